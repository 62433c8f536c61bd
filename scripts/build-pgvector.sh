#!/usr/bin/env bash
# Build and install pgvector from Debian's own source package (trixie suite), against the local PostgreSQL.
# The archive address is read from this machine's apt sources: no registry host is written here.
# apt state goes to a private directory, so the system's sources and lists are left as they were.
set -euo pipefail
PG_CONFIG=${PG_CONFIG:-pg_config}
SUITE=${PGVECTOR_SUITE:-trixie}

archive_uri() {
  # deb822 files first (URIs: ...), then one-line sources (deb URI suite ...); skip security and non-Debian archives.
  { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{for (i=2;i<=NF;i++) print $i}'
    grep -hE '^deb(-src)?[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | sed -E 's/\[[^]]*\]//' | awk '{print $2}'
  } | grep -E '/debian/?$' | grep -v security | head -n 1
}

uri=$(archive_uri || true)
if [ -z "$uri" ]; then
  echo "build-pgvector: no Debian archive found in /etc/apt/sources*; add one or install pgvector yourself" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'deb-src [signed-by=%s] %s %s main\n' "$keyring" "$uri" "$SUITE" > "$work/sources.list"
APT_OPTS=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/lists" -o Dir::Cache::Archives="$work/archives" -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root)
echo "build-pgvector: fetching the pgvector source package of $SUITE from $uri"
apt-get "${APT_OPTS[@]}" -qq update
(cd "$work" && apt-get "${APT_OPTS[@]}" -qq --only-source --download-only source pgvector >/dev/null)
dsc=$(ls "$work"/pgvector_*.dsc | head -n 1)
(cd "$work" && dpkg-source -x --no-check "$dsc" src >/dev/null)
make -C "$work/src" -s PG_CONFIG="$PG_CONFIG" >/dev/null
make -C "$work/src" -s PG_CONFIG="$PG_CONFIG" install >/dev/null
echo "build-pgvector: installed $(basename "$dsc" .dsc)"
