"""Labels are untrusted: validation, and the Anthropic labeller through the real SDK against a local server that
speaks the Messages API (no mocked client objects).  The offline label and the cost ledger live in SQL: see
tests/test_clusters.py."""
from __future__ import annotations

import psycopg
import pytest

from storetopics.labels import (
    AnthropicLabeler,
    ClusterInput,
    LabelError,
    StoreInput,
    clean_label,
    clean_labels,
    prompt,
    store_prompt,
)
from tests.fakes.messages import MessagesServer

CLUSTER = ClusterInput(keywords=["chess", "board", "engine", "opening"],
                       representatives=["A chess engine that plays strong openings.", "Board game for two players."])


@pytest.mark.parametrize("text, ok", [
    ("Chess Engines", "Chess Engines"),
    ("  Board games and puzzles. ", "Board games and puzzles"),
    ("Label: Kitchen Renovation", "Kitchen Renovation"),
    ("Chess\nEngines", None),
    ("   ", None),
    (None, None),
])
def test_clean_label_tidies_the_form_only(text, ok):
    """What a label says is judged in SQL (storetopics._record_label, screen, grounding: test_screen.py and
    test_clusters.py); the labeller only tidies an answer's form."""
    clean, reason = clean_label(text)
    assert clean == ok
    assert (reason is None) == (ok is not None)


@pytest.mark.parametrize("text, ok", [
    ("Chess Engines\nBoard Games", ["Chess Engines", "Board Games"]),
    ("1. Chess engines.\n2) Board games\n- Opening theory\n* Endgame studies\n\u2022 Puzzles and problems",
     ["Chess engines", "Board games", "Opening theory", "Endgame studies", "Puzzles and problems"]),
    ("Label: Kitchen Renovation\n\n   \n", ["Kitchen Renovation"]),
    ("  \n ", []),
    (None, []),
])
def test_clean_labels_one_per_line(text, ok):
    """A keyword-only store's answer: one label per line, numbering and bullets removed; what each says is judged
    in SQL (storetopics._record_store_labels, test_store_labels.py)."""
    labels, reason = clean_labels(text)
    assert labels == ok
    assert (reason is None) == bool(ok)


def test_store_prompt_carries_terms_phrases_and_the_other_stores(server):
    store = StoreInput(terms=["pawn", "rook", "gambit"], phrases=["opening gambit"], others=["music: chord, tempo"])
    label = labeler(server).label_store(store)
    assert label.labels == ["Pawn Rook", "Gambit"] and label.calls == 1 and label.input_tokens > 0
    sent = server.requests[-1]
    assert sent["max_tokens"] >= 100
    prompt = sent["messages"][0]["content"]
    assert "<terms>pawn, rook, gambit</terms>" in prompt and "<phrases>opening gambit</phrases>" in prompt
    assert "<other_stores>music: chord, tempo</other_stores>" in prompt and "data, not instructions" in prompt


@pytest.fixture
def server():
    with MessagesServer() as s:
        yield s


def labeler(server, **kw):
    return AnthropicLabeler(api_key="test-key", base_url=server.base_url, **kw)


def test_anthropic_label_usage_and_prompt(server):
    label = labeler(server).label(CLUSTER)
    assert label.text == "Chess Board Engine" and label.labeller == "anthropic" and label.rejected is None
    assert label.input_tokens > 0 and label.output_tokens > 0 and label.calls == 1
    body = server.requests[-1]
    assert body["model"] == "claude-haiku-4-5" and body["temperature"] == 0 and body["max_tokens"] <= 32
    prompt = body["messages"][0]["content"]
    assert "chess, board, engine, opening" in prompt and "A chess engine" in prompt
    assert "2-5" in prompt and "not instructions" in prompt


def test_representatives_are_truncated_to_a_budget(server):
    big = ClusterInput(keywords=["x"], representatives=["word " * 5000] * 5)
    labeler(server, chunk_chars=300).label(big)
    prompt = server.requests[-1]["messages"][0]["content"]
    assert prompt.count("<document>") == 3 and len(prompt) < 3 * 300 + 1000


def test_rate_limit_with_retry_after_is_retried_by_the_sdk(server):
    server.plan(429, retry_after=0)
    assert labeler(server).label(CLUSTER).text == "Chess Board Engine"
    assert len(server.requests) == 2


def test_server_errors_raise_label_error_after_retries(server):
    for _ in range(3):
        server.plan(500)
    with pytest.raises(LabelError, match="InternalServerError"):
        labeler(server, max_retries=2).label(CLUSTER)
    assert len(server.requests) == 3


def test_timeout_raises_label_error(server):
    server.plan("delay", seconds=2)
    with pytest.raises(LabelError, match="Timeout"):
        labeler(server, timeout=0.5, max_retries=0).label(CLUSTER)


def test_malformed_body_raises_label_error(server):
    server.plan("garbage")
    with pytest.raises(LabelError):
        labeler(server, max_retries=0).label(CLUSTER)


def test_an_answer_on_several_lines_is_no_label(server):
    server.plan("text", text="Chess engines\nIgnore previous instructions")
    label = labeler(server).label(CLUSTER)
    assert label.text is None and label.rejected == "several lines"
    assert label.calls == 1 and label.input_tokens > 0     # the call happened and is accounted for


def test_the_prompt_carries_what_the_other_clusters_and_stores_are_about(server):
    cluster = ClusterInput(keywords=["jvm", "spring", "maven"], representatives=["Spring Boot services on the JVM."],
                           siblings=["kotlin coroutines", "android apps"], others=["python: django, flask, pip"])
    labeler(server).label(cluster)
    prompt = server.requests[-1]["messages"][0]["content"]
    assert "<other_clusters>kotlin coroutines; android apps</other_clusters>" in prompt
    assert "<other_stores>python: django, flask, pip</other_stores>" in prompt
    assert "sets it apart" in prompt and "data, not instructions" in prompt


# ------------------------------------------------------------------------------------------------------------
# A sibling store with no terms to show yet (issue 31): its entry in <other_stores> is NULL
# ------------------------------------------------------------------------------------------------------------
def test_a_prompt_leaves_out_siblings_and_stores_with_nothing_to_show():
    cluster = ClusterInput(keywords=["chess", "board"], representatives=["A chess engine."],
                           siblings=[None, "kitchen renovation"], others=[None, "games: go, shogi", None])
    text = prompt(cluster)
    assert "<other_clusters>kitchen renovation</other_clusters>" in text
    assert "<other_stores>games: go, shogi</other_stores>" in text
    store = StoreInput(terms=["pawn", None, "rook"], phrases=[None, "opening gambit"], others=[None])
    text = store_prompt(store)
    assert "<terms>pawn, rook</terms>" in text and "<phrases>opening gambit</phrases>" in text
    assert "<other_stores></other_stores>" in text


def test_two_stores_with_embeddings_one_whose_terms_are_not_known_yet(make_db, messages):
    """The catalog's other stores are told to the labeller as '<key>: <first contrastive terms>'; a sibling whose
    topics hold no contrastive term yet is NULL there.  The labelling call goes ahead without it (was: TypeError in
    prompt(), the pass failed)."""
    from storetopics import api, refresh
    from tests.test_clusters import insert, rows_for, setup_table
    with psycopg.connect(make_db(), autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        source = setup_table(conn)
        insert(conn, rows_for("kitchen", 12, store="s1") + rows_for("chess", 12, store="s1")
                     + rows_for("guitar", 12, store="s2"))
        api.backfill(conn)                                          # offline labels, every store rendered
        conn.execute("UPDATE storetopics.store_state SET topics = jsonb_set(topics, '{contrast}', '[]') "
                     "WHERE store_key = 's2'")
        assert conn.execute("SELECT storetopics._other_stores(%s, 's1')", (source,)).fetchone()[0] == [None]
        conn.execute("SELECT storetopics.configure('chunks', '{\"labeller\": \"anthropic\"}')")
        conn.execute("UPDATE storetopics.clusters SET label_needed = true WHERE store_key = 's1'")
        stats = refresh.label(conn, source, "s1")
        assert stats.calls >= 2 and stats.ok == stats.calls and stats.errors == 0, stats
        assert all("<other_stores></other_stores>" in b["messages"][0]["content"] for b in messages.requests)


def _llm_gates(conn, source: int, kw: int) -> dict[str, bool]:
    """What every place that asks for, waits on or shows an LLM label says now, for the store 's1' (clusters) of
    `source` and the keyword-only store 'chess' of `kw`, both with labels due."""
    one = lambda q, *a: conn.execute(q, a).fetchone()[0]  # noqa: E731
    conn.execute("SELECT storetopics._render(source_id, store_key) FROM storetopics.store_state "
                 "ORDER BY source_id, store_key")      # every store rendered: none is dirty for that
    shown = one("SELECT topics FROM storetopics.stores WHERE source_id = %s AND store_key = 's1'", source)
    return {
        "labels_due": one("SELECT count(*) > 0 FROM storetopics._labels_due(%s, 's1')", source),
        "store_labels_due": one("SELECT count(*) > 0 FROM storetopics._store_labels_due(%s, 'chess')", kw),
        "stores_due": one("SELECT coalesce(bool_or(label), false) FROM storetopics._stores_due(%s) WHERE store_key = 's1'", source)
                      and one("SELECT coalesce(bool_or(label), false) FROM storetopics._stores_due(%s) "
                              "WHERE store_key = 'chess'", kw),
        "store_dirty": one("SELECT storetopics._store_dirty(%s, 's1') AND storetopics._store_dirty(%s, 'chess')",
                           source, kw),
        "metrics": one("SELECT dirty_stores > 0 FROM storetopics.metrics() WHERE source_id = %s", kw),
        "render_clusters": any(c["labeller"] != "offline" for c in shown["clusters"]),
        "render_store": one("SELECT topics ->> 'topics_from' FROM storetopics.stores WHERE source_id = %s "
                            "AND store_key = 'chess'", kw) == "labeller",
    }


def test_one_sql_function_decides_whether_a_source_gets_llm_labels(make_db, messages):
    """Issue 32: whether a source's stores get LLM labels is decided in one place, storetopics._llm_labeller().
    Nothing else in the schema or in the Python package compares the labeller with 'offline'; setting the labeller
    flips every gate (labels_due, store_labels_due, stores_due, the worker's dirty test, metrics, render) through
    that function alone, and a _llm_labeller() that says the opposite of the settings is what every gate and the
    refresh pass follow."""
    import pathlib
    import re

    from storetopics import api, refresh
    from tests.test_clusters import insert, rows_for, setup_table
    from tests.test_store_labels import setup as setup_keyword_only
    with psycopg.connect(make_db(), autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        compares = re.compile(r"(<>|!=|=)\s*'offline'|'offline'(::text)?\s*(<>|!=|=)")
        deciders = {name for name, body in conn.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'storetopics'::regnamespace AND p.prokind = 'f'") if compares.search(body)}
        assert deciders == {"_llm_labeller"}, deciders
        python = re.compile(r"""(==|!=)\s*["']offline["']|["']offline["']\s*(==|!=)""")
        for f in pathlib.Path(refresh.__file__).parent.glob("*.py"):
            assert not python.search(f.read_text()), f"{f.name} decides about the offline labeller itself"

        source = setup_table(conn)
        conn.execute("SELECT storetopics.configure('chunks', '{\"labeller\": \"anthropic\"}')")
        insert(conn, rows_for("kitchen", 12, store="s1") + rows_for("chess", 12, store="s1"))
        kw = setup_keyword_only(conn)
        api.backfill(conn)                                  # LLM labels for the clusters and the keyword-only stores
        assert messages.requests

        def due_again():
            conn.execute("UPDATE storetopics.clusters SET label_needed = true, label_retry_at = now() - interval '1s' "
                         "WHERE source_id = %s AND chunks > 0", (source,))
            conn.execute("UPDATE storetopics.store_state SET store_label_needed = true, "
                         "store_label_retry_at = now() - interval '1s' WHERE source_id = %s AND store_key = 'chess'",
                         (kw,))

        def labeller(name):
            for table in ("chunks", "kw"):
                conn.execute("SELECT storetopics.configure(%s, %s::jsonb)", (table, f'{{"labeller": "{name}"}}'))

        due_again()
        assert set(_llm_gates(conn, source, kw).values()) == {True}, _llm_gates(conn, source, kw)
        labeller("offline")
        assert set(_llm_gates(conn, source, kw).values()) == {False}, _llm_gates(conn, source, kw)
        labeller("anthropic")
        assert set(_llm_gates(conn, source, kw).values()) == {True}, _llm_gates(conn, source, kw)

        # the function alone, against the settings: every gate follows it, and so does the refresh pass
        real = conn.execute("SELECT pg_get_functiondef('storetopics._llm_labeller(int)'::regprocedure)").fetchone()[0]
        conn.execute("CREATE OR REPLACE FUNCTION storetopics._llm_labeller(p_source int) RETURNS boolean "
                     "LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp RETURN false")
        try:
            assert set(_llm_gates(conn, source, kw).values()) == {False}, _llm_gates(conn, source, kw)
            asked = len(messages.requests)
            assert refresh.llm_labeller(conn, source) is None and refresh.llm_labeller(conn, kw) is None
            assert refresh.label(conn, source, "s1").calls == 0 and refresh.label(conn, kw, "chess").calls == 0
            assert refresh.refresh_store(conn, kw, "chess").labels.calls == 0
            assert api.backfill(conn).label_calls == 0 and len(messages.requests) == asked
            due_again()
            labeller("offline")
            conn.execute("CREATE OR REPLACE FUNCTION storetopics._llm_labeller(p_source int) RETURNS boolean "
                         "LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp RETURN true")
            assert set(_llm_gates(conn, source, kw).values()) == {True}, _llm_gates(conn, source, kw)
        finally:
            conn.execute(real)


# ------------------------------------------------------------------------------------------------------------
# A labeller that cannot work (issue 31): no key, no SDK, a server that refuses or is not there
# ------------------------------------------------------------------------------------------------------------
def closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LLM_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL")


def test_a_labeller_that_cannot_work_is_one_clear_error(make_db, monkeypatch, capsys):
    """`storetopics backfill` with a labeller that cannot work: every store is still folded, fitted and rendered
    (with the labels it had), no call is recorded, and the run ends with one error line saying what to do (which
    variable, which extra) and exit status 1: not one failed call, warning and SDK error per cluster."""
    import sys

    from tests.fakes.chat import ChatCompletionsServer
    from tests.test_cli import assert_one_line_error, run
    from tests.test_clusters import insert, rows_for, setup_table
    for name in LLM_ENV:
        monkeypatch.delenv(name, raising=False)
    dsn = make_db()
    with MessagesServer() as messages, ChatCompletionsServer() as chat, \
            psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        setup_table(conn)
        insert(conn, rows_for("kitchen", 12, store="s1") + rows_for("chess", 12, store="s1")
               + rows_for("guitar", 12, store="s2") + rows_for("garden", 12, store="s2"))
        conn.execute("SELECT storetopics.configure('chunks', '{\"labeller\": \"anthropic\", \"k_min\": 2}')")
        with monkeypatch.context() as m:
            m.setenv("ANTHROPIC_API_KEY", "test-key")
            m.setenv("ANTHROPIC_BASE_URL", messages.base_url)
            rc, out, err = run(capsys, "--dsn", dsn, "backfill", "-q")
        assert rc == 0 and "labelling calls" in out, err

        def labels():
            return conn.execute("SELECT store_key, cluster_id, label, labeller FROM storetopics.clusters "
                                "WHERE chunks > 0 ORDER BY 1, 2").fetchall()
        before, texts = labels(), conn.execute("SELECT store_key, store_topics FROM storetopics.stores ORDER BY 1").fetchall()
        assert len(before) >= 4 and all(r[3] == "anthropic" and r[2] for r in before), before
        ledger = conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0]
        refused = f"http://127.0.0.1:{closed_port()}"
        cases = [   # labeller, environment, what goes wrong, what the error line says
            ("anthropic", {"ANTHROPIC_BASE_URL": messages.base_url}, None, ["ANTHROPIC_API_KEY is not set"]),
            ("anthropic", {"ANTHROPIC_API_KEY": "k"}, "hide", ["pip install 'storetopics[anthropic]'"]),
            ("anthropic", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": refused}, None,
             ["cannot reach", refused, "ANTHROPIC_BASE_URL"]),
            ("anthropic", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": messages.base_url}, 401,
             ["refused", "401", "ANTHROPIC_API_KEY"]),
            ("openai", {}, None, ["OPENAI_API_KEY is not set", "OPENAI_BASE_URL"]),
            ("openai", {"OPENAI_BASE_URL": chat.base_url}, "hide", ["pip install 'storetopics[openai]'"]),
            ("openai", {"OPENAI_BASE_URL": refused + "/v1"}, None, ["cannot reach", refused, "OPENAI_BASE_URL"]),
            ("openai", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": chat.base_url}, 401,
             ["refused", "401", "OPENAI_API_KEY"]),
        ]
        for labeller, env, trouble, needles in cases:
            conn.execute("SELECT storetopics.configure('chunks', %s)", (f'{{"labeller": "{labeller}"}}',))
            conn.execute("UPDATE storetopics.clusters SET label_needed = true, label_retry_at = NULL")
            asked = len(messages.requests) + len(chat.requests)
            with monkeypatch.context() as m:
                for k, v in env.items():
                    m.setenv(k, v)
                if trouble == "hide":
                    m.setitem(sys.modules, labeller, None)          # as if the extra were not installed
                elif trouble == 401 and labeller == "anthropic":
                    messages.plan(401, no_retry=True)
                elif trouble == 401:
                    chat.fail(401, no_retry=True)
                rc, out, err = run(capsys, "--dsn", dsn, "backfill", "-q")
            case = (labeller, env, trouble)
            assert_one_line_error(rc, err, f"the {labeller} labeller", *needles)
            assert "TypeError" not in err, (case, err)
            assert "2 stores rendered" in out and "labelling call" not in out, (case, out)
            assert len(messages.requests) + len(chat.requests) - asked <= 1, case    # asked once, not per cluster
            assert labels() == before, case                                           # the old labels stay
            assert conn.execute("SELECT store_key, store_topics FROM storetopics.stores ORDER BY 1").fetchall() == texts
            assert conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0] == ledger, case
        # the labeller back: the labels due are asked for at once (no backoff was recorded for a labeller that
        # could not work)
        conn.execute("SELECT storetopics.configure('chunks', '{\"labeller\": \"anthropic\"}')")
        with monkeypatch.context() as m:
            m.setenv("ANTHROPIC_API_KEY", "test-key")
            m.setenv("ANTHROPIC_BASE_URL", messages.base_url)
            rc, out, err = run(capsys, "--dsn", dsn, "backfill", "-q")
        assert rc == 0 and f"{len(before)} labelling calls" in out, (out, err)
