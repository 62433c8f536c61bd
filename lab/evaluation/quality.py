"""Cost and label quality: the labelling ledger, and NMI / topic diversity of clusterings against the sections.

* ledger(conn): LLM calls and tokens from storetopics.label_ledger (when the installed SQL has it), per labeller,
  per store and per 1,000 file events.
* clusterings(...): the routing stores' chunks pooled into one set (their sections are the ground truth); our
  clustering (plpy/storetopics_clustering.py: KMeans on unit vectors, K by silhouette, c-TF-IDF keywords) and,
  when installed, BERTopic (UMAP + HDBSCAN + c-TF-IDF) on the SAME embeddings; NMI against the sections and topic
  diversity (unique words among all topics' top-10 keywords / (10 x topics)).
* db_clusters(rows): what the database itself holds in topics->'clusters' per store (keyword diversity).
"""
from __future__ import annotations

import importlib.util
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

try:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as STOP
except ImportError:  # pragma: no cover
    STOP = frozenset()


def ledger(conn, file_events: int, stores: int) -> dict:
    if conn.execute("SELECT to_regclass('storetopics.label_ledger')").fetchone()[0] is None:
        return {"available": False, "note": "storetopics.label_ledger does not exist in the installed SQL"}
    rows = conn.execute("""SELECT labeller, coalesce(model, ''), count(*), coalesce(sum(input_tokens), 0),
                                  coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0)::float8,
                                  count(*) FILTER (WHERE outcome = 'ok')
                             FROM storetopics.label_ledger GROUP BY 1, 2 ORDER BY 1, 2""").fetchall()
    by = [{"labeller": r[0], "model": r[1], "calls": r[2], "input_tokens": int(r[3]), "output_tokens": int(r[4]),
           "cost_usd": r[5], "ok": r[6],
           "calls_per_store": r[2] / stores if stores else None,
           "calls_per_1000_file_events": 1000 * r[2] / file_events if file_events else None,
           "tokens_per_1000_file_events": 1000 * (int(r[3]) + int(r[4])) / file_events if file_events else None}
          for r in rows]
    return {"available": True, "file_events": file_events, "stores": stores, "by_labeller": by,
            "note": "" if by else "the ledger is empty: no labelling call was made during the run"}


def words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z0-9+-]*[a-z0-9+]|[a-z]", text.lower()) if w not in STOP and len(w) > 2]


def diversity(topics: list[list[str]], top: int = 10) -> float | None:
    kws = [t[:top] for t in topics if t]
    if not kws:
        return None
    return len({w for t in kws for w in t}) / (top * len(kws))


def nmi(a, b) -> float:
    from sklearn.metrics import normalized_mutual_info_score
    return float(normalized_mutual_info_score(a, b))


def _our_module():
    from storetopics.plpy import storetopics_clustering
    return storetopics_clustering


OURS = "storetopics: chunks in their file's context, KMeans, K by silhouette"
OURS_ALONE = "storetopics clustering of the chunk vectors alone (no file context)"


def ours(texts: list[str], vecs: np.ndarray, truth: list[str], seed: int = 0, method: str = OURS_ALONE) -> dict:
    """Our clustering of `vecs` (KMeans, K by silhouette, c-TF-IDF words); `method` names what vecs are."""
    mod = _our_module()
    t0 = time.perf_counter()
    f = mod.fit(vecs, seed=seed, k_min=5, k_max=30)
    labels = np.asarray(f.labels)
    terms = {int(c): Counter() for c in set(labels.tolist())}
    for t, c in zip(texts, labels.tolist()):
        terms[int(c)].update(words(t))
    kw = mod.ctfidf({c: dict(v) for c, v in terms.items()}, top=10)
    return {"method": method, "topics": int(f.k),
            "silhouette": f.silhouette, "nmi": nmi(truth, labels.tolist()),
            "diversity": diversity(list(kw.values())), "keywords": {str(c): v for c, v in kw.items()},
            "seconds": time.perf_counter() - t0}


def bertopic(texts: list[str], vecs: np.ndarray, truth: list[str], seed: int = 0,
             method: str = "BERTopic 0.17 defaults (UMAP 5-d + HDBSCAN + c-TF-IDF), same embeddings") -> dict:
    if importlib.util.find_spec("bertopic") is None:
        return {"method": "BERTopic", "available": False, "note": "bertopic is not installed (extra `eval`)"}
    import warnings
    t0 = time.perf_counter()
    from bertopic import BERTopic
    from sklearn.feature_extraction.text import CountVectorizer
    from umap import UMAP
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BERTopic(umap_model=UMAP(n_neighbors=15, n_components=5, min_dist=0.0, metric="cosine",
                                         random_state=seed),
                         vectorizer_model=CountVectorizer(stop_words="english"), calculate_probabilities=False,
                         verbose=False)
        topics, _ = model.fit_transform(texts, embeddings=vecs)
    topics = np.asarray(topics)
    kws = [[w for w, _ in (model.get_topic(t) or [])][:10] for t in sorted(set(topics.tolist())) if t != -1]
    inl = topics != -1
    truth_a = np.asarray(truth)
    return {"method": method, "available": True, "topics": int(len(kws)), "outlier_share": float(np.mean(~inl)),
            "nmi": nmi(truth, topics.tolist()),
            "nmi_inliers": nmi(truth_a[inl].tolist(), topics[inl].tolist()) if inl.any() else None,
            "diversity": diversity(kws),
            "largest_topic_share": float(max(Counter(topics[inl].tolist()).values()) / len(topics)) if inl.any()
            else None,
            "seconds": time.perf_counter() - t0}


def clusterings(texts: list[str], vecs: np.ndarray, truth: list[str], files=None, *, sample: int,
                with_bertopic: bool, seed: int = 0, log=print) -> dict:
    """NMI and diversity of: our clustering (chunks in their file's context, as the extension clusters them, when
    `files` is given; file contexts come from all of a file's chunks, the sample only picks which chunks are
    scored), ours on the chunk vectors alone, BERTopic's default pipeline on the chunk vectors, and BERTopic given
    the same file-context vectors as ours (so the comparison separates the method from the context)."""
    n = len(texts)
    idx = np.sort(np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False))
    t = [texts[i] for i in idx]
    v = vecs[idx]
    y = [truth[i] for i in idx]
    out = {"chunks": len(idx), "sections": len(set(y))}
    ctx = _our_module().in_file_context(vecs, files)[idx] if files is not None else None
    runs = [("ours", ctx, OURS), ("ours_chunks_alone", v, OURS_ALONE)] if ctx is not None else [("ours", v, OURS_ALONE)]
    for key, vv, method in runs:
        o = out[key] = ours(t, vv, y, seed=seed, method=method)
        log(f"quality: {key} K={o['topics']}, NMI {o['nmi']:.3f}, diversity {o['diversity']:.2f} "
            f"[{o['seconds']:.0f}s]")
    b_runs = [("bertopic", v, "BERTopic 0.17 defaults (UMAP 5-d + HDBSCAN + c-TF-IDF), same chunk embeddings")]
    if ctx is not None:
        b_runs.append(("bertopic_file_context", ctx, "BERTopic 0.17 defaults on our file-context vectors"))
    for key, vv, method in b_runs:
        if not with_bertopic:
            out[key] = {"method": method, "available": False, "note": "not run (--no-bertopic)"}
            continue
        try:
            out[key] = bertopic(t, vv, y, seed, method=method)
        except Exception as e:  # report, do not hide, a BERTopic failure
            out[key] = {"method": method, "available": False, "note": f"failed: {e!r}"}
        b = out[key]
        if b.get("available"):
            log(f"quality: {key} {b['topics']} topics, NMI {b['nmi']:.3f}, diversity {b['diversity']:.2f} "
                f"[{b['seconds']:.0f}s]")
        else:
            log(f"quality: {key} not run: {b.get('note')}")
    return out


def db_clusters(topics_by_store: dict[str, dict | None]) -> dict:
    per = {}
    for s, topics in topics_by_store.items():
        cl = (topics or {}).get("clusters") or []
        per[s] = {"clusters": len(cl), "labels": [c.get("label") for c in cl],
                  "diversity": diversity([c.get("keywords") or [] for c in cl])}
    have = [p for p in per.values() if p["clusters"]]
    return {"available": bool(have), "stores_with_clusters": len(have), "per_store": per,
            "note": "" if have else "topics->'clusters' is empty in every store: the cluster signal is not "
                                    "in the installed SQL yet"}
