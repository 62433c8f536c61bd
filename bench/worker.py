"""`make bench` (worker): the worker's freshness and LLM spend, measured against real processes.

1. Event -> updated summary: a 100k-chunk store (10k files x 10 chunks, 384-d vectors around 20 centres), built and
   clustered once; then a running `storetopics worker` and single uploads that fit the existing clusters, one at a
   time.  Latency = from the upload's commit to the NOTIFY storetopics_updated of its store.  Target: p95 <=
   debounce + 30 s (the bench uses a shorter debounce than the default 60 s, reported below).
2. LLM calls per 1,000 uploads that fit existing clusters (in bursts, while the worker runs).  Target: 0.
3. LLM calls per re-cluster: a new theme arrives (more than refit_outliers of the store), the worker re-fits and
   labels only the new clusters.  Target: <= K.
4. `--soak SECONDS` (`make soak`, opt-in): steady churn on a 50k-chunk 1536-d store for SECONDS with a running
   worker; the worker's RSS is sampled every 2 s.  Target: peak <= 1 GB.

    python -m bench.worker [--chunks N] [--debounce S] [--events N]
    python -m bench.worker --soak 600
Results: bench/results/worker-<stamp>.json and bench/results/worker-latest.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg

from storetopics import api, cli
from storetopics import install as st_install
from tests import harness
from tests.fakes.messages import MessagesServer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CENTRES = 20
THEMES = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
          "quebec romeo sierra tango").split()
NEW_THEME = "zulu yankee xray whiskey"


class Data:
    def __init__(self, dim: int, seed: int = 1):
        self.dim = dim
        self.rng = np.random.default_rng(seed)
        c = self.rng.normal(size=(CENTRES + 1, dim)).astype(np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)
        self.next_id = 0
        self.next_file = 0

    def rows(self, files: int, per_file: int = 10, store: str = "big", new_theme: bool = False):
        out = []
        for _ in range(files):
            f = self.next_file
            self.next_file += 1
            t = CENTRES if new_theme else f % CENTRES
            words = NEW_THEME if new_theme else f"{THEMES[t]} {THEMES[(t + 7) % CENTRES]}"
            x = self.centres[t] + self.rng.normal(scale=0.035, size=(per_file, self.dim)).astype(np.float32)
            for v in x:
                out.append((self.next_id, store, f"f{f}", f"{words} notes about {words}", v))
                self.next_id += 1
        return out


def copy_rows(conn, rows) -> None:
    with conn.cursor() as cur:
        with cur.copy("COPY docs (id, store, file, content, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "text", "text", "vector"])
            for r in rows:
                copy.write_row(r)


def setup(dsn: str, data: Data, chunks: int, settings: dict, log) -> None:
    from pgvector.psycopg import register_vector
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(f"CREATE TABLE docs (id bigint PRIMARY KEY, store text, file text, content text, "
                     f"embedding vector({data.dim}))")
        conn.execute("CREATE INDEX ON docs (file)")
        t0 = time.perf_counter()
        for start in range(0, chunks // 10, 5000):
            copy_rows(conn, data.rows(min(5000, chunks // 10 - start)))
        log(f"loaded {chunks:,} chunks in {time.perf_counter() - t0:.1f}s")
        conn.execute("SELECT storetopics.attach('docs', 'store', 'file', 'content', 'embedding')")
        conn.execute("SELECT storetopics.configure('docs', %s)", (json.dumps(settings),))
        t0 = time.perf_counter()
        res = api.backfill(conn)
        log(f"backfill (fold, fit, labels, render) in {time.perf_counter() - t0:.1f}s: {cli.summary(res)}")


def start_worker(dsn: str, env: dict, logpath: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "-v", *args],
                            stdout=open(logpath, "w"), stderr=subprocess.STDOUT, env=dict(os.environ, **env))


def rss_kb(pid: int) -> tuple[int, int]:
    text = Path(f"/proc/{pid}/status").read_text()
    get = lambda k: int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith(k)))  # noqa: E731
    return get("VmRSS:"), get("VmHWM:")


def ledger_calls(conn) -> int:
    return conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0]


def wait_quiet(conn, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn.execute("""SELECT NOT EXISTS (SELECT 1 FROM storetopics.pending)
                             AND NOT EXISTS (SELECT 1 FROM storetopics.work_status() WHERE state <> 'idle')"""
                        ).fetchone()[0]:
            return
        time.sleep(0.5)
    raise TimeoutError("the worker did not catch up")


def percentile(xs, p):
    return float(np.percentile(np.array(xs), p)) if xs else None


def bench_freshness(args, log) -> dict:
    out: dict = {"chunks": args.chunks, "dim": 384, "debounce_s": args.debounce}
    with harness.server() as admin, MessagesServer() as server:
        env = {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "bench"}
        os.environ.update(env)
        name = harness.create_database(admin, prefix="bench_worker")
        dsn = harness.with_db(admin, name)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION vector")
        st_install.install(dsn, log=lambda *a: None)
        data = Data(384)
        setup(dsn, data, args.chunks, {"debounce": args.debounce, "labeller": "anthropic",
                                       "k_min": 10, "k_max": 25, "sample_size": 20000}, log)
        from pgvector.psycopg import register_vector
        conn = psycopg.connect(dsn, autocommit=True)
        register_vector(conn)
        k0 = conn.execute("SELECT count(*) FROM storetopics.clusters WHERE chunks > 0").fetchone()[0]
        calls0 = ledger_calls(conn)
        out["initial"] = {"k": k0, "label_calls": calls0}
        logpath = Path(tempfile.gettempdir()) / f"storetopics-bench-worker-{os.getpid()}.log"
        proc = start_worker(dsn, env, logpath, "--lease", "30", "--poll", "2")
        listener = psycopg.connect(dsn, autocommit=True)
        listener.execute("LISTEN storetopics_updated")
        try:
            time.sleep(3)
            # 1. event -> updated summary, one upload at a time
            lat = []
            for i in range(args.events):
                copy_rows(conn, data.rows(1))
                t0 = time.monotonic()
                got = None
                for n in listener.notifies(timeout=args.debounce + 120):
                    if n.payload.endswith(":big"):
                        got = time.monotonic()
                        break
                if got is None:
                    raise TimeoutError("no NOTIFY storetopics_updated")
                lat.append(got - t0)
                log(f"event {i + 1}/{args.events}: {lat[-1]:.2f}s")
                time.sleep(0.5)
            refits = conn.execute("SELECT fit_generation FROM storetopics.store_state WHERE store_key = 'big'"
                                  ).fetchone()[0]
            out["event_to_summary_s"] = {"n": len(lat), "p50": percentile(lat, 50), "p95": percentile(lat, 95),
                                         "max": max(lat), "target_p95": args.debounce + 30,
                                         "fit_generation_after": refits}
            # 2. 1,000 uploads that fit the existing clusters, in 10 bursts of 100
            calls_before, gen_before = ledger_calls(conn), refits
            t0 = time.monotonic()
            for _ in range(10):
                copy_rows(conn, data.rows(100))
                time.sleep(1.0)
            wait_quiet(conn, 600)
            gen_after = conn.execute("SELECT fit_generation FROM storetopics.store_state WHERE store_key = 'big'"
                                     ).fetchone()[0]
            out["uploads_1000"] = {"label_calls": ledger_calls(conn) - calls_before, "refits": gen_after - gen_before,
                                   "seconds_to_quiet": round(time.monotonic() - t0, 1), "target": 0}
            log(f"1,000 uploads: {out['uploads_1000']}")
            # 3. a new theme (more than 5% of the store): one re-cluster, labels only for new clusters
            calls_before = ledger_calls(conn)
            n_new = int(args.chunks * 0.08) // 10
            t0 = time.monotonic()
            copy_rows(conn, data.rows(n_new, new_theme=True))
            deadline = time.monotonic() + 900
            while conn.execute("SELECT fit_generation FROM storetopics.store_state WHERE store_key = 'big'"
                               ).fetchone()[0] == gen_after and time.monotonic() < deadline:
                time.sleep(1)
            wait_quiet(conn, 900)
            k1 = conn.execute("SELECT fit_k FROM storetopics.store_state WHERE store_key = 'big'").fetchone()[0]
            out["recluster"] = {"new_chunks": n_new * 10, "k": k1,
                                "label_calls": ledger_calls(conn) - calls_before,
                                "refits": conn.execute("SELECT fit_generation FROM storetopics.store_state "
                                                       "WHERE store_key = 'big'").fetchone()[0] - gen_after,
                                "seconds": round(time.monotonic() - t0, 1), "target": "<= K"}
            log(f"re-cluster: {out['recluster']}")
            out["worker_peak_rss_mb"] = round(rss_kb(proc.pid)[1] / 1024, 1)
        finally:
            proc.terminate()
            proc.wait(60)
            listener.close()
            conn.close()
            harness.drop_database(admin, name)
    return out


def bench_soak(args, log) -> dict:
    dim, chunks = 1536, args.soak_chunks
    out: dict = {"seconds": args.soak, "chunks": chunks, "dim": dim}
    with harness.server() as admin:
        name = harness.create_database(admin, prefix="bench_soak")
        dsn = harness.with_db(admin, name)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION vector")
        st_install.install(dsn, log=lambda *a: None)
        data = Data(dim)
        # sample_size 50k: every fit reads all 50k x 1536-d vectors (the case the 1 GB bound is about);
        # refit_outliers 0.01 so the churn keeps causing re-fits; max_staleness 15 s (the churn never stops)
        setup(dsn, data, chunks, {"debounce": 2, "max_staleness": 15, "sample_size": 50000, "k_min": 10,
                                  "k_max": 20, "refit_outliers": 0.01}, log)
        from pgvector.psycopg import register_vector
        conn = psycopg.connect(dsn, autocommit=True)
        register_vector(conn)
        logpath = Path(tempfile.gettempdir()) / f"storetopics-soak-worker-{os.getpid()}.log"
        proc = start_worker(dsn, {}, logpath, "--lease", "60", "--poll", "1")
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set() and proc.poll() is None:
                try:
                    samples.append((time.monotonic(), *rss_kb(proc.pid)))
                except (FileNotFoundError, StopIteration):
                    break
                stop.wait(2)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        t0 = time.monotonic()
        ops = 0
        try:
            while time.monotonic() - t0 < args.soak:
                # steady churn: 20 new files (one in five of a new theme, so outliers accumulate and re-fits come),
                # and 20 old files deleted
                copy_rows(conn, data.rows(20, new_theme=(ops % 5 == 4)))
                conn.execute("DELETE FROM docs WHERE file IN (SELECT DISTINCT file FROM docs ORDER BY file LIMIT 20)")
                ops += 1
                time.sleep(1.0)
            fits = conn.execute("SELECT fit_generation FROM storetopics.store_state").fetchone()[0]
        finally:
            stop.set()
            proc.terminate()
            proc.wait(60)
            th.join(5)
            conn.close()
            harness.drop_database(admin, name)
    rss = [s[1] for s in samples]
    out.update({"churn_rounds": ops, "fits": fits, "rss_mb_max": round(max(rss) / 1024, 1) if rss else None,
                "rss_mb_first": round(rss[0] / 1024, 1) if rss else None,
                "rss_mb_last": round(rss[-1] / 1024, 1) if rss else None,
                "peak_hwm_mb": round(max(s[2] for s in samples) / 1024, 1) if samples else None,
                "target_mb": 1024})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=100_000)
    p.add_argument("--debounce", type=float, default=5.0, help="the source's debounce in the bench (default 5 s)")
    p.add_argument("--events", type=int, default=20)
    p.add_argument("--soak", type=float, default=0, metavar="SECONDS", help="run the soak instead (make soak)")
    p.add_argument("--soak-chunks", type=int, default=50_000)
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M%S")

    def log(msg: str) -> None:
        print(f"[bench.worker] {msg}", flush=True)

    if args.soak:
        res = {"soak": bench_soak(args, log)}
        s = res["soak"]
        md = ["# Worker soak", "",
              f"{s['seconds']:.0f} s of steady churn on a {s['chunks']:,}-chunk {s['dim']}-d store "
              f"({s['churn_rounds']} rounds of +20/-20 files, {s['fits']} fits): worker RSS first "
              f"{s['rss_mb_first']} MB, last {s['rss_mb_last']} MB, max {s['rss_mb_max']} MB, peak (VmHWM) "
              f"{s['peak_hwm_mb']} MB; target <= {s['target_mb']} MB."]
        name = "worker-soak"
    else:
        res = {"freshness": bench_freshness(args, log)}
        f = res["freshness"]
        e, u, r = f["event_to_summary_s"], f["uploads_1000"], f["recluster"]
        md = ["# Worker", "",
              f"Store of {f['chunks']:,} chunks ({f['dim']}-d, K={f['initial']['k']} after the first fit), debounce "
              f"{f['debounce_s']:g} s in this bench (default 60 s).", "",
              "| measure | result | target |", "|---|---|---|",
              f"| event -> updated summary, p50 / p95 / max ({e['n']} uploads that fit the clusters) | "
              f"{e['p50']:.2f} / {e['p95']:.2f} / {e['max']:.2f} s | p95 <= debounce + 30 = {e['target_p95']:g} s |",
              f"| LLM calls per 1,000 uploads that fit existing clusters | {u['label_calls']} (re-fits: "
              f"{u['refits']}) | 0 |",
              f"| LLM calls for one re-cluster (new theme, {r['new_chunks']:,} chunks) | {r['label_calls']} "
              f"(K = {r['k']}, re-fits: {r['refits']}) | <= K |",
              f"| worker peak RSS | {f['worker_peak_rss_mb']} MB | |"]
        name = "worker"
    (RESULTS / f"{name}-{stamp}.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / f"{name}-latest.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
