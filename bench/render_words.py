"""Render after a one-file upload on a realistic store (issue 33): `_refresh_words` + `_render` of `big`, two
versions of the words' SQL side by side, interleaved on one store.

    python -m bench.render_words build --dir /tmp/rw [--chunks 100000]   # a kept cluster with the store (untimed)
    python -m bench.render_words ab --dir /tmp/rw --base HEAD~1 [--rounds 6]
    python -m bench.render_words stop --dir /tmp/rw

The store: bench.doctext's texts (200-300-word windows of real manuals), 3 chunks per file, 94% of the files in
`big` and 2% in each of three small stores; folded, fitted, its words refreshed and rendered.  `ab` loads, per
trial, either the words' functions (060-clusters, 065-phrases, 070-summary) as they are at --base (A) or as they
are in the work tree (B), uploads one file of 3 chunks to `big`, folds it, and times _refresh_words and _render
of `big`; A and B alternate (ABBA...).  After each B trial the clusters' words and phrases are computed again from
scratch with A and compared.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench import clusters as bc
from bench.doctext import DocTexts
from lab.localpg import LocalPostgres
from storetopics import install as st_install

REPO = Path(__file__).resolve().parents[1]
PER_FILE = 3
WORDS_SQL = ("sql/idempotent/060-clusters.sql", "sql/idempotent/065-phrases.sql", "sql/idempotent/070-summary.sql")


def store_of(file_ids: np.ndarray) -> list[str]:
    h = (file_ids // bc.CENTRES) % 50
    return ["big" if x < 47 else f"small{x - 47}" for x in h.tolist()]


def connect(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET client_min_messages = warning")
    register_vector(conn)
    return conn


def server(where: Path) -> LocalPostgres:
    pg = LocalPostgres(where / "data")
    pg.start()
    return pg


def fold(conn, source: int) -> None:
    while conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]:
        pass


def build(where: Path, chunks: int) -> None:
    pg = server(where)
    admin = pg.dsn()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS words WITH (FORCE)")
        c.execute("CREATE DATABASE words")
    dsn = psycopg.conninfo.make_conninfo(admin, dbname="words")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION vector")
        c.execute("CREATE EXTENSION plpython3u")
    st_install.install(dsn, extension=True, log=lambda *a: None)
    texts = DocTexts(seed=1)
    synth = bc.Synth(seed=1, per_file=PER_FILE, store_of=store_of, text_of=texts)
    t0 = time.perf_counter()
    with connect(dsn) as conn:
        bc.create_table(conn, "docs")
        conn.execute("CREATE INDEX ON docs (file)")
        source = conn.execute("SELECT storetopics.attach('docs', 'store', 'file', 'content', 'embedding')").fetchone()[0]
        for start in range(0, chunks, 30_000):
            bc.copy_rows(conn, "docs", synth.rows(start, min(30_000, chunks - start)))
        conn.execute("VACUUM ANALYZE docs")
        print(f"loaded {chunks:,} chunks [{time.perf_counter() - t0:.0f}s]", flush=True)
        fold(conn, source)
        print(f"folded [{time.perf_counter() - t0:.0f}s]", flush=True)
        for (store,) in conn.execute("SELECT store_key FROM storetopics._stores_due(%s) WHERE fit IS NOT NULL "
                                     "ORDER BY store_key", (source,)).fetchall():
            rep = conn.execute("SELECT storetopics._cluster(%s, %s)", (source, store)).fetchone()[0]
            print(f"fit {store}: k={rep.get('k')} [{time.perf_counter() - t0:.0f}s]", flush=True)
        stores = [r[0] for r in conn.execute("SELECT store_key FROM storetopics.store_state ORDER BY 1")]
        for s in stores:
            conn.execute("SELECT storetopics._refresh_words(%s, %s)", (source, s))
            conn.execute("SELECT storetopics._render(%s, %s)", (source, s))
        print(f"words and renders [{time.perf_counter() - t0:.0f}s]", flush=True)
        meta = {"source": source, "next_id": chunks, "dsn": dsn}
        (where / "bench.json").write_text(json.dumps(meta))
        print(conn.execute("SELECT store_key, files, chunks, fit_k FROM storetopics.store_state ORDER BY 1").fetchall())


def words_sql(base: str | None) -> str:
    if base is None:
        return "\n".join((REPO / f).read_text() for f in WORDS_SQL)
    return "\n".join(subprocess.run(["git", "-C", str(REPO), "show", f"{base}:{f}"], check=True, capture_output=True,
                                    text=True).stdout for f in WORDS_SQL)


PARTS = ("_cluster_keywords", "_cluster_phrases", "_mine_phrases", "_learn_words", "_keywords", "_contrast_terms")


def timed(conn, sql: str, params) -> str:
    """Runs sql in a transaction (track_functions = 'pl'); returns the time spent in PARTS (ms, as the functions'
    total times in the transaction, nested calls included)."""
    conn.execute("SET track_functions = 'pl'")
    with conn.transaction():
        conn.execute(sql, params)
        rows = conn.execute("SELECT p.proname, pg_stat_get_xact_function_total_time(p.oid) FROM pg_proc p "
                            "WHERE p.pronamespace = 'storetopics'::regnamespace AND p.proname = ANY (%s)",
                            (list(PARTS),)).fetchall()
    return " ".join(f"{n[1:]} {t:.0f}" for n, t in sorted(rows, key=lambda r: PARTS.index(r[0])) if t)


def snapshot(conn, source: int):
    return conn.execute("SELECT cluster_id, keywords, phrase, label_needed FROM storetopics.clusters "
                        "WHERE source_id = %s AND store_key = 'big' ORDER BY cluster_id", (source,)).fetchall()


def ab(where: Path, base: str, rounds: int) -> None:
    server(where)
    meta = json.loads((where / "bench.json").read_text())
    source, dsn = meta["source"], meta["dsn"]
    sql = {"A": words_sql(base), "B": words_sql(None)}
    incr = sorted((REPO / "sql" / "incremental" / "0.2").glob("012-*.sql"))
    texts = DocTexts(seed=99)
    synth = bc.Synth(seed=99, per_file=PER_FILE, store_of=lambda ids: ["big"] * len(ids), text_of=texts)
    times: dict = {"A": [], "B": []}
    mismatches = 0
    with connect(dsn) as conn:
        for f in incr:     # the new column(s), when the work tree adds them
            try:
                conn.execute(f.read_text())
            except psycopg.errors.DuplicateColumn:
                pass
        order = "".join("AB" if i % 2 == 0 else "BA" for i in range(rounds))
        for variant in order:
            conn.execute(sql[variant])
            start = meta["next_id"]
            rows = list(synth.rows(start, PER_FILE))
            rows = [(i, s, f"u{start}", t, v) for i, s, _, t, v in rows]
            bc.copy_rows(conn, "docs", rows)
            meta["next_id"] = start + PER_FILE
            fold(conn, source)
            t0 = time.perf_counter()
            parts = timed(conn, "SELECT storetopics._refresh_words(%s, 'big')", (source,))
            t1 = time.perf_counter()
            parts2 = timed(conn, "SELECT storetopics._render(%s, 'big')", (source,))
            t2 = time.perf_counter()
            times[variant].append((t1 - t0, t2 - t1))
            line = (f"{variant} file u{start}: refresh_words {t1 - t0:6.3f}s ({parts}) render {t2 - t1:6.3f}s "
                    f"({parts2})")
            if variant == "B":    # the same state computed from scratch by A
                got = snapshot(conn, source)
                conn.execute(sql["A"])
                conn.execute("UPDATE storetopics.store_state SET words_version = 0, cluster_phrases_from = NULL "
                             "WHERE source_id = %s AND store_key = 'big'", (source,))
                conn.execute("SELECT storetopics._refresh_words(%s, 'big')", (source,))
                same = snapshot(conn, source) == got
                mismatches += not same
                line += "  (= from scratch)" if same else "  MISMATCH with a from-scratch computation"
            print(line, flush=True)
    (where / "bench.json").write_text(json.dumps(meta))
    for v in "AB":
        rw = [t[0] for t in times[v]]
        rd = [t[1] for t in times[v]]
        print(f"{v}: refresh_words median {statistics.median(rw):.3f}s (min {min(rw):.3f}, max {max(rw):.3f}); "
              f"render median {statistics.median(rd):.3f}s (min {min(rd):.3f}, max {max(rd):.3f}); n={len(rw)}")
    print(f"mismatches: {mismatches}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.render_words")
    ap.add_argument("what", choices=("build", "ab", "stop"))
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.what == "build":
        build(args.dir, args.chunks)
    elif args.what == "ab":
        ab(args.dir, args.base, args.rounds)
    else:
        LocalPostgres(args.dir / "data").stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
