"""The document corpus family: pages converted as an ingestion pipeline does it, chunked, made into queries.

Offline: real pages committed under tests/data/doc_corpus/ (see its README for their packages and licences) are
converted by scripts/doc_corpus.py's own functions; no package is downloaded.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from lab.evaluation import data, docs

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "data" / "doc_corpus"


def _script():
    spec = importlib.util.spec_from_file_location("doc_corpus", REPO / "scripts" / "doc_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dc = _script()
bs4 = pytest.importorskip("bs4")


def test_html_page_keeps_what_a_pipeline_keeps():
    page = dc.html_page((FIXTURES / "mod_dumpio.html").read_bytes())
    assert page["title"] == "mod_dumpio - Apache HTTP Server Version 2.4"
    assert "Apache Module mod_dumpio" in page["headings"]
    text = page["text"]
    # navigation, breadcrumbs, the language switcher and the footer stay in, as get_text() leaves them
    assert "Modules | Directives | FAQ | Glossary | Sitemap | Report a bug" in text
    assert "Apache > HTTP Server > Documentation > Version 2.4 > Modules" in text
    assert "Available Languages: en" in text and "Copyright" in text
    # ... and the body text, without markup or script
    assert "DumpIOInput" in text and "error.log" in text
    assert "<" not in text.replace("<Directory", "") and "prettyPrint" not in text
    assert "\n\n\n" not in text


def test_chunks_are_200_to_300_words_and_lose_nothing():
    text = dc.html_page((FIXTURES / "mod_dumpio.html").read_bytes())["text"]
    chunks = dc.chunk(text)
    assert len(chunks) >= 2
    assert all(len(c.split()) <= dc.CHUNK_MAX for c in chunks)
    assert all(len(c.split()) >= dc.CHUNK_MIN for c in chunks[:-1])
    assert " ".join(chunks).split() == text.split()          # every word once, in order
    long = "\n\n".join(" ".join(f"w{p}_{i}" for i in range(90)) for p in range(20))   # 1,800 words
    sizes = [len(c.split()) for c in dc.chunk(long)]
    assert sum(sizes) == 1800 and all(200 <= n <= 300 for n in sizes[:-1]) and sizes[-1] > 0
    one_line = " ".join(f"w{i}" for i in range(1000))       # no break at all: cut inside the line
    assert [len(c.split()) for c in dc.chunk(one_line)] == [300, 300, 300, 100]
    assert dc.chunk("short page\nof five words") == ["short page\nof five words"]


@pytest.mark.skipif(not (shutil.which("man") and shutil.which("col")), reason="man-db / col not installed")
def test_man_page_rendered_with_header_and_footer():
    page = dc.man_page(FIXTURES / "sleep.1")
    assert page["title"] == "sleep - delay for a specified amount of time"
    lines = page["text"].split("\n")
    assert lines[0].startswith("SLEEP(1)") and lines[0].endswith("SLEEP(1)")
    assert lines[-1].startswith("GNU coreutils 9.1") and "\b" not in page["text"]
    assert "Pause for NUMBER seconds" in page["text"]


def test_info_nodes(tmp_path):
    raw = ("This is demo.info, produced by makeinfo.\n\n\x1f\nFile: demo.info,  Node: Top,  Next: Usage,  Up: (dir)\n\n"
           "Demo\n****\n\nA demo manual.\n\n* Menu:\n\n* Usage::  How to use it.\n\n\x1f\n"
           "File: demo.info,  Node: Usage,  Prev: Top,  Up: Top\n\n1 Using the demo\n================\n\n"
           "Run it.\n\n\x1f\nTag Table:\nNode: Top\x7f60\n\x1f\nEnd Tag Table\n")
    (tmp_path / "demo.info.gz").write_bytes(gzip.compress(raw.encode()))
    nodes = dc.info_nodes([tmp_path / "demo.info.gz"])
    assert [n for n, _ in nodes] == ["Top", "Usage"]
    assert nodes[1][1]["title"] == "1 Using the demo"
    # the node's header line and its menu stay in (whitespace runs made one, as everywhere)
    assert nodes[0][1]["text"].startswith("File: demo.info, Node: Top, Next: Usage")
    assert "* Usage:: How to use it." in nodes[0][1]["text"]


def test_titles_as_queries():
    assert docs.clean_title("mod_cgid - Apache HTTP Server Version 2.4", docs.PRODUCT_NAMES["apache"]) == "mod_cgid"
    assert docs.clean_title("Chapter 12. Advanced Administration",
                            docs.PRODUCT_NAMES["debian-handbook"]) == "Advanced Administration"
    assert docs.clean_title("7.38. Threshold Alpha", docs.PRODUCT_NAMES["gimp"]) == "Threshold Alpha"
    assert docs.clean_title("Postfix manual - qmgr(8)", docs.PRODUCT_NAMES["postfix"]) == "qmgr(8)"
    assert docs.clean_title("2. Resource Requirements — BIND 9 9.18.49-1~deb12u3-Debian documentation",
                            docs.PRODUCT_NAMES["bind9"]) == "Resource Requirements"
    assert docs.clean_title("ImageMagick - Command-line Tools: Convert",
                            docs.PRODUCT_NAMES["imagemagick"]) == "Command-line Tools: Convert"
    assert docs.clean_title("GIMP", docs.PRODUCT_NAMES["gimp"]) == ""        # nothing left: no query
    assert docs.strip_name("Sudoku puzzle game for GNOME, like gnome-sudoku", "gnome-sudoku") == \
        "Sudoku puzzle game for GNOME, like"
    assert docs.strip_name("tools for the ext2 filesystem: e2fsprogs", "e2fsprogs") == "tools for the ext2 filesystem"


def test_read_caps_stored_pages_and_keeps_held_out(tmp_path, monkeypatch):
    monkeypatch.setitem(docs.PRODUCT_NAMES, "alpha", ("Alpha",))
    words = " ".join(f"word{i}" for i in range(250))
    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(60):
            pid = f"pkg/page{i}.html"
            f.write(json.dumps({"store": "alpha", "id": pid, "kind": "html", "title": f"Page {i} - Alpha",
                                "headings": ["Navigation", f"Part {i}"], "chunks": [words, words]}) + "\n")
    got = docs.read(("alpha",), path, held_share=0.2, chunk_budget=20)["alpha"]
    held = [p for p in got if data.is_held_out(p.name, 0.2)]
    stored = [p for p in got if not data.is_held_out(p.name, 0.2)]
    assert len(held) == sum(data.is_held_out(f"pkg/page{i}.html", 0.2) for i in range(60)) > 0
    assert sum(len(p.chunks) for p in stored) == 20
    assert docs.read(("alpha",), path, held_share=0.2, chunk_budget=20)["alpha"] == got   # reproducible
    ps = docs.passages(held, 5)
    assert len(ps) == 5 and all(len(q.split()) == docs.PASSAGE_WORDS for _, q in ps)
    assert all(q in " ".join(p.chunks) for p, q in ps)
    ts = docs.titles("alpha", held, 100)
    # titles first, the product's name taken out; then headings, but not one that every page has
    assert ts[0][1].startswith("Page") and not any("Alpha" in q or q == "Navigation" for _, q in ts)
    assert len(ts) == 2 * len(held) and ts[-1][1].startswith("Part")
