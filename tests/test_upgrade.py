"""Upgrades keep the data: a database on 0.1 (extension and plain script), attached and backfilled on real text with
clusters and labels, is upgraded to the current version (ALTER EXTENSION storetopics UPDATE / `storetopics install`)
while an application keeps writing.  Its state survives as it was (no re-backfill), the writes made during the
upgrade are counted, and the upgraded catalog is the one a fresh install of the current version creates."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest

from lab import demo
from storetopics import install as st_install
from tests import harness, helpers
from tests.test_install import _catalog

STORES = ("games", "science", "mail")
PER_STORE = 60


@pytest.fixture
def database(pg_admin_dsn):
    created = []

    def make(prefix: str) -> str:
        name = harness.create_database(pg_admin_dsn, prefix=prefix)
        created.append(name)
        dsn = harness.with_db(pg_admin_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE EXTENSION plpython3u")   # 0.1's backfill() clusters inside the database
        return dsn

    yield make
    for name in created:
        harness.drop_database(pg_admin_dsn, name)


def _install(dsn: str, how: str, version: str | None) -> None:
    if how == "extension":
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET client_min_messages = warning")
            if version is None:
                conn.execute("CREATE EXTENSION storetopics")
            else:
                conn.execute(f"CREATE EXTENSION storetopics VERSION '{version}'")
    else:
        st_install.install(dsn, version=version, log=lambda *a: None)


def _upgrade(dsn: str, how: str) -> None:
    if how == "extension":
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET client_min_messages = warning")
            conn.execute("ALTER EXTENSION storetopics UPDATE")
    else:
        st_install.install(dsn, log=lambda *a: None)


def _populate(conn: psycopg.Connection) -> int:
    demo.recreate_table(conn)
    corpus = demo.read_corpus(STORES)
    embeddings = demo.read_embeddings()
    for store in STORES:
        demo.load(conn, store, corpus[store][:PER_STORE], embeddings)
    src = conn.execute(f"SELECT storetopics.attach('{demo.TABLE}', store_key => 'store', file_key => 'file', "
                       "content => 'content', embedding => 'embedding')").fetchone()[0]
    conn.execute("SELECT * FROM storetopics.backfill()")
    return src


def _kept(conn: psycopg.Connection, src: int) -> dict:
    """What an upgrade must keep: keyword state, counters, summaries, clusters with their labels, the ledger."""
    q = lambda sql: conn.execute(sql, (src,)).fetchall()  # noqa: E731
    return {
        "state": helpers.state(conn, src),
        "summaries": helpers.summaries(conn, src),
        "store_state": q("SELECT store_key, files, chunks, words, version, rendered_version, fit_generation, fit_k, "
                         "fit_dim, fit_chunks FROM storetopics.store_state WHERE source_id = %s ORDER BY 1"),
        "clusters": q("SELECT store_key, cluster_id, centroid::text, radius, chunks, files, outliers, keywords, "
                      "representatives, label, labeller, label_needed FROM storetopics.clusters "
                      "WHERE source_id = %s ORDER BY 1, 2"),
        # (0.1 kept them in file_terms, 0.2 in file_clusters: a row for each file with chunks assigned)
        "file_clusters": q("SELECT file_key, store_key, cluster_ids, cluster_chunks, cluster_outliers, other_dim "
                           "FROM storetopics.file_clusters WHERE source_id = %s ORDER BY 1, 2"
                           if conn.execute("SELECT to_regclass('storetopics.file_clusters')").fetchone()[0] else
                           "SELECT file_key, store_key, cluster_ids, cluster_chunks, cluster_outliers, other_dim "
                           "FROM storetopics.file_terms WHERE source_id = %s AND store_key IS NOT NULL "
                           "AND (cardinality(cluster_ids) > 0 OR other_dim <> 0) ORDER BY 1, 2"),
        "ledger": q("SELECT store_key, cluster_id, outcome FROM storetopics.label_ledger WHERE source_id = %s "
                    "ORDER BY id"),
    }


class Writer(threading.Thread):
    """The application: one new file (three chunks) into the games store per statement, until stopped."""

    def __init__(self, dsn: str):
        super().__init__(daemon=True)
        self.dsn, self.stop, self.files, self.error = dsn, threading.Event(), 0, None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    conn.execute(f"INSERT INTO {demo.TABLE} (store, file, content) SELECT 'games', %s, t "
                                 "FROM unnest(ARRAY['a puzzle game with levels', 'the levels unlock new worlds', "
                                 "'a soundtrack of chiptunes']) t", (f"written-during-upgrade-{self.files}",))
                    self.files += 1
                    time.sleep(0.005)
        except Exception as e:  # reported by the test
            self.error = e


@pytest.mark.parametrize("how", ["extension", "script"])
def test_upgrade_from_0_1_keeps_the_state_and_the_writes_made_meanwhile(database, how):
    dsn = database(f"st_up_{how}")
    _install(dsn, how, "0.1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        assert st_install.installed(conn) == (how, "0.1")
        src = _populate(conn)
        before = _kept(conn, src)
        assert before["state"] == helpers.recount(conn, src)
        assert before["clusters"] and all(k[9] is None for k in before["clusters"])   # offline labels
        assert all(text for text, _ in before["summaries"].values())

        writer = Writer(dsn)
        writer.start()
        while writer.files < 20 and writer.is_alive():
            time.sleep(0.01)
        _upgrade(dsn, how)
        during = writer.files
        time.sleep(0.2)
        writer.stop.set()
        writer.join(10)
        assert writer.error is None, writer.error
        assert writer.files > during > 20

        version = st_install.default_version()
        assert st_install.installed(conn) == (how, version)
        # Nothing was recounted, re-fitted or relabelled by the upgrade itself: the state is the one 0.1 left.
        after = _kept(conn, src)
        assert after == before
        # The writes made before, during and after the upgrade are all counted by the next backfill, without a
        # re-fit of the existing clusters (their generation stays).
        conn.execute("SELECT * FROM storetopics.backfill()")
        assert helpers.state(conn, src) == helpers.recount(conn, src)
        games = helpers.state(conn, src)["stores"]["games"]
        assert games[0] == before["state"]["stores"]["games"][0] + writer.files
        fits = conn.execute("SELECT store_key, fit_generation FROM storetopics.store_state WHERE source_id = %s "
                            "ORDER BY 1", (src,)).fetchall()
        assert fits == [(s, g) for s, _f, _c, _w, _v, _r, g, *_ in before["store_state"]]


@pytest.mark.parametrize("how", ["extension", "script"])
def test_an_upgraded_catalog_is_a_fresh_install(database, how):
    upgraded, fresh = database(f"st_upc_{how}"), database(f"st_fresh_{how}")
    _install(upgraded, how, "0.1")
    _upgrade(upgraded, how)
    _install(fresh, how, None)
    with psycopg.connect(upgraded) as a, psycopg.connect(fresh) as b:
        ca, cb = _catalog(a), _catalog(b)
        for part in cb:
            assert ca[part] == cb[part], part
