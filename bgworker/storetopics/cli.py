"""`storetopics`: install, attach, bring up to date and inspect the keyword summaries of pgvector data stores.

    storetopics [--dsn DSN] install [--extension]
    storetopics [--dsn DSN] attach TABLE --store-key K --file-key K [--content COL] [--embedding COL]
                                         [--ts-config CFG] [--files-table T [--files-key COL]]
                                         [--mirror T [--mirror-key COL] [--mirror-column COL]] [--dry-run]
    storetopics [--dsn DSN] detach TABLE
    storetopics [--dsn DSN] backfill [--store KEY] [--source TABLE] [--batch N] [--quiet]
    storetopics [--dsn DSN] status
    storetopics [--dsn DSN] worker [--once] [--lease S] [--poll S] [--batch N] [--id NAME] [-v]
    storetopics [--dsn DSN] show [--store KEY] [--source TABLE]
    storetopics eval [routing|all] [--quick] [--out DIR] ...   (the evaluation harness; extra `eval`)

The connection defaults to $DATABASE_URL, else libpq's own PG* environment variables.  Errors from Postgres are
printed as one line (message and hint) with exit status 1.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, TextIO

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from . import __version__
from . import install as st_install
from . import refresh
from .progress import Progress

DEFAULT_BATCH = 500
RECOUNT_EVERY = 3.0  # seconds between recounts of the pending files while folding (writers may add more)


class CliError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


# ------------------------------------------------------------------------------------------------------------
# Connection
# ------------------------------------------------------------------------------------------------------------
def default_dsn() -> str:
    return os.environ.get("DATABASE_URL", "")


def connect(dsn: str) -> psycopg.Connection:
    """An autocommit connection: every statement (each fold, each render) is its own transaction."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, application_name="storetopics-cli")
    except psycopg.OperationalError as e:
        raise CliError(f"could not connect: {_one_line(str(e))}",
                       "give --dsn, or set DATABASE_URL or the PG* environment variables") from None
    conn.execute("SET client_min_messages = warning")
    return conn


def require_installed(conn: psycopg.Connection) -> None:
    if conn.execute("SELECT to_regclass('storetopics.sources') IS NULL").fetchone()[0]:
        db = conn.info.dbname
        raise CliError(f"storetopics is not installed in database {db!r}",
                       "run `storetopics install` (or `storetopics install --extension`) first")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------------------
# Attach / detach
# ------------------------------------------------------------------------------------------------------------
ATTACH_OPTIONS = (("files_table", "regclass"), ("files_key", None), ("mirror", "regclass"), ("mirror_key", None),
                  ("mirror_column", None))


def attach_query(table: str, store_key: str, file_key: str, content: str | None = None,
                 embedding: str | None = None, ts_config: str | None = None, **options: str | None) -> sql.Composed:
    """The SELECT storetopics.attach(...) statement, with every value inlined as a literal.  options: files_table,
    files_key, mirror, mirror_key, mirror_column (None: the SQL function's default)."""
    args = [sql.SQL("chunks => {}::regclass").format(sql.Literal(table)),
            sql.SQL("store_key => {}").format(sql.Literal(store_key)),
            sql.SQL("file_key => {}").format(sql.Literal(file_key))]
    if content is not None:
        args.append(sql.SQL("content => {}").format(sql.Literal(content)))
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
    return sql.SQL("SELECT storetopics.attach({})").format(sql.SQL(", ").join(args))


def attach(conn: psycopg.Connection, table: str, store_key: str, file_key: str, content: str | None = None,
           embedding: str | None = None, ts_config: str | None = None, *, check_only: bool = False,
           **options: str | None) -> int | None:
    """Attach a chunk table; returns the source id.  check_only: run every check of attach() (columns exist, the
    embedding is a vector, the key expressions type-check, the mirror fits) in a transaction that is rolled back,
    so nothing is installed; returns None."""
    require_installed(conn)
    q = attach_query(table, store_key, file_key, content, embedding, ts_config, **options)
    if not check_only:
        return conn.execute(q).fetchone()[0]

    class _Rollback(Exception):
        pass

    try:
        with conn.transaction():
            conn.execute(q)
            raise _Rollback
    except _Rollback:
        pass
    return None


def detach(conn: psycopg.Connection, table: str) -> bool:
    require_installed(conn)
    return conn.execute("SELECT storetopics.detach(%s::regclass)", (table,)).fetchone()[0]


# ------------------------------------------------------------------------------------------------------------
# Backfill
# ------------------------------------------------------------------------------------------------------------
@dataclass
class BackfillResult:
    sources: int = 0
    files: int = 0            # files folded (recounted)
    chunks: int = 0           # chunks now held by the stores concerned
    words: int = 0            # counted words now held by the stores concerned
    full: bool = False        # every source was recounted from scratch (attach, TRUNCATE, resync)
    rendered: int = 0
    fitted: int = 0           # stores (re-)clustered
    label_calls: int = 0      # labelling calls made (0 with the offline labeller)
    changed: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0
    store: str | None = None  # the --store filter, if any

    def summary(self) -> str:
        # After attach/TRUNCATE every word of the stores was just counted, so words/s is a real rate; after an
        # incremental fold only the touched files were, and the store totals would overstate it.
        rate = f", {_human(self.words / self.seconds)} words/s" if self.full and self.files and self.seconds else ""
        fits = f"{_n(self.fitted, 'store')} clustered, {_n(self.label_calls, 'labelling call')}; " \
            if self.fitted or self.label_calls else ""
        return (f"backfill: {_n(self.files, 'file')} folded in {self.seconds:.1f}s{rate}; {fits}"
                f"{_n(self.rendered, 'store')} rendered ({len(self.changed)} changed); "
                f"{'the store holds' if self.store else 'the stores hold'} {_n(self.chunks, 'chunk')}, "
                f"{_n(self.words, 'word')}")


def _n(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _human(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    return f"{x:,.0f}"


def _pending_files(conn: psycopg.Connection, source_id: int) -> int:
    return conn.execute("SELECT count(DISTINCT file_key) FROM storetopics.pending "
                        "WHERE source_id = %s AND file_key IS NOT NULL", (source_id,)).fetchone()[0]


def backfill(conn: psycopg.Connection, store: str | None = None, source: str | None = None, *,
             batch: int = DEFAULT_BATCH, progress: bool = True, stream: TextIO | None = None) -> BackfillResult:
    """Fold every pending change of the sources concerned (one transaction per batch of `batch` files), then render
    the stores whose state changed.  Progress goes to `stream` (stderr)."""
    require_installed(conn)
    if batch < 1:
        raise CliError("--batch must be at least 1")
    stream = stream if stream is not None else sys.stderr
    started = time.monotonic()
    if source is not None:
        row = conn.execute("SELECT id FROM storetopics.sources WHERE chunks = %s::regclass", (source,)).fetchone()
        if row is None:
            raise CliError(f"{source} is not attached", "attach it first with `storetopics attach`")
    sources = conn.execute(
        """SELECT x.id, x.chunks::text,
                  EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id AND p.resync),
                  EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = x.chunks)
             FROM storetopics.sources x
            WHERE (%(source)s::text IS NULL OR x.chunks = %(source)s::text::regclass)
              AND (%(store)s::text IS NULL
                   OR EXISTS (SELECT 1 FROM storetopics.store_state y
                               WHERE y.source_id = x.id AND y.store_key = %(store)s)
                   OR EXISTS (SELECT 1 FROM storetopics.pending p WHERE p.source_id = x.id))
            ORDER BY x.id""", {"source": source, "store": store}).fetchall()
    for source_id, name, _, exists in sources:
        if not exists and progress:
            stream.write(f"backfill: warning: skipping source {source_id}: its table (oid {name}) was dropped "
                         "without being detached\n")
    sources = [r[:3] for r in sources if r[3]]
    result = BackfillResult(sources=len(sources), full=bool(sources) and all(r[2] for r in sources), store=store)
    if not sources and store is None:
        if progress:
            stream.write("backfill: no attached tables (attach one with `storetopics attach`)\n")
        return result

    for source_id, name, resync in sources:
        # 1. Fold, a batch of files per transaction.  The first fold after attach/TRUNCATE turns the resync marker
        #    into one pending row per live file, so the total is recounted after it (and whenever writers add more).
        total = _pending_files(conn, source_id)
        bar = None
        if total or resync:
            bar = Progress(f"fold   {name}", total, unit="files", stream=stream, enabled=progress)
        done, first, last_count = 0, True, time.monotonic()
        while True:
            n = conn.execute("SELECT storetopics.fold(%s, max_files => %s)", (source_id, batch)).fetchone()[0]
            if not n:
                break
            done += n
            now = time.monotonic()
            if first or done >= total or now - last_count >= RECOUNT_EVERY:
                total = done + _pending_files(conn, source_id)
                last_count, first = now, False
            if bar is None:
                bar = Progress(f"fold   {name}", total, unit="files", stream=stream, enabled=progress)
            bar.update(done, total)
        if bar is not None:
            bar.update(done, done)
            bar.close()
        result.files += done

        # 2. Cluster the stores whose fit is due (outside the database, same code as plpython3u's), label the
        #    clusters that need it (no transaction open during LLM calls).
        to_fit = refresh.stores_to_fit(conn, source_id, store)
        if to_fit:
            fbar = Progress(f"fit    {name}", len(to_fit), unit="stores", stream=stream, enabled=progress)
            for i, (key, _why) in enumerate(to_fit, 1):
                report = refresh.fit(conn, source_id, key)
                if report.get("applied"):
                    result.fitted += 1
                fbar.update(i)
            fbar.close()
        for key in refresh.stores_with_stale_words(conn, source_id, store):
            conn.execute("SELECT storetopics.refresh_words(%s, %s)", (source_id, key))
        for key in refresh.stores_to_label(conn, source_id, store):
            stats = refresh.label(conn, source_id, key)
            result.label_calls += stats.calls
            if stats.errors and progress:
                stream.write(f"backfill: {stats.errors} labelling call(s) failed for store {key!r} "
                             f"(old labels kept, retried later): {stats.last_error}\n")

        # 3. Render the stores whose state changed since they were last rendered (and drop emptied ones).
        stale = refresh.stores_to_render(conn, source_id, store)
        if stale:
            rbar = Progress(f"render {name}", len(stale), unit="stores", stream=stream, enabled=progress)
            for i, key in enumerate(stale, 1):
                if refresh.render(conn, source_id, key):
                    result.changed.append((source_id, key))
                rbar.update(i)
            rbar.close()
        result.rendered += len(stale)

    ids = [r[0] for r in sources]
    result.chunks, result.words, n_store = conn.execute(
        """SELECT coalesce(sum(chunks), 0)::bigint, coalesce(sum(words), 0)::bigint, count(*)
             FROM storetopics.store_state
            WHERE source_id = ANY (%s) AND (%s::text IS NULL OR store_key = %s)""", (ids, store, store)).fetchone()
    result.seconds = time.monotonic() - started
    if store is not None and n_store == 0 and not any(k == store for _, k in result.changed):
        raise CliError(f"no store {store!r}" + (f" in {source}" if source else ""),
                       "`storetopics status` lists the stores")
    return result


# ------------------------------------------------------------------------------------------------------------
# Reading: status and stores
# ------------------------------------------------------------------------------------------------------------
def stores(conn: psycopg.Connection, store: str | None = None, source: str | None = None) -> list[dict[str, Any]]:
    require_installed(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(
            """SELECT source::text AS source, source_id, store_key, files, chunks, words, skipped, dirty,
                      updated_at, folded_at, store_topics, topics
                 FROM storetopics.stores
                WHERE (%(store)s::text IS NULL OR store_key = %(store)s)
                  AND (%(source)s::text IS NULL OR source = %(source)s::text::regclass)
                ORDER BY source_id, store_key""", {"store": store, "source": source})
        return cur.fetchall()


def status_rows(conn: psycopg.Connection) -> list[dict[str, Any]]:
    require_installed(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT source_id, source::text AS source, ts_config::text AS ts_config, stores, files, chunks, "
                    "skipped_text_rows, skipped_null_key_rows, pending_events, oldest_pending, folded_at, "
                    "attached_at FROM storetopics.status ORDER BY source_id")
        return cur.fetchall()


# ------------------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------------------
def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, dt.datetime):
        return v.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def truncate(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, wrap: dict[int, int] | None = None,
                 indent: str = "") -> str:
    """An aligned text table.  Numbers are right-aligned; columns listed in `wrap` (index -> width) are wrapped."""
    wrap = wrap or {}
    rows = list(rows)
    numeric = [bool(rows) and all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                                  for r in rows if r[i] is not None) for i in range(len(headers))]
    cells: list[list[list[str]]] = []
    for r in rows:
        cell_lines = []
        for i, v in enumerate(r):
            s = fmt(v)
            cell_lines.append(textwrap.wrap(s, wrap[i], break_on_hyphens=False) or [""] if i in wrap else [s])
        cells.append(cell_lines)
    widths = [len(h) for h in headers]
    for cl in cells:
        for i, lines in enumerate(cl):
            widths[i] = max(widths[i], *(len(x) for x in lines))

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)]
        return (indent + "  ".join(parts)).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    for cl in cells:
        height = max(len(lines) for lines in cl)
        for k in range(height):
            out.append(line([lines[k] if k < len(lines) else "" for lines in cl]))
    return "\n".join(out)


def _term_width(default: int = 120) -> int:
    return max(shutil.get_terminal_size((default, 24)).columns, 60)


def print_status(conn: psycopg.Connection, out: TextIO) -> None:
    srcs = status_rows(conn)
    if not srcs:
        out.write("no attached tables (attach one with `storetopics attach`)\n")
        return
    out.write("Sources\n")
    out.write(format_table(
        ["id", "table", "ts_config", "stores", "files", "chunks", "skipped text", "null keys", "pending",
         "oldest pending", "folded", "attached"],
        [(s["source_id"], s["source"], s["ts_config"], s["stores"], int(s["files"]), int(s["chunks"]),
          int(s["skipped_text_rows"]), int(s["skipped_null_key_rows"]), s["pending_events"], s["oldest_pending"],
          s["folded_at"], s["attached_at"]) for s in srcs], indent="  ") + "\n\n")
    rows = stores(conn)
    out.write("Stores\n")
    if not rows:
        out.write("  none yet (run `storetopics backfill`)\n")
        return
    multi = len({r["source_id"] for r in rows}) > 1
    headers = (["table"] if multi else []) + ["store", "files", "chunks", "dirty", "updated", "store_topics"]
    table = [([r["source"]] if multi else []) + [r["store_key"], r["files"], r["chunks"], r["dirty"],
                                                 r["updated_at"], truncate(r["store_topics"], 100)] for r in rows]
    out.write(format_table(headers, table, indent="  ") + "\n")
    print_worker_status(conn, out, multi)


def print_worker_status(conn: psycopg.Connection, out: TextIO, multi: bool = False) -> None:
    """The worker's side of `status`: workers (heartbeats), each store's state (idle, dirty, working, failing, with
    the last error), passes, and the LLM cost from the label ledger."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM storetopics.worker_status() "
                    "WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 day' ORDER BY started_at, id")
        workers = cur.fetchall()
        cur.execute("SELECT w.*, w.source::text AS source_name FROM storetopics.work_status() w "
                    "ORDER BY w.source_id, w.store_key")
        work = cur.fetchall()
        cur.execute("SELECT count(*) AS calls, coalesce(sum(cost_usd), 0) AS usd, "
                    "count(*) FILTER (WHERE outcome = 'error') AS errors FROM storetopics.label_ledger")
        ledger = cur.fetchone()
    out.write("\nWorkers\n")
    if not workers:
        out.write("  none has run yet (start one with `storetopics worker`)\n")
    else:
        out.write(format_table(
            ["worker", "alive", "last seen", "working on", "passes", "changed", "failed", "label calls"],
            [(w["id"], w["alive"], w["last_seen"],
              f"{w['source_id']}:{w['store_key']}" if w["store_key"] is not None else None,
              int(w["processed"]), int(w["regenerated"]), int(w["failures"]), int(w["label_calls"]))
             for w in workers], indent="  ") + "\n")
    if work:
        counts: dict[str, int] = {}
        for r in work:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        out.write("\nWork (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")\n")
        headers = (["table"] if multi else []) + ["store", "state", "dirty since", "due", "passes", "changed",
                                                  "label calls", "cost usd", "last error"]
        out.write(format_table(headers, [
            ([r["source_name"]] if multi else []) +
            [r["store_key"], r["state"], r["dirty_since"], r["due_at"], int(r["processed"]), int(r["regenerated"]),
             int(r["label_calls"]), float(r["cost_usd"]), truncate(r["last_error"], 60)] for r in work],
            indent="  ") + "\n")
    out.write(f"\nLLM cost: ${float(ledger['usd']):.4f} over {ledger['calls']:,} labelling calls "
              f"({ledger['errors']:,} failed)\n")


def print_show(conn: psycopg.Connection, out: TextIO, store: str | None = None, source: str | None = None) -> int:
    rows = stores(conn, store, source)
    if not rows:
        if store is not None:
            raise CliError(f"no store {store!r}" + (f" in {source}" if source else ""),
                           "`storetopics status` lists the stores")
        out.write("no stores yet (attach a table and run `storetopics backfill`)\n")
        return 0
    width = min(_term_width(), 120)
    for i, r in enumerate(rows):
        if i:
            out.write("\n")
        flags = ", changes pending (run `storetopics backfill`)" if r["dirty"] else ""
        out.write(f"{r['store_key']}  ({r['source']}: {r['files']:,} files, {r['chunks']:,} chunks, "
                  f"{r['words']:,} words; updated {fmt(r['updated_at'])}{flags})\n")
        text = r["store_topics"] if r["store_topics"] is not None else "(not rendered yet: run `storetopics backfill`)"
        out.write(textwrap.fill(text, width, initial_indent="    ", subsequent_indent="    ",
                                break_on_hyphens=False) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------------------
# Commands
# ------------------------------------------------------------------------------------------------------------
def cmd_install(args) -> int:
    version = st_install.install(args.dsn, extension=args.extension,
                                 log=lambda *a: print(*a, file=sys.stderr))
    print(f"storetopics {version} installed ({'extension' if args.extension else 'plain script'})")
    return 0


def cmd_attach(args) -> int:
    options = {name: getattr(args, name) for name, _ in ATTACH_OPTIONS}
    q = attach_query(args.table, args.store_key, args.file_key, args.content, args.embedding, args.ts_config,
                     **options)
    if args.dry_run:
        # Checked against the database when one is reachable (in a transaction rolled back: nothing installed);
        # a check that fails is the usual one-line error and nothing is printed on stdout.
        try:
            conn = connect(args.dsn)
        except CliError as e:
            print(q.as_string(None) + ";")
            print(f"storetopics: not checked against a database: {e.message}", file=sys.stderr)
            return 0
        with conn:
            attach(conn, args.table, args.store_key, args.file_key, args.content, args.embedding, args.ts_config,
                   check_only=True, **options)
            print(q.as_string(conn) + ";")
        print("storetopics: checked against the database; nothing was installed", file=sys.stderr)
        return 0
    with connect(args.dsn) as conn:
        source_id = attach(conn, args.table, args.store_key, args.file_key, args.content, args.embedding,
                           args.ts_config, **options)
    print(source_id)
    print(f"attached {args.table} as source {source_id}; run `storetopics backfill` to build its summaries",
          file=sys.stderr)
    return 0


def cmd_detach(args) -> int:
    with connect(args.dsn) as conn:
        done = detach(conn, args.table)
    print(f"detached {args.table}" if done else f"{args.table} was not attached")
    return 0


def cmd_backfill(args) -> int:
    with connect(args.dsn) as conn:
        res = backfill(conn, args.store, args.source, batch=args.batch, progress=not args.quiet)
    if res.sources or args.store is not None:
        print(res.summary())
    return 0


def cmd_status(args) -> int:
    with connect(args.dsn) as conn:
        print_status(conn, sys.stdout)
    return 0


def cmd_worker(args) -> int:
    from . import worker
    try:
        opts = worker.options(args)
    except ValueError as e:
        raise CliError(str(e)) from None
    with connect(args.dsn) as conn:   # fail fast with the usual one-line error when the database is not there
        require_installed(conn)
    return worker.run(opts)


def cmd_show(args) -> int:
    with connect(args.dsn) as conn:
        return print_show(conn, sys.stdout, args.store, args.source)


def build_parser() -> argparse.ArgumentParser:
    dsn_help = "libpq connection string or URL (default: $DATABASE_URL, else the PG* environment variables)"
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS, help=dsn_help)

    p = argparse.ArgumentParser(prog="storetopics", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=default_dsn(), help=dsn_help)
    p.add_argument("--version", action="version", version=f"storetopics {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("install", parents=[common], help="install or upgrade storetopics in the database")
    s.add_argument("--extension", action="store_true",
                   help="CREATE EXTENSION storetopics (the files must be installed on the server); "
                        "default: run the SQL as a plain script (managed Postgres)")
    s.set_defaults(func=cmd_install)

    s = sub.add_parser("attach", parents=[common], help="attach a chunk table; prints the source id")
    s.add_argument("table", metavar="TABLE")
    s.add_argument("--store-key", required=True, metavar="K",
                   help="column, or SQL expression over the row c, naming the data store of a chunk")
    s.add_argument("--file-key", required=True, metavar="K",
                   help="column, or SQL expression over the row c, naming the file/document of a chunk")
    s.add_argument("--content", metavar="COL", help="text column (default: content)")
    s.add_argument("--embedding", metavar="COL", help="pgvector column (default: none)")
    s.add_argument("--ts-config", metavar="CFG", help="text search configuration (default: english)")
    s.add_argument("--files-table", metavar="T", help="the table that knows each file's store, when the store key "
                   "looks it up there: its updates (files moving between stores) are captured too")
    s.add_argument("--files-key", metavar="COL", help="its column equal to the chunks' file key (default: id)")
    s.add_argument("--mirror", metavar="T", help="also write each store's summary into this table of yours")
    s.add_argument("--mirror-key", metavar="COL", help="its column holding the store key (default: id)")
    s.add_argument("--mirror-column", metavar="COL", help="its text column for the summary (default: store_topics)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the SQL instead of running it (checked against the database when reachable; "
                        "nothing is installed)")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("detach", parents=[common], help="detach a chunk table and forget its summaries")
    s.add_argument("table", metavar="TABLE")
    s.set_defaults(func=cmd_detach)

    s = sub.add_parser("backfill", parents=[common], help="bring the summaries up to date, with a progress bar")
    s.add_argument("--store", metavar="KEY", help="render only this store (its sources are folded whole)")
    s.add_argument("--source", metavar="TABLE", help="only this attached table")
    s.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                   help=f"files per fold transaction (default {DEFAULT_BATCH})")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_backfill)

    s = sub.add_parser("status", parents=[common], help="sources and stores, one line each")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("worker", parents=[common],
                       help="keep the summaries fresh: debounced, drift-gated, leases per store (run many)")
    from . import worker as st_worker
    st_worker.add_arguments(s)
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("show", parents=[common], help="the stores and their full summaries")
    s.add_argument("--store", metavar="KEY")
    s.add_argument("--source", metavar="TABLE")
    s.set_defaults(func=cmd_show)

    from .evaluation import run as evaluation  # lazy: only its argument definitions are needed here
    s = sub.add_parser("eval", parents=[evaluation.parser()], add_help=False,
                       help="evaluation harness: routing accuracy, drift, needle (what `make eval` runs)")
    s.set_defaults(func=evaluation.run)
    return p


def report_error(message: str, hint: str | None = None, stream: TextIO | None = None) -> None:
    stream = stream if stream is not None else sys.stderr
    message = _one_line(message)
    if message.startswith("storetopics: "):
        message = message[len("storetopics: "):]
    line = f"storetopics: error: {message}"
    if hint:
        line += f" (hint: {_one_line(hint)})"
    stream.write(line + "\n")
    stream.flush()


def _pg_hint(e: psycopg.Error) -> str | None:
    if e.diag.message_hint:
        return e.diag.message_hint
    if isinstance(e, psycopg.errors.UndefinedTable):
        return "check the table name; schema-qualify it if it is not on the search_path"
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return "connect as the table's owner or a superuser"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except CliError as e:
        report_error(e.message, e.hint)
    except st_install.InstallError as e:
        report_error(str(e))
    except psycopg.Error as e:
        msg = e.diag.message_primary or str(e)
        if e.diag.message_detail:
            msg = f"{msg.rstrip('.')}: {e.diag.message_detail}"
        if e.diag.message_primary is None and isinstance(e, psycopg.OperationalError):
            msg = f"could not connect: {msg}"
        report_error(msg, _pg_hint(e))
    except KeyboardInterrupt:
        sys.stderr.write("\nstoretopics: interrupted (folded batches are committed; run backfill again to resume)\n")
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
