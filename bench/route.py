"""How fast storetopics.route() answers: a synthetic catalog of 1,000 stores x 30 clusters of 384-d centroids
(30,000 centroids, 10 sources of 100 stores), 300 query embeddings (half near a cluster, half anywhere), each
route() timed from the client (one round trip over the unix socket included), after a warm-up.  Also
route_text() (the same stores with 300 terms each from a 5,000-word vocabulary, 20-word queries) and catalog(), and
the floor of any plain scan: `SELECT sum(centroid <#> q) FROM storetopics.clusters` (one inner product per centroid).

    .venv/bin/python -m bench.route [--stores 1000] [--clusters 30] [--dim 384] [--queries 300]

Prints p50/p95/max per function, as the superuser and as a role granted reading every source (grant_read: the
visibility rule is applied per source).  Nothing is written to bench/results.  The server is a throwaway cluster
(tests.harness.server) or $STORETOPICS_TEST_DSN's server, as in `make bench`.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid

import numpy as np
import psycopg
from psycopg import conninfo

from storetopics import install as st_install
from tests import harness

SOURCES = 10


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v.tolist()) + "]"


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


def build(conn: psycopg.Connection, stores: int, clusters: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """The synthetic catalog, written straight into storetopics' tables (as fold and a fit would leave them);
    returns the centroids (stores x clusters x dim)."""
    per_source = stores // SOURCES
    centres = _unit(rng.normal(size=(stores, dim)))
    cents = _unit(centres[:, None, :] + 0.6 * rng.normal(size=(stores, clusters, dim)) / np.sqrt(dim) * 4)
    vocab = [f"w{i:04d}" for i in range(5000)]
    conn.execute("INSERT INTO storetopics.lexemes (lexeme) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING", (vocab,))
    ids = dict(conn.execute("SELECT lexeme, id FROM storetopics.lexemes WHERE lexeme = ANY(%s)", (vocab,)).fetchall())
    for s in range(SOURCES):
        table = f"bench_route_{s}"
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, store text, file text, content text, "
                     f"embedding vector({dim}))")
        conn.execute(f"CREATE INDEX ON {table} (file)")
        src = conn.execute("SELECT storetopics.attach(%s, store_key => 'store', file_key => 'file', "
                           "content => 'content', embedding => 'embedding')", (table,)).fetchone()[0]
        with conn.cursor() as cur:
            for j in range(per_source):
                g = s * per_source + j
                key = f"store-{g:04d}"
                cur.execute("INSERT INTO storetopics.store_state (source_id, store_key, files, chunks, words, "
                            "store_topics, updated_at) VALUES (%s, %s, 100, 1000, 30000, %s, now())",
                            (src, key, f"Topics: topic {g}, subject {g}. {g} files."))
                with cur.copy("COPY storetopics.clusters (source_id, store_key, centroid, radius, chunks, files, "
                              "fit_size, keywords) FROM STDIN") as cp:
                    for c in range(clusters):
                        cp.write_row((src, key, _vec(cents[g, c]), 0.3, int(rng.integers(5, 200)), 10, 50,
                                      [f"word{c}", f"term{g}"]))
                terms = rng.choice(len(vocab), size=300, replace=False)
                with cur.copy("COPY storetopics.store_terms (source_id, store_key, term_id, files, total, total_sq) "
                              "FROM STDIN") as cp:
                    for t in terms:
                        n = int(rng.integers(1, 100))
                        cp.write_row((src, key, ids[vocab[t]], max(1, n // 3), n, n * 2))
    conn.execute("ANALYZE storetopics.clusters")
    conn.execute("ANALYZE storetopics.store_state")
    conn.execute("ANALYZE storetopics.store_terms")
    return cents


def timed(conn: psycopg.Connection, sql: str, args_list: list[tuple], warmup: int = 20) -> list[float]:
    for a in args_list[:warmup]:
        conn.execute(sql, a).fetchall()
    out = []
    for a in args_list:
        t = time.perf_counter()
        conn.execute(sql, a).fetchall()
        out.append(1000 * (time.perf_counter() - t))
    return out


def pct(ts: list[float], p: float) -> float:
    return float(np.percentile(ts, p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.route", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stores", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=30)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dsn", help="an existing server's admin DSN instead of a throwaway cluster")
    ap.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    args = ap.parse_args(argv)
    if args.stores % SOURCES:
        ap.error(f"--stores must be a multiple of {SOURCES}")
    rng = np.random.default_rng(args.seed)
    with (contextlib.nullcontext(args.dsn) if args.dsn else harness.server()) as admin:
        name = harness.create_database(admin, prefix="bench_route")
        dsn = harness.with_db(admin, name)
        reader = f"bench_router_{uuid.uuid4().hex[:6]}"
        try:
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                t0 = time.perf_counter()
                cents = build(conn, args.stores, args.clusters, args.dim, rng)
                n_cent = conn.execute("SELECT count(*) FROM storetopics.clusters").fetchone()[0]
                print(f"catalog: {args.stores:,} stores x {args.clusters} clusters = {n_cent:,} centroids of "
                      f"{args.dim} dimensions, {SOURCES} sources (built in {time.perf_counter() - t0:.0f} s)")
                conn.execute(f"CREATE ROLE {reader} LOGIN")
                conn.execute("SELECT storetopics.grant_read(%s)", (reader,))
                server = conn.execute("SHOW server_version").fetchone()[0]
            half = args.queries // 2
            flat = cents.reshape(-1, args.dim)
            near = _unit(flat[rng.integers(0, len(flat), half)] + 0.05 * rng.normal(size=(half, args.dim)))
            anywhere = _unit(rng.normal(size=(args.queries - half, args.dim)))
            queries = [(_vec(v),) for v in np.vstack([near, anywhere])]
            rng.shuffle(queries)
            vocab = [f"w{i:04d}" for i in range(5000)]
            texts = [(" ".join(rng.choice(vocab, 20)),) for _ in range(args.queries)]
            rows = []
            for who, role in (("superuser", None), ("reader of every source", reader)):
                bare = role is None
                with psycopg.connect(conninfo.make_conninfo(dsn, user=role) if role else dsn, autocommit=True) as c:
                    c.execute("SET client_min_messages = warning")
                    got = c.execute("SELECT count(*) FROM storetopics.route(%s::vector, 3)", queries[0]).fetchone()[0]
                    assert got == 3, got
                    for label, sql, a in (
                            ("route(q, 3)", "SELECT * FROM storetopics.route(%s::vector, 3)", queries),
                            # the floor a plain scan has: one inner product per centroid, nothing else
                            ("bare scan", "SELECT sum(centroid <#> %s::vector) FROM storetopics.clusters", queries),
                            ("route_text(q, 3)", "SELECT * FROM storetopics.route_text(%s, 3)", texts),
                            ("catalog()", "SELECT * FROM storetopics.catalog()", [()] * min(50, args.queries))):
                        if label == "bare scan" and not bare:
                            continue   # (the reader may not read the clusters table)
                        ts = timed(c, sql, a)
                        rows.append((who, label, len(ts), statistics.median(ts), pct(ts, 95), max(ts)))
            print(f"PostgreSQL {server}; times in ms from the client (round trip included), after 20 warm-up calls\n")
            print(f"{'caller':24s} {'call':18s} {'n':>5s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s}")
            for who, label, n, p50, p95, mx in rows:
                print(f"{who:24s} {label:18s} {n:5d} {p50:8.2f} {p95:8.2f} {mx:8.2f}")
        finally:
            if args.keep:
                print(f"kept database {name} (role {reader})")
            else:
                harness.drop_database(admin, name)
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f"DROP ROLE IF EXISTS {reader}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
