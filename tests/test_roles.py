"""Roles as a real deployment has them, none of them superuser:

* app_owner owns the application's tables and attaches them, after an administrator ran
  storetopics.grant_attach('app_owner');
* app_writer writes chunks and files with plain table privileges and no rights on storetopics at all;
* worker can read the attached tables (and update the mirror column) and write only storetopics' own schema, after
  storetopics.grant_worker('worker'); it runs storetopics.backfill().

Both install paths (extension and plain script) are exercised."""
from __future__ import annotations

import psycopg
import pytest
from psycopg import conninfo

from tests import helpers
from tests.test_libraries import GARAGE, KITCHEN, STARS
from tests.test_recipes import HAND_ATTACH, HAND_DDL


def as_role(dsn: str, role: str) -> psycopg.Connection:
    c = psycopg.connect(conninfo.make_conninfo(dsn, user=role), autocommit=True)
    c.execute("SET client_min_messages = warning")
    return c


def add(c, store: int, first: int, files: dict) -> list[int]:
    ids = []
    for n, (name, texts) in enumerate(files.items()):
        c.execute("INSERT INTO app.files (id, store_id, name) VALUES (%s, %s, %s)", (first + n, store, name))
        c.execute("INSERT INTO app.chunks (file_id, content) SELECT %s, t FROM unnest(%s::text[]) t", (first + n, texts))
        ids.append(first + n)
    return ids


@pytest.mark.parametrize("how", ["extension", "script"])
def test_owner_attaches_and_worker_backfills_without_superuser(make_db, how):
    dsn = make_db(how)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SET client_min_messages = warning")
        for role in ("app_owner", "app_writer", "worker"):
            admin.execute(f"DROP ROLE IF EXISTS {role}")  # roles are cluster-wide; a previous test may have left one
        admin.execute("CREATE ROLE app_owner LOGIN; CREATE ROLE app_writer LOGIN; CREATE ROLE worker LOGIN")
        admin.execute("CREATE SCHEMA app AUTHORIZATION app_owner")
        admin.execute("SELECT storetopics.grant_attach('app_owner')")
        admin.execute("SELECT storetopics.grant_worker('worker')")
        try:
            with as_role(dsn, "app_owner") as owner:
                assert owner.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0] is False
                owner.execute("SET search_path = app, public")
                owner.execute(HAND_DDL)
                owner.execute("INSERT INTO stores VALUES (1, 'kitchen', NULL), (2, 'garage', NULL)")
                owner.execute("GRANT USAGE ON SCHEMA app TO app_writer, worker")
                owner.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON app.files, app.chunks TO app_writer")
                owner.execute("GRANT USAGE ON SEQUENCE app.chunks_id_seq TO app_writer")
                owner.execute("GRANT SELECT ON app.stores, app.files, app.chunks TO worker")
                owner.execute("GRANT UPDATE (store_topics) ON app.stores TO worker")
                with as_role(dsn, "app_writer") as writer:
                    add(writer, 1, 100, KITCHEN)
                    src = owner.execute(HAND_ATTACH.replace("public.", "app.")).fetchone()[0]
                    add(writer, 2, 200, GARAGE)
                    with as_role(dsn, "worker") as worker:
                        rows = worker.execute("SELECT store, files, chunks FROM storetopics.backfill()").fetchall()
                        assert sorted(rows) == [("1", 3, 6), ("2", 3, 6)]
                        st = helpers.state(admin, src)
                        assert st == helpers.recount(admin, src)
                        base = helpers.summaries(admin, src)
                        assert "pasta" in base["1"][0] and "brake" in base["2"][0]
                        assert dict(admin.execute("SELECT id::text, store_topics FROM app.stores").fetchall()) == \
                            {k: v[0] for k, v in base.items()}

                        # the application keeps writing; a move; the worker keeps up; deleting restores exactly
                        added = add(writer, 1, 300, STARS)
                        writer.execute("UPDATE app.files SET store_id = 2 WHERE id = 100")
                        worker.execute("SELECT * FROM storetopics.backfill()")
                        assert helpers.state(admin, src) == helpers.recount(admin, src)
                        assert "telescope" in helpers.summaries(admin, src)["1"][0]
                        writer.execute("UPDATE app.files SET store_id = 1 WHERE id = 100")
                        writer.execute("DELETE FROM app.files WHERE id = ANY(%s)", (added,))
                        worker.execute("SELECT * FROM storetopics.backfill()")
                        helpers.assert_restored(admin, src, base, st)

                        # the worker writes nothing of the application's but the mirror column
                        for stmt in ("INSERT INTO app.chunks (file_id, content) VALUES (100, 'x')",
                                     "UPDATE app.stores SET name = 'x'", "DELETE FROM app.files"):
                            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                                worker.execute(stmt)
                        # and nobody but the owner may detach
                        with pytest.raises(psycopg.errors.InsufficientPrivilege):
                            worker.execute("SELECT storetopics.detach('app.chunks')")
                    # the application's writer has no rights on storetopics, and needs none
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        writer.execute("SELECT * FROM storetopics.pending")
                assert owner.execute("SELECT storetopics.detach('app.chunks')").fetchone()[0] is True
                assert owner.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'storetopics%'"
                                     ).fetchone()[0] == 0
        finally:
            admin.execute("DROP SCHEMA app CASCADE")
            for role in ("app_owner", "app_writer", "worker"):
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")
