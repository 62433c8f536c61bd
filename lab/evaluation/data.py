"""The corpus side of the evaluation: Debian sections as stores, a held-out split by hash of the package name.

One file per package, one chunk per paragraph: exactly the demo's layout (lab.demo.chunks_of), so the
embedding cache and the shipped demo embeddings share their texts.  The corpus already keeps one binary package
per source package (scripts/debian_corpus.py), so no two files are near-duplicates of one source.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..demo import CORPUS, chunks_of, read_corpus

REPO = Path(__file__).resolve().parents[2]
SECTION_DESCRIPTIONS = REPO / "data" / "debian" / "section-descriptions"


@dataclass
class Package:
    name: str
    section: str
    short: str
    long: str
    chunks: list[str] = field(default_factory=list)
    headings: list[str] = field(default_factory=list)   # section headings (the document family's pages)

    @property
    def text(self) -> str:
        """The whole description: the query text when this package is held out."""
        return "\n".join(self.chunks)


def bucket(name: str, buckets: int = 1000) -> int:
    """Stable bucket of a package name (SHA-1), the basis of the held-out split."""
    return int(hashlib.sha1(name.encode("utf-8")).hexdigest()[:8], 16) % buckets


def is_held_out(name: str, share: float) -> bool:
    return bucket(name) < round(share * 1000)


def read_sections(sections, path: Path = CORPUS) -> dict[str, list[Package]]:
    out = {s: [Package(r["package"], r["section"], r["short"], r["long"], chunks_of(r)) for r in recs]
           for s, recs in read_corpus(sections, path).items()}
    missing = [s for s in out if not out[s]]
    if missing:
        raise SystemExit(f"eval: no packages for section(s) {', '.join(sorted(missing))} in {path}")
    return out


def by_hash(pkgs: list[Package], salt: str = "") -> list[Package]:
    """Packages in a fixed pseudo-random order (SHA-1 of salt + name): caps take a uniform, reproducible sample."""
    return sorted(pkgs, key=lambda p: hashlib.sha1((salt + p.name).encode()).hexdigest())


@dataclass
class Split:
    store: dict[str, list[Package]]      # section -> packages loaded into its store
    held: dict[str, list[Package]]       # section -> held-out packages (never in any store)
    queries: dict[str, list[Package]]    # section -> the held-out packages used as queries


def split(corpus: dict[str, list[Package]], *, held_share: float, store_cap: int | None,
          queries_per_section: int) -> Split:
    store, held, queries = {}, {}, {}
    for s, pkgs in corpus.items():
        h = [p for p in pkgs if is_held_out(p.name, held_share)]
        rest = [p for p in pkgs if not is_held_out(p.name, held_share)]
        store[s] = sorted(by_hash(rest, "store")[:store_cap] if store_cap else rest, key=lambda p: p.name)
        held[s] = h
        queries[s] = sorted(by_hash(h, "query")[:queries_per_section], key=lambda p: p.name)
    return Split(store, held, queries)


def section_descriptions(path: Path = SECTION_DESCRIPTIONS) -> dict[str, tuple[str, str]]:
    """aptitude's hand-written section descriptions: section -> (short, long), as aptitude shows them."""
    text = path.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r'^\s+([A-Za-z0-9-]+)\s+"((?:[^"\\]|\\.)*)";', text, re.M):
        name, body = m.group(1), m.group(2)
        body = body.replace("''", '"')
        short, _, rest = body.partition("\\n")
        paras = [" ".join(p.replace("\\n", " ").split()) for p in rest.split("\\n .")]
        out[name] = (short.strip(), "\n".join(p for p in paras if p))
    return out
