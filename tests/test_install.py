"""Both install paths (CREATE EXTENSION, and the plain script for managed Postgres) give the same working objects,
with no plpython3u, hardened functions and capture triggers that application roles cannot call."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from storetopics import install as st_install
from tests import harness, helpers

VERSION = st_install.default_version()

SEARCH_PATH = "search_path=pg_catalog, pg_temp"
# Functions without a SET search_path: SQL-standard bodies (RETURN ...), parsed and bound to their objects when
# created, so the caller's search_path cannot change what they call; a SET clause would stop the planner from
# inlining them (they run per row in fold()).  Any other function must set search_path.
# functions that do not pin their search_path: a SQL-standard body is bound when it is created, and the planner
# inlines these into the statements that call them (fold's recount; render's novelty, per (file, term) pair or
# per file: sql/idempotent/069-novelty.sql)
BOUND_AT_CREATION: set[str] = {"_dehyphenated(text)", "_ln9(bigint)", "_novelty(double precision,bigint,bigint)",
                               "_novelty_bound(double precision,double precision,double precision,"
                               "double precision,boolean)",
                               "_novel(double precision,boolean,boolean,double precision,double precision)",
                               "_file_apart(integer[],integer[])", "_file_far(real)",
                               "_kept_bound(double precision,bigint,bigint,double precision[],bigint,"
                               "double precision[],boolean)", "_novelty_bands()",
                               "_novelty_slack(double precision[],double precision[])",
                               "_novelty_worn(integer,double precision,double precision,double precision,"
                               "double precision)",
                               "_noise(text,bigint,bigint,bigint,bigint,bigint,text)",
                               "_page_chrome(bigint,bigint,bigint,bigint,bigint)", "_clause_fragment(text[])", "_glued_re()",
                               "_showable_term(text)", "_terms_digest(integer[],integer[])", "_script(text)",
                               "_count_le(integer[],bigint)", "_latin(text)",
                               "_contrast_q(integer,bigint,double precision,double precision)",
                               "_contrast_raw(double precision,double precision,numeric)",
                               "_contrast_most(integer,double precision,double precision,numeric)",
                               "_contrast_bound(double precision[],double precision,double precision,"
                               "double precision,numeric)",
                               "_letters_az(text)", "_letter_then(text,text)"}
PUBLIC_EXECUTE = {"_usable_text(text)", "_dehyphenated(text)", "_showable_term(text)", "_human_count(bigint)",
                  "_tsvector_or_null(regconfig,text)", "_max_store_key()", "_tool_name(text,text)",
                  # checks every caller itself: contents go only to roles that may SELECT the chunk table
                  "search(regclass,text,text,integer,vector)"}


@pytest.fixture
def fresh_db(pg_admin_dsn):
    """A database with nothing installed (not even pgvector)."""
    name = harness.create_database(pg_admin_dsn, prefix="st_fresh")
    yield harness.with_db(pg_admin_dsn, name)
    harness.drop_database(pg_admin_dsn, name)


def _connect(dsn):
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("SET client_min_messages = warning")
    return c


def _no_plpython(conn):
    assert conn.execute("SELECT count(*) FROM pg_language WHERE lanname LIKE 'plpython%'").fetchone()[0] == 0


def _end_to_end(conn):
    helpers.create_chunks(conn)
    conn.execute("""INSERT INTO chunks (store_id, file_id, content)
                    SELECT 'home', g / 3, 'kitchen renovation with new tiles and cabinets; the bathroom renovation '
                                          'needs plumbing ' || g FROM generate_series(1, 60) g""")
    src = helpers.attach_chunks(conn)
    rows = helpers.backfill(conn)
    assert [(r[1], r[2], r[3]) for r in rows] == [("home", 21, 60)]
    text = helpers.summary(conn, src, "home")[0]
    assert helpers.sections(text)["files"] == "21" and helpers.sections(text)["terms"], text
    for word in ("kitchen", "renovation", "tiles", "bathroom", "plumbing"):
        assert word in text, (word, text)
    # and it stays current through the triggers
    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('garage', 1, 'engine oil and brake pads')")
    helpers.backfill(conn)
    assert "engine" in helpers.summary(conn, src, "garage")[0]
    assert helpers.state(conn, src) == helpers.recount(conn, src)
    return src


def test_create_extension_cascade_in_a_fresh_database(fresh_db):
    with _connect(fresh_db) as conn:
        conn.execute("CREATE EXTENSION storetopics CASCADE")
        assert conn.execute("SELECT extname, extversion FROM pg_extension WHERE extname IN ('storetopics', 'vector') "
                            "ORDER BY 1").fetchall()[0] == ("storetopics", VERSION)
        assert st_install.installed(conn) == ("extension", VERSION)
        _no_plpython(conn)
        _end_to_end(conn)


@pytest.mark.parametrize("how", ["extension", "script"])
def test_end_to_end_without_plpython(make_db, how):
    with _connect(make_db(how)) as conn:
        assert st_install.installed(conn) == (how, VERSION)
        _no_plpython(conn)
        _end_to_end(conn)
        _no_plpython(conn)


@pytest.mark.parametrize("plpython", [False, True])
def test_sql_backfill_tells_a_dba_only_its_own_notices(make_db, plpython):
    """SELECT storetopics.backfill() in psql (client_min_messages notice): its own NOTICEs (what it folded, that
    clustering needs plpython3u, how long it took), none about its temp tables (was: 'table "storetopics_new_terms"
    does not exist, skipping', the same for storetopics_mined and storetopics_assign; issue 31)."""
    from tests.test_clusters import base_rows, insert, setup_table
    with _connect(make_db(plpython=plpython)) as conn:
        setup_table(conn)
        insert(conn, base_rows(files=6))
        conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, book text, path text, body text)")
        conn.execute("INSERT INTO notes (book, path, body) SELECT 'b' || (g % 2), 'p' || (g % 9), "
                     "'garden roses and compost, pruning the roses in spring ' || g FROM generate_series(1, 40) g")
        conn.execute("SELECT storetopics.attach('notes', 'book', 'path', 'body')")
        conn.execute("SET client_min_messages = notice")
        notices = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        for _ in range(2):   # a second run in the same session too (the temp tables' names are known there)
            assert conn.execute("SELECT * FROM storetopics.backfill()").fetchall()
            conn.execute("INSERT INTO notes (book, path, body) VALUES ('b0', 'p1', 'more roses')")
        internal = [n for n in notices if "does not exist" in n or "storetopics_" in n]
        assert not internal, internal
        assert any("backfill took" in n for n in notices), notices
        assert any("plpython3u is not installed" in n for n in notices) != plpython, notices


def test_plain_script_into_a_fresh_database(fresh_db):
    assert st_install.install(fresh_db, log=lambda *a: None) == VERSION
    with _connect(fresh_db) as conn:
        assert st_install.installed(conn) == ("script", VERSION)
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0] == 0
        _no_plpython(conn)
        _end_to_end(conn)


@pytest.mark.parametrize("how", ["extension", "script"])
def test_functions_are_hardened(make_db, how):
    with _connect(make_db(how)) as conn:
        _end_to_end(conn)      # creates a capture function too
        funcs = conn.execute("""
            SELECT p.oid::regprocedure::text, p.proconfig, p.prosqlbody IS NOT NULL, p.prosecdef
              FROM pg_proc p WHERE p.pronamespace = 'storetopics'::regnamespace ORDER BY 1""").fetchall()
        assert len(funcs) > 20
        without = set()
        for name, config, sqlbody, secdef in funcs:
            short = name.removeprefix("storetopics.")
            if config is None or SEARCH_PATH not in config:
                if re.fullmatch(r"capture_\d+\(\)", short):
                    # a capture function whose keys are plain columns: every name in it is qualified
                    # (test_security.py::test_a_writers_search_path_does_not_reach_the_capture_function)
                    sid = int(short.removeprefix("capture_").removesuffix("()"))
                    assert conn.execute("SELECT storetopics._capture_bound(s) FROM storetopics.sources s "
                                        "WHERE s.id = %s", (sid,)).fetchone()[0], name
                    continue
                without.add(short)
                assert sqlbody, f"{name} neither sets search_path nor has a SQL-standard body"
        assert without == BOUND_AT_CREATION

        # ... and those are indeed immune to a hostile search_path
        conn.execute("CREATE SCHEMA evil")
        conn.execute("CREATE FUNCTION evil.octet_length(text) RETURNS int LANGUAGE sql RETURN 0")
        conn.execute("CREATE FUNCTION evil.length(text) RETURNS int LANGUAGE sql RETURN 5")
        conn.execute("CREATE FUNCTION evil.strpos(text, text) RETURNS int LANGUAGE sql RETURN 0")
        conn.execute("CREATE FUNCTION evil.translate(text, text, text) RETURNS text LANGUAGE sql RETURN ''")
        conn.execute("SET search_path = evil, pg_catalog")
        assert conn.execute("SELECT storetopics._usable_text(repeat('x', 2000000)), storetopics._showable_term('ab'), "
                            "storetopics._human_count(12345), storetopics._dehyphenated(E'destina-\\n    tion'), "
                            "storetopics._letters_az('ab1'), storetopics._noise('prevchapter', 1, 1, 1, 1, 1, 'latin')"
                            ).fetchone() == (False, False, "12k", "destination", False, "navigation")
        conn.execute("RESET search_path")

        # What PUBLIC may execute: only the pure helpers (NULL proacl would mean the default: PUBLIC may).
        public = {r[0].removeprefix("storetopics.") for r in conn.execute("""
            SELECT p.oid::regprocedure::text FROM pg_proc p,
                   aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
             WHERE p.pronamespace = 'storetopics'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
            """)}
        assert public == PUBLIC_EXECUTE
        # No table or view of storetopics is readable or writable by PUBLIC.
        assert conn.execute("""
            SELECT count(*) FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
             WHERE c.relnamespace = 'storetopics'::regnamespace AND c.relkind IN ('r', 'v', 'p')
               AND a.grantee = 0""").fetchone()[0] == 0


@pytest.mark.parametrize("how", ["extension", "script"])
def test_capture_functions_are_security_definer_and_not_public(make_db, how):
    with _connect(make_db(how)) as conn:
        helpers.create_chunks(conn, "a")
        helpers.create_chunks(conn, "b")
        sa = helpers.attach_chunks(conn, "a")
        sb = helpers.attach_chunks(conn, "b")
        rows = conn.execute("""
            SELECT p.oid::regprocedure::text, p.prosecdef, p.proconfig, p.proacl IS NOT NULL,
                   (SELECT array_agg(DISTINCT t.tgrelid::regclass::text ORDER BY t.tgrelid::regclass::text)
                      FROM pg_trigger t WHERE t.tgfoid = p.oid),
                   (SELECT count(*) FROM pg_trigger t WHERE t.tgfoid = p.oid),
                   EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                            WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
              FROM pg_proc p WHERE p.pronamespace = 'storetopics'::regnamespace AND p.proname LIKE 'capture%'
             ORDER BY p.oid""").fetchall()
        # (no SET search_path: their keys are plain columns, see test_functions_are_hardened)
        assert rows == [
            (f"storetopics.capture_{sa}()", True, None, True, ["a"], 4, False),
            (f"storetopics.capture_{sb}()", True, None, True, ["b"], 4, False),
        ]
        # An application role with rights on the table only: its writes are captured, it cannot call the function.
        role = f"app_writer_{how}"    # roles are per cluster
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT INSERT, UPDATE, DELETE, SELECT ON a TO {role}")
        conn.execute(f"GRANT USAGE ON SEQUENCE a_id_seq TO {role}")
        try:
            conn.execute(f"SET ROLE {role}")
            conn.execute("INSERT INTO a (store_id, file_id, content) VALUES ('s', 1, 'kitchen tiles')")
            conn.execute("UPDATE a SET content = 'kitchen renovation' WHERE file_id = 1")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("INSERT INTO storetopics.pending (source_id, resync) VALUES (%s, true)", (sa,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM storetopics.store_state")
        finally:
            conn.execute("RESET ROLE")
        helpers.backfill(conn)
        assert helpers.state(conn, sa)["stores"] == {"s": (1, 1, 2, 0)}
        conn.execute("SELECT storetopics.detach('a'), storetopics.detach('b')")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_plain_install_is_idempotent(make_db):
    dsn = make_db("script")
    with _connect(dsn) as conn:
        before = _catalog(conn)
        meta = conn.execute("SELECT * FROM storetopics.meta ORDER BY 1").fetchall()
    logs = []
    assert st_install.install(dsn, log=logs.append) == VERSION
    assert st_install.install(dsn, log=logs.append) == VERSION
    assert logs == [f"storetopics install: {VERSION} already installed"] * 2
    with _connect(dsn) as conn:
        assert _catalog(conn) == before
        assert conn.execute("SELECT * FROM storetopics.meta ORDER BY 1").fetchall() == meta
        assert dict(meta)["version"] == VERSION and set(dict(meta)) == {"version", "build"}   # build: the sources
        _end_to_end(conn)


def test_plain_install_refuses_where_the_extension_is(make_db):
    dsn = make_db("extension")
    with pytest.raises(st_install.InstallError, match="installed as an extension"):
        st_install.install(dsn, log=lambda *a: None)
    with _connect(dsn) as conn:
        assert st_install.installed(conn) == ("extension", VERSION)
        _end_to_end(conn)


def test_extension_refuses_where_the_plain_script_is(make_db):
    dsn = make_db("script")
    with pytest.raises(st_install.InstallError, match="installed as a plain script"):
        st_install.install(dsn, extension=True, log=lambda *a: None)
    with _connect(dsn) as conn:
        assert st_install.installed(conn) == ("script", VERSION)


def _catalog(conn) -> dict:
    """Every object of schema storetopics with its definition, comparable between databases."""
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    return {
        "functions": q("""SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text
                            FROM pg_proc p WHERE p.pronamespace = 'storetopics'::regnamespace AND p.prokind <> 'a'
                           ORDER BY 1"""),
        "relations": q("""SELECT c.relname, c.relkind, c.relacl::text, c.relpersistence
                            FROM pg_class c WHERE c.relnamespace = 'storetopics'::regnamespace ORDER BY 1"""),
        "columns": q("""SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated
                          FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
                         WHERE c.relnamespace = 'storetopics'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
                         ORDER BY 1, 2"""),
        "views": q("""SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c
                       WHERE c.relnamespace = 'storetopics'::regnamespace AND c.relkind IN ('v', 'm') ORDER BY 1"""),
        "indexes": q("""SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_class c
                         WHERE c.relnamespace = 'storetopics'::regnamespace AND c.relkind = 'i' ORDER BY 1"""),
        "constraints": q("""SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                             WHERE connamespace = 'storetopics'::regnamespace ORDER BY 1, 2"""),
        "triggers": q("""SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
                          JOIN pg_class c ON c.oid = t.tgrelid
                         WHERE c.relnamespace = 'storetopics'::regnamespace ORDER BY 1, 2"""),
        "event_triggers": q("""SELECT evtname, evtevent, evtfoid::regprocedure::text, evtenabled, evttags
                                 FROM pg_event_trigger ORDER BY 1"""),
        "types": q("""SELECT t.typname, t.typtype FROM pg_type t
                       WHERE t.typnamespace = 'storetopics'::regnamespace ORDER BY 1"""),
        "schema_acl": q("SELECT nspacl::text FROM pg_namespace WHERE nspname = 'storetopics'"),
    }


def test_both_install_paths_create_the_same_objects(make_db):
    with _connect(make_db("extension")) as ext, _connect(make_db("script")) as plain:
        a, b = _catalog(ext), _catalog(plain)
        assert len(a["functions"]) > 20 and len(a["columns"]) > 40 and len(a["views"]) == 2
        for kind in a:
            assert a[kind] == b[kind], kind
        assert a == b


def test_the_versioned_scripts_are_built_from_the_sources():
    """sql/storetopics--<version>.sql and the upgrade into it are what `make sql` builds from sql/incremental and
    sql/idempotent (they are committed: the Python package ships them)."""
    sql_dir = Path(__file__).resolve().parents[1] / "sql"
    built = {f"storetopics--{VERSION}.sql": ["install", VERSION]}
    for p in sql_dir.glob(f"storetopics--*--{VERSION}.sql"):
        built[p.name] = ["upgrade", p.name.split("--")[1], VERSION]
    assert len(built) >= 2
    for name, args in built.items():
        out = subprocess.run(["sh", str(sql_dir / "build.sh"), *args], capture_output=True, text=True, check=True)
        assert out.stdout == (sql_dir / name).read_text(), f"{name} is stale: run `make sql`"


PUBLIC_API_LIST = Path(__file__).parent / "data" / "public_api.txt"
PUBLIC_SURFACE = """
SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p
 WHERE p.pronamespace = 'storetopics'::regnamespace AND p.proname !~ '^_'
   AND p.proname !~ '^(capture|read|mirror|try)_[0-9]+$'
UNION ALL
SELECT 'view ' || c.relname FROM pg_class c WHERE c.relnamespace = 'storetopics'::regnamespace AND c.relkind = 'v'
ORDER BY 1"""


@pytest.mark.parametrize("how", ["extension", "script"])
def test_the_public_api_is_the_committed_list(make_db, how):
    """The public SQL (functions without a leading `_`, with their parameters' names, and views) is what
    tests/data/public_api.txt lists, no more: a new public name is a decision made in that file, and an internal one
    starts with `_`."""
    with _connect(make_db(how)) as conn:
        _end_to_end(conn)      # generated functions exist too, and stay out of it
        installed = [r[0] for r in conn.execute(PUBLIC_SURFACE)]
    listed = [line for line in PUBLIC_API_LIST.read_text().splitlines() if line and not line.startswith("#")]
    assert installed == listed


def test_every_public_function_and_view_says_what_it_is(conn):
    """What `\\df+` and `\\dv+` show a DBA: a COMMENT on every public function and view (internal `_` functions and
    the generated per-source ones excepted)."""
    missing = conn.execute(
        """SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'storetopics' AND p.proname !~ '^_'
              AND p.proname !~ '^(capture|read|mirror)_[0-9]+$' AND obj_description(p.oid, 'pg_proc') IS NULL
           UNION ALL
           SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'storetopics' AND c.relkind = 'v' AND obj_description(c.oid, 'pg_class') IS NULL
           ORDER BY 1""").fetchall()
    assert missing == []
    assert conn.execute("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                        "WHERE n.nspname = 'storetopics' AND obj_description(p.oid, 'pg_proc') IS NOT NULL"
                        ).fetchone()[0] > 30
