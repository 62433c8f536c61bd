"""plpy/storetopics_clustering.py: K by silhouette with a floor, matching across fits by centroid, c-TF-IDF.
Small synthetic data: these check behaviour, not speed."""
from __future__ import annotations

import struct

import numpy as np

from storetopics.plpy import storetopics_clustering as sc


def blobs(k: int, per: int, dim: int = 32, spread: float = 0.06, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = sc.unit(rng.normal(size=(k, dim)))
    x = np.vstack([c + rng.normal(scale=spread, size=(per, dim)) for c in centers])
    return x, np.repeat(np.arange(k), per)


def test_finds_the_structure_and_reports_sizes_radius_representatives():
    x, truth = blobs(7, 300)
    fit = sc.fit(x, seed=1, k_min=3, k_max=12)
    assert fit.k == 7 and not fit.single_theme and fit.silhouette > 0.3
    assert sorted(c.size for c in fit.clusters) == [300] * 7
    for c in fit.clusters:
        assert len(set(truth[c.members])) == 1                       # pure clusters
        assert len(c.representatives) == 3 and set(c.representatives) <= set(c.members.tolist())
        assert 0 < c.radius < 0.5
        assert abs(np.linalg.norm(c.centroid) - 1) < 1e-5


def test_noise_is_one_theme():
    rng = np.random.default_rng(3)
    fit = sc.fit(rng.normal(size=(3000, 32)), seed=1, k_min=3, k_max=12)
    assert fit.single_theme and fit.k == 1 and fit.clusters[0].size == 3000


def test_refit_with_another_seed_matches_every_cluster_by_centroid():
    x, _ = blobs(6, 200, seed=5)
    a = sc.fit(x, seed=1, k_min=3, k_max=10)
    b = sc.fit(x, seed=2, k_min=3, k_max=10)
    pairs = sc.match([c.centroid for c in a.clusters], [c.centroid for c in b.clusters], threshold=0.05)
    assert len(pairs) == 6
    for new, old in pairs.items():   # matched by position in space, whatever the label numbers
        assert set(b.clusters[new].members.tolist()) == set(a.clusters[old].members.tolist())


def test_match_refuses_clusters_that_moved():
    a = [sc.unit(np.eye(4)[i:i + 1])[0] for i in range(3)]
    assert sc.match(a, [np.array([0.0, 0.0, 0.0, 1.0])], threshold=0.1) == {}


def test_ctfidf_prefers_terms_of_the_cluster():
    terms = {0: {"chess": 20, "game": 10, "board": 8}, 1: {"audio": 25, "game": 9, "mixer": 6}}
    top = sc.ctfidf(terms, top=2)
    assert top[0] == ["chess", "board"] and top[1] == ["audio", "mixer"]


def test_parse_vectors_reads_pgvector_binary():
    vecs = [[1.0, 2.0, 3.0], [-1.5, 0.0, 4.25]]
    blob = b"".join(struct.pack(">hh", 3, 0) + struct.pack(">3f", *v) for v in vecs)
    assert sc.parse_vectors(blob, 2).tolist() == vecs
