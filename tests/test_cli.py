"""The `storetopics` command line and `make demo`'s core, against the real throwaway Postgres of conftest.py."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from lab import demo
from storetopics import api, cli
from storetopics import install as st_install
from tests import harness

VERSION = st_install.default_version()

REPO = Path(__file__).resolve().parents[1]
STORETOPICS_BIN = Path(sys.executable).parent / "storetopics"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 1
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("storetopics: error: "), err
    for n in needles:
        assert n in lines[0], err


def make_chunks(conn: psycopg.Connection, table: str = "chunks") -> None:
    """Three stores: 'fruit' (4 files), 'tools' (3 files), 'space' (3 files), a few chunks per file."""
    conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, store text, file text, body text, "
                 "embedding vector(3))")
    rows = []
    texts = {
        "fruit": ["Apples and pears ripen in autumn orchards.", "Citrus fruit: oranges, lemons and limes.",
                  "Bananas grow in tropical plantations.", "Cherries and plums are stone fruit."],
        "tools": ["A hammer drives nails into wood.", "Screwdrivers turn screws; a drill bores holes.",
                  "Saws cut timber and planks."],
        "space": ["Telescopes observe distant galaxies and nebulae.", "Rockets launch satellites into orbit.",
                  "Astronauts live aboard the space station."],
    }
    for store, paras in texts.items():
        for i, p in enumerate(paras):
            for k in range(3):
                rows.append((store, f"{store}/{i}.txt", f"{p} Part {k} of the {store} notes."))
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} (store, file, body) VALUES (%s, %s, %s)", rows)


def db_topics(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores ORDER BY 1").fetchall())


@pytest.fixture
def fresh_db(pg_admin_dsn):
    """An empty database: neither vector nor storetopics installed."""
    name = harness.create_database(pg_admin_dsn)
    yield harness.with_db(pg_admin_dsn, name)
    harness.drop_database(pg_admin_dsn, name)


# ------------------------------------------------------------------------------------------------------------
# install
# ------------------------------------------------------------------------------------------------------------
def test_install_plain_script_on_empty_database(fresh_db, capsys):
    rc, out, err = run(capsys, "--dsn", fresh_db, "install")
    assert rc == 0, err
    assert out.strip() == f"storetopics {VERSION} installed (plain script)"
    with psycopg.connect(fresh_db) as c:
        assert c.execute("SELECT value FROM storetopics.meta WHERE key = 'version'").fetchone()[0] == VERSION
        assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0] == 0
    # Idempotent.
    rc, out, err = run(capsys, "--dsn", fresh_db, "install")
    assert rc == 0 and "already installed" in err
    # The extension path refuses a plain install, in one line.
    rc, out, err = run(capsys, "--dsn", fresh_db, "install", "--extension")
    assert_one_line_error(rc, err, "plain script")


def test_install_extension_on_empty_database(fresh_db, capsys):
    rc, out, err = run(capsys, "--dsn", fresh_db, "install", "--extension")
    assert rc == 0, err
    assert out.strip() == f"storetopics {VERSION} installed (extension)"
    with psycopg.connect(fresh_db) as c:
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0] == VERSION
        assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == 1
    rc, out, err = run(capsys, "--dsn", fresh_db, "status")
    assert rc == 0 and "no attached tables" in out


def test_commands_on_a_database_without_storetopics(fresh_db, capsys):
    for argv in (["status"], ["show"], ["backfill"], ["detach", "x"],
                 ["attach", "x", "--store-key", "s", "--file-key", "f"]):
        rc, out, err = run(capsys, "--dsn", fresh_db, *argv)
        assert_one_line_error(rc, err, "storetopics is not installed", "storetopics install")


# ------------------------------------------------------------------------------------------------------------
# attach, backfill, status, show, detach
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["extension", "script"])
def test_attach_backfill_status_show_detach(make_db, capsys, how):
    dsn = make_db(how)
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_chunks(conn)
        rc, out, err = run(capsys, "--dsn", dsn, "attach", "chunks", "--store-key", "store", "--file-key", "file",
                           "--content", "body", "--embedding", "embedding")
        assert rc == 0, err
        source_id = int(out.strip())
        assert conn.execute("SELECT id FROM storetopics.sources WHERE chunks = 'chunks'::regclass").fetchone()[0] \
            == source_id

        # Status before any fold: one source, no stores yet, the resync marker pending.
        rc, out, err = run(capsys, "--dsn", dsn, "status")
        assert rc == 0 and "chunks" in out and "none yet" in out

        # Backfill in batches of 3 files: 10 files, all folded, every store rendered.
        rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--batch", "3")
        assert rc == 0, err
        assert "10/10 files" in err and "100.0%" in err and "3/3 stores" in err
        assert re.search(r"backfill: 10 files folded in [\d.]+s, \S+ words/s; 3 stores rendered \(3 changed\); "
                         r"the stores hold 30 chunks", out), out
        topics = db_topics(conn)
        assert set(topics) == {"fruit", "tools", "space"} and all(t for t in topics.values())
        assert conn.execute("SELECT count(*) FROM storetopics.pending").fetchone()[0] == 0

        # A second backfill has nothing to do.
        rc, out, err = run(capsys, "--dsn", dsn, "backfill")
        assert rc == 0 and "0 files folded" in out and "0 stores rendered" in out

        # status: the source line and one aligned line per store, topics truncated.
        rc, out, err = run(capsys, "--dsn", dsn, "status")
        assert rc == 0, err
        lines = out.splitlines()
        header = next(line for line in lines if line.strip().startswith("store "))
        col = header.index("store_topics")
        assert col > header.index("updated") > header.index("dirty") > header.index("chunks")
        for key in ("fruit", "tools", "space"):
            line = next(line for line in lines if line.strip().startswith(key + " "))
            assert line[header.index("dirty"):].startswith("no ")  # aligned, not dirty
            assert line[col:] == cli.truncate(topics[key], 100)

        # show: full summaries; --store narrows to one.
        rc, out, err = run(capsys, "--dsn", dsn, "show")
        assert rc == 0, err
        flat = " ".join(out.split())
        for key, text in topics.items():
            assert " ".join(text.split()) in flat
        rc, out, err = run(capsys, "--dsn", dsn, "show", "--store", "tools")
        assert rc == 0 and "tools" in out and "fruit" not in out
        rc, out, err = run(capsys, "--dsn", dsn, "show", "--store", "nope")
        assert_one_line_error(rc, err, "no store 'nope'")

        # detach: gone, twice is fine.
        rc, out, err = run(capsys, "--dsn", dsn, "detach", "chunks")
        assert rc == 0 and out.strip() == "detached chunks"
        rc, out, err = run(capsys, "--dsn", dsn, "detach", "chunks")
        assert rc == 0 and "was not attached" in out
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'chunks'::regclass "
                            "AND NOT tgisinternal").fetchone()[0] == 0
        rc, out, err = run(capsys, "--dsn", dsn, "status")
        assert rc == 0 and "no attached tables" in out


def test_incremental_backfill_restores_summary_exactly(dsn, conn, capsys):
    make_chunks(conn)
    api.attach(conn, "chunks", "store", "file", content="body")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--quiet")
    assert rc == 0 and err == ""
    before = db_topics(conn)

    conn.execute("INSERT INTO chunks (store, file, body) VALUES "
                 "('tools', 'odd.txt', 'Sourdough bread needs flour, water, salt and a lively sourdough starter.'),"
                 "('tools', 'odd.txt', 'Knead the sourdough, proof it overnight, bake it in a hot oven.')")
    rc, out, err = run(capsys, "--dsn", dsn, "status")
    tools_line = next(line for line in out.splitlines() if line.strip().startswith("tools "))
    assert " yes " in tools_line  # dirty
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--store", "tools")
    assert rc == 0, err
    assert "1 file folded" in out and "1 store rendered (1 changed)" in out and "the store holds" in out
    assert "sourdough" in db_topics(conn)["tools"]
    assert {k: v for k, v in db_topics(conn).items() if k != "tools"} == \
           {k: v for k, v in before.items() if k != "tools"}

    conn.execute("DELETE FROM chunks WHERE file = 'odd.txt'")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill")
    assert rc == 0, err
    assert db_topics(conn) == before


def test_backfill_progress_recounts_after_resync(dsn, conn, monkeypatch):
    """The first fold after attach turns the resync marker into one pending row per file: the bar's total is
    recounted then, so every update shows the real total, and every file is counted once."""
    conn.execute("CREATE TABLE many (id serial PRIMARY KEY, s text, f int, content text)")
    conn.execute("INSERT INTO many (s, f, content) SELECT 's' || (g % 4), g % 57, 'word' || (g % 13) || ' alpha' "
                 "FROM generate_series(1, 600) g")
    api.attach(conn, "many", "s", "f")
    updates: list[tuple[str, int, int]] = []

    class Recording(cli.Progress):
        def update(self, done=None, total=None, *, advance=0):
            super().update(done, total, advance=advance)
            updates.append((self.label.split()[0], self.done, self.total))

    monkeypatch.setattr(cli, "Progress", Recording)
    stream = io.StringIO()
    res = api.backfill(conn, batch=5, progress=cli.Bars(stream=stream))
    assert res.files == 57 and res.full and res.chunks == 600 and res.rendered == 4
    folds = [u for u in updates if u[0] == "fold"]
    assert [d for _, d, _ in folds] == list(range(5, 57, 5)) + [55 + 2, 57]
    assert all(t == 57 for _, _, t in folds)
    assert [u for u in updates if u[0] == "refresh"] == [("refresh", i, 4) for i in range(1, 5)]
    log = stream.getvalue()  # not a terminal: one line per bar at the end
    assert log.splitlines()[0].startswith("fold    many [") and "57/57 files" in log and "4/4 stores" in log


def test_backfill_source_and_store_filters(dsn, conn, capsys):
    make_chunks(conn, "a")
    make_chunks(conn, "b")
    api.attach(conn, "a", "store", "file", content="body")
    api.attach(conn, "b", "store", "file", content="body")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--source", "a", "-q")
    assert rc == 0 and "10 files folded" in out
    pending_b = conn.execute("SELECT count(*) FROM storetopics.pending p JOIN storetopics.sources s "
                             "ON s.id = p.source_id WHERE s.chunks = 'b'::regclass").fetchone()[0]
    assert pending_b == 1  # b untouched: still its resync marker
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--store", "space", "-q")
    assert rc == 0 and "10 files folded" in out and "1 store rendered" in out
    rendered = conn.execute("SELECT s.chunks::text, st.store_key FROM storetopics.store_state st JOIN "
                            "storetopics.sources s ON s.id = st.source_id WHERE st.store_topics IS NOT NULL "
                            "ORDER BY 1, 2").fetchall()
    assert rendered == [("a", "fruit"), ("a", "space"), ("a", "tools"), ("b", "space")]
    rc, out, err = run(capsys, "--dsn", dsn, "status")
    assert rc == 0 and re.search(r"^\s+table\s+store\s+files", out, re.M)  # two sources: a table column
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--source", "nope")
    assert_one_line_error(rc, err, 'relation "nope" does not exist')
    conn.execute("CREATE TABLE c (x int)")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--source", "c")
    assert_one_line_error(rc, err, "c is not attached")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "--store", "nope")
    assert_one_line_error(rc, err, "no store 'nope'")


def test_dropping_an_attached_table_forgets_its_source(dsn, conn, capsys):
    make_chunks(conn, "a")
    make_chunks(conn, "gone")
    api.attach(conn, "a", "store", "file", content="body")
    gone = api.attach(conn, "gone", "store", "file", content="body")
    conn.execute("DROP TABLE gone")   # the sql_drop event trigger forgets the source and its capture function
    assert conn.execute("SELECT count(*) FROM storetopics.sources WHERE id = %s", (gone,)).fetchone()[0] == 0
    assert conn.execute("SELECT to_regprocedure(%s)", (f"storetopics.capture_{gone}()",)).fetchone()[0] is None
    rc, out, err = run(capsys, "--dsn", dsn, "backfill")
    assert rc == 0, err
    assert "10 files folded" in out


def test_backfill_skips_a_table_dropped_while_attached(dsn, conn, capsys):
    # Where storetopics could not install its event trigger (no superuser), a dropped table's source stays.
    conn.execute("ALTER EVENT TRIGGER storetopics_forget_dropped_tables DISABLE")
    make_chunks(conn, "a")
    make_chunks(conn, "gone")
    api.attach(conn, "a", "store", "file", content="body")
    gone = api.attach(conn, "gone", "store", "file", content="body")
    conn.execute("DROP TABLE gone")
    rc, out, err = run(capsys, "--dsn", dsn, "backfill")
    assert rc == 0, err
    assert "10 files folded" in out and "was dropped without being detached" in err
    assert conn.execute("SELECT array_agg(s) FROM storetopics.detach_dropped() s").fetchone()[0] == [gone]
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 1


def test_a_table_dropped_where_no_event_trigger_sees_it_leaves_every_reader(dsn, conn, capsys):
    """The managed path (no event triggers): a dropped table's source stays until detach_dropped().  Its stores leave
    the stores view, catalog() (so the MCP tool list) and route(); status shows the source with a note and the
    detach hint; the worker skips it and says so once, backfill skips it (issue 31)."""
    conn.execute("ALTER EVENT TRIGGER storetopics_forget_dropped_tables DISABLE")
    conn.execute("ALTER EVENT TRIGGER storetopics_follow_ddl DISABLE")
    make_chunks(conn, "a")
    conn.execute("CREATE TABLE gone (id bigserial PRIMARY KEY, store text, file text, body text)")
    conn.execute("INSERT INTO gone (store, file, body) VALUES ('moons', 'm1', 'Moons orbit planets; Europa is icy.'), "
                 "('moons', 'm2', 'Titan has lakes of methane.')")
    api.attach(conn, "a", "store", "file", content="body", embedding=None)
    gone = api.attach(conn, "gone", "store", "file", content="body", embedding=None)
    api.backfill(conn)
    catalog = "SELECT store_key FROM storetopics.catalog() ORDER BY 1"
    assert [r[0] for r in conn.execute(catalog)] == ["fruit", "moons", "space", "tools"]
    conn.execute("INSERT INTO gone (store, file, body) VALUES ('moons', 'm3', 'Io has volcanoes.')")
    conn.execute("DELETE FROM gone WHERE file = 'm1'")      # changes that name no store, too
    conn.execute("DROP TABLE gone")

    assert [r[0] for r in conn.execute(catalog)] == ["fruit", "space", "tools"]
    assert {r[0] for r in conn.execute("SELECT store_key FROM storetopics.stores")} == {"fruit", "space", "tools"}
    assert "moons" not in {r[0] for r in conn.execute("SELECT store_key FROM storetopics.route_text('moons "
                                                      "orbit planets titan europa', 4)")}
    assert conn.execute("SELECT storetopics._next_due()").fetchone()[0] is None     # nothing a worker could do

    rc, out, err = run(capsys, "--dsn", dsn, "status")
    assert rc == 0, err
    assert re.search(rf"source {gone} .*was dropped without being detached.*storetopics\.detach_dropped\(\)",
                     out), out
    r = subprocess.run([sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "--once", "--now"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if f"source {gone}" in line]
    assert len(said) == 1 and "dropped" in said[0] and "storetopics.detach_dropped()" in said[0], r.stderr
    assert "pass failed" not in r.stderr and "cannot fold" not in r.stderr, r.stderr
    rc, out, err = run(capsys, "--dsn", dsn, "backfill", "-q")
    assert rc == 0 and "was dropped without being detached" in err, err
    assert conn.execute("SELECT array_agg(s) FROM storetopics.detach_dropped() s").fetchone()[0] == [gone]
    assert conn.execute("SELECT count(*) FROM storetopics.detach_dropped()").fetchone()[0] == 0
    rc, out, err = run(capsys, "--dsn", dsn, "status")
    assert rc == 0 and "dropped" not in out, out


# ------------------------------------------------------------------------------------------------------------
# dry run, DSN handling, errors
# ------------------------------------------------------------------------------------------------------------
def test_attach_dry_run_prints_runnable_sql(conn, capsys):
    make_chunks(conn, '"it\'s"')
    rc, out, err = run(capsys, "--dsn", "host=/nonexistent", "attach", '"it\'s"', "--store-key", "store",
                       "--file-key", "c.file || '#'", "--content", "body", "--ts-config", "simple", "--dry-run")
    assert rc == 0, err
    assert out.startswith("SELECT storetopics.attach(chunks => '\"it''s\"'::regclass, store_key => 'store', "
                          "file_key => 'c.file || ''#''', content => 'body', ts_config => 'simple'::regconfig);")
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 0
    source_id = conn.execute(out).fetchone()[0]
    row = conn.execute("SELECT file_sql, ts_config::text FROM storetopics.sources WHERE id = %s",
                       (source_id,)).fetchone()
    assert row == ("(c.file || '#'\n)", "simple")   # the line break ends a trailing -- comment


def test_attach_dry_run_uses_up_no_source_id_and_works_for_an_attacher(dsn, conn, capsys):
    """--dry-run runs attach()'s checks (storetopics.attach_check) and installs nothing, not even a source id: the
    attach that follows gets the id it would have had (was: every dry run consumed one).  A table owner that may
    attach (grant_attach) may check too (issue 31)."""
    import uuid

    from psycopg import conninfo
    make_chunks(conn)
    seq = conn.execute("SELECT pg_get_serial_sequence('storetopics.sources', 'id')").fetchone()[0]
    before = conn.execute(f"SELECT last_value, is_called FROM {seq}").fetchone()
    argv = ["--dsn", dsn, "attach", "chunks", "--store-key", "store", "--file-key", "file", "--content", "body",
            "--embedding", "embedding"]
    for _ in range(3):
        rc, out, err = run(capsys, *argv, "--dry-run")
        assert rc == 0 and "nothing was installed" in err, err
    assert conn.execute(f"SELECT last_value, is_called FROM {seq}").fetchone() == before
    rc, out, err = run(capsys, *argv)
    assert rc == 0 and int(out) == before[0] + before[1], (out, err)

    role = f"attacher_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        conn.execute("SELECT storetopics.grant_attach(%s)", (role,))
        make_chunks(conn, "theirs")
        conn.execute(f"ALTER TABLE theirs OWNER TO {role}")
        rc, out, err = run(capsys, "--dsn", conninfo.make_conninfo(dsn, user=role), "attach", "theirs",
                           "--store-key", "store", "--file-key", "file", "--content", "body", "--dry-run")
        assert rc == 0 and "nothing was installed" in err, err
        rc, out, err = run(capsys, "--dsn", conninfo.make_conninfo(dsn, user=role), "attach", "chunks",
                           "--store-key", "store", "--file-key", "file", "--content", "body", "--dry-run")
        assert_one_line_error(rc, err, "only the owner of public.chunks")
    finally:
        conn.execute("DROP TABLE IF EXISTS theirs")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_attach_takes_the_only_vector_column_and_says_so(dsn, conn, capsys):
    """Without --embedding: the table's only pgvector column (vector or halfvec) is the embedding, said on stderr
    (was: keywords only, silently); with several, one clear error naming them; --no-embedding: keywords only.  The
    library's api.attach follows the same rule (embedding=None: keywords only)  (issue 31)."""
    def embedding_of(table):
        return conn.execute("SELECT embedding FROM storetopics.sources WHERE chunks = %s::regclass",
                            (table,)).fetchone()[0]
    base = ["--dsn", dsn, "attach", "--store-key", "store", "--file-key", "file", "--content", "body"]
    make_chunks(conn)
    rc, out, err = run(capsys, *base, "chunks", "--dry-run")
    assert rc == 0 and "embedding => 'embedding'" in out, (out, err)
    rc, out, err = run(capsys, *base, "chunks")
    assert rc == 0 and embedding_of("chunks") == "embedding", err
    assert "embedding: embedding, the only vector column of chunks (--no-embedding: keywords only)" in err, err

    conn.execute("CREATE TABLE two (id serial PRIMARY KEY, store text, file text, body text, e1 vector(3), "
                 "e2 halfvec(3))")
    rc, out, err = run(capsys, *base, "two")
    assert_one_line_error(rc, err, "2 vector columns (e1, e2)", "--embedding COL", "--no-embedding")
    with pytest.raises(api.StoretopicsError, match=r"2 vector columns \(e1, e2\)"):
        api.attach(conn, "two", "store", "file", content="body")
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 1
    rc, out, err = run(capsys, *base, "two", "--no-embedding")
    assert rc == 0 and embedding_of("two") is None and "embedding:" not in err, err
    with pytest.raises(SystemExit) as e:                                       # one or the other
        run(capsys, *base, "two", "--embedding", "e2", "--no-embedding")
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err

    make_chunks(conn, "lib")
    api.attach(conn, "lib", "store", "file", content="body")
    assert embedding_of("lib") == "embedding"
    conn.execute("CREATE TABLE plain (id serial PRIMARY KEY, store text, file text, body text)")
    rc, out, err = run(capsys, *base, "plain")
    assert rc == 0 and embedding_of("plain") is None and "embedding:" not in err, err
    assert "--embedding COL" in cli.build_parser()._subparsers._group_actions[0].choices["attach"].format_help()


def test_dsn_from_environment_and_after_the_command(dsn, conn, capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", dsn)
    rc, out, err = run(capsys, "status")
    assert rc == 0 and "no attached tables" in out
    monkeypatch.setenv("DATABASE_URL", "host=/nonexistent")
    rc, out, err = run(capsys, "status", "--dsn", dsn)
    assert rc == 0 and "no attached tables" in out


@pytest.mark.parametrize("args, needles", [
    (["nope", "--store-key", "store", "--file-key", "file"], ['relation "nope" does not exist', "hint:"]),
    (["chunks", "--store-key", "nope", "--file-key", "file"],
     ["store_key 'nope' is not a column or valid expression over", 'column "nope" does not exist',
      "hint: Give a column name"]),
    (["chunks", "--store-key", "store", "--file-key", "c.nope->>'x'"], ["file_key", "is not a column"]),
    (["chunks", "--store-key", "store", "--file-key", "file", "--content", "id"], ["is bigint, not text"]),
    (["chunks", "--store-key", "store", "--file-key", "file", "--content", "body", "--embedding", "zz"],
     ["has no column zz"]),
    (["chunks", "--store-key", "store", "--file-key", "file", "--content", "body", "--embedding", "body"],
     ["not a pgvector vector"]),
    (["chunks", "--store-key", "store", "--file-key", "file", "--content", "body", "--ts-config", "klingon"],
     ['text search configuration "klingon" does not exist']),
])
def test_attach_errors_are_one_clear_line(dsn, conn, capsys, args, needles):
    make_chunks(conn)
    rc, out, err = run(capsys, "--dsn", dsn, "attach", *args)
    assert_one_line_error(rc, err, *needles)
    assert not err.startswith("storetopics: error: storetopics:")
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 0


def test_attach_twice_is_one_clear_line(dsn, conn, capsys):
    make_chunks(conn)
    assert run(capsys, "--dsn", dsn, "attach", "chunks", "--store-key", "store", "--file-key", "file",
               "--content", "body")[0] == 0
    rc, out, err = run(capsys, "--dsn", dsn, "attach", "chunks", "--store-key", "store", "--file-key", "file",
                       "--content", "body")
    assert_one_line_error(rc, err, "public.chunks is already attached", "hint: Detach it first")


def test_connection_error_is_one_clear_line(capsys, monkeypatch):
    """The hint names what gave the connection string: --dsn, $DATABASE_URL, or nothing (libpq's PG* variables and
    defaults) (was: 'give --dsn' whatever was given, --dsn too; issue 31)."""
    bad = "host=/nonexistent-storetopics-dir port=1"
    for name in ("DATABASE_URL", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    rc, out, err = run(capsys, "--dsn", bad, "status")
    assert_one_line_error(rc, err, "could not connect", "hint: check the connection string given with --dsn")
    monkeypatch.setenv("DATABASE_URL", bad)
    rc, out, err = run(capsys, "status")
    assert_one_line_error(rc, err, "could not connect", "hint: check $DATABASE_URL")
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("PGHOST", "/nonexistent-storetopics-dir")
    monkeypatch.setenv("PGPORT", "1")
    rc, out, err = run(capsys, "status")
    assert_one_line_error(rc, err, "could not connect", "hint: check the PG* environment variables (PGHOST, PGPORT)",
                          "or give --dsn")
    monkeypatch.delenv("PGHOST")
    monkeypatch.delenv("PGPORT")
    with pytest.raises(api.StoretopicsError) as e:
        api.connect(bad)
    assert "given with --dsn" in e.value.hint


def test_installed_entry_point_errors_without_traceback(dsn, conn):
    """The real executable, in a subprocess: exit status 1, one line on stderr, nothing on stdout."""
    assert STORETOPICS_BIN.exists(), STORETOPICS_BIN
    make_chunks(conn)
    env = dict(os.environ, DATABASE_URL=dsn)
    for argv in (["attach", "missing_table", "--store-key", "s", "--file-key", "f"],
                 ["attach", "chunks", "--store-key", "store", "--file-key", "no_such_column"]):
        r = subprocess.run([str(STORETOPICS_BIN), *argv], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1, r
        assert r.stdout == ""
        assert_one_line_error(1, r.stderr)
    r = subprocess.run([str(STORETOPICS_BIN), "attach", "chunks", "--store-key", "store", "--file-key", "file",
                        "--content", "body"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r
    r = subprocess.run([str(STORETOPICS_BIN), "backfill"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "10 files folded" in r.stdout and "10/10 files" in r.stderr, r


COMMANDS = ("install", "attach", "detach", "backfill", "status", "show", "worker", "mcp")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_s_help_says_what_it_does_and_shows_an_example(command, capsys):
    """`storetopics COMMAND --help`: the one-line description the command list shows, then examples that run
    (was: usage and options only; issue 31)."""
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    listed = {a.dest: a for a in cli.build_parser()._subparsers._group_actions}["command"]
    one_line = next(c.help for c in listed._choices_actions if c.dest == command)
    assert description.strip().split("\n")[0] == one_line[0].upper() + one_line[1:] + ".", (description, one_line)
    examples = out[out.index("\nexamples:\n"):]
    assert re.search(rf"^  storetopics {command}\b", examples, re.M), out


# ------------------------------------------------------------------------------------------------------------
# Output helpers
# ------------------------------------------------------------------------------------------------------------
def test_truncate():
    assert cli.truncate("x" * 100, 100) == "x" * 100
    assert cli.truncate("abc def " * 20, 100) == ("abc def " * 20)[:99].rstrip() + "…"
    assert len(cli.truncate("abc def " * 20, 100)) <= 100
    assert cli.truncate(None, 10) == "-"


def test_format_table_aligns_and_wraps():
    text = cli.format_table(["name", "n", "text"], [("a", 1234, "one two three four five"), ("bb", 5, None)],
                            wrap={2: 9})
    lines = text.splitlines()
    assert lines[0] == "name      n  text"
    assert lines[2] == "a     1,234  one two"
    assert lines[3] == "             three"
    assert lines[5] == "bb        5  -"


# ------------------------------------------------------------------------------------------------------------
# make demo's core (the embedded server part is exercised by `make demo` itself)
# ------------------------------------------------------------------------------------------------------------
def test_demo_core_on_the_corpus(dsn):
    """Three of the demo's stores, whole (the outlier test needs a store of realistic size), run twice."""
    stores = ("games", "mail", "editors")
    out = io.StringIO()
    ok = demo.run(dsn, stores=stores, out=out, progress=False)
    text = out.getvalue()
    assert ok, text
    assert "summary restored exactly: yes" in text
    assert re.search(r"of which from printer-driver-oki itself \(outlier file\): .*\boki\b", text), text
    # Reruns start from the same state and print the same.
    out2 = io.StringIO()
    assert demo.run(dsn, stores=stores, out=out2, progress=False)
    strip = lambda s: re.sub(r"\[[\d.]+s\]|in [\d.]+s|source \d+|, [\d.,]+[kM]? words/s", "", s)  # noqa: E731
    assert strip(out2.getvalue()) == strip(text)


def test_demo_chunking():
    rec = {"short": " A synopsis ", "long": "First para\nwraps.\n\n\nSecond  para.\n\n"}
    assert demo.chunks_of(rec) == ["A synopsis", "First para wraps.", "Second para."]


# ------------------------------------------------------------------------------------------------------------
# attach: checks before anything is installed, --dry-run against the database, files table and mirror
# ------------------------------------------------------------------------------------------------------------
BAD_ATTACH = [
    (["--store-key", "store", "--file-key", "nope"], ["file_key 'nope' is not a column", 'column "nope" does not exist']),
    (["--store-key", "c.store + 1", "--file-key", "file"],
     ["store_key 'c.store + 1' is not a column or valid expression", "operator does not exist: text + integer"]),
    (["--store-key", "store", "--file-key", "file", "--content", "body", "--embedding", "body"],
     ["embedding column body of public.chunks is text, not a pgvector vector"]),
    (["--store-key", "store", "--file-key", "file", "--content", "body", "--mirror", "stores",
      "--mirror-column", "nope"], ["mirror public.stores has no column nope (mirror_column)", "hint: Add it"]),
    (["--store-key", "store", "--file-key", "file", "--content", "body", "--files-table", "stores",
      "--files-key", "nope"], ["files_table public.stores has no column nope"]),
]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("args, needles", BAD_ATTACH)
def test_attach_checks_before_installing_anything(dsn, conn, capsys, args, needles, dry_run):
    make_chunks(conn)
    conn.execute("CREATE TABLE stores (id text PRIMARY KEY, store_topics text)")
    rc, out, err = run(capsys, "--dsn", dsn, "attach", "chunks", *args, *(["--dry-run"] if dry_run else []))
    assert_one_line_error(rc, err, *needles)
    assert out == ""
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'storetopics%'").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE 'capture%'").fetchone()[0] == 0


def test_attach_dry_run_checks_then_installs_nothing_and_attach_mirrors(dsn, conn, capsys):
    make_chunks(conn)
    conn.execute("CREATE TABLE stores (id text PRIMARY KEY, store_topics text)")
    conn.execute("INSERT INTO stores VALUES ('fruit'), ('tools')")
    argv = ["--dsn", dsn, "attach", "chunks", "--store-key", "store", "--file-key", "file", "--content", "body",
            "--mirror", "stores"]
    rc, out, err = run(capsys, *argv, "--dry-run")
    assert rc == 0, err
    assert out.strip() == ("SELECT storetopics.attach(chunks => 'chunks'::regclass, store_key => 'store', "
                           "file_key => 'file', content => 'body', embedding => 'embedding', "
                           "mirror => 'stores'::regclass);")
    assert "nothing was installed" in err
    assert conn.execute("SELECT count(*) FROM storetopics.sources").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'storetopics%'").fetchone()[0] == 0

    rc, out, err = run(capsys, *argv)
    assert rc == 0 and out.strip().isdigit(), err
    conn.execute("SELECT * FROM storetopics.backfill()")
    mirrored = dict(conn.execute("SELECT id, store_topics FROM stores").fetchall())
    assert mirrored == {k: v for k, v in db_topics(conn).items() if k in mirrored}
    assert "orchards" in mirrored["fruit"] or "fruit" in mirrored["fruit"]
