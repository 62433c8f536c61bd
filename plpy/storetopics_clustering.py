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

FLOOR = 0.02          # best silhouette less than this above a structureless reference: one theme
GRID_SAMPLE = 8000    # vectors used to score each K


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
    null_silhouette: float = 0.0  # the same K on the same data with its structure destroyed (the floor's base)


def parse_vectors(blob: bytes, n: int) -> np.ndarray:
    """Vectors from concatenated pgvector binary sends (int16 dim, int16 unused, float4 big-endian x dim)."""
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    dim = struct.unpack(">h", blob[:2])[0]
    rec = 4 + 4 * dim
    if len(blob) != n * rec:
        raise ValueError("vectors of different dimensions in one sample")
    # a strided big-endian view of the floats (no copy), converted once: one float32 array is the only new memory
    floats = np.ndarray((n, dim), dtype=">f4", buffer=blob, offset=4, strides=(rec, 4))
    return floats.astype(np.float32)


def unit(x: np.ndarray, in_place: bool = False) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]      # no temporary the size of x (np.linalg.norm makes one)
    norms[norms == 0] = 1.0
    if in_place and x.dtype == np.float32:
        x /= norms
        return x
    return (x / norms).astype(np.float32)


def in_file_context(x: np.ndarray, files) -> np.ndarray:
    """Each row as the unit sum of its own direction and its file's mean direction: what storetopics clusters (the
    extension computes the same in SQL, in _fit_input and _assign).  For callers holding vectors and file ids
    (the evaluation)."""
    u = unit(np.asarray(x, dtype=np.float32))
    _, owner = np.unique(np.asarray(files), return_inverse=True)
    means = np.zeros((owner.max() + 1, u.shape[1]), dtype=np.float32)
    np.add.at(means, owner, u)
    return unit(u + unit(means)[owner], in_place=True)


def _kmeans(x: np.ndarray, k: int, seed: int, n_init: int = 1):
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=k, n_init=n_init, random_state=seed, max_iter=100).fit(x)


def lloyd(x: np.ndarray, centroids: np.ndarray, max_iter: int = 100, tol: float = 1e-6,
          block: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """KMeans on unit vectors from given centroids (Lloyd's iterations, cosine: nearest = largest dot product,
    centroid = unit mean of its members), over blocks of rows so that nothing but x itself is as big as x
    (scikit-learn's KMeans copies x to centre it and again for its tolerance: 2 x 307 MB at 50k x 1536-d).  Stops
    when no centroid moves by more than `tol` in cosine distance.  Returns (labels, unit centroids)."""
    c = unit(np.asarray(centroids, dtype=np.float32))
    labels = np.empty(len(x), dtype=np.int64)
    for _ in range(max_iter):
        sums = np.zeros_like(c, dtype=np.float64)
        for a in range(0, len(x), block):
            part = x[a:a + block]
            lab = np.argmax(part @ c.T, axis=1)
            labels[a:a + block] = lab
            onehot = np.zeros((len(c), len(part)), dtype=np.float32)
            onehot[lab, np.arange(len(part))] = 1.0
            sums += onehot @ part                  # per-centroid sums (np.add.at: 30x slower)
        empty = ~sums.any(axis=1)
        sums[empty] = c[empty]                     # an emptied centroid stays where it was
        new = unit(sums.astype(np.float32))
        moved = float(np.max(1.0 - np.einsum("ij,ij->i", new, c)))
        c = new
        if moved <= tol:
            break
    for a in range(0, len(x), block):                # the members of the final centroids
        labels[a:a + block] = np.argmax(x[a:a + block] @ c.T, axis=1)
    return labels, c


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


def _project(x: np.ndarray, seed: int, dims: int = 32) -> np.ndarray:
    """x projected on its first `dims` principal components, unit length again (x itself when small already)."""
    if x.shape[1] <= dims or len(x) <= dims:
        return x
    from sklearn.decomposition import PCA

    return unit(PCA(dims, random_state=seed, svd_solver="randomized").fit_transform(x).astype(np.float32))


def silhouette(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette with cosine distance, exact, in O(n K d) instead of O(n^2 d): on unit vectors the mean
    distance from x_i to the members of cluster c is 1 - x_i . mean(c) (the own cluster excludes x_i itself)."""
    ks, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if len(ks) < 2:
        return 0.0
    order = np.argsort(inv, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sums = np.add.reduceat(x[order], starts, axis=0)          # per-cluster sums of the vectors
    dots = x @ sums.T                                           # x_i . sum(c)
    mean_dist = 1.0 - dots / counts                             # mean distance to each cluster (self included)
    own = inv
    n_own = counts[own]
    a = np.where(n_own > 1, (n_own - dots[np.arange(len(x)), own]) / np.maximum(n_own - 1, 1), 0.0)
    mean_dist[np.arange(len(x)), own] = np.inf
    b = mean_dist.min(axis=1)
    s = np.where(n_own > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0.0)
    return float(s.mean())


def _fit(vectors: np.ndarray, *, seed: int = 0, k_min: int = 5, k_max: int = 30, floor: float = FLOOR,
         radius_percentile: float = 95.0, n_representatives: int = 3) -> Fit:
    x = np.asarray(vectors, dtype=np.float32)
    if len(x) and not np.allclose(np.einsum("ij,ij->i", x, x), 1.0, atol=1e-4):
        x = unit(x)                             # a unit copy; unit vectors (the usual case) are used as they are
    n = len(x)
    rng = np.random.default_rng(seed)
    scores: dict[int, float] = {}
    models: dict[int, object] = {}
    k_max = min(k_max, max(1, n // 5))
    if n >= 10 and k_max >= 2:
        grid_full = x[rng.choice(n, GRID_SAMPLE, replace=False)] if n > GRID_SAMPLE else x
        # K is searched in a PCA projection of the sub-sample (32 dimensions, unit length again): the same
        # partitions at a fraction of the cost (NMI 0.475 vs 0.473 against Debian sections, 6x faster); the
        # centroids are then fitted in the vectors' own space, where pgvector will compare chunks with them.
        grid_x = _project(grid_full, seed)

        def score(k: int, n_init: int = 1) -> None:
            if k in scores or k < 2 or k >= len(grid_x):
                return
            km = _kmeans(grid_x, k, seed, n_init=n_init)
            if len(set(km.labels_.tolist())) < 2:
                return
            models[k] = km
            scores[k] = silhouette(grid_x, km.labels_)

        # A coarse geometric grid first, then every K between the best grid point's neighbours (at most 3 away),
        # with four KMeans starts each: these are the close calls, and one start can merge two real clusters.
        grid = k_grid(min(k_min, k_max), k_max)
        for k in grid:
            score(k)
        if scores:
            best_grid = max(scores, key=lambda k: (scores[k], -k))
            i = grid.index(best_grid)
            lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
            for k in range(max(lo + 1, best_grid - 3), min(hi, best_grid + 4)):
                score(k, n_init=4)
    best_k = max(scores, key=lambda k: (scores[k], -k)) if scores else 1
    best = scores.get(best_k, 0.0)
    # The floor is relative to the same data with its structure destroyed (each coordinate permuted on its own,
    # which keeps every coordinate's distribution): KMeans finds some silhouette in pure noise too (0.048 for
    # 3,000 random 32-d vectors), and real text embeddings score low in absolute terms (0.05-0.09 for Debian
    # sections with all-MiniLM-L6-v2) but far above their reference (-0.005-0.005).
    null = 0.0
    if best_k > 1:
        perm = np.random.default_rng(seed + 1)
        grid_null = unit(np.column_stack([perm.permutation(grid_x[:, j]) for j in range(grid_x.shape[1])]))
        null = silhouette(grid_null, _kmeans(grid_null, best_k, seed).labels_)
    single = best - null < floor or best_k == 1
    k = 1 if single else best_k
    if k == 1:
        labels = np.zeros(n, dtype=np.int64)
        centroids = x.mean(axis=0, keepdims=True)
    else:
        # The chosen K once more with four starts (the lowest inertia wins): one start can merge two real clusters
        # and split another, and a re-fit with another seed must find the same partition to keep its labels.
        best_model = _kmeans(grid_x, k, seed, n_init=4)
        if best_model.inertia_ > models[k].inertia_:
            best_model = models[k]
        # back in the vectors' own space: the projected clusters' means start KMeans on the whole sample, which
        # converges in a few passes
        start = np.vstack([grid_full[best_model.labels_ == i].mean(axis=0) for i in range(k)])
        labels, centroids = lloyd(x, start)
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
               labels=labels, null_silhouette=null)


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
# One store's fit, end to end: read the sample (storetopics._fit_input), fit, match, write (storetopics._apply_fit).
# The same code runs inside Postgres (plpython3u: PlpyDatabase) and in the worker/CLI (psycopg: PsycopgDatabase).
# ------------------------------------------------------------------------------------------------------------
class PlpyDatabase:
    """The two statements fit_store needs, through plpython's plpy."""

    def __init__(self, plpy):
        self.plpy = plpy
        self._plans = {}

    def _plan(self, query: str, types: list[str]):
        plan = self._plans.get(query)
        if plan is None:
            plan = self._plans[query] = self.plpy.prepare(query, types)
        return plan

    def one(self, query: str, types: list[str], args: list):
        rows = self.plpy.execute(self._plan(query, types), args)
        return dict(rows[0]) if len(rows) else None

    def rows(self, query: str, types: list[str], args: list):
        """The rows one at a time (a cursor), not all of them in memory at once."""
        for row in self.plpy.cursor(self._plan(query, types), args):
            yield dict(row)


class PsycopgDatabase:
    """The same through a psycopg 3 connection ($n placeholders become %s, in order)."""

    def __init__(self, conn):
        self.conn = conn

    def one(self, query: str, types: list[str], args: list):
        import re

        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(re.sub(r"\$\d+", "%s", query), args, binary=True)
            return cur.fetchone()

    def rows(self, query: str, types: list[str], args: list):
        """The rows one at a time (libpq's single-row mode), in binary: a bytea arrives as its bytes, not as hex."""
        import re

        from psycopg.rows import dict_row

        with self.conn.cursor(row_factory=dict_row) as cur:
            yield from cur.stream(re.sub(r"\$\d+", "%s", query), args, binary=True)


def _jsonish(v):
    import json

    return json.loads(v) if isinstance(v, str) else v


def space_fingerprint(x: np.ndarray, model: str | None) -> str:
    """What space the vectors live in: the model's name when configured, else the dimension and the coordinates
    where the sample's mean is largest (models have a few such 'rogue' dimensions, stable across texts)."""

    dim = x.shape[1]
    if model:
        return f"{model} ({dim}-d)"
    top = np.argsort(-np.abs(x.mean(axis=0)))[:4]
    return f"{dim}-d, mean peaks at {','.join(str(int(i)) for i in sorted(top))}"


def heir_of(members: np.ndarray, old: np.ndarray, old_ids: list, radii: list, share: float = 0.5):
    """The old cluster most of a new cluster's members belonged to (nearest old centroid, within its radius), when
    at least `share` of the members lay inside old clusters: a split, a merge or a re-cut of known regions, not a
    new theme.  Outliers of the old fit (a new theme forming) belong to no old cluster."""
    if not len(old_ids) or not len(members):
        return None
    d = 1.0 - members @ unit(old).T
    nearest = np.argmin(d, axis=1)
    inside = d[np.arange(len(members)), nearest] <= np.asarray(radii, dtype=np.float32)[nearest]
    counts = np.bincount(nearest[inside], minlength=len(old_ids))
    i = int(np.argmax(counts))
    return old_ids[i] if inside.mean() >= share else None


def read_sample(db, source: int, store: str):
    """storetopics._fit_input read part by part into one preallocated float32 array: (part 0's row, the vectors,
    their chunk refs).  Only one part's bytes are in memory besides the array."""
    head, x, refs = None, None, []
    for r in db.rows("SELECT * FROM storetopics._fit_input($1, $2)", ["int", "text"], [source, store]):
        if head is None:
            head = r
            n, dim = int(r["n"] or 0), int(r["dim"] or 0)
            x = np.empty((n, dim), dtype=np.float32)
        blob = r.pop("vectors")
        if blob is None:
            continue
        part = list(r["refs"])
        x[len(refs):len(refs) + len(part)] = parse_vectors(blob if isinstance(blob, bytes) else bytes(blob),
                                                           len(part))
        refs += part
    if head is None or len(refs) != len(x):
        raise RuntimeError(f"storetopics._fit_input gave {len(refs)} vectors of {0 if x is None else len(x)}")
    return head, x, refs


def fit_store(db, source: int, store: str) -> str:
    """Fit one store's clusters and apply them; returns apply_fit's jsonb report (as text for plpython)."""
    import json
    import time

    t0 = time.monotonic()
    row, x, refs = read_sample(db, source, store)
    cfg = _jsonish(row["settings"])
    n = len(refs)
    if n < int(cfg["min_vectors"]):
        return json.dumps({"applied": False, "reason": f"{n} vectors, fewer than min_vectors {cfg['min_vectors']}"})
    t_read = time.monotonic() - t0
    x = unit(x, in_place=True)
    seed = int(cfg["seed"])
    f = fit(x, seed=seed, k_min=int(cfg["k_min"]), k_max=int(cfg["k_max"]), floor=float(cfg["silhouette_floor"]),
            radius_percentile=float(cfg["radius_percentile"]))
    t_fit = time.monotonic() - t0 - t_read
    old_ids = list(row["old_ids"] or [])
    old = parse_vectors(bytes(row["old_centroids"]), len(old_ids)) if old_ids else np.zeros((0, x.shape[1]))
    pairs = match(list(old), [c.centroid for c in f.clusters], float(cfg["reuse_distance"]))
    radii = list(row["old_radii"] or [])
    clusters = [{"centroid": [round(float(v), 7) for v in c.centroid],
                 "radius": float(c.radius), "size": int(c.size),
                 "representatives": [refs[i] for i in c.representatives],
                 "reuse": old_ids[pairs[j]] if j in pairs else None,
                 "inherit": None if j in pairs else heir_of(x[c.members], old, old_ids, radii)}
                for j, c in enumerate(f.clusters)]
    fit_json = {"generation": int(row["generation"]), "k": f.k, "silhouette": round(float(f.silhouette), 6),
                "single_theme": bool(f.single_theme), "sample": n, "seed": seed, "dim": int(x.shape[1]),
                "space": space_fingerprint(x, cfg.get("embedding_model")), "method": row["method"],
                "seconds": round(time.monotonic() - t0, 3), "clusters": clusters}
    # (0.1 named it apply_fit: a 0.1 database keeps clustering after this module is installed, until it is updated)
    apply = "_apply_fit" if db.one("SELECT to_regprocedure('storetopics._apply_fit(int, text, jsonb)') IS NOT NULL "
                                   "AS x", [], [])["x"] else "apply_fit"
    out = db.one(f"SELECT storetopics.{apply}($1, $2, $3::jsonb) AS r", ["int", "text", "jsonb"],
                 [source, store, json.dumps(fit_json)])["r"]
    report = _jsonish(out)
    report["seconds"] = round(time.monotonic() - t0, 3)
    report["seconds_read_sample"] = round(t_read, 3)
    report["seconds_fit"] = round(t_fit, 3)
    report["seconds_apply"] = round(report["seconds"] - t_read - t_fit, 3)
    report["null_silhouette"] = round(float(f.null_silhouette), 6)
    report["sampling"] = row["method"]
    report["silhouette"] = fit_json["silhouette"]
    return json.dumps(report)
