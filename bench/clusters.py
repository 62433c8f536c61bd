"""`make bench` (clusters): the cluster signal measured side by side in one run.

1. Backfill of a 1M-chunk, 384-d store (synthetic vectors around 20 centres, 100k files of 10 chunks): the keyword
   fold, then clustering inside Postgres (storetopics._cluster via plpython3u: sample <= 50k, KMeans with K by
   silhouette, full reassignment of the 1M chunks by pgvector), then labelling with the Anthropic labeller against
   the local Messages API server.  Wall time, the backend's peak memory (VmHWM), LLM calls vs K.
2. LLM calls for a 100-file store vs a 100k-file store with the same structure: the same number (one per cluster).
3. Stability: re-fitting unchanged data with other seeds; share of labels that change; LLM calls made.

    python -m bench.clusters [--chunks N] [--files N]     # defaults: 1,000,000 chunks, 100,000 files
Results: bench/results/clusters-<stamp>.json and bench/results/clusters-latest.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from storetopics import install as st_install
from storetopics import refresh
from tests import harness
from tests.fakes.messages import MessagesServer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DIM = 384
CENTRES = 20
# each centre's chunks say two words of their own (so clusters get distinct words and labels), and one shared
THEMES = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
          "quebec romeo sierra tango").split()


class Synth:
    """The synthetic chunks of this bench: vectors around CENTRES random unit directions (noise 0.035 per
    coordinate), each file's chunks from one centre (file i: centre i mod CENTRES) saying that centre's two words.

    `store_of(file_ids)` gives each file's store key (default: all in "big"); `text_of(topics, n)` the n contents
    (default: the centre's two words and "notes", 3 words per chunk).  `rows(start, n)` draws chunks start..start+n
    (ids from `start`, file = id // per_file) from one seeded generator, so drawing the same sizes in the same order
    gives the same rows."""

    def __init__(self, seed: int, per_file: int, store_of=None, text_of=None):
        self.rng = np.random.default_rng(seed)
        centres = self.rng.normal(size=(CENTRES, DIM)).astype(np.float32)
        self.centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        self.per_file = per_file
        self.store_of = store_of or (lambda file_ids: ["big"] * len(file_ids))
        self.text_of = text_of or (lambda topics, n: [f"{THEMES[t]} {THEMES[(t + 7) % CENTRES]} notes"
                                                      for t in topics.tolist()])

    def rows(self, start: int, n: int, centre=None, text=None):
        """(id, store, file, content, vector) for chunks start..start+n; `centre` and `text` (a function of n)
        override the centres and texts (a new theme)."""
        ids = np.arange(start, start + n)
        file_ids = ids // self.per_file
        topic = file_ids % CENTRES
        base = self.centres[topic] if centre is None else centre
        x = base + self.rng.normal(scale=0.035, size=(n, DIM)).astype(np.float32)
        texts = self.text_of(topic, n) if text is None else text(n)
        return zip(ids.tolist(), self.store_of(file_ids), [f"f{f}" for f in file_ids.tolist()], texts, x)


COPY_SQL = "COPY {} (id, store, file, content, embedding) FROM STDIN WITH (FORMAT BINARY)"
COPY_TYPES = ["int8", "text", "text", "text", "vector"]


def create_table(conn, name: str) -> None:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, store text, file text, content text, "
                 f"embedding vector({DIM}))")


def copy_rows(conn, name: str, rows) -> None:
    with conn.cursor() as cur:
        with cur.copy(COPY_SQL.format(name)) as copy:
            copy.set_types(COPY_TYPES)
            for r in rows:
                copy.write_row(r)


def make_table(conn, name: str, chunks: int, files: int, seed: int, log) -> None:
    """`chunks` rows around CENTRES random directions; each file's chunks come from one centre."""
    create_table(conn, name)
    synth = Synth(seed, max(1, chunks // files))
    t0 = time.perf_counter()
    batch = 50_000
    with conn.cursor() as cur:
        with cur.copy(COPY_SQL.format(name)) as copy:
            copy.set_types(COPY_TYPES)
            for start in range(0, chunks, batch):
                n = min(batch, chunks - start)
                for r in synth.rows(start, n):
                    copy.write_row(r)
                if start // batch % 4 == 0:
                    log(f"  loaded {start + n:,} rows  [{time.perf_counter() - t0:.0f}s]")
    conn.execute(f"CREATE INDEX ON {name} (file)")
    conn.execute(f"VACUUM ANALYZE {name}")


def backend_peak_kb(conn) -> int | None:
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def label_calls(conn, source: int, store: str) -> int:
    return conn.execute("SELECT count(*) FROM storetopics.label_ledger WHERE source_id = %s AND store_key = %s",
                        (source, store)).fetchone()[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.clusters", description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=100_000)
    args = ap.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    out: dict = {"started": started.isoformat(), "chunks": args.chunks, "files": args.files, "dim": DIM,
                 "centres": CENTRES}
    with harness.server() as admin, MessagesServer() as llm:
        os.environ["ANTHROPIC_BASE_URL"] = llm.base_url
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        db = harness.create_database(admin, prefix="benchk")
        dsn = harness.with_db(admin, db)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION vector")
                conn.execute("CREATE EXTENSION plpython3u")
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                register_vector(conn)
                # -- 1. the 1M-chunk store ---------------------------------------------------------------------
                log(f"1. building {args.chunks:,} chunks x {DIM}-d in {args.files:,} files (not timed)")
                make_table(conn, "big", args.chunks, args.files, seed=1, log=log)
                size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('big'))").fetchone()[0]
                source = conn.execute("SELECT storetopics.attach('big', 'store', 'file', 'content', 'embedding', "
                                      "settings => '{\"labeller\": \"anthropic\"}')").fetchone()[0]
                t0 = time.perf_counter()
                while conn.execute("SELECT storetopics._fold(%s, 20000)", (source,)).fetchone()[0]:
                    pass
                fold_s = time.perf_counter() - t0
                log(f"  keyword fold of {args.chunks:,} short chunks: {fold_s:.1f}s (table {size})")
            # a fresh backend, so its peak memory is the clustering's
            with psycopg.connect(dsn, autocommit=True) as conn:
                register_vector(conn)
                t0 = time.perf_counter()
                report = conn.execute("SELECT storetopics._cluster(%s, 'big')", (source,)).fetchone()[0]
                fit_s = time.perf_counter() - t0
                peak = backend_peak_kb(conn)
                log(f"  clustering inside Postgres: {fit_s:.1f}s, backend peak {peak / 1024 if peak else -1:.0f} MB, "
                    f"{report}")
                t0 = time.perf_counter()
                refresh.label(conn, source, "big")
                label_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                refresh.render(conn, source, "big")
                render_s = time.perf_counter() - t0
                k = report["k"]
                calls = label_calls(conn, source, "big")
                text = conn.execute("SELECT store_topics FROM storetopics.stores WHERE store_key = 'big'").fetchone()[0]
                log(f"  labels: {calls} calls for K={k} ({label_s:.1f}s); render {render_s:.1f}s")
                log(f"  {text}")
                out["backfill_1m"] = {
                    "fold_seconds": round(fold_s, 1), "cluster_seconds": round(fit_s, 1),
                    "label_seconds": round(label_s, 1), "render_seconds": round(render_s, 1),
                    "backfill_seconds": round(fold_s + fit_s + label_s + render_s, 1),
                    "backfill_seconds_without_fold": round(fit_s + label_s + render_s, 1),
                    "backend_peak_mb": round(peak / 1024) if peak else None, "k": k, "llm_calls": calls,
                    "sampling": report.get("sampling"), "table_size": size, "summary": text,
                    "targets": {"seconds": 60, "peak_mb": 1024, "llm_calls_max": k}}

                # -- 3. stability: other seeds on unchanged data -------------------------------------------------
                log("3. stability: re-fit the same data with seeds 1, 2, 3")
                before = {r[0]: r[1] for r in conn.execute(
                    "SELECT cluster_id, coalesce(label, storetopics._offline_label(keywords)) FROM storetopics.clusters "
                    "WHERE source_id = %s AND store_key = 'big'", (source,))}
                calls0 = label_calls(conn, source, "big")
                changed = []
                for seed in (1, 2, 3):
                    conn.execute("SELECT storetopics.configure('big', %s)", (json.dumps({"seed": seed}),))
                    t0 = time.perf_counter()
                    rep = conn.execute("SELECT storetopics._cluster(%s, 'big')", (source,)).fetchone()[0]
                    refresh.label(conn, source, "big")
                    now = {r[0]: r[1] for r in conn.execute(
                        "SELECT cluster_id, coalesce(label, storetopics._offline_label(keywords)) "
                        "FROM storetopics.clusters WHERE source_id = %s AND store_key = 'big'", (source,))}
                    # a label changes for a router when its text is gone (kept, reused and inherited labels stay)
                    lost = sum(1 for lab in before.values() if lab not in set(now.values()))
                    changed.append(lost / max(1, len(before)))
                    log(f"  seed {seed}: {rep['kept']} kept, {rep.get('inherited', 0)} inherited, {rep['new']} new, "
                        f"{rep['removed']} removed; "
                        f"{lost}/{len(before)} labels changed  [{time.perf_counter() - t0:.1f}s]")
                out["stability"] = {"labels_changed_share": changed, "llm_calls": label_calls(conn, source, "big")
                                    - calls0, "targets": {"labels_changed_share_max": 0.10, "llm_calls": 0}}

                # -- 2. LLM calls: 100 files vs 100k files, same structure ---------------------------------------
                log("2. LLM calls for a 100-file store with the same structure")
                make_table(conn, "small", 1_000, 100, seed=1, log=lambda *a: None)
                s2 = conn.execute("SELECT storetopics.attach('small', 'store', 'file', 'content', 'embedding', "
                                  "settings => '{\"labeller\": \"anthropic\"}')").fetchone()[0]
                conn.execute("SELECT * FROM storetopics.backfill(source => 'small')")
                refresh.label(conn, s2, "big")
                small_k = conn.execute("SELECT fit_k FROM storetopics.store_state WHERE source_id = %s",
                                       (s2,)).fetchone()[0]
                out["llm_calls_by_size"] = {"files_100": {"k": small_k, "llm_calls": label_calls(conn, s2, "big")},
                                            f"files_{args.files}": {"k": k, "llm_calls": calls}}
                log(f"  100 files: K={small_k}, {label_calls(conn, s2, 'big')} calls; {args.files:,} files: K={k}, "
                    f"{calls} calls")
        finally:
            harness.drop_database(admin, db)

    out["elapsed_seconds"] = round(time.perf_counter() - t_start, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    (RESULTS / f"clusters-{stamp}.json").write_text(json.dumps(out, indent=2) + "\n")
    b, s, c = out["backfill_1m"], out["stability"], out["llm_calls_by_size"]
    md = [f"# Clusters benchmark ({started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs)", "",
          "| what | measured | target |", "|---|---|---|",
          f"| 1M-chunk store: backfill (keyword fold + clustering + labels + render) | {b['backfill_seconds']} s "
          f"| ≤ 60 s |",
          f"| … keyword fold of the short synthetic texts | {b['fold_seconds']} s | |",
          f"| … clustering inside Postgres (sample, fit, reassign 1M chunks in their files' context) | "
          f"{b['cluster_seconds']} s | |",
          f"| … labels ({b['llm_calls']} calls to the local Messages API server) + render | "
          f"{round(b['label_seconds'] + b['render_seconds'], 1)} s | |",
          f"| backend peak memory (VmHWM) during clustering | {b['backend_peak_mb']} MB | ≤ 1024 MB |",
          f"| LLM calls for the 1M-chunk store | {b['llm_calls']} (K = {b['k']}) | ≤ K |",
          f"| LLM calls, 100-file vs {args.files:,}-file store | {c['files_100']['llm_calls']} vs "
          f"{c[f'files_{args.files}']['llm_calls']} | equal |",
          f"| re-fit with another seed: labels changed | "
          f"{', '.join(f'{x:.0%}' for x in s['labels_changed_share'])} | ≤ 10% |",
          f"| re-fit with another seed: LLM calls | {s['llm_calls']} | 0 |", "",
          f"Sampling: {b['sampling']}. Table: {b['table_size']}. Summary: `{b['summary']}`", ""]
    (RESULTS / "clusters-latest.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
