"""The library API: what the CLI, the worker, the demo and the evaluation call.

    conn = api.connect(dsn)                     # autocommit: each fold, fit step and render commits on its own
    api.attach(conn, "public.chunks", store_key="store_id", file_key="file_id", embedding="embedding")
    result = api.backfill(conn)                 # fold, then one refresh pass per store with work due
    for row in api.stores(conn): print(row["store_key"], row["store_topics"])

Errors a user can act on are StoretopicsError (a message and a hint); errors from Postgres are psycopg's own.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import config, refresh
from .errors import StoretopicsError, Unavailable

__all__ = ["StoretopicsError", "Unavailable"]   # (and the functions below)
log = logging.getLogger("storetopics.api")


# ------------------------------------------------------------------------------------------------------------
# Connection
# ------------------------------------------------------------------------------------------------------------
def connect(dsn: str | None = None, application_name: str = "storetopics") -> psycopg.Connection:
    """An autocommit connection (every statement its own transaction; none is held open while a fit runs or an LLM
    call waits).  dsn None: $DATABASE_URL, else libpq's PG* variables."""
    try:
        conn = psycopg.connect(config.dsn() if dsn is None else dsn, autocommit=True,
                               application_name=application_name)
    except psycopg.OperationalError as e:
        raise StoretopicsError(f"could not connect: {' '.join(str(e).split())}", _connect_hint(dsn)) from None
    conn.execute("SET client_min_messages = warning")
    conn.add_notice_handler(_log_notice)
    return conn


def _connect_hint(dsn: str | None) -> str:
    """What to check, by where the connection string came from: --dsn (or the dsn argument), $DATABASE_URL (which the
    CLI's --dsn defaults to), or nowhere (libpq's PG* variables and defaults)."""
    env = os.environ.get("DATABASE_URL")
    server = "and that the server is running and accepts the connection"
    if env and dsn in (None, env):
        return f"check $DATABASE_URL (host, port, user, database; the password in PGPASSWORD or ~/.pgpass) {server}"
    if dsn:
        return (f"check the connection string given with --dsn (host, port, user, database; the password in "
                f"PGPASSWORD or ~/.pgpass) {server}")
    pg = [k for k in ("PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGDATABASE", "PGSERVICE") if os.environ.get(k)]
    if pg:
        return f"check the PG* environment variables ({', '.join(pg)}) {server}, or give --dsn"
    return "give --dsn, or set DATABASE_URL or the PG* environment variables (PGHOST, PGPORT, PGUSER, PGDATABASE)"


def _log_notice(diag: psycopg.errors.Diagnostic) -> None:
    """The server's warnings (attach: a file key with no index; backfill: a source skipped) reach the user's log."""
    text = diag.message_primary or ""
    if diag.message_hint:
        text += f" (hint: {diag.message_hint})"
    log.log(logging.WARNING if diag.severity_nonlocalized in ("WARNING", None) else logging.INFO, "%s", text)


def require_installed(conn: psycopg.Connection) -> None:
    if conn.execute("SELECT to_regclass('storetopics.sources') IS NULL").fetchone()[0]:
        raise StoretopicsError(f"storetopics is not installed in database {conn.info.dbname!r}",
                               "run `storetopics install` (or `storetopics install --extension`) first")


def is_standby(conn: psycopg.Connection) -> bool:
    """Whether the server is a hot standby (a read-only replica in recovery: pg_is_in_recovery())."""
    return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])


def standby_error(what: str, conn: psycopg.Connection) -> StoretopicsError:
    return StoretopicsError(
        f"{what} writes, and the server it connected to ({conn.info.host}, port {conn.info.port}) is a standby (a "
        f"read-only replica in recovery: pg_is_in_recovery() is true)",
        "point it at the primary (--dsn, $DATABASE_URL); readers (catalog(), route(), search(), `storetopics mcp`, "
        "status, show) may use the standby")


def require_primary(conn: psycopg.Connection, what: str) -> None:
    """What writes (the worker, backfill) refuses a standby, with one error that says to use the primary."""
    if is_standby(conn):
        raise standby_error(what, conn)


# ------------------------------------------------------------------------------------------------------------
# Attach / detach
# ------------------------------------------------------------------------------------------------------------
ATTACH_OPTIONS = (("files_table", "regclass"), ("files_key", None), ("mirror", "regclass"), ("mirror_key", None),
                  ("mirror_column", None))


class _Auto:
    def __repr__(self) -> str:
        return "AUTO"


AUTO: Any = _Auto()   # attach(embedding=AUTO), the default: the table's only vector column (see vector_columns)


def vector_columns(conn: psycopg.Connection, table: str) -> list[str]:
    """The table's pgvector columns (vector, halfvec), in column order."""
    return [r[0] for r in conn.execute(
        """SELECT a.attname FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
            WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
              AND t.typname IN ('vector', 'halfvec')
            ORDER BY a.attnum""", (table,))]


def resolve_embedding(conn: psycopg.Connection, table: str, embedding: str | None = AUTO) -> str | None:
    """The embedding column attach() is to use.  The rule: a column given is used; None is keywords only; AUTO (not
    given) is the table's only vector column, if it has exactly one, none if it has none, and an error naming them
    when it has several (a store's clusters are made from one)."""
    if embedding is not AUTO:
        return embedding
    found = vector_columns(conn, table)
    if len(found) > 1:
        raise StoretopicsError(f"{table} has {len(found)} vector columns ({', '.join(found)}): which one holds the "
                               "chunks' embeddings?",
                               "give --embedding COL, or --no-embedding for keywords only (api.attach: embedding='COL' "
                               "or None)")
    return found[0] if found else None


def attach_query(table: str, store_key: str, file_key: str, content: str | None = None,
                 embedding: str | None = None, ts_config: str | None = None, *, function: str = "attach",
                 **options: str | None) -> sql.Composed:
    """The SELECT storetopics.attach(...) statement, with every value inlined as a literal.  options: files_table,
    files_key, mirror, mirror_key, mirror_column (None: the SQL function's default).  function "attach_check": the
    same arguments to the function that only checks them."""
    args = [sql.SQL("chunks => {}::regclass").format(sql.Literal(table)),
            sql.SQL("store_key => {}").format(sql.Literal(store_key)),
            sql.SQL("file_key => {}").format(sql.Literal(file_key))]
    if content is not None:
        args.append(sql.SQL("content => {}").format(sql.Literal(content)))
    if embedding is AUTO:
        raise ValueError("attach_query needs the embedding column resolved (resolve_embedding)")
    if embedding is not None:
        args.append(sql.SQL("embedding => {}").format(sql.Literal(embedding)))
    if ts_config is not None:
        args.append(sql.SQL("ts_config => {}::regconfig").format(sql.Literal(ts_config)))
    unknown = set(options) - {name for name, _ in ATTACH_OPTIONS}
    if unknown:
        raise TypeError(f"unknown attach options: {sorted(unknown)}")
    for name, cast in ATTACH_OPTIONS:
        if options.get(name) is not None:
            args.append(sql.SQL("{} => {}{}").format(sql.SQL(name), sql.Literal(options[name]),
                                                     sql.SQL(f"::{cast}" if cast else "")))
    if function not in ("attach", "attach_check"):
        raise ValueError(f"attach_query builds attach() or attach_check(), not {function}()")
    return sql.SQL("SELECT storetopics.{}({})").format(sql.SQL(function), sql.SQL(", ").join(args))


def attach(conn: psycopg.Connection, table: str, store_key: str, file_key: str, content: str | None = None,
           embedding: str | None = AUTO, ts_config: str | None = None, *, check_only: bool = False,
           **options: str | None) -> int | None:
    """Attach a chunk table; returns the source id.  embedding: its pgvector column; not given, the table's only
    one (an error when it has several: see resolve_embedding); None, keywords only.  check_only: run every check
    of attach() (columns exist, the embedding is a vector, the key expressions type-check, the mirror fits) with
    storetopics.attach_check(), which installs nothing and uses up no source id; returns None."""
    require_installed(conn)
    embedding = resolve_embedding(conn, table, embedding)
    if embedding is not None:
        log.debug("attach %s: embedding column %s", table, embedding)
    q = attach_query(table, store_key, file_key, content, embedding, ts_config,
                     function="attach_check" if check_only else "attach", **options)
    result = conn.execute(q).fetchone()[0]
    return None if check_only else result


def detach(conn: psycopg.Connection, table: str) -> bool:
    require_installed(conn)
    return conn.execute("SELECT storetopics.detach(%s::regclass)", (table,)).fetchone()[0]


# ------------------------------------------------------------------------------------------------------------
# Fold and backfill
# ------------------------------------------------------------------------------------------------------------
def pending_files(conn: psycopg.Connection, source: int) -> int:
    return conn.execute("SELECT count(DISTINCT file_key) FROM storetopics.pending "
                        "WHERE source_id = %s AND file_key IS NOT NULL", (source,)).fetchone()[0]


def fold(conn: psycopg.Connection, source: int, batch: int = config.BATCH, *, seconds: float | None = None,
         check: Callable[[], None] | None = None, progress: Callable[[int], None] | None = None) -> int:
    """Fold a source's pending changes, `batch` files per transaction, until none is left (or for at most
    `seconds`).  check() runs before each batch (raise to stop); progress(done) after each.  Returns the files
    folded."""
    done, started = 0, time.monotonic()
    while seconds is None or time.monotonic() - started < seconds:
        if check is not None:
            check()
        n = conn.execute("SELECT storetopics._fold(%s, max_files => %s)", (source, batch)).fetchone()[0]
        if not n:
            break
        done += n
        if progress is not None:
            progress(done)
    return done


@dataclass
class BackfillResult:
    sources: int = 0
    files: int = 0            # files folded (recounted)
    chunks: int = 0           # chunks now held by the stores concerned
    words: int = 0            # counted words now held by the stores concerned
    full: bool = False        # every source was recounted from scratch (attach, TRUNCATE, resync)
    rendered: int = 0         # stores passed over (fit, words, labels, render as due)
    fitted: int = 0           # stores (re-)clustered
    label_calls: int = 0      # labelling calls made (0 with the offline labeller)
    label_errors: int = 0
    changed: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)   # sources whose table was dropped, not detached
    # what could not run here (a labeller without its key, SDK or server; clustering without the extra `cluster`),
    # once each: the stores were rendered without it (old labels kept, keywords only)
    unavailable: list[Unavailable] = field(default_factory=list)
    seconds: float = 0.0
    store: str | None = None  # the store filter, if any


class Progress:
    """What backfill tells its caller as it goes (the CLI draws bars; the default says nothing)."""

    def start(self, step: str, name: str, total: int, unit: str) -> None: ...
    def update(self, done: int, total: int | None = None) -> None: ...
    def close(self) -> None: ...


def backfill(conn: psycopg.Connection, store: str | None = None, source: str | None = None, *,
             batch: int = config.BATCH, progress: Progress | None = None) -> BackfillResult:
    """Bring the stores up to date: fold every pending change of the sources concerned (a batch of files per
    transaction; a file can move between stores, so a source is folded whole), then one refresh pass
    (refresh.refresh_store) over each store with work due.  What cannot run here (a labeller without its key, SDK
    or server; clustering without the extra `cluster`) is skipped, the stores rendered without it, and listed once
    in result.unavailable (`storetopics backfill` then exits 1 with it)."""
    require_installed(conn)
    require_primary(conn, "backfill")
    if batch < 1:
        raise StoretopicsError("--batch must be at least 1")
    progress = progress or Progress()
    started = time.monotonic()
    if source is not None and conn.execute("SELECT NOT EXISTS (SELECT 1 FROM storetopics.sources "
                                           "WHERE chunks = %s::regclass)", (source,)).fetchone()[0]:
        raise StoretopicsError(f"{source} is not attached", "attach it first with `storetopics attach`")
    rows = conn.execute("SELECT source_id, chunks::text, resync, present FROM storetopics._backfill_sources(%s, %s)",
                        (store, source)).fetchall()
    result = BackfillResult(store=store, skipped=[(r[0], r[1]) for r in rows if not r[3]])
    for source_id, name in result.skipped:
        log.warning("skipping source %s: its table (oid %s) was dropped without being detached", source_id, name)
    rows = [r for r in rows if r[3]]
    result.sources, result.full = len(rows), bool(rows) and all(r[2] for r in rows)
    labellers = refresh.Labellers()   # one that cannot work is asked once in the run, not once per store
    for source_id, name, resync, _ in rows:
        result.files += _fold_with_progress(conn, source_id, name, resync, batch, progress)
        due = refresh.stores_due(conn, source_id, store)
        if due:
            progress.start("refresh", name, len(due), "stores")
            for i, key in enumerate(due, 1):
                p = refresh.refresh_store(conn, source_id, key, labellers=labellers)
                result.fitted += p.fitted
                result.label_calls += p.labels.calls
                result.label_errors += p.labels.errors
                result.unavailable += [e for e in p.unavailable
                                       if str(e) not in {str(x) for x in result.unavailable}]
                if p.changed:
                    result.changed.append((source_id, key))
                progress.update(i)
            progress.close()
        result.rendered += len(due)
    ids = [r[0] for r in rows]
    result.chunks, result.words, n_store = conn.execute(
        """SELECT coalesce(sum(chunks), 0)::bigint, coalesce(sum(words), 0)::bigint, count(*)
             FROM storetopics.store_state
            WHERE source_id = ANY (%s) AND (%s::text IS NULL OR store_key = %s)""", (ids, store, store)).fetchone()
    result.seconds = time.monotonic() - started
    if store is not None and n_store == 0 and not any(k == store for _, k in result.changed):
        raise StoretopicsError(f"no store {store!r}" + (f" in {source}" if source else ""),
                               "`storetopics status` lists the stores")
    return result


def _fold_with_progress(conn: psycopg.Connection, source: int, name: str, resync: bool, batch: int,
                        progress: Progress) -> int:
    # The first fold after attach/TRUNCATE turns the resync marker into one pending row per live file, so the total
    # is counted again after it (and every few seconds: writers may add more).
    total = pending_files(conn, source)
    if not total and not resync:
        return fold(conn, source, batch)
    progress.start("fold", name, total, "files")
    state = {"total": total, "first": True, "at": time.monotonic()}

    def step(done: int) -> None:
        now = time.monotonic()
        if state["first"] or done >= state["total"] or now - state["at"] >= config.RECOUNT_EVERY:
            state["total"] = done + pending_files(conn, source)
            state["first"], state["at"] = False, now
        progress.update(done, state["total"])

    done = fold(conn, source, batch, progress=step)
    progress.update(done, done)
    progress.close()
    return done


# ------------------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------------------
def _rows(conn: psycopg.Connection, query: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def stores(conn: psycopg.Connection, store: str | None = None, source: str | None = None) -> list[dict[str, Any]]:
    """The stores and their summaries (storetopics.stores), by source and store key."""
    require_installed(conn)
    return _rows(conn, """SELECT source::text AS source, source_id, store_key, files, chunks, words, skipped, dirty,
                                 updated_at, folded_at, store_topics, topics
                            FROM storetopics.stores
                           WHERE (%(store)s::text IS NULL OR store_key = %(store)s)
                             AND (%(source)s::text IS NULL OR source = %(source)s::text::regclass)
                           ORDER BY source_id, store_key""", {"store": store, "source": source})


def sources(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The attached tables and their counts (storetopics.status); `dropped`: the table was dropped where no event
    trigger saw it (managed Postgres): its stores are left out everywhere until detach_dropped() forgets it."""
    require_installed(conn)
    return _rows(conn, "SELECT source_id, source::text AS source, ts_config::text AS ts_config, stores, files, "
                       "chunks, skipped_text_rows, skipped_null_key_rows, pending_events, oldest_pending, folded_at, "
                       "attached_at, NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = source) AS dropped "
                       "FROM storetopics.status ORDER BY source_id")


def workers(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The workers seen in the last day (heartbeats)."""
    return _rows(conn, "SELECT * FROM storetopics.worker_status() "
                       "WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 day' ORDER BY started_at, id")


def work(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Each store's work state (idle, dirty, working, failing, with the last error)."""
    return _rows(conn, "SELECT w.*, w.source::text AS source_name FROM storetopics.work_status() w "
                       "ORDER BY w.source_id, w.store_key")


def waiting(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """What waits for a worker (storetopics.work_due()): each dirty store, and each table with changes that name no
    store (store_key None), with when it is due (due_in: seconds from now, 0 when due), why (debounce,
    max_staleness, backoff, paused) and the setting's seconds for debounce and max_staleness."""
    return _rows(conn, """SELECT d.source::text AS source, d.source_id, d.store_key, d.due_at, d.why,
                                 greatest(0, extract(epoch FROM d.due_at - now()))::float8 AS due_in,
                                 (storetopics._settings(d.source_id) ->> d.why)::float8 AS seconds
                            FROM storetopics.work_due() d""")


def describe_wait(row: dict[str, Any]) -> str:
    """One waiting entry as the worker and `status` say it: 'docs:attic due in 58s (debounce 60s)'."""
    what = (f"{row['source']}:{row['store_key']}" if row["store_key"] is not None
            else f"{row['source']} (changes that name no store: attach, DELETE, TRUNCATE)")
    return f"{what} {when_due(row)}"


def when_due(row: dict[str, Any]) -> str:
    if row["why"] == "paused":
        return "paused (storetopics.resume() it)"
    due = "due now" if row["due_in"] < 0.5 else f"due in {_seconds(row['due_in'])}"
    why = {"debounce": f"debounce {_seconds(row['seconds'])}", "max_staleness": f"max_staleness "
           f"{_seconds(row['seconds'])}", "backoff": "backoff after a failed pass"}.get(row["why"], row["why"])
    return f"{due} ({why})"


def _seconds(s: float | None) -> str:
    if s is None:
        return "?"
    s = round(s)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def scheduled(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """The pg_cron jobs that call storetopics.refresh(), each with its last run from cron.job_run_details (status
    'succeeded' or 'failed', when, the message: a run that failed, say at its statement_timeout, was rolled back and
    shows nowhere else).  Empty where pg_cron is not installed in this database (it lives in cron.database_name; its
    jobs may run in others: `database`) or the role may not read its tables (each role sees its own jobs)."""
    if not conn.execute("SELECT coalesce(has_schema_privilege(to_regnamespace('cron'), 'USAGE'), false) "
                        "AND to_regclass('cron.job_run_details') IS NOT NULL").fetchone()[0]:
        return []
    try:
        return _rows(conn, r"""
            SELECT j.jobid, j.jobname, j.schedule, j.database, j.active, r.status, r.start_time, r.end_time,
                   r.return_message
              FROM cron.job j
              LEFT JOIN LATERAL (SELECT d.status, d.start_time, d.end_time, d.return_message
                                   FROM cron.job_run_details d WHERE d.jobid = j.jobid
                                  ORDER BY d.runid DESC LIMIT 1) r ON true
             WHERE j.command ~ 'storetopics\.refresh\s*\('
             ORDER BY j.jobid""")
    except psycopg.Error as e:   # (an older or newer pg_cron with other columns; no right on its tables)
        log.debug("cannot read pg_cron's jobs: %s", " ".join(str(e).split()))
        return []


def label_cost(conn: psycopg.Connection) -> dict[str, Any]:
    """Labelling calls, failed calls and their cost, from the ledger."""
    return _rows(conn, "SELECT count(*) AS calls, coalesce(sum(cost_usd), 0) AS usd, "
                       "count(*) FILTER (WHERE outcome = 'error') AS errors FROM storetopics.label_ledger")[0]
