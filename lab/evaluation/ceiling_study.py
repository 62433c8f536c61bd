"""How well can one description per store route at best?  `python -m lab.evaluation.ceiling_study [--greedy]`

Issue 14 asks name + `store_topics` for 5 points of top-1 over the best TF-IDF baseline of no greater length, with
both routers, on the Debian sections and on WordNet.  This asks what any single description could reach, in Python
with no database, on `make eval`'s stores and held-out queries (the 16 Debian sections, each half of 8 routed among
its own 8 stores, the 10 WordNet stores; name + `store_topics` is read from bench/results/eval.json, so run
`make eval` first).  Nothing here ever fits on a query: the prototypes are fitted on the stores' own files.

- One vector per store, no text (MiniLM only): the store centroid, and a prototype fitted discriminatively on the
  store's own file vectors (multinomial logistic regression without intercept, rows unit-normalised, routed by
  cosine as a description is).  What a description's embedding would have to land on.
- Word lists of 150 words after the store's name (both routers):
  - the TF-IDF baseline (routers.tfidf_words);
  - contrast: words ranked by p * ln(p / q) on file frequencies against the set's other stores, as
    `contrast_terms()` ranks lexemes;
  - coverage: the same score, picked greedily, each file's weight halved for every picked word it holds (a word
    whose files are already covered by picked words adds less);
  - aligned: words ranked by how their own MiniLM embedding leans to the store's prototype rather than to the
    others' (the router's own model in the loop, which the extension does not have);
  - greedy (--greedy, ~25 min for the four sets on 2 cores): words appended 4 at a time, each of the 4 among the 30 best
    aligned words that makes the whole text's MiniLM embedding lean most to the store's prototype.
What it measured is in bench/README.md ("How far one description can go").
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import numpy as np
from sklearn.linear_model import LogisticRegression

from .. import embedding
from . import data, metrics, routers, routing, wordnet
from .run import RESULTS

WORDS = 150


def contrast(files: dict[str, list[set[str]]], *, cover_decay: float | None = None, n: int = WORDS,
             min_files: int = 2) -> dict[str, list[str]]:
    """Per store, n words by p * ln(p / q) (p: share of the store's files holding the word, q: share of the other
    stores' files, +0.5 smoothing), in >= min_files files and more common here than elsewhere; cover_decay: pick
    greedily instead, a file's weight multiplied by cover_decay for every picked word it holds."""
    df = {s: Counter(t for f in fl for t in f) for s, fl in files.items()}
    whole = Counter()
    for c in df.values():
        whole.update(c)
    total = sum(len(fl) for fl in files.values())
    out = {}
    for s, fl in files.items():
        ns = len(fl)
        lift = {}
        for t, f in df[s].items():
            p, q = f / ns, (whole[t] - f + 0.5) / (total - ns + 0.5)
            if f >= min_files and p > q and t not in routers._STOP:
                lift[t] = math.log(p / q)
        ranked = sorted(lift, key=lambda t: (-df[s][t] * lift[t], t))
        if cover_decay is None:
            out[s] = ranked[:n]
            continue
        pool = ranked[:10 * n]
        holders = {t: np.array([i for i, f in enumerate(fl) if t in f]) for t in pool}
        weight, picked = np.ones(ns), []
        for _ in range(min(n, len(pool))):
            best = max((t for t in pool if t not in picked), key=lambda t: (weight[holders[t]].sum() * lift[t], t))
            picked.append(best)
            weight[holders[best]] *= cover_decay
        out[s] = picked
    return out


def aligned(stores: list[str], files: dict[str, list[set[str]]], proto: np.ndarray, emb,
            n: int = WORDS) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per store, its words (in >= 2 files) by the margin of their own embedding's cosine to the store's prototype
    over the best other store's: the top n, and the pool the greedy search draws from."""
    df = {s: Counter(t for f in files[s] for t in f) for s in stores}
    cands = {s: sorted(t for t, f in df[s].items() if f >= 2 and t not in routers._STOP) for s in stores}
    vocab = sorted({t for c in cands.values() for t in c})
    vec = dict(zip(vocab, emb(vocab)))
    pools = {}
    for i, s in enumerate(stores):
        sc = np.array([vec[t] for t in cands[s]]) @ proto.T
        margin = sc[:, i] - np.delete(sc, i, axis=1).max(axis=1)
        pools[s] = [cands[s][j] for j in np.argsort(-margin, kind="stable")]
    return {s: p[:n] for s, p in pools.items()}, pools


def greedy(stores: list[str], pools: dict[str, list[str]], proto: np.ndarray, emb, n: int = WORDS,
           step: int = 4, tries: int = 30) -> dict[str, list[str]]:
    """Per store, n words appended `step` at a time: of the `tries` first words of its pool not yet taken, those
    whose addition makes the whole text's embedding lean most to the store's prototype over the best other's."""
    out = {}
    for i, s in enumerate(stores):
        cur: list[str] = []
        while len(cur) < n:
            cand = [w for w in pools[s] if w not in cur][:tries]
            if not cand:
                break
            e = emb([f"{s}: " + " ".join(cur + [w]) for w in cand]) @ proto.T
            obj = e[:, i] - np.delete(e, i, axis=1).max(axis=1)
            cur.extend(cand[j] for j in np.argsort(-obj, kind="stable")[:step])
        out[s] = cur[:n]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--greedy", action="store_true", help="also the greedy search with the model in the loop (slow)")
    args = ap.parse_args(argv)
    emb = embedding.default_embedder()
    ev = json.loads((RESULTS / "eval.json").read_text())
    cfg = routing.RoutingConfig()
    deb = data.read_sections(sorted(cfg.sections))
    sets = [("Debian, 16 sections", deb, ev["routing"]),
            *((f"Debian, {h} half", {s: deb[s] for s in routing.HALVES[h]}, ev["halves"][h]) for h in ("tune", "report")),
            ("WordNet", wordnet.read(), ev["family2"])]
    print("| set | description | MiniLM top-1 % | BM25 top-1 % | tokens |\n|---|---|---:|---:|---:|")
    for name, corpus, node in sets:
        sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                        queries_per_section=cfg.queries_per_section)
        stores = sorted(corpus)
        qs = [p for s in stores for p in sp.queries[s]]
        truth = np.array([stores.index(p.section) for p in qs])
        qv = emb([p.text for p in qs])
        owners = [(i, len(p.chunks)) for i, s in enumerate(stores) for p in sp.store[s]]
        cv = emb([c for s in stores for p in sp.store[s] for c in p.chunks])   # one call: one cache shard
        ends = np.cumsum([n for _, n in owners])
        X = embedding.normalise(np.array([cv[e - n:e].mean(0) for (_, n), e in zip(owners, ends)]))
        y = np.array([i for i, _ in owners])
        top1 = lambda scores: 100 * float((metrics.ranks(scores, truth) == 1).mean())   # noqa: E731
        centroid = embedding.normalise(np.array([X[y == i].mean(0) for i in range(len(stores))]))
        proto = embedding.normalise(LogisticRegression(C=10, fit_intercept=False, max_iter=3000).fit(X, y).coef_)
        print(f"| {name} | store centroid (a vector, no text) | {top1(qv @ centroid.T):.1f} | – | – |")
        print(f"| {name} | fitted prototype (a vector, no text) | {top1(qv @ proto.T):.1f} | – | – |")
        files = {s: [set(routers.bm25_tokens(p.text)) for p in sp.store[s]] for s in stores}
        lists = {"TF-IDF baseline": routers.tfidf_words({s: "\n".join(p.text for p in sp.store[s]) for s in stores}),
                 "contrast": contrast(files), "coverage": contrast(files, cover_decay=0.5)}
        lists["aligned (model in the loop)"], pools = aligned(stores, files, proto, emb)
        if args.greedy:
            lists["greedy (model in the loop)"] = greedy(stores, pools, proto, emb)
        texts = {"name + store_topics (make eval)": [node["stores"][s]["descriptions"]["name_hybrid"] for s in stores]}
        texts.update({f"name + {k}, {WORDS} words": [f"{s}: " + " ".join(w[s][:WORDS]) for s in stores]
                      for k, w in lists.items()})
        for k, t in texts.items():
            bm = top1(routers.bm25_scores([p.text for p in qs], t))
            tok = np.mean([routers.tokens_estimate(x) for x in t])
            print(f"| {name} | {k} | {top1(qv @ emb(t).T):.1f} | {bm:.1f} | {tok:.0f} |", flush=True)


if __name__ == "__main__":
    main()
