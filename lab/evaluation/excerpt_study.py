"""Would sentences people wrote route better than word lists?  `python -m lab.evaluation.excerpt_study`

The routing benchmark's 16 Debian sections and 480 held-out queries, in Python, with no database: each store is
described by excerpts of its most central chunks (K KMeans clusters of the store's all-MiniLM-L6-v2 vectors, the
chunk nearest each centroid, its first W words, largest cluster first), alone and followed by the terms of the
store's `store_topics`, and routed by MiniLM cosine among all 16 stores, beside name + `store_topics` and
name + top-150 TF-IDF words as `make eval` rendered them (read from bench/results/eval.json, so run `make eval`
first) and the store centroid.  Top-1 over all queries and over the queries of each half (the tuning half is what
a choice may be made on).  What it measured is in bench/README.md ("Sentences instead of word lists").
"""
from __future__ import annotations

import json

import numpy as np
from sklearn.cluster import KMeans

from .. import embedding
from . import data, routing
from .run import RESULTS

SHAPES = ((8, 20), (8, 12), (12, 14), (16, 10))   # (K clusters, W words per excerpt)


def main() -> None:
    cfg = routing.RoutingConfig()
    stores = sorted(cfg.sections)
    sp = data.split(data.read_sections(stores), held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    emb = embedding.default_embedder()
    rows = [(j, c) for j, s in enumerate(stores) for p in sp.store[s] for c in p.chunks]
    V, sid = emb([c for _, c in rows]), np.array([j for j, _ in rows])
    qs = [p for s in stores for p in sp.queries[s]]
    Q, truth = emb([p.text for p in qs]), np.array([stores.index(p.section) for p in qs])
    sets = {"all": np.ones(len(qs), bool), **{h: np.array([p.section in secs for p in qs])
                                               for h, secs in routing.HALVES.items()}}
    descs = {s: d["descriptions"] for s, d in json.loads((RESULTS / "eval.json").read_text())["routing"]
             ["stores"].items()}

    def line(name: str, pred: np.ndarray, texts: list[str] | None = None) -> None:
        ok = pred == truth
        cells = "  ".join(f"{h} {100 * ok[m].mean():5.1f}" for h, m in sets.items())
        size = f"  ~{np.mean([len(t.split()) for t in texts]):.0f} words" if texts else ""
        print(f"{name:58s} {cells}{size}")

    def route(texts: list[str]) -> np.ndarray:
        return (Q @ emb(texts).T).argmax(1)

    for key, name in (("name_hybrid", "name + store_topics (make eval)"),
                      ("tfidf150", "name + top-150 TF-IDF words (make eval)")):
        texts = [descs[s][key] for s in stores]
        line(name, route(texts), texts)
    C = np.stack([V[sid == j].mean(0) for j in range(len(stores))])
    line("store centroid (sees the contents)", (Q @ (C / np.linalg.norm(C, axis=1, keepdims=True)).T).argmax(1))
    for k, w in SHAPES:
        texts = []
        for j, s in enumerate(stores):
            idx = np.where(sid == j)[0]
            km = KMeans(k, n_init=3, random_state=0).fit(V[idx])
            parts = []
            for c in np.argsort(-np.bincount(km.labels_, minlength=k), kind="stable"):
                m = idx[km.labels_ == c]
                centre = V[m].mean(0)
                parts.append(" ".join(rows[m[np.argmax(V[m] @ centre)]][1].split()[:w]))
            texts.append(f"{s}: " + "; ".join(parts))
        line(f"name + {k} central excerpts of {w} words", route(texts), texts)
        plus = [t + " Terms:" + descs[s]["hybrid"].split("Terms:", 1)[-1] for t, s in zip(texts, stores)]
        line("  the same + store_topics' terms", route(plus), plus)


if __name__ == "__main__":
    main()
