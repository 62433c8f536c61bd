"""The outlier files of the dominant store after a one-file upload (issue 33): storetopics._outlier_files from
what render kept, against the same from scratch (nothing kept: the state computed again and kept), against the
novelty query keywords() ran on every render before (main's CTE, below), side by side in one run.

    python -m bench.render_words build --dir /tmp/rw [--chunks 100000]   # the store (untimed), as for render_words
    python -m bench.novelty --dir /tmp/rw [--rounds 4] [--pile 10]
    python -m bench.novelty --dsn DSN --source 1 --store big            # a database built elsewhere

Each round uploads one file of 3 chunks (bench.doctext's text) to the store and folds it, then times, in an order
that alternates between rounds: `incremental` (_outlier_files from the state the previous round kept), `scratch`
(_forget_novelty, then _outlier_files: computed again, and kept for the next round) and `old` (the CTE); the
incremental and scratch results must be equal.  --pile K then uploads K more files one at a time without
computing the state again in between, and times the incremental call after each: how the cost grows with the
changes since the state was kept (it is computed again when a tenth of the files would have to be computed
exactly).  --stale also times, each round, the incremental call with the planner's estimates of the kept tables
stale (pg_class says they hold one row, as between a keep and autovacuum's next ANALYZE; in a transaction rolled
back, a superuser's, in a new session): its plan must not become a loop over the files.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench import clusters as bc
from bench.doctext import DocTexts
from bench.render_words import PER_FILE, connect, fold, server

# keywords()'s novelty and outlier test as main computed them, from scratch at every render (the hash join of every
# (file, term) pair of the store with its terms, grouped by file again)
OLD_SQL = """
WITH st AS MATERIALIZED (SELECT greatest(s.files, 1)::float8 AS n FROM storetopics.store_state s
                          WHERE s.source_id = %(src)s AND s.store_key = %(store)s),
terms AS (SELECT t.term_id, ln(st.n / t.files) AS idf FROM storetopics.store_terms t, st
           WHERE t.source_id = %(src)s AND t.store_key = %(store)s),
novelty AS (
  SELECT u.file_key, round((sum(u.n * t.idf) / sum(u.n))::numeric, 9)::float8 AS nov
    FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n FROM storetopics.file_terms f
           WHERE f.source_id = %(src)s AND f.store_key = %(store)s AND f.words > 0) u
    JOIN terms t ON t.term_id = u.term_id
   GROUP BY u.file_key),
spread AS (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY nov) AS med FROM novelty),
mad AS (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY abs(v.nov - s.med)) AS mad, s.med
          FROM novelty v, spread s GROUP BY s.med),
apart AS (SELECT f.file_key FROM storetopics.file_clusters f
           WHERE f.source_id = %(src)s AND f.store_key = %(store)s
             AND cardinality(f.cluster_chunks) > 0
             AND (SELECT sum(o) FROM unnest(f.cluster_outliers) o) = (SELECT sum(c) FROM unnest(f.cluster_chunks) c))
SELECT v.file_key, v.nov FROM novelty v CROSS JOIN mad m LEFT JOIN apart a ON a.file_key = v.file_key
 WHERE (v.nov - m.med) / (1.4826 * m.mad + 1e-9) >= CASE WHEN a.file_key IS NULL THEN 3.5 ELSE 2.5 END
 ORDER BY a.file_key IS NULL, v.nov DESC, v.file_key LIMIT 3
"""


def upload(conn, synth, source: int, store: str, next_id: int, seed: int) -> int:
    rows = [(next_id + i, store, f"novelty-{seed}", t, v)
            for i, (_, _, _, t, v) in enumerate(synth.rows(seed * PER_FILE, PER_FILE))]
    bc.copy_rows(conn, "docs", rows)
    fold(conn, source)
    return next_id + len(rows)


def timed(conn, sql: str, params=None) -> tuple[float, list]:
    t0 = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    return time.perf_counter() - t0, rows


STALE = ("UPDATE pg_class SET reltuples = 1 "
         "WHERE oid IN ('storetopics.file_novelty'::regclass, 'storetopics.novelty_postings'::regclass)")


def timed_stale(dsn: str, sql: str, params) -> tuple[float, list]:
    """timed() in a new session (its functions' plans made afresh) told that the kept tables hold one row, in a
    transaction rolled back: the kept state stays as it was."""
    with connect(dsn) as fresh, fresh.transaction(force_rollback=True):
        fresh.execute("SET jit = off")
        fresh.execute(STALE)
        return timed(fresh, sql, params)


def run(dsn: str, source: int, store: str, rounds: int, pile: int, stale: bool = False) -> dict:
    texts = DocTexts(seed=33)
    synth = bc.Synth(seed=33, per_file=PER_FILE, store_of=lambda ids: [store] * len(ids), text_of=texts)
    out: dict = {"incremental": [], "scratch": [], "old": [], "pile": [], "stale": []}
    outliers = "SELECT rank, file_key, novelty FROM storetopics._outlier_files(%s, %s)"
    with connect(dsn) as conn:
        conn.execute("SET jit = off")
        files = conn.execute("SELECT files FROM storetopics.store_state WHERE source_id = %s AND store_key = %s",
                             (source, store)).fetchone()[0]
        print(f"store {store}: {files:,} files", flush=True)
        next_id = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM docs").fetchone()[0]
        conn.execute(outliers, (source, store))   # kept, for the first round
        for r in range(rounds):
            next_id = upload(conn, synth, source, store, next_id, 1000 + r)
            times = {}
            if r % 2:
                times["old"], _ = timed(conn, OLD_SQL, {"src": source, "store": store})
            if stale:
                times["stale"], inc_stale = timed_stale(dsn, outliers, (source, store))
            times["incremental"], inc = timed(conn, outliers, (source, store))
            if stale:
                assert inc_stale == inc, (inc_stale, inc)
            conn.execute("SELECT storetopics._forget_novelty(%s, %s)", (source, store))
            times["scratch"], scratch = timed(conn, outliers, (source, store))
            if not r % 2:
                times["old"], _ = timed(conn, OLD_SQL, {"src": source, "store": store})
            assert inc == scratch, (inc, scratch)
            for k, v in times.items():
                out[k].append(v)
            print(f"round {r}: incremental {times['incremental']:.3f}s  scratch {times['scratch']:.3f}s  "
                  f"old {times['old']:.3f}s  incremental/scratch {times['incremental'] / times['scratch']:.1%}  "
                  f"scratch/old {times['scratch'] / times['old']:.2f}"
                  + (f"  stale estimates {times['stale']:.3f}s" if stale else ""), flush=True)
        for k in range(pile):
            next_id = upload(conn, synth, source, store, next_id, 2000 + k)
            if stale:
                t_stale, rows_stale = timed_stale(dsn, outliers, (source, store))
                out["stale"].append(t_stale)
            t, rows = timed(conn, outliers, (source, store))
            out["pile"].append(t)
            if stale:
                assert rows_stale == rows, (rows_stale, rows)
            print(f"{k + 1} uploads since kept: incremental {t:.3f}s"
                  + (f", with stale estimates {t_stale:.3f}s" if stale else ""), flush=True)
    med = {k: statistics.median(v) for k, v in out.items() if v and k != "pile"}
    print(f"median: incremental {med['incremental']:.3f}s, scratch {med['scratch']:.3f}s, old {med['old']:.3f}s; "
          f"incremental/scratch {med['incremental'] / med['scratch']:.1%}, scratch/old "
          f"{med['scratch'] / med['old']:.2f}" + (f"; incremental with stale estimates {med['stale']:.3f}s" if stale else ""),
          flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.novelty")
    ap.add_argument("--dir", type=Path, help="a store built by `python -m bench.render_words build --dir`")
    ap.add_argument("--dsn")
    ap.add_argument("--source", type=int, default=1)
    ap.add_argument("--store", default="big")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--pile", type=int, default=0)
    ap.add_argument("--stale", action="store_true", help="also time the incremental call with stale estimates")
    args = ap.parse_args(argv)
    if args.dir:
        server(args.dir)
        meta = json.loads((args.dir / "bench.json").read_text())
        dsn, source = meta["dsn"], meta["source"]
    elif args.dsn:
        dsn, source = args.dsn, args.source
    else:
        ap.error("--dir or --dsn")
    run(dsn, source, args.store, args.rounds, args.pile, args.stale)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
