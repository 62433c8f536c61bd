"""`make demo`: storetopics on real text, in an embedded Postgres kept under .pgdata/.

Debian's package descriptions (data/debian/descriptions.jsonl.gz) become data stores: one store per archive
section, one file per package, one chunk per paragraph.  The demo attaches the chunk table, builds every store's
summary with the CLI backfill, then adds one package from a distant section to one store, shows which words it
brings into that store's summary, deletes it again and checks the summary comes back byte for byte.

    python -m lab.demo            # what `make demo` runs
    python -m lab.demo --dsn DSN  # use an existing database (vector + storetopics installable) instead
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import numpy as np
import psycopg
from psycopg import sql

from storetopics import api, cli
from storetopics import install as st_install

from .localpg import LocalPostgres

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "debian" / "descriptions.jsonl.gz"
# all-MiniLM-L6-v2 vectors of every demo chunk, made once by scripts/demo_embeddings.py (int8, scale 127), so the
# demo clusters real embeddings without shipping a model: what an application would have stored.
EMBEDDINGS = REPO / "data" / "debian" / "demo-embeddings.npz"
PGDATA = REPO / ".pgdata" / "data"
DBNAME = "storetopics_demo"
TABLE = "demo_chunks"
STORES = ("games", "science", "sound", "graphics", "math", "web", "mail", "editors")
# The one distinctive file: a Debian package from a section that is none of the stores, put into the games store.
EXTRA_STORE = "games"
EXTRA_SECTION = "text"
EXTRA_PACKAGE = "printer-driver-oki"

RULE = "=" * 78


# ------------------------------------------------------------------------------------------------------------
# The corpus
# ------------------------------------------------------------------------------------------------------------
def read_corpus(sections: Iterable[str], path: Path = CORPUS) -> dict[str, list[dict]]:
    """section -> its records, in file order (sorted by package)."""
    wanted = set(sections)
    out: dict[str, list[dict]] = {s: [] for s in wanted}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["section"] in wanted:
                out[rec["section"]].append(rec)
    return out


def chunks_of(rec: dict) -> list[str]:
    """A package's chunks: its one-line synopsis, then each paragraph of its long description."""
    paragraphs = [" ".join(p.split()) for p in rec["long"].split("\n\n")]
    return [rec["short"].strip()] + [p for p in paragraphs if p]


# ------------------------------------------------------------------------------------------------------------
# Database steps
# ------------------------------------------------------------------------------------------------------------
def _sql_fingerprint() -> str:
    h = hashlib.sha256()
    for p in sorted((REPO / "sql").glob("storetopics--*.sql")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def ensure_database(admin_dsn: str, name: str) -> bool:
    """Create the database if missing; returns True if it was created."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


def ensure_extensions(dsn: str) -> str:
    """vector + storetopics as an extension.  The extension is recreated when its SQL changed since the last run
    (the version number stays 0.1 while it is being developed).  Returns a one-line description."""
    fingerprint = _sql_fingerprint()
    note = ""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        seen = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                            "WHERE datname = current_database()").fetchone()[0] or ""
        has_ext = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'storetopics'").fetchone()
        if has_ext and seen != f"storetopics-sql {fingerprint}":
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
            conn.execute("DROP EXTENSION storetopics CASCADE")
            note = " (reinstalled: the extension SQL changed since the last run)"
    version = st_install.install(dsn, extension=True, log=lambda *a: None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(
            sql.Identifier(conn.info.dbname), sql.Literal(f"storetopics-sql {fingerprint}")))
        vector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
    return f"vector {vector}, storetopics {version}{note}"


def recreate_table(conn: psycopg.Connection) -> None:
    """Detach and drop the demo table if it is there, then create it empty: reruns start from the same state."""
    with conn.transaction():
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,)).fetchone()[0]:
            conn.execute("SELECT storetopics.detach(%s::regclass)", (TABLE,))
        # Sources whose table was dropped without detach (e.g. by hand) would make every backfill fail.  (The
        # upgrade test loads this table into a 0.1 database, which has no detach_dropped().)
        if conn.execute("SELECT to_regprocedure('storetopics.detach_dropped()') IS NOT NULL").fetchone()[0]:
            conn.execute("SELECT * FROM storetopics.detach_dropped()")
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"""CREATE TABLE {TABLE} (
                           id bigserial PRIMARY KEY,
                           store text NOT NULL,
                           file text NOT NULL,
                           content text NOT NULL,
                           embedding vector(384))""")
        conn.execute(f"CREATE INDEX ON {TABLE} (file)")


def read_embeddings(path: Path = EMBEDDINGS) -> dict[tuple[str, int], tuple[bytes, np.ndarray]]:
    """(package, chunk index) -> (sha1 of the chunk's text, int8 vector).  Empty if the file is missing."""
    if not path.exists():
        return {}
    z = np.load(path)
    return {(str(p), int(i)): (bytes(h), e) for p, i, h, e in zip(z["package"], z["chunk"], z["sha1"], z["emb"])}


def vector_text(rec: dict, i: int, text: str, embeddings: dict) -> str | None:
    """The chunk's vector as pgvector text, if the shipped file has it for this very text."""
    hit = embeddings.get((rec["package"], i))
    if hit is None or hit[0] != hashlib.sha1(text.encode("utf-8")).hexdigest().encode():
        return None
    return "[" + ",".join(f"{x / 127:.4f}" for x in hit[1].tolist()) + "]"


def load(conn: psycopg.Connection, store: str, records: Iterable[dict], embeddings: dict) -> tuple[int, int, int]:
    files = chunks = vectors = 0
    with conn.transaction(), conn.cursor() as cur:
        with cur.copy(f"COPY {TABLE} (store, file, content, embedding) FROM STDIN") as copy:
            for rec in records:
                files += 1
                for i, text in enumerate(chunks_of(rec)):
                    v = vector_text(rec, i, text, embeddings)
                    copy.write_row((store, rec["package"], text, v))
                    chunks += 1
                    vectors += v is not None
    return files, chunks, vectors


def summaries(conn: psycopg.Connection) -> dict[str, dict]:
    rows = conn.execute("SELECT store_key, files, chunks, store_topics, topics FROM storetopics.stores "
                        "WHERE source = %s::regclass ORDER BY store_key", (TABLE,)).fetchall()
    return {r[0]: {"files": r[1], "chunks": r[2], "text": r[3], "topics": r[4]} for r in rows}


# ------------------------------------------------------------------------------------------------------------
# The demo
# ------------------------------------------------------------------------------------------------------------
class Printer:
    def __init__(self, out: TextIO, steps: int):
        self.out, self.steps, self.step = out, steps, 0

    def head(self, text: str) -> None:
        self.step += 1
        self.out.write(f"\n[{self.step}/{self.steps}] {text}\n")
        self.out.flush()

    def line(self, text: str = "", indent: int = 6) -> None:
        self.out.write((" " * indent + text if text else "") + "\n")
        self.out.flush()

    def para(self, text: str, indent: int = 6, width: int = 100) -> None:
        self.out.write(textwrap.fill(text, width, initial_indent=" " * indent, subsequent_indent=" " * indent,
                                     break_on_hyphens=False) + "\n")
        self.out.flush()


def store_table(sums: dict[str, dict], only: Iterable[str] | None = None) -> str:
    keys = list(only) if only is not None else list(sums)
    return cli.format_table(["store", "files", "chunks", "store_topics"],
                            [(k, sums[k]["files"], sums[k]["chunks"], sums[k]["text"]) for k in keys],
                            wrap={3: 84}, indent="      ")


def run_backfill(conn: psycopg.Connection, p: Printer, progress: bool) -> api.BackfillResult:
    sys.stdout.flush()
    res = api.backfill(conn, progress=cli.Bars(progress))
    sys.stderr.flush()
    p.line(cli.summary(res))
    return res


def run(dsn: str, *, stores: Iterable[str] = STORES, limit: int | None = None, extra_store: str = EXTRA_STORE,
        extra_section: str = EXTRA_SECTION, extra_package: str = EXTRA_PACKAGE, out: TextIO | None = None,
        progress: bool = True, steps: int = 4, printer: Printer | None = None) -> bool:
    """The demo proper, against a database where vector and storetopics are installed.  `limit` caps the packages
    per store (tests).  Returns True if the summary came back byte for byte."""
    out = out if out is not None else sys.stdout
    p = printer or Printer(out, steps)
    stores = list(stores)

    # -- load ------------------------------------------------------------------------------------------------
    p.head(f"Load the corpus: {len(stores)} Debian sections become {len(stores)} stores, one file per package")
    t0 = time.monotonic()
    corpus = read_corpus([*stores, extra_section])
    extra = next((r for r in corpus[extra_section] if r["package"] == extra_package), None)
    if extra is None:
        raise SystemExit(f"demo: package {extra_package!r} is not in section {extra_section!r} of {CORPUS}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        recreate_table(conn)
        embeddings = read_embeddings()
        total_files = total_chunks = total_vectors = 0
        for s in stores:
            files, chunks, vectors = load(conn, s, corpus[s][:limit] if limit else corpus[s], embeddings)
            total_files += files
            total_chunks += chunks
            total_vectors += vectors
        p.line(f"{TABLE}: {total_files:,} files, {total_chunks:,} chunks (short description + one chunk per "
               f"paragraph), {total_vectors:,} with all-MiniLM-L6-v2 embeddings  [{time.monotonic() - t0:.1f}s]")
        source_id = api.attach(conn, TABLE, store_key="store", file_key="file", content="content",
                               embedding="embedding")
        p.line(f"attached {TABLE} as source {source_id}: store_key => store, file_key => file, content => content")

        # -- build ---------------------------------------------------------------------------------------------
        p.head("Build every store's summary (storetopics backfill)")
        run_backfill(conn, p, progress)
        before = summaries(conn)
        p.line()
        out.write(store_table(before) + "\n")

        # -- add one distinctive file --------------------------------------------------------------------------
        target = extra_store
        p.head(f"Add one distinctive file to store {target!r}: Debian package {extra['package']!r} "
               f"from section {extra_section!r}")
        p.para(f"{extra['package']}: {extra['short']}")
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {TABLE} (store, file, content, embedding) VALUES (%s, %s, %s, %s)",
                            [(target, extra["package"], t, vector_text(extra, i, t, embeddings))
                             for i, t in enumerate(chunks_of(extra))])
        dirty = conn.execute("SELECT dirty FROM storetopics.stores WHERE source_id = %s AND store_key = %s",
                             (source_id, target)).fetchone()[0]
        p.line(f"inserted {len(chunks_of(extra))} chunks (the trigger logged the file; store {target!r} dirty: "
               f"{cli.fmt(dirty)})")
        run_backfill(conn, p, progress)
        added = summaries(conn)
        p.line()
        out.write(store_table(added, [target]) + "\n")
        old_terms = {d["term"] for d in (before[target]["topics"] or {}).get("distinctive", [])} | \
                    {d["term"] for d in (before[target]["topics"] or {}).get("dominant", [])}
        new = [d for d in (added[target]["topics"] or {}).get("distinctive", [])
               if d["term"] not in old_terms]
        from_file = [d["term"] for d in new if d.get("file") == extra["package"]]
        p.line()
        if new:
            p.line(f"new distinctive words in {target!r}: {', '.join(d['term'] for d in new)}")
            p.line(f"  of which from {extra['package']} itself (outlier file): "
                   f"{', '.join(from_file) if from_file else 'none'}")
        else:
            p.line(f"no new distinctive word surfaced in {target!r}")

        # -- delete it -----------------------------------------------------------------------------------------
        p.head(f"Delete that file again and check the summary of {target!r} comes back byte for byte")
        n = conn.execute(f"DELETE FROM {TABLE} WHERE store = %s AND file = %s",
                         (target, extra["package"])).rowcount
        p.line(f"deleted {n} chunks")
        run_backfill(conn, p, progress)
        after = summaries(conn)
        p.line()
        out.write(store_table(after, [target]) + "\n")
        same_text = after[target]["text"] == before[target]["text"]
        same_topics = after[target]["topics"] == before[target]["topics"]
        same_all = all(after[k]["text"] == before[k]["text"] for k in before) and after.keys() == before.keys()
        p.line()
        p.line(f"summary restored exactly: {'yes' if same_text else 'no'}")
        p.line(f"  structured topics (jsonb) identical: {'yes' if same_topics else 'no'}; "
               f"all {len(before)} stores identical: {'yes' if same_all else 'no'}")
        if not same_text:
            p.line(f"before: {before[target]['text']}")
            p.line(f"after:  {after[target]['text']}")
        surfaced = bool(from_file)
    return same_text and surfaced


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="use this database instead of the embedded one under .pgdata/")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    started = time.monotonic()
    out = sys.stdout
    p = Printer(out, 5)
    out.write(f"{RULE}\nstoretopics demo: what does each data store hold?  (Debian bookworm package descriptions)\n"
              f"{RULE}\n")
    try:
        p.head("Postgres")
        if args.dsn:
            dsn = args.dsn
            p.line(f"using {dsn}")
        else:
            pg = LocalPostgres(PGDATA)
            fresh = not pg.initialized
            was_running = not fresh and pg.running()
            t0 = time.monotonic()
            pg.start()
            pg.wait_ready()
            how = "initialised and started" if fresh else ("already running" if was_running else "started")
            p.line(f"embedded server {how}: {PGDATA.relative_to(REPO)} (unix socket {pg.sockdir.relative_to(REPO)}, "
                   f"port {pg.port})  [{time.monotonic() - t0:.1f}s]")
            created = ensure_database(pg.dsn(), DBNAME)
            dsn = pg.dsn(DBNAME)
            p.line(f"database {DBNAME}: {'created' if created else 'exists, reused'}")
            p.line("stop it with: " + " ".join([*pg._as_user, str(pg.bindir / "pg_ctl"), "-D", str(PGDATA), "stop"]))
        p.line(ensure_extensions(dsn))
        ok = run(dsn, out=out, progress=not args.no_progress, printer=p)
    except (psycopg.Error, api.StoretopicsError) as e:
        if isinstance(e, api.StoretopicsError):
            cli.report_error(e.message, e.hint)
        else:
            cli.report_error(e.diag.message_primary or str(e), e.diag.message_hint)
        return 1
    elapsed = time.monotonic() - started
    out.write(f"\n{RULE}\ndemo {'finished' if ok else 'FAILED'} in {elapsed:.1f}s\n{RULE}\n")
    if not args.dsn:
        out.write(f"explore it (the server keeps running):\n"
                  f"  .venv/bin/storetopics --dsn '{dsn}' status\n"
                  f"  .venv/bin/storetopics --dsn '{dsn}' show --store games\n"
                  f"  psql '{dsn}'\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
