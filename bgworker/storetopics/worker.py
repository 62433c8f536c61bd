"""`storetopics worker`: keeps every store's summary fresh, debounced and drift-gated, safely from many processes.

    storetopics worker [--once] [--lease S] [--poll S] [--batch N] [--id NAME] [-v]
    python -m storetopics.worker [--dsn DSN] ...    (the same, without loading the rest of the CLI: starts faster)

The loop (one worker process; run as many as you like, on as many machines):
  * wake on NOTIFY storetopics_dirty (a hint only) or after --poll seconds, whichever comes first;
  * fold the sources whose logged changes name no store (deletes, TRUNCATE, attach) once they are quiet;
  * claim one due store with storetopics.claim() (FOR UPDATE SKIP LOCKED + a lease with an expiry; a store is due
    when quiet for its source's `debounce`, or dirty for `max_staleness`), then in order: fold its source's pending
    changes, fit its clusters if a gate says so (outliers > refit_outliers, no fit yet, another dimension), refresh
    the words of clusters new outliers joined (keyword gate), ask the labeller for the labels the gates made due,
    render (only if the lease is still ours), and hand the store back with storetopics.work_done() (compare-and-set
    on the store's generation: a store changed underneath stays dirty).
  * No transaction is open while a fit runs or a labelling call waits: every statement commits on its own
    (autocommit).  A heartbeat thread renews the lease; after SIGKILL it just runs out and another worker takes over.
  * SIGTERM/SIGINT: the pass stops at its next step, the lease is given back (the store stays dirty), exit 0.
  * Postgres gone: reconnect with exponential backoff and jitter, LISTEN again, carry on (polling catches up).
"""
from __future__ import annotations

import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TextIO

import psycopg

from . import refresh
from .labels import make_labeler

FOLD_SECONDS = 30.0   # fold at most this long before processing a store (under a continuous stream of writes)


class Stopping(Exception):
    """SIGTERM arrived: give the store back."""


class LeaseLost(Exception):
    """Another worker holds the store now (ours expired): write nothing more."""


@dataclass
class Options:
    dsn: str = ""
    once: bool = False
    lease: float = 60.0        # seconds; renewed every lease/3 by the heartbeat
    poll: float = 5.0          # seconds between polls when no NOTIFY comes
    batch: int = 500           # files per fold transaction
    worker_id: str | None = None
    verbose: bool = False
    max_backoff: float = 15.0  # reconnect backoff cap, seconds


@dataclass
class Stats:
    passes: int = 0
    regenerated: int = 0
    failed: int = 0
    label_calls: int = 0
    folded_sources: int = 0
    reconnects: int = 0
    outcomes: dict = field(default_factory=dict)


class _LeaseCheckingLabeller:
    """Wraps a labeller: before each call, check that the lease is still ours (no call for a store another worker
    has taken over), and tell the log when a call starts and ends."""

    def __init__(self, inner, worker: "Worker", source: int, store: str):
        self.inner, self.worker, self.source, self.store = inner, worker, source, store
        self.name = inner.name
        self.model = getattr(inner, "model", None)

    def label(self, cluster):
        self.worker.check(self.source, self.store)
        self.worker.log(f"label call {self.source}:{self.store}", debug=True)
        try:
            return self.inner.label(cluster)
        finally:
            self.worker.log(f"label done {self.source}:{self.store}", debug=True)


class Worker:
    def __init__(self, opts: Options, stream: TextIO | None = None):
        self.opts = opts
        self.stream = stream if stream is not None else sys.stderr
        self.id = opts.worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = Stats()
        self.conn: psycopg.Connection | None = None
        self.stopping = threading.Event()
        self.current: tuple[int, str] | None = None
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._fold_warned: set[int] = set()

    # -- logging ---------------------------------------------------------------------------------------------
    def log(self, msg: str, debug: bool = False) -> None:
        if debug and not self.opts.verbose:
            return
        now = time.time()
        stamp = time.strftime('%H:%M:%S', time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
        self.stream.write(f"{stamp} storetopics worker {self.id}: {msg}\n")
        self.stream.flush()

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
                self.log(f"cannot connect ({' '.join(str(e).split())[:200]}); retrying in {wait:.1f}s")
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
        done, started = 0, time.monotonic()
        while time.monotonic() - started < FOLD_SECONDS:
            if self.stopping.is_set():
                raise Stopping()
            n = self.conn.execute("SELECT storetopics.fold(%s, max_files => %s)",
                                  (source, self.opts.batch)).fetchone()[0]
            if not n:
                break
            done += n
        return done

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
            why = refresh.fit_due(conn, source, store)
            fitted = False
            if why:
                self.log(f"fit {source}:{store} ({why})", debug=True)
                report = refresh.fit(conn, source, store)
                fitted = bool(report.get("applied"))
                self.log(f"fitted {source}:{store}: k={report.get('k')} applied={fitted} in "
                         f"{report.get('seconds')}s (read {report.get('seconds_read_sample')}s, fit "
                         f"{report.get('seconds_fit')}s, apply {report.get('seconds_apply')}s)", debug=True)
                self.check(source, store)
            if conn.execute("SELECT EXISTS (SELECT 1 FROM storetopics.clusters k WHERE k.source_id = %s "
                            "AND k.store_key = %s AND k.outliers > k.outliers_seen)", (source, store)).fetchone()[0]:
                conn.execute("SELECT storetopics.refresh_words(%s, %s)", (source, store))
            cfg = refresh.settings(conn, source)
            if cfg.get("labeller", "offline") != "offline" and refresh.stores_to_label(conn, source, store):
                labeller = _LeaseCheckingLabeller(make_labeler(cfg["labeller"], cfg.get("model")), self, source, store)
                stats = refresh.label(conn, source, store, labeller)
                calls = stats.calls
                self.stats.label_calls += calls
                if stats.errors:
                    self.log(f"{stats.errors} labelling call(s) failed for {source}:{store} (old labels kept, "
                             f"retried later): {stats.last_error}")
            self.check(source, store)
            # count_first: words whose token count is not known yet are counted (tiktoken) before the one write
            changed = conn.execute("SELECT storetopics.work_render(%s, %s, %s, true)",
                                   (self.id, source, store)).fetchone()[0]
            if changed is None and refresh.count_tokens(conn, source, store):
                changed = conn.execute("SELECT storetopics.work_render(%s, %s, %s)",
                                       (self.id, source, store)).fetchone()[0]
            if changed is None:
                raise LeaseLost()
            self._releasing(source, store)
            outcome = conn.execute("SELECT storetopics.work_done(%s, %s, %s, %s, %s, NULL, %s)",
                                   (self.id, source, store, generation, changed, calls)).fetchone()[0]
            self.stats.passes += 1
            self.stats.regenerated += bool(changed)
            self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
            self.log(f"pass {source}:{store}: folded {folded} files{', fitted' if fitted else ''}, {calls} labelling "
                     f"calls, {'summary changed' if changed else 'summary unchanged'}, {outcome} "
                     f"({time.monotonic() - t0:.2f}s)", debug=not changed and not fitted and not calls)
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
        self.log(f"{source}:{store}: pass failed: {msg}")
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
                    self.log(f"cannot fold source {source}: {' '.join(str(e).split())}")
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
                        self.log(f"error ({' '.join(str(e).split())[:200]}); retrying in {self.opts.poll:g}s")
                        self.stopping.wait(self.opts.poll)
                        continue
                    self.stats.reconnects += 1
                    self.log(f"lost the database ({' '.join(str(e).split())[:200]}); reconnecting")
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


def run(opts: Options, stream: TextIO | None = None) -> int:
    return Worker(opts, stream).run()


def add_arguments(p) -> None:
    """The worker's flags (shared by `storetopics worker` and `python -m storetopics.worker`)."""
    p.add_argument("--once", action="store_true", help="process what is due now, then exit (cron, tests)")
    p.add_argument("--lease", type=float, default=60.0, metavar="S",
                   help="seconds a claimed store stays ours without a heartbeat (default 60): how soon another "
                        "worker takes over after a crash")
    p.add_argument("--poll", type=float, default=5.0, metavar="S",
                   help="seconds between polls when no NOTIFY arrives (default 5)")
    p.add_argument("--batch", type=int, default=500, metavar="N", help="files per fold transaction (default 500)")
    p.add_argument("--id", metavar="NAME", help="worker name in `status` (default host:pid:random)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every pass and labelling call")


def options(args) -> Options:
    if args.lease <= 0 or args.poll <= 0 or args.batch < 1:
        raise ValueError("--lease and --poll must be positive and --batch at least 1")
    return Options(dsn=args.dsn, once=args.once, lease=args.lease, poll=args.poll, batch=args.batch,
                   worker_id=args.id, verbose=args.verbose)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m storetopics.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("DATABASE_URL", ""),
                   help="libpq connection string or URL (default: $DATABASE_URL, else the PG* variables)")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        opts = options(args)
    except ValueError as e:
        p.error(str(e))
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
