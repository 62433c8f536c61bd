"""`storetopics`: install, attach, bring up to date and inspect the summaries of pgvector data stores.

    storetopics [--dsn DSN] [--log-level L] [--log-format text|json] COMMAND ...
    storetopics install [--extension]
    storetopics attach TABLE --store-key K --file-key K [--content COL] [--embedding COL | --no-embedding]
                             [--files-table T [--files-key COL]] [--mirror T [--mirror-key COL] [--mirror-column COL]]
                             [--ts-config CFG] [--dry-run]
    storetopics detach TABLE
    storetopics backfill [--store KEY] [--source TABLE] [--batch N] [--quiet]
    storetopics status
    storetopics show [--store KEY] [--source TABLE]
    storetopics worker [--once] [--now] [--lease S] [--poll S] [--batch N] [--statement-timeout S] [--id NAME]
    storetopics mcp [--prefix TEXT] [--http HOST:PORT [--auth-token T] [--allowed-host H]...] [--catalog NAME]
                    [--embeddings-url URL --embeddings-model NAME] [--poll S]

The connection defaults to $DATABASE_URL, else libpq's own PG* environment variables.  Errors are printed as one
line (message and hint) with exit status 1.  This module parses arguments and prints; the work is in api.
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import shutil
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import psycopg

from . import __version__, api, config
from . import install as st_install
from . import log as st_log
from .errors import report_error
from .progress import Progress

log = logging.getLogger("storetopics.cli")


class Bars(api.Progress):
    """api.backfill's progress, drawn as bars on stderr."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None):
        self.enabled, self.stream, self.bar = enabled, stream, None

    def start(self, step: str, name: str, total: int, unit: str) -> None:
        self.bar = Progress(f"{step:<7} {name}", total, unit=unit, stream=self.stream, enabled=self.enabled)

    def update(self, done: int, total: int | None = None) -> None:
        self.bar.update(done, total)

    def close(self) -> None:
        self.bar.close()


def summary(r: api.BackfillResult) -> str:
    """backfill's one-line report."""
    # After attach/TRUNCATE every word of the stores was just counted, so words/s is a real rate; after an
    # incremental fold only the touched files were, and the store totals would overstate it.
    rate = f", {_human(r.words / r.seconds)} words/s" if r.full and r.files and r.seconds else ""
    fits = f"{_n(r.fitted, 'store')} clustered, {_n(r.label_calls, 'labelling call')}; " \
        if r.fitted or r.label_calls else ""
    return (f"backfill: {_n(r.files, 'file')} folded in {r.seconds:.1f}s{rate}; {fits}"
            f"{_n(r.rendered, 'store')} rendered ({len(r.changed)} changed); "
            f"{'the store holds' if r.store else 'the stores hold'} {_n(r.chunks, 'chunk')}, "
            f"{_n(r.words, 'word')}")


def _n(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _human(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.0f}k"
    return f"{x:,.0f}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
    srcs = api.sources(conn)
    if not srcs:
        out.write("no attached tables (attach one with `storetopics attach`)\n")
        return
    out.write("Sources\n")
    out.write(format_table(
        ["id", "table", "ts_config", "stores", "files", "chunks", "skipped text", "null keys", "pending",
         "oldest pending", "folded", "attached"],
        [(s["source_id"], s["source"], s["ts_config"], s["stores"], int(s["files"]), int(s["chunks"]),
          int(s["skipped_text_rows"]), int(s["skipped_null_key_rows"]), s["pending_events"], s["oldest_pending"],
          s["folded_at"], s["attached_at"]) for s in srcs], indent="  ") + "\n")
    for s in srcs:
        if s["dropped"]:
            out.write(f"  source {s['source_id']} (table oid {s['source']}) was dropped without being detached: its "
                      f"stores are left out everywhere; forget it with SELECT * FROM "
                      f"storetopics.detach_dropped()\n")
    out.write("\n")
    rows = api.stores(conn)
    out.write("Stores\n")
    multi = len({r["source_id"] for r in rows} if rows else srcs) > 1
    if not rows:
        out.write("  none yet (run `storetopics backfill`, or a worker: see Work below)\n")
    else:
        headers = (["table"] if multi else []) + ["store", "files", "chunks", "dirty", "updated", "store_topics"]
        table = [([r["source"]] if multi else []) + [r["store_key"], r["files"], r["chunks"], r["dirty"],
                                                     r["updated_at"], truncate(r["store_topics"], 100)] for r in rows]
        out.write(format_table(headers, table, indent="  ") + "\n")
    print_worker_status(conn, out, multi)


def print_worker_status(conn: psycopg.Connection, out: TextIO, multi: bool = False) -> None:
    """The worker's side of `status`: workers (heartbeats), each store's state (idle, dirty, working, failing, with
    the last error), passes, and the LLM cost from the label ledger."""
    workers, work, ledger, waiting = api.workers(conn), api.work(conn), api.label_cost(conn), api.waiting(conn)
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
    jobs = api.scheduled(conn)
    if jobs:
        out.write("\nScheduled refresh (pg_cron: storetopics.refresh())\n")
        out.write(format_table(
            ["job", "schedule", "database", "active", "last run", "took s", "status", "message"],
            [(j["jobname"] or j["jobid"], j["schedule"], j["database"], j["active"], j["start_time"],
              (j["end_time"] - j["start_time"]).total_seconds() if j["end_time"] and j["start_time"] else None,
              j["status"], truncate(j["return_message"], 60)) for j in jobs], indent="  ") + "\n")
    # why each waiting store is due when it is (debounce, max_staleness, backoff, paused); what no worker has looked
    # at yet (a new store's first rows, changes that name no store) shows as 'pending'
    why = {(w["source_id"], w["store_key"]): w for w in waiting}
    work = [dict(r, why=why.pop((r["source_id"], r["store_key"]), {}).get("why")) for r in work]
    work += [{"source_name": w["source"], "store_key": w["store_key"] or "(changes that name no store)",
              "state": "pending", "dirty_since": None, "due_at": w["due_at"], "why": w["why"], "processed": 0,
              "regenerated": 0, "label_calls": 0, "cost_usd": 0, "last_error": None} for w in why.values()]
    if work:
        counts: dict[str, int] = {}
        for r in work:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        out.write("\nWork (" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ")\n")
        headers = (["table"] if multi else []) + ["store", "state", "dirty since", "due", "why", "passes",
                                                  "changed", "label calls", "cost usd", "last error"]
        out.write(format_table(headers, [
            ([r["source_name"]] if multi else []) +
            [r["store_key"], r["state"], r["dirty_since"], r["due_at"], r["why"], int(r["processed"]),
             int(r["regenerated"]), int(r["label_calls"]), float(r["cost_usd"]), truncate(r["last_error"], 60)]
            for r in work], indent="  ") + "\n")
        if waiting:
            out.write("  (due: when a worker takes it; `storetopics worker --once --now` or `storetopics backfill` "
                      "does it now)\n")
    out.write(f"\nLLM cost: ${float(ledger['usd']):.4f} over {ledger['calls']:,} labelling calls "
              f"({ledger['errors']:,} failed)\n")


def print_show(conn: psycopg.Connection, out: TextIO, store: str | None = None, source: str | None = None) -> int:
    rows = api.stores(conn, store, source)
    if not rows:
        if store is not None:
            raise api.StoretopicsError(f"no store {store!r}" + (f" in {source}" if source else ""),
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
    version = st_install.install(args.dsn, extension=args.extension, log=lambda *a: log.info(" ".join(map(str, a))))
    print(f"storetopics {version} installed ({'extension' if args.extension else 'plain script'})")
    return 0


def _embedding(conn: psycopg.Connection, args) -> tuple[str | None, str | None]:
    """--embedding COL, --no-embedding (None), or neither: the table's only vector column.  Returns it, and what to
    say on stderr once attach() or its check went through."""
    given = None if args.no_embedding else (args.embedding if args.embedding is not None else api.AUTO)
    api.require_installed(conn)
    embedding = api.resolve_embedding(conn, args.table, given)
    if given is api.AUTO and embedding is not None:
        return embedding, (f"storetopics: embedding: {embedding}, the only vector column of {args.table} "
                           "(--no-embedding: keywords only)")
    return embedding, None


def cmd_attach(args) -> int:
    options = {name: getattr(args, name) for name, _ in api.ATTACH_OPTIONS}
    if args.dry_run:
        # Checked against the database when one is reachable (storetopics.attach_check: nothing installed); a
        # check that fails is the usual one-line error and nothing is printed on stdout.
        try:
            conn = api.connect(args.dsn, "storetopics-cli")
        except api.StoretopicsError as e:
            print(api.attach_query(args.table, args.store_key, args.file_key, args.content, args.embedding,
                                   args.ts_config, **options).as_string(None) + ";")
            print(f"storetopics: not checked against a database: {e.message}", file=sys.stderr)
            if args.embedding is None and not args.no_embedding:
                print("storetopics: without a database the table's vector column is not known: this SQL attaches "
                      "keywords only (give --embedding COL, or --no-embedding)", file=sys.stderr)
            return 0
        with conn:
            embedding, note = _embedding(conn, args)
            api.attach(conn, args.table, args.store_key, args.file_key, args.content, embedding,
                       args.ts_config, check_only=True, **options)
            print(api.attach_query(args.table, args.store_key, args.file_key, args.content, embedding,
                                   args.ts_config, **options).as_string(conn) + ";")
        if note:
            print(note, file=sys.stderr)
        print("storetopics: checked against the database; nothing was installed", file=sys.stderr)
        return 0
    with api.connect(args.dsn, "storetopics-cli") as conn:
        embedding, note = _embedding(conn, args)
        source_id = api.attach(conn, args.table, args.store_key, args.file_key, args.content, embedding,
                               args.ts_config, **options)
    if note:
        print(note, file=sys.stderr)
    print(source_id)
    print(f"attached {args.table} as source {source_id}; run `storetopics backfill` to build its summaries",
          file=sys.stderr)
    return 0


def cmd_detach(args) -> int:
    with api.connect(args.dsn, "storetopics-cli") as conn:
        done = api.detach(conn, args.table)
    print(f"detached {args.table}" if done else f"{args.table} was not attached")
    return 0


def cmd_backfill(args) -> int:
    with api.connect(args.dsn, "storetopics-cli") as conn:
        res = api.backfill(conn, args.store, args.source, batch=args.batch, progress=Bars(not args.quiet))
    if res.sources or args.store is not None:
        print(summary(res))
    elif not res.skipped:
        print("backfill: no attached tables (attach one with `storetopics attach`)", file=sys.stderr)
    for e in res.unavailable:   # the stores were rendered without it; the exit status says something is missing
        report_error(e.message + "; the summaries were rendered without it", e.hint)
    return 1 if res.unavailable else 0


def cmd_status(args) -> int:
    with api.connect(args.dsn, "storetopics-cli") as conn:
        print_status(conn, sys.stdout)
    return 0


def cmd_worker(args) -> int:
    from . import worker
    try:
        opts = worker.options(args)
    except ValueError as e:
        raise api.StoretopicsError(str(e)) from None
    with api.connect(args.dsn, "storetopics-cli") as conn:   # fail fast with the one-line error: no database,
        api.require_installed(conn)                          # not installed, a standby
        api.require_primary(conn, "the worker")
    return worker.run(opts)


def cmd_mcp(args) -> int:
    from . import mcp as st_mcp  # the MCP SDK itself is imported only when the server starts
    try:
        opts = st_mcp.options(args)
    except ValueError as e:
        raise api.StoretopicsError(str(e)) from None
    return st_mcp.run(opts)


def cmd_show(args) -> int:
    with api.connect(args.dsn, "storetopics-cli") as conn:
        return print_show(conn, sys.stdout, args.store, args.source)


def build_parser() -> argparse.ArgumentParser:
    dsn_help = "libpq connection string or URL (default: $DATABASE_URL, else the PG* environment variables)"
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=argparse.SUPPRESS, help=dsn_help)
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=config.LOG_LEVELS)
    common.add_argument("--log-format", default=argparse.SUPPRESS, choices=config.LOG_FORMATS)

    p = argparse.ArgumentParser(prog="storetopics", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=config.dsn(), help=dsn_help)
    p.add_argument("--log-level", default=config.env("log_level", config.LOG_LEVEL), choices=config.LOG_LEVELS,
                   help=f"(default: $STORETOPICS_LOG_LEVEL, else {config.LOG_LEVEL})")
    p.add_argument("--log-format", default=config.env("log_format", config.LOG_FORMAT), choices=config.LOG_FORMATS,
                   help=f"one line of text or one JSON object per event (default: $STORETOPICS_LOG_FORMAT, else "
                        f"{config.LOG_FORMAT})")
    p.add_argument("--version", action="version", version=f"storetopics {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, about: str, examples: Sequence[str]) -> argparse.ArgumentParser:
        """A subcommand whose --help says what it does (its line in the command list, then more) and shows
        examples."""
        return sub.add_parser(name, parents=[common], help=help,
                              description=f"{help[0].upper()}{help[1:]}.\n\n{textwrap.dedent(about).strip()}",
                              epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    s = command("install", "install or upgrade storetopics in the database", """
        Runs the SQL the package ships as a plain script (managed Postgres: RDS, Supabase, Neon, Cloud SQL), or
        CREATE EXTENSION with --extension where the extension's files are installed on the server.  Creates
        pgvector's `vector` when the server has it.  Idempotent: run it again after an upgrade of the package.""",
                ["storetopics install --dsn postgresql://admin@db-host/app",
                 "storetopics install --extension        # CREATE EXTENSION, or ALTER EXTENSION ... UPDATE"])
    s.add_argument("--extension", action="store_true",
                   help="CREATE EXTENSION storetopics (the files must be installed on the server); "
                        "default: run the SQL as a plain script (managed Postgres)")
    s.set_defaults(func=cmd_install)

    s = command("attach", "attach a chunk table; prints the source id", """
        Installs statement-level triggers that log which files a write touched (the application's writes stay
        fast) and registers the table; `storetopics backfill` (or the worker) then counts the rows already there.
        The keys are columns or SQL expressions over the chunk row `c`.  Embedding: without --embedding, the
        table's only pgvector column is used (said on stderr); a table with several must name one; --no-embedding
        attaches keywords only.""",
                ["storetopics attach public.chunks --store-key store_id --file-key file_id --content content",
                 "storetopics attach docs --store-key \"'kitchen'\" --file-key source --embedding embedding --dry-run",
                 "storetopics attach chunks --store-key '(SELECT f.store_id FROM public.files f WHERE f.id = "
                 "c.file_id)' --file-key file_id --files-table public.files"])
    s.add_argument("table", metavar="TABLE")
    s.add_argument("--store-key", required=True, metavar="K",
                   help="column, or SQL expression over the row c, naming the data store of a chunk")
    s.add_argument("--file-key", required=True, metavar="K",
                   help="column, or SQL expression over the row c, naming the file/document of a chunk")
    s.add_argument("--content", metavar="COL", help="text column (default: content)")
    emb = s.add_mutually_exclusive_group()
    emb.add_argument("--embedding", metavar="COL",
                     help="the pgvector column (vector or halfvec) holding the chunks' embeddings; default: the "
                          "table's only one (said on stderr), none when it has none; a table with several must "
                          "name one (--embedding COL)")
    emb.add_argument("--no-embedding", action="store_true", help="keywords only, even with a vector column")
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

    s = command("detach", "detach a chunk table and forget its summaries", """
        Drops the triggers and generated functions and forgets every store of the table; the table itself is left
        as it is.  Detaching a table that is not attached says so and succeeds.""",
                ["storetopics detach public.chunks"])
    s.add_argument("table", metavar="TABLE")
    s.set_defaults(func=cmd_detach)

    s = command("backfill", "bring the summaries up to date, with a progress bar", """
        Folds every pending change (a batch of files per transaction), clusters the stores whose fit is due
        (outside the database: the extra `cluster`), asks the configured labeller for the labels that are due and
        renders: now, whatever the worker's debounce.  Exits 1 when something it needs cannot work here (a labeller
        without its key or server, a missing extra), after rendering what it could.""",
                ["storetopics backfill", "storetopics backfill --store kitchen -q",
                 "storetopics backfill --source public.chunks --batch 100"])
    s.add_argument("--store", metavar="KEY", help="only this store (its sources are folded whole)")
    s.add_argument("--source", metavar="TABLE", help="only this attached table")
    s.add_argument("--batch", type=int, default=config.BATCH, metavar="N",
                   help=f"files per fold transaction (default {config.BATCH})")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_backfill)

    s = command("status", "sources, stores, workers, one line each", """
        The attached tables and their counts, each store with its summary's start, the workers seen in the last
        day, each store's work state (idle, dirty, working, failing) with when it is due and why (debounce,
        max_staleness, backoff, paused), and the LLM cost from the label ledger.""",
                ["storetopics status", "DATABASE_URL=postgresql://router@db-host/app storetopics status"])
    s.set_defaults(func=cmd_status)

    s = command("worker", "keep the summaries fresh: debounced, drift-gated, leases per store (run many)", """
        Wakes on NOTIFY or every --poll seconds, waits until a store has been quiet for its `debounce` (never longer
        than `max_staleness`), then folds, re-fits when a gate says so, labels what is due and renders.  Each store
        is leased to one worker at a time.  Every flag also comes from its STORETOPICS_* variable.""",
                ["storetopics worker", "storetopics worker --once           # what is due now, then exit",
                 "storetopics worker --once --now     # everything dirty now (a first run)",
                 "STORETOPICS_LOG_FORMAT=json storetopics worker --lease 60 --poll 5"])
    from . import worker as st_worker
    st_worker.add_arguments(s)
    s.set_defaults(func=cmd_worker)

    s = command("mcp", "serve the stores as MCP tools (stdio, or streamable HTTP with --http); needs the extra "
                       "`mcp`", """
        One search tool per store the role may read, described by its live summary, a `route` tool, and one
        resource per store; tools/list_changed is sent when a summary changes (on a hot standby, found by polling
        every --poll seconds).  pip install 'storetopics[mcp]'.""",
                ["storetopics mcp --dsn postgresql://router@db-host/app --prefix \"Acme's internal documents.\"",
                 "storetopics mcp --http 127.0.0.1:8765",
                 "storetopics mcp --dsn postgresql://router@replica-host/app --poll 2   # a hot standby",
                 "STORETOPICS_MCP_TOKEN=... storetopics mcp --http 0.0.0.0:8765 --allowed-host mcp.example.com"])
    s.add_argument("--prefix", metavar="TEXT",
                   help="what each search tool's description says first ({store} and {source} are replaced by the "
                        "delimited store key and table name; default: nothing)")
    s.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    s.add_argument("--auth-token", metavar="TOKEN",
                   help="with --http: require 'Authorization: Bearer TOKEN' on every request (at least 16 characters; "
                        "default: $STORETOPICS_MCP_TOKEN; needed to bind an address that is not loopback)")
    s.add_argument("--allowed-host", metavar="HOST[:PORT]", action="append",
                   help="with --http: a Host (and Origin) the server also answers, besides the bind address, "
                        "localhost, 127.0.0.1 and [::1] with the port (repeatable)")
    s.add_argument("--max-sessions", metavar="N", type=int,
                   help="with --http: at most N open sessions, a new one past it gets 503 (default 100)")
    s.add_argument("--session-timeout", metavar="S", type=float,
                   help="with --http: end a session after S seconds with no request in flight (default 600)")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="with --http: serve an address that is not loopback without --auth-token (e.g. behind a "
                        "proxy that authenticates)")
    s.add_argument("--catalog", metavar="NAME",
                   help="only the stores of this catalog (configure(t, '{\"catalog\": NAME}')); default: every store "
                        "the role may see")
    s.add_argument("--embeddings-url", metavar="URL",
                   help="an OpenAI-compatible embeddings endpoint (POST URL/embeddings; $OPENAI_API_KEY when set) to "
                        "embed queries with: search is then full-text + vector, route uses route()")
    s.add_argument("--embeddings-model", metavar="NAME",
                   help="the model to ask that endpoint for (the one that made the stores' vectors)")
    s.add_argument("--client-embeddings", action="store_true",
                   help="let tool calls pass the query's embedding (argument `embedding`) instead")
    s.add_argument("--poll", metavar="S", type=float,
                   help="on a hot standby, where LISTEN does not work: seconds between looks at what changed "
                        "(default: $STORETOPICS_MCP_POLL, else 5); on a primary, notifications come at once")
    s.set_defaults(func=cmd_mcp)

    s = command("show", "the stores and their full summaries", """
        Each store's counts, when it was last updated, whether changes are pending, and its whole summary (what a
        router reads from storetopics.stores).""",
                ["storetopics show", "storetopics show --store kitchen", "storetopics show --source public.chunks"])
    s.add_argument("--store", metavar="KEY")
    s.add_argument("--source", metavar="TABLE")
    s.set_defaults(func=cmd_show)
    return p


def _pg_hint(e: psycopg.Error) -> str | None:
    if e.diag.message_hint:
        return e.diag.message_hint
    if isinstance(e, psycopg.errors.UndefinedTable):
        return "check the table name; schema-qualify it if it is not on the search_path"
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return "connect as the table's owner or a superuser"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except ValueError as e:   # a STORETOPICS_* variable that does not parse
        report_error(str(e))
        return 2
    st_log.setup(args.log_level, args.log_format)
    try:
        return args.func(args) or 0
    except api.StoretopicsError as e:
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
