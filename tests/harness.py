"""Real PostgreSQL servers for the tests, the benchmarks and the evaluation: a throwaway cluster (the demo's
LocalPostgres in a temp dir), or the server named by STORETOPICS_TEST_DSN; a throwaway primary with a streaming hot
standby (replica()).

`python -m tests.harness regress` runs the extension's pg_regress suite (`make installcheck`) against a
throwaway cluster.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import conninfo

from lab.localpg import DEFAULT_BINDIR, LocalPostgres

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def server():
    """Yields an admin DSN.  STORETOPICS_TEST_DSN wins; else a throwaway cluster in a temp dir."""
    given = os.environ.get("STORETOPICS_TEST_DSN")
    if given:
        yield given
        return
    with cluster() as pg:
        yield pg.dsn()


@contextlib.contextmanager
def cluster(settings=None):
    """Yields a throwaway cluster (LocalPostgres), running, in a temp dir.  settings: a dict for its
    postgresql.conf, or a function of the (not yet initialised) cluster that returns one (pg_cron_settings)."""
    tmp = tempfile.mkdtemp(prefix="storetopics-pg-")
    os.chmod(tmp, 0o755)  # the unprivileged server user must be able to enter it
    pg = LocalPostgres(Path(tmp) / "data")
    pg.settings.update(settings(pg) if callable(settings) else settings or {})
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


def pg_cron_settings(database: str = "postgres"):
    """For cluster(): a server that runs pg_cron (Debian's postgresql-15-cron), its scheduler in `database`, the
    jobs' connections over the cluster's own unix socket (cron.host: a directory means a socket there)."""
    return lambda pg: {"shared_preload_libraries": "pg_cron", "cron.database_name": database,
                       "cron.host": str(pg.sockdir)}


def pg_cron_installed(bindir: Path = DEFAULT_BINDIR) -> bool:
    """Whether the server's library directory holds pg_cron."""
    lib = subprocess.run([str(bindir / "pg_config"), "--pkglibdir"], capture_output=True, text=True)
    return lib.returncode == 0 and (Path(lib.stdout.strip()) / "pg_cron.so").exists()


@contextlib.contextmanager
def replica(settings: dict[str, str] | None = None):
    """Yields (primary, standby): two throwaway clusters (LocalPostgres) on unix sockets, the second a streaming hot
    standby of the first (pg_basebackup -R), both running; `settings` go to both.  Always local: a replica of
    STORETOPICS_TEST_DSN's server cannot be made from here."""
    tmp = tempfile.mkdtemp(prefix="storetopics-replica-")
    os.chmod(tmp, 0o755)
    primary = LocalPostgres(Path(tmp) / "primary", settings=settings)
    standby = None
    try:
        primary.start()
        standby = primary.standby(Path(tmp) / "standby")
        standby.start()
        yield primary, standby
    finally:
        for pg in (standby, primary):
            if pg is not None:
                pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


def replayed(primary_dsn: str, standby_dsn: str, timeout: float = 30.0) -> float:
    """Waits until the standby has replayed everything the primary had written when called (its WAL position then);
    returns the seconds that took.  Both DSNs name the same database's servers (any database will do)."""
    start = time.monotonic()
    with psycopg.connect(primary_dsn, autocommit=True) as p:
        lsn = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    with psycopg.connect(standby_dsn, autocommit=True) as s:
        while not s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0]:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the standby did not replay up to {lsn} within {timeout:g}s")
            time.sleep(0.01)
    return time.monotonic() - start


def with_db(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


def create_database(admin_dsn: str, *, template: str | None = None, prefix: str = "st") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        tpl = f" TEMPLATE {template}" if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{tpl}')
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def regress() -> int:
    with server() as dsn:
        params = conninfo.conninfo_to_dict(dsn)
        env = dict(os.environ, PGHOST=params.get("host", ""), PGPORT=str(params.get("port", "5432")),
                   PGUSER=params.get("user", "postgres"))
        outdir = tempfile.mkdtemp(prefix="storetopics-regress-")
        os.chmod(outdir, 0o777)
        r = subprocess.run(["make", "-s", "installcheck", f"REGRESS_OUTDIR={outdir}"], cwd=REPO, env=env)
        if os.environ.get("STORETOPICS_KEEP_REGRESS"):
            print("results in", outdir)
        diffs = Path(outdir) / "regression.diffs"
        if r.returncode != 0 and diffs.exists():
            sys.stdout.write(diffs.read_text()[-20000:])
        return r.returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["regress"]:
        sys.exit(regress())
    print("usage: python -m tests.harness regress", file=sys.stderr)
    sys.exit(2)
