"""The real Postgres the evaluated stores live in: a throwaway cluster (tests.harness.server, like the tests
and `make bench`) or an existing server ($STORETOPICS_TEST_DSN), a fresh database with vector + storetopics, and
chunk tables attached with storetopics.attach and summarised with the CLI's backfill (fold + render)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import psycopg

from storetopics import api
from storetopics import install as st_install
from tests import harness


@contextlib.contextmanager
def database(log=print) -> Iterator[str]:
    """Yields the DSN of a new database with vector and storetopics installed; dropped afterwards."""
    with harness.server() as admin:
        name = harness.create_database(admin, prefix="eval")
        dsn = harness.with_db(admin, name)
        try:
            try:
                st_install.install(dsn, extension=True, log=lambda *a: None)
                how = "extension"
            except psycopg.Error as e:  # extension files not installed on this server: the same SQL as a script
                log(f"  CREATE EXTENSION storetopics failed ({e.diag.message_primary}); installing the SQL script")
                st_install.install(dsn, log=lambda *a: None)
                how = "script"
            log(f"  storetopics installed ({how}) in database {name}")
            yield dsn
        finally:
            harness.drop_database(admin, name)


def connect(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET client_min_messages = warning")
    return conn


def create_chunks(conn: psycopg.Connection, table: str, dim: int) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"""CREATE TABLE {table} (id bigserial PRIMARY KEY, store text NOT NULL, file text NOT NULL,
                                           content text NOT NULL, embedding vector({dim}))""")
    conn.execute(f"CREATE INDEX ON {table} (file)")


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v.tolist()) + "]"


def insert(conn: psycopg.Connection, table: str, rows: Iterable[tuple[str, str, str, np.ndarray | None]]) -> int:
    """COPY (store, file, content, embedding) rows in; returns the number of rows."""
    n = 0
    with conn.transaction(), conn.cursor() as cur:
        with cur.copy(f"COPY {table} (store, file, content, embedding) FROM STDIN") as copy:
            for store, file, content, vec in rows:
                copy.write_row((store, file, content, None if vec is None else _vec(vec)))
                n += 1
    return n


# Settings applied with storetopics.configure() right after each attach (None: the extension's defaults, which
# is what the evaluation measures; the tests shrink the K search to stay fast).
ATTACH_SETTINGS: dict | None = None


def attach(conn: psycopg.Connection, table: str) -> int:
    source = api.attach(conn, table, store_key="store", file_key="file", content="content", embedding="embedding")
    if ATTACH_SETTINGS:
        import json
        conn.execute("SELECT storetopics.configure(%s::regclass, %s::jsonb)", (table, json.dumps(ATTACH_SETTINGS)))
    return source


def refresh(conn: psycopg.Connection) -> float:
    """Bring every summary up to date the way the CLI does (fold + render); returns seconds."""
    t0 = time.perf_counter()
    api.backfill(conn)
    return time.perf_counter() - t0


def stores(conn: psycopg.Connection, table: str) -> dict[str, dict]:
    rows = conn.execute("SELECT store_key, files, chunks, store_topics, topics, dirty FROM storetopics.stores "
                        "WHERE source = %s::regclass ORDER BY store_key", (table,)).fetchall()
    return {r[0]: {"files": r[1], "chunks": r[2], "store_topics": r[3], "topics": r[4], "dirty": r[5]}
            for r in rows}


def delete_files(conn: psycopg.Connection, table: str, store: str, files: Sequence[str]) -> int:
    return conn.execute(f"DELETE FROM {table} WHERE store = %s AND file = ANY(%s)", (store, list(files))).rowcount


def lexemes(conn: psycopg.Connection, text: str | None, cfg: str = "english") -> set[str]:
    """The text's lexemes as Postgres's text search sees them (stemmed, no stopwords)."""
    if not text:
        return set()
    row = conn.execute("SELECT tsvector_to_array(to_tsvector(%s::regconfig, %s))", (cfg, text)).fetchone()
    return set(row[0] or [])


def server_info(conn: psycopg.Connection) -> dict:
    return {
        "server_version": conn.execute("SHOW server_version").fetchone()[0],
        "vector": (conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
                   or [None])[0],
        "storetopics": (conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()
                        or [None])[0],
    }


def lexeme_counts(conn: psycopg.Connection, texts: Sequence[str], cfg: str = "english") -> list[dict[str, int]]:
    """Per text, its lexemes and how often each occurs (positions in its tsvector), as `lexemes` sees them."""
    out: list[dict[str, int]] = [{} for _ in texts]
    rows = conn.execute("SELECT t.i, v.lexeme, cardinality(v.positions) FROM unnest(%s::text[]) WITH ORDINALITY "
                        "AS t(txt, i), unnest(to_tsvector(%s::regconfig, t.txt)) AS v", (list(texts), cfg))
    for i, lexeme, n in rows:
        out[i - 1][lexeme] = n
    return out
