"""Routing metrics with confidence intervals: top-1 accuracy, recall@k (Wilson 95%), paired bootstrap differences."""
from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def ranks(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Rank (1 = best) of the true store for each query; ties count against the router (pessimistic)."""
    true_scores = scores[np.arange(len(truth)), truth]
    return np.sum(scores >= true_scores[:, None], axis=1)


def summarize(hits: np.ndarray) -> dict:
    n, k = int(len(hits)), int(np.sum(hits))
    lo, hi = wilson(k, n)
    return {"value": k / n if n else float("nan"), "hits": k, "n": n, "ci95": [lo, hi]}


def rank_metrics(scores: np.ndarray, truth: np.ndarray, k: int = 3) -> dict:
    r = ranks(scores, truth)
    return {"top1": summarize(r == 1), f"recall@{k}": summarize(r <= k),
            "mrr": float(np.mean(1.0 / r)) if len(r) else float("nan"), "ranks": r.tolist()}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, reps: int = 2000, seed: int = 0) -> dict:
    """Difference of means a - b over the same queries, with a 95% percentile bootstrap interval."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(reps, len(a)))
    d = a[idx].mean(axis=1) - b[idx].mean(axis=1)
    return {"diff": float(a.mean() - b.mean()), "ci95": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))]}
