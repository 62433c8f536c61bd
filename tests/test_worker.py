"""Issue 4: the worker (`storetopics worker`), tested as real processes against a real Postgres: debounce (a burst of
50 uploads gives one regeneration; a continuous stream is bounded by max_staleness), leases (two and four workers
over 50 stores: one worker per store at a time, the work divides), kill -9 at random points while writers keep
writing (summaries equal a clean run over the same final data, no dirty store lost, no labelling call repeated
except by retry), a Postgres restart under a running worker, an LLM outage (old topics stay, the store shows
`failing`, then recovers by itself), SIGTERM (the lease is given back) and --once."""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
import psycopg
import pytest

from lab.localpg import LocalPostgres
from storetopics import install as st_install
from tests.fakes.messages import MessagesServer

DIM = 16
WORDS = {
    "kitchen": "kitchen tile renovation plumbing cabinet countertop faucet grout",
    "football": "football club match league goal striker stadium referee",
    "guitar": "guitar chord melody song rhythm amplifier strings fretboard",
    "garden": "garden tomato compost seedling mulch pruning orchard harvest",
    "astronomy": "telescope galaxy nebula orbit planet comet eclipse observatory",
    "chess": "chess opening gambit endgame bishop knight checkmate rook",
}
_rng = np.random.default_rng(11)
CENTERS = {t: (lambda v: v / np.linalg.norm(v))(_rng.normal(size=DIM)) for t in WORDS}


def text_for(topic: str, rng, n: int = 30) -> str:
    return " ".join(rng.choice(WORDS[topic].split(), n))


def vec_for(topic: str, rng, spread: float = 0.05) -> str:
    v = CENTERS[topic] + rng.normal(scale=spread, size=DIM)
    return "[" + ",".join(f"{x:.5f}" for x in v) + "]"


def connect(dsn: str) -> psycopg.Connection:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("SET client_min_messages = warning")
    return c


# ------------------------------------------------------------------------------------------------------------
# Worker processes
# ------------------------------------------------------------------------------------------------------------
class WorkerProc:
    """`storetopics worker` as a subprocess, its log in a file."""

    def __init__(self, dsn: str, *args: str, env: dict | None = None, logdir: Path, name: str = "w"):
        self.log_path = logdir / f"{name}-{time.monotonic_ns()}.log"
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "-v", "--id", name, *args],
            stdout=self.log_file, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))

    def log(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def term(self, timeout: float = 20) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.term(20)
        if self.proc.poll() is None:
            self.kill9()
        self.log_file.close()


@pytest.fixture
def workers(tmp_path):
    made: list[WorkerProc] = []

    def start(dsn, *args, env=None, name="w"):
        w = WorkerProc(dsn, *args, env=env, logdir=tmp_path, name=name)
        made.append(w)
        return w

    yield start
    for w in made:
        w.stop()


def wait_for(cond, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def quiescent(conn) -> bool:
    """Nothing logged, nothing to render, no store dirty or leased."""
    return conn.execute(
        """SELECT NOT EXISTS (SELECT 1 FROM storetopics.pending)
              AND NOT EXISTS (SELECT 1 FROM storetopics.work_status() WHERE state <> 'idle')
              AND NOT EXISTS (SELECT 1 FROM storetopics.store_state st WHERE storetopics._render_due(st))"""
    ).fetchone()[0]


def work(conn, store: str):
    return conn.execute("SELECT processed, regenerated, state FROM storetopics.work_status() WHERE store_key = %s",
                        (store,)).fetchone()


def summaries(conn) -> dict:
    out = {}
    for key, text, topics in conn.execute(
            "SELECT store_key, store_topics, topics FROM storetopics.stores ORDER BY source_id, store_key"):
        t = dict(topics)
        for c in t.get("clusters") or []:
            c.pop("id", None)          # identity numbers depend on the order stores were fitted in
        if t.get("fit"):
            t["fit"] = {k: v for k, v in t["fit"].items() if k != "at"}
        if t.get("cost"):
            # the ledger is history: a prompt carries what the other clusters and stores were about when the call
            # was made, so its length (and price) depends on when; the calls and the answers do not
            t["cost"] = {k: v for k, v in t["cost"].items() if k not in ("input_tokens", "usd")}
        out[key] = (text, t)
    return out


def state(conn) -> dict:
    """What the worker keeps per store, comparable between databases: counters, term statistics (by lexeme) and
    clusters (sizes, words, labels)."""
    out = {}
    for key, files, chunks, words in conn.execute(
            "SELECT store_key, files, chunks, words FROM storetopics.store_state ORDER BY source_id, store_key"):
        terms = dict((lx, (f, t, q)) for lx, f, t, q in conn.execute(
            """SELECT l.lexeme, t.files, t.total, t.total_sq FROM storetopics.store_terms t
                 JOIN storetopics.lexemes l ON l.id = t.term_id WHERE t.store_key = %s""", (key,)))
        clusters = sorted(tuple(r) for r in conn.execute(
            """SELECT chunks, files, outliers, keywords, coalesce(label, '') FROM storetopics.clusters
                 WHERE store_key = %s AND chunks > 0""", (key,)))
        out[key] = (files, chunks, words, terms, clusters)
    return out


def docs_table(conn, name: str = "docs", embedding: bool = False):
    emb = f", emb vector({DIM})" if embedding else ""
    conn.execute(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, store text, file text, content text{emb})")
    conn.execute(f"CREATE INDEX ON {name} (file)")
    return conn.execute("SELECT storetopics.attach(%s, 'store', 'file', 'content'" + (", 'emb')" if embedding else ")"),
                        (name,)).fetchone()[0]


def configure(conn, table: str, **settings):
    conn.execute("SELECT storetopics.configure(%s, %s)", (table, json.dumps(settings)))


FAST = ("--lease", "2", "--poll", "0.3")


# ------------------------------------------------------------------------------------------------------------
# Debounce and staleness
# ------------------------------------------------------------------------------------------------------------
def test_burst_of_50_uploads_gives_one_regeneration_and_a_stream_is_bounded_by_max_staleness(dsn, workers):
    with connect(dsn) as conn:
        docs_table(conn)
        configure(conn, "docs", debounce=1.5, max_staleness=2.5)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('s', 'f0', 'kitchen tiles and grout')")
        w = workers(dsn, *FAST)
        wait_for(lambda: work(conn, "s") and work(conn, "s")[:2] == (1, 1) and quiescent(conn), 30, "first pass")
        listener = connect(dsn)
        listener.execute("LISTEN storetopics_updated")

        # 50 uploads, one transaction each, faster than the debounce: one pass, one new summary, one NOTIFY.
        rng = random.Random(1)
        for i in range(50):
            conn.execute("INSERT INTO docs (store, file, content) VALUES ('s', %s, %s)",
                         (f"up{i}", " ".join(rng.choice(WORDS["garden"].split()) for _ in range(20))))
        wait_for(lambda: work(conn, "s")[:2] == (2, 2) and quiescent(conn), 30, "the burst's pass")
        time.sleep(2)  # nothing more comes
        assert work(conn, "s") == (2, 2, "idle")
        assert conn.execute("SELECT files FROM storetopics.stores WHERE store_key = 's'").fetchone()[0] == 51
        notes = [n.payload for n in listener.notifies(timeout=0.5)]
        assert notes.count(f"{conn.execute('SELECT id FROM storetopics.sources').fetchone()[0]}:s") == 1, notes

        # A continuous stream (a write every 0.4 s, never quiet for 1.5 s): max_staleness (2.5 s) still refreshes it.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 6:
            conn.execute("INSERT INTO docs (store, file, content) VALUES ('s', %s, 'football match')",
                         (f"st{time.monotonic_ns()}",))
            time.sleep(0.4)
        during = work(conn, "s")[0] - 2
        assert 1 <= during <= 3, during   # refreshed by staleness (every ~2.5 s), not per write
        listener.close()
        assert w.term() == 0


def pass_over(conn, worker: str = "w") -> tuple[int, str] | None:
    """One worker pass by hand: claim a due store, fold its source, render it, hand it back."""
    row = conn.execute("SELECT source_id, store_key, generation FROM storetopics._claim(%s)", (worker,)).fetchone()
    if row is None:
        return None
    source, store, generation = row
    while conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]:
        pass
    conn.execute("SELECT storetopics._work_render(%s, %s, %s)", (worker, source, store))
    assert conn.execute("SELECT storetopics._work_done(%s, %s, %s, %s, true)",
                        (worker, source, store, generation)).fetchone()[0] == "clean"
    return source, store


def test_a_store_folded_by_another_store_s_pass_waits_one_debounce_not_two(dsn):
    """A new store on an attached table, written in the same burst as a store already there: the first store's pass
    folds the whole source, so the new store's rows are folded then and it is due for its render.  Its debounce
    counts from its last logged change, not from that fold (was: a second full debounce from the fold, issue 31)."""
    with connect(dsn) as conn:
        docs_table(conn)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('attic', 'a1', 'boxes lamps dust')")
        conn.execute("SELECT * FROM storetopics.backfill()")
        configure(conn, "docs", debounce=2, max_staleness=600)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('attic', 'a2', 'boxes trunks'), "
                     "('kitchen', 'k1', 'pots pans knives')")
        assert pass_over(conn) is None                                   # seen, quiet for less than 2 s
        time.sleep(2.3)
        assert pass_over(conn)[1] == "attic"                             # folds kitchen's rows too
        due = conn.execute("SELECT due_at <= now() FROM storetopics.work_status() WHERE store_key = 'kitchen'"
                           ).fetchone()[0]
        assert due and pass_over(conn)[1] == "kitchen"                   # due now: its rows are 2.3 s quiet
        assert quiescent(conn)


def test_worker_once_says_what_waits_and_when_and_now_does_it(dsn, capsys):
    """`worker --once` right after an attach and new rows does nothing (the debounce): it says so, store by store,
    with when each is due and why, and how to do it now; `--now` does it.  `status` shows why too (issue 31)."""
    from storetopics import cli
    with connect(dsn) as conn:
        docs_table(conn)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('attic', 'a1', 'boxes lamps dust'), "
                     "('kitchen', 'k1', 'pots pans knives')")
        once = lambda *args: subprocess.run(  # noqa: E731
            [sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "--once", *args], capture_output=True,
            text=True, timeout=120)
        r = once()
        assert r.returncode == 0, r.stderr
        assert "0 passes" in r.stderr and "Traceback" not in r.stderr
        waiting = [line for line in r.stderr.splitlines() if "left for a later run" in line or "due in" in line]
        text = "\n".join(waiting)
        for what in ("docs:attic", "docs:kitchen", "docs (changes that name no store"):
            assert re.search(re.escape(what) + r".*due in (59|60)s \(debounce 60s\)", text), r.stderr
        assert "--now" in r.stderr and "storetopics backfill" in r.stderr, r.stderr
        assert conn.execute("SELECT count(*) FROM storetopics.stores WHERE store_topics IS NOT NULL").fetchone()[0] \
            == 0

        assert cli.main(["--dsn", dsn, "status"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"^\s+attic\s+dirty\s.*\sdebounce\s", out, re.M), out

        r = once("--now")
        assert r.returncode == 0, r.stderr
        assert "2 passes" in r.stderr and "left for a later run" not in r.stderr, r.stderr
        assert quiescent(conn)
        # nothing dirty: a worker sleeps its --poll, or until a NOTIFY (was 0 s: an idle worker polled every 50 ms)
        assert conn.execute("SELECT storetopics._next_due()").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM storetopics.stores WHERE store_topics IS NOT NULL").fetchone()[0] \
            == 2

        # why a store waits: the debounce, max_staleness under a steady stream, or the backoff of a failed pass
        configure(conn, "docs", debounce=3600, max_staleness=1800)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('attic', 'a2', 'trunks')")
        conn.execute("SELECT * FROM storetopics._claim('nobody', 60, 0)")      # the worker's look at the log
        attic = "SELECT why, due_at > now() + interval '1790 s' FROM storetopics.work_due() WHERE store_key = 'attic'"
        assert conn.execute(attic).fetchall() == [("max_staleness", True)]
        conn.execute("UPDATE storetopics.work SET next_attempt_at = now() + interval '2 hours', attempts = 1 "
                     "WHERE store_key = 'attic'")
        assert conn.execute(attic).fetchall() == [("backoff", True)]
        conn.execute("SELECT storetopics.pause('docs')")
        assert conn.execute(attic).fetchall() == [("paused", None)]


# ------------------------------------------------------------------------------------------------------------
# Leases: 2 and 4 workers over 50 stores
# ------------------------------------------------------------------------------------------------------------
LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) storetopics worker (\S+): (claim|release) (\d+):(\S+)")


def pass_intervals(logs: list[str]) -> dict[str, list[tuple[float, float, str]]]:
    out: dict[str, list] = {}
    for log in logs:
        open_: dict[str, tuple[float, str]] = {}
        for line in log.splitlines():
            m = LINE.match(line)
            if not m:
                continue
            h, mi, s, ms, who, what, _src, store = m.groups()
            t = int(h) * 3600 + int(mi) * 60 + int(s) + int(ms) / 1000
            if what == "claim":
                open_[store] = (t, who)
            elif store in open_:
                start, who = open_.pop(store)
                out.setdefault(store, []).append((start, t, who))
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_many_workers_share_50_stores_one_worker_per_store_at_a_time(dsn, workers, n):
    with connect(dsn) as conn:
        docs_table(conn)
        configure(conn, "docs", debounce=0.5)
        # a lease long enough that a busy machine's scheduling does not expire it (nobody crashes here; takeovers
        # after a crash are tested below)
        procs = [workers(dsn, "--lease", "6", "--poll", "0.3", name=f"w{i}") for i in range(n)]
        wait_for(lambda: conn.execute("SELECT count(*) FROM storetopics.worker_status() WHERE alive").fetchone()[0]
                 == n, 30, "workers up")
        for rnd in range(2):   # two rounds of changes to every store
            with conn.transaction():
                for s in range(50):
                    topic = list(WORDS)[(s + rnd) % len(WORDS)]
                    conn.execute("INSERT INTO docs (store, file, content) SELECT %s, %s || g, %s "
                                 "FROM generate_series(1, 5) g", (f"s{s:02d}", f"r{rnd}-", WORDS[topic]))
            wait_for(lambda: conn.execute("SELECT count(*) FROM storetopics.work_status() WHERE processed > %s",
                                          (rnd,)).fetchone()[0] == 50 and quiescent(conn), 90, f"round {rnd}")
        assert conn.execute("SELECT sum(failures) FROM storetopics.worker_status()").fetchone()[0] == 0
        per_worker = dict(conn.execute("SELECT id, processed FROM storetopics.worker_status()").fetchall())
        passes = conn.execute("SELECT sum(processed) FROM storetopics.work_status()").fetchone()[0]
        assert sum(per_worker.values()) == passes >= 100
        assert len(per_worker) == n and min(per_worker.values()) >= passes / n / 4, per_worker   # the work divides
        assert conn.execute("SELECT count(*) FROM storetopics.stores WHERE files = 10").fetchone()[0] == 50
        for p in procs:
            assert p.term() == 0
        # one worker per store at a time: no two passes over a store overlap
        intervals = pass_intervals([p.log() for p in procs])
        # every logged claim..release is a counted pass, or one whose lease ran out under load (2 s here) and was
        # taken over: before its render (it writes nothing and says so) or after it (work_done finds the lease gone,
        # outcome None): either way it is not counted
        lost = sum(p.log().count(": lease lost (another worker has it)") +
                   len(re.findall(r": pass \d+:\S+: .*, None \(", p.log())) for p in procs)
        assert sum(len(v) for v in intervals.values()) == passes + lost
        for store, iv in intervals.items():
            iv.sort()
            for (s1, e1, w1), (s2, e2, w2) in zip(iv, iv[1:]):
                assert s2 >= e1, (store, (s1, e1, w1), (s2, e2, w2))
        assert conn.execute("SELECT count(*) FROM storetopics.worker_status() WHERE stopped_at IS NOT NULL"
                            ).fetchone()[0] == n


# ------------------------------------------------------------------------------------------------------------
# kill -9 twenty times while writers write
# ------------------------------------------------------------------------------------------------------------
class Writers(threading.Thread):
    """Keeps changing the stores: keyword-only source `docs` (inserts, updates, deletes, files moving between
    stores) and source `emb` (embeddings, LLM labels: whole new stores appear in one transaction, some vanish)."""

    def __init__(self, dsn: str, seed: int = 3):
        super().__init__(daemon=True)
        self.dsn, self.rng, self.stop = dsn, random.Random(seed), threading.Event()
        self.writes, self.emb_stores, self.error = 0, 0, None

    def emb_store(self, conn, key: str):
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        topics = self.rng.sample(list(WORDS), 3)
        rows = [(key, f"{key}-{t}-{f}", text_for(t, rng), vec_for(t, rng)) for t in topics for f in range(6)
                for _ in range(2)]
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany("INSERT INTO emb (store, file, content, emb) VALUES (%s, %s, %s, %s)", rows)

    def run(self):
        try:
            with connect(self.dsn) as conn:
                n = 0
                while not self.stop.is_set():
                    r, n = self.rng.random(), n + 1
                    store = f"a{self.rng.randrange(6)}"
                    topic = self.rng.choice(list(WORDS))
                    if r < 0.45:
                        conn.execute("INSERT INTO docs (store, file, content) SELECT %s, %s, %s || ' ' || g "
                                     "FROM generate_series(1, 3) g", (store, f"f{n}", WORDS[topic]))
                    elif r < 0.6:
                        conn.execute("UPDATE docs SET content = %s WHERE id = (SELECT id FROM docs ORDER BY "
                                     "random() LIMIT 1)", (WORDS[topic] + " revised",))
                    elif r < 0.72:
                        conn.execute("DELETE FROM docs WHERE file = (SELECT file FROM docs ORDER BY random() "
                                     "LIMIT 1)")
                    elif r < 0.8:
                        conn.execute("UPDATE docs SET store = %s WHERE file = (SELECT file FROM docs ORDER BY "
                                     "random() LIMIT 1)", (store,))
                    elif r < 0.84:
                        self.emb_stores += 1
                        self.emb_store(conn, f"b{self.emb_stores:03d}")
                    elif r < 0.86 and self.emb_stores > 3:
                        conn.execute("DELETE FROM emb WHERE store = (SELECT store FROM emb ORDER BY random() "
                                     "LIMIT 1)")
                    self.writes += 1
                    time.sleep(self.rng.uniform(0.02, 0.25))
        except Exception as e:  # surfaced by the test
            self.error = e


def setup_chaos_tables(conn):
    docs_table(conn)
    docs_table(conn, "emb", embedding=True)
    configure(conn, "docs", debounce=0.3, max_staleness=3)
    configure(conn, "emb", debounce=0.3, max_staleness=3, labeller="anthropic", k_min=2, k_max=4, min_vectors=12)


def test_kill_9_twenty_times_while_writers_write(make_db, workers):
    dsn = make_db()
    with MessagesServer() as server, connect(dsn) as conn:
        env = {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test-key"}
        for _ in range(2000):           # slow answers: kills land mid-call too
            server.plan("delay", seconds=0.4)
        setup_chaos_tables(conn)
        writers = Writers(dsn)
        writers.start()
        rng = random.Random(7)
        in_flight = 0                   # kills that landed while a labelling call was in flight
        last_steps = []
        for i in range(20):
            w = workers(dsn, "--lease", "1.5", "--poll", "0.2", env=env, name=f"k{i}")
            # short lives land mostly in start-up, folds and fits; longer ones let fits finish and labels start
            time.sleep(rng.uniform(0.6, 2.0) if i % 2 else rng.uniform(2.0, 5.0))
            w.kill9()
            log = [ln for ln in w.log().splitlines() if " storetopics worker " in ln]
            calls = [ln for ln in log if re.search(r": label (call|done) ", ln)]
            if calls and " label call " in calls[-1]:
                in_flight += 1
            last_steps.append(log[-1].split(": ", 1)[1].split(" ")[0] if log else "(starting)")
        writers.stop.set()
        writers.join(30)
        assert writers.error is None, writers.error
        assert writers.writes > 100 and writers.emb_stores >= 2, (writers.writes, writers.emb_stores)
        # the kills did land inside passes (claimed, not yet released), not only between them
        assert sum(step in ("claim", "label", "fit") for step in last_steps) >= 3, last_steps

        # A worker that is left alone catches up: nothing stays dirty.
        final = workers(dsn, "--lease", "1.5", "--poll", "0.2", env=env, name="final")
        wait_for(lambda: quiescent(conn), 120, "the final worker to catch up", interval=0.3)
        assert final.term() == 0
        assert conn.execute("SELECT count(*) FROM storetopics.stores s WHERE s.dirty").fetchone()[0] == 0
        chaos_state = state(conn)
        assert any(k.startswith("b") for k in chaos_state) and any(k.startswith("a") for k in chaos_state)

        # No labelling call was repeated, except one in flight when its worker was killed.
        prompts = [json.dumps(r.get("messages"), sort_keys=True) for r in server.requests]
        repeats = len(prompts) - len(set(prompts))
        assert repeats <= in_flight, (repeats, in_flight)
        assert conn.execute("""SELECT count(*) FROM (SELECT store_key, cluster_id FROM storetopics.label_ledger
                                 WHERE outcome = 'ok' GROUP BY 1, 2 HAVING count(*) > 1) x""").fetchone()[0] == 0
        assert server.requests, "the labeller was used"
        docs_rows = conn.execute("SELECT id, store, file, content FROM docs ORDER BY id").fetchall()
        emb_rows = conn.execute("SELECT id, store, file, content, emb::text FROM emb ORDER BY id").fetchall()

        # A clean run over the same final data: a fresh database, the same rows, one worker --once.
        clean_dsn = make_db()
        with connect(clean_dsn) as clean:
            setup_chaos_tables(clean)
            configure(clean, "docs", debounce=0)
            configure(clean, "emb", debounce=0)
            with clean.cursor() as cur:
                cur.executemany("INSERT INTO docs (id, store, file, content) VALUES (%s, %s, %s, %s)", docs_rows)
                cur.executemany("INSERT INTO emb (id, store, file, content, emb) VALUES (%s, %s, %s, %s, %s)",
                                emb_rows)
            # Surface words ("renovation" for the stem "renov") are a cache learnt once per stem from the texts
            # there were at the time (storetopics.term_words, store_words): history, not state.  The clean run
            # starts from the same cache, so what is compared is what the counts and clusters make of the final data.
            with clean.cursor() as cur:
                cur.executemany("INSERT INTO storetopics.term_words (owner, ts_config, lexeme, word, residue, "
                                "source_id, store_key) VALUES (%s, %s, %s, %s, %s, "
                                "(SELECT s.id FROM storetopics.sources s WHERE s.chunks = %s::regclass), %s)",
                                conn.execute("SELECT w.owner, w.ts_config::text, w.lexeme, w.word, w.residue, "
                                             "s.chunks::text, w.store_key FROM storetopics.term_words w "
                                             "LEFT JOIN storetopics.sources s ON s.id = w.source_id").fetchall())
                # and what each store was found to write instead (storetopics.store_words), by table name
                cur.executemany("INSERT INTO storetopics.store_words (source_id, store_key, lexeme, word, residue) "
                                "SELECT s.id, %s, %s, %s, %s FROM storetopics.sources s WHERE s.chunks = %s::regclass",
                                conn.execute("SELECT w.store_key, w.lexeme, w.word, w.residue, s.chunks::text "
                                             "FROM storetopics.store_words w "
                                             "JOIN storetopics.sources s ON s.id = w.source_id").fetchall())
            r = subprocess.run([sys.executable, "-m", "storetopics.cli", "--dsn", clean_dsn, "worker", "--once"],
                               env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            assert quiescent(clean)
            # Nothing the writers did was lost: every store's counters, term statistics and clusters (sizes,
            # words, labels) equal the clean run's.
            expected_state = state(clean)
            assert chaos_state.keys() == expected_state.keys()
            for key in expected_state:
                assert chaos_state[key] == expected_state[key], key
            expected = summaries(clean)
        # The summaries too.  A store's main terms are weighed against its sibling stores as they were when it was
        # last rendered (render() reads them; a sibling's change shows at the store's next render), so each store
        # is rendered once more from the final state here, as the clean run rendered it (configure() makes every
        # store's render due, and --once does it).
        configure(conn, "docs", debounce=0)
        configure(conn, "emb", debounce=0)
        r = subprocess.run([sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "--once"],
                           env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert quiescent(conn) and state(conn) == chaos_state
        chaos = summaries(conn)
        assert chaos.keys() == expected.keys()
        for key in expected:
            assert chaos[key] == expected[key], key
        takeovers = conn.execute("SELECT sum(takeovers) FROM storetopics.work").fetchone()[0]
        print(f"\nkill -9: {writers.writes} writes, {writers.emb_stores} stores with clusters; last step before "
              f"each kill: {last_steps}; {in_flight} kills mid-call, {repeats} repeated calls; {takeovers} leases "
              f"taken over; {len(expected)} stores equal to the clean run")


# ------------------------------------------------------------------------------------------------------------
# Postgres restarts under a running worker
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def own_cluster():
    tmp = tempfile.mkdtemp(prefix="storetopics-restart-")
    os.chmod(tmp, 0o755)
    pg = LocalPostgres(Path(tmp) / "data")
    pg.start()
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute("CREATE EXTENSION vector")
        st_install.install(pg.dsn(), extension=True, log=lambda *a: None)
        yield pg
    finally:
        pg.destroy()
        with contextlib.suppress(OSError):
            os.rmdir(tmp)


def test_postgres_restart_under_a_running_worker(own_cluster, workers):
    pg = own_cluster
    dsn = pg.dsn()
    with connect(dsn) as conn:
        docs_table(conn)
        configure(conn, "docs", debounce=0.3)
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('s', 'f1', 'kitchen tiles and grout')")
    # a long poll: after the restart only a NOTIFY (heard because it LISTENs again) wakes it quickly
    w = workers(dsn, "--lease", "2", "--poll", "120")
    with connect(dsn) as conn:
        wait_for(lambda: quiescent(conn) and work(conn, "s")[1] == 1, 30, "first pass")
    pg.stop()
    time.sleep(2)
    pg.start()
    wait_for(lambda: "reconnected" in w.log(), 60, "the worker to reconnect")
    with connect(dsn) as conn:
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('s', 'f2', 'telescope galaxy nebula')")
        t0 = time.monotonic()
        wait_for(lambda: "telescope" in (conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]),
                 20, "the change after the restart")
        assert time.monotonic() - t0 < 20
        assert w.proc.poll() is None
        assert conn.execute("SELECT count(*) FROM storetopics.worker_status() WHERE alive").fetchone()[0] == 1
    assert "lost the database" in w.log()
    assert w.term() == 0


# ------------------------------------------------------------------------------------------------------------
# LLM outage: old topics stay, the store shows failing, then recovers by itself
# ------------------------------------------------------------------------------------------------------------
def emb_rows(topics, files=8, chunks=3, prefix=""):
    rows = []
    for t in topics:
        rng = np.random.default_rng(zlib.crc32(f"{prefix}{t}".encode()))
        rows += [("s", f"{prefix}{t}-{f}", text_for(t, rng), vec_for(t, rng)) for f in range(files)
                 for _ in range(chunks)]
    return rows


def insert_emb(conn, rows):
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany("INSERT INTO docs (store, file, content, emb) VALUES (%s, %s, %s, %s)", rows)


def test_llm_outage_keeps_old_topics_shows_failing_then_recovers(dsn, workers):
    with MessagesServer() as server, connect(dsn) as conn:
        env = {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test-key"}
        docs_table(conn, embedding=True)
        configure(conn, "docs", debounce=0.3, labeller="anthropic", k_min=2, k_max=6)
        insert_emb(conn, emb_rows(["kitchen", "football", "guitar"]))
        w = workers(dsn, *FAST, env=env)
        wait_for(lambda: quiescent(conn) and work(conn, "s")[1] >= 1, 60, "labelled summary")
        before = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
        labels_before = conn.execute("SELECT label FROM storetopics.clusters WHERE chunks > 0 ORDER BY label"
                                     ).fetchall()
        assert labels_before and all(lb[0] and lb[0] in before for lb in labels_before), (labels_before, before)
        calls_before = len(server.requests)

        # The outage: every call fails.  A new theme arrives (outliers -> re-fit -> a new cluster needs a label).
        server.fail_until = time.time() + 3600
        insert_emb(conn, emb_rows(["chess"], files=10, prefix="new-"))
        wait_for(lambda: conn.execute("SELECT max(label_failures) FROM storetopics.clusters").fetchone()[0] == 1,
                 60, "a failed labelling call")
        retry_in = conn.execute("SELECT extract(epoch FROM min(label_retry_at) - now()) FROM storetopics.clusters "
                                "WHERE label_failures > 0").fetchone()[0]
        assert 5 < retry_in <= 30, retry_in         # backoff with jitter: 30 s x [0.5, 1]
        after = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
        # old labels stay in place; the new cluster shows its offline label meanwhile
        assert all(lb in conn.execute("SELECT label FROM storetopics.clusters WHERE chunks > 0").fetchall()
                   for lb in labels_before)
        for old in re.findall(r"([A-Z][a-z]+ [A-Z][a-z]+ [A-Z][a-z]+) \(", before):
            assert old in after, (old, after)
        # each retry comes by itself once its backoff is over (the clock is moved on instead of waited for)
        for failures in (2, 3):
            conn.execute("UPDATE storetopics.clusters SET label_retry_at = now() WHERE label_failures > 0")
            wait_for(lambda: conn.execute("SELECT max(label_failures) FROM storetopics.clusters").fetchone()[0]
                     == failures, 60, f"failure {failures}")
        st = conn.execute("SELECT state, last_error FROM storetopics.work_status() WHERE store_key = 's'").fetchone()
        assert st[0] == "failing" and "500" in st[1], st
        assert len(server.requests) > calls_before

        # The LLM comes back: the next retry labels the cluster and the store recovers by itself.
        server.fail_until = 0
        conn.execute("UPDATE storetopics.clusters SET label_retry_at = now() WHERE label_failures > 0")
        wait_for(lambda: conn.execute("SELECT state FROM storetopics.work_status() WHERE store_key = 's'"
                                      ).fetchone()[0] == "idle" and quiescent(conn), 60, "recovery")
        final = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
        labels = conn.execute("SELECT label FROM storetopics.clusters WHERE chunks > 0").fetchall()
        assert len(labels) == len(labels_before) + 1 and all(lb[0] and lb[0] in final for lb in labels), \
            (labels, final)
        assert conn.execute("SELECT count(*) FROM storetopics.clusters WHERE label_needed AND chunks > 0"
                            ).fetchone()[0] == 0
        assert w.term() == 0


def test_a_labeller_that_cannot_work_is_logged_once_per_pass(dsn):
    """No ANTHROPIC_API_KEY: the pass still folds, fits and renders (offline labels), then says what is wrong in
    one warning (not one per cluster, no SDK TypeError); the store shows the error and backs off like a failed pass
    (issue 31)."""
    with MessagesServer() as server, connect(dsn) as conn:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
        env["ANTHROPIC_BASE_URL"] = server.base_url
        docs_table(conn, embedding=True)
        configure(conn, "docs", debounce=0, labeller="anthropic", k_min=2, k_max=4)
        insert_emb(conn, emb_rows(["kitchen", "astronomy", "chess"]))
        r = subprocess.run([sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "--once"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        said = [line for line in r.stderr.splitlines() if "ANTHROPIC_API_KEY" in line]
        assert len(said) == 1 and "the anthropic labeller" in said[0] and "old labels kept" in said[0], r.stderr
        assert "Traceback" not in r.stderr and "TypeError" not in r.stderr and "labelling call(s) failed" \
            not in r.stderr, r.stderr
        assert not server.requests
        text = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
        assert text and "Topics:" in text, text                    # rendered, with the offline labels
        state, error, due = conn.execute("SELECT state, last_error, next_attempt_at > now() "
                                         "FROM storetopics.work_status()").fetchone()
        assert state == "dirty" and "ANTHROPIC_API_KEY" in error and due, (state, error)
        assert conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0] == 0


# ------------------------------------------------------------------------------------------------------------
# SIGTERM gives the store back; --once; status
# ------------------------------------------------------------------------------------------------------------
def test_sigterm_gives_the_lease_back_and_once_finishes(dsn, workers, capsys):
    with MessagesServer() as server, connect(dsn) as conn:
        env = {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "test-key"}
        docs_table(conn, embedding=True)
        configure(conn, "docs", debounce=0, labeller="anthropic", k_min=2, k_max=4)
        insert_emb(conn, emb_rows(["kitchen", "astronomy"]))
        for _ in range(2):
            server.plan("delay", seconds=2)
        w = workers(dsn, "--lease", "30", "--poll", "0.2", env=env)
        wait_for(lambda: " label call " in w.log(), 60, "a labelling call")
        t0 = time.monotonic()
        assert w.term() == 0
        assert time.monotonic() - t0 < 10
        row = conn.execute("SELECT leased_by, dirty_since IS NOT NULL FROM storetopics.work").fetchone()
        assert row == (None, True)     # given back at once (not after the 30 s lease), still dirty
        assert conn.execute("SELECT stopped_at IS NOT NULL FROM storetopics.worker_status()").fetchone()[0]

        # paused sources are left alone by --once; resumed, they are done
        conn.execute("SELECT storetopics.pause('docs')")
        run = lambda: subprocess.run(  # noqa: E731
            [sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "--once"],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
        r = run()
        assert r.returncode == 0, r.stderr
        assert conn.execute("SELECT dirty_since IS NOT NULL FROM storetopics.work").fetchone()[0]
        conn.execute("SELECT storetopics.resume('docs')")
        r = run()
        assert r.returncode == 0, r.stderr
        assert quiescent(conn)
        text = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
        labels = conn.execute("SELECT label FROM storetopics.clusters WHERE chunks > 0").fetchall()
        assert len(labels) >= 2 and all(lb[0] and lb[0] in text for lb in labels), (labels, text)

        from storetopics import cli
        assert cli.main(["--dsn", dsn, "status"]) == 0
        out = capsys.readouterr().out
        assert "Workers" in out and re.search(r"^\s+s\s+idle\s", out, re.M), out
        assert re.search(r"LLM cost: \$0\.\d{4} over \d+ labelling calls", out), out


# ------------------------------------------------------------------------------------------------------------
# A worker role that is no superuser (storetopics.grant_worker)
# ------------------------------------------------------------------------------------------------------------
def test_worker_runs_as_a_role_that_is_no_superuser_and_a_failing_pass_recovers(make_db):
    """The managed-Postgres case (plain script, no superuser worker, a table owner who is no superuser either).  The
    worker needs no right on the application's tables: each source's reader reads them as their owner.  Until the
    owner may read the table its store key looks up, every pass fails: the store keeps its state, backs off, shows
    `failing` with the error, and recovers by itself once the owner is granted it."""
    from psycopg import conninfo
    dsn = make_db("script")
    role, owner = "st_worker_role", "st_owner_role"
    with connect(dsn) as admin:
        for r in (role, owner):
            admin.execute(f"DROP ROLE IF EXISTS {r}")   # roles are cluster-wide
            admin.execute(f"CREATE ROLE {r} LOGIN")
        admin.execute("SELECT storetopics.grant_worker(%s)", (role,))
        admin.execute("SELECT storetopics.grant_attach(%s)", (owner,))
        admin.execute(f"CREATE SCHEMA app AUTHORIZATION {owner}")
        admin.execute("CREATE TABLE public.shelf (file text PRIMARY KEY, store text)")   # the owner may not read it
        admin.execute("INSERT INTO shelf VALUES ('f1', 's'), ('f2', 't')")
        with connect(conninfo.make_conninfo(dsn, user=owner)) as o:
            o.execute("CREATE TABLE app.docs (id bigserial PRIMARY KEY, file text, content text)")
            o.execute("INSERT INTO app.docs (file, content) VALUES ('f1', 'kitchen tiles and grout'), "
                      "('f2', 'telescope galaxy nebula')")
            o.execute("SELECT storetopics.attach('app.docs', "
                      "store_key => '(SELECT x.store FROM public.shelf x WHERE x.file = c.file)', "
                      "file_key => 'file', content => 'content')")
            o.execute("SELECT storetopics.configure('app.docs', '{\"debounce\": 0}')")
        once = lambda: subprocess.run(  # noqa: E731
            [sys.executable, "-m", "storetopics.worker", "--once", "--dsn", conninfo.make_conninfo(dsn, user=role)],
            capture_output=True, text=True, timeout=120)
        try:
            for attempt in (1, 2, 3):
                r = once()
                assert r.returncode == 0, r.stderr
                assert "cannot fold source" in r.stderr and "permission denied for table shelf" in r.stderr, r.stderr
                assert admin.execute("SELECT count(*) FROM storetopics.store_state").fetchone()[0] == 0
            admin.execute(f"GRANT SELECT ON shelf TO {owner}")
            for _ in range(2):   # the first pass folds the source, the second renders its stores
                r = once()
                assert r.returncode == 0, r.stderr
            assert quiescent(admin), r.stderr
            assert "telescope" in admin.execute("SELECT store_topics FROM storetopics.stores WHERE store_key = 't'"
                                                ).fetchone()[0]
            assert admin.execute("SELECT count(*) FROM storetopics.work_status() WHERE state = 'idle' "
                                 "AND attempts = 0 AND last_error IS NULL").fetchone()[0] == 2
        finally:
            admin.execute("DROP SCHEMA app CASCADE")
            admin.execute("DROP TABLE shelf")
            for r in (role, owner):
                admin.execute(f"DROP OWNED BY {r}")
                admin.execute(f"DROP ROLE {r}")


# ------------------------------------------------------------------------------------------------------------
# One tenant must not stall the shared worker (issue 28): a time limit per statement, fairness, a prompt SIGTERM
# ------------------------------------------------------------------------------------------------------------
# How tenant A's key expression stalls once A switches it on (a.stall).  Never inside A's own writes' capture trigger
# (pg_trigger_depth): A's inserts stay fast, the worker's reads of A's table stall.
STALLS = {
    # the audit's expression: a sleep in the key
    "sleep": "PERFORM pg_catalog.pg_sleep(60);",
    # a tenant that fights the limit: it catches every cancel and sleeps again, and turns the session's timeout off
    "stubborn": """PERFORM pg_catalog.set_config('statement_timeout', '0', false);
    FOR i IN 1..100 LOOP
      BEGIN
        PERFORM pg_catalog.pg_sleep(60);
      EXCEPTION WHEN query_canceled THEN
        NULL;
      END;
    END LOOP;""",
    # a tenant that swallows the cancel: its statement goes on and comes back without an error
    "absorb": """IF coalesce(pg_catalog.current_setting('a.absorbed', true), '') <> pg_catalog.statement_timestamp()::text
    THEN
      BEGIN
        PERFORM pg_catalog.pg_sleep(60);
      EXCEPTION WHEN query_canceled THEN
        PERFORM pg_catalog.set_config('a.absorbed', pg_catalog.statement_timestamp()::text, true);
      END;
    END IF;""",
    # the first statement that reads A's table turns the timeout off for the rest of the worker's session (and
    # returns: its transaction commits, so the setting stays); every later statement sleeps
    "lift": """IF coalesce(pg_catalog.current_setting('a.lifted', true), '') = '' THEN
      PERFORM pg_catalog.set_config('statement_timeout', '0', false),
              pg_catalog.set_config('a.lifted', pg_catalog.statement_timestamp()::text, false);
    ELSIF pg_catalog.current_setting('a.lifted') <> pg_catalog.statement_timestamp()::text THEN
      PERFORM pg_catalog.pg_sleep(60);
    END IF;""",
    # the first statement that reads A's table makes the rest of the worker's session read-only
    "read-only": """PERFORM pg_catalog.set_config('default_transaction_read_only', 'on', false);""",
}


class Tenants:
    """The cast of tests/test_security.py, for the worker: tenant roles A and B (storetopics.grant_attach), each
    owning a schema (a, b) with an attached table, and a worker role (storetopics.grant_worker), none a superuser.
    A's store key is its own function a.key(store), which stalls as STALLS[how] says once A sets a.stall."""

    def __init__(self, dsn: str, how: str, a_stores: int):
        from psycopg import conninfo
        self.dsn, self.conninfo = dsn, conninfo
        tag = uuid.uuid4().hex[:6]
        self.a, self.b, self.worker = f"stall_a_{tag}", f"stall_b_{tag}", f"stall_w_{tag}"
        self.admin = connect(dsn)
        for r in (self.a, self.b, self.worker):
            self.admin.execute(f"CREATE ROLE {r} LOGIN")
        for r, schema in ((self.a, "a"), (self.b, "b")):
            self.admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {r}")
            self.admin.execute("SELECT storetopics.grant_attach(%s)", (r,))
        self.admin.execute("SELECT storetopics.grant_worker(%s)", (self.worker,))
        self.ca, self.cb = connect(self.as_(self.a)), connect(self.as_(self.b))
        self.ca.execute("CREATE TABLE a.stall (active boolean NOT NULL)")
        self.ca.execute("INSERT INTO a.stall VALUES (false)")
        self.ca.execute(f"""CREATE FUNCTION a.key(s text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  IF pg_catalog.pg_trigger_depth() = 0 AND (SELECT x.active FROM a.stall x) THEN
    {STALLS[how]}
  END IF;
  RETURN s;
END $$""")
        for c, schema in ((self.ca, "a"), (self.cb, "b")):
            c.execute(f"CREATE TABLE {schema}.docs (id serial PRIMARY KEY, store text, file text, content text)")
            c.execute(f"CREATE INDEX ON {schema}.docs (file)")
        topics = list(WORDS)
        self.a_stores = [f"a{i}" for i in range(a_stores)]
        self.insert("a", [(s, f"{s}-f0", WORDS[topics[i % len(topics)]]) for i, s in enumerate(self.a_stores)])
        self.insert("b", [("bees", "bees-f0", WORDS["garden"])])
        self.a_source = self.ca.execute("SELECT storetopics.attach('a.docs', store_key => 'a.key(c.store)', "
                                        "file_key => 'file', content => 'content')").fetchone()[0]
        self.b_source = self.cb.execute("SELECT storetopics.attach('b.docs', store_key => 'store', file_key => 'file', "
                                        "content => 'content')").fetchone()[0]
        self.ca.execute("""SELECT storetopics.configure('a.docs', '{"debounce": 0.5}')""")
        self.cb.execute("""SELECT storetopics.configure('b.docs', '{"debounce": 0.5}')""")

    def as_(self, role: str) -> str:
        return self.conninfo.make_conninfo(self.dsn, user=role)

    def insert(self, schema: str, rows) -> None:
        with (self.ca if schema == "a" else self.cb).cursor() as cur:
            cur.executemany(f"INSERT INTO {schema}.docs (store, file, content) VALUES (%s, %s, %s)", rows)

    def stall(self, on: bool = True) -> None:
        self.ca.execute("UPDATE a.stall SET active = %s", (on,))

    def summary(self, source: int, store: str) -> str | None:
        row = self.admin.execute("SELECT store_topics FROM storetopics.stores WHERE source_id = %s AND store_key = %s",
                                 (source, store)).fetchone()
        return row[0] if row else None

    def work(self, source: int) -> list[tuple]:
        return self.admin.execute(
            "SELECT store_key, state, attempts, last_error, leased_by FROM storetopics.work_status() "
            "WHERE source_id = %s ORDER BY store_key", (source,)).fetchall()

    def close(self) -> None:
        roles = [self.a, self.b, self.worker]
        # a backend left sleeping in A's SQL (a worker that could not stop it) holds locks on A's table
        self.admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = ANY (%s)",
                           (roles,))
        self.ca.close()
        self.cb.close()
        self.admin.execute("DROP SCHEMA IF EXISTS a, b CASCADE")
        for r in roles:
            self.admin.execute(f"DROP OWNED BY {r}")
            self.admin.execute(f"DROP ROLE {r}")
        self.admin.close()


@pytest.fixture
def tenants(dsn):
    made: list[Tenants] = []

    def make(how: str = "sleep", a_stores: int = 1) -> Tenants:
        t = Tenants(dsn, how, a_stores)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def first_summaries(t: Tenants) -> dict[str, str]:
    """Wait until every store of A and B has its summary; return A's."""
    wait_for(lambda: quiescent(t.admin) and all(t.summary(t.a_source, s) for s in t.a_stores)
             and t.summary(t.b_source, "bees"), 60, "the first summaries")
    return {s: t.summary(t.a_source, s) for s in t.a_stores}


@pytest.mark.parametrize("how", ["sleep", "stubborn", "absorb"])
def test_a_tenant_whose_key_expression_stalls_does_not_stall_the_worker(tenants, workers, how):
    """Tenant A's key expression sleeps (or catches every cancel, or swallows the cancel and returns).  One
    worker with a 2 s statement timeout serves A's 8 stores and B's one: every pass over A fails at the limit (the
    store keeps its summary, backs off, shows `failing` with an error that names the limit), and B's one-file change
    is rendered within its debounce and a few seconds although all of A's stores are due before it (claim() serves
    the sources without failing passes first)."""
    t = tenants(how, a_stores=8)
    w = workers(t.as_(t.worker), "--lease", "5", "--poll", "0.3", env={"STORETOPICS_STATEMENT_TIMEOUT": "2"})
    before = first_summaries(t)
    t.stall()
    t.insert("a", [(s, f"{s}-f1", WORDS["chess"]) for s in t.a_stores])      # every store of A is dirty now
    wait_for(lambda: any(r[2] for r in t.work(t.a_source)), 60, "a first failed pass over A")
    failed = [r for r in t.work(t.a_source) if r[2]][0]
    assert "time limit" in failed[3] and "statement-timeout" in failed[3], failed

    # All of A's stores are due now (their backoff is moved on rather than waited for); then B changes one file.
    t.admin.execute("UPDATE storetopics.work SET next_attempt_at = now() WHERE source_id = %s", (t.a_source,))
    t0 = time.monotonic()
    t.insert("b", [("bees", "bees-f1", WORDS["astronomy"])])
    wait_for(lambda: "telescope" in (t.summary(t.b_source, "bees") or ""), 60, "B's change")
    took = time.monotonic() - t0
    print(f"\n{how}: B's change rendered after {took:.2f}s")
    # debounce 0.5 s + at most the one pass over A in flight (2 s, or 4 s when the cancel is caught) + B's own pass
    # (the 8 passes over A first would take 16 s or 32 s)
    assert took < 10, f"B's one-file change took {took:.1f}s to be rendered"

    if how == "absorb":
        # its statements do get done, each one a limit's length late (and each one fails its pass): its stores come
        # clean one statement at a time
        assert w.term() == 0
        return
    # A's stores keep failing at the limit, with backoff, and show it; their summaries are the old ones.  (The
    # clock is moved on for one store, the others' retries are put off.)
    store = t.a_stores[0]

    def attempts():
        return t.admin.execute("SELECT attempts FROM storetopics.work WHERE source_id = %s AND store_key = %s",
                               (t.a_source, store)).fetchone()[0]
    while (n := attempts()) < 3:
        t.admin.execute("UPDATE storetopics.work SET next_attempt_at = CASE WHEN store_key = %s THEN now() "
                        "ELSE now() + interval '1 hour' END WHERE source_id = %s", (store, t.a_source))
        wait_for(lambda: attempts() > n, 60, f"failure {n + 1} of {store}")
    row = [r for r in t.work(t.a_source) if r[0] == store][0]
    assert row[1] == "failing" and "time limit" in row[3] and "STORETOPICS_STATEMENT_TIMEOUT" in row[3], row
    assert {s: t.summary(t.a_source, s) for s in t.a_stores} == before
    assert w.proc.poll() is None
    assert t.admin.execute("SELECT sum(failures) FROM storetopics.worker_status()").fetchone()[0] >= 4
    t0 = time.monotonic()
    assert w.term() == 0
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("how", ["sleep", "stubborn", "absorb"])
def test_sigterm_while_a_tenants_statement_runs_stops_the_worker_at_once(tenants, workers, how):
    """SIGTERM while the worker's statement sleeps in A's key expression (under the default time limit, 5 min):
    the statement is cancelled (its session ended when the cancel is caught), the lease given back, exit 0, within
    3 s."""
    t = tenants(how)
    w = workers(t.as_(t.worker), "--lease", "30", "--poll", "0.3")
    first_summaries(t)
    t.stall()
    t.insert("a", [("a0", "a0-f1", WORDS["chess"])])
    wait_for(lambda: t.admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND state = 'active' "
                                     "AND wait_event = 'PgSleep'", (t.worker,)).fetchone()[0], 60,
             "the worker's statement to sleep in A's key expression")
    assert t.work(t.a_source)[0][4] == "w"          # leased
    time.sleep(0.5)
    t0 = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    try:
        code = w.proc.wait(20)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    print(f"\nSIGTERM ({how}): exit {code} after {took:.2f}s")
    assert code == 0 and took < 3, (code, f"{took:.1f}s", w.log()[-2000:])
    store, state, attempts, _error, leased_by = t.work(t.a_source)[0]
    assert leased_by is None and attempts == 0, t.work(t.a_source)   # given back, not counted as a failure
    assert t.admin.execute("SELECT stopped_at IS NOT NULL FROM storetopics.worker_status()").fetchone()[0]
    # nothing of the worker's is left running on the server
    wait_for(lambda: not t.admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                                         (t.worker,)).fetchone()[0], 5, "the worker's sessions to end")


def test_statement_timeout_flag_and_variable(monkeypatch):
    """--statement-timeout S, else $STORETOPICS_STATEMENT_TIMEOUT, else the default; 0 means none; a negative value
    or one that does not parse is an error that names the flag or the variable."""
    import argparse

    from storetopics import config
    from storetopics import worker as st_worker

    def parse(*argv):
        p = argparse.ArgumentParser()
        p.add_argument("--dsn", default="")
        st_worker.add_arguments(p)
        return st_worker.options(p.parse_args(argv))

    monkeypatch.delenv("STORETOPICS_STATEMENT_TIMEOUT", raising=False)
    assert parse().statement_timeout == config.STATEMENT_TIMEOUT > 0
    monkeypatch.setenv("STORETOPICS_STATEMENT_TIMEOUT", "7.5")
    assert parse().statement_timeout == 7.5
    assert parse("--statement-timeout", "0").statement_timeout == 0
    with pytest.raises(ValueError, match="--statement-timeout"):
        parse("--statement-timeout", "-1")
    monkeypatch.setenv("STORETOPICS_STATEMENT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="STORETOPICS_STATEMENT_TIMEOUT"):
        parse()


def test_the_time_limit_is_the_operators_a_tenant_cannot_lift_it(tenants):
    """The limit is a flag of the worker: configure() knows no such setting, and what a tenant owns (its reader,
    the SQL its key runs) cannot lift it: not a SET on its generated reader, not a SET its SQL makes for the worker's
    session (the worker's client cancels a statement that runs on past the limit)."""
    t = tenants("lift", a_stores=2)
    for key in ("statement_timeout", "lock_timeout", "time_limit"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"unknown setting {key}"):
            t.ca.execute("SELECT storetopics.configure('a.docs', %s)", (json.dumps({key: 0}),))
    assert not any("timeout" in k for k in t.ca.execute("SELECT storetopics.settings('a.docs')").fetchone()[0])
    reader = t.admin.execute("SELECT format('storetopics.read_%%s', %s::int)::regproc::regprocedure::text",
                             (t.a_source,)).fetchone()[0]
    t.ca.execute(f"ALTER FUNCTION {reader} SET statement_timeout = 0")   # the tenant owns its reader
    t.admin.execute("""SELECT storetopics.configure(x, '{"debounce": 0}') FROM unnest('{a.docs,b.docs}'::regclass[]) x""")
    once = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "storetopics.worker", "--once", "--dsn", t.as_(t.worker)],
        env=dict(os.environ, STORETOPICS_STATEMENT_TIMEOUT="2"), capture_output=True, text=True, timeout=120)
    r = once()
    assert r.returncode == 0, r.stderr
    assert all(t.summary(t.a_source, s) for s in t.a_stores) and t.summary(t.b_source, "bees")
    t.stall()
    t.insert("a", [("a0", "a0-f1", WORDS["chess"])])
    t.insert("b", [("bees", "bees-f1", WORDS["astronomy"])])
    t0 = time.monotonic()
    try:
        r = once()
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the worker did not finish: {e.stderr[-3000:] if e.stderr else ''}") from None
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    print(f"\nlift: the --once run took {took:.2f}s")
    # A's pass ran into the limit (each statement at most the limit and the client's grace), B's was done after it
    assert took < 30, f"{took:.1f}s\n{r.stderr}"
    a0 = t.work(t.a_source)[0]
    assert a0[2] == 1 and "time limit" in a0[3], (a0, r.stderr)
    assert "telescope" in t.summary(t.b_source, "bees")


def test_a_tenants_session_settings_end_with_its_pass(tenants):
    """A's key expression makes the worker's session read-only (a SET without LOCAL outlives the function that made
    it): A's pass fails, but the worker's own bookkeeping and B's pass run in a session put back as the worker set
    it."""
    t = tenants("read-only")
    once = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "storetopics.worker", "--once", "--dsn", t.as_(t.worker)],
        capture_output=True, text=True, timeout=60)
    t.admin.execute("""SELECT storetopics.configure(x, '{"debounce": 0}') FROM unnest('{a.docs,b.docs}'::regclass[]) x""")
    r = once()
    assert r.returncode == 0, r.stderr
    t.stall()
    t.insert("a", [("a0", "a0-f1", WORDS["chess"])])
    t.insert("b", [("bees", "bees-f1", WORDS["astronomy"])])
    try:
        r = once()
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the worker did not finish: {e.stderr[-3000:] if e.stderr else ''}") from None
    assert r.returncode == 0, r.stderr
    assert "telescope" in t.summary(t.b_source, "bees"), r.stderr
    assert t.admin.execute("SELECT count(*) FROM storetopics.work WHERE leased_by IS NOT NULL").fetchone()[0] == 0
