"""Routers on a streaming replica (issue 34): a throwaway primary and a hot standby made from it with
`pg_basebackup -R` (tests.harness.replica), both on unix sockets.  Attached and written on the primary:

* on the standby, a reader role (granted on the primary by an administrator with storetopics.grant_read) gets the
  same catalog(), route(), route_text() and search() answers as on the primary, and `storetopics status`/`show` work;
* the replica lag from a render committed on the primary to its description in the standby's catalog(), measured;
* `storetopics mcp --dsn <standby>` serves the tools (the official MCP SDK's client over stdio) and, LISTEN not
  working on a standby, polls (--poll): a store rendered on the primary reaches the client as tools/list_changed;
* the worker (`storetopics worker`, `python -m storetopics.worker`) and backfill (CLI and api) refuse the standby with
  one error that says to point them at the primary.
"""
from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from storetopics import api
from storetopics import install as st_install
from tests import harness, helpers

REPO = Path(__file__).resolve().parents[1]
STORES = {"games": {"chess": "chess opening gambit endgame bishop knight checkmate rook",
                    "go": "go stones territory komi ladder joseki liberties board"},
          "kitchen": {"bread": "sourdough bread starter flour dough oven crust rise",
                      "pasta": "pasta tomato sauce garlic basil noodles boil parmesan"}}


@dataclasses.dataclass
class Replica:
    primary: str        # DSNs of the database 'app', as the administrator
    standby: str
    source: int

    def as_(self, dsn: str, user: str) -> str:
        return conninfo.make_conninfo(dsn, user=user)


@pytest.fixture(scope="module")
def replica():
    # synchronous_commit on (the default; the throwaway clusters turn it off): a commit is sent to the standby at
    # once, as in production, not when the WAL writer next flushes
    with harness.replica({"synchronous_commit": "on"}) as (primary, standby):
        with psycopg.connect(primary.dsn(), autocommit=True) as c:
            c.execute("CREATE DATABASE app")
        dsn = primary.dsn("app")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET client_min_messages = warning")
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE EXTENSION plpython3u")   # backfill() then clusters inside the database (route())
            st_install.install(dsn, extension=True, log=lambda *a: None)
            helpers.create_chunks(conn)
            conn.execute("CREATE INDEX ON chunks (file_id)")
            helpers.insert_chunks(conn, helpers.topical_rows(STORES, files=6, chunks=2))
            source = helpers.attach_chunks(conn)
            helpers.backfill(conn)
            # the reader, made on the primary by an administrator: every source's summaries, and the chunks
            conn.execute("CREATE ROLE router LOGIN")
            conn.execute("SELECT storetopics.grant_read('router')")
            conn.execute("GRANT SELECT ON chunks TO router")
        rep = Replica(dsn, standby.dsn("app"), source)
        harness.replayed(rep.primary, rep.standby)
        yield rep


def _answers(dsn: str, source: int) -> dict:
    """What a router asks, as the role in dsn."""
    with psycopg.connect(dsn, autocommit=True) as c:
        near_chess = "[" + ",".join(str(x) for x in helpers.topic_vector("chess", STORES)) + "]"
        return {
            "catalog": c.execute("SELECT catalog, source::text, source_id, store_key, tool_name, description, tokens, "
                                 "updated_at, content_hash FROM storetopics.catalog() ORDER BY tool_name").fetchall(),
            "route": c.execute("SELECT store_key, tool_name, round(score::numeric, 6), cluster_id, label, search "
                               "FROM storetopics.route(%s::vector, 3)", (near_chess,)).fetchall(),
            "route_text": c.execute("SELECT store_key, round(score::numeric, 6), label, search "
                                    "FROM storetopics.route_text('sourdough bread with a good crust', 3)").fetchall(),
            "search": c.execute("SELECT file_key, chunk, content, rank FROM storetopics.search('chunks', 'games', "
                                "'chess gambit', 3)").fetchall(),
            "stores": c.execute("SELECT store_key, store_topics FROM storetopics.stores ORDER BY 1").fetchall(),
        }


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=str(REPO), timeout=120)


def test_a_reader_gets_the_primarys_answers_on_the_standby(replica):
    router_standby = replica.as_(replica.standby, "router")
    with psycopg.connect(router_standby, autocommit=True) as c:
        assert c.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    on_standby = _answers(router_standby, replica.source)
    assert on_standby == _answers(replica.as_(replica.primary, "router"), replica.source)
    assert {r[3] for r in on_standby["catalog"]} == {"games", "kitchen"}
    assert all(r[5] for r in on_standby["catalog"])                       # every store has its description
    assert on_standby["route"][0][0] == "games" and on_standby["route"][0][-1], on_standby["route"]   # clustered
    assert on_standby["route_text"][0][0] == "kitchen" and on_standby["route_text"][0][-1]
    assert on_standby["search"] and all("chess" in r[2] or "gambit" in r[2] for r in on_standby["search"])
    # the CLI's reads work there too (as the administrator: status reads the worker's tables)
    status = _cli("storetopics.cli", "--dsn", replica.standby, "status")
    assert status.returncode == 0 and "games" in status.stdout and "kitchen" in status.stdout, status.stderr
    show = _cli("storetopics.cli", "--dsn", router_standby, "show", "--store", "kitchen")
    assert show.returncode == 0 and on_standby["stores"][1][1][:40] in " ".join(show.stdout.split()), show


def test_replica_lag_from_a_render_on_the_primary_to_the_standbys_catalog(replica):
    """A store rendered on the primary (SQL backfill(), committed) until the standby's catalog() lists it, 20 times.
    The number is printed (pytest -s) and in docs/scaling.md."""
    router_standby = replica.as_(replica.standby, "router")
    lags = []
    with psycopg.connect(replica.primary, autocommit=True) as p, \
            psycopg.connect(router_standby, autocommit=True) as s:
        p.execute("SET client_min_messages = warning")
        for i in range(20):
            store = f"lag{i}"
            p.execute("INSERT INTO chunks (store_id, file_id, content) VALUES (%s, %s, %s)",
                      (store, 10000 + i, f"replica lag measurement number {i}: checkpoints and wal senders"))
            p.execute("SELECT * FROM storetopics.backfill(store_key => %s)", (store,))
            t0 = time.perf_counter()
            while not s.execute("SELECT count(*) FROM storetopics.catalog() WHERE store_key = %s",
                                (store,)).fetchone()[0]:
                assert time.perf_counter() - t0 < 30, f"{store} did not reach the standby in 30 s"
                time.sleep(0.001)
            lags.append(time.perf_counter() - t0)
            want = p.execute("SELECT store_topics, md5(store_topics) FROM storetopics.stores WHERE store_key = %s",
                             (store,)).fetchone()
            assert s.execute("SELECT description, content_hash FROM storetopics.catalog() WHERE store_key = %s",
                             (store,)).fetchone() == want
    print(f"\nreplica lag, render committed on the primary -> description in the standby's catalog(), 20 stores: "
          f"median {statistics.median(lags) * 1000:.1f} ms, max {max(lags) * 1000:.1f} ms")
    assert max(lags) < 5


def test_storetopics_mcp_on_the_standby_polls_and_announces_changes(replica):
    pytest.importorskip("mcp", reason="the MCP server needs the extra `mcp`")
    import anyio
    from mcp import types

    from tests import test_mcp

    router_standby = replica.as_(replica.standby, "router")

    def catalog(dsn: str) -> dict[str, tuple[str, str]]:
        with psycopg.connect(dsn, autocommit=True) as c:
            return {r[0]: (r[1], r[2]) for r in c.execute("SELECT tool_name, store_key, description "
                                                          "FROM storetopics.catalog()")}

    async def main():
        async with test_mcp.client(router_standby, "--poll", "0.5", wait_listening=False) as (session, notes, log):
            with anyio.fail_after(60):
                while "polling the catalog every 0.5s" not in log.read_text():
                    await anyio.sleep(0.05)
            listed = test_mcp._tools(await session.list_tools())
            want = catalog(router_standby)
            assert set(listed) == {"route"} | set(want)
            for name, (store, summary) in want.items():
                assert listed[name].description == test_mcp._described(store, summary)
            hits = test_mcp._json(await session.call_tool("search_games", {"query": "chess endgame", "k": 2}))
            assert hits["results"] and all("chess" in r["content"] or "endgame" in r["content"]
                                           for r in hits["results"])
            routed = test_mcp._json(await session.call_tool("route", {"query": "pasta with garlic and basil"}))
            assert routed["method"] == "route_text()" and routed["search"][:1] == ["search_kitchen"], routed

            # a store written and rendered on the primary: the client hears of it through the standby
            after = len(notes.items)
            with psycopg.connect(replica.primary, autocommit=True) as p:
                p.execute("SET client_min_messages = warning")
                helpers.insert_chunks(p, helpers.topical_rows(
                    {"music": {"jazz": "saxophone trumpet swing bebop improvisation chord"}}, files=2, chunks=1,
                    first_file=20000))
                p.execute("SELECT * FROM storetopics.backfill(store_key => 'music')")
            t0 = time.perf_counter()
            await notes.wait_for(types.ToolListChangedNotification, after=after, timeout=30)
            heard = time.perf_counter() - t0
            listed = test_mcp._tools(await session.list_tools())
            want = catalog(router_standby)
            assert "search_music" in listed and set(listed) == {"route"} | set(want)
            assert listed["search_music"].description == test_mcp._described("music", want["search_music"][1])
            text = log.read_text()
            assert "LISTEN" not in text.replace("LISTEN does not work there", ""), text
            print(f"\nstoretopics mcp on the standby (--poll 0.5): tools/list_changed {heard * 1000:.0f} ms after "
                  "the render committed on the primary")

    anyio.run(main)


def test_the_worker_and_backfill_refuse_the_standby(replica):
    for cmd, what in ((["storetopics.cli", "--dsn", replica.standby, "worker", "--once"], "the worker"),
                      (["storetopics.cli", "--dsn", replica.standby, "backfill", "-q"], "backfill"),
                      (["storetopics.worker", "--dsn", replica.standby, "--once"], "the worker")):
        r = _cli(*cmd)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1, r.stderr
        assert errors[0].startswith(f"storetopics: error: {what} writes, and the server it connected to ("), errors
        assert "is a standby" in errors[0] and "(hint: point it at the primary" in errors[0], errors
        assert "Traceback" not in r.stderr
    with api.connect(replica.standby) as conn, pytest.raises(api.StoretopicsError, match="is a standby"):
        api.backfill(conn)
    # nothing was registered on the primary (no worker row) by the refused runs
    with psycopg.connect(replica.primary, autocommit=True) as p:
        assert p.execute("SELECT count(*) FROM storetopics.workers").fetchone()[0] == 0
