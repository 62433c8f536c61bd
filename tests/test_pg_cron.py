"""The refresh from inside the database, for pg_cron (issue 34): storetopics.refresh(time_budget), the worker's loop
as one SQL call, and a real pg_cron job (Debian's postgresql-15-cron) that runs it on a schedule.

* refresh() does only what the worker's rules make due (claim(): debounce, a paused source, a store leased to a
  worker), one step (a table's fold, a store's pass) at least per call and none started once its budget is spent,
  one call at a time per database; a worker role may run it, a reader may not; it shows in worker_status() and
  `storetopics status` as the worker storetopics.refresh();
* the recipe's job (every minute, a statement_timeout and a time budget) on a throwaway cluster with pg_cron
  preloaded: its first run renders the stores that are due, clustered inside the database (plpython3u), leaves a
  debounced source for later, and `storetopics status` shows the job's last run.  (pg_cron 1.4 schedules by the
  minute: this test waits for the next one, up to 60 s.)
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from storetopics import install as st_install
from tests import harness, helpers

REPO = Path(__file__).resolve().parents[1]
RECIPE = """SELECT cron.schedule('storetopics-refresh', '* * * * *',
  $$SET statement_timeout = '5min'; SELECT * FROM storetopics.refresh(time_budget => interval '45 seconds')$$)"""


def _refresh(conn: psycopg.Connection, budget: str = "1 hour") -> list[tuple]:
    return conn.execute("SELECT store_key, outcome, changed FROM storetopics.refresh(%s::interval)",
                        (budget,)).fetchall()


def _rendered(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores WHERE store_topics IS NOT NULL"))


def _refresher(conn: psycopg.Connection) -> tuple:
    return conn.execute("SELECT processed, regenerated, failures, stopped_at IS NOT NULL FROM "
                        "storetopics.worker_status() WHERE id = 'storetopics.refresh()'").fetchone()


def test_refresh_follows_the_workers_rules_within_its_budget(dsn, conn):
    helpers.create_chunks(conn)
    helpers.insert_chunks(conn, [(s, i, f"notes about {s} and item {i}", None) for s in ("a", "b", "c")
                                 for i in range(1, 4)])
    helpers.attach_chunks(conn, embedding=False)
    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 300}')")
    # not due: the attach and the writes wait out their debounce, as they would for a worker
    assert _refresh(conn) == [] and _rendered(conn) == {}
    assert {r[0] for r in conn.execute("SELECT why FROM storetopics.work_due()")} == {"debounce"}
    assert _refresher(conn) == (0, 0, 0, True)   # seen, with nothing done, and not running

    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
    # a budget of nothing: one step per call all the same (the attach's fold, then a store), the rest left for later
    assert _refresh(conn, "0") == [] and _rendered(conn) == {}
    assert _refresh(conn, "0") == [("a", "clean", True)]
    assert set(_rendered(conn)) == {"a"}
    assert _refresh(conn, "0") == [("b", "clean", True)]
    assert _refresh(conn) == [("c", "clean", True)]
    assert _refresh(conn) == []
    assert set(_rendered(conn)) == {"a", "b", "c"}
    assert _refresher(conn) == (3, 3, 0, True)
    assert {r[0] for r in conn.execute("SELECT state FROM storetopics.work_status()")} == {"idle"}

    # a store leased to a worker is not touched (the worker's claim()); a paused source is skipped
    helpers.insert_chunks(conn, [("a", 9, "more notes about a", None), ("b", 9, "more notes about b", None)])
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT store_key FROM storetopics._claim('a-worker', 60, 1)").fetchall() == [("a",)]
        assert _refresh(conn) == [("b", "clean", True)]
        other.execute("SELECT storetopics._worker_stop('a-worker')")   # gives the lease back: a is dirty still
    assert _refresh(conn) == [("a", "clean", True)]
    helpers.insert_chunks(conn, [("c", 9, "more notes about c", None)])
    conn.execute("SELECT storetopics.pause('chunks')")
    assert _refresh(conn) == []
    conn.execute("SELECT storetopics.resume('chunks')")   # (a change of settings: every store renders again)
    assert ("c", "clean", True) in _refresh(conn)
    assert _refresh(conn) == []


def test_one_refresh_at_a_time(dsn, conn):
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn, embedding=False)
    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
    with psycopg.connect(dsn) as first:   # a transaction: its refresh() holds the lock until it commits
        assert _refresh(first) == []
        helpers.insert_chunks(conn, [("a", 1, "notes about a", None)])
        notices = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute("SET client_min_messages = notice")
        started = time.monotonic()
        assert _refresh(conn) == []                   # returns at once, having done nothing
        assert time.monotonic() - started < 5
        assert any("another refresh() is running" in n for n in notices), notices
        first.commit()
    assert _refresh(conn) == [("a", "clean", True)]


def test_a_worker_role_may_run_it_a_tenant_may_not(dsn, conn):
    from psycopg import conninfo
    helpers.create_chunks(conn)
    helpers.insert_chunks(conn, [("a", 1, "notes about a", None)])
    helpers.attach_chunks(conn, embedding=False)
    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
    for role in ("st_refresh_worker", "st_refresh_tenant"):
        conn.execute(f"DROP ROLE IF EXISTS {role}")   # roles are cluster-wide
        conn.execute(f"CREATE ROLE {role} LOGIN")
    conn.execute("SELECT storetopics.grant_worker('st_refresh_worker')")
    conn.execute("SELECT storetopics.grant_read('st_refresh_tenant', 'chunks')")
    try:
        with psycopg.connect(conninfo.make_conninfo(dsn, user="st_refresh_tenant"), autocommit=True) as t, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            _refresh(t)
        with psycopg.connect(conninfo.make_conninfo(dsn, user="st_refresh_worker"), autocommit=True) as w:
            assert _refresh(w) == [("a", "clean", True)]
    finally:
        conn.execute("DROP OWNED BY st_refresh_worker, st_refresh_tenant")
        conn.execute("DROP ROLE st_refresh_worker, st_refresh_tenant")


def test_status_shows_the_refresh(dsn, conn):
    helpers.create_chunks(conn)
    helpers.insert_chunks(conn, [("a", 1, "notes about a", None)])
    helpers.attach_chunks(conn, embedding=False)
    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
    assert _refresh(conn) == [("a", "clean", True)]
    out = subprocess.run([sys.executable, "-m", "storetopics.cli", "--dsn", dsn, "status"], capture_output=True,
                         text=True, cwd=str(REPO), timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "storetopics.refresh()" in x)
    assert line.split()[1:2] == ["no"] and line.split()[-4:] == ["1", "1", "0", "0"], line   # alive no; 1 pass


@pytest.mark.skipif(not harness.pg_cron_installed(), reason="pg_cron is not installed (make setup installs "
                    "postgresql-15-cron)")
def test_a_pg_cron_job_runs_the_refresh():
    with harness.cluster(harness.pg_cron_settings("app")) as pg:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute("CREATE DATABASE app")    # (pg_cron's launcher retries until it exists)
        dsn = pg.dsn("app")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET client_min_messages = warning")
            for ext in ("vector", "plpython3u", "pg_cron"):
                conn.execute(f"CREATE EXTENSION {ext}")
            st_install.install(dsn, extension=True, log=lambda *a: None)
            # one table refreshed at once, one whose debounce has not passed
            helpers.create_chunks(conn)
            stores = {"games": {"chess": "chess opening gambit endgame bishop knight checkmate rook",
                                "go": "go stones territory komi ladder joseki liberties board"},
                      "kitchen": {"bread": "sourdough bread starter flour dough oven crust rise",
                                  "pasta": "pasta tomato sauce garlic basil noodles boil parmesan"}}
            helpers.insert_chunks(conn, helpers.topical_rows(stores, files=6, chunks=2))
            helpers.attach_chunks(conn)
            conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
            helpers.create_chunks(conn, "later")
            helpers.insert_chunks(conn, [("attic", 1, "boxes of old letters in the attic", None)], "later")
            helpers.attach_chunks(conn, "later", embedding=False)
            conn.execute("SELECT storetopics.configure('later', '{\"debounce\": 300}')")

            job = conn.execute(RECIPE).fetchone()[0]
            deadline = time.monotonic() + 100     # the next minute, and the run
            while True:
                run = conn.execute("SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s "
                                   "AND status IN ('succeeded', 'failed') ORDER BY runid LIMIT 1", (job,)).fetchone()
                if run or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert run == ("succeeded", "2 rows"), run    # the two stores of chunks
            assert set(_rendered(conn)) == {"games", "kitchen"}
            clusters = dict(conn.execute("SELECT store_key, count(*) FROM storetopics.clusters WHERE chunks > 0 "
                                         "GROUP BY 1"))
            assert set(clusters) == {"games", "kitchen"} and min(clusters.values()) >= 2, clusters
            assert conn.execute("SELECT why FROM storetopics.work_due() WHERE source = 'later'::regclass"
                                ).fetchone() == ("debounce",)
            assert _refresher(conn)[:3] == (2, 2, 0)

            out = subprocess.run([sys.executable, "-m", "storetopics.cli", "--dsn", dsn, "status"],
                                 capture_output=True, text=True, cwd=str(REPO), timeout=60)
            assert out.returncode == 0, out.stderr
            assert "Scheduled refresh (pg_cron: storetopics.refresh())" in out.stdout, out.stdout
            line = next(x for x in out.stdout.splitlines() if "storetopics-refresh" in x)
            assert "* * * * *" in line and "succeeded" in line and "2 rows" in line, line
            conn.execute("SELECT cron.unschedule(%s)", (job,))
