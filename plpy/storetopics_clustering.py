"""Clustering a store's embeddings: one implementation, used inside Postgres (plpython3u) and by the worker.

Pure numpy + scikit-learn, no database access: callers hand in vectors and get back plain Python structures.
Works with Debian's python3-numpy 1.24 / scikit-learn 1.2 (plpython3u's interpreter) and with current releases.

fit():        KMeans on unit vectors (so Euclidean KMeans ~ cosine), K chosen by silhouette on a sub-sample over a
              coarse grid; a store whose best silhouette is under a floor has no real structure: one theme.
match():      pairs new clusters with the previous fit's by centroid (Hungarian on cosine distance), never by label
              number, so labels survive a re-fit of unchanged data.
ctfidf():     each cluster's distinctive terms: c-TF-IDF (cluster term frequency x log(1 + A / f_t)).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

FLOOR = 0.04          # best silhouette under this: no real structure, one theme
SILHOUETTE_SAMPLE = 5000
GRID_SAMPLE = 12000   # vectors used to score each K


@dataclass
class Cluster:
    index: int                    # position in this fit
    centroid: np.ndarray          # unit length
    size: int                     # members in the sample
    radius: float                 # cosine distance marking outliers (high percentile of members' distances)
    representatives: list[int]    # sample row numbers of the members nearest the centroid
    members: np.ndarray = field(repr=False, default=None)


@dataclass
class Fit:
    k: int
    silhouette: float
    single_theme: bool
    scores: dict                  # K -> silhouette
    clusters: list[Cluster]
    labels: np.ndarray            # cluster index per sample row


def parse_vectors(blob: bytes, n: int) -> np.ndarray:
    """Vectors from concatenated pgvector binary sends (int16 dim, int16 unused, float4 big-endian x dim)."""
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    dim = struct.unpack(">h", blob[:2])[0]
    rec = 4 + 4 * dim
    if len(blob) != n * rec:
        raise ValueError("vectors of different dimensions in one sample")
    raw = np.frombuffer(blob, dtype=np.uint8).reshape(n, rec)[:, 4:]
    return raw.copy().view(">f4").astype(np.float32).reshape(n, dim)


def unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (x / norms).astype(np.float32)


def _kmeans(x: np.ndarray, k: int, seed: int, n_init: int = 1, init=None):
    from sklearn.cluster import KMeans

    if init is not None:
        return KMeans(n_clusters=k, init=init, n_init=1, random_state=seed, max_iter=100).fit(x)
    return KMeans(n_clusters=k, n_init=n_init, random_state=seed, max_iter=100).fit(x)


def _one_thread():
    """BLAS/OpenMP limited to one thread for the fit: inside a Postgres backend a thread pool is unwelcome, and on a
    busy machine two spinning OpenMP threads made one KMeans 12x slower (1.83 s vs 0.14 s, 3.5k x 384, K=18)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn depends on it
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(1)


def k_grid(k_min: int, k_max: int) -> list[int]:
    k_min, k_max = max(2, k_min), max(2, k_max)
    if k_max <= k_min:
        return [k_min]
    return sorted({int(round(k)) for k in np.geomspace(k_min, k_max, 7)})


def fit(vectors: np.ndarray, **kw) -> Fit:
    with _one_thread():
        return _fit(vectors, **kw)


def _fit(vectors: np.ndarray, *, seed: int = 0, k_min: int = 5, k_max: int = 30, floor: float = FLOOR,
         radius_percentile: float = 95.0, n_representatives: int = 3) -> Fit:
    from sklearn.metrics import silhouette_score

    x = unit(np.asarray(vectors, dtype=np.float32))
    n = len(x)
    rng = np.random.default_rng(seed)
    scores: dict[int, float] = {}
    models: dict[int, object] = {}
    k_max = min(k_max, max(1, n // 5))
    if n >= 10 and k_max >= 2:
        grid_x = x[rng.choice(n, GRID_SAMPLE, replace=False)] if n > GRID_SAMPLE else x

        def score(k: int) -> None:
            if k in scores or k < 2 or k >= len(grid_x):
                return
            km = _kmeans(grid_x, k, seed)
            if len(set(km.labels_.tolist())) < 2:
                return
            models[k] = km
            scores[k] = float(silhouette_score(grid_x, km.labels_, sample_size=min(SILHOUETTE_SAMPLE, len(grid_x)),
                                               random_state=seed))

        # A coarse geometric grid first, then every K between the best grid point's neighbours.
        grid = k_grid(min(k_min, k_max), k_max)
        for k in grid:
            score(k)
        if scores:
            best_grid = max(scores, key=lambda k: (scores[k], -k))
            i = grid.index(best_grid)
            lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
            for k in range(lo + 1, hi):
                score(k)
    best_k = max(scores, key=lambda k: (scores[k], -k)) if scores else 1
    best = scores.get(best_k, 0.0)
    single = best < floor or best_k == 1
    k = 1 if single else best_k
    if k == 1:
        labels = np.zeros(n, dtype=np.int64)
        centroids = x.mean(axis=0, keepdims=True)
    elif len(x) == len(grid_x):
        km = models[k]                            # the grid already fitted this very sample
        labels = km.labels_.astype(np.int64)
        centroids = km.cluster_centers_
    else:
        # the whole sample, started from the grid's centroids for this K: converges in a few passes
        km = _kmeans(x, k, seed, init=models[k].cluster_centers_)
        labels = km.labels_.astype(np.int64)
        centroids = km.cluster_centers_
    centroids = unit(centroids)
    clusters = []
    for i in range(k):
        members = np.flatnonzero(labels == i)
        if len(members) == 0:
            continue
        dist = 1.0 - x[members] @ centroids[i]
        order = np.argsort(dist, kind="stable")
        clusters.append(Cluster(index=i, centroid=centroids[i], size=int(len(members)),
                                radius=float(np.percentile(dist, radius_percentile)),
                                representatives=[int(members[j]) for j in order[:n_representatives]],
                                members=members))
    clusters.sort(key=lambda c: (-c.size, c.index))
    return Fit(k=len(clusters), silhouette=best, single_theme=single, scores=scores, clusters=clusters,
               labels=labels)


def match(old_centroids: list[np.ndarray], new_centroids: list[np.ndarray], threshold: float) -> dict[int, int]:
    """new index -> old index, for pairs closer than `threshold` in cosine distance (one-to-one, Hungarian)."""
    if not old_centroids or not new_centroids:
        return {}
    from scipy.optimize import linear_sum_assignment

    a = unit(np.vstack(new_centroids))
    b = unit(np.vstack(old_centroids))
    cost = 1.0 - a @ b.T
    rows, cols = linear_sum_assignment(cost)
    return {int(r): int(c) for r, c in zip(rows, cols) if cost[r, c] <= threshold}


def ctfidf(cluster_terms: dict[int, dict[str, int]], top: int = 10, min_count: int = 2) -> dict[int, list[str]]:
    """Per cluster, its most distinctive terms by c-TF-IDF (BERTopic's class-based TF-IDF):
    tf(t, c) x log(1 + A / f(t)), A = average number of counted words per cluster, f(t) = count of t in all."""
    totals: dict[str, int] = {}
    words = []
    for terms in cluster_terms.values():
        words.append(sum(terms.values()))
        for t, n in terms.items():
            totals[t] = totals.get(t, 0) + n
    if not words:
        return {}
    avg = sum(words) / len(words)
    out = {}
    for c, terms in cluster_terms.items():
        size = sum(terms.values()) or 1
        scored = [((n / size) * np.log(1 + avg / totals[t]), t) for t, n in terms.items() if n >= min_count]
        scored.sort(key=lambda s: (-s[0], s[1]))
        out[c] = [t for _, t in scored[:top]]
    return out


# ------------------------------------------------------------------------------------------------------------
# One store's fit, end to end: read the sample (storetopics._fit_input), fit, match, write (storetopics.apply_fit).
# The same code runs inside Postgres (plpython3u: PlpyDatabase) and in the worker/CLI (psycopg: PsycopgDatabase).
# ------------------------------------------------------------------------------------------------------------
class PlpyDatabase:
    """The two statements fit_store needs, through plpython's plpy."""

    def __init__(self, plpy):
        self.plpy = plpy
        self._plans = {}

    def one(self, query: str, types: list[str], args: list):
        plan = self._plans.get(query)
        if plan is None:
            plan = self._plans[query] = self.plpy.prepare(query, types)
        rows = self.plpy.execute(plan, args)
        return dict(rows[0]) if len(rows) else None


class PsycopgDatabase:
    """The same through a psycopg 3 connection ($n placeholders become %s, in order)."""

    def __init__(self, conn):
        self.conn = conn

    def one(self, query: str, types: list[str], args: list):
        import re

        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(re.sub(r"\$\d+", "%s", query), args)
            return cur.fetchone()


def _jsonish(v):
    import json

    return json.loads(v) if isinstance(v, str) else v


def space_fingerprint(x: np.ndarray, model: str | None) -> str:
    """What space the vectors live in: the model's name when configured, else the dimension and the coordinates
    where the sample's mean is largest (models have a few such 'rogue' dimensions, stable across texts)."""
    import hashlib

    dim = x.shape[1]
    if model:
        return f"{model} ({dim}-d)"
    top = np.argsort(-np.abs(x.mean(axis=0)))[:4]
    return f"{dim}-d, mean peaks at {','.join(str(int(i)) for i in sorted(top))}"


def fit_store(db, source: int, store: str) -> str:
    """Fit one store's clusters and apply them; returns apply_fit's jsonb report (as text for plpython)."""
    import json
    import time

    t0 = time.monotonic()
    row = db.one("SELECT * FROM storetopics._fit_input($1, $2)", ["int", "text"], [source, store])
    cfg = _jsonish(row["settings"])
    n = int(row["n"] or 0)
    if n < int(cfg["min_vectors"]):
        return json.dumps({"applied": False, "reason": f"{n} vectors, fewer than min_vectors {cfg['min_vectors']}"})
    x = unit(parse_vectors(bytes(row["vectors"]), n))
    refs = list(row["refs"])
    seed = int(cfg["seed"])
    f = fit(x, seed=seed, k_min=int(cfg["k_min"]), k_max=int(cfg["k_max"]), floor=float(cfg["silhouette_floor"]),
            radius_percentile=float(cfg["radius_percentile"]))
    old_ids = list(row["old_ids"] or [])
    old = parse_vectors(bytes(row["old_centroids"]), len(old_ids)) if old_ids else np.zeros((0, x.shape[1]))
    pairs = match(list(old), [c.centroid for c in f.clusters], float(cfg["reuse_distance"]))
    clusters = [{"centroid": [round(float(v), 7) for v in c.centroid],
                 "radius": float(c.radius), "size": int(c.size),
                 "representatives": [refs[i] for i in c.representatives],
                 "reuse": old_ids[pairs[j]] if j in pairs else None}
                for j, c in enumerate(f.clusters)]
    fit_json = {"generation": int(row["generation"]), "k": f.k, "silhouette": round(float(f.silhouette), 6),
                "single_theme": bool(f.single_theme), "sample": n, "seed": seed, "dim": int(x.shape[1]),
                "space": space_fingerprint(x, cfg.get("embedding_model")), "method": row["method"],
                "seconds": round(time.monotonic() - t0, 3), "clusters": clusters}
    out = db.one("SELECT storetopics.apply_fit($1, $2, $3::jsonb) AS r", ["int", "text", "jsonb"],
                 [source, store, json.dumps(fit_json)])["r"]
    report = _jsonish(out)
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["sampling"] = row["method"]
    report["silhouette"] = fit_json["silhouette"]
    return json.dumps(report)
