"""Would the rendered text route better reshaped?  `python -m lab.evaluation.text_study [--topics] [TRANSFORM ...]`

`make eval`'s 36 routing cells (three families × both query styles × tuning half, reporting half, all × MiniLM and
BM25), recomputed in Python with no database from the texts `make eval` rendered (bench/results/eval.json, so run
`make eval` first) with a transform applied to each store's text: what a change of shape would do before it is built
in SQL.  Each cell prints name + `store_topics` as rendered and as transformed, against the best TF-IDF baseline no
longer than each (issue 29's first target); with --topics, name + the Topics section alone against the name alone +
10 points (its second target).  `ident` reproduces `make eval`'s cells exactly (a check of the harness).

A transform reshapes what was rendered (drops, reorders, mixes in the baseline's words or the clusters' words that
eval.json holds); `titles` instead puts the stores' own page titles (the stored pages nearest 8 KMeans centroids of
each document store, its product's names taken out) in the document stores' Topics.  What it measured is in
bench/README.md ("Reshaping the rendered text").
"""
from __future__ import annotations

import argparse
import json
import re
from functools import cache

import numpy as np

from .. import embedding
from . import data, docs, metrics, routers, routing, wordnet
from .run import RESULTS

# family -> (eval.json's key for all its stores, the key for its halves)
FAMILIES = {"debian": ("routing", "halves"), "wordnet": ("family2", "family2_halves"), "docs": ("docs", "docs_halves")}
_TAIL = re.compile(r"\s+[\d.,]+[kKmM]?\s+files?\.$")


@cache
def queries(family: str) -> dict[str, list[tuple[str, str, str]]]:
    """The family's two query styles as `make eval` builds them: style -> [(store, query, its title/synopsis)]."""
    if family == "docs":
        sp = data.split(docs.read(docs.STORES, held_share=0.2), held_share=0.2, store_cap=None,
                        queries_per_section=30)
        return docs.query_styles(sp, list(docs.STORES), 30)
    cfg = routing.RoutingConfig()
    stores = list(wordnet.STORES) if family == "wordnet" else list(cfg.sections)
    corpus = wordnet.read() if family == "wordnet" else data.read_sections(stores)
    sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    return routing.default_query_styles(family)(sp, stores, cfg.queries_per_section)


# -- transforms: (store, text, the store's eval.json descriptions) -> text --------------------------------------------
def section(text: str, name: str) -> str | None:
    """The body of one section ("Terms: a b c." -> "a b c"), None when the text has none."""
    m = re.search(name + r": (.*?)\.(?= (?:Topics|Terms|Distinctive):|\s+[\d.,]+[kKmM]? files?\.$|$)", text)
    return m.group(1) if m else None


def _with_terms(text: str, words: list[str]) -> str:
    body = section(text, "Terms")
    return text if body is None else text.replace(f"Terms: {body}.", "Terms: " + " ".join(words) + ".")


def _baseline(d: dict) -> list[str]:
    return d["tfidf150"].split(": ", 1)[1].split()


def _mix(text: str, d: dict, pattern: str) -> str:
    """The Terms, as many words, taken from ours ('o') and the TF-IDF baseline's ('b') in turn, each word once."""
    ours, base = (section(text, "Terms") or "").split(), _baseline(d)
    out: list[str] = []
    i = {"o": 0, "b": 0}
    src = {"o": ours, "b": base}
    k = 0
    while len(out) < len(ours) and (i["o"] < len(ours) or i["b"] < len(base)):
        s = pattern[k % len(pattern)]
        k += 1
        if i[s] < len(src[s]):
            w = src[s][i[s]]
            i[s] += 1
            if w not in out:
                out.append(w)
    return _with_terms(text, out)


def _clusters(d: dict) -> dict[str, list[str]]:
    """label -> the cluster's words, from eval.json's cluster summary ("label (6%): a, b, c; ...")."""
    out: dict[str, list[str]] = {}
    for part in re.sub(r"^Topics: ", "", (d.get("clusters") or "").rstrip(".")).split("; "):
        m = re.match(r"(.*) \((\d+)%\): (.*)$", part)
        if m:
            out.setdefault(m.group(1), m.group(3).split(", "))
    return out


def _labels(text: str, d: dict, fn) -> str:
    m = re.search(r"Topics: (.*?)\.(?=\s|$)", text)
    words = _clusters(d)
    if not m or not words:
        return text
    return text.replace(m.group(0), "Topics: " + ", ".join(fn(x, words.get(x)) for x in m.group(1).split(", ")) + ".")


def _plus_words(n: int):
    def fn(label: str, words: list[str] | None) -> str:
        extra = [w for w in words or [] if w.lower() not in label.lower().split()][:n]
        return f"{label} ({' '.join(extra)})" if n > 1 and extra else " ".join([label, *extra])
    return fn


def _trim_to(text: str, tokens: float) -> str:
    """The Terms cut from the end until the text is no longer (in the eval's token estimate) than `tokens`."""
    words = (section(text, "Terms") or "").split()
    while words and routers.tokens_estimate(text) > tokens:
        words = words[:-1]
        text = _with_terms(text, words)
    return text


@cache
def page_titles() -> dict[str, list[str]]:
    """Per document store, the titles of the stored pages nearest 8 KMeans centroids of its chunk vectors (largest
    cluster first), its product's names taken out, up to a separator, at most 5 words."""
    from sklearn.cluster import KMeans
    emb = embedding.default_embedder()
    sp = data.split(docs.read(docs.STORES, held_share=0.2), held_share=0.2, store_cap=None, queries_per_section=30)
    out = {}
    for s in docs.STORES:
        pages = sp.store[s]
        vecs = emb([c for p in pages for c in p.chunks])
        owner = np.array([i for i, p in enumerate(pages) for _ in p.chunks])
        km = KMeans(min(8, len(pages)), n_init=4, random_state=0).fit(vecs)
        labels: list[str] = []
        for c in np.argsort(-np.bincount(km.labels_)):
            idx = np.where(km.labels_ == c)[0]
            for j in idx[np.argsort(-(vecs[idx] @ km.cluster_centers_[c]))]:
                title = docs.clean_title(pages[owner[j]].short, docs.PRODUCT_NAMES.get(s, ()))
                t = re.split(r"\s+[-–—:]\s+", title)[0]
                if t and t.lower() not in {x.lower() for x in labels}:
                    labels.append(" ".join(t.split()[:5]))
                    break
        out[s] = labels
    return out


TRANSFORMS = {
    "ident": lambda s, t, d: t,
    "no_file_count": lambda s, t, d: _TAIL.sub("", t),
    "no_headings": lambda s, t, d: re.sub(r"(Topics|Terms|Distinctive):\s", "", _TAIL.sub("", t)),
    "no_distinctive": lambda s, t, d: re.sub(r"\s*Distinctive: [^.]*\.", "", t),
    "no_topics": lambda s, t, d: re.sub(r"Topics: .*?\.\s(?=Terms:)", "", t),
    "terms_first": lambda s, t, d: (lambda m: t if not m else re.sub(
        r"(\s+[\d.,]+[kKmM]? files?\.)?$", lambda e: " " + m.group(1) + (e.group(1) or ""),
        t.replace(m.group(0), ""), count=1))(re.search(r"(Topics: .*?\.)\s(?=Terms:)", t)),
    "terms_60": lambda s, t, d: _with_terms(t, (section(t, "Terms") or "").split()[:60]),
    "terms_50": lambda s, t, d: _with_terms(t, (section(t, "Terms") or "").split()[:50]),
    "terms_40": lambda s, t, d: _with_terms(t, (section(t, "Terms") or "").split()[:40]),
    "terms_commas": lambda s, t, d: (lambda b: t if b is None else t.replace(f"Terms: {b}.", "Terms: "
                                                                           + ", ".join(b.split()) + "."))(
        section(t, "Terms")),
    "terms_tfidf": lambda s, t, d: _with_terms(t, _baseline(d)[:len((section(t, "Terms") or "").split())]),
    "terms_mix_ob": lambda s, t, d: _mix(t, d, "ob"),
    "terms_mix_oob": lambda s, t, d: _mix(t, d, "oob"),
    "labels_kw2": lambda s, t, d: _labels(t, d, lambda x, w: " ".join((w or [x])[:2])),
    "labels_kw3": lambda s, t, d: _labels(t, d, lambda x, w: " ".join((w or [x])[:3])),
    "label_plus_1": lambda s, t, d: _trim_to(_labels(t, d, _plus_words(1)), routers.tokens_estimate(t)),
    "label_plus_2": lambda s, t, d: _trim_to(_labels(t, d, _plus_words(2)), routers.tokens_estimate(t)),
    "titles": lambda s, t, d: t if s not in page_titles() else re.sub(
        r"Topics: .*?\.(?=\s|$)", lambda _: "Topics: " + ", ".join(page_titles()[s]) + ".", t, count=1),
}


# -- the cells -------------------------------------------------------------------------------------------------------
def cells(transform, topics: bool = False, path=RESULTS / "eval.json") -> list[dict]:
    """The 36 cells for one transform: per family, set, style and router, top-1 % as rendered and transformed, and
    what each must reach (the best baseline no longer than it, or with topics the name alone + 10)."""
    ev = json.loads(path.read_text())
    emb = embedding.default_embedder()
    key = "name_topics" if topics else "name_hybrid"
    out = []
    for fam, (all_key, halves_key) in FAMILIES.items():
        sets = (("tuning half", ev[halves_key]["tune"]), ("reporting half", ev[halves_key]["report"]),
                ("all", ev[all_key]))
        for set_name, src in sets:
            stores = sorted(src["stores"])
            descs = {s: src["stores"][s]["descriptions"] for s in stores}
            texts = {"now": [descs[s][key] or s for s in stores],
                     "new": [transform(s, descs[s][key] or s, descs[s]) for s in stores], "name": stores,
                     **{b: [descs[s][b] for s in stores] for b in routers.BASELINES}}
            for style, qs in queries(fam).items():
                qs = [q for q in qs if q[0] in descs]
                qv, truth = emb([q[1] for q in qs]), np.array([stores.index(q[0]) for q in qs])
                for router in ("MiniLM", "BM25"):
                    def top1(tx: list[str]) -> float:
                        scores = (routers.embedding_scores(qv, emb(tx)) if router == "MiniLM"
                                  else routers.bm25_scores([q[1] for q in qs], tx))
                        return 100 * metrics.rank_metrics(scores, truth, 3)["top1"]["value"]

                    r = {k: top1(v) for k, v in texts.items()}
                    tok = {k: float(np.mean([routers.tokens_estimate(x) for x in v])) for k, v in texts.items()}

                    def goal(which: str) -> float:
                        if topics:
                            return r["name"] + 10
                        return max([r[b] for b in routers.BASELINES if tok[b] <= tok[which]], default=0.0)
                    out.append({"family": fam, "style": style, "set": set_name, "router": router,
                                "now": r["now"], "new": r["new"], "goal_now": goal("now"), "goal_new": goal("new"),
                                "tokens": tok["new"]})
    return out


def totals(rows: list[dict]) -> str:
    """The cells' mean top-1 and how many are at their goal, as rendered -> transformed."""
    n = len(rows)
    now, new = sum(c["now"] >= c["goal_now"] for c in rows), sum(c["new"] >= c["goal_new"] for c in rows)
    return (f"mean top-1 {sum(c['now'] for c in rows) / n:.2f} -> {sum(c['new'] for c in rows) / n:.2f}; cells at "
            f"their goal {now} -> {new} of {n}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("transforms", nargs="*", default=["ident"], metavar="TRANSFORM",
                    help="one or more of: " + ", ".join(TRANSFORMS))
    ap.add_argument("--topics", action="store_true", help="name + the Topics section alone, against name + 10")
    ap.add_argument("--cells", action="store_true", help="print every cell, not only the totals")
    args = ap.parse_args(argv)
    unknown = [t for t in args.transforms if t not in TRANSFORMS]
    if unknown:
        ap.error(f"unknown transform(s) {', '.join(unknown)}; one of: {', '.join(TRANSFORMS)}")
    for name in args.transforms:
        rows = cells(TRANSFORMS[name], args.topics)
        if args.cells:
            for c in rows:
                print(f"  {c['family']:8} {c['style']:12} {c['set']:14} {c['router']:6} {c['now']:5.1f} -> "
                      f"{c['new']:5.1f} (goal {c['goal_now']:5.1f} -> {c['goal_new']:5.1f}, {c['tokens']:.0f} tokens)")
        print(f"{name:16} {totals(rows)}")


if __name__ == "__main__":
    main()
