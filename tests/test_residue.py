"""Summaries of document stores say what the documents are about, not what the ingestion pipeline left in.

Each store below is up to 20 files of real extracted text with one class of residue (tests/data/doc_residue/README.md):
navigation glued by HTML-to-text, words glued into one ("bugSee"), links' targets left in, a language selector's
locale codes, dotted option names, words hyphenated at line breaks, words in another script, changelog dates,
sentence pieces that the offline phrase miner would take for topics; and 12 files whose every page carries a web
site's header and footer (a small store of long documents).  And ten of them as the stores of one table: each shows
its stems in words its own pages write, whichever store taught the owner a word first.  Keyword-only stores, rendered
by SQL alone (what `SELECT storetopics.backfill()` shows where no worker runs).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "doc_residue"


def _render(conn, name: str, files: int = 20) -> tuple[str, dict]:
    conn.execute("CREATE TABLE docs (id serial PRIMARY KEY, store text, file text, content text)")
    conn.execute("CREATE INDEX ON docs (file)")
    rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == files
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs (store, file, content) VALUES (%s, %s, %s)",
                        [(name, f"{i}-{r['file']}", r["text"]) for i, r in enumerate(rows)])
    conn.execute("SELECT storetopics.attach('docs', 'store', 'file', 'content', embedding => NULL)")
    conn.execute("SELECT * FROM storetopics.backfill()")
    text, topics = conn.execute("SELECT store_topics, topics FROM storetopics.stores").fetchone()
    assert text and f"{files} files" in text
    return text, topics


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[^\W\d_][\w'-]*", text)}


def test_navigation_glued_by_html_to_text_is_not_shown(conn):
    text, _ = _render(conn, "handbook")
    shown = _words(text)
    assert not {w for w in shown if re.search(r"prev|next", w)}, text
    assert not {"ebookprevthe", "handbooknextchapter", "prevchapter", "nextchapter"} & shown, text
    assert "debian" in shown or "package" in shown or "packages" in shown, text


def test_a_sites_header_and_footer_are_not_shown_in_a_small_store(conn):
    # every page of the Exim specification says "Home Download Documentation Mailing Lists Wiki Bugs Security
    # Credits" at the top and "Website design by Mike Cardwell." at the bottom: once a page, in every page
    text, _ = _render(conn, "exim", files=12)
    shown = _words(text)
    assert not {"cardwell", "mike", "website", "design", "wiki", "credits", "mailing"} & shown, text
    assert {"exim", "smtp", "router", "transport", "routers", "transports"} & shown, text


def test_halves_of_words_hyphenated_at_line_breaks_are_not_shown(conn):
    texts = [json.loads(line)["text"] for line in (DATA / "postfix.jsonl").read_text().splitlines()]
    halves = {h.lower() for t in texts for m in re.finditer(r"([A-Za-z]+)-\n\s*([a-z]+)", t) for h in m.groups()}
    assert len(halves) >= 20
    text, _ = _render(conn, "postfix")
    words = {w.lower() for t in texts for w in re.findall(r"[A-Za-z]+", t)}
    # a half that is no word of the store elsewhere (written whole) must not be shown: "destina", "tion", "recipi"
    fragments = {h for h in halves if sum(w == h for w in re.findall(r"[a-z]+", " ".join(texts).lower())) <= 2
                 and len(h) >= 3} - (words - halves)
    assert fragments, halves
    assert not fragments & _words(text), (sorted(fragments & _words(text)), text)
    assert "postfix" in _words(text) or "smtpd" in _words(text) or "mail" in _words(text), text


def test_words_in_another_script_than_the_stores_are_not_shown(conn):
    text, _ = _render(conn, "lilypond")
    assert not re.search(r"[\u0400-\u04ff\u0370-\u03ff\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]", text), text


def test_words_a_page_converter_glued_are_not_shown(conn):
    # the sidebar of Apache httpd's how-to pages: "Known issues", "Report a bug", "See also", read as "Known
    # issuesReport a bugSee also"
    text, topics = _render(conn, "apache-howto")
    assert "bugsee" not in _words(text) and "bugsee" not in {t["term"] for t in topics["contrast"]}, text
    assert {"apache", "httpd", "http", "module", "server", "directive", "directives"} & _words(text), text


def test_words_of_links_targets_are_not_shown(conn):
    # BIND 9's manual, HTML to text, keeps its links' targets: "named <#std-iscman-named>", "rndc <#std-iscman-rndc>"
    text, topics = _render(conn, "bind9")
    assert not {"iscman", "std-iscman-named", "std-iscman-rndc", "std"} & _words(text), text
    assert not {"iscman", "std"} & {t["term"] for t in topics["contrast"]}, topics["contrast"]
    assert {"named", "rndc", "dns", "zone", "zones", "bind", "dnssec"} & _words(text), text


def test_a_language_selectors_locale_codes_are_not_shown(conn):
    # the first chunk of Apache httpd's pages: "Available Languages: de | en | es | fr | ja | ko | pt-br | tr | zh-cn"
    text, _ = _render(conn, "apache", files=16)
    assert not re.search(r"\b(zh-cn|pt-br|zh-tw)\b", text), text
    assert {"apache", "httpd", "http", "module", "server", "directive", "directives"} & _words(text), text


def test_words_of_dotted_option_names_are_shown_as_written(conn):
    # lighttpd's options ("setenv.add-response-header", "server.max-request-size"): the parser reads "setenv.add" as
    # a host and the rest as a word, whose lexeme ("response-head", "request-s") is no word a person wrote
    rows = [json.loads(line)["text"] for line in (DATA / "lighttpd.jsonl").read_text(encoding="utf-8").splitlines()]
    written = {w.lower() for t in rows for run in re.findall(r"[A-Za-z]+(?:-[A-Za-z]+)+", t)
               for parts in [run.split("-")] for i in range(len(parts)) for j in range(i + 2, len(parts) + 1)
               for w in ["-".join(parts[i:j])]}
    text, _ = _render(conn, "lighttpd", files=18)
    shown = {w for w in _words(text) if "-" in w}
    assert "response-header" in shown, text
    assert shown <= written, (sorted(shown - written), text)


def test_changelog_dates_are_not_shown(conn):
    text, _ = _render(conn, "changelog")
    months = ("jan feb mar apr may jun jul aug sep sept oct nov dec january february march april june july august "
              "september october november december mon tue wed thu fri sat sun monday tuesday wednesday thursday "
              "friday saturday sunday").split()
    assert not set(months) & _words(text), text


@pytest.mark.parametrize("name", ["coreutils", "postfix", "handbook"])
def test_topics_are_no_pieces_of_sentences(conn, name):
    _, topics = _render(conn, name)
    assert topics["topics_from"] == "phrases" and topics["topics"], topics
    for phrase in topics["topics"]:
        words = phrase.lower().split()
        assert not set(words) & {"is", "are", "was", "were", "be", "been", "has", "have", "can", "may", "must",
                                 "should", "will"}, phrase
        assert not (len(words) >= 3 and words[1] in {"the", "a", "an", "this", "its", "their", "any"}), phrase
        assert not re.search(r"prev|next", phrase.lower()), phrase


# Runs the miner offered as topics of the document family's stores (make eval, bench/results/report.md), and names
# of topics it must keep offering.
PIECES = ["used when sending", "useful to adjust", "writing to standard", "automatically installed",
          "currently running Perl", "Sass makes CSS", "package contains development", "Wget works particularly",
          "discrete elements like", "sometimes placed", "obviously discrete elements", "elements like packages",
          "Upon catalog zone", "value is specified", "cover the new", "Specifies the widget"]
NAMES = ["text editor", "Web Server", "Apache Module", "Object Caching", "Layer Modes", "Gradient Editor menu",
         "Opening Files", "Alpha Channel", "network interfaces", "Linux kernel", "configuration file", "query type",
         "Log files", "shell command", "Debian packages", "MIDI files", "sequence alignment",
         "Monkey patching", "GNOME Shell extension", "New in GIMP", "Using Apache", "GNU Wget", "Still images",
         "Getting Started", "Introduction to Apache", "dictionary for hunspell", "Web Services", "spinal cord"]


@pytest.mark.parametrize("phrase", PIECES + NAMES)
def test_the_miner_tells_pieces_of_sentences_from_names(conn, phrase):
    reason = conn.execute("SELECT storetopics._clause_fragment(%s)", (phrase.split(),)).fetchone()[0]
    assert (reason is not None) == (phrase in PIECES), (phrase, reason)


def test_a_clusters_first_words_shown_as_its_label_end_on_no_dangling_word(conn):
    """The offline fallback (a cluster whose files share no phrase) shows its first three words: none on which no
    noun phrase ends ("name zone used", "mouse keyboard lets" were shown)."""
    got = conn.execute("SELECT storetopics._offline_label(ARRAY['name', 'zone', 'used', 'set']), "
                       "storetopics._offline_label(ARRAY['mouse', 'keyboard', 'lets', 'marks']), "
                       "storetopics._offline_label(ARRAY['octave', 'forge', 'octave-forge', 'signal'])").fetchone()
    assert got == ("name zone set", "mouse keyboard marks", "octave forge signal")


def test_the_learner_tells_a_page_converters_residue_from_words(conn):
    """storetopics._text_words: the word each text writes for a lexeme, and whether mostly as residue: glued to the
    next word (in lower or upper case), or inside a link's target (a line break in it too)."""
    text = ("-c, --config FILEUse a textual file; --journal-db fileUse a path.\nKnown issuesReport a bugSee also. "
            "See named <#\nstd-iscman-named> and set server.max-request-size in a textual way.")
    got = {r[0]: r[1:] for r in conn.execute(
        "SELECT lexeme, word, residue FROM storetopics._text_words('english', ARRAY[%s], "
        "ARRAY['fileus', 'bugse', 'iscman', 'request-s', 'textual', 'name'])", (text,))}
    assert got == {"fileus": ("fileuse", "glued"), "bugse": ("bugsee", "glued"), "iscman": ("iscman", "link"),
                   "request-s": ("request-size", None), "textual": ("textual", None), "name": ("named", None)}, got


def test_a_store_shows_its_stems_in_words_it_writes(conn):
    # The word shown for a stem is learnt once per owner, from the texts of the first store that needs it; another
    # store of the same owner may never write that word ("responsive" for a manual that says "response", "productive"
    # for "product").  Ten stores of real pages in one table: each shows words its own pages write.
    names = ["apache", "apache-howto", "lighttpd", "bind9", "postfix", "exim", "coreutils", "handbook", "lilypond",
             "changelog"]
    conn.execute("CREATE TABLE docs (id serial PRIMARY KEY, store text, file text, content text)")
    conn.execute("CREATE INDEX ON docs (file)")
    pages: dict[str, list[str]] = {}
    with conn.cursor() as cur:
        for name in names:
            rows = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
            pages[name] = [r["text"] for r in rows]
            cur.executemany("INSERT INTO docs (store, file, content) VALUES (%s, %s, %s)",
                            [(name, f"{name}/{i}", r["text"]) for i, r in enumerate(rows)])
    conn.execute("SELECT storetopics.attach('docs', 'store', 'file', 'content', embedding => NULL)")
    conn.execute("SELECT * FROM storetopics.backfill()")
    unwritten = {}
    for store, text, topics in conn.execute("SELECT store_key, store_topics, topics FROM storetopics.stores"):
        written = set()
        for t in pages[store]:
            t = re.sub(r"([^\W\d_])[-\u2010][ \t]*\n[ \t]*([a-z])", r"\1\2", t)   # "main-\ntain" is written
            for run in re.findall(r"[^\W\d_][\w'-]*", t.lower().replace("_", " ")):
                parts = run.strip("'-").split("-")
                written |= {"-".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)}
        shown = [d["term"] for k in ("contrast", "distinctive") for d in topics[k]]
        unwritten[store] = sorted(w for w in shown if w.lower() not in written)
    assert sorted(unwritten) == sorted(names)
    assert not any(unwritten.values()), unwritten


# The noise classes and the miner's suffix tests as regular expressions, as they were written before they became
# word lists and string functions, and a store in Latin letters asked the script of every word (storetopics._script).
# A backend keeps 32 compiled regular expressions; a render cycle used 35-48, and recompiled the screen's at every
# render (bench/README.md, "Regular expressions within the backend's cache").
_NOISE_BY_PATTERN = r"""
    CASE
      WHEN w COLLATE "C" ~ '^(prev|previous|next|toc|sitemap|breadcrumb|navbar|permalink)$'
           OR w COLLATE "C" ~ '^(prev|previous|next)[a-z]{3,}$|^[a-z]{3,}(prev|previous|next)[a-z]*$'
              AND w COLLATE "C" !~ '^(prevent|preview|prevail|prevalen)'
           OR w COLLATE "C" ~ '^(zh|pt|en|es|fr|de|ja|ko|ru|it|nl|sv|pl|tr|da|fi|nb|nn|cs|hu|ro|uk|el|he|ar|id|vi|th)'
                              '-[a-z]{2}$' THEN 'navigation'
      WHEN w COLLATE "C" ~ '^(jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec|januari|februari|march|april|june|'
                           'juli|august|septemb|octob|novemb|decemb|mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun|'
                           'monday|tuesday|wednesday|thursday|friday|saturday|sunday)$' THEN 'date'
      WHEN w COLLATE "C" ~ '^(tion|ation|ment|ing|anc|enc|ness|iti|abl|ibl|ous)$' THEN 'fragment'
      WHEN storetopics._script(w) <> store_script THEN 'script'
    END"""


def test_noise_and_suffix_tests_without_regular_expressions_say_what_the_patterns_said(conn):
    # every word and lexeme of the residue corpus (navigation, locale codes, dates, fragments, other scripts), and
    # words made at the edges of each rule
    texts = [json.loads(line)["text"] for p in sorted(DATA.glob("*.jsonl"))
             for line in p.read_text(encoding="utf-8").splitlines()]
    words = {w for t in texts for w in re.findall(r"[^\s|,.;:()<>\"]+", t)}
    words |= {w.lower() for w in words}
    made = {a + b + c for a in ("", "a", "ab", "abc", "chapter", "é", "Ж")
            for b in ("prev", "previous", "next", "prevent", "preview", "prevail", "prevalen", "toc", "nexT", "zh",
                      "pt", "xx", "sept", "sep", "may", "tion", "ing", "ed", "ful", "ble", "")
            for c in ("", "a", "ab", "abc", "ious", "-cn", "-CN", "-c", "-cnn", "-é", "ed", "ing", "1", "ω", "한")}
    made |= {"", "-", "zh-", "-cn", "a-b", "ω", "ωж", "жω", "漢字", "ひらがな", "한국어", "עברית", "عربي", "हिन्दी",
             "ผม", "x\u0301", "Ⅻ", "ßed", "éed", "Ed", "aED", "ING", "outing", "red", "bed", "ed"}
    made |= {w + s for w in ("tion", "ation", "ment", "ing", "anc", "enc", "ness", "iti", "abl", "ibl", "ous", "march",
                             "thurs", "octob") for s in ("", "s", "x")}
    # each script's range at its ends and just past them, alone, after a Latin letter and after a Greek one
    edges = [0x7f, 0x80, 0xbf, 0xc0, 0x24f, 0x250, 0x36f, 0x370, 0x3ff, 0x400, 0x4ff, 0x500, 0x58f, 0x590, 0x5ff,
             0x600, 0x6ff, 0x700, 0x8ff, 0x900, 0xdff, 0xe00, 0x303f, 0x3040, 0x30ff, 0x3100, 0x33ff, 0x3400, 0x9fff,
             0xa000, 0xabff, 0xac00, 0xd7af, 0xd7b0]
    made |= {p + chr(c) for c in edges for p in ("", "a", "\u03b1")}
    words |= made
    assert len(words) > 10_000
    diff = conn.execute(f"""
        SELECT array_agg(store_script || ': ' || w ORDER BY w)
          FROM unnest(%s::text[]) w, unnest('{{latin,cyrillic,greek,cjk,other}}'::text[]) store_script
         WHERE storetopics._noise(w, 1, 1, 1, 1, 1, store_script) IS DISTINCT FROM ({_NOISE_BY_PATTERN})
    """, (sorted(words),)).fetchone()[0]
    assert diff is None, diff[:50]
    classes = dict(conn.execute(f"""
        SELECT c, count(*) FROM (SELECT ({_NOISE_BY_PATTERN}) AS c FROM unnest(%s::text[]) w, (SELECT 'latin') AS
                                 x(store_script)) x GROUP BY 1
    """, (sorted(words),)).fetchall())
    assert all(classes.get(c, 0) >= 10 for c in ("navigation", "date", "fragment", "script")), classes
    scripts = dict(conn.execute("SELECT storetopics._script(w), count(*) FROM unnest(%s::text[]) w GROUP BY 1",
                                (sorted(words),)).fetchall())
    assert {"latin", "cyrillic", "greek", "hebrew", "arabic", "indic", "cjk", "other"} <= set(scripts), scripts
    diff = conn.execute("""
        SELECT array_agg(w ORDER BY w)
          FROM unnest(%s::text[]) w, unnest('{ed,ing,ful,ble}'::text[]) s
         WHERE storetopics._letter_then(w, s) IS DISTINCT FROM w ~ ('[a-z]' || s || '$')
    """, (sorted(words),)).fetchone()[0]
    assert diff is None, diff[:50]
    # the miner's runs whose verdict a suffix decides: "<w> by X" passive, "<w> to X" a clause cut short, "<w> and
    # X" two verbs joined (of the words that start no run the miner refuses for another reason)
    diff = conn.execute(r"""
        SELECT array_agg(w ORDER BY w)
          FROM unnest(%s::text[]) w
         WHERE storetopics._clause_fragment(ARRAY[w, 'of', 'Xyz']) IS NULL AND w !~ '\s' AND w <> ''
           AND (storetopics._clause_fragment(ARRAY[w, 'by', 'Xyz'])
                  IS DISTINCT FROM CASE WHEN lower(w) ~ '[a-z]ed$' THEN 'passive' END
                OR storetopics._clause_fragment(ARRAY[w, 'to', 'Xyz'])
                  IS DISTINCT FROM CASE WHEN lower(w) ~ '[a-z]ed$' THEN 'passive'
                                        WHEN lower(w) ~ '[a-z](ed|ing|ful|ble)$' THEN 'clause' END
                OR storetopics._clause_fragment(ARRAY[w, 'and', 'Xyz'])
                  IS DISTINCT FROM CASE WHEN w = lower(w) AND w ~ '(ing|ed)$' THEN 'verbs joined' END
                OR storetopics._clause_fragment(ARRAY[w, 'and', 'xyz'])
                  IS DISTINCT FROM CASE WHEN w = lower(w) THEN 'verbs joined' END)
    """, (sorted(words),)).fetchone()[0]
    assert diff is None, diff[:50]
    diff = conn.execute(r"""
        SELECT array_agg(w ORDER BY w)
          FROM unnest(%s::text[]) w
         WHERE storetopics._clause_fragment(ARRAY['xyz', 'of', w]) IS NULL AND w !~ '\s' AND w <> ''
           AND storetopics._clause_fragment(ARRAY['xyz', 'and', w])
                 IS DISTINCT FROM CASE WHEN w ~ '(ing|ed)$' OR w = lower(w) THEN 'verbs joined' END
    """, (sorted(words),)).fetchone()[0]
    assert diff is None, diff[:50]
