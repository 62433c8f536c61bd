#!/usr/bin/env python3
"""Build the document-store corpus family of the routing evaluation from Debian's documentation packages.

Real long documents nobody on this project wrote: the manuals Debian ships for a few products (web servers, graphics
programs, mail servers, DNS servers, Debian's own administration guides ...), one store per product, one file per
page, converted to text the way a typical ingestion pipeline does it and cut into chunks of about 200-300 words:

* HTML (and DocBook XML) pages: BeautifulSoup's ``get_text()`` on the whole page, as LangChain's BSHTMLLoader does:
  navigation, headers, footers and link text stay in;
* man pages: rendered by man-db (``man -l``, 80 columns) and ``col -b``, page headers and footers included;
* info manuals: one page per node, the node's text as the info file holds it (its "File: ..., Node: ..., Next: ..."
  line and its menus included), as ``info --output`` prints it;
* plain-text documents: as they are.

Packages are fetched with ``apt-get download`` through the machine's own apt sources (no host name is written
anywhere) into ``.cache/doc-corpus/debs/``, unpacked with ``dpkg-deb -x`` into ``.cache/doc-corpus/root/<package>/``
(never installed), and the corpus is written to ``.cache/doc-corpus/corpus.jsonl.gz`` (one JSON record per page:
store, page id, title, headings, chunks) with ``manifest.json`` (package versions, counts, the spec's digest).  Pages
per store are capped for the embedding budget: pages are taken in the order of a SHA-1 of their id until the store
has ``--chunk-budget`` chunks or ``--max-pages`` pages (reproducible).

    python3 scripts/doc_corpus.py            # build when missing or when the spec changed (idempotent)
    python3 scripts/doc_corpus.py --force    # build again from the unpacked packages
    python3 scripts/doc_corpus.py stats      # pages, chunks and words per store of the built corpus

Needs: apt-get and dpkg-deb (Debian), man-db and groff-base (man pages), bsdextrautils (col), and BeautifulSoup 4
(the ``eval`` extra).  Which stores the evaluation puts in the catalog, and which it keeps aside as queries no store
holds, is lab/evaluation/docs.py's business; this script builds them all.  Licences: each package's
/usr/share/doc/<package>/copyright (kept under root/ in the cache).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("STORETOPICS_DOC_CORPUS", REPO / ".cache" / "doc-corpus"))
CORPUS_NAME = "corpus.jsonl.gz"
MANIFEST_NAME = "manifest.json"
FORMAT = 3                  # bumped when the conversion or the chunking changes (the corpus is rebuilt)

CHUNK_MIN, CHUNK_TARGET, CHUNK_MAX = 200, 250, 300   # words per chunk
MIN_WORDS = 30              # a page with fewer words (a redirect, an empty index) is no page

# store -> [(package, kind, glob under the unpacked package)]; kinds: html, xml, man, info, text.  One store per
# product: its documentation package, and its man pages where the product ships them in another package.
SPEC: dict[str, list[tuple[str, str, str]]] = {
    # web servers
    "apache": [("apache2-doc", "html", "usr/share/doc/apache2-doc/manual/en/**.html")],
    "lighttpd": [("lighttpd-doc", "text", "usr/share/doc/lighttpd/*.txt*"),
                 ("lighttpd", "man", "usr/share/man/man[18]/*")],
    # graphics programs
    "gimp": [("gimp-help-en", "html", "usr/share/gimp/2.0/help/en/*.html")],
    "imagemagick": [("imagemagick-6-doc", "html", "usr/share/doc/imagemagick-6-common/html/www/*.html")],
    # Debian administration guides
    "debian-reference": [("debian-reference-en", "html", "usr/share/debian-reference/*.en.html")],
    "debian-handbook": [("debian-handbook", "html", "usr/share/doc/debian-handbook/html/en-US/*.html")],
    # mail servers
    "postfix": [("postfix-doc", "html", "usr/share/doc/postfix/html/*.html")],
    "exim": [("exim4-doc-html", "html", "usr/share/doc/exim4-doc-html/*_html/*.html")],
    # DNS servers
    "bind9": [("bind9-doc", "html", "usr/share/doc/bind9-doc/arm/*.html"),
              ("bind9", "man", "usr/share/man/man[158]/*"),
              ("bind9-utils", "man", "usr/share/man/man[158]/*"),
              ("bind9-dnsutils", "man", "usr/share/man/man[158]/*")],
    "knot": [("knot-doc", "html", "usr/share/doc/knot-doc/*.html"),
             ("knot", "man", "usr/share/man/man[158]/*")],
    # plotting; command-line utilities
    "gnuplot": [("gnuplot-doc", "info", "usr/share/info/gnuplot.info*")],
    "coreutils": [("coreutils", "man", "usr/share/man/man[18]/*")],
    # kept aside by the evaluation as stores that are never in the catalog (queries no store holds)
    "lilypond": [("lilypond-doc-html", "html",
                  "usr/share/doc/lilypond/html/Documentation/{learning,notation,usage,essay,music-glossary}/*.html")],
    "wireshark": [("wireshark-doc", "html", "usr/share/doc/wireshark/wsug_html_chunked/*.html")],
    "ffmpeg": [("ffmpeg-doc", "html", "usr/share/doc/ffmpeg/manual/*.html")],
    "maxima": [("maxima-doc", "info", "usr/share/info/**.info*")],
    "gnumeric": [("gnumeric-doc", "xml", "usr/share/help/C/gnumeric/*.xml")],
    "units": [("units", "info", "usr/share/info/units.info*"), ("units", "man", "usr/share/man/man1/*")],
}
# pages that are no documentation: search pages, generated indexes, other languages' copies
SKIP = re.compile(r"(^|/)(search|genindex|py-modindex|sitemap|index_toc)\.html$|-all\.html$|\.[a-z]{2}([_-][a-zA-Z]{2})?\.html$")
LANG_OK = re.compile(r"\.en\.html$")


def log(msg: str) -> None:
    print(f"doc corpus: {msg}", file=sys.stderr, flush=True)


def spec_digest() -> str:
    blob = json.dumps({"spec": SPEC, "format": FORMAT, "chunk": [CHUNK_MIN, CHUNK_TARGET, CHUNK_MAX], "min_words": MIN_WORDS}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------------------------
# fetching and unpacking
# ---------------------------------------------------------------------------------------------------------------
def packages() -> list[str]:
    return sorted({p for parts in SPEC.values() for p, _, _ in parts})


def deb_of(pkg: str, debs: Path) -> Path | None:
    hits = sorted(debs.glob(f"{pkg}_*.deb"))
    return hits[-1] if hits else None


def download(pkgs: list[str], debs: Path) -> None:
    """apt-get download the packages not in the cache yet (the machine's apt sources; nothing is installed)."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in pkgs if deb_of(p, debs) is None]
    if not missing:
        return
    log(f"apt-get download {' '.join(missing)}")
    cmd = ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", *missing]
    r = subprocess.run(cmd, cwd=debs)
    if r.returncode != 0:   # the package lists may be missing or stale: update once, then try again
        subprocess.run(["apt-get", "-qq", "update"], check=False)
        subprocess.run(cmd, cwd=debs, check=True)


def unpack(pkg: str, debs: Path, root: Path) -> tuple[Path, str]:
    """dpkg-deb -x the package into root/<package>/ (once per .deb); returns (tree, the .deb's file name)."""
    deb = deb_of(pkg, debs)
    if deb is None:
        raise SystemExit(f"doc corpus: no .deb of {pkg} in {debs}")
    tree = root / pkg
    stamp = tree / ".unpacked-from"
    if not (stamp.exists() and stamp.read_text() == deb.name):
        subprocess.run(["rm", "-rf", str(tree)], check=True)
        tree.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
        stamp.write_text(deb.name)
    return tree, deb.name


def expand_braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def select(tree: Path, pattern: str) -> list[Path]:
    """Regular files (not symlinks) under tree matching the glob ('**' crosses directories), sorted."""
    out = []
    for pat in expand_braces(pattern):
        base = re.split(r"[*?\[]", pat, maxsplit=1)[0].rsplit("/", 1)[0]
        rx = re.compile("^" + re.escape(pat).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
                        .replace(r"\?", "[^/]").replace(r"\[", "[").replace(r"\]", "]") + "$")
        start = tree / base
        if not start.is_dir():
            continue
        for dirpath, _, files in os.walk(start):
            for f in files:
                p = Path(dirpath) / f
                rel = p.relative_to(tree).as_posix()
                if rx.match(rel) and p.is_file() and not p.is_symlink():
                    out.append(p)
    return sorted(set(out))


def read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


# ---------------------------------------------------------------------------------------------------------------
# conversion to text, as an ingestion pipeline does it
# ---------------------------------------------------------------------------------------------------------------
def tidy(text: str) -> str:
    """Whitespace as a loader leaves it after a light clean-up: lines stripped, runs of blank lines made one."""
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", "", text)     # control characters (NUL included): no text
    lines = [ln.strip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").replace("\xa0", " ").split("\n")]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(re.sub(r"[ \t]+", " ", ln))
    return "\n".join(out).strip()


def html_page(raw: bytes, xml: bool = False) -> dict:
    """One HTML (or DocBook XML) page: BeautifulSoup's get_text() of the whole document (navigation, headers,
    footers and link text stay in, as LangChain's BSHTMLLoader leaves them), the <title> (or first heading) and the
    h1-h3 headings."""
    import warnings

    from bs4 import BeautifulSoup, XMLParsedAsHTMLWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(raw, "html.parser")
    heads = [" ".join(h.get_text(" ").split()) for h in soup.find_all(["h1", "h2", "h3"] if not xml else
                                                                         ["title"])]
    heads = [h for h in heads if h]
    title = ""
    if not xml and soup.title is not None:
        title = " ".join(soup.title.get_text(" ").split())
    if not title and heads:
        title = heads[0]
    root = soup.find("html")
    lang = (root.get("lang") or root.get("xml:lang") or "") if root is not None else ""
    for t in soup.find_all(["script", "style"]):   # never text: bs4 skips them too, this keeps old versions alike
        t.decompose()
    return {"title": title, "headings": heads, "text": tidy(soup.get_text()), "lang": lang}


def man_page(path: Path) -> dict | None:
    """One man page rendered by man-db at 80 columns through col -b (page header and footer included); the title
    is its NAME line ("ls - list directory contents")."""
    head = read_bytes(path)[:200].lstrip()
    if head.startswith(b".so "):        # a link to another page
        return None
    env = {**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8",
           "MAN_KEEP_FORMATTING": ""}
    env.pop("MANOPT", None)
    r = subprocess.run(["man", "-l", str(path)], capture_output=True, env=env)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    text = subprocess.run(["col", "-b"], input=r.stdout, capture_output=True, check=True).stdout.decode(
        "utf-8", "replace")
    text = tidy(text)
    lines = text.split("\n")
    title = ""
    for i, ln in enumerate(lines):
        if ln.strip() == "NAME":
            name = []
            for nxt in lines[i + 1:]:
                if not nxt.strip() or nxt.isupper():
                    break
                name.append(nxt.strip())
            title = " ".join(name)
            break
    return {"title": title, "headings": [], "text": text}


_NODE = re.compile(r"^File: [^,]+,\s+Node: ([^,\n]+)")


def info_nodes(paths: list[Path]) -> list[tuple[str, dict]]:
    """The nodes of an info manual (its split parts read in order): (node name, page).  The node's text is kept as
    the info file holds it, header line and menus included."""
    def part_no(p: Path) -> int:
        m = re.search(r"\.info-(\d+)", p.name)
        return int(m.group(1)) if m else 0
    out = []
    for p in sorted(paths, key=part_no):
        text = read_bytes(p).decode("utf-8", "replace")
        for seg in text.split("\x1f"):
            seg = seg.lstrip("\n")
            m = _NODE.match(seg)
            if not m:
                continue          # the preamble, the tag table, the indirect table
            node = m.group(1).strip()
            body = tidy(seg.replace("\x7f", ""))
            lines = body.split("\n")
            # the node's heading: the first line underlined with = - * or . (as makeinfo writes it), else its name
            title = next((a for a, b in zip(lines, lines[1:]) if a and len(b) >= 3 and
                          re.fullmatch(r"([=*.-])\1+", b)), node)
            out.append((node, {"title": title, "headings": [], "text": body}))
    return out


def text_page(raw: bytes) -> dict:
    text = tidy(raw.decode("utf-8", "replace"))
    title = next((ln for ln in text.split("\n") if re.search(r"[A-Za-z]{3}", ln) and not
                  re.fullmatch(r"[=\-~#*+ ]+", ln) and not ln.startswith(("!", ".."))), "")
    return {"title": title.strip(" =#"), "headings": [], "text": text}


# ---------------------------------------------------------------------------------------------------------------
# chunking
# ---------------------------------------------------------------------------------------------------------------
def chunk(text: str, lo: int = CHUNK_MIN, target: int = CHUNK_TARGET, hi: int = CHUNK_MAX) -> list[str]:
    """Chunks of about lo-hi words, cut where the text has a break: at a blank line once a chunk has lo words, at a
    line end once it has target words, inside a line only past hi words.  A last piece under a fifth of lo words
    joins the chunk before it.  Line breaks inside a chunk are kept."""
    chunks: list[str] = []
    cur: list[str] = []
    n = 0

    def emit():
        nonlocal cur, n
        body = "\n".join(cur).strip()
        if body:
            chunks.append(body)
        cur, n = [], 0

    for line in text.split("\n"):
        words = line.split()
        if not words:
            if n >= lo:
                emit()
            elif cur:
                cur.append("")
            continue
        while words:
            room = hi - n
            if len(words) <= room:
                cur.append(" ".join(words))
                n += len(words)
                words = []
            else:
                cur.append(" ".join(words[:room]))
                n += room
                words = words[room:]
                emit()
        if n >= target:
            emit()
    if cur and chunks and n < lo // 5:
        chunks[-1] = chunks[-1] + "\n" + "\n".join(cur).strip()
        cur, n = [], 0
    emit()
    return chunks


# ---------------------------------------------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------------------------------------------
def pages_of(store: str, root: Path, debs: Path, versions: dict) -> list[dict]:
    out = []
    for pkg, kind, pattern in SPEC[store]:
        tree, deb = unpack(pkg, debs, root)
        versions[pkg] = deb
        files = select(tree, pattern)
        if kind == "info":
            manuals: dict[str, list[Path]] = {}
            for f in files:
                manuals.setdefault(re.sub(r"(-\d+)?(\.gz)?$", "", f.name), []).append(f)
            for manual, parts in sorted(manuals.items()):
                for node, page in info_nodes(parts):
                    out.append({"id": f"{pkg}/{manual}#{node}", "kind": kind, **page})
            continue
        for f in files:
            rel = f.relative_to(tree).as_posix()
            if kind in ("html", "xml") and SKIP.search(rel) and not LANG_OK.search(rel):
                continue
            if kind in ("html", "xml"):
                page = html_page(read_bytes(f), xml=kind == "xml")
            elif kind == "man":
                page = man_page(f)
            else:
                page = text_page(read_bytes(f))
            lang = page.pop("lang", "") if page is not None else ""
            if page is None or (lang and not lang.lower().startswith("en")):
                continue      # a page of another language in the English tree (a translation kept as the fallback)
            out.append({"id": f"{pkg}/{re.sub(r'[.]gz$', '', rel)}", "kind": kind, **page})
    return out


def build(cache: Path = CACHE, *, force: bool = False, stores: list[str] | None = None) -> Path:
    out = cache / CORPUS_NAME
    manifest = cache / MANIFEST_NAME
    digest = spec_digest()
    if not force and out.exists() and manifest.exists():
        try:
            if json.loads(manifest.read_text()).get("spec_digest") == digest:
                log(f"{out} is up to date (spec {digest})")
                return out
        except ValueError:
            pass
    debs, root = cache / "debs", cache / "root"
    download(packages(), debs)
    versions: dict[str, str] = {}
    counts = {}
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for store in stores or SPEC:
            pages = []
            for p in pages_of(store, root, debs, versions):
                if len(p["text"].split()) < MIN_WORDS:
                    continue
                p["chunks"] = chunk(p["text"])
                pages.append(p)
            counts[store] = {"pages": len(pages),
                             "chunks": sum(len(p["chunks"]) for p in pages),
                             "words": sum(len(p["text"].split()) for p in pages)}
            log(f"{store}: {len(pages)} pages, {counts[store]['chunks']} chunks, "
                f"{counts[store]['words']:,} words")
            for p in pages:
                rec = {"store": store, "id": p["id"], "kind": p["kind"], "title": p["title"],
                       "headings": p["headings"][:40], "chunks": p["chunks"]}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(out)
    manifest.write_text(json.dumps({"spec_digest": digest, "format": FORMAT, "packages": versions,
                                    "stores": counts}, indent=1, sort_keys=True) + "\n")
    log(f"wrote {out} ({sum(c['pages'] for c in counts.values()):,} pages, "
        f"{sum(c['chunks'] for c in counts.values()):,} chunks)")
    return out


def stats(cache: Path = CACHE) -> None:
    m = json.loads((cache / MANIFEST_NAME).read_text())
    print(f"{'store':18s} {'pages':>6s} {'chunks':>7s} {'words':>9s}")
    for s, c in m["stores"].items():
        print(f"{s:18s} {c['pages']:6d} {c['chunks']:7d} {c['words']:9,d}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", default="build", choices=("build", "stats"))
    ap.add_argument("--force", action="store_true", help="convert again even if the corpus is up to date")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"cache directory (default {CACHE})")
    args = ap.parse_args(argv)
    if args.what == "stats":
        stats(args.cache)
    else:
        build(args.cache, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
