"""Bad input never fails the application's statement; storetopics counts it as skipped, exactly, and still counts the
valid rows of the same statement."""
from __future__ import annotations

import random
import string

import psycopg
import pytest

from tests import helpers

GOOD = "kitchen renovation tiles"      # 3 terms: kitchen, renov, tile
EMB = "[1,2,3,4,5,6,7,8]"


def _table(conn):
    # An untyped `vector` column takes embeddings of any dimension; `note` is a column storetopics does not read.
    conn.execute("CREATE TABLE chunks (id serial PRIMARY KEY, store_id text, file_id int, content text, "
                 "embedding vector, note text)")
    return helpers.attach_chunks(conn, "chunks")


def _huge_tsvector_text(seed: int) -> str:
    """~900 kB of distinct random hyphenated words: under the 1 MB text limit, but each compound gives three
    lexemes (the compound and its parts), so the tsvector's lexemes pass 1 MB."""
    rnd = random.Random(seed)
    words, size = [], 0
    while size < 900_000:
        w = "".join(rnd.choices(string.ascii_lowercase, k=6)) + "-" + "".join(rnd.choices(string.ascii_lowercase, k=6))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)


def _insert(conn, rows):
    values = ", ".join(["(%s, %s, %s, %s::vector)"] * len(rows))
    conn.execute(f"INSERT INTO chunks (store_id, file_id, content, embedding) VALUES {values}",
                 [v for r in rows for v in r])


def test_huge_tsvector_text_really_overflows(conn):
    text = _huge_tsvector_text(1)
    assert len(text.encode()) < 1_000_000
    assert conn.execute("SELECT storetopics._usable_text(%s)", (text,)).fetchone()[0] is True
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("SELECT to_tsvector('english', %s)", (text,))


def test_bad_rows_in_one_statement_are_skipped_and_good_rows_counted(conn):
    src = _table(conn)
    huge_tsv_1, huge_tsv_2 = _huge_tsvector_text(1), _huge_tsvector_text(2)
    rows = [
        ("s", 1, GOOD, EMB),
        ("s", 1, GOOD, EMB),
        ("s", 1, None, EMB),                                  # NULL content
        ("s", 1, "", EMB),                                    # empty
        ("s", 1, " \t\n  ", EMB),                             # whitespace only
        ("s", 1, "big " * 270_000, EMB),                      # text over 1 MB
        ("s", 1, "\x01\x02\x03 binary \x07 junk \x1f", EMB),   # control characters
        ("s", 1, huge_tsv_1, EMB),                            # tsvector over 1 MB, in a file with good rows
        ("s", 1, "garden fence", None),                       # NULL embedding: the text is good, counted
        ("s", 1, "roof repair", "[1,2,3]"),                   # wrong dimension: the text is good, counted
        ("s", 4, huge_tsv_2, EMB),                            # tsvector over 1 MB, alone in its file
        (None, 2, GOOD, EMB),                                 # NULL store key
        ("s", None, GOOD, EMB),                               # NULL file key
        ("t", 3, "garden tiles", EMB),                        # another store, same statement
    ]
    _insert(conn, rows)      # the application's statement succeeds
    assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 14
    # one resync marker (attach) and each distinct key pair of the statement once
    assert sorted(helpers.pending(conn, src), key=repr) == sorted(
        [(src, None, None, True), (src, "s", "1", False), (src, "s", "4", False), (src, None, "2", False),
         (src, "s", None, False), (src, "t", "3", False)], key=repr)
    conn.execute("SELECT storetopics._fold(%s)", (src,))      # fast path fails on the batch, slow path counts it
    helpers.backfill(conn)

    st = helpers.state(conn, src)
    assert st["stores"] == {"s": (2, 11, 10, 7), "t": (1, 1, 2, 0)}
    assert st["terms"] == {
        ("s", "kitchen"): (1, 2, 4), ("s", "renov"): (1, 2, 4), ("s", "tile"): (1, 2, 4),
        ("s", "garden"): (1, 1, 1), ("s", "fenc"): (1, 1, 1), ("s", "roof"): (1, 1, 1), ("s", "repair"): (1, 1, 1),
        ("t", "garden"): (1, 1, 1), ("t", "tile"): (1, 1, 1)}
    assert st["files"][("1", "s")][:3] == (10, 6, 10)
    assert st["files"][("4", "s")] == (1, 1, 0, ())
    assert st["files"][("2", None)] == (1, 0, 0, ())
    assert st == helpers.recount(conn, src)
    status = conn.execute("SELECT skipped_text_rows, skipped_null_key_rows, chunks, files, pending_events "
                          "FROM storetopics.status WHERE source_id = %s", (src,)).fetchone()
    assert status == (7, 2, 12, 3, 0)
    text = helpers.summary(conn, src, "s")[0]
    assert helpers.sections(text)["files"] == "2" and helpers.sections(text)["terms"], text
    assert "kitchen" in text and "junk" not in text and "big" not in text


@pytest.mark.parametrize("store, file, content, emb, skipped_text, skipped_null", [
    ("s", 1, None, EMB, 1, 0),
    ("s", 1, "", EMB, 1, 0),
    ("s", 1, "   \n\t ", EMB, 1, 0),
    ("s", 1, "x" * 1_048_576, EMB, 1, 0),
    ("s", 1, "\x08 backspace junk", EMB, 1, 0),
    ("s", 1, "tiles", None, 0, 0),
    ("s", 1, "tiles", "[1,2]", 0, 0),
    (None, 1, "tiles", EMB, 0, 1),
    ("s", None, "tiles", EMB, 0, 1),
], ids=["null", "empty", "blank", "over-1MB", "control", "null-embedding", "wrong-dimension", "null-store",
        "null-file"])
def test_each_bad_row_next_to_a_good_one(conn, store, file, content, emb, skipped_text, skipped_null):
    src = _table(conn)
    _insert(conn, [("s", 1, GOOD, EMB), (store, file, content, emb)])
    helpers.backfill(conn)
    status = conn.execute("SELECT skipped_text_rows, skipped_null_key_rows FROM storetopics.status "
                          "WHERE source_id = %s", (src,)).fetchone()
    assert status == (skipped_text, skipped_null)
    counted = 1 + (store is not None and file is not None)
    words = 3 + (1 if counted == 2 and skipped_text == 0 else 0)
    assert helpers.state(conn, src)["stores"] == {"s": (1, counted, words, skipped_text)}
    assert helpers.state(conn, src) == helpers.recount(conn, src)


def test_update_of_unrelated_column_logs_nothing(conn):
    src = _table(conn)
    _insert(conn, [("s", 1, GOOD, EMB), ("s", 2, "garden fence", EMB), ("t", 3, "roof", None)])
    helpers.backfill(conn)
    assert helpers.pending(conn, src) == []

    conn.execute("UPDATE chunks SET note = 'reviewed'")
    conn.execute("UPDATE chunks SET content = content, store_id = store_id, embedding = embedding")
    conn.execute("UPDATE chunks SET id = id + 100")
    assert helpers.pending(conn, src) == []
    assert conn.execute("SELECT bool_or(dirty) FROM storetopics.stores WHERE source_id = %s",
                        (src,)).fetchone()[0] is False

    # ... while a relevant change logs exactly the rows' keys, once per statement and key pair
    conn.execute("UPDATE chunks SET content = content || ' tiles', note = NULL WHERE file_id IN (1, 3)")
    assert helpers.pending(conn, src) == [(src, "s", "1", False), (src, "t", "3", False)]
    conn.execute("UPDATE chunks SET embedding = '[0,0,0]' WHERE file_id = 2")
    assert helpers.pending(conn, src) == [(src, "s", "1", False), (src, "s", "2", False), (src, "t", "3", False)]
    helpers.backfill(conn)
    assert helpers.state(conn, src) == helpers.recount(conn, src)
