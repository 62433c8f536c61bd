"""Realistic chunk texts for the benchmarks: windows of 200-300 words of real documents.

The words come from the document corpus of the routing evaluation (scripts/doc_corpus.py: the manuals Debian ships
for 18 products, converted to text as an ingestion pipeline does it, navigation and markup residue left in), in
`.cache/doc-corpus/corpus.jsonl.gz` (STORETOPICS_DOC_CORPUS overrides the directory).  Each product's pages are
joined into one run of words; a chunk is a window of that run at a random offset, so a million chunks are a million
different texts with the word statistics of real manuals (Zipf's law, long words, names, residue), not one text
repeated.  A theme (a vector centre of bench.clusters) is one product; the last product is kept for `new_theme`.

    from bench.doctext import DocTexts, ensure_corpus
    ensure_corpus()                       # builds the corpus when missing (apt-get download, never installed)
    texts = DocTexts(seed=1)
    texts(np.array([0, 1, 2]), 3)         # three chunks: themes 0, 1, 2
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("STORETOPICS_DOC_CORPUS", REPO / ".cache" / "doc-corpus")) / "corpus.jsonl.gz"
MIN_WORDS, MAX_WORDS = 200, 300


def ensure_corpus(path: Path = CORPUS) -> Path:
    """The corpus, built by scripts/doc_corpus.py when missing (it needs apt-get, dpkg-deb, man-db, groff-base,
    bsdextrautils and BeautifulSoup: `make bench` installs what is missing)."""
    if not path.exists():
        print(f"bench: building the document corpus ({path}) with scripts/doc_corpus.py", flush=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "doc_corpus.py")], check=True)
    if not path.exists():
        raise SystemExit(f"bench: no document corpus at {path}; run python3 scripts/doc_corpus.py")
    return path


def product_words(path: Path = CORPUS) -> dict[str, list[str]]:
    """Every product's pages (in corpus order), joined into one list of words."""
    out: dict[str, list[str]] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            d = json.loads(line)
            out.setdefault(d["store"], []).extend(" ".join(d["chunks"]).split())
    return out


class DocTexts:
    """`texts(topics, n)`: n chunks, chunk i a window of MIN_WORDS..MAX_WORDS words of product
    products[topics[i] % themes]; `new_theme(n)`: windows of the product kept aside.  Seeded: the same calls in the
    same order give the same texts."""

    def __init__(self, seed: int, path: Path | None = None):
        words = product_words(ensure_corpus(path or CORPUS))
        self.products = sorted(words)
        self.words = [np.array(words[p], dtype=object) for p in self.products]
        self.themes = len(self.products) - 1          # the last is the new theme
        self.rng = np.random.default_rng(seed + 2000)

    def _windows(self, product: np.ndarray, n: int) -> list[str]:
        lengths = self.rng.integers(MIN_WORDS, MAX_WORDS + 1, size=n)
        out = []
        for p, k, u in zip(product.tolist(), lengths.tolist(), self.rng.random(n).tolist()):
            w = self.words[p]
            start = int(u * (len(w) - k))
            out.append(" ".join(w[start:start + k]))
        return out

    def __call__(self, topics: np.ndarray, n: int) -> list[str]:
        return self._windows(np.asarray(topics) % self.themes, n)

    def new_theme(self, n: int) -> list[str]:
        return self._windows(np.full(n, len(self.products) - 1), n)

    def words_per_chunk(self) -> float:
        return (MIN_WORDS + MAX_WORDS) / 2
