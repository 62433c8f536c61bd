"""Real PostgreSQL servers for tests: a throwaway cluster, or the server named by STORETOPICS_TEST_DSN.

`python -m lab.testing regress` runs the extension's pg_regress suite (`make installcheck`) against a
throwaway cluster.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import conninfo

from .localpg import LocalPostgres

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def server():
    """Yields an admin DSN.  STORETOPICS_TEST_DSN wins; else a throwaway cluster in a temp dir."""
    given = os.environ.get("STORETOPICS_TEST_DSN")
    if given:
        yield given
        return
    tmp = tempfile.mkdtemp(prefix="storetopics-pg-")
    os.chmod(tmp, 0o755)  # the unprivileged server user must be able to enter it
    pg = LocalPostgres(Path(tmp) / "data")
    try:
        pg.start()
        yield pg.dsn()
    finally:
        pg.destroy()
        with contextlib.suppress(OSError):
            os.rmdir(tmp)


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
    print("usage: python -m lab.testing regress", file=sys.stderr)
    sys.exit(2)
