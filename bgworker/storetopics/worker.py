"""`storetopics worker`: keeps every store's summary fresh, debounced and drift-gated, safely from many processes.

    storetopics worker [--once] [--now] [--lease S] [--poll S] [--batch N] [--statement-timeout S] [--id NAME] [-v]
    python -m storetopics.worker [--dsn DSN] ...    (the same)

Every flag also comes from the environment: STORETOPICS_ONCE, STORETOPICS_NOW, STORETOPICS_LEASE, STORETOPICS_POLL,
STORETOPICS_BATCH, STORETOPICS_STATEMENT_TIMEOUT, STORETOPICS_ID, STORETOPICS_LOG_LEVEL, STORETOPICS_LOG_FORMAT (a
flag wins); the connection from --dsn, else $DATABASE_URL.  Logs go to stderr through Python logging (logger
storetopics.worker), as text or JSON.

The loop (one worker process; run as many as you like, on as many machines):
  * wake on NOTIFY storetopics_dirty (a hint only) or after --poll seconds, whichever comes first;
  * fold the sources whose logged changes name no store (deletes, TRUNCATE, attach) once they are quiet;
  * one pass (Worker.work_one, top to bottom): claim one due store with storetopics._claim() (FOR UPDATE SKIP LOCKED
    + a lease with an expiry; a store is due when quiet for its source's `debounce`, or dirty for `max_staleness`),
    fold its source's pending changes, run the refresh pass under the lease (refresh.refresh_store with a
    refresh.Lease, the same pass as `storetopics backfill`: fit when a gate says so, the clusters' words and the
    keyword gate, the labels due, render, then the file novelty kept again if the uploads piled up since make
    renders dearer than a keep; the lease checked in SQL between steps and before each labelling call, the render
    written only under it), and hand the store back with storetopics._work_done() (compare-and-set on the store's
    generation: a store changed underneath stays dirty).
  * No transaction is open while a fit runs or a labelling call waits: every statement commits on its own
    (autocommit).  A heartbeat thread renews the lease; after SIGKILL it just runs out and another worker takes over.
  * A time limit per statement (--statement-timeout): a source's SQL (the attacher's key expressions, run as the
    table's owner) cannot hold the shared worker.  The session's statement_timeout stops a statement first; a
    watchdog thread cancels one still running CANCEL_GRACE later (the tenant's SQL caught the cancel, or SET the
    timeout off) and ends its session one more CANCEL_GRACE later; one that comes back at the limit without an error
    (its SQL swallowed the cancel) counts as stopped too.  A pass stopped so fails (the store keeps its summary and
    backs off; _claim() serves the sources without failing passes first), and after every stretch of a source's SQL
    the session is put back as the worker set it (RESET ALL): a SET the tenant's SQL made does not outlive it.
  * SIGTERM/SIGINT: the statement running is cancelled (its session ended if that does not stop it), the pass
    stops, the lease is given back (the store stays dirty), exit 0.
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
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from . import api, config, refresh
from .refresh import LeaseLost, Stopping

logger = logging.getLogger("storetopics.worker")


class TimeLimit(Exception):
    """A statement with a source's SQL in it ran into the worker's time limit (--statement-timeout): a failed pass."""


def _limit_text(t: float) -> str:
    if t > 0:
        return (f"time limit: a statement ran past the worker's statement timeout of {t:g}s (--statement-timeout, "
                f"STORETOPICS_STATEMENT_TIMEOUT)")
    return "time limit: a statement ran past the server's statement_timeout (the worker's --statement-timeout is 0)"


class _Connection(psycopg.Connection):
    """The worker's own connection.  It notes since when a statement has been running (busy_since, for the
    watchdog), and while `limit` is set, a statement that ran that long raises TimeLimit even if it succeeded: the
    server cancelled it at the limit and the tenant's SQL caught the cancel and returned.  psycopg runs every round
    trip of a statement through wait(); notifies() does too, which is no statement: `listening` marks it."""

    busy_since: float | None = None
    listening: bool = False
    limit: float | None = None

    def wait(self, *args, **kwargs):
        if self.listening:
            return super().wait(*args, **kwargs)
        self.busy_since = start = time.monotonic()
        try:
            result = super().wait(*args, **kwargs)
        finally:
            self.busy_since = None
        took = time.monotonic() - start
        if self.limit is not None and took >= self.limit:
            raise TimeLimit(f"{_limit_text(self.limit)}: it ran {took:.1f}s and came back without an error (its SQL "
                            f"caught the cancel); the old summary is kept")
        return result


class _Watchdog:
    """Bounds from outside the session the statements that run a source's SQL.  The session's statement_timeout
    stops them first, but the tenant's SQL can catch that cancel (EXCEPTION WHEN query_canceled) or SET the timeout
    off for the rest of the session; so this thread watches the clock too: a statement still running CANCEL_GRACE
    after its limit is cancelled, and if it is still running CANCEL_GRACE after that, its session is ended
    (pg_terminate_backend from another connection: that cannot be caught).  After SIGTERM it does the same to the
    statement that was running then, at once (the statements that give the lease back run after it)."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.armed = False
        self.cancelled: tuple | None = None          # (connection, busy_since, when) of the statement it cancelled
        self.killed: psycopg.Connection | None = None   # the connection whose session it ended
        self.wake = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="storetopics-watchdog")

    def arm(self) -> None:
        self.cancelled = self.killed = None
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def ours(self, conn) -> bool:
        """Whether the watchdog cancelled a statement on this connection, or ended its session, since it was armed."""
        return self.killed is conn or (self.cancelled is not None and self.cancelled[0] is conn)

    def _loop(self) -> None:
        while not self.done.is_set():
            self.wake.wait(0.1)
            self.wake.clear()
            try:
                self.look()
            except Exception as e:   # never let the watchdog die
                self.worker.log(f"watchdog: {type(e).__name__}: {e}", level=logging.WARNING)

    def look(self) -> None:
        w = self.worker
        conn = w.conn
        since = getattr(conn, "busy_since", None)
        if since is None:
            return
        now = time.monotonic()
        if w.stopping.is_set():
            if w.stopped_at is None:     # stopped without a signal (a worker run in a thread)
                w.stopped_at = now
            if since > w.stopped_at:
                return            # giving the lease back
            due = w.stopped_at
        elif self.armed and w.opts.statement_timeout > 0:
            due = since + w.opts.statement_timeout + config.CANCEL_GRACE
        else:
            return
        if now < due:
            return
        if self.cancelled is None or self.cancelled[0] is not conn or self.cancelled[1] != since:
            self.cancelled = (conn, since, now)
            w.log(f"cancelling the statement running for {now - since:.1f}s"
                  f"{' (stopping)' if w.stopping.is_set() else ' (time limit)'}", debug=True)
            conn.cancel()
        elif self.killed is not conn and now >= self.cancelled[2] + config.CANCEL_GRACE and conn.busy_since == since:
            self.killed = conn
            pid = conn.info.backend_pid
            w.log(f"the statement ignored its cancel: ending its session (backend {pid})", level=logging.WARNING)
            try:
                with psycopg.connect(w.opts.dsn, autocommit=True, connect_timeout=10,
                                     application_name="storetopics-worker") as c:
                    c.execute("SELECT pg_terminate_backend(%s)", (pid,))
            except psycopg.Error as e:
                w.log(f"cannot end backend {pid}: {' '.join(str(e).split())[:200]}", level=logging.WARNING)


@dataclass
class Options:
    dsn: str = ""
    once: bool = False
    lease: float = config.LEASE
    poll: float = config.POLL
    batch: int = config.BATCH
    worker_id: str | None = None
    statement_timeout: float = config.STATEMENT_TIMEOUT   # seconds; 0: no limit
    now: bool = False          # no debounce: every dirty store (and table with pending changes) is due at once
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


class Worker:
    def __init__(self, opts: Options):
        self.opts = opts
        self.id = opts.worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = Stats()
        self.conn: psycopg.Connection | None = None
        self.stopping = threading.Event()
        self.stopped_at: float | None = None    # monotonic time of SIGTERM
        self.watch = _Watchdog(self)
        self.current: tuple[int, str] | None = None
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._fold_warned: set[int] = set()
        self._fold_backoff: dict[int, tuple[int, float]] = {}   # source: (failures in a row, next try, monotonic)

    # -- logging ---------------------------------------------------------------------------------------------
    def log(self, msg: str, debug: bool = False, level: int = logging.INFO, **fields) -> None:
        """One event: debug ones (each claim, pass, labelling call) show at --log-level debug or with -v."""
        if debug:
            level = logging.INFO if self.opts.verbose else logging.DEBUG
        logger.log(level, msg, extra={"worker": self.id, **fields})

    # -- connections -----------------------------------------------------------------------------------------
    def _connect(self, cls=psycopg.Connection) -> psycopg.Connection:
        conn = cls.connect(self.opts.dsn, autocommit=True, application_name="storetopics-worker", connect_timeout=10)
        conn.execute("SET client_min_messages = warning")
        return conn

    def _session(self, conn: psycopg.Connection) -> None:
        """The worker's settings for its session, applied when it connects and again after every stretch of a
        source's SQL: that SQL runs in this session (as the table's owner) and may SET anything for the rest of it
        (a SET without LOCAL outlives the function that made it: statement_timeout 0, default_transaction_read_only
        on...).  RESET ALL undoes it.  (Tried three times: a statement_timeout the tenant set tiny may cancel it.)"""
        t = self.opts.statement_timeout
        # 0: no limit of the worker's (a statement_timeout set for the role or the database still applies)
        limit = f"; SET statement_timeout = {max(1, round(t * 1000))}" if t > 0 else ""
        for attempt in range(3):
            try:
                conn.execute(f"RESET ALL; SET client_min_messages = warning{limit}", prepare=False)
                return
            except psycopg.errors.QueryCanceled:
                if attempt == 2:
                    raise

    def _connect_with_backoff(self, first: bool = False) -> psycopg.Connection:
        """Connected, with the worker's session settings, and LISTENing.  A standby (pg_is_in_recovery()) is refused
        on the first connection (api.StoretopicsError: point the worker at the primary); met on a reconnect (a
        failover under way), it is waited out like a server that is down."""
        delay = 0.2
        while True:
            try:
                conn = self._connect(_Connection)
                if api.is_standby(conn):
                    error = api.standby_error("the worker", conn)
                    conn.close()
                    if first:
                        raise error
                    raise psycopg.OperationalError(error.message)
                self._session(conn)
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
                conn.execute("SELECT storetopics._worker_heartbeat(%s, %s, %s, %s, %s, %s)",
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

    # -- a source's SQL: bounded ----------------------------------------------------------------------------
    @contextmanager
    def _source_sql(self):
        """Around statements that run a source's SQL (its reader runs the attacher's expressions as the table's
        owner): the watchdog watches them; one stopped at the time limit raises TimeLimit, one stopped by SIGTERM
        Stopping; afterwards the session is put back as the worker set it."""
        self.watch.arm()
        if self.opts.statement_timeout > 0:
            self.conn.limit = self.opts.statement_timeout
        try:
            yield
        except psycopg.Error as e:
            why = self._why(e)
            if why is None:
                raise
            raise why from e
        finally:
            self.watch.disarm()
            conn = self.conn
            conn.limit = None
            if not conn.closed and not conn.broken:
                self._session(conn)

    def _why(self, e: psycopg.Error) -> Exception | None:
        """What stopped a statement of a source's SQL, if it was the worker: Stopping, TimeLimit or None."""
        conn = self.conn
        canceled = isinstance(e, psycopg.errors.QueryCanceled)
        if self.stopping.is_set() and (canceled or self.watch.ours(conn) or conn.closed or conn.broken):
            return Stopping()
        limit = _limit_text(self.opts.statement_timeout)
        detail = " ".join(f"{type(e).__name__}: {e}".split())
        if self.watch.killed is conn:
            # its session ended: the pass failed; carry on with a new one
            self.log("reconnecting after ending a session", debug=True)
            try:
                conn.close()
            except Exception:
                pass
            self.conn = self._connect_with_backoff()
            return TimeLimit(f"{limit}, ignored its cancel and had its session ended; the old summary is kept. "
                             f"{detail}")
        if canceled and (self.watch.ours(conn) or "statement timeout" in str(e)):
            return TimeLimit(f"{limit} and was cancelled; the old summary is kept. {detail}")
        return None

    def _give_back(self) -> None:
        """Give every lease back (SIGTERM): on the worker's connection, or on a new one if that one is gone (its
        session ended by the watchdog)."""
        conn = self.conn
        if conn is not None and not conn.closed and not conn.broken:
            try:
                conn.execute("SELECT storetopics._worker_stop(%s)", (self.id,))
                return
            except psycopg.Error:
                pass
        try:
            with psycopg.connect(self.opts.dsn, autocommit=True, connect_timeout=5,
                                 application_name="storetopics-worker") as c:
                c.execute("SELECT storetopics._worker_stop(%s)", (self.id,))
        except psycopg.Error as e:
            self.log(f"cannot give the leases back ({' '.join(str(e).split())[:200]}); they run out after "
                     f"{self.opts.lease:g}s", level=logging.WARNING)

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

    def work_one(self) -> bool:
        """One pass, top to bottom: claim a due store (storetopics._claim: a lease), fold its source, the refresh pass
        under the lease (refresh.refresh_store: fit when due, the words and the keyword gate, the labels due, render
        under the lease), hand the store back (storetopics._work_done).  Returns False when no store was due."""
        row = self.conn.execute("SELECT source_id, store_key, generation, takeover "
                                "FROM storetopics._claim(%s, %s, 1, %s)",
                                (self.id, self.opts.lease, self.opts.now)).fetchone()
        if row is None:
            return False
        source, store, generation, takeover = row
        if takeover:
            self.log(f"{source}:{store}: taking over an expired lease")
        self.log(f"claim {source}:{store} generation {generation}", debug=True)
        lease = refresh.Lease(self.id, self.stopping, self.opts.verbose)
        self.current = (source, store)
        calls = 0
        t0 = time.monotonic()
        try:
            with self._source_sql():
                folded = self.fold_source(source)
                lease.check(self.conn, source, store)
                p = refresh.refresh_store(self.conn, source, store, lease=lease)
            calls = p.labels.calls
            self.stats.label_calls += calls
            if p.changed is None:
                raise LeaseLost()
            # what cannot run here (a labeller without its key, SDK or server; clustering without its extra): the
            # summary was rendered without it, and the pass counts as failed (status shows why, and it is tried
            # again with backoff, not at every poll); said once per pass, not once per cluster
            missing = "; ".join(" ".join(str(e).split()) for e in p.unavailable) or None
            self._releasing(source, store)
            outcome = self.conn.execute("SELECT storetopics._work_done(%s, %s, %s, %s, %s, %s, %s)",
                                        (self.id, source, store, generation, p.changed, missing, calls)).fetchone()[0]
            self.stats.passes += 1
            self.stats.failed += bool(missing)
            self.stats.regenerated += bool(p.changed)
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
            line = (f"pass {source}:{store}: folded {folded} files{', fitted' if p.fitted else ''}, {calls} "
                    f"labelling calls, {'summary changed' if p.changed else 'summary unchanged'}"
                    f"{', file novelty kept again' if p.novelty_kept else ''}, {outcome} "
                    f"({time.monotonic() - t0:.2f}s)")
            if missing:
                self.log(f"{line}: {missing}; rendered without it (old labels kept), tried again with backoff",
                         level=logging.WARNING, source=source, store=store, outcome=outcome)
            else:
                self.log(line, debug=not p.changed and not p.fitted and not calls and not p.novelty_kept,
                         source=source, store=store, outcome=outcome)
        except LeaseLost:
            self._releasing(source, store)
            self.log(f"{source}:{store}: lease lost (another worker has it); nothing written")
        except Stopping:
            self._releasing(source, store)
            self._give_back()
            self.log(f"{source}:{store}: stopping; lease given back (the store stays dirty)")
            raise
        except Exception as e:  # a failed pass: keep the old summary, back off, retry later
            if isinstance(e, psycopg.Error) and self.connection_lost(e):
                raise
            self._failed(source, store, generation, e, calls)
        finally:
            self.current = None
        return True

    def _failed(self, source: int, store: str, generation: int, e: Exception, calls: int) -> None:
        msg = " ".join((str(e) if isinstance(e, TimeLimit) else f"{type(e).__name__}: {e}").split())
        self.stats.failed += 1
        self.log(f"{source}:{store}: pass failed: {msg}", level=logging.WARNING, source=source, store=store)
        self._releasing(source, store)
        self.conn.execute("SELECT storetopics._work_done(%s, %s, %s, %s, false, %s, %s)",
                          (self.id, source, store, generation, msg, calls))

    # -- the loop --------------------------------------------------------------------------------------------
    def tick(self) -> bool:
        """Do what is due now.  Returns whether anything was done."""
        did = False
        self.conn.execute("SELECT storetopics._verify_due()")   # the periodic count check (settings.verify_every)
        # a table dropped where no event trigger saw it (managed Postgres): its source is skipped (claim,
        # sources_to_fold), said once
        for source, oid in self.conn.execute(
                "SELECT s.id, s.chunks::oid FROM storetopics.sources s "
                "WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = s.chunks)").fetchall():
            if source not in self._fold_warned:
                self._fold_warned.add(source)
                self.log(f"source {source}: its table (oid {oid}) was dropped without being detached; skipped. "
                         "Forget it with SELECT * FROM storetopics.detach_dropped()", level=logging.WARNING)
        for (source,) in self.conn.execute("SELECT storetopics._sources_to_fold(%s)", (self.opts.now,)).fetchall():
            if self.stopping.is_set():
                raise Stopping()
            failures, next_try = self._fold_backoff.get(source, (0, 0.0))
            if next_try > time.monotonic():
                continue
            try:
                with self._source_sql():
                    folded = self.fold_source(source)
                self._fold_backoff.pop(source, None)
                if folded:
                    self.stats.folded_sources += 1
                    did = True
            except (psycopg.Error, TimeLimit) as e:   # its table was dropped without detach, its SQL ran into the
                if isinstance(e, psycopg.Error) and self.connection_lost(e):   # time limit...: say so once, back
                    raise                                                       # off as work_done does, carry on
                wait = min(600.0, 5.0 * 2 ** min(failures, 20)) * (0.5 + random.random() / 2)
                self._fold_backoff[source] = (failures + 1, time.monotonic() + wait)
                if source not in self._fold_warned:
                    self._fold_warned.add(source)
                    self.log(f"cannot fold source {source}: {' '.join(str(e).split())}", level=logging.WARNING)
        while not self.stopping.is_set() and self.work_one():
            did = True
        return did

    def say_what_waits(self, most: int = 10) -> None:
        """--once: what is left for a later run (not due yet: the debounce, max_staleness, a backoff; paused), and
        when each comes due, so that a first run that did nothing says why."""
        try:
            rows = api.waiting(self.conn)
        except psycopg.Error as e:   # (an older schema without work_due()): the run itself went fine
            self.log(f"cannot say what waits: {' '.join(str(e).split())[:200]}", debug=True)
            return
        if not rows:
            return
        shown = "; ".join(api.describe_wait(r) for r in rows[:most])
        more = f"; and {len(rows) - most} more" if len(rows) > most else ""
        self.log(f"left for a later run: {shown}{more}. `storetopics worker --once --now` (no debounce) or "
                 f"`storetopics backfill` does them now; `storetopics status` lists them")

    def _wait(self) -> None:
        nxt = self.conn.execute("SELECT storetopics._next_due()").fetchone()[0]
        timeout = self.opts.poll if nxt is None else max(0.05, min(self.opts.poll, nxt + 0.02))
        deadline = time.monotonic() + timeout
        # notifies() waits on the socket; wake at least every 0.5 s to notice SIGTERM
        self.conn.listening = True
        try:
            while not self.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in self.conn.notifies(timeout=min(left, 0.5), stop_after=1):
                    return
        finally:
            self.conn.listening = False

    def run(self) -> int:
        def on_signal(signum, frame):
            if self.stopped_at is None:
                self.stopped_at = time.monotonic()
            self.stopping.set()
            self.watch.wake.set()     # the watchdog cancels the statement running, if any
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, on_signal)
            except ValueError:  # not the main thread (tests may run a worker in a thread)
                pass
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True, name="storetopics-heartbeat")
        # the tokenizer, loaded now rather than inside a pass's render transaction (which holds the store's work row)
        from . import tokens
        tokens.count("")
        limit = f"{self.opts.statement_timeout:g}s" if self.opts.statement_timeout > 0 else "none"
        self.log(f"started (lease {self.opts.lease:g}s, poll {self.opts.poll:g}s, statement timeout {limit}"
                 f"{', once' if self.opts.once else ''}{', now: no debounce' if self.opts.now else ''})")
        try:
            self.conn = self._connect_with_backoff(first=True)
            self.conn.execute("SELECT storetopics._worker_heartbeat(%s, %s, %s, %s)",
                              (self.id, socket.gethostname(), os.getpid(), self.opts.lease))
            self._hb_thread.start()
            self.watch.thread.start()
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
                    self.conn.execute("SELECT storetopics._worker_stop(%s)", (self.id,))
                    self.conn.execute("SELECT storetopics._worker_heartbeat(%s, %s, %s, %s)",
                                      (self.id, socket.gethostname(), os.getpid(), self.opts.lease))
                    self.log("reconnected; listening again")
            if self.opts.once and not self.stopping.is_set():
                self.say_what_waits()
        except Stopping:
            pass
        finally:
            self.watch.done.set()
            self._hb_stop.set()
            if self._hb_thread.is_alive():
                self._hb_thread.join(timeout=5)
            if self.conn is not None:
                self._give_back()
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
    p.add_argument("--now", action="store_true", default=config.env("now", False, bool),
                   help="no debounce: every dirty store, and every table with pending changes, is due at once (a "
                        "failed pass's backoff still holds); with --once, a first run does everything now "
                        "[$STORETOPICS_NOW]")
    p.add_argument("--lease", type=float, default=config.env("lease", config.LEASE, float), metavar="S",
                   help=f"seconds a claimed store stays ours without a heartbeat (default {config.LEASE:g}): how "
                        "soon another worker takes over after a crash [$STORETOPICS_LEASE]")
    p.add_argument("--poll", type=float, default=config.env("poll", config.POLL, float), metavar="S",
                   help=f"seconds between polls when no NOTIFY arrives (default {config.POLL:g}) [$STORETOPICS_POLL]")
    p.add_argument("--batch", type=int, default=config.env("batch", config.BATCH, int), metavar="N",
                   help=f"files per fold transaction (default {config.BATCH}) [$STORETOPICS_BATCH]")
    p.add_argument("--statement-timeout", type=float, metavar="S",
                   default=config.env("statement_timeout", config.STATEMENT_TIMEOUT, float),
                   help=f"seconds one statement may run (default {config.STATEMENT_TIMEOUT:g}; 0: no limit): a "
                        "source's SQL cannot hold the worker longer; a pass that runs into it fails "
                        "[$STORETOPICS_STATEMENT_TIMEOUT]")
    p.add_argument("--id", default=config.env("id", None), metavar="NAME",
                   help="worker name in `status` (default host:pid:random) [$STORETOPICS_ID]")
    p.add_argument("-v", "--verbose", action="store_true", default=config.env("verbose", False, bool),
                   help="log every claim, pass and labelling call at info level [$STORETOPICS_VERBOSE]")


def options(args) -> Options:
    if args.lease <= 0 or args.poll <= 0 or args.batch < 1:
        raise ValueError("--lease and --poll must be positive and --batch at least 1")
    if not args.statement_timeout >= 0:
        raise ValueError("--statement-timeout must be 0 (no limit) or positive")
    return Options(dsn=args.dsn, once=args.once, lease=args.lease, poll=args.poll, batch=args.batch,
                   worker_id=args.id, verbose=args.verbose, statement_timeout=args.statement_timeout, now=args.now)


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
    try:
        return run(opts)
    except api.StoretopicsError as e:   # (a standby): the CLI's one-line error
        from .errors import report_error
        report_error(e.message, e.hint)
        return 1


if __name__ == "__main__":
    sys.exit(main())
