"""Concurrency: many application writers on the same store while fold() and backfill() run; no deadlock, no lost
change, and the result is exact."""
from __future__ import annotations

import random
import threading
import time

import psycopg

from tests import helpers

WORDS = ["kitchen", "renovation", "tiles", "plumbing", "bathroom", "garden", "fence", "roof", "paint", "floor",
         "the", "and", "running", "runs"]
WRITERS = 8
SECONDS = 4.0


def _connect(dsn: str) -> psycopg.Connection:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("SET client_min_messages = warning")
    c.execute("SET lock_timeout = '60s'")  # a hang becomes an error instead of a stuck test
    return c


def _text(rnd: random.Random) -> str:
    return " ".join(rnd.choices(WORDS, k=rnd.randint(1, 12)))


def _writer(dsn: str, i: int, stop: threading.Event, errors: list, ops: list) -> None:
    """Writer i owns files i*100 .. i*100+9; writers 0-5 write store 'shared', 6-7 their own store; every writer
    moves its files to and from store 'other' now and then."""
    rnd = random.Random(i)
    home = "shared" if i < 6 else f"own{i}"
    files = [i * 100 + k for k in range(10)]
    n = 0
    try:
        with _connect(dsn) as c:
            while not stop.is_set():
                op = rnd.random()
                f = rnd.choice(files)
                if op < 0.35:
                    rows = [(home, rnd.choice(files), _text(rnd)) for _ in range(rnd.randint(1, 6))]
                    if rnd.random() < 0.1:
                        rows.append((home, None, _text(rnd)))       # a row without a file key
                    c.execute("INSERT INTO chunks (store_id, file_id, content) VALUES "
                              + ", ".join(["(%s, %s, %s)"] * len(rows)), [v for r in rows for v in r])
                elif op < 0.5:
                    c.execute("UPDATE chunks SET content = %s WHERE file_id = %s AND id %% 2 = %s",
                              (_text(rnd), f, rnd.randint(0, 1)))
                elif op < 0.6:
                    c.execute("DELETE FROM chunks WHERE file_id = %s AND id %% 3 = %s", (f, rnd.randint(0, 2)))
                elif op < 0.65:
                    c.execute("DELETE FROM chunks WHERE file_id = %s", (f,))
                elif op < 0.72:
                    c.execute("UPDATE chunks SET store_id = %s WHERE file_id = %s",
                              (rnd.choice([home, "other"]), f))
                elif op < 0.77:
                    c.execute("UPDATE chunks SET file_id = %s WHERE file_id = %s", (rnd.choice(files), f))
                elif op < 0.8:
                    c.execute("DELETE FROM chunks WHERE file_id IS NULL AND store_id = %s AND id %% 2 = 0", (home,))
                else:
                    # a transaction of several statements, committed or rolled back
                    commit = rnd.random() < 0.6
                    try:
                        with c.transaction():
                            c.execute("INSERT INTO chunks (store_id, file_id, content) VALUES (%s, %s, %s), "
                                      "(%s, %s, %s)", (home, f, _text(rnd), home, rnd.choice(files), _text(rnd)))
                            time.sleep(rnd.random() * 0.01)
                            c.execute("UPDATE chunks SET content = %s WHERE file_id = %s AND id %% 5 = 0",
                                      (_text(rnd), f))
                            c.execute("DELETE FROM chunks WHERE file_id = %s AND id %% 7 = 0", (rnd.choice(files),))
                            if not commit:
                                raise _Rollback
                    except _Rollback:
                        pass
                n += 1
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append((f"writer {i}", e))
    ops.append(n)


class _Rollback(Exception):
    pass


def _folder(dsn: str, src: int, stop: threading.Event, errors: list, calls: list, backfill: bool) -> None:
    rnd = random.Random(99 + backfill)
    n = 0
    try:
        with _connect(dsn) as c:
            while not stop.is_set():
                if backfill:
                    # backfill() folds until nothing is pending, holding the source lock: under a steady stream of
                    # writes that takes a while, so it runs now and then, not in a tight loop
                    helpers.backfill(c)
                    stop.wait(0.3)
                else:
                    c.execute("SELECT storetopics._fold(%s, %s)", (src, rnd.choice([1, 3, 10, 20000])))
                n += 1
                progress["backfill" if backfill else "fold"] = n
    except Exception as e:  # noqa: BLE001
        errors.append(("backfill" if backfill else "fold", e))
    calls.append(n)


progress: dict = {}


def test_writers_and_fold_concurrently(dsn, conn):
    helpers.create_chunks(conn)
    conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                    SELECT CASE WHEN g % 8 < 6 THEN 'shared' ELSE 'own' || (g % 8) END, (g % 8) * 100 + g % 10,
                           'kitchen renovation tiles ' || g FROM generate_series(1, 400) g""")
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)

    stop = threading.Event()
    errors: list = []
    ops: list = []
    folds: list = []
    threads = [threading.Thread(target=_writer, args=(dsn, i, stop, errors, ops)) for i in range(WRITERS)]
    threads.append(threading.Thread(target=_folder, args=(dsn, src, stop, errors, folds, False)))
    threads.append(threading.Thread(target=_folder, args=(dsn, src, stop, errors, folds, True)))
    progress.clear()
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    # The point is folds interleaved with writes, not speed: on a loaded machine let the writers go on until the
    # folder and the backfiller have each run a few times (bounded).
    deadline = time.monotonic() + 90
    while (progress.get("fold", 0) < 5 or progress.get("backfill", 0) < 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert [t.name for t in threads if t.is_alive()] == []
    print("writer statements", ops, "fold/backfill calls", folds)
    assert errors == []
    assert len(ops) == WRITERS and min(ops) > 10, ops
    assert len(folds) == 2 and min(folds) >= 2 and max(folds) >= 5, folds

    helpers.backfill(conn)
    expected = helpers.recount(conn, src)
    assert helpers.state(conn, src) == expected
    assert set(expected["stores"]) >= {"shared", "own6", "own7"}
    assert helpers.pending(conn, src) == []


def test_open_writer_transaction_is_counted_after_the_next_fold(dsn, conn):
    helpers.create_chunks(conn)
    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 1, 'kitchen renovation'), "
                 "('s', 7, 'garden fence')")
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    before = helpers.state(conn, src)

    with _connect(dsn) as writer, _connect(dsn) as other:
        writer.execute("BEGIN")
        writer.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 7, 'roof tiles roof'), "
                       "('s', 8, 'paint the floor')")
        writer.execute("UPDATE chunks SET content = 'garden fence paint' WHERE content = 'garden fence'")
        # a committed change to the same file, folded while the writer's transaction is still open
        other.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 7, 'plumbing')")
        assert conn.execute("SELECT storetopics._fold(%s)", (src,)).fetchone()[0] == 1
        helpers.backfill(conn)
        mid = helpers.state(conn, src)
        assert mid == helpers.recount(conn, src)
        assert mid["stores"] == {"s": (2, 3, 5, 0)}
        assert mid != before
        assert conn.execute("SELECT dirty FROM storetopics.stores WHERE source_id = %s", (src,)).fetchone()[0] \
            is False
        writer.execute("COMMIT")

    assert conn.execute("SELECT dirty FROM storetopics.stores WHERE source_id = %s", (src,)).fetchone()[0] is True
    assert conn.execute("SELECT storetopics._fold(%s)", (src,)).fetchone()[0] == 2
    helpers.backfill(conn)
    after = helpers.state(conn, src)
    assert after == helpers.recount(conn, src)
    # file 1: kitchen renovation; file 7: 'garden fence paint', 'roof tiles roof', 'plumbing'; file 8: paint floor
    assert after["stores"] == {"s": (3, 5, 11, 0)}
    assert after["terms"][("s", "roof")] == (1, 2, 4)
    assert after["terms"][("s", "paint")] == (2, 2, 2)
    assert "roof" in helpers.summary(conn, src, "s")[0]


def test_fold_waits_for_nothing_but_the_source_lock(dsn, conn):
    """A writer holding row locks on the chunk table and a pending insert does not block fold, and fold (holding
    the source lock in an open transaction) does not block writers."""
    helpers.create_chunks(conn)
    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 1, 'kitchen renovation')")
    src = helpers.attach_chunks(conn)
    helpers.backfill(conn)
    with _connect(dsn) as writer, _connect(dsn) as folder:
        writer.execute("SET lock_timeout = '2s'")
        folder.execute("SET lock_timeout = '2s'")
        conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 1, 'tiles')")
        writer.execute("BEGIN")
        writer.execute("UPDATE chunks SET content = 'garden fence' WHERE content = 'kitchen renovation'")
        folder.execute("BEGIN")
        # recounts file 1 whose row the writer has locked; would raise LockNotAvailable if it waited
        assert folder.execute("SELECT storetopics._fold(%s)", (src,)).fetchone()[0] == 1
        writer.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 2, 'roof')")
        writer.execute("COMMIT")
        writer.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('s', 3, 'paint')")
        folder.execute("COMMIT")
    helpers.backfill(conn)
    assert helpers.state(conn, src) == helpers.recount(conn, src)
    assert helpers.state(conn, src)["stores"] == {"s": (3, 4, 5, 0)}
