#!/usr/bin/env bash
# The document corpus (scripts/doc_corpus.py: Debian's documentation of 18 products, .cache/doc-corpus/), built when
# missing or out of date, with what building it needs installed when missing (idempotent): man-db, groff-base and
# bsdextrautils (man pages to text) from apt, BeautifulSoup into the project's virtualenv (the version the `eval`
# extra of pyproject.toml asks for).  Used by `make bench` (bench.scale --text docs, bench/doctext.py) and by
# scripts/eval_setup.sh (the routing evaluation's document stores).  Exits non-zero when the corpus cannot be built.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "doc corpus setup: no virtualenv at $VENV: run 'make setup' first" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    # (not Debian: a corpus built elsewhere, in .cache/doc-corpus/ or STORETOPICS_DOC_CORPUS, still does)
    corpus="${STORETOPICS_DOC_CORPUS:-.cache/doc-corpus}/corpus.jsonl.gz"
    if [ -f "$corpus" ]; then exit 0; fi
    echo "doc corpus setup: building the document corpus needs apt-get and dpkg-deb (Debian); no $corpus" >&2
    exit 1
fi
. scripts/apt_install.sh
missing=()
command -v man >/dev/null || missing+=(man-db)
command -v groff >/dev/null || missing+=(groff-base)
command -v col >/dev/null || missing+=(bsdextrautils)
if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
if ! "$PY" -c 'import bs4' 2>/dev/null; then
    bs4=$(grep -o '"beautifulsoup4[^"]*"' pyproject.toml | head -1 | tr -d '"')
    echo "doc corpus setup: installing ${bs4:?no beautifulsoup4 in pyproject.toml}"
    "$PY" -m pip install -q --disable-pip-version-check "$bs4"
fi
"$PY" scripts/doc_corpus.py
