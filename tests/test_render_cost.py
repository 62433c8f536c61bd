"""Render in proportion to what changed: keywords() measures each file's novelty against the store's basis (its
document frequencies as of a moment, kept until they drift by half), so a file's novelty is computed once and
rendering after one upload computes one file's.  What is stored is derived state: keywords() returns the same with
every stored novelty forgotten, and the stored values are what a computation from scratch gives."""
from __future__ import annotations

import helpers
from test_ranking import FOOTBALL, load_ordinary_files


def _keywords(conn, src: int, store: str = "home") -> list[tuple]:
    return conn.execute("SELECT * FROM storetopics.keywords(%s, %s)", (src, store)).fetchall()


def _basis(conn, src: int, store: str = "home") -> tuple | None:
    return conn.execute("SELECT files, incidences, term_ids, dfs FROM storetopics.novelty_basis "
                        "WHERE source_id = %s AND store_key = %s", (src, store)).fetchone()


def _stored_is_recomputed(conn, src: int, store: str = "home") -> None:
    """Every file's stored novelty is the value computed again from its counts and the stored basis."""
    stored = dict(conn.execute("SELECT file_key, novelty FROM storetopics.file_terms WHERE source_id = %s "
                               "AND store_key = %s AND words > 0", (src, store)).fetchall())
    fresh = dict(conn.execute("SELECT * FROM storetopics._novelty_compute(%s, %s, false, true)",
                              (src, store)).fetchall())
    assert None not in stored.values()
    assert stored == fresh


def test_stored_novelty_is_derived_state(conn):
    helpers.create_chunks(conn)
    load_ordinary_files(conn, 300)
    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('home', 0, %s)", (FOOTBALL,))
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    _stored_is_recomputed(conn, src)
    warm = _keywords(conn, src)
    assert {"football", "league", "club"} & {r[2] for r in warm if r[0] == "distinctive"}
    # forgotten: computed by keywords() itself, the same
    conn.execute("UPDATE storetopics.file_terms SET novelty = NULL WHERE source_id = %s", (src,))
    assert _keywords(conn, src) == warm
    # no basis (due): measured against the current counts, which is what the basis was taken from
    basis = _basis(conn, src)
    conn.execute("DELETE FROM storetopics.novelty_basis WHERE source_id = %s", (src,))
    assert _keywords(conn, src) == warm
    conn.execute("SELECT storetopics.render(%s, 'home')", (src,))
    assert _basis(conn, src) == basis
    _stored_is_recomputed(conn, src)


def test_render_after_one_upload_computes_one_file(conn):
    helpers.create_chunks(conn)
    load_ordinary_files(conn, 300)
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    basis = _basis(conn, src)
    before = helpers.summary(conn, src, "home")

    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('home', 0, %s)", (FOOTBALL * 3,))
    conn.execute("SELECT storetopics.fold(%s)", (src,))
    assert conn.execute("SELECT count(*) FROM storetopics.file_terms WHERE source_id = %s AND novelty IS NULL",
                        (src,)).fetchone()[0] == 1
    assert conn.execute("SELECT storetopics._novelty_refresh(%s, 'home')", (src,)).fetchone()[0] == 1
    assert conn.execute("SELECT storetopics._novelty_refresh(%s, 'home')", (src,)).fetchone()[0] == 0
    helpers.backfill(conn)
    assert _basis(conn, src) == basis            # one file is no drift
    assert "football" in helpers.summary(conn, src, "home")[0].split("Distinctive:")[1]
    _stored_is_recomputed(conn, src)

    # deleting it: nothing to compute, and the summary is the one before, byte for byte
    conn.execute("DELETE FROM chunks WHERE file_id = 0")
    conn.execute("SELECT storetopics.fold(%s)", (src,))
    assert conn.execute("SELECT storetopics._novelty_refresh(%s, 'home')", (src,)).fetchone()[0] == 0
    helpers.backfill(conn)
    assert helpers.summary(conn, src, "home") == before
    assert _basis(conn, src) == basis


def test_the_basis_is_taken_again_when_the_counts_drifted_by_half(conn):
    helpers.create_chunks(conn)
    load_ordinary_files(conn, 200)
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    assert _basis(conn, src)[0] == 200
    # a third more files: the document frequencies moved by a third of the basis, which it still is
    conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                    SELECT store_id, file_id + 1000, content FROM chunks WHERE file_id <= 66""")
    helpers.backfill(conn)
    assert _basis(conn, src)[0] == 200
    _stored_is_recomputed(conn, src)
    # twice the files: taken again, and every file's novelty with it
    conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                    SELECT store_id, file_id + 2000, content FROM chunks WHERE file_id <= 200""")
    helpers.backfill(conn)
    files = conn.execute("SELECT files FROM storetopics.store_state WHERE source_id = %s", (src,)).fetchone()[0]
    assert _basis(conn, src)[0] == files == 466
    _stored_is_recomputed(conn, src)
    # a resync recounts the same counts: the basis stays, the summary too
    before = helpers.summary(conn, src, "home")
    conn.execute("SELECT storetopics.resync('chunks')")
    helpers.backfill(conn)
    assert _basis(conn, src)[0] == 466
    assert helpers.summary(conn, src, "home") == before


def test_detach_forgets_the_basis(conn):
    helpers.create_chunks(conn)
    load_ordinary_files(conn, 20)
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    assert _basis(conn, src)
    conn.execute("SELECT storetopics.detach('chunks')")
    assert conn.execute("SELECT count(*) FROM storetopics.novelty_basis WHERE source_id = %s",
                        (src,)).fetchone()[0] == 0
