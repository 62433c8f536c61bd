"""Which signal tells a query no store holds from one a store holds?  `python -m lab.evaluation.abstain_study`

The retrieve-or-not question of `make eval`, asked of other signals than route()'s, on the same stores and queries
(the routing benchmark's 16 Debian sections, their held-out queries, and the held-out packages of the 12 sections
with no store), in Python, with no database: each signal gives every query a score for its best store, a threshold
is chosen on the tuning half (best abstention F1 there) and applied to the reporting half and to all queries.

Signals: route()'s (a von Mises-Fisher mixture over 8 KMeans clusters per store, kappa 20), the store centroid,
the mean cosine of the k nearest chunks (k = 1 .. 20), a logistic regression over the best score and its margins
(fitted on the tuning half), the score calibrated per store (minus the median of the store's own chunks' scores,
and as a z-score), and the share of the query's words (IDF-weighted) that the best store holds, alone and combined.
What it measured is in bench/README.md ("Retrieve or not: the signals tried").
"""
from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression

from .. import embedding
from . import data, routing

KAPPA, CLUSTERS = 20.0, 8


def _auc(i: np.ndarray, o: np.ndarray) -> float:
    return float(np.mean((i[:, None] > o[None, :]) + 0.5 * (i[:, None] == o[None, :])))


def _f1(i: np.ndarray, o: np.ndarray, t: float) -> float:
    tp, fp, fn = np.sum(o < t), np.sum(i < t), np.sum(o >= t)
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def _best(i: np.ndarray, o: np.ndarray) -> float:
    return max(np.unique(np.concatenate([i, o])), key=lambda t: _f1(i, o, t))


def main() -> None:
    cfg = routing.RoutingConfig()
    stores = sorted(cfg.sections)
    corpus = data.read_sections([*stores, *cfg.abstain_sections])
    sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    emb = embedding.default_embedder()
    rows = [(j, c) for j, s in enumerate(stores) for p in sp.store[s] for c in p.chunks]
    V, sid = emb([c for _, c in rows]), np.array([j for j, _ in rows])
    qs = [p for s in stores for p in sp.queries[s]]
    outq = [p for s in cfg.abstain_sections for p in sp.queries[s]]
    Q, Qout = emb([p.text for p in qs]), emb([p.text for p in outq])
    truth = np.array([stores.index(p.section) for p in qs])
    tune_in = np.array([p.section in routing.HALVES["tune"] for p in qs])
    tune_out = np.array([p.section in routing.ABSTAIN_HALVES["tune"] for p in outq])

    cen, csid, share = [], [], []
    for j in range(len(stores)):
        X = V[sid == j]
        km = KMeans(CLUSTERS, n_init=3, random_state=0).fit(X)
        for c in range(CLUSTERS):
            m = km.labels_ == c
            v = X[m].mean(0)
            cen.append(v / np.linalg.norm(v))
            csid.append(j)
            share.append(m.mean())
    cen, csid, share = np.array(cen), np.array(csid), np.array(share)

    def per_store(S, f):
        return np.stack([f(S[:, sid == j]) for j in range(len(stores))], 1)

    def mixture(X):
        a = KAPPA * (X @ cen.T) + np.log(share)[None, :]
        return np.stack([np.logaddexp.reduce(a[:, csid == j], axis=1) / KAPPA for j in range(len(stores))], 1)

    C = np.stack([V[sid == j].mean(0) for j in range(len(stores))])
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    signals: dict[str, tuple[np.ndarray, np.ndarray]] = {"route(): mixture, kappa 20": (mixture(Q), mixture(Qout)),
                                                         "store centroid": (Q @ C.T, Qout @ C.T)}
    Si, So = Q @ V.T, Qout @ V.T
    for k in (1, 5, 20):
        def f(s, k=k):
            return np.sort(s, 1)[:, -k:].mean(1)
        signals[f"mean cosine of the {k} nearest chunks"] = (per_store(Si, f), per_store(So, f))

    print(f"{len(qs)} queries with a store, {len(outq)} without; threshold chosen on the tuning half\n")
    print("| signal | top-1 % | AUC | F1 tuning half | F1 reporting half | F1 all |")
    print("|---|---:|---:|---:|---:|---:|")

    def line(name, ti, to, top1=None):
        t = _best(ti[tune_in], to[tune_out])
        print(f"| {name} | {'' if top1 is None else f'{100 * top1:.1f}'} | {_auc(ti, to):.3f} | "
              f"{_f1(ti[tune_in], to[tune_out], t):.3f} | {_f1(ti[~tune_in], to[~tune_out], t):.3f} | "
              f"{_f1(ti, to, t):.3f} |")

    for name, (pi, po) in signals.items():
        line(name, pi.max(1), po.max(1), np.mean(pi.argmax(1) == truth))

    pi, po = signals["route(): mixture, kappa 20"]
    # the store's own chunks under its mixture: a per-store calibration
    own = mixture(V)[np.arange(len(V)), sid]
    med = np.array([np.median(own[sid == j]) for j in range(len(stores))])
    sd = np.array([np.std(own[sid == j]) for j in range(len(stores))])
    bi, bo = pi.argmax(1), po.argmax(1)
    for name, cal in (("route() minus the store's median own-chunk score", lambda p, b: p[np.arange(len(p)), b] - med[b]),
                      ("route() as a z-score of the store's own chunks",
                       lambda p, b: (p[np.arange(len(p)), b] - med[b]) / sd[b])):
        line(name, cal(pi, bi), cal(po, bo))

    # words: the IDF-weighted share of the query's words that the best store holds
    docs = [p.text for s in stores for p in sp.store[s]]
    dsid = np.array([j for j, s in enumerate(stores) for _ in sp.store[s]])
    cv = CountVectorizer(stop_words="english")
    X = cv.fit_transform(docs)
    held = np.stack([X[dsid == j].sum(0).A1 > 0 for j in range(len(stores))])
    df = (X > 0).sum(0).A1
    analyse, vocab = cv.build_analyzer(), cv.vocabulary_

    def cover(text, j):
        toks = set(analyse(text))
        if not toks:
            return 1.0
        ids = [vocab.get(t) for t in toks]
        w = np.array([np.log((len(docs) + 1) / ((df[i] if i is not None else 0) + 1)) + 1 for i in ids])
        inside = np.array([i is not None and held[j, i] for i in ids], float)
        return float((w * inside).sum() / w.sum())

    ci = np.array([cover(p.text, j) for p, j in zip(qs, bi)])
    co = np.array([cover(p.text, j) for p, j in zip(outq, bo)])
    line("share of the query's words the best store holds (IDF-weighted)", ci, co)

    def margins(p):
        s = np.sort(p, 1)
        return np.stack([s[:, -1], s[:, -1] - s[:, -2], s[:, -1] - s[:, -3], s[:, -1] - s.mean(1)], 1)

    for name, fi, fo in (("logistic: best score + its margins over the 2nd, 3rd and mean store", margins(pi), margins(po)),
                         ("logistic: best score + word share", np.c_[pi.max(1), ci], np.c_[po.max(1), co])):
        lr = LogisticRegression(C=100).fit(np.concatenate([fi[tune_in], fo[tune_out]]),
                                           np.r_[np.zeros(tune_in.sum()), np.ones(tune_out.sum())])
        line(name + " (fitted on the tuning half)", -lr.decision_function(fi), -lr.decision_function(fo))


if __name__ == "__main__":
    main()
