"""Operations: storetopics.metrics() and the postgres_exporter file that maps it (pending events rise with writes and
fall to 0 with a backfill, dirty and failing stores, labelling calls and cost from the ledger, per-tenant visibility),
attach() warning about a file key without an index, and one clear error where pgvector is missing."""
from __future__ import annotations

import re
import uuid
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import conninfo

from storetopics import install as st_install
from tests import helpers

EXPORTER_FILE = Path(__file__).resolve().parents[1] / "docker" / "postgres_exporter-queries.yaml"


def metrics(conn: psycopg.Connection) -> dict[str, dict]:
    """{source: {column: value}} from storetopics.metrics()."""
    cur = conn.execute("SELECT * FROM storetopics.metrics()")
    names = [d.name for d in cur.description]
    return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}


def _insert(conn, rows):
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO chunks (store_id, file_id, content) VALUES (%s, %s, %s)", rows)


# ------------------------------------------------------------------------------------------------------------
# metrics(): what changes when
# ------------------------------------------------------------------------------------------------------------
def test_metrics_follow_writes_backfill_and_labelling_calls(conn):
    helpers.create_chunks(conn)
    conn.execute("CREATE INDEX ON chunks (file_id)")
    src = helpers.attach_chunks(conn, embedding=False)
    m = metrics(conn)["public.chunks"]
    assert m["source_id"] == src
    assert (m["stores"], m["pending_events"], m["dirty_stores"], m["failing_stores"]) == (0, 1, 0, 0)  # the resync

    # writes: one event per (store, file) a statement touched; every store they name is dirty
    _insert(conn, [("home", 1, "kitchen renovation with new tiles"), ("home", 2, "the bathroom needs plumbing"),
                   ("garage", 3, "engine oil and brake pads")])
    m = metrics(conn)["public.chunks"]
    assert m["pending_events"] == 4 and m["dirty_stores"] == 2 and m["stores"] == 0, m
    assert 0 <= m["oldest_pending_seconds"] < 60, m

    helpers.backfill(conn)
    m = metrics(conn)["public.chunks"]
    assert (m["stores"], m["pending_events"], m["oldest_pending_seconds"], m["dirty_stores"]) == (2, 0, 0, 0), m
    assert 0 <= m["oldest_summary_seconds"] < 60 and m["paused"] == 0, m
    assert (m["label_calls_total"], m["label_errors_total"], m["label_cost_usd_total"]) == (0, 0, 0), m

    # a delete names no store: every store of the source may change at the next fold
    conn.execute("DELETE FROM chunks WHERE file_id = 3")
    m = metrics(conn)["public.chunks"]
    assert (m["pending_events"], m["dirty_stores"]) == (1, 2), m
    helpers.backfill(conn)
    m = metrics(conn)["public.chunks"]
    assert (m["stores"], m["pending_events"], m["dirty_stores"]) == (1, 0, 0), m

    # Labelling calls, as the worker writes them back: one answered (its tokens are priced), three that got no
    # answer (the cluster fails failing_after() times in a row).  Two clusters stand in for a fit.
    conn.execute("SELECT storetopics.configure('chunks', '{\"labeller\": \"anthropic\"}')")
    ok, bad = [conn.execute(
        "INSERT INTO storetopics.clusters (source_id, store_key, centroid, radius, chunks, files, fit_size, keywords) "
        "VALUES (%s, 'home', '[1,0,0,0,0,0,0,0]', 0.3, 1, 1, 1, %s) RETURNING cluster_id",
        (src, words)).fetchone()[0] for words in (["kitchen", "renovation", "tiles"], ["bathroom", "plumbing"])]
    assert conn.execute("SELECT storetopics._record_label(%s, 'home', %s, 'ok', 'Kitchen renovation', 'anthropic', "
                        "'claude-haiku-4-5', 1000, 100)", (src, ok)).fetchone()[0]
    for _ in range(3):
        conn.execute("SELECT storetopics._record_label(%s, 'home', %s, 'error', NULL, 'anthropic', 'claude-haiku-4-5', "
                     "0, 0, 'HTTP 500')", (src, bad))
    m = metrics(conn)["public.chunks"]
    assert (m["label_calls_total"], m["label_errors_total"]) == (4, 3), m
    assert m["label_cost_usd_total"] == pytest.approx((1000 * 1.0 + 100 * 5.0) / 1e6), m   # default prices
    assert m["failing_stores"] == 1, m
    assert m["dirty_stores"] == 1, m            # the new label is not rendered yet
    state = {r[0]: r[1] for r in conn.execute("SELECT store_key, state FROM storetopics.work_status()")}
    assert state["home"] == "failing"
    helpers.backfill(conn)
    m = metrics(conn)["public.chunks"]
    assert (m["dirty_stores"], m["failing_stores"], m["label_calls_total"]) == (0, 1, 4), m

    # paused: the stores stay dirty, and the metrics say why
    conn.execute("SELECT storetopics.pause('chunks')")
    assert metrics(conn)["public.chunks"]["paused"] == 1


def test_a_store_whose_passes_fail_counts_as_failing_and_dirty(conn):
    helpers.create_chunks(conn)
    conn.execute("CREATE INDEX ON chunks (file_id)")
    helpers.attach_chunks(conn, embedding=False)
    helpers.backfill(conn)
    conn.execute("SELECT storetopics.configure('chunks', '{\"debounce\": 0}')")
    _insert(conn, [("home", 1, "kitchen renovation with new tiles")])
    for attempt in range(1, 4):
        conn.execute("UPDATE storetopics.work SET next_attempt_at = now()")   # the backoff, passed at once
        (source_id, store, generation, _), = conn.execute("SELECT * FROM storetopics._claim('w1')").fetchall()
        assert conn.execute("SELECT storetopics._work_done('w1', %s, %s, %s, p_error => 'boom')",
                            (source_id, store, generation)).fetchone()[0] == "failed"
        m = metrics(conn)["public.chunks"]
        assert (m["failing_stores"], m["dirty_stores"]) == (int(attempt >= 3), 1), (attempt, m)
    # a pass that succeeds clears it
    helpers.backfill(conn)
    conn.execute("UPDATE storetopics.work SET next_attempt_at = now()")
    (source_id, store, generation, _), = conn.execute("SELECT * FROM storetopics._claim('w1')").fetchall()
    assert conn.execute("SELECT storetopics._work_done('w1', %s, %s, %s)", (source_id, store, generation)
                        ).fetchone()[0] == "clean"
    m = metrics(conn)["public.chunks"]
    assert (m["failing_stores"], m["dirty_stores"], m["pending_events"]) == (0, 0, 0), m


# ------------------------------------------------------------------------------------------------------------
# metrics(): who sees what
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def tenants(make_db):
    """Two tenants with a table each, a worker, a reader of B's table, a reader of every table, a role with
    nothing (helpers.tenants)."""
    def worker(admin, roles):
        admin.execute("SELECT storetopics.grant_worker(%s)", (roles["worker"],))

    def table(c, t, roles):
        c.execute(f"GRANT USAGE ON SCHEMA {t} TO {roles['worker']}")
        c.execute(f"GRANT SELECT ON {t}.docs TO {roles['worker']}")
        c.execute(f"INSERT INTO {t}.docs (store, file, content) VALUES ('s', 1, 'honey bees and hives')")

    with helpers.tenants(make_db(), ("worker", "router", "monitor", "nobody"), worker, table) as (
            roles, conns, admin, _):
        admin.execute(f"GRANT {roles['router']} TO {roles['b']}")   # b chooses for its own router
        conns["b"].execute(f"SELECT storetopics.grant_read('{roles['router']}', 'b.docs')")
        admin.execute(f"SELECT storetopics.grant_read('{roles['monitor']}')")
        yield roles, conns, admin


def test_metrics_show_a_role_only_the_sources_it_may_read(tenants):
    roles, conns, admin = tenants
    everything = {"a.docs", "b.docs"}
    assert set(metrics(admin)) == everything
    assert set(metrics(conns["worker"])) == everything
    assert set(metrics(conns["monitor"])) == everything
    assert set(metrics(conns["router"])) == {"b.docs"}
    same = ("source_id", "stores", "pending_events", "dirty_stores", "failing_stores", "label_calls_total")
    assert [metrics(conns["router"])["b.docs"][k] for k in same] == [metrics(admin)["b.docs"][k] for k in same]
    # a role granted nothing may not call it; nor may a tenant before it granted itself the reading of its table ...
    for k in ("nobody", "a"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conns[k].execute("SELECT * FROM storetopics.metrics()")
    # ... and then it sees that table only, not the other tenant's
    conns["a"].execute(f"SELECT storetopics.grant_read('{roles['a']}', 'a.docs')")
    assert set(metrics(conns["a"])) == {"a.docs"}
    # SET ROLE counts, not the login role: the superuser acting as the router sees what the router sees
    admin.execute(f"SET ROLE {roles['router']}")
    try:
        assert set(metrics(admin)) == {"b.docs"}
    finally:
        admin.execute("RESET ROLE")


# ------------------------------------------------------------------------------------------------------------
# The postgres_exporter file
# ------------------------------------------------------------------------------------------------------------
def _load_yaml(text: str):
    try:
        import yaml
    except ImportError:
        return _mini_yaml(text)
    return yaml.safe_load(text)


def _mini_yaml(text: str):
    """The subset of YAML the exporter file uses (mappings, `- key:` list items, quoted scalars, `|` blocks), for a
    machine without PyYAML."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    pos = 0

    def block(indent: int):
        nonlocal pos
        out: dict | list | None = None
        while pos < len(lines):
            ln = lines[pos]
            ind = len(ln) - len(ln.lstrip())
            if ind < indent:
                break
            body = ln.strip()
            if body.startswith("- "):
                out = out if out is not None else []
                lines[pos] = " " * (ind + 2) + body[2:]
                out.append(block(ind + 2))
                continue
            key, _, value = body.partition(":")
            value = value.strip()
            pos += 1
            out = out if out is not None else {}
            if value == "|":
                first = len(lines[pos]) - len(lines[pos].lstrip())
                buf = []
                while pos < len(lines) and len(lines[pos]) - len(lines[pos].lstrip()) >= first:
                    buf.append(lines[pos][first:])
                    pos += 1
                out[key] = "\n".join(buf) + "\n"
            elif value:
                out[key] = value[1:-1] if value[:1] == '"' else {"true": True, "false": False}.get(
                    value, int(value) if value.isdigit() else value)
            else:
                out[key] = block(ind + 1)
        return out

    return block(0)


def test_the_exporter_file_parses_and_its_query_returns_the_declared_columns(tenants):
    roles, conns, admin = tenants
    text = EXPORTER_FILE.read_text()
    doc = _load_yaml(text)
    assert _mini_yaml(text) == doc           # the fallback reads this file as PyYAML does
    assert list(doc) == ["storetopics"]
    q = doc["storetopics"]
    assert q["master"] is True and isinstance(q["cache_seconds"], int)
    declared = []
    for item in q["metrics"]:
        assert isinstance(item, dict) and len(item) == 1, item
        (name, spec), = item.items()
        assert spec["usage"] in ("LABEL", "GAUGE", "COUNTER") and spec["description"], item
        declared.append((name, spec["usage"]))
    assert [u for _, u in declared].count("LABEL") == 2
    assert all(n.endswith("_total") == (u == "COUNTER") for n, u in declared), declared   # Prometheus naming

    # The query as the exporter's role runs it (a reader of every source): exactly the declared columns, numbers
    # wherever a gauge or counter is declared, one row per source.
    cur = conns["monitor"].execute(q["query"])
    assert [d.name for d in cur.description] == [n for n, _ in declared]
    rows = cur.fetchall()
    assert sorted(r[0] for r in rows) == ["a.docs", "b.docs"]
    for row in rows:
        for (name, usage), value in zip(declared, row):
            if usage != "LABEL":
                assert isinstance(value, (int, float)) and not isinstance(value, bool), (name, value)
    # and every column metrics() returns is mapped (the exporter would report an unmapped one as untyped)
    cur = admin.execute("SELECT * FROM storetopics.metrics() LIMIT 0")
    assert [d.name for d in cur.description] == [n for n, _ in declared]


# ------------------------------------------------------------------------------------------------------------
# attach() warns about a file key without an index
# ------------------------------------------------------------------------------------------------------------
def _notices(conn: psycopg.Connection) -> list[SimpleNamespace]:
    """The notices the server sends from now on (copied: a Diagnostic is valid only inside the handler)."""
    seen: list = []
    conn.add_notice_handler(lambda d: seen.append(SimpleNamespace(
        severity=d.severity, message_primary=d.message_primary, message_detail=d.message_detail,
        message_hint=d.message_hint)))
    return seen


def _index_warnings(seen) -> list:
    return [d for d in seen if d.severity == "WARNING" and "no index on its file key" in (d.message_primary or "")]


def test_attach_warns_when_the_file_key_has_no_index(conn):
    helpers.create_chunks(conn)
    seen = _notices(conn)
    src = helpers.attach_chunks(conn)
    (w,) = _index_warnings(seen)
    assert w.message_primary == "storetopics: public.chunks has no index on its file key file_id"
    assert w.message_hint == "CREATE INDEX CONCURRENTLY ON public.chunks (file_id);"
    assert "recount" in w.message_detail
    assert conn.execute("SELECT count(*) FROM storetopics.sources WHERE id = %s", (src,)).fetchone()[0] == 1

    # the hint is the statement to run; with it, attach says nothing
    conn.execute("SELECT storetopics.detach('chunks')")
    conn.execute(w.message_hint)
    seen.clear()
    helpers.attach_chunks(conn)
    assert _index_warnings(seen) == [] and not [d for d in seen if d.severity == "WARNING"], seen


@pytest.mark.parametrize("index, warned", [
    ("CREATE INDEX ON docs (store, \"File Key\")", True),                  # not its first column
    ("CREATE INDEX ON docs (\"File Key\") WHERE store = 's'", True),       # partial: serves some lookups only
    ("CREATE UNIQUE INDEX ON docs (\"File Key\", id)", False),
    ("CREATE INDEX ON docs USING hash (\"File Key\")", False),
])
def test_which_indexes_count(conn, index, warned):
    conn.execute('CREATE TABLE docs (id serial PRIMARY KEY, store text, "File Key" text, content text)')
    conn.execute(index)
    seen = _notices(conn)
    conn.execute("SELECT storetopics.attach('docs', store_key => 'store', file_key => 'File Key')")
    assert len(_index_warnings(seen)) == int(warned), seen
    if warned:
        assert _index_warnings(seen)[0].message_hint == 'CREATE INDEX CONCURRENTLY ON public.docs ("File Key");'


def test_partitioned_tables_and_expression_keys(conn):
    conn.execute("CREATE TABLE parts (id int, store text, file int, content text) PARTITION BY LIST (store)")
    conn.execute("CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN ('a')")
    conn.execute("CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN ('b')")
    seen = _notices(conn)
    conn.execute("SELECT storetopics.attach('parts', store_key => 'store', file_key => 'file')")
    (w,) = _index_warnings(seen)
    assert w.message_hint == "CREATE INDEX ON public.parts (file);"     # no CONCURRENTLY on a partitioned table
    conn.execute("SELECT storetopics.detach('parts')")
    # an index on every partition serves as well as one on the parent
    conn.execute("CREATE INDEX ON parts_a (file)")
    conn.execute("CREATE INDEX ON parts_b (file)")
    seen.clear()
    conn.execute("SELECT storetopics.attach('parts', store_key => 'store', file_key => 'file')")
    assert _index_warnings(seen) == []
    # an expression key is not checked (an expression index may or may not serve it: the planner's business)
    helpers.create_chunks(conn)
    seen.clear()
    conn.execute("SELECT storetopics.attach('chunks', store_key => 'store_id', file_key => 'c.file_id + 0')")
    assert _index_warnings(seen) == []


# ------------------------------------------------------------------------------------------------------------
# pgvector missing: one clear error
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def owned_db(pg_admin_dsn):
    """A database with nothing installed, owned by a role that is no superuser (pgvector is not a trusted
    extension: that role cannot create it, as on a managed server that does not offer it)."""
    tag = uuid.uuid4().hex[:8]
    role, name = f"dbowner_{tag}", f"st_novector_{tag}"
    with helpers.connect_as(pg_admin_dsn) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'CREATE DATABASE "{name}" OWNER {role}')
    yield conninfo.make_conninfo(pg_admin_dsn, dbname=name), role
    with helpers.connect_as(pg_admin_dsn) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f"DROP ROLE {role}")


def test_install_without_pgvector_is_one_clear_error(owned_db):
    dsn, role = owned_db
    as_owner = conninfo.make_conninfo(dsn, user=role)
    logs: list[str] = []
    with pytest.raises(st_install.InstallError) as e:
        st_install.install(as_owner, log=logs.append)
    assert e.value.message == ('storetopics needs pgvector, and CREATE EXTENSION vector failed: permission denied to '
                               'create extension "vector"')
    assert "CREATE EXTENSION vector" in e.value.hint and "pgvector" in e.value.hint
    assert str(e.value) == f"{e.value.message} (hint: {e.value.hint})"
    assert logs == []                                                    # no "keyword summaries only"
    with helpers.connect_as(dsn) as conn:                                          # and nothing was left behind
        assert conn.execute("SELECT to_regnamespace('storetopics')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == 0
    # the extension path says the same before CREATE EXTENSION ... CASCADE would
    with pytest.raises(st_install.InstallError, match=r"^storetopics needs pgvector"):
        st_install.install(as_owner, extension=True, log=logs.append)

    # Once an administrator created pgvector there, the owner installs it and a keyword-only table works.
    with helpers.connect_as(dsn) as conn:
        conn.execute("CREATE EXTENSION vector")
    assert st_install.install(as_owner, log=logs.append) == st_install.default_version()
    with helpers.connect_as(as_owner) as conn:
        conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, store text, file int, content text)")
        conn.execute("CREATE INDEX ON notes (file)")
        conn.execute("INSERT INTO notes (store, file, content) VALUES ('home', 1, 'kitchen renovation tiles')")
        conn.execute("SELECT storetopics.attach('notes', store_key => 'store', file_key => 'file')")
        conn.execute("SELECT * FROM storetopics.backfill()")
        assert "kitchen" in conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]


def test_the_cli_reports_it_on_one_line(owned_db, capsys):
    from storetopics import cli
    dsn, role = owned_db
    assert cli.main(["--dsn", conninfo.make_conninfo(dsn, user=role), "install"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert re.match(r"storetopics: error: storetopics needs pgvector, .* \(hint: install pgvector .*CREATE EXTENSION "
                    r"vector.*\)$", err.strip()), err
