"""Fold A/B: the fold of one chunk table with two (or more) versions of its SQL, interleaved in one run, beside the
floor (per-(file, term) counts computed and discarded) -- how issue 33's fold changes were measured.

    .venv/bin/python -m bench.foldab --text docs --chunks 20000 --rounds 2 A=base:sql/idempotent/040-fold.sql B=.
        # A: 040-fold.sql as of the git revision `base`; B: the working tree's idempotent files as they are

A variant is NAME=REV:PATH[,PATH...] (those files as of git revision REV, run over the installed extension) or
NAME=. (the working tree's versions of every file any variant names).  Each round runs the variants in ABBA order:
the variant's SQL is run (CREATE OR REPLACE), the reader regenerated, the source resynced, then `_fold(source)` is
timed until it returns 0, and the floor query once.  After each fold the state (file_terms, store_terms,
store_state) is digested: every variant must leave the same state.  Prints the medians, and the per-step time of
the last fold of each variant (pg_stat_user_functions).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import psycopg

from bench.run import REPO, TEXT_KINDS, Config, Tables, copy_batches, copy_load, settle
from storetopics import install as st_install
from tests import harness

DIGEST = """
SELECT md5(string_agg(x, '|' ORDER BY x)) FROM (
  SELECT concat_ws(' ', f.file_key, f.store_key, f.chunks, f.skipped, f.words,
                   (SELECT string_agg(l.lexeme || ':' || u.n, ',' ORDER BY l.lexeme)
                      FROM unnest(f.term_ids, f.counts) u(id, n) JOIN storetopics.lexemes l ON l.id = u.id)) AS x
    FROM storetopics.file_terms f WHERE f.source_id = %(sid)s
  UNION ALL
  SELECT concat_ws(' ', 'T', t.store_key, l.lexeme, t.files, t.total, t.total_sq)
    FROM storetopics.store_terms t JOIN storetopics.lexemes l ON l.id = t.term_id WHERE t.source_id = %(sid)s
  UNION ALL
  SELECT concat_ws(' ', 'S', s.store_key, s.files, s.chunks, s.words, s.skipped) FROM storetopics.store_state s
   WHERE s.source_id = %(sid)s) q"""

FLOOR = ("SELECT count(*), sum(q.n) FROM (SELECT c.file_id, x.lexeme, sum(cardinality(x.positions)) AS n "
         "FROM {t} c, unnest(to_tsvector('english', c.content)) x GROUP BY 1, 2) q")


def variant_sql(spec: str, paths: list[str]) -> str:
    rev, _, files = spec.partition(":")
    if rev == ".":
        return "\n".join((REPO / p).read_text() for p in paths)
    return "\n".join(subprocess.run(["git", "show", f"{rev}:{p}"], cwd=REPO, capture_output=True, text=True,
                                    check=True).stdout for p in files.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.foldab")
    ap.add_argument("--text", default="docs", choices=list(TEXT_KINDS))
    ap.add_argument("--chunks", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-files", type=int, default=None, help="max_files of each _fold call (default: its own)")
    ap.add_argument("variants", nargs="+", help="NAME=REV:PATH[,PATH] or NAME=.")
    args = ap.parse_args(argv)
    specs = dict(v.split("=", 1) for v in args.variants)
    paths = sorted({p for s in specs.values() if s != "." for p in s.partition(":")[2].split(",")})
    sqls = {k: variant_sql(s, paths) for k, s in specs.items()}
    cfg = Config(chunks=args.chunks)
    chunks = TEXT_KINDS[args.text][1](cfg)
    words = sum(len(c.content.split()) for c in chunks)
    print(f"{args.text}: {len(chunks):,} chunks, {words / 1e6:.2f}M words; variants {specs}", flush=True)
    secs: dict[str, list[float]] = {k: [] for k in specs}
    floor: list[float] = []
    digests: dict[str, set[str]] = {k: set() for k in specs}
    steps: dict[str, dict[str, float]] = {}
    with harness.server() as admin_dsn:
        db = harness.create_database(admin_dsn, prefix="foldab")
        dsn = harness.with_db(admin_dsn, db)
        try:
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                conn.execute("SET track_functions = 'pl'")
                tables = Tables(conn)
                name = tables.create(True)
                sid = conn.execute("SELECT id FROM storetopics.sources WHERE chunks = %s::regclass",
                                   (name,)).fetchone()[0]
                copy_load(conn, name, copy_batches(chunks, cfg.copy_batch))
                conn.execute(f"VACUUM ANALYZE {name}")
                names = list(specs)
                for r in range(args.rounds):
                    for k in (names if r % 2 == 0 else names[::-1]):
                        conn.execute(sqls[k])
                        conn.execute("SELECT storetopics._regenerate(%s, true)", (sid,))
                        conn.execute("SELECT storetopics.resync(%s)", (name,))
                        conn.execute("VACUUM ANALYZE storetopics.pending, storetopics.file_terms, "
                                     "storetopics.store_terms, storetopics.store_state")
                        settle(conn)
                        conn.execute("SELECT pg_stat_reset()")
                        t0 = time.perf_counter()
                        q = ("SELECT storetopics._fold(%s)" if args.max_files is None
                             else "SELECT storetopics._fold(%s, %s)")
                        p = (sid,) if args.max_files is None else (sid, args.max_files)
                        while conn.execute(q, p).fetchone()[0] > 0:
                            pass
                        secs[k].append(time.perf_counter() - t0)
                        time.sleep(0.6)   # the statistics collector
                        steps[k] = dict(conn.execute(
                            "SELECT funcname, round(self_time::numeric / 1000, 2) FROM pg_stat_user_functions "
                            "WHERE self_time > 100 ORDER BY self_time DESC"
                        ).fetchall())
                        digests[k].add(conn.execute(DIGEST, {"sid": sid}).fetchone()[0])
                        settle(conn)
                        with conn.transaction():
                            for s, v in {"parallel_setup_cost": "0", "parallel_tuple_cost": "0",
                                         "min_parallel_table_scan_size": "0", "jit": "off",
                                         "work_mem": "128MB"}.items():
                                conn.execute("SELECT set_config(%s, %s, true)", (s, v))
                            t0 = time.perf_counter()
                            conn.execute(FLOOR.format(t=name)).fetchone()
                            floor.append(time.perf_counter() - t0)
                        print(f"  round {r + 1} {k}: fold {secs[k][-1]:.2f} s, floor {floor[-1]:.2f} s", flush=True)
                tables.drop(name)
        finally:
            harness.drop_database(admin_dsn, db)
    f = statistics.median(floor)
    print(f"floor_counts: median {f:.2f} s ({words / f / 1e6:.2f} M words/s) of {len(floor)}")
    for k in specs:
        s = statistics.median(secs[k])
        print(f"{k}: fold median {s:.2f} s ({words / s / 1e6:.2f} M words/s), fold/floor {f / s:.3f}; "
              f"runs {', '.join(f'{x:.2f}' for x in secs[k])}")
        print(f"   self time (ms) of the last fold: {steps[k]}")
    all_digests = set().union(*digests.values())
    print("state identical across variants and rounds" if len(all_digests) == 1
          else f"STATE DIFFERS: {digests}")
    return 0 if len(all_digests) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
