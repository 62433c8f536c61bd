"""Install the storetopics SQL without the extension mechanism (managed Postgres), or check an installation.

The SQL is the extension's own versioned script: `sql/storetopics--<version>.sql`, then upgrade scripts
`sql/storetopics--<a>--<b>.sql` in order, exactly as ALTER EXTENSION would run them.  The installed version is
recorded in storetopics.meta, so `storetopics install` on an older plain install upgrades it.
"""
from __future__ import annotations

from importlib import resources

import psycopg

# The versioned scripts: package data of the subpackage storetopics.sql (the repository's sql/ folder).
SQL_DIR = resources.files("storetopics.sql")


class InstallError(RuntimeError):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(f"{message} (hint: {hint})" if hint else message)
        self.message, self.hint = message, hint


# storetopics' own tables hold vectors (cluster centroids), so the vector type must exist before its script runs,
# whether the tables attached later have an embedding column or not: there is no install without pgvector.
PGVECTOR_HINT = ("install pgvector on the database server (https://github.com/pgvector/pgvector), run "
                 "CREATE EXTENSION vector in this database as a superuser, then install storetopics again")


def require_pgvector(conn: psycopg.Connection) -> None:
    """Create pgvector in the database if it is not there; one clear InstallError when that cannot be done."""
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return
    if not conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone():
        raise InstallError("storetopics needs pgvector, which is not installed on this database server",
                           PGVECTOR_HINT)
    try:
        with conn.transaction():
            conn.execute("CREATE EXTENSION vector")
    except psycopg.Error as e:
        raise InstallError(f"storetopics needs pgvector, and CREATE EXTENSION vector failed: "
                           f"{e.diag.message_primary or e}", PGVECTOR_HINT) from e


def _scripts() -> list[str]:
    return sorted(p.name for p in SQL_DIR.iterdir() if p.name.startswith("storetopics--") and p.name.endswith(".sql"))


def _key(version: str) -> list[int]:
    return [int(x) for x in version.split(".")]


def default_version() -> str:
    """The newest install script shipped (storetopics.control's default_version names the same one)."""
    versions = [name[len("storetopics--"):-4] for name in _scripts() if "--" not in name[len("storetopics--"):]]
    return max(versions, key=_key)


def script(name: str) -> str:
    text = (SQL_DIR / name).read_text()
    # The extension scripts start with a psql guard that makes `psql -f` stop; the plain path skips that line.
    return "\n".join(line for line in text.splitlines() if not line.startswith("\\echo"))


def upgrade_path(current: str, target: str) -> list[str]:
    steps, version = [], current
    while version != target:
        nxt = [name for name in _scripts() if name.startswith(f"storetopics--{version}--")]
        if not nxt:
            raise InstallError(f"no upgrade script from storetopics {version} towards {target}")
        step = max(nxt, key=lambda name: _key(name[:-4].split("--")[2]))
        steps.append(step)
        version = step[:-4].split("--")[2]
    return steps


def installed(conn: psycopg.Connection) -> tuple[str | None, str | None]:
    """(how, version): how is 'extension', 'script' or None."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()
    if row:
        return "extension", row[0]
    if conn.execute("SELECT to_regclass('storetopics.meta')").fetchone()[0] is None:
        return None, None
    row = conn.execute("SELECT value FROM storetopics.meta WHERE key = 'version'").fetchone()
    return "script", row[0] if row else None


def install(dsn: str, *, extension: bool = False, version: str | None = None, log=print) -> str:
    """Install or upgrade storetopics in the database at dsn.  Returns the installed version."""
    target = version or default_version()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('storetopics install'))")
            how, current = installed(conn)
            if extension:
                if how == "script":
                    raise InstallError("storetopics is installed as a plain script here; "
                                       "keep using `storetopics install`")
                require_pgvector(conn)
                conn.execute("CREATE EXTENSION IF NOT EXISTS storetopics CASCADE")
                if how == "extension" and current != target:
                    conn.execute(f"ALTER EXTENSION storetopics UPDATE TO '{target}'")
                return installed(conn)[1]
            if how == "extension":
                raise InstallError("storetopics is installed as an extension here; upgrade it with ALTER EXTENSION")
            require_pgvector(conn)
            if how is None:
                conn.execute("CREATE SCHEMA storetopics")
                conn.execute(script(f"storetopics--{target}.sql"))
                log(f"storetopics install: installed {target}")
            elif current != target:
                for step in upgrade_path(current, target):
                    conn.execute(script(step))
                    log(f"storetopics install: applied {step}")
                conn.execute("UPDATE storetopics.meta SET value = %s WHERE key = 'version'", (target,))
            else:
                log(f"storetopics install: {target} already installed")
            return target
