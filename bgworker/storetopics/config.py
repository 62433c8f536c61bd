"""Defaults, in one place, and the environment that overrides them.

Every worker flag can also come from the environment (twelve-factor): STORETOPICS_<FLAG> (STORETOPICS_POLL,
STORETOPICS_LEASE, STORETOPICS_BATCH, STORETOPICS_ID, STORETOPICS_ONCE, STORETOPICS_NOW, STORETOPICS_VERBOSE,
STORETOPICS_STATEMENT_TIMEOUT, STORETOPICS_LOG_LEVEL, STORETOPICS_LOG_FORMAT); a flag on the command line wins over
the environment, which wins over the default.  The connection comes from --dsn, else $DATABASE_URL, else libpq's own
PG* variables.

What a store's summary does (debounce, labeller, budgets, gates) is configured in the database, per source, with
storetopics.configure(): those defaults live in the SQL (storetopics._settings()).
"""
from __future__ import annotations

import os

BATCH = 500            # files per fold transaction
LEASE = 60.0           # seconds a claimed store stays a worker's without a heartbeat (renewed every LEASE / 3)
POLL = 5.0             # seconds between polls when no NOTIFY arrives
FOLD_SECONDS = 30.0    # a worker folds at most this long before processing a store (under a continuous stream)
MAX_BACKOFF = 15.0     # reconnect backoff cap, seconds
# seconds one statement of the worker may run (0: no limit): a source's SQL (its key expressions, run as the table's
# owner) cannot hold the shared worker longer.  Well above the longest single statements measured (bench/README.md:
# a 5M-chunk store's render 38 s, a 1M-chunk store's re-assignment after a re-fit 23 s, on 2 cores).
STATEMENT_TIMEOUT = 300.0
CANCEL_GRACE = 1.0     # seconds a statement may run on past its limit (or past SIGTERM) before the worker's client
                       # cancels it, and again before it ends the statement's session (a cancel can be caught)
RECOUNT_EVERY = 3.0    # seconds between recounts of the pending files while `backfill` folds (for its progress bar)
LOG_LEVEL = "info"
LOG_FORMAT = "text"    # text | json
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def dsn() -> str:
    """The connection string when none is given: $DATABASE_URL, else "" (libpq then reads PG* variables)."""
    return os.environ.get("DATABASE_URL", "")


def env(flag: str, default, kind=str):
    """The value of STORETOPICS_<FLAG> parsed as `kind` (str, int, float, bool), else `default`.  A value that does
    not parse is an error that names the variable (a typo in a deployment must not silently mean the default)."""
    name = "STORETOPICS_" + flag.upper().replace("-", "_")
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        if kind is bool:
            if raw.strip().lower() in _TRUE:
                return True
            if raw.strip().lower() in _FALSE:
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
