"""A local PostgreSQL cluster owned by the project: for tests (throwaway) and for `make demo` (kept).

initdb refuses to run as root, so when we are root every server command runs as an unprivileged
user (`postgres`, which Debian's server package creates) through `runuser`.  The server listens on a
unix socket in a private directory, so it never collides with another server on this machine.
`standby()` makes a streaming hot standby of a running cluster (pg_basebackup -R), on a socket of its own.
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path


def _default_bindir() -> Path:
    """STORETOPICS_PG_BINDIR; else the bindir of the server the Makefile builds for (PG_CONFIG, or the pg_config on
    PATH) when it holds initdb; else Debian's PostgreSQL 15."""
    if os.environ.get("STORETOPICS_PG_BINDIR"):
        return Path(os.environ["STORETOPICS_PG_BINDIR"])
    try:
        out = subprocess.run([os.environ.get("PG_CONFIG") or "pg_config", "--bindir"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
        return Path(out.stdout.strip())
    return Path("/usr/lib/postgresql/15/bin")


DEFAULT_BINDIR = _default_bindir()
UNPRIVILEGED_USER = os.environ.get("STORETOPICS_PG_OSUSER", "postgres")

# Settings for a cluster that only tests and demos use: durability is not the point.
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "256MB",
    "work_mem": "64MB",
    "maintenance_work_mem": "256MB",
    "max_connections": "100",
    "max_parallel_workers_per_gather": "2",
    "log_min_messages": "warning",
    "dynamic_shared_memory_type": "posix",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    def __init__(self, datadir: str | os.PathLike, port: int | None = None, bindir: Path = DEFAULT_BINDIR,
                 settings: dict[str, str] | None = None):
        self.datadir = Path(datadir).absolute()
        self.sockdir = self.datadir.parent / (self.datadir.name + ".run")
        self.logfile = self.datadir.parent / (self.datadir.name + ".log")
        self.bindir = bindir
        self.settings = dict(FAST_SETTINGS, **(settings or {}))
        self._port = port

    # -- running commands as an unprivileged user ---------------------------------------------
    @property
    def _as_user(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        return ["runuser", "-u", UNPRIVILEGED_USER, "--"]

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam(UNPRIVILEGED_USER)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as_user, *args], check=check, capture_output=True, text=True)

    # -- life cycle ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            portfile = self.datadir / "storetopics.port"
            self._port = int(portfile.read_text()) if portfile.exists() else free_port()
        return self._port

    @property
    def initialized(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def init(self) -> None:
        if not (self.bindir / "initdb").exists():
            raise RuntimeError(f"no PostgreSQL binaries in {self.bindir}; run `make setup`")
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._chown(self.datadir)
        self.datadir.chmod(0o700)
        r = self._run(str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--locale=C.UTF-8", check=False)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write("\n# written by lab.localpg\n")
            for k, v in self.settings.items():
                conf.write(f"{k} = '{v}'\n")
        (self.datadir / "storetopics.port").write_text(str(self.port))

    def running(self) -> bool:
        r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "status", check=False)
        return r.returncode == 0

    def start(self) -> LocalPostgres:
        if not self.initialized:
            self.init()
        if self.running():
            return self
        self.sockdir.mkdir(parents=True, exist_ok=True)
        self._chown(self.sockdir)
        if not self.logfile.exists():
            self.logfile.touch()
        self._chown(self.logfile)
        opts = f"-p {self.port} -k {self.sockdir} -c listen_addresses=''"
        r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.logfile),
                      "-o", opts, "-w", "-t", "60", "start", check=False)
        if r.returncode != 0:
            tail = self.logfile.read_text()[-3000:] if self.logfile.exists() else ""
            raise RuntimeError(f"could not start PostgreSQL:\n{r.stdout}\n{r.stderr}\n{tail}")
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.initialized and self.running():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        for p in (self.datadir, self.sockdir):
            shutil.rmtree(p, ignore_errors=True)
        if self.logfile.exists():
            self.logfile.unlink()

    def standby(self, datadir: str | os.PathLike, port: int | None = None,
                settings: dict[str, str] | None = None) -> LocalPostgres:
        """A streaming hot standby of this cluster (which must be running): a base backup with its WAL
        (`pg_basebackup -R -X stream`, which writes primary_conninfo to this cluster's socket and standby.signal)
        into datadir, with a port and a socket directory of its own and this cluster's settings plus `settings`.
        Returned not started: start() it.  (initdb's pg_hba.conf trusts local replication connections.)"""
        sb = LocalPostgres(datadir, port=port or free_port(), bindir=self.bindir,
                           settings=dict(self.settings, **(settings or {})))
        sb.datadir.mkdir(parents=True, exist_ok=False)
        self._chown(sb.datadir)
        sb.datadir.chmod(0o700)
        r = self._run(str(self.bindir / "pg_basebackup"), "-D", str(sb.datadir), "-h", str(self.sockdir),
                      "-p", str(self.port), "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync",
                      check=False)
        if r.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed:\n{r.stdout}\n{r.stderr}")
        with open(sb.datadir / "postgresql.conf", "a") as conf:   # the primary's, copied: the standby's own after it
            conf.write("\n# written by lab.localpg (standby)\nhot_standby = 'on'\n")
            for k, v in (settings or {}).items():
                conf.write(f"{k} = '{v}'\n")
        (sb.datadir / "storetopics.port").write_text(str(sb.port))   # (the copy holds the primary's)
        return sb

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host={self.sockdir} port={self.port} user={user} dbname={dbname}"

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._run(str(self.bindir / "pg_isready"), "-h", str(self.sockdir), "-p", str(self.port),
                         check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError("PostgreSQL did not become ready")
