"""The application's writes never fail because of storetopics: not after DDL on an attached table, not for rows on
which a key expression raises.

Two ways a database runs storetopics: with its event triggers (installed by a superuser: DDL that an attachment does
not survive is refused, the rest is followed at once) and without them (managed Postgres: the capture's net keeps
the writes going, fold follows what it can and fails with the error otherwise).  `guarded` is the first, and the
second is the same database with the event triggers disabled.
"""
from __future__ import annotations

import psycopg
import pytest

from tests import helpers

ROWS = [("kitchen", 1, "kitchen renovation with new tiles", '{"store": "kitchen"}'),
        ("kitchen", 2, "cabinets and a new kitchen sink", '{"store": "kitchen"}'),
        ("garden", 3, "roses, tulips and a lawn", '{"store": "garden"}')]


def _table(conn: psycopg.Connection, name: str = "docs") -> None:
    conn.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, store text, file int, content text, meta text)")
    conn.execute(f"CREATE INDEX ON {name} (file)")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {name} (store, file, content, meta) VALUES (%s, %s, %s, %s)", ROWS)


def _attach(conn: psycopg.Connection, name: str = "docs", **keys: str) -> int:
    args = {"store_key": "store", "file_key": "file", "content": "content", **keys}
    named = ", ".join(f"{k} => %s" for k in args)
    return conn.execute(f"SELECT storetopics.attach('{name}', {named})", list(args.values())).fetchone()[0]


def _unguard(conn: psycopg.Connection) -> None:
    for name in ("storetopics_follow_ddl", "storetopics_forget_dropped_tables"):
        conn.execute(f"ALTER EVENT TRIGGER {name} DISABLE")


@pytest.fixture(params=["guarded", "unguarded"])
def mode(request):
    return request.param


@pytest.fixture
def db(conn, mode):
    if mode == "unguarded":
        _unguard(conn)
    return conn


def _status(conn: psycopg.Connection, src: int) -> dict:
    cur = conn.execute("SELECT * FROM storetopics.status WHERE source_id = %s", (src,))
    return dict(zip([d.name for d in cur.description], cur.fetchone()))


# ------------------------------------------------------------------------------------------------------------
# DDL an attachment survives is followed
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ddl, then", [
    ("ALTER TABLE docs RENAME COLUMN store TO shop", "INSERT INTO docs (shop, file, content) VALUES "
                                                     "('kitchen', 4, 'a pantry with shelves for spices')"),
    ("ALTER TABLE docs RENAME COLUMN content TO body", "INSERT INTO docs (store, file, body) VALUES "
                                                       "('kitchen', 4, 'a pantry with shelves for spices')"),
    ("ALTER TABLE docs RENAME COLUMN file TO doc", "INSERT INTO docs (store, doc, content) VALUES "
                                                   "('kitchen', 4, 'a pantry with shelves for spices')"),
    ("ALTER TABLE docs RENAME TO documents", "INSERT INTO documents (store, file, content) VALUES "
                                             "('kitchen', 4, 'a pantry with shelves for spices')"),
    ("ALTER TABLE docs ALTER COLUMN file TYPE bigint", "INSERT INTO docs (store, file, content) VALUES "
                                                       "('kitchen', 4, 'a pantry with shelves for spices')"),
    ("ALTER TABLE docs ALTER COLUMN file TYPE text", "INSERT INTO docs (store, file, content) VALUES "
                                                     "('kitchen', '4', 'a pantry with shelves for spices')"),
])
def test_ddl_the_attachment_survives_is_followed_and_writes_go_on(db, ddl, then):
    _table(db)
    src = _attach(db)
    helpers.backfill(db)
    db.execute(ddl)
    db.execute(then)
    db.execute("UPDATE storetopics.sources SET key_error = NULL")   # what follows must be this test's
    helpers.backfill(db)
    assert helpers.state(db, src) == helpers.recount(db, src)
    assert helpers.state(db, src)["stores"]["kitchen"][0] == 3
    assert "pantry" in helpers.summary(db, src, "kitchen")[0] or "spices" in helpers.summary(db, src, "kitchen")[0]


def test_resync_makes_the_capture_again_after_ddl_no_event_trigger_saw(conn):
    _table(conn)
    src = _attach(conn)
    helpers.backfill(conn)
    _unguard(conn)
    conn.execute("ALTER TABLE docs RENAME COLUMN store TO shop")
    conn.execute("SELECT storetopics.resync('docs')")
    assert conn.execute("SELECT store_key FROM storetopics.sources WHERE id = %s", (src,)).fetchone()[0] == "shop"
    conn.execute("INSERT INTO docs (shop, file, content) VALUES ('garden', 5, 'a hedge of hornbeam')")
    helpers.backfill(conn)
    assert helpers.state(conn, src) == helpers.recount(conn, src)
    # the capture keyed that row itself (no count check, no error)
    assert _status(conn, src)["key_error"] is None


# ------------------------------------------------------------------------------------------------------------
# DDL an attachment does not survive: refused where the event triggers run, never a failed write elsewhere
# ------------------------------------------------------------------------------------------------------------
BREAKING = [
    # (keys, DDL, a write after it)
    ({}, "ALTER TABLE docs DROP COLUMN store", "INSERT INTO docs (file, content) VALUES (4, 'a pantry')"),
    ({}, "ALTER TABLE docs DROP COLUMN content", "INSERT INTO docs (store, file) VALUES ('kitchen', 4)"),
    ({"store_key": "c.meta::jsonb->>'store'"}, "ALTER TABLE docs RENAME COLUMN meta TO metadata",
     "INSERT INTO docs (store, file, content, metadata) VALUES ('x', 4, 'a pantry', '{\"store\": \"kitchen\"}')"),
    ({"store_key": "c.meta::jsonb->>'store'"}, "ALTER TABLE docs DROP COLUMN meta",
     "INSERT INTO docs (store, file, content) VALUES ('kitchen', 4, 'a pantry')"),
    ({"content": "c.content || ' ' || lower(c.store)"}, "ALTER TABLE docs ALTER COLUMN store TYPE int USING 0",
     "INSERT INTO docs (store, file, content) VALUES (7, 4, 'a pantry')"),
]


@pytest.mark.parametrize("keys, ddl, write", BREAKING)
def test_ddl_that_breaks_an_attachment_is_refused_where_event_triggers_run(conn, keys, ddl, write):
    _table(conn)
    src = _attach(conn, **keys)
    helpers.backfill(conn)
    before = helpers.state(conn, src)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist) as e:
        conn.execute(ddl)
    assert f"source {src}" in str(e.value) and "would break the attachment of public.docs" in str(e.value), e.value
    assert "storetopics.detach('public.docs')" in (e.value.diag.message_hint or "")
    # nothing changed: the table, the capture, the state
    conn.execute("INSERT INTO docs (store, file, content, meta) VALUES ('kitchen', 4, 'a pantry', "
                 "'{\"store\": \"kitchen\"}')")
    helpers.backfill(conn)
    assert helpers.state(conn, src) == helpers.recount(conn, src) != before


@pytest.mark.parametrize("keys, ddl, write", BREAKING)
def test_ddl_that_breaks_an_attachment_never_fails_a_write_without_event_triggers(conn, keys, ddl, write):
    _unguard(conn)
    _table(conn)
    src = _attach(conn, **keys)
    helpers.backfill(conn)
    conn.execute(ddl)
    for statement in (write, "UPDATE docs SET file = file WHERE file = 1", "DELETE FROM docs WHERE file = 2",
                      "COPY docs (file) FROM STDIN"):
        if statement.startswith("COPY"):
            with conn.cursor().copy(statement) as copy:
                copy.write_row((9,))
        else:
            conn.execute(statement)
    # the fold says what broke, and what to do; status shows it; the old summary stays
    old = helpers.summary(conn, src, "kitchen")[0]
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT storetopics._fold(%s)", (src,))
    assert f"source {src}" in str(e.value) and e.value.diag.message_hint, e.value
    assert "capture trigger could not key" in (_status(conn, src)["key_error"] or "")
    assert helpers.summary(conn, src, "kitchen")[0] == old


def test_a_dropped_partition_table_is_followed_by_a_count_check(conn):
    conn.execute("CREATE TABLE parts (id serial, store text, file int, content text) PARTITION BY RANGE (file)")
    conn.execute("CREATE TABLE parts_a PARTITION OF parts FOR VALUES FROM (0) TO (100)")
    conn.execute("CREATE TABLE parts_b PARTITION OF parts FOR VALUES FROM (100) TO (200)")
    conn.execute("INSERT INTO parts (store, file, content) VALUES ('kitchen', 1, 'tiles'), ('kitchen', 150, 'sink')")
    src = _attach(conn, "parts")
    helpers.backfill(conn)
    conn.execute("DROP TABLE parts_b")
    helpers.backfill(conn)
    assert helpers.state(conn, src) == helpers.recount(conn, src)
    assert helpers.state(conn, src)["stores"]["kitchen"][0] == 1


# ------------------------------------------------------------------------------------------------------------
# Rows on which a key expression raises
# ------------------------------------------------------------------------------------------------------------
FAILING = [
    # a division by zero for an empty store name
    ({"store_key": "CASE WHEN 100 / length(c.store) > 0 THEN c.store END"}, ("", 4, "a pantry with spices", "{}")),
    # text that is no JSON
    ({"store_key": "c.meta::jsonb->>'store'"}, ("kitchen", 4, "a pantry with spices", "not json")),
    # a subquery that finds two rows
    ({"file_key": "(SELECT x.f FROM (VALUES (c.file), (c.file + 1000)) x(f) WHERE x.f = c.file OR c.meta = 'two')"},
     ("kitchen", 4, "a pantry with spices", "two")),
]


@pytest.mark.parametrize("keys, bad", FAILING)
def test_a_key_that_raises_for_some_rows_never_fails_the_write(db, keys, bad):
    _table(db)
    src = _attach(db, **keys)
    helpers.backfill(db)
    # every kind of write that meets the bad row goes through
    db.execute("INSERT INTO docs (store, file, content, meta) VALUES (%s, %s, %s, %s)", bad)
    with db.cursor().copy("COPY docs (store, file, content, meta) FROM STDIN") as copy:
        copy.write_row(bad[:1] + (5,) + bad[2:])
        copy.write_row(("garden", 6, "a hedge of hornbeam", '{"store": "garden"}'))
    db.execute("UPDATE docs SET content = content || ' and jars' WHERE file IN (4, 5)")
    db.execute("INSERT INTO docs (store, file, content, meta) VALUES ('garden', 7, 'mulch for the roses', "
               "'{\"store\": \"garden\"}')")
    helpers.backfill(db)
    # the good rows are counted, the bad ones skipped, and status says why
    stores = helpers.state(db, src)["stores"]
    assert stores["garden"][0] == 3 and stores["kitchen"][0] == 2, stores
    status = _status(db, src)
    assert status["skipped_null_key_rows"] == 2, status
    assert status["key_error"] and status["reads"] == "row by row", status
    # resync reads set-based again, finds the rows again, and says so again
    db.execute("SELECT storetopics.resync('docs')")
    helpers.backfill(db)
    assert helpers.state(db, src)["stores"] == stores
    assert _status(db, src)["reads"] == "row by row"


def test_a_key_that_reads_what_the_owner_may_not_still_fails_loudly(conn):
    """Not a row's data error: the source's own (a right missing); no row-by-row reading hides it."""
    conn.execute("CREATE ROLE st_ddl_owner")
    try:
        conn.execute("CREATE TABLE secret (s text)")
        _table(conn)
        conn.execute("ALTER TABLE docs OWNER TO st_ddl_owner")
        src = _attach(conn, store_key="(SELECT s.s FROM public.secret s LIMIT 1)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT storetopics._fold(%s)", (src,))
        assert _status(conn, src)["reads"] == "set-based"
    finally:
        conn.execute("DROP TABLE IF EXISTS docs, secret")
        conn.execute("DROP OWNED BY st_ddl_owner")
        conn.execute("DROP ROLE st_ddl_owner")
