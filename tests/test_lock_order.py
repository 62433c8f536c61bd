"""A fold of a source and a render of one of its stores, at once (two workers holding two stores of one source: each
pass folds its source first): they take the store's rows in one order, so neither waits for the other in a cycle."""
from __future__ import annotations

import random
import threading
import time

import psycopg

from tests.test_novelty import file_rows, insert


def _waiting(conn, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        (pid,)).fetchone()[0] or False


def _until(cond, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_a_fold_and_a_render_of_the_same_store_at_once_do_not_deadlock(make_db):
    rng = random.Random(5)
    dsn = make_db(plpython=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("CREATE TABLE chunks (id serial PRIMARY KEY, store_id text, file_id int, content text, "
                     "embedding vector(8))")
        insert(conn, [r for f in range(300) for r in file_rows(rng, "a", f)])
        src = conn.execute("SELECT storetopics.attach('chunks', 'store_id', 'file_id', 'content', "
                           "'embedding')").fetchone()[0]
        conn.execute("SELECT * FROM storetopics.backfill()")
        # folded, not rendered since (the clusters' words are due), and more not folded yet
        insert(conn, [r for f in range(300, 330) for r in file_rows(rng, "a", f)])
        while conn.execute("SELECT storetopics._fold(%s)", (src,)).fetchone()[0]:
            pass
        insert(conn, [r for f in range(330, 360) for r in file_rows(rng, "a", f)])
        results: dict[str, object] = {}

        def run(name: str, sql: str, args: tuple) -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SET client_min_messages = warning")
                results[name + "_pid"] = c.info.backend_pid
                try:
                    results[name] = c.execute(sql, args).fetchone()[0]
                except psycopg.Error as e:
                    results[name] = e

        # a third session holds the store's cluster rows, so that the fold stops where it writes them, and the
        # render (started next) reaches them too; then lets go
        with psycopg.connect(dsn) as holder:
            holder.execute("SELECT 1 FROM storetopics.clusters WHERE source_id = %s AND store_key = 'a' FOR UPDATE",
                           (src,))
            fold = threading.Thread(target=run, args=("fold", "SELECT storetopics._fold(%s)", (src,)))
            fold.start()
            _until(lambda: "fold_pid" in results and _waiting(conn, results["fold_pid"]))
            render = threading.Thread(target=run, args=("render", "SELECT storetopics._render(%s, 'a')", (src,)))
            render.start()
            _until(lambda: "render_pid" in results and _waiting(conn, results["render_pid"]))
            holder.rollback()
        fold.join(60)
        render.join(60)
        assert not isinstance(results.get("fold"), Exception), results.get("fold")
        assert not isinstance(results.get("render"), Exception), results.get("render")
        assert conn.execute("SELECT files FROM storetopics.store_state WHERE source_id = %s AND store_key = 'a'",
                            (src,)).fetchone()[0] == 360
