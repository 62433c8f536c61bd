"""The database counts a summary's cl100k tokens exactly as tiktoken does (storetopics._count_tokens), so a summary
rendered by SQL alone, where no worker or CLI ever ran, fills the same 200-token budget as one the CLI rendered."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from storetopics import api, tokens
from tests import helpers

REPO = Path(__file__).resolve().parents[1]


def _words(n: int, seed: int = 0) -> list[str]:
    """n distinct ASCII words (as written: case, hyphens, digits, punctuation kept) from Debian's package
    descriptions (data/debian, in the repository), a uniform sample."""
    seen: set[str] = set()
    with gzip.open(REPO / "data" / "debian" / "descriptions.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            for w in (r["short"] + " " + r["long"]).split():
                if w.isascii():
                    seen.add(w)
    return random.Random(seed).sample(sorted(seen), n)


ODD = ["  double", " x   ", "'s", "'stuff", " 1.2k", " 12345", " --help", " Topics:", " (a)", "\tx", " ...",
       " a-b-c", " don't", " O'Reilly", " WE'LL", " 3.14159", " C++", " .NET", " e-mail,", " mod_rewrite,", ""]


def test_counts_are_tiktokens_for_real_words_as_render_cuts_them(conn):
    pieces = ODD + [f" {w}{end}" for w in _words(3000) for end in ("", ",", ".")]
    got = [r[0] for r in conn.execute("SELECT storetopics._count_tokens(x) FROM unnest(%s::text[]) "
                                      "WITH ORDINALITY AS u(x, i) ORDER BY i", (pieces,))]
    wrong = [(p, g, tokens.count(p)) for p, g in zip(pieces, got) if g != tokens.count(p)]
    assert wrong == [], wrong[:20]


def test_text_outside_ascii_is_left_to_tiktoken(conn):
    assert conn.execute("SELECT storetopics._count_tokens(' Über'), storetopics._count_tokens(' a\nb')"
                        ).fetchone() == (None, None)


@pytest.mark.parametrize("path", ["sql", "cli"])
def test_a_summary_fills_the_budget_whichever_path_renders_it(conn, path):
    """The same stores rendered by SQL alone and by the CLI (which counts with tiktoken) say the same."""
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn, embedding=False)
    words = _words(1200, seed=1)
    rows = [(f"store{s}", s * 100 + f, " ".join(words[(s * 400 + f * 40 + k) % 1200] for k in range(60)))
            for s in range(3) for f in range(12)]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO chunks (store_id, file_id, content) VALUES (%s, %s, %s)", rows)
    if path == "sql":
        conn.execute("SELECT * FROM storetopics.backfill()")
    else:
        api.backfill(conn)
    texts = dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores").fetchall())
    assert len(texts) == 3
    for key, text in texts.items():
        n = tokens.count(text)
        assert 190 <= n <= 200, (key, n, text)


def test_the_database_counts_only_chunks_not_counted_yet(conn):
    """A render passes the database its ~300 chunks each time it runs: those already in token_counts must cost no
    byte-pair merge (the count was once taken for every chunk of the text, counted or not)."""
    conn.execute("SET track_functions = 'all'")
    text = " ".join(_words(200, seed=2))
    bpe = "pg_stat_get_xact_function_calls('storetopics._bpe_count'::regproc)"
    with conn.transaction():
        conn.execute("SELECT storetopics._count_in_database(%s)", (text,))
        first = conn.execute(f"SELECT {bpe}").fetchone()[0]
        counted = conn.execute("SELECT count(*) FROM storetopics.token_counts").fetchone()[0]
        conn.execute("SELECT storetopics._count_in_database(%s)", (text + " zqxwv",))
        second = conn.execute(f"SELECT {bpe}").fetchone()[0] - first
    assert first >= 200 and counted >= 200
    assert second == 1          # " zqxwv" alone: one pretoken
    assert conn.execute("SELECT tokens FROM storetopics.token_counts WHERE chunk = ' zqxwv'").fetchone()[0] \
        == tokens.count(" zqxwv")


def test_a_piece_is_priced_by_looking_up_its_words_not_by_reading_every_count(conn):
    """token_counts holds every word any summary has shown (a catalog of many stores: tens of thousands).  Pricing a
    piece of a summary (storetopics._tokens, a dozen calls a render) and finding its uncounted words
    (storetopics._uncounted) look each word up by its key: a few buffers a word, however many counts there are (a
    join hashed the whole table at every call: bench/README.md)."""
    conn.execute("INSERT INTO storetopics.token_counts (chunk, tokens) "
                 "SELECT ' zzw' || g, 2 FROM generate_series(1, 50000) g")
    conn.execute("ANALYZE storetopics.token_counts")
    pieces = ["zzw7 zzw70 zzw700 zzw7000 unknownword", "zzw123 zzw1234"]
    assert [r[0] for r in conn.execute("SELECT tokens FROM storetopics._tokens(%s::text[]) ORDER BY i",
                                       (pieces,))] == [2 * 4 + len(" unknownword"), 2 * 2]
    assert conn.execute("SELECT storetopics._uncounted(%s)", (" ".join(pieces),)).fetchone()[0] == [" unknownword"]
    table = conn.execute("SELECT pg_relation_size('storetopics.token_counts') / 8192").fetchone()[0]
    priced = helpers.buffers(conn, "SELECT * FROM storetopics._tokens(%s::text[])", (pieces,))
    found = helpers.buffers(conn, "SELECT storetopics._uncounted(%s)", (" ".join(pieces),))
    assert table > 200 and priced <= 4 * 7 and found <= 4 * 7, (table, priced, found)
