"""How well can any signal from the query's embedding tell a query no store holds from one a store holds, in each
query style?  `python -m lab.evaluation.abstain_ceiling`

Issue 30 asks route() to search for >= 90% of the queries some store holds and to abstain for >= 80% of those no
store holds, for long passages and for short questions alike.  This measures the ceiling of that target, in Python,
with no database: the stores, held-out queries and out-of-catalog queries of `make eval` (the Debian sections and the
document stores, both query styles), the stores' chunks embedded with all-MiniLM-L6-v2 and clustered (KMeans, up to
20 per store, as the nearest-cluster reference), and per query the signals a database could compute from its
clusters and chunks: route()'s mixture score of the best store, its margin over the second, its z-score among the
stores, the cluster z-score, the nearest chunk's cosine, and the best store's score minus the mean.  For each signal:
its AUC (in-catalog against out-of-catalog queries), and the share of out-of-catalog queries abstained at the
threshold that searches exactly 90% of the in-catalog ones, chosen on these very queries (an oracle: no calibration
from the database can do better than the signal's own curve).  What it printed is in bench/README.md.
"""
from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from .. import embedding
from . import data, docs, routing

KAPPA, K_MAX = 20.0, 20


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def auc(i: np.ndarray, o: np.ndarray) -> float:
    return float(np.mean((i[:, None] > o[None, :]) + 0.5 * (i[:, None] == o[None, :])))


def abstained_at(i: np.ndarray, o: np.ndarray, searched: float = 0.9) -> float:
    """The share of out-of-catalog queries below the threshold that keeps `searched` of the in-catalog ones."""
    return float(np.mean(o < np.quantile(i, 1 - searched)))


def signals(stores: list[str], sp: data.Split, styles: dict, emb) -> dict[str, dict]:
    rows = [(j, c) for j, s in enumerate(stores) for p in sp.store[s] for c in p.chunks]
    vecs, sid = _unit(emb([c for _, c in rows])), np.array([j for j, _ in rows])
    cen, csid, share = [], [], []
    for j in range(len(stores)):
        x = vecs[sid == j]
        k = min(K_MAX, max(2, len(x) // 10))
        labels = KMeans(k, n_init=3, random_state=0).fit(x).labels_
        for c in range(k):
            m = labels == c
            cen.append(_unit(x[m].mean(0, keepdims=True))[0])
            csid.append(j)
            share.append(m.mean())
    cen, csid, share = np.array(cen), np.array(csid), np.array(share)
    out = {}
    for style, items in styles.items():
        q = _unit(emb([t for _, t, _ in items]))
        inside = np.array([s in stores for s, _, _ in items])
        truth = np.array([stores.index(s) if s in stores else -1 for s, _, _ in items])
        cos = q @ cen.T
        a = KAPPA * cos + np.log(share)[None, :]
        mix = np.stack([np.logaddexp.reduce(a[:, csid == j], axis=1) / KAPPA for j in range(len(stores))], 1)
        top, ranked = mix.max(1), np.sort(mix, 1)
        sig = {"route(): best store's score": top,
               "its margin over the second": ranked[:, -1] - ranked[:, -2],
               "its z-score among the stores": (top - mix.mean(1)) / (mix.std(1) + 1e-9),
               "best store's score minus the mean": top - mix.mean(1),
               "best cluster's z-score": (cos.max(1) - cos.mean(1)) / (cos.std(1) + 1e-9),
               "nearest chunk's cosine": (q @ vecs.T).max(1)}
        out[style] = {"top1": float((mix.argmax(1) == truth)[inside].mean()), "in": int(inside.sum()),
                      "out": int((~inside).sum()),
                      "signals": {k: (auc(v[inside], v[~inside]), abstained_at(v[inside], v[~inside]))
                                  for k, v in sig.items()}}
    return out


def main() -> None:
    emb = embedding.default_embedder()
    cfg = routing.RoutingConfig()
    families = []
    corpus = data.read_sections([*cfg.sections, *cfg.abstain_sections])
    sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    families.append(("Debian sections", list(cfg.sections), sp,
                     routing.default_query_styles("debian")(sp, [*cfg.sections, *cfg.abstain_sections],
                                                            cfg.queries_per_section)))
    if docs.available():
        corpus = docs.read(docs.STORES + docs.ABSTAIN, held_share=cfg.held_share, chunk_budget=docs.CHUNK_BUDGET)
        sp = data.split(corpus, held_share=cfg.held_share, store_cap=None, queries_per_section=30)
        families.append(("Document stores", list(docs.STORES), sp,
                         docs.query_styles(sp, [*docs.STORES, *docs.ABSTAIN], 30)))
    print("| family | style | queries in / out | signal | AUC | out-of-catalog abstained at 90% in-catalog searched |")
    print("|---|---|---|---|---:|---:|")
    for name, stores, sp, styles in families:
        for style, r in signals(stores, sp, styles, emb).items():
            for sig, (a, ab) in r["signals"].items():
                print(f"| {name} | {style} | {r['in']} / {r['out']} | {sig} | {a:.3f} | {100 * ab:.1f}% |")


if __name__ == "__main__":
    main()
