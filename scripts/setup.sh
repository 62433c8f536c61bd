#!/usr/bin/env bash
# make setup: install what is missing for storetopics on a Debian machine, and nothing else. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# The server: PG_CONFIG as the Makefile exports it (the pg_config on PATH, or `make PG_CONFIG=... setup`).  Its major
# version picks the Debian packages, unless PG_MAJOR is given; 15 when there is no pg_config yet (a fresh machine).
PG_CONFIG=${PG_CONFIG:-pg_config}
if [ -z "${PG_MAJOR:-}" ]; then
  if [[ $PG_CONFIG =~ ^/usr/lib/postgresql/([0-9]+)/bin/pg_config$ ]]; then
    PG_MAJOR=${BASH_REMATCH[1]}
  elif version=$("$PG_CONFIG" --version 2>/dev/null); then
    PG_MAJOR=$(sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p' <<<"$version")
  fi
fi
PG_MAJOR=${PG_MAJOR:-15}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -f /etc/debian_version ] || ! command -v apt-get >/dev/null; then
  cat >&2 <<MSG
make setup: this machine is not Debian, and setup only knows Debian's packages.
Use the container instead (see docker/README.md):
  docker build -t storetopics -f docker/Dockerfile . && docker run --rm -it storetopics make test
MSG
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# 1. Debian packages: the PostgreSQL server and headers, PL/Python and the numpy/scikit-learn that
#    plpython3u's interpreter (Debian's python3) imports, pg_cron (100 kB; tests/test_pg_cron.py), a venv module,
#    and dpkg-dev for `apt-get source`.
want=(postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-plpython3-$PG_MAJOR postgresql-$PG_MAJOR-cron
      python3-numpy python3-sklearn python3-venv dpkg-dev make gcc)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. pgvector >= 0.8, built from Debian's own source package (bookworm has none), for the server PG_CONFIG names
#    (as an absolute path: sudo resets PATH).
if ! PG_CONFIG=$(command -v "$PG_CONFIG"); then
  echo "setup: no $PG_CONFIG; name the server's with make PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" >&2
  exit 1
fi
sharedir=$($PG_CONFIG --sharedir)
have=$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$sharedir/extension/vector.control" 2>/dev/null || true)
if [ -z "$have" ] || [ "$(printf '%s\n0.8.0\n' "$have" | sort -V | head -n1)" != "0.8.0" ]; then
  $SUDO env PG_CONFIG=$PG_CONFIG bash scripts/build-pgvector.sh
fi

# 3. The Python package, in a project-local virtualenv.
# Reinstalled whenever pyproject.toml differs from the one last installed (the stamp holds its hash: a fresh
# checkout's timestamps say nothing), so a dependency added there reaches every existing .venv.
stamp="$VENV/.storetopics-installed"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
want_hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want_hash" ]; then
  echo "setup: installing the Python package into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]' 2> >(grep -v "^WARNING: Location" >&2)
  echo "$want_hash" > "$stamp"
fi
echo "setup: ok"
