"""Routing metrics with confidence intervals: top-1 accuracy, recall@k (Wilson 95%), paired bootstrap differences;
abstention (retrieve or not) precision, recall and F1 over a score threshold."""
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


def abstention(top_in: np.ndarray, top_out: np.ndarray, threshold: float, reps: int = 2000, seed: int = 0) -> dict:
    """Retrieve-or-not at one threshold: a router abstains on a query when its best store's score is below the
    threshold.  The positive class is "abstain": precision = share of the abstentions that were queries no store
    holds, recall = share of those queries it abstained on (Wilson 95%), F1 with a 95% percentile bootstrap interval
    (queries of each kind resampled apart)."""
    top_in, top_out = np.asarray(top_in, float), np.asarray(top_out, float)
    tp, fp = int(np.sum(top_out < threshold)), int(np.sum(top_in < threshold))
    fn = len(top_out) - tp

    def f1(tp_, fp_, fn_):
        return 2 * tp_ / (2 * tp_ + fp_ + fn_) if tp_ else 0.0

    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(reps):
        o = top_out[rng.integers(0, len(top_out), len(top_out))] if len(top_out) else top_out
        i = top_in[rng.integers(0, len(top_in), len(top_in))] if len(top_in) else top_in
        t = int(np.sum(o < threshold))
        boot.append(f1(t, int(np.sum(i < threshold)), len(o) - t))
    p_lo, p_hi = wilson(tp, tp + fp)
    r_lo, r_hi = wilson(tp, tp + fn)
    return {"threshold": float(threshold), "abstained_out": tp, "abstained_in": fp, "out": len(top_out),
            "in": len(top_in),
            "precision": {"value": tp / (tp + fp) if tp + fp else float("nan"), "ci95": [p_lo, p_hi]},
            "recall": {"value": tp / (tp + fn) if tp + fn else float("nan"), "ci95": [r_lo, r_hi]},
            "f1": {"value": f1(tp, fp, fn),
                   "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))] if boot else
                   [float("nan"), float("nan")]}}


def abstention_curve(top_in, top_out, thresholds) -> list[dict]:
    """Precision, recall and F1 of abstaining (see abstention) at each threshold, without intervals."""
    top_in, top_out = np.asarray(top_in, float), np.asarray(top_out, float)
    out = []
    for t in thresholds:
        tp, fp = int(np.sum(top_out < t)), int(np.sum(top_in < t))
        fn = len(top_out) - tp
        out.append({"threshold": float(t), "precision": tp / (tp + fp) if tp + fp else float("nan"),
                    "recall": tp / (tp + fn) if tp + fn else float("nan"),
                    "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0})
    return out


def best_threshold(top_in, top_out) -> float:
    """The threshold with the best abstention F1: every distinct score tried as "abstain below it", the lowest of
    equally good ones kept."""
    top_in, top_out = np.asarray(top_in, float), np.asarray(top_out, float)
    cands = np.unique(np.concatenate([top_in, top_out]))
    best, best_t = -1.0, float(cands[0]) if len(cands) else 0.0
    for t in cands:
        tp, fp = int(np.sum(top_out < t)), int(np.sum(top_in < t))
        f = 2 * tp / (2 * tp + fp + (len(top_out) - tp)) if tp else 0.0
        if f > best:
            best, best_t = f, float(t)
    return best_t


def auc(top_in, top_out) -> float:
    """Probability that a query some store holds scores above one no store holds (ties count half)."""
    a, b = np.asarray(top_in, float), np.asarray(top_out, float)
    if not len(a) or not len(b):
        return float("nan")
    return float(np.mean(b[:, None] < a[None, :]) + 0.5 * np.mean(b[:, None] == a[None, :]))
