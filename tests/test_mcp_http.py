"""`storetopics mcp --http`: what stands between the network and the MCP handlers, with real HTTP requests to a real
server process on loopback addresses only (127.0.0.x; never any other address), against a real Postgres.

* the Host and Origin headers are checked first (DNS rebinding): by default the bind address, localhost, 127.0.0.1
  and [::1] with the port; --allowed-host adds names; a bad Host is 421, a bad Origin 403;
* --auth-token / $STORETOPICS_MCP_TOKEN: a bearer token on every request, else 401;
* --max-sessions: past it a new session is a 503; --session-timeout: idle sessions are closed;
* a non-loopback address without a token is refused before anything is bound (unless --allow-unauthenticated);
* a client that goes away mid-request is a debug line, not a traceback; a hostile NOTIFY does not break the server.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP server needs the extra `mcp`")

import anyio  # noqa: E402
import httpx  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402

from storetopics import cli  # noqa: E402
from storetopics import mcp as st_mcp  # noqa: E402
from tests.test_mcp import REPO, TIMEOUT, _json, _setup, _tools  # noqa: E402

TOKEN = "s3cret-token-for-the-tests-0123456789"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """`storetopics mcp --http HOST:PORT` as a process; its log (stderr) in a file."""

    def __init__(self, dsn: str, host: str, *flags: str, env: dict | None = None, log_level: str = "info"):
        assert host.startswith("127.0.0."), "the tests bind loopback addresses only"
        self.host, self.port = host, _free_port(host)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="storetopics-mcp-http-", suffix=".log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "storetopics.cli", "--dsn", dsn, "--log-level", log_level, "mcp",
             "--http", f"{host}:{self.port}", *flags],
            stdout=subprocess.DEVNULL, stderr=self.log, cwd=str(REPO), env={**os.environ, **(env or {})})
        deadline = time.monotonic() + TIMEOUT
        while "listening on storetopics_updated" not in self.text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    def text(self) -> str:
        return Path(self.log.name).read_text()

    def post(self, body: dict, **headers: str) -> httpx.Response:
        return httpx.post(self.url, json=body, headers={**HEADERS, **headers}, timeout=30)

    def open_session(self, **headers: str) -> str:
        r = self.post(INIT, **headers)
        assert r.status_code == 200, (r.status_code, r.text)
        sid = r.headers["mcp-session-id"]
        r = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, **{"mcp-session-id": sid},
                      **headers)
        assert r.status_code == 202, (r.status_code, r.text)
        return sid

    def close(self) -> str:
        self.proc.terminate()
        code = self.proc.wait(timeout=30)
        text = self.text()
        self.log.close()
        assert code in (0, -15), text
        return text


@contextlib.contextmanager
def server(dsn: str, host: str, *flags: str, **kwargs):
    s = Server(dsn, host, *flags, **kwargs)
    try:
        yield s
    except BaseException:
        sys.stderr.write("--- server log ---\n" + s.text())
        raise
    finally:
        if s.proc.poll() is None:
            s.close()


@contextlib.asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str]):
    try:
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:   # older releases
        from mcp.client.streamable_http import streamablehttp_client
        cm = streamablehttp_client(url, headers=headers)
    else:
        cm = streamable_http_client(url, http_client=httpx.AsyncClient(headers=headers, timeout=60))
    async with cm as (read, write, _), ClientSession(read, write) as session:
        with anyio.fail_after(TIMEOUT):
            await session.initialize()
        yield session


def test_host_and_origin_are_checked_before_anything_else(dsn, conn):
    """On 127.0.0.2 (a loopback address that is not 127.0.0.1): a request naming another host is refused (421), one
    from another origin too (403), before any MCP handling; the bind address, localhost, 127.0.0.1 and [::1] with
    the port, and the names given with --allowed-host, pass."""
    _setup(conn)
    with server(dsn, "127.0.0.2", "--allowed-host", "mcp.test", "--allowed-host", "other.test:8443") as s:
        p = s.port
        for host in ("evil.example", f"evil.example:{p}", "127.0.0.2", f"127.0.0.2:{p + 1}", f"localhost.evil:{p}",
                     f"mcp.test.evil:{p}", "other.test", f"other.test:{p}", ""):
            r = s.post(INIT, Host=host)
            assert r.status_code == 421, (host, r.status_code, r.text)
            assert "mcp-session-id" not in r.headers
        for origin in ("http://evil.example", f"http://evil.example:{p}", "null", f"http://127.0.0.2:{p}.evil",
                       f"https://localhost:{p + 1}"):
            r = s.post(INIT, Origin=origin)
            assert r.status_code == 403, (origin, r.status_code, r.text)
        for host in (f"127.0.0.2:{p}", f"localhost:{p}", f"127.0.0.1:{p}", f"[::1]:{p}", "mcp.test", f"mcp.test:{p}",
                     "other.test:8443"):
            assert s.post(INIT, Host=host).status_code == 200, host
        for origin in (f"http://127.0.0.2:{p}", f"http://localhost:{p}", "https://mcp.test", f"http://mcp.test:{p}"):
            assert s.post(INIT, Origin=origin).status_code == 200, origin
        # the default list without --allowed-host: the same refusals, the loopback names pass
    with server(dsn, "127.0.0.2") as s:
        assert s.post(INIT, Host="evil.example").status_code == 421
        assert s.post(INIT, Host="mcp.test").status_code == 421
        assert s.post(INIT, Host=f"localhost:{s.port}").status_code == 200


def test_a_bearer_token_guards_every_request(dsn, conn):
    """--auth-token (here from $STORETOPICS_MCP_TOKEN): without it, with another one or another scheme, 401 and no
    session; with it, a whole MCP session works.  A hostile NOTIFY does not stop the HTTP server; a client that
    disconnects mid-request is a quiet debug line."""
    source = _setup(conn)
    with server(dsn, "127.0.0.3", env={"STORETOPICS_MCP_TOKEN": TOKEN}, log_level="debug") as s:
        for auth in (None, "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Basic {TOKEN}",
                     f"Bearer  {TOKEN} extra", TOKEN):
            r = s.post(INIT, **({"Authorization": auth} if auth is not None else {}))
            assert r.status_code == 401, (auth, r.status_code, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer") and "mcp-session-id" not in r.headers
        assert httpx.get(s.url, headers={"Accept": "text/event-stream"}).status_code == 401
        # the Host check comes first, token or not
        assert s.post(INIT, Host="evil.example", Authorization=f"Bearer {TOKEN}").status_code == 421
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert s.post(INIT, **{"authorization": f"bearer {TOKEN}"}).status_code == 200   # the scheme: any case
        sid = s.open_session(**auth)
        r = s.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, **{"mcp-session-id": sid})
        assert r.status_code == 401                                        # a session id is no credential

        # a client that goes away in the middle of sending its request
        with socket.create_connection((s.host, s.port)) as sock:
            sock.sendall((f"POST /mcp HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                          f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
                          f"mcp-session-id: {sid}\r\nContent-Length: 500\r\n\r\n{{\"jsonrpc\"").encode())
            time.sleep(0.3)
        with socket.create_connection((s.host, s.port)) as sock:   # and one that drops its GET stream
            sock.sendall((f"GET /mcp HTTP/1.1\r\nHost: {s.host}:{s.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                          f"Accept: text/event-stream\r\nmcp-session-id: {sid}\r\n"
                          f"mcp-protocol-version: 2025-06-18\r\n\r\n").encode())
            time.sleep(0.3)
        # any role may NOTIFY anything
        conn.execute("SELECT pg_notify('storetopics_updated', '²:x')")
        time.sleep(2 * st_mcp.COALESCE_SECONDS + 0.5)

        async def main():
            async with mcp_session(s.url, auth) as session:
                assert {"route", "search_games", "search_kitchen"} <= set(_tools(await session.list_tools()))
                hits = _json(await session.call_tool("search_games", {"query": "backgammon"}))
                assert {r["file_key"] for r in hits["results"]} == {"3", "4"}
                body = await session.read_resource(f"storetopics://{source}/games")
                assert body.contents

        anyio.run(main)
        deadline = time.monotonic() + 10
        while "client disconnected" not in s.text():
            assert time.monotonic() < deadline, s.text()
            time.sleep(0.1)
        log = s.close()
    assert "Traceback" not in log and "Error handling POST request" not in log and "Received exception" not in log, log
    assert TOKEN not in log


def test_sessions_are_capped_and_idle_ones_closed(dsn, conn):
    _setup(conn)
    with server(dsn, "127.0.0.4", "--max-sessions", "2", "--session-timeout", "1") as s:
        first = [s.open_session(), s.open_session()]
        r = s.post(INIT)
        assert r.status_code == 503 and "sessions" in r.text.lower(), (r.status_code, r.text)
        # the sessions are idle (no request in flight, no open stream): after the timeout they are gone
        deadline = time.monotonic() + 30
        while (r := s.post(INIT)).status_code == 503:
            assert time.monotonic() < deadline, "idle sessions were kept"
            time.sleep(0.25)
        assert r.status_code == 200
        # (each session has its own timer: the first to end frees the slot, the other may end a moment later; a
        # request to it before then would be activity that keeps it.  One timeout more and both are past theirs.
        # Seen under make test's load: 200 for the second.)
        time.sleep(1.5)
        for sid in first:
            assert s.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                          **{"mcp-session-id": sid}).status_code == 404


# `storetopics mcp` in a process where binding any address but a 127.0.0.x one fails (so that a server that would
# not refuse a non-loopback address still binds nothing but loopback in these tests)
LOOPBACK_ONLY = """
import socket, sys
bind = socket.socket.bind
def loopback_only(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not str(address[0]).startswith("127.0.0."):
        raise PermissionError(f"test: binding {address!r} is not allowed")
    return bind(self, address)
socket.socket.bind = loopback_only
from storetopics import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOOPBACK_ONLY, "--dsn", "host=/nonexistent", "mcp", *args],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO),
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None})


def test_a_non_loopback_address_needs_a_token():
    """Refused before anything is bound or connected (the DSN leads nowhere): a clear one-line error, exit 1."""
    for addr in ("0.0.0.0:8000", "[::]:8000", "192.0.2.1:8000", "example.com:8000", "localhost.example:80"):
        r = _cli("--http", addr, env={"STORETOPICS_MCP_TOKEN": None})
        assert r.returncode == 1 and r.stdout == "", (addr, r.stderr)
        assert "--auth-token" in r.stderr and "--allow-unauthenticated" in r.stderr and "loopback" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for flags, msg in ((["--http", "127.0.0.1:8000", "--auth-token", "short"], "at least 16"),
                       (["--auth-token", TOKEN], "--http"), (["--allowed-host", "x.test"], "--http"),
                       (["--allow-unauthenticated"], "--http"), (["--max-sessions", "5"], "--http"),
                       (["--http", "127.0.0.1:8000", "--max-sessions", "0"], "max-sessions"),
                       (["--http", "127.0.0.1:8000", "--session-timeout", "0"], "session-timeout"),
                       (["--http", "127.0.0.1:8000", "--allowed-host", "a b"], "allowed-host")):
        r = _cli(*flags, env={"STORETOPICS_MCP_TOKEN": None})
        assert r.returncode == 1 and msg in r.stderr and r.stdout == "", (flags, r.stderr)

    def opts(*args: str, **env: str | None):
        old = os.environ.get("STORETOPICS_MCP_TOKEN")
        os.environ.pop("STORETOPICS_MCP_TOKEN", None)
        if env.get("token"):
            os.environ["STORETOPICS_MCP_TOKEN"] = env["token"]
        try:
            return st_mcp.options(cli.build_parser().parse_args(["mcp", *args]))
        finally:
            os.environ.pop("STORETOPICS_MCP_TOKEN", None)
            if old is not None:
                os.environ["STORETOPICS_MCP_TOKEN"] = old

    # what is accepted (nothing is started here)
    o = opts("--http", "0.0.0.0:8000", "--allow-unauthenticated")
    assert o.http == ("0.0.0.0", 8000) and o.auth_token is None and o.allow_unauthenticated
    assert opts("--http", "0.0.0.0:8000", "--auth-token", TOKEN).auth_token == TOKEN
    assert opts("--http", "[::]:8000", token=TOKEN).auth_token == TOKEN
    o = opts("--http", "127.0.0.1:8000")
    assert o.auth_token is None and o.max_sessions == st_mcp.MAX_SESSIONS and o.allowed_hosts == ()
    assert opts("--http", "[::1]:8000").http == ("::1", 8000)
    assert opts().auth_token is None and opts(token=TOKEN).http is None   # stdio: the variable is not needed
    assert st_mcp.allowed_hosts("127.0.0.2", 8000, ("mcp.test", "b.test:443")) == [
        "127.0.0.2:8000", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "mcp.test:8000", "mcp.test",
        "b.test:443"]
    assert st_mcp.allowed_hosts("::1", 9, ())[0] == "[::1]:9"
