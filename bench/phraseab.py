"""Phrase mining A/B: storetopics._mine_phrases of two SQL versions on the same store and the same input (each
cluster's 20 most committed files and its words, as storetopics._cluster_phrases gives them), interleaved in one
run; every version must return the same rows.

    .venv/bin/python -m bench.phraseab --chunks 30000 --rounds 3 A=main B=.
        # A: sql/idempotent/065-phrases.sql as of git revision `main`; B: the working tree's

One source of realistic text (bench.doctext: 200-300-word windows of real manuals), 3 chunks per file around 20
vector centres, one store, backfilled inside Postgres (clustered through plpython3u).  Each version's
_mine_phrases is created under its own name; each round times every version once (ABBA order).  Prints the
medians and their ratio.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time

import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from bench import clusters as bc
from bench.doctext import DocTexts
from bench.run import REPO
from storetopics import install as st_install
from tests import harness

PATH = "sql/idempotent/065-phrases.sql"
FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION storetopics\._mine_phrases\(.*?END \$\$;", re.S)

# _cluster_phrases' input: the clusters' words with their weights, each cluster's 20 most committed files
INPUT = """
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_object('grp', w.grp, 'lexeme', w.lexeme, 'weight', w.weight)
                                  ORDER BY w.grp, w.lexeme), '[]')
          FROM (SELECT k.cluster_id AS grp, l.lexeme, max(1.0 / (1 + u.i / 3.0)) AS weight
                  FROM storetopics.clusters k, unnest(k.keywords[1:15]) WITH ORDINALITY AS u(w, i),
                       LATERAL unnest(tsvector_to_array(to_tsvector(s.ts_config, u.w))) AS l(lexeme)
                 WHERE k.source_id = s.id AND k.store_key = %(store)s AND k.chunks > 0 GROUP BY 1, 2) w),
       (SELECT coalesce(jsonb_agg(jsonb_build_object('grp', x.grp, 'file_key', x.file_key)
                                  ORDER BY x.grp, x.file_key), '[]')
          FROM (SELECT u.cluster_id AS grp, c.file_key,
                       row_number() OVER (PARTITION BY u.cluster_id
                                          ORDER BY u.n::float8 / greatest(c.chunks, 1) DESC, hashtext(c.file_key),
                                                   c.file_key) AS r
                  FROM storetopics.file_clusters c, unnest(c.cluster_ids, c.cluster_chunks) AS u(cluster_id, n)
                 WHERE c.source_id = s.id AND c.store_key = %(store)s) x
         WHERE x.r <= 20)
  FROM storetopics.sources s WHERE s.id = %(source)s"""


def version_sql(name: str, rev: str) -> str:
    text = ((REPO / PATH).read_text() if rev == "." else
            subprocess.run(["git", "show", f"{rev}:{PATH}"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout)
    m = FUNCTION.search(text)
    if not m:
        raise SystemExit(f"phraseab: no storetopics._mine_phrases in {rev}:{PATH}")
    return m.group(0).replace("storetopics._mine_phrases(", f"storetopics._mine_phrases_{name}(", 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.phraseab")
    ap.add_argument("--chunks", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("variants", nargs="+", help="NAME=REV (065-phrases.sql as of git revision REV; . : the working tree)")
    args = ap.parse_args(argv)
    specs = dict(v.split("=", 1) for v in args.variants)
    if not all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in specs):
        raise SystemExit("phraseab: variant names are lower-case identifiers")
    sqls = {k: version_sql(k, rev) for k, rev in specs.items()}
    secs: dict[str, list[float]] = {k: [] for k in specs}
    results: dict[str, set] = {k: set() for k in specs}
    with harness.server() as admin_dsn:
        db = harness.create_database(admin_dsn, prefix="phraseab")
        dsn = harness.with_db(admin_dsn, db)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                register_vector(conn)
                bc.create_table(conn, "docs")
                source = conn.execute("SELECT storetopics.attach('docs', 'store', 'file', 'content', 'embedding')"
                                      ).fetchone()[0]
                synth = bc.Synth(seed=1, per_file=3, store_of=lambda f: ["big"] * len(f), text_of=DocTexts(1))
                for s in range(0, args.chunks, 9000):
                    bc.copy_rows(conn, "docs", list(synth.rows(s, min(9000, args.chunks - s))))
                t0 = time.perf_counter()
                conn.execute("SELECT * FROM storetopics.backfill()").fetchall()
                print(f"{args.chunks:,} chunks backfilled in {time.perf_counter() - t0:.1f} s", flush=True)
                words, files = conn.execute(INPUT, {"store": "big", "source": source}).fetchone()
                print(f"store big: {len(files)} files mined in {len({f['grp'] for f in files})} clusters",
                      flush=True)
                for sql in sqls.values():
                    conn.execute(sql)
                names = list(specs)
                for r in range(args.rounds):
                    for k in (names if r % 2 == 0 else names[::-1]):
                        t0 = time.perf_counter()
                        rows = conn.execute(f"SELECT * FROM storetopics._mine_phrases_{k}(%s, 'big', %s, %s)",
                                            (source, Jsonb(files), Jsonb(words))).fetchall()
                        secs[k].append(time.perf_counter() - t0)
                        results[k].add(hash(frozenset(rows)))
                        print(f"  round {r + 1} {k}: {secs[k][-1]:.2f} s, {len(rows):,} rows", flush=True)
        finally:
            harness.drop_database(admin_dsn, db)
    base = statistics.median(secs[names[0]])
    for k in names:
        m = statistics.median(secs[k])
        print(f"{k} ({specs[k]}): median {m:.2f} s, {m / base:.3f}x of {names[0]}; runs "
              + ", ".join(f"{x:.2f}" for x in secs[k]))
    same = len(set().union(*results.values())) == 1
    print("same rows from every version and round" if same else "ROWS DIFFER between versions")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
