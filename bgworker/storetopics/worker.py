"""`storetopics worker`: keeps every store's summary fresh, debounced and drift-gated, safely from many processes.

    storetopics worker [--once] [--lease S] [--poll S] [--batch N] [--id NAME] [-v]
    python -m storetopics.worker [--dsn DSN] ...    (the same)

Every flag also comes from the environment: STORETOPICS_ONCE, STORETOPICS_LEASE, STORETOPICS_POLL,
STORETOPICS_BATCH, STORETOPICS_ID, STORETOPICS_LOG_LEVEL, STORETOPICS_LOG_FORMAT (a flag wins); the connection from
--dsn, else $DATABASE_URL.  Logs go to stderr through Python logging (logger storetopics.worker), as text or JSON.

The loop (one worker process; run as many as you like, on as many machines):
  * wake on NOTIFY storetopics_dirty (a hint only) or after --poll seconds, whichever comes first;
  * fold the sources whose logged changes name no store (deletes, TRUNCATE, attach) once they are quiet;
  * claim one due store with storetopics.claim() (FOR UPDATE SKIP LOCKED + a lease with an expiry; a store is due
    when quiet for its source's `debounce`, or dirty for `max_staleness`), fold its source's pending changes, run
    the refresh pass (refresh.refresh_store, the same as `storetopics backfill`: fit when a gate says so, the
    clusters' words and the keyword gate, the labels due, render) with the lease checked between steps and before
    each labelling call and the render written only under the lease, and hand the store back with
    storetopics.work_done() (compare-and-set on the store's generation: a store changed underneath stays dirty).
  * No transaction is open while a fit runs or a labelling call waits: every statement commits on its own
    (autocommit).  A heartbeat thread renews the lease; after SIGKILL it just runs out and another worker takes over.
  * SIGTERM/SIGINT: the pass stops at its next step, the lease is given back (the store stays dirty), exit 0.
  * Postgres gone: reconnect with exponential backoff and jitter, LISTEN again, carry on (polling catches up).
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg

from . import api, config, refresh

logger = logging.getLogger("storetopics.worker")


class Stopping(Exception):
    """SIGTERM arrived: give the store back."""


class LeaseLost(Exception):
    """Another worker holds the store now (ours expired): write nothing more."""


@dataclass
class Options:
    dsn: str = ""
    once: bool = False
    lease: float = config.LEASE
    poll: float = config.POLL
    batch: int = config.BATCH
    worker_id: str | None = None
    verbose: bool = False      # the pass-by-pass log (debug level) even when the log level is higher
    max_backoff: float = config.MAX_BACKOFF
    fold_seconds: float = config.FOLD_SECONDS


@dataclass
class Stats:
    passes: int = 0
    regenerated: int = 0
    failed: int = 0
    label_calls: int = 0
    folded_sources: int = 0
    reconnects: int = 0
    outcomes: dict = field(default_factory=dict)


class _Leased(refresh.Hooks):
    """The worker's hooks into the refresh pass: the lease is checked between steps and before each labelling
    call, and the summary is rendered under the lease (storetopics.work_render writes nothing once it is gone)."""

    def __init__(self, worker: Worker, source: int, store: str):
        self.worker, self.source, self.store = worker, source, store

    def check(self) -> None:
        self.worker.check(self.source, self.store)

    def labeller(self, inner):
        return _LeaseCheckingLabeller(inner, self)

    def render(self, conn, source: int, store: str, count_first: bool):
        return conn.execute("SELECT storetopics.work_render(%s, %s, %s, %s)",
                            (self.worker.id, source, store, count_first)).fetchone()[0]


class _LeaseCheckingLabeller:
    """A labeller whose every call is preceded by the lease check (no call for a store another worker has taken)."""

    def __init__(self, inner, hooks: _Leased):
        self.inner, self.hooks = inner, hooks
        self.name = inner.name
        self.model = getattr(inner, "model", None)

    def label(self, cluster):
        return self._call(self.inner.label, cluster)

    def label_store(self, store):
        return self._call(self.inner.label_store, store)

    def _call(self, method, what):
        self.hooks.check()
        self.hooks.worker.log(f"label call {self.hooks.source}:{self.hooks.store}", debug=True)
        try:
            return method(what)
        finally:
            self.hooks.worker.log(f"label done {self.hooks.source}:{self.hooks.store}", debug=True)


class Worker:
    def __init__(self, opts: Options):
        self.opts = opts
        self.id = opts.worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = Stats()
        self.conn: psycopg.Connection | None = None
        self.stopping = threading.Event()
        self.current: tuple[int, str] | None = None
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._fold_warned: set[int] = set()

    # -- logging ---------------------------------------------------------------------------------------------
    def log(self, msg: str, debug: bool = False, level: int = logging.INFO, **fields) -> None:
        """One event: debug ones (each claim, pass, labelling call) show at --log-level debug or with -v."""
        if debug:
            level = logging.INFO if self.opts.verbose else logging.DEBUG
        logger.log(level, msg, extra={"worker": self.id, **fields})

    # -- connections -----------------------------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.opts.dsn, autocommit=True, application_name="storetopics-worker",
                               connect_timeout=10)
        conn.execute("SET client_min_messages = warning")
        return conn

    def _connect_with_backoff(self) -> psycopg.Connection:
        delay = 0.2
        while True:
            try:
                conn = self._connect()
                conn.execute("LISTEN storetopics_dirty")
                return conn
            except psycopg.OperationalError as e:
                if self.stopping.is_set():
                    raise Stopping() from None
                wait = delay * (0.5 + random.random() / 2)
                self.log(f"cannot connect ({' '.join(str(e).split())[:200]}); retrying in {wait:.1f}s",
                         level=logging.WARNING)
                self.stopping.wait(wait)
                delay = min(delay * 2, self.opts.max_backoff)

    def _heartbeat_loop(self) -> None:
        conn = None
        period = max(0.2, self.opts.lease / 3)
        while not self._hb_stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                cur = self.current
                conn.execute("SELECT storetopics.worker_heartbeat(%s, %s, %s, %s, %s, %s)",
                             (self.id, socket.gethostname(), os.getpid(), self.opts.lease,
                              cur[0] if cur else None, cur[1] if cur else None))
            except psycopg.Error:
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
            self._hb_stop.wait(period)
        if conn is not None:
            conn.close()

    def connection_lost(self, e: Exception) -> bool:
        """Whether an error means the connection is gone (reconnect), not that one statement failed (report it,
        carry on): psycopg files both under OperationalError (a ProgramLimitExceeded, say, is one too)."""
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            return True
        state = getattr(e, "sqlstate", None) or ""
        # 08: connection exceptions; 57P01-57P03: the server is shutting down or starting up
        return state.startswith("08") or state in ("57P01", "57P02", "57P03")

    # -- the lease -------------------------------------------------------------------------------------------
    def check(self, source: int, store: str) -> None:
        if self.stopping.is_set():
            raise Stopping()
        if not self.conn.execute("SELECT storetopics.lease_held(%s, %s, %s)", (self.id, source, store)).fetchone()[0]:
            raise LeaseLost()

    # -- one pass over one store -----------------------------------------------------------------------------
    def fold_source(self, source: int) -> int:
        def check():
            if self.stopping.is_set():
                raise Stopping()
        return api.fold(self.conn, source, self.opts.batch, seconds=self.opts.fold_seconds, check=check)

    def _releasing(self, source: int, store: str) -> None:
        # logged before the lease is given back, as `claim` is logged after it was taken: the logged intervals of
        # one store never overlap unless the leases did (tests check this across processes)
        self.log(f"release {source}:{store}", debug=True)

    def process(self, source: int, store: str, generation: int) -> str | None:
        conn = self.conn
        self.current = (source, store)
        calls = 0
        t0 = time.monotonic()
        try:
            folded = self.fold_source(source)
            self.check(source, store)
            p = refresh.refresh_store(conn, source, store, _Leased(self, source, store))
            calls = p.labels.calls
            self.stats.label_calls += calls
            if p.changed is None:
                raise LeaseLost()
            self._releasing(source, store)
            outcome = conn.execute("SELECT storetopics.work_done(%s, %s, %s, %s, %s, NULL, %s)",
                                   (self.id, source, store, generation, p.changed, calls)).fetchone()[0]
            self.stats.passes += 1
            self.stats.regenerated += bool(p.changed)
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
            self.log(f"pass {source}:{store}: folded {folded} files{', fitted' if p.fitted else ''}, {calls} "
                     f"labelling calls, {'summary changed' if p.changed else 'summary unchanged'}, {outcome} "
                     f"({time.monotonic() - t0:.2f}s)", debug=not p.changed and not p.fitted and not calls,
                     source=source, store=store, outcome=outcome)
            return outcome
        except LeaseLost:
            self._releasing(source, store)
            self.log(f"{source}:{store}: lease lost (another worker has it); nothing written")
            return None
        except Stopping:
            self._releasing(source, store)
            conn.execute("SELECT storetopics.worker_stop(%s)", (self.id,))
            self.log(f"{source}:{store}: stopping; lease given back (the store stays dirty)")
            raise
        except Exception as e:  # a failed pass: keep the old summary, back off, retry later
            if isinstance(e, psycopg.Error) and self.connection_lost(e):
                raise
            return self._failed(source, store, generation, e, calls)
        finally:
            self.current = None

    def _failed(self, source: int, store: str, generation: int, e: Exception, calls: int) -> str:
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        self.stats.failed += 1
        self.log(f"{source}:{store}: pass failed: {msg}", level=logging.WARNING, source=source, store=store)
        self._releasing(source, store)
        self.conn.execute("SELECT storetopics.work_done(%s, %s, %s, %s, false, %s, %s)",
                          (self.id, source, store, generation, msg, calls))
        return "failed"

    # -- the loop --------------------------------------------------------------------------------------------
    def tick(self) -> bool:
        """Do what is due now.  Returns whether anything was done."""
        did = False
        self.conn.execute("SELECT storetopics.verify_due()")   # the periodic count check (settings.verify_every)
        for (source,) in self.conn.execute("SELECT storetopics.sources_to_fold()").fetchall():
            if self.stopping.is_set():
                raise Stopping()
            try:
                if self.fold_source(source):
                    self.stats.folded_sources += 1
                    did = True
            except psycopg.Error as e:   # e.g. its table was dropped without detach: say so once, carry on
                if self.connection_lost(e):
                    raise
                if source not in self._fold_warned:
                    self._fold_warned.add(source)
                    self.log(f"cannot fold source {source}: {' '.join(str(e).split())}", level=logging.WARNING)
        while not self.stopping.is_set():
            row = self.conn.execute("SELECT source_id, store_key, generation, takeover FROM storetopics.claim(%s, %s)",
                                    (self.id, self.opts.lease)).fetchone()
            if row is None:
                break
            source, store, generation, takeover = row
            if takeover:
                self.log(f"{source}:{store}: taking over an expired lease")
            self.log(f"claim {source}:{store} generation {generation}", debug=True)
            self.process(source, store, generation)
            did = True
        return did

    def _wait(self) -> None:
        nxt = self.conn.execute("SELECT storetopics.next_due()").fetchone()[0]
        timeout = self.opts.poll if nxt is None else max(0.05, min(self.opts.poll, nxt + 0.02))
        deadline = time.monotonic() + timeout
        # notifies() waits on the socket; wake at least every 0.5 s to notice SIGTERM
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in self.conn.notifies(timeout=min(left, 0.5), stop_after=1):
                return

    def run(self) -> int:
        def on_signal(signum, frame):
            self.stopping.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, on_signal)
            except ValueError:  # not the main thread (tests may run a worker in a thread)
                pass
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True, name="storetopics-heartbeat")
        # the tokenizer, loaded now rather than inside a pass's render transaction (which holds the store's work row)
        from . import tokens
        tokens.count("")
        self.log(f"started (lease {self.opts.lease:g}s, poll {self.opts.poll:g}s{', once' if self.opts.once else ''})")
        try:
            self.conn = self._connect_with_backoff()
            self.conn.execute("SELECT storetopics.worker_heartbeat(%s, %s, %s, %s)",
                              (self.id, socket.gethostname(), os.getpid(), self.opts.lease))
            self._hb_thread.start()
            while not self.stopping.is_set():
                try:
                    did = self.tick()
                    if self.opts.once and not did:
                        break
                    if not did:
                        self._wait()
                except psycopg.Error as e:
                    if self.stopping.is_set():
                        break
                    if not self.connection_lost(e):
                        # a statement failed outside any store's pass (claiming, say): report it, wait, go on
                        self.stats.failed += 1
                        self.log(f"error ({' '.join(str(e).split())[:200]}); retrying in {self.opts.poll:g}s",
                                 level=logging.WARNING)
                        self.stopping.wait(self.opts.poll)
                        continue
                    self.stats.reconnects += 1
                    self.log(f"lost the database ({' '.join(str(e).split())[:200]}); reconnecting",
                             level=logging.WARNING)
                    try:
                        self.conn.close()
                    except Exception:
                        pass
                    self.conn = self._connect_with_backoff()
                    # whatever we held is stale: give it back (the stores stay dirty), then carry on
                    self.conn.execute("SELECT storetopics.worker_stop(%s)", (self.id,))
                    self.conn.execute("SELECT storetopics.worker_heartbeat(%s, %s, %s, %s)",
                                      (self.id, socket.gethostname(), os.getpid(), self.opts.lease))
                    self.log("reconnected; listening again")
        except Stopping:
            pass
        finally:
            self._hb_stop.set()
            if self._hb_thread.is_alive():
                self._hb_thread.join(timeout=5)
            if self.conn is not None and not self.conn.closed:
                try:
                    self.conn.execute("SELECT storetopics.worker_stop(%s)", (self.id,))
                except psycopg.Error:
                    pass
                self.conn.close()
        self.log(f"stopped: {self.stats.passes} passes, {self.stats.regenerated} summaries changed, "
                 f"{self.stats.failed} failed, {self.stats.label_calls} labelling calls")
        return 0


def run(opts: Options) -> int:
    return Worker(opts).run()


def add_arguments(p) -> None:
    """The worker's flags (shared by `storetopics worker` and `python -m storetopics.worker`), each defaulting to
    its STORETOPICS_* environment variable, else to config's default."""
    p.add_argument("--once", action="store_true", default=config.env("once", False, bool),
                   help="process what is due now, then exit (cron, tests) [$STORETOPICS_ONCE]")
    p.add_argument("--lease", type=float, default=config.env("lease", config.LEASE, float), metavar="S",
                   help=f"seconds a claimed store stays ours without a heartbeat (default {config.LEASE:g}): how "
                        "soon another worker takes over after a crash [$STORETOPICS_LEASE]")
    p.add_argument("--poll", type=float, default=config.env("poll", config.POLL, float), metavar="S",
                   help=f"seconds between polls when no NOTIFY arrives (default {config.POLL:g}) [$STORETOPICS_POLL]")
    p.add_argument("--batch", type=int, default=config.env("batch", config.BATCH, int), metavar="N",
                   help=f"files per fold transaction (default {config.BATCH}) [$STORETOPICS_BATCH]")
    p.add_argument("--id", default=config.env("id", None), metavar="NAME",
                   help="worker name in `status` (default host:pid:random) [$STORETOPICS_ID]")
    p.add_argument("-v", "--verbose", action="store_true", default=config.env("verbose", False, bool),
                   help="log every claim, pass and labelling call at info level [$STORETOPICS_VERBOSE]")


def options(args) -> Options:
    if args.lease <= 0 or args.poll <= 0 or args.batch < 1:
        raise ValueError("--lease and --poll must be positive and --batch at least 1")
    return Options(dsn=args.dsn, once=args.once, lease=args.lease, poll=args.poll, batch=args.batch,
                   worker_id=args.id, verbose=args.verbose)


def main(argv=None) -> int:
    from . import log as st_log
    p = argparse.ArgumentParser(prog="python -m storetopics.worker", description=__doc__.split("\n\n")[0])
    try:
        p.add_argument("--dsn", default=config.dsn(),
                       help="libpq connection string or URL (default: $DATABASE_URL, else the PG* variables)")
        p.add_argument("--log-level", default=config.env("log_level", config.LOG_LEVEL), choices=config.LOG_LEVELS)
        p.add_argument("--log-format", default=config.env("log_format", config.LOG_FORMAT),
                       choices=config.LOG_FORMATS)
        add_arguments(p)
    except ValueError as e:
        p.error(str(e))
    args = p.parse_args(argv)
    try:
        opts = options(args)
    except ValueError as e:
        p.error(str(e))
    st_log.setup(args.log_level, args.log_format)
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
