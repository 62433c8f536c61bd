"""Every test talks to a real PostgreSQL with the real extensions: a throwaway cluster started here (initdb as an
unprivileged user, unix socket, free port), or the server in STORETOPICS_TEST_DSN.  Each test gets its own database,
cloned from a template where vector and storetopics are already installed."""
from __future__ import annotations

import psycopg
import pytest

from storetopics import install as st_install
from tests import harness
from tests.fakes.messages import MessagesServer


@pytest.fixture(scope="session")
def pg_admin_dsn():
    with harness.server() as dsn:
        yield dsn


def _template(admin_dsn: str, how: str, plpython: bool) -> str:
    name = harness.create_database(admin_dsn, prefix=f"tpl_{how}{'_py' if plpython else ''}")
    dsn = harness.with_db(admin_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
        if plpython:
            conn.execute("CREATE EXTENSION plpython3u")
    if how == "extension":
        st_install.install(dsn, extension=True, log=lambda *a: None)
    else:
        st_install.install(dsn, log=lambda *a: None)
    return name


@pytest.fixture(scope="session")
def templates(pg_admin_dsn):
    made: dict[tuple[str, bool], str] = {}

    def get(how: str = "extension", plpython: bool = False) -> str:
        key = (how, plpython)
        if key not in made:
            made[key] = _template(pg_admin_dsn, how, plpython)
        return made[key]

    yield get
    for name in made.values():
        harness.drop_database(pg_admin_dsn, name)


@pytest.fixture
def make_db(pg_admin_dsn, templates):
    """make_db(how='extension'|'script', plpython=False) -> DSN of a fresh database, dropped after the test."""
    created = []

    def make(how: str = "extension", plpython: bool = False) -> str:
        name = harness.create_database(pg_admin_dsn, template=templates(how, plpython))
        created.append(name)
        return harness.with_db(pg_admin_dsn, name)

    yield make
    for name in created:
        harness.drop_database(pg_admin_dsn, name)


@pytest.fixture
def dsn(make_db):
    return make_db()


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET client_min_messages = warning")
        yield c


@pytest.fixture
def messages(monkeypatch):
    """The local Messages API server, and the environment that points the Anthropic labeller at it."""
    with MessagesServer() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        yield server
