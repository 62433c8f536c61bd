"""The recipes of docs/recipes.md for tables people design themselves, as written there:

* hand-rolled: stores(id, name, store_topics) <- files(id, store_id, name) <- chunks(file_id ON DELETE CASCADE);
  only files knows the store, files move between stores by UPDATE files SET store_id, and each store's summary is
  mirrored into stores.store_topics;
* keyword-only: a table with text and no embedding column.

Attached after the data exists and before; additions show; deleting them restores the summary exactly; detach
leaves the application's tables as they were.  Roles (non-superuser owner and worker) are in test_roles.py."""
from __future__ import annotations

import psycopg
import pytest

from tests import helpers
from tests.test_libraries import GARAGE, KITCHEN, STARS, check

HAND_DDL = """
CREATE TABLE stores (id int PRIMARY KEY, name text NOT NULL, store_topics text);
CREATE TABLE files (id bigint PRIMARY KEY, store_id int NOT NULL REFERENCES stores, name text NOT NULL);
CREATE TABLE chunks (id bigserial PRIMARY KEY, file_id bigint NOT NULL REFERENCES files ON DELETE CASCADE,
                     content text NOT NULL, embedding vector(3));
CREATE INDEX ON chunks (file_id);
"""
# docs/recipes.md's recipe (its index comes before it there; tests/test_docs.py runs it as written).
HAND_ATTACH = """
SELECT storetopics.attach('public.chunks',
  store_key   => '(SELECT f.store_id FROM public.files f WHERE f.id = c.file_id)',
  file_key    => 'file_id',
  content     => 'content',
  embedding   => 'embedding',
  files_table => 'public.files', files_key => 'id',
  mirror      => 'public.stores', mirror_key => 'id', mirror_column => 'store_topics')"""


def hand_add(conn, store: int, first_file: int, files: dict[str, list[str]]) -> list[int]:
    ids = []
    for n, (name, texts) in enumerate(files.items()):
        fid = first_file + n
        conn.execute("INSERT INTO files (id, store_id, name) VALUES (%s, %s, %s)", (fid, store, name))
        conn.execute("INSERT INTO chunks (file_id, content, embedding) SELECT %s, t, '[1,0,0]' "
                     "FROM unnest(%s::text[]) t", (fid, texts))
        ids.append(fid)
    return ids


def mirrored(conn) -> dict:
    return dict(conn.execute("SELECT id::text, store_topics FROM stores").fetchall())


def assert_mirror(conn, src: int) -> None:
    """stores.store_topics holds exactly what storetopics.stores holds (NULL for a store without summary)."""
    views = dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores WHERE source_id = %s",
                              (src,)).fetchall())
    assert mirrored(conn) == {k: views.get(k) for k in mirrored(conn)}


@pytest.mark.parametrize("when", ["after", "before"])
def test_hand_rolled_files_cascade_moves_and_mirror(conn, when):
    conn.execute(HAND_DDL)
    conn.execute("INSERT INTO stores VALUES (1, 'kitchen', NULL), (2, 'garage', 'stale text'), (3, 'empty', NULL)")
    if when == "before":
        src = conn.execute(HAND_ATTACH).fetchone()[0]
    hand_add(conn, 1, 100, KITCHEN)
    hand_add(conn, 2, 200, GARAGE)
    if when == "after":
        src = conn.execute(HAND_ATTACH).fetchone()[0]
    base = check(conn, src, {"1": ["pasta", "garlic"], "2": ["brake", "engine"]})
    assert helpers.state(conn, src)["stores"]["1"][:2] == (3, 6)
    assert_mirror(conn, src)
    assert mirrored(conn)["3"] is None and helpers.sections(mirrored(conn)["2"])["files"] == "3"
    before_state = helpers.state(conn, src)

    # additions, then a file moved from the kitchen to the garage by an UPDATE of files alone
    added = hand_add(conn, 1, 300, STARS)
    check(conn, src, {"1": ["telescope"]})
    conn.execute("UPDATE files SET store_id = 2 WHERE id = 100")  # pasta.txt
    assert conn.execute("SELECT dirty FROM storetopics.stores WHERE source_id = %s AND store_key = '1'",
                        (src,)).fetchone()[0] is True
    st_moved = helpers.state(conn, src)
    moved = check(conn, src, {"1": ["telescope"], "2": ["pasta"]})
    st = helpers.state(conn, src)
    assert st["stores"]["2"][:2] == (4, 8) and st["stores"]["1"][:2] == (4, 8)
    assert ("100", "2") in st["files"] and ("100", "1") not in st["files"] and st != st_moved
    assert_mirror(conn, src)
    assert "pasta" in mirrored(conn)["2"]
    # a rename of a file is an UPDATE too: recounted, nothing changes
    conn.execute("UPDATE files SET name = 'pasta-v2.txt' WHERE id = 100")
    assert check(conn, src, {}) == moved

    # move back, delete the additions through files (the chunks go by cascade): exactly as before
    conn.execute("UPDATE files SET store_id = 1 WHERE id = 100")
    conn.execute("DELETE FROM files WHERE id = ANY(%s)", (added,))
    assert conn.execute("SELECT count(*) FROM chunks WHERE file_id = ANY(%s)", (added,)).fetchone()[0] == 0
    check(conn, src, {})
    helpers.assert_restored(conn, src, base, before_state)
    assert_mirror(conn, src)

    # a store emptied: its summary and its mirror go
    conn.execute("DELETE FROM files WHERE store_id = 2")
    check(conn, src, {"1": ["pasta"]})
    assert mirrored(conn)["2"] is None and mirrored(conn)["1"] == base["1"][0]

    # detach: no trigger, no storetopics row left for the source; the application's tables untouched
    tables = {t: conn.execute(f"SELECT md5(string_agg(x::text, ',' ORDER BY x::text)) FROM {t} x").fetchone()[0]
              for t in ("stores", "files", "chunks")}
    assert conn.execute("SELECT storetopics.detach('chunks')").fetchone()[0] is True
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'storetopics%'").fetchone()[0] == 0
    for t, col in (("sources", "id"), ("pending", "source_id"), ("file_terms", "source_id"),
                   ("store_terms", "source_id"), ("store_state", "source_id")):
        assert conn.execute(f"SELECT count(*) FROM storetopics.{t} WHERE {col} = %s", (src,)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = %s", (f"capture_{src}",)).fetchone()[0] == 0
    assert tables == {t: conn.execute(f"SELECT md5(string_agg(x::text, ',' ORDER BY x::text)) FROM {t} x").fetchone()[0]
                      for t in ("stores", "files", "chunks")}
    conn.execute("UPDATE files SET store_id = 1")
    conn.execute("DELETE FROM files")
    assert conn.execute("SELECT count(*) FROM storetopics.pending").fetchone()[0] == 0


def test_mirror_never_fails_the_fold(conn):
    conn.execute(HAND_DDL)
    conn.execute("INSERT INTO stores VALUES (1, 'kitchen', NULL)")
    src = conn.execute(HAND_ATTACH).fetchone()[0]
    hand_add(conn, 1, 100, KITCHEN)
    check(conn, src, {"1": ["pasta"]})
    assert_mirror(conn, src)
    # the mirror's column goes, then its table: rendering carries on with a warning
    conn.execute("SET client_min_messages = warning")
    notices = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    conn.execute("ALTER TABLE stores DROP COLUMN store_topics")
    hand_add(conn, 1, 200, GARAGE)
    check(conn, src, {"1": ["brake"]})
    assert any("could not mirror the summary of store 1" in n for n in notices), notices
    notices.clear()
    conn.execute("DROP TABLE stores CASCADE")
    conn.execute("DELETE FROM files WHERE id >= 200")
    check(conn, src, {"1": ["pasta"]})
    assert any("could not mirror the summary of store 1" in n for n in notices), notices


@pytest.mark.parametrize("args, error", [
    ("mirror => 'nope'", 'relation "nope" does not exist'),
    ("mirror => 'stores', mirror_key => 'nope'", "has no column nope (mirror_key)"),
    ("mirror => 'stores', mirror_column => 'nope'", "has no column nope (mirror_column)"),
    ("mirror => 'stores', mirror_column => 'id'", "is integer, not a text column"),
    ("mirror => 'stores', mirror_column => 'name', mirror_key => 'name'", "not a text column of its own"),
    ("files_table => 'files', files_key => 'nope'", "files_table public.files has no column nope"),
    ("files_table => 'storetopics.stores'", "files_table storetopics.stores is not a table"),
])
def test_attach_checks_mirror_and_files_table(conn, args, error):
    conn.execute(HAND_DDL)
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT storetopics.attach('chunks', store_key => "
                     "'(SELECT f.store_id FROM public.files f WHERE f.id = c.file_id)', file_key => 'file_id', "
                     f"content => 'content', {args})")
    assert error in str(e.value)
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'storetopics%'").fetchone()[0] == 0


# --------------------------------------------------------------------------------------------------------------
# keyword-only: text and no embedding column at all
# --------------------------------------------------------------------------------------------------------------
KEYWORD_ATTACH = """
SELECT storetopics.attach('public.notes', store_key => 'notebook', file_key => 'path', content => 'body',
                          embedding => NULL)"""


@pytest.mark.parametrize("when", ["after", "before"])
def test_keyword_only(conn, when):
    conn.execute("CREATE TABLE notes (id bigserial PRIMARY KEY, notebook text NOT NULL, path text NOT NULL, "
                 "body text, body_tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', body)) STORED)")
    conn.execute("CREATE INDEX ON notes (path)")

    def add(notebook, files):
        for path, texts in files.items():
            for t in texts:
                conn.execute("INSERT INTO notes (notebook, path, body) VALUES (%s, %s, %s)", (notebook, path, t))

    if when == "before":
        src = conn.execute(KEYWORD_ATTACH).fetchone()[0]
    add("kitchen", KITCHEN)
    add("garage", GARAGE)
    if when == "after":
        src = conn.execute(KEYWORD_ATTACH).fetchone()[0]
    base = check(conn, src, {"kitchen": ["pasta", "garlic"], "garage": ["brake"]})
    before_state = helpers.state(conn, src)
    add("kitchen", STARS)
    conn.execute("UPDATE notes SET body = body || ' garlic' WHERE path = 'pasta.txt'")
    during = check(conn, src, {"kitchen": ["telescope", "garlic"]})
    assert during["garage"] == base["garage"] and during["kitchen"] != base["kitchen"]
    conn.execute("DELETE FROM notes WHERE path = ANY(%s)", (list(STARS),))
    conn.execute("UPDATE notes SET body = left(body, -7) WHERE path = 'pasta.txt'")
    check(conn, src, {})
    helpers.assert_restored(conn, src, base, before_state)
