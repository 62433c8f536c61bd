"""The third corpus family: document stores, one per product, built from Debian's documentation packages.

Long documents of another kind than Debian's package descriptions and WordNet's glosses: the manuals of web servers
(apache, lighttpd), graphics programs (gimp, imagemagick), Debian's administration guides (debian-reference,
debian-handbook), mail servers (postfix, exim), DNS servers (bind9, knot), a plotting program (gnuplot) and the GNU
core utilities, one file per page (an HTML page, a man page, an info node, a text file), converted to text as an
ingestion pipeline does it (navigation and link text left in) and cut into chunks of 200-300 words by
scripts/doc_corpus.py, which `make eval` runs (scripts/eval_setup.sh) when the corpus is missing from
.cache/doc-corpus/.  Six more products' manuals (lilypond, ffmpeg, wireshark, maxima, gnumeric, units) are never in
the catalog: their held-out pages are queries no store holds (retrieve or not).

Held-out pages (by a hash of the page id, as the Debian split is by hash of the package name) are the queries, in
two styles: 30-word passages of the page, and the page's title with the product's names taken out (PRODUCT_NAMES, a
small explicit list per store).  Pages per store are capped for the embedding budget: every held-out page is kept
(they are only queries), the others are taken in the order of a hash of their id until the store has CHUNK_BUDGET
chunks.  The licences are the packages' own (their copyright files; all DFSG-free, from Debian main).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections import Counter
from pathlib import Path

from . import data
from .data import Package

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("STORETOPICS_DOC_CORPUS", REPO / ".cache" / "doc-corpus")) / "corpus.jsonl.gz"

STORES = ("apache", "lighttpd", "gimp", "imagemagick", "debian-reference", "debian-handbook", "postfix", "exim",
          "bind9", "knot", "gnuplot", "coreutils")
LOOKALIKE_PAIRS = (("apache", "lighttpd"), ("gimp", "imagemagick"), ("debian-reference", "debian-handbook"),
                   ("postfix", "exim"), ("bind9", "knot"))
# look-alike pairs kept together; neither half was looked at while the summaries were tuned
HALVES = {"tune": ("apache", "lighttpd", "gimp", "imagemagick", "debian-reference", "debian-handbook"),
          "report": ("postfix", "exim", "bind9", "knot", "gnuplot", "coreutils")}
# never in the catalog: their held-out pages are queries no store holds, alternately to each half
ABSTAIN = ("lilypond", "ffmpeg", "wireshark", "maxima", "gnumeric", "units")
ABSTAIN_HALVES = {"tune": ABSTAIN[0::2], "report": ABSTAIN[1::2]}
STYLES = ("passages", "titles")

CHUNK_BUDGET = 300          # chunks of the stored (not held-out) pages per store
PASSAGE_WORDS = 30

# What is taken out of a page title to make it a query: the product's name and its obvious variants (the longest
# first; a string, or a regular expression when it starts with "re:"), and the site's title affixes where they carry
# the product's name.  Matching ignores case and respects word boundaries.
PRODUCT_NAMES: dict[str, tuple[str, ...]] = {
    "apache": ("Apache HTTP Server Version 2.4", "Apache HTTP Server", "Apache httpd", "Apache", "apache2",
               "httpd"),
    "lighttpd": ("lighttpd", "lighty"),
    "gimp": ("GNU Image Manipulation Program", "GIMP"),
    "imagemagick": ("ImageMagick", "MagickCore", "MagickWand", "Magick++", "Magick"),
    "debian-reference": ("Debian Reference", "Debian"),
    "debian-handbook": ("The Debian Administrator's Handbook", "Debian Administrator's Handbook", "Debian"),
    "postfix": ("Postfix manual", "Postfix"),
    "exim": ("Exim", "exim4"),
    "bind9": (r"re:BIND 9 [\w.~+:-]+ documentation", "BIND 9", "BIND9", "BIND", "named"),
    "knot": (r"re:Knot DNS [\d.]+ documentation", "Knot DNS", "Knot", "knotd", "knotc"),
    "gnuplot": ("gnuplot",),
    "coreutils": ("GNU coreutils", "coreutils"),
    "lilypond": (r"re:(LilyPond )?(Notation Reference|Learning Manual|Music Glossary|Application Usage)",
                 "Essay on automated music engraving", "LilyPond"),
    "ffmpeg": ("FFmpeg", "ffprobe", "ffplay"),
    "wireshark": ("Wireshark", "TShark"),
    "maxima": ("Maxima",),
    "gnumeric": ("The Gnumeric Manual, version &manrevision", "Gnumeric"),
    "units": ("GNU units",),
}


def available(path: Path = CORPUS) -> bool:
    return path.exists()


def _pattern(names: tuple[str, ...]) -> re.Pattern:
    alts = [n[3:] if n.startswith("re:") else re.escape(n) for n in names]
    return re.compile(r"(?<![\w-])(?:" + "|".join(alts) + r")(?![\w-])", re.I)


_NUMBERING = re.compile(r"^(?:(?:chapter|appendix|section|part)\s+)?(?:[A-Z]|\d+)(?:\.\d+)*\.?(?=\s)\s*", re.I)


def clean_title(title: str, names: tuple[str, ...] = ()) -> str:
    """A page title as a short query: the product's names taken out, then the separators left at either end and a
    leading section number ("7.38.", "Chapter 12.", "Appendix B.") dropped."""
    t = _pattern(names).sub(" ", title) if names else title
    t = " ".join(t.split())
    for _ in range(3):
        t = re.sub(r"^[\s\-–—:|@,/.]+|[\s\-–—:|@,/]+$", "", t)
        t = _NUMBERING.sub("", t)
    return t if re.search(r"[A-Za-z]{2}", t) else ""


def strip_name(text: str, name: str) -> str:
    """A Debian synopsis without its package's name (and the name without a trailing version number)."""
    names = [name]
    base = re.sub(r"[\d.]+$", "", name).rstrip("-")
    if base and base != name and len(base) >= 3:
        names.append(base)
    return clean_title(text, tuple(names))


def _hash(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode("utf-8")).hexdigest()


def read(stores=STORES + ABSTAIN, path: Path = CORPUS, *, held_share: float = 0.2,
         chunk_budget: int | None = CHUNK_BUDGET) -> dict[str, list[Package]]:
    """store -> its pages as packages (name = the page id, short = the page title, chunks = its chunks; headings:
    the page's h1-h3).  Every held-out page is kept; the stored ones are capped at chunk_budget chunks."""
    pages: dict[str, list[Package]] = {s: [] for s in stores}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["store"] in pages and r["chunks"]:
                pages[r["store"]].append(Package(r["id"], r["store"], r["title"], "", r["chunks"],
                                                 headings=r.get("headings") or []))
    out = {}
    for s, ps in pages.items():
        held = [p for p in ps if data.is_held_out(p.name, held_share)]
        rest = data.by_hash([p for p in ps if not data.is_held_out(p.name, held_share)], "store")
        kept, n = [], 0
        for p in rest:
            if chunk_budget is not None and kept and n + len(p.chunks) > chunk_budget:
                continue          # a page that would pass the budget: smaller ones after it may still fit
            kept.append(p)
            n += len(p.chunks)
        out[s] = sorted(held + kept, key=lambda p: p.name)
    missing = [s for s in stores if not out[s]]
    if missing:
        raise SystemExit(f"eval: no pages for store(s) {', '.join(missing)} in {path}")
    return out


def passages(pkgs: list[Package], n: int, words: int = PASSAGE_WORDS) -> list[tuple[Package, str]]:
    """n passages of `words` consecutive words from the pages (their text as chunked), spread over the pages: the
    pages in a fixed pseudo-random order, one passage each per round, each page's windows in a fixed pseudo-random
    order (non-overlapping windows; a page shorter than `words` gives none)."""
    order = data.by_hash(pkgs, "query")
    windows = {}
    for p in order:
        w = p.text.split()
        ws = [" ".join(w[i:i + words]) for i in range(0, len(w) - words + 1, words)]
        windows[p.name] = sorted(ws, key=lambda x: _hash(p.name, x))
    out: list[tuple[Package, str]] = []
    rnd = 0
    while len(out) < n and any(len(windows[p.name]) > rnd for p in order):
        for p in order:
            if len(out) >= n:
                break
            if len(windows[p.name]) > rnd:
                out.append((p, windows[p.name][rnd]))
        rnd += 1
    return out


def titles(store: str, pkgs: list[Package], n: int) -> list[tuple[Package, str]]:
    """Up to n short queries: the pages' titles without the product's names, in a fixed pseudo-random order of the
    pages, distinct (case aside) and not empty; when the pages have fewer titles than n (a manual of a few long
    chapters), their section headings (h1-h3, but none found on two pages) after them."""
    names = PRODUCT_NAMES.get(store, ())
    order = data.by_hash(pkgs, "query")
    out: list[tuple[Package, str]] = []
    seen: set[str] = set()
    # a heading on more than one page is the site's ("Navigation", "Summary", "Table of Contents"), not a subject
    common = Counter(h.lower() for p in pkgs for h in set(p.headings))
    for source in ("title", "headings"):
        for p in order:
            for t in ([p.short] if source == "title" else [h for h in p.headings if common[h.lower()] < 2]):
                q = clean_title(t, names)
                if q and q.lower() not in seen and len(out) < n:
                    seen.add(q.lower())
                    out.append((p, q))
    return out


def query_styles(sp: data.Split, stores: list[str], n: int) -> dict[str, list[tuple[str, str, str]]]:
    """The two query styles of the family, from each store's held-out pages: style -> [(store, query, the page's
    title)], stores in the given order."""
    out: dict[str, list[tuple[str, str, str]]] = {"passages": [], "titles": []}
    for s in stores:
        out["passages"] += [(s, q, p.short) for p, q in passages(sp.held[s], n)]
        out["titles"] += [(s, q, p.short) for p, q in titles(s, sp.held[s], n)]
    return out
