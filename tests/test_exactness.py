"""Exactness: whatever the application does, after a backfill storetopics holds exactly what a recount from scratch
gives.  A property test over random sequences of statements, and the "deleting the additions restores the summary"
guarantee."""
from __future__ import annotations

import itertools

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import helpers

# Small vocabularies so that terms, files and stores collide: run/runs/running share a stem, stopwords vanish.
WORDS = ["apple", "apples", "banana", "cherry", "run", "running", "runs", "the", "and", "42", "kitchen", "tile",
         "tiles", "x", "well-known"]
STORES = st.sampled_from(["a", "a", "b", "b", "c", None])
FILES = st.sampled_from([1, 1, 2, 2, 3, 4, 5, None])
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
CONTENT = st.one_of(TEXT, TEXT, TEXT, TEXT,
                    st.sampled_from([None, "", "   ", "\x01\x02 junk", "the and of", "x", "!!! ..."]))

INSERT = st.tuples(st.just("insert"), st.lists(st.tuples(STORES, FILES, CONTENT), min_size=1, max_size=5))
BASE_OP = st.one_of(
    INSERT, INSERT, INSERT,
    st.tuples(st.just("update_file_content"), FILES, CONTENT),
    st.tuples(st.just("update_rows_content"), st.integers(2, 4), st.integers(0, 3), CONTENT),
    st.tuples(st.just("move"), FILES, STORES),
    st.tuples(st.just("rekey"), FILES, FILES),
    st.tuples(st.just("noop_update")),
    st.tuples(st.just("delete_rows"), st.integers(2, 4), st.integers(0, 3)),
    st.tuples(st.just("delete_file"), FILES),
    st.tuples(st.just("truncate")),
    st.tuples(st.just("fold"), st.integers(1, 4)),
    st.tuples(st.just("resync")),
)
TX_OP = st.tuples(st.just("tx"), st.lists(BASE_OP, min_size=1, max_size=5), st.booleans())
OPS = st.lists(st.one_of(BASE_OP, BASE_OP, BASE_OP, TX_OP, st.tuples(st.just("backfill"))), max_size=20)

_names = itertools.count()


def _file_cond(file):
    return ("file_id IS NULL", ()) if file is None else ("file_id = %s", (file,))


def _apply(conn: psycopg.Connection, tbl: str, src: int | None, op: tuple) -> None:
    kind = op[0]
    if kind == "insert":
        values = ", ".join(["(%s, %s, %s)"] * len(op[1]))
        conn.execute(f"INSERT INTO {tbl} (store_id, file_id, content) VALUES {values}",
                     [v for row in op[1] for v in row])
    elif kind == "update_file_content":
        cond, args = _file_cond(op[1])
        conn.execute(f"UPDATE {tbl} SET content = %s WHERE {cond}", (op[2], *args))
    elif kind == "update_rows_content":
        conn.execute(f"UPDATE {tbl} SET content = %s WHERE id %% %s = %s", (op[3], op[1], op[2]))
    elif kind == "move":
        cond, args = _file_cond(op[1])
        conn.execute(f"UPDATE {tbl} SET store_id = %s WHERE {cond}", (op[2], *args))
    elif kind == "rekey":
        cond, args = _file_cond(op[1])
        conn.execute(f"UPDATE {tbl} SET file_id = %s WHERE {cond}", (op[2], *args))
    elif kind == "noop_update":
        conn.execute(f"UPDATE {tbl} SET content = content, embedding = embedding")
    elif kind == "delete_rows":
        conn.execute(f"DELETE FROM {tbl} WHERE id %% %s = %s", (op[1], op[2]))
    elif kind == "delete_file":
        cond, args = _file_cond(op[1])
        conn.execute(f"DELETE FROM {tbl} WHERE {cond}", args)
    elif kind == "truncate":
        conn.execute(f"TRUNCATE {tbl}")
    elif kind == "fold" and src is not None:
        conn.execute("SELECT storetopics._fold(%s, %s)", (src, op[1]))
    elif kind == "resync" and src is not None:
        conn.execute("SELECT storetopics.resync(%s)", (tbl,))
    elif kind == "backfill" and src is not None:
        helpers.backfill(conn, tbl)
    elif kind == "tx":
        try:
            with conn.transaction():
                for inner in op[1]:
                    _apply(conn, tbl, src, inner)
                if not op[2]:
                    raise _Rollback
        except _Rollback:
            pass


class _Rollback(Exception):
    pass


def _check(conn: psycopg.Connection, src: int, tbl: str) -> None:
    assert helpers.state(conn, src) == helpers.recount(conn, src)
    assert helpers.pending(conn, src) == []
    # Every store is rendered, clean, and its text states its counts.
    for store, files, chunks, dirty, text in conn.execute(
            "SELECT store_key, files, chunks, dirty, store_topics FROM storetopics.stores WHERE source_id = %s",
            (src,)).fetchall():
        assert dirty is False
        assert files > 0
        assert helpers.sections(text)["files"] in (str(files), None), (store, text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(before=st.lists(INSERT, max_size=3), ops=OPS)
def test_random_statements_fold_exactly(conn, before, ops):
    tbl = f"ex_{next(_names)}"
    helpers.create_chunks(conn, tbl)
    src = None
    try:
        for op in before:
            _apply(conn, tbl, None, op)
        src = helpers.attach_chunks(conn, tbl)
        for op in ops:
            _apply(conn, tbl, src, op)
            if op[0] == "backfill":
                _check(conn, src, tbl)
        helpers.backfill(conn, tbl)
        _check(conn, src, tbl)
    finally:
        conn.execute("SELECT storetopics.detach(%s)", (tbl,))
        conn.execute(f"DROP TABLE {tbl}")
    assert conn.execute("SELECT count(*) FROM storetopics.file_terms WHERE source_id = %s", (src,)).fetchone()[0] == 0


# --------------------------------------------------------------------------------------------------------------
# Deleting what was added restores the summary exactly.
# --------------------------------------------------------------------------------------------------------------
HOME = ["kitchen renovation with new tiles and cabinets; the bathroom renovation needs plumbing",
        "paint the walls of the living room, sand the floor, renovation of the hallway",
        "the plumbing of the bathroom: new pipes, a new shower and tiles",
        "garden fence repair and a new deck; the roof needs tiles"]


def _home(conn, tbl="chunks"):
    helpers.create_chunks(conn, tbl)
    conn.execute(f"""INSERT INTO {tbl} (store_id, file_id, content)
                     SELECT 'home', g / 3, %s || ' ' || g FROM generate_series(1, 90) g""", (HOME[0],))
    conn.execute(f"""INSERT INTO {tbl} (store_id, file_id, content)
                     SELECT 'home', 100 + g %% 7, (ARRAY[%s, %s, %s])[1 + g %% 3] FROM generate_series(1, 40) g""",
                 HOME[1:])
    # another store in the same table, which the additions must not disturb either
    conn.execute(f"""INSERT INTO {tbl} (store_id, file_id, content)
                     SELECT 'cars', 500 + g % 5, 'engine oil change and new brake pads for the car ' || g
                       FROM generate_series(1, 20) g""")
    src = helpers.attach_chunks(conn, tbl)
    helpers.backfill(conn)
    return src


def _summaries(conn, src):
    return {s: (t, j) for s, t, j in conn.execute(
        "SELECT store_key, store_topics, topics FROM storetopics.store_state WHERE source_id = %s", (src,))}


def test_deleting_additions_restores_summary(conn):
    src = _home(conn)
    before = _summaries(conn, src)
    before_state = helpers.state(conn, src)
    assert helpers.sections(before["home"][0])["files"] == "38" and helpers.sections(before["home"][0])["terms"]
    assert "renovation" in before["home"][0]

    conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                    SELECT 'home', 1000, 'the football club won the league; the goalkeeper and the striker of the '
                                         'football club celebrated' FROM generate_series(1, 3)""")
    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('home', 1001, 'tiles tiles tiles plumbing')")
    helpers.backfill(conn)
    during = _summaries(conn, src)
    assert during["home"] != before["home"]
    assert helpers.sections(during["home"][0])["files"] == "40"
    assert "football" in during["home"][0]
    assert during["cars"] == before["cars"]

    conn.execute("DELETE FROM chunks WHERE file_id IN (1000, 1001)")
    helpers.backfill(conn)
    assert_restored(conn, src, before, before_state)


def test_deleting_additions_folded_in_several_batches_restores_summary(conn):
    src = _home(conn)
    before = _summaries(conn, src)
    before_state = helpers.state(conn, src)

    # Additions in several statements, folded in small batches between them, some rendered, some into existing
    # files (whose extra rows are deleted again), one moved in from the other store and back.
    for i in range(5):
        conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                        SELECT 'home', 2000 + %s, 'the football club won the league; striker number ' || g
                          FROM generate_series(1, 4) g""", (i,))
        conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('home', %s, 'goalkeeper gloves')",
                     (100 + i,))
        assert conn.execute("SELECT storetopics._fold(%s, 2)", (src,)).fetchone()[0] >= 1
        if i % 2:
            helpers.backfill(conn)
    conn.execute("UPDATE chunks SET store_id = 'home' WHERE file_id = 500")
    conn.execute("SELECT storetopics._fold(%s, 1)", (src,))
    helpers.backfill(conn)
    assert _summaries(conn, src)["home"] != before["home"]

    conn.execute("UPDATE chunks SET store_id = 'cars' WHERE file_id = 500")
    conn.execute("DELETE FROM chunks WHERE content = 'goalkeeper gloves'")
    conn.execute("SELECT storetopics._fold(%s, 1)", (src,))
    conn.execute("DELETE FROM chunks WHERE file_id >= 2000 AND file_id < 2003")
    conn.execute("SELECT storetopics._fold(%s, 2)", (src,))
    helpers.backfill(conn)
    conn.execute("DELETE FROM chunks WHERE file_id >= 2000")
    conn.execute("SELECT storetopics._fold(%s, 1)", (src,))
    helpers.backfill(conn)
    # The store whose additions are gone reads exactly as before.  Its sibling 'cars' was last rendered while
    # 'home' still held some of them: its terms are contrasted with its catalog as of its own last render, and
    # come back with its next one.
    after = _summaries(conn, src)
    assert after["home"] == before["home"]
    conn.execute("SELECT storetopics._render(%s, 'cars')", (src,))

    assert_restored(conn, src, before, before_state)


def assert_restored(conn, src: int, before: dict, before_state: dict) -> None:
    """Every store's summary (text, then jsonb) and the whole keyword state are exactly as before."""
    after = _summaries(conn, src)
    assert after["home"][0] == before["home"][0]
    assert after["home"][1] == before["home"][1]
    assert after == before
    assert helpers.state(conn, src) == before_state == helpers.recount(conn, src)


def test_files_with_thousands_of_distinct_words_fold_exactly(conn):
    """A file's term and count arrays past TOAST's threshold (here 4,000 distinct words: 16 kB each) are stored out
    of line; folding such files, in several batches of one session, keeps them whole (the recount's rows must not
    point into a table dropped before they are read)."""
    helpers.create_chunks(conn)
    src = helpers.attach_chunks(conn, embedding=False)
    for f in range(3):
        conn.execute("INSERT INTO chunks (store_id, file_id, content) "
                     "SELECT 'big', %s, string_agg('w' || md5((%s * 10000 + g)::text), ' ') "
                     "FROM generate_series(1, 4000) g", (f, f))
        assert conn.execute("SELECT storetopics._fold(%s, 1)", (src,)).fetchone()[0] == 1
    assert conn.execute("SELECT min(cardinality(term_ids)), max(cardinality(term_ids)) FROM storetopics.file_terms "
                        "WHERE source_id = %s", (src,)).fetchone() == (4000, 4000)
    assert helpers.state(conn, src) == helpers.recount(conn, src)
