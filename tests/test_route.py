"""Routing: storetopics.catalog() (one tool per store the caller may read: a valid, unique, deterministic name, the
summary as its description, its tokens and a hash that moves only with the text), route() (where a query embedding
belongs, from the stores' clusters, or nowhere) and route_text() (the same from the term counts), per role."""
from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import psycopg
import pytest

from storetopics import api
from storetopics import tokens as st_tokens
from tests import helpers

TOOL = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
KAPPA = 20


def catalog(conn, catalog_name=None) -> list[dict]:
    cur = conn.execute("SELECT * FROM storetopics.catalog(%s)", (catalog_name,))
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def route(conn, q, k=3, catalog_name=None) -> list[dict]:
    cur = conn.execute("SELECT * FROM storetopics.route(%s::vector, %s, %s)", (q, k, catalog_name))
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def route_text(conn, q, k=3, catalog_name=None) -> list[dict]:
    cur = conn.execute("SELECT * FROM storetopics.route_text(%s, %s, %s)", (q, k, catalog_name))
    names = [d.name for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def vec(v) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def unit(i: int, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim)
    v[i] = 1.0
    return v


def expected_name(key: str) -> str:
    """The tool name rule, written again: 'search_' + the lowercased key, [^a-z0-9_-] -> '_', cut to 64."""
    return ("search_" + re.sub(r"[^a-z0-9_-]", "_", key.lower()))[:64]


def keyword_rows(stores: dict[str, str], files: int = 3) -> list[tuple]:
    return [(s, f, f"{words} file {f}") for s, words in stores.items() for f in range(files)]


def insert(conn, rows, table="chunks"):
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} (store_id, file_id, content) VALUES (%s, %s, %s)", rows)


# ------------------------------------------------------------------------------------------------------------
# catalog()
# ------------------------------------------------------------------------------------------------------------
LONG_KEY = "Ä very long store key / with spaces, punctuation and more " * 3


def test_catalog_rows_and_tool_names_valid_unique_deterministic(conn):
    helpers.create_chunks(conn, "chunks")
    helpers.create_chunks(conn, "other")
    s1 = helpers.attach_chunks(conn, "chunks", embedding=False)
    s2 = helpers.attach_chunks(conn, "other", embedding=False)
    keys1 = {"Home Repair": "kitchen tiles grout", "garage": "engine oil brakes", "GARAGE": "tyres wheels",
             "docs": "manuals guides", "docs_2": "handbooks", LONG_KEY: "long key words"}
    insert(conn, keyword_rows(keys1))
    insert(conn, keyword_rows({"garage": "cars parking", "docs": "papers"}), "other")
    helpers.backfill(conn)
    rows = catalog(conn)
    by = {(r["source_id"], r["store_key"]): r for r in rows}
    assert set(by) == {(s1, k) for k in keys1} | {(s2, "garage"), (s2, "docs")}
    names = [r["tool_name"] for r in rows]
    assert all(TOOL.match(n) and n.startswith("search_") for n in names), names
    assert len(set(names)) == len(names), names
    # first come, first named (one fold names its new stores in bytewise key order): a free name is taken as it is;
    # a taken one gets the source id; still taken, the source id and a digest of the key
    assert (s1, s2) == (1, 2)
    assert by[(s1, "Home Repair")]["tool_name"] == "search_home_repair"
    assert by[(s1, "GARAGE")]["tool_name"] == "search_garage"
    assert by[(s1, "garage")]["tool_name"] == f"search_garage_{s1}"
    assert by[(s1, "docs")]["tool_name"] == "search_docs"
    assert by[(s1, "docs_2")]["tool_name"] == "search_docs_2"
    assert by[(s2, "garage")]["tool_name"] == f"search_garage_{s2}"
    # source 2's 'docs': search_docs and search_docs_2 are taken: the long form
    assert by[(s2, "docs")]["tool_name"] == f"search_docs_{s2}_{hashlib.md5(b'docs').hexdigest()[:8]}"
    long = by[(s1, LONG_KEY)]["tool_name"]
    assert long == expected_name(LONG_KEY) and len(long) == 64 and long.startswith("search___very_long_store_key")
    # the rest of each row
    for (sid, key), r in by.items():
        text, _ = helpers.summary(conn, sid, key)
        assert r["description"] == text and text
        assert r["content_hash"] == hashlib.md5(text.encode()).hexdigest()
        assert r["catalog"] == f"source:{sid}" and r["source"] == ("chunks" if sid == s1 else "other")
        assert r["updated_at"] is not None
    # deterministic: the same names on every call, and whatever order the rows were written in
    assert catalog(conn) == rows
    conn.execute("CREATE TABLE shuffled AS SELECT * FROM storetopics.store_state ORDER BY random()")
    conn.execute("DELETE FROM storetopics.store_state")
    conn.execute("INSERT INTO storetopics.store_state SELECT * FROM shuffled")
    assert [(r["source_id"], r["store_key"], r["tool_name"]) for r in catalog(conn)] == \
        [(r["source_id"], r["store_key"], r["tool_name"]) for r in rows]
    # one catalog only: the same names (a store's name does not depend on what else is listed)
    only2 = {r["store_key"]: r["tool_name"] for r in catalog(conn, f"source:{s2}")}
    assert only2 == {"garage": by[(s2, "garage")]["tool_name"], "docs": by[(s2, "docs")]["tool_name"]}
    assert catalog(conn, "no such catalog") == []


def test_a_stores_tool_name_never_changes_when_other_tables_come_and_go(conn):
    helpers.create_chunks(conn, "kitchen_docs")
    s1 = helpers.attach_chunks(conn, "kitchen_docs", embedding=False)
    insert(conn, keyword_rows({"kitchen": "tiles grout sink", "games": "chess boards"}), "kitchen_docs")
    helpers.backfill(conn)
    first = {r["store_key"]: r["tool_name"] for r in catalog(conn)}
    assert first == {"kitchen": "search_kitchen", "games": "search_games"}
    # another table with stores of the same names: the newcomers are suffixed, the incumbents keep theirs
    helpers.create_chunks(conn, "more_docs")
    s2 = helpers.attach_chunks(conn, "more_docs", embedding=False)
    insert(conn, keyword_rows({"kitchen": "ovens stoves", "games": "cards dice"}), "more_docs")
    helpers.backfill(conn)
    names = {(r["source_id"], r["store_key"]): r["tool_name"] for r in catalog(conn)}
    assert names == {(s1, "kitchen"): "search_kitchen", (s1, "games"): "search_games",
                     (s2, "kitchen"): f"search_kitchen_{s2}", (s2, "games"): f"search_games_{s2}"}
    # the incumbent goes: the newcomers keep the names they were given
    conn.execute("SELECT storetopics.detach('kitchen_docs')")
    helpers.backfill(conn)
    assert {r["store_key"]: r["tool_name"] for r in catalog(conn)} == \
        {"kitchen": f"search_kitchen_{s2}", "games": f"search_games_{s2}"}
    # the name is there before the first summary too (the stores view), for a client that names tools early
    insert(conn, keyword_rows({"garden": "roses"}), "more_docs")
    conn.execute("SELECT storetopics._fold(%s)", (s2,))
    assert conn.execute("SELECT tool_name, store_topics FROM storetopics.stores WHERE store_key = 'garden'"
                        ).fetchone() == ("search_garden", None)


def test_catalog_tokens_are_the_real_tokenizers_count_once_counted(conn):
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn, embedding=False)
    insert(conn, keyword_rows({"home": "kitchen renovation tiles grout plumbing", "garage": "engine oil brakes"}))
    api.backfill(conn)                        # the CLI counts what render priced, with tiktoken, and renders
    rows = catalog(conn)
    for r in rows:
        assert r["tokens"] == st_tokens.count(r["description"]), r
    # a chunk whose count is not known: NULL, not a guess
    conn.execute("DELETE FROM storetopics.token_counts WHERE chunk = ' files.'")
    assert {r["tokens"] for r in catalog(conn)} == {None}


def test_content_hash_changes_only_when_the_text_does(conn):
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn, embedding=False)
    insert(conn, keyword_rows({"home": "kitchen renovation tiles", "garage": "engine oil brakes"}))
    helpers.backfill(conn)
    before = {r["store_key"]: r for r in catalog(conn)}
    # nothing changed: the same rows; a change to another store leaves this one's hash and time alone
    helpers.backfill(conn)
    insert(conn, [("garage", 10, "spark plugs and a new exhaust")])
    conn.execute("UPDATE chunks SET content = content WHERE store_id = 'home'")   # a write that changes nothing
    helpers.backfill(conn)
    after = {r["store_key"]: r for r in catalog(conn)}
    assert after["home"] == before["home"]
    assert after["garage"]["description"] != before["garage"]["description"]
    assert after["garage"]["content_hash"] != before["garage"]["content_hash"]
    assert after["garage"]["content_hash"] == hashlib.md5(after["garage"]["description"].encode()).hexdigest()
    # the text changes back: so does the hash
    conn.execute("DELETE FROM chunks WHERE file_id = 10")
    helpers.backfill(conn)
    assert {r["store_key"]: r["content_hash"] for r in catalog(conn)} == \
        {k: r["content_hash"] for k, r in before.items()}


# ------------------------------------------------------------------------------------------------------------
# route(): synthetic stores with clusters
# ------------------------------------------------------------------------------------------------------------
def add_clusters(conn, source: int, store: str, centroids, chunks, radius=0.2) -> list[int]:
    """Clusters as a fit leaves them (unit centroids), written straight into storetopics.clusters."""
    ids = []
    for c, n in zip(centroids, chunks):
        c = np.asarray(c, float)
        ids.append(conn.execute(
            "INSERT INTO storetopics.clusters (source_id, store_key, centroid, radius, chunks, files, fit_size) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING cluster_id",
            (source, store, vec(c / np.linalg.norm(c)), radius, n, n, n)).fetchone()[0])
    return ids


def expected_scores(conn, q, source=None) -> dict:
    """route()'s score written again, from the clusters table: ln(sum_c chunks_c exp(kappa cos_c) / sum_c
    chunks_c) / kappa over a store's clusters with chunks in the query's dimension."""
    q = np.asarray(q, float)
    out: dict = {}
    for sid, store, cen, n in conn.execute(
            "SELECT source_id, store_key, centroid::text, chunks FROM storetopics.clusters WHERE chunks > 0"):
        c = np.array([float(x) for x in cen.strip("[]").split(",")])
        if len(c) != len(q) or (source is not None and sid != source):
            continue
        cos = float(c @ q / np.linalg.norm(c) / np.linalg.norm(q))
        w, tot = out.get((sid, store), (0.0, 0.0))
        out[(sid, store)] = (w + n * math.exp(KAPPA * cos), tot + n)
    return {k: math.log(w / t) / KAPPA for k, (w, t) in out.items()}


@pytest.fixture
def three_stores(conn):
    """Three keyword summaries ('kitchen', 'garden', 'music') whose clusters sit around e0, e1 and e2 of an 8-d
    space; nothing sits near e7."""
    helpers.create_chunks(conn)
    src = helpers.attach_chunks(conn)
    insert(conn, keyword_rows({"kitchen": "tiles grout", "garden": "compost mulch", "music": "guitar chords"}))
    helpers.backfill(conn)
    ids = {}
    ids["kitchen"] = add_clusters(conn, src, "kitchen", [unit(0) + 0.2 * unit(3), unit(0) + 0.2 * unit(4)], [30, 10])
    ids["garden"] = add_clusters(conn, src, "garden", [unit(1), unit(1) + 0.5 * unit(5)], [20, 20])
    ids["music"] = add_clusters(conn, src, "music", [unit(2)], [5])
    return conn, src, ids


def test_route_ranks_the_store_whose_cluster_holds_the_query_first(three_stores):
    conn, src, ids = three_stores
    q = unit(1) + 0.1 * unit(5) + 0.05 * unit(0)
    rows = route(conn, vec(q), k=3)
    assert [r["store_key"] for r in rows] == ["garden", "kitchen", "music"]
    first = rows[0]
    assert first["search"] is True and first["within_radius"] is True and first["source_id"] == src
    assert first["cluster_id"] in ids["garden"] and first["tool_name"] == "search_garden"
    exp = expected_scores(conn, q)
    for r in rows:
        assert r["score"] == pytest.approx(exp[(src, r["store_key"])], abs=1e-6)
    # the best cluster is the one nearest the query here (equal shares), with its cosine distance
    d = [1 - float(q @ c / np.linalg.norm(q) / np.linalg.norm(c)) for c in (unit(1), unit(1) + 0.5 * unit(5))]
    assert first["distance"] == pytest.approx(min(d), abs=1e-6)
    assert first["cluster_id"] == ids["garden"][int(np.argmin(d))]
    # k bounds the rows; a k above the number of stores gives them all
    assert [r["store_key"] for r in route(conn, vec(q), k=1)] == ["garden"]
    assert len(route(conn, vec(q), k=100)) == 3
    # the cluster's share counts: near both kitchen clusters' directions equally, the larger one weighs most
    q2 = unit(0) + 0.2 * unit(3) + 0.2 * unit(4)
    assert route(conn, vec(q2), k=1)[0]["cluster_id"] == ids["kitchen"][0]


def test_route_abstains_for_a_query_no_store_holds(three_stores):
    conn, src, _ = three_stores
    far = unit(7) + 0.1 * unit(6)
    rows = route(conn, vec(far), k=3)
    assert len(rows) == 3 and not any(r["search"] for r in rows), rows
    assert not any(r["within_radius"] for r in rows)
    # the threshold is the source's setting: at 0 the same query searches the best store ...
    conn.execute("SELECT storetopics.configure('chunks', '{\"route_threshold\": 0}')")
    assert route(conn, vec(far), k=1)[0]["search"] is True
    # ... and at 0.99 even a near query does not
    conn.execute("SELECT storetopics.configure('chunks', '{\"route_threshold\": 0.99}')")
    assert not any(r["search"] for r in route(conn, vec(unit(1) + 0.3 * unit(5)), k=3))
    conn.execute("SELECT storetopics.configure('chunks', '{\"route_threshold\": null}')")
    default = conn.execute("SELECT (storetopics.default_settings() ->> 'route_threshold')::float8").fetchone()[0]
    assert 0 < default < 1
    assert [r["search"] for r in route(conn, vec(unit(0)), k=3)] == [True, False, False]


def test_route_ignores_other_dimensions_and_empty_clusters(three_stores):
    conn, src, ids = three_stores
    # a store that has only 4-d clusters, one of them right on the query's direction; and an emptied 8-d cluster
    insert(conn, keyword_rows({"other": "lamps bulbs"}))
    helpers.backfill(conn)
    four = add_clusters(conn, src, "other", [np.eye(4)[2]], [50])
    add_clusters(conn, src, "music", [unit(6)], [0])           # no chunks: no topic
    rows = route(conn, vec(unit(6)), k=10)
    assert {r["store_key"] for r in rows} == {"kitchen", "garden", "music"}
    assert all(r["cluster_id"] != four[0] for r in rows)
    assert not any(r["search"] for r in rows)
    # in 4 dimensions only that store answers; in 3 nobody does
    rows4 = route(conn, vec(np.eye(4)[2]), k=10)
    assert [(r["store_key"], r["cluster_id"], r["search"]) for r in rows4] == [("other", four[0], True)]
    assert route(conn, vec([1, 0, 0]), k=10) == []


def test_route_and_route_text_refuse_bad_input_and_handle_empty_catalogs(conn):
    # nothing attached: no rows, no error
    assert catalog(conn) == [] and route(conn, vec(unit(0))) == [] and route_text(conn, "kitchen") == []
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn)
    insert(conn, keyword_rows({"kitchen": "tiles grout"}))
    helpers.backfill(conn)
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        route(conn, None)
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        route_text(conn, None)
    for k in (0, -1, None):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="k >= 1"):
            route(conn, vec(unit(0)), k=k)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="k >= 1"):
            route_text(conn, "tiles", k=k)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="zero vector"):
        route(conn, vec(np.zeros(8)))
    # a store without clusters (keyword-only so far), another catalog: no rows
    assert route(conn, vec(unit(0))) == []
    assert route_text(conn, "tiles", catalog_name="no such catalog") == []
    # named arguments: the parameters' names are the API
    assert conn.execute("SELECT count(*) FROM storetopics.route_text(query => 'tiles', catalog => 'no such catalog')"
                        ).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM storetopics.route(query_embedding => %s::vector, k => 1, "
                        "catalog => 'no such catalog')", (vec(unit(0)),)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM storetopics.catalog(name => 'no such catalog')").fetchone()[0] == 0
    # the settings are validated
    for bad in ('{"route_threshold": 1.5}', '{"route_threshold": -0.1}', '{"route_threshold": "high"}',
                '{"route_text_threshold": -1}', '{"route_text_threshold": true}'):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT storetopics.configure('chunks', %s)", (bad,))
    conn.execute("SELECT storetopics.configure('chunks', '{\"route_threshold\": 1, \"route_text_threshold\": 2.5}')")


def test_route_end_to_end_with_fitted_clusters(conn):
    """Clusters fitted by the CLI from real rows (vector(8)), labels from the summary."""
    helpers.create_chunks(conn)
    helpers.attach_chunks(conn)
    conn.execute("SELECT storetopics.configure('chunks', '{\"k_min\": 2, \"k_max\": 3}')")
    rng = np.random.default_rng(1)
    rows = []
    for i, (store, words) in enumerate((("kitchen", "tiles grout sink"), ("garden", "compost mulch seedlings"),
                                        ("music", "guitar chords melody"))):
        for f in range(25):
            v = unit(i) + 0.05 * rng.normal(size=8)
            rows.append((store, 100 * i + f, f"{words} number {f}", vec(v)))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO chunks (store_id, file_id, content, embedding) VALUES (%s, %s, %s, %s)", rows)
    api.backfill(conn)
    assert conn.execute("SELECT count(DISTINCT store_key) FROM storetopics.clusters WHERE chunks > 0").fetchone()[0] \
        == 3
    for i, store in enumerate(("kitchen", "garden", "music")):
        got = route(conn, vec(unit(i)), k=3)
        assert got[0]["store_key"] == store and got[0]["search"] and got[0]["within_radius"], got
        assert not any(r["search"] for r in got[1:]), got
        assert got[0]["label"] and got[0]["label"] in helpers.summary(conn, got[0]["source_id"], store)[0]
    assert not any(r["search"] for r in route(conn, vec(unit(7)), k=3))


# ------------------------------------------------------------------------------------------------------------
# route_text(): keyword-only stores
# ------------------------------------------------------------------------------------------------------------
def expected_text_scores(conn, query: str) -> dict:
    """route_text()'s score written again from store_terms (one source, english): the mean over the query's lexemes
    of ln((tf/words/2 + p/2) / p), p the lexeme's share of all the stores' words (lexemes no store holds: 0)."""
    lex = conn.execute("SELECT l.lexeme, cardinality(l.positions) FROM unnest(to_tsvector('english', %s)) l",
                       (query,)).fetchall()
    words = dict(((s, k), w) for s, k, w in conn.execute(
        "SELECT source_id, store_key, words FROM storetopics.store_state WHERE store_topics IS NOT NULL"))
    tf = {(s, k, x): t for s, k, x, t in conn.execute(
        "SELECT t.source_id, t.store_key, l.lexeme, t.total FROM storetopics.store_terms t "
        "JOIN storetopics.lexemes l ON l.id = t.term_id")}
    total = sum(words.values())
    out = {}
    for key, w in words.items():
        s = 0.0
        for x, n in lex:
            p = sum(t for (a, b, y), t in tf.items() if y == x and (a, b) in words) / total
            if p > 0:
                s += n * math.log((tf.get((*key, x), 0) / w / 2 + p / 2) / p)
        out[key] = s / max(sum(n for _, n in lex), 1)
    return out


def test_route_text_on_keyword_only_stores(conn):
    helpers.create_chunks(conn)
    src = helpers.attach_chunks(conn, embedding=False)
    insert(conn, keyword_rows({"kitchen": "kitchen tiles grout plumbing sink faucet",
                               "garden": "garden compost mulch seedlings pruning",
                               "music": "guitar chords melody rhythm amplifier"}, files=6))
    helpers.backfill(conn)
    q = "which grout for the kitchen tiles?"
    rows = route_text(conn, q, k=3)
    assert [r["store_key"] for r in rows][0] == "kitchen"
    assert rows[0]["search"] is True and not any(r["search"] for r in rows[1:]), rows
    assert rows[0]["label"] in ("grout", "kitchen", "tiles") and rows[0]["tool_name"] == "search_kitchen"
    assert (rows[0]["cluster_id"], rows[0]["distance"], rows[0]["within_radius"]) == (None, None, None)
    exp = expected_text_scores(conn, q)
    for r in rows:
        assert r["score"] == pytest.approx(exp[(src, r["store_key"])], abs=1e-9)
    # words no store has, or no words at all: every store scores 0 and none is searched
    for nothing in ("zebra quokka axolotl", "", "the and of"):
        got = route_text(conn, nothing, k=3)
        assert len(got) == 3 and {r["score"] for r in got} == {0} and not any(r["search"] for r in got), got
    # half known words, half unknown: the unknown ones weigh the score down
    assert route_text(conn, q + " zebra quokka axolotl capybara", k=1)[0]["score"] < rows[0]["score"]
    # its own threshold
    conn.execute("SELECT storetopics.configure('chunks', '{\"route_text_threshold\": 100}')")
    assert not any(r["search"] for r in route_text(conn, q, k=3))


def test_route_text_uses_each_sources_text_search_configuration(conn):
    helpers.create_chunks(conn, "en")
    helpers.create_chunks(conn, "plain")
    conn.execute("SELECT storetopics.attach('en', store_key => 'store_id', file_key => 'file_id', "
                 "content => 'content', embedding => NULL)")
    conn.execute("SELECT storetopics.attach('plain', store_key => 'store_id', file_key => 'file_id', "
                 "content => 'content', embedding => NULL, ts_config => 'simple')")
    insert(conn, keyword_rows({"runners": "running runs runner"}), "en")
    insert(conn, keyword_rows({"walkers": "walking walks walker"}), "plain")
    helpers.backfill(conn)
    # english stems 'running' to 'run'; simple keeps 'walking' whole: each query word finds its store's lexeme
    assert route_text(conn, "runs", k=1)[0]["store_key"] == "runners"
    assert route_text(conn, "walking", k=1)[0]["store_key"] == "walkers"
    assert route_text(conn, "walk", k=2)[0]["score"] == 0       # not a lexeme under 'simple'
    # a store alone in what is listed is its own background: it scores 0 (nothing to be told apart from)
    assert [(r["store_key"], r["score"], r["search"]) for r in route_text(conn, "walking", 3, "source:2")] == \
        [("walkers", 0, False)]


# ------------------------------------------------------------------------------------------------------------
# Who sees what (the rule of the stores view and metrics())
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def tenants(make_db):
    """Tenants a and b with a table each (stores with 8-d clusters), a router granted b's table, a role granted
    nothing (helpers.tenants)."""
    def rows(c, t, roles):
        c.execute(f"INSERT INTO {t}.docs (store, file, content) VALUES ('{t}-store', 1, 'honey bees hives'), "
                  f"('shared', 2, 'honey and bees')")

    with helpers.tenants(make_db(), ("router", "nobody"), each=rows) as (roles, conns, admin, sources):
        admin.execute("SELECT * FROM storetopics.backfill()")
        for i, t in enumerate(("a", "b")):
            add_clusters(admin, sources[t], f"{t}-store", [unit(i)], [10])
            add_clusters(admin, sources[t], "shared", [unit(i) + unit(5)], [10])
        admin.execute(f"GRANT {roles['router']} TO {roles['b']}")   # b chooses for its own router
        conns["b"].execute(f"SELECT storetopics.grant_read('{roles['router']}', 'b.docs')")
        yield roles, conns, admin, sources


def test_a_read_role_sees_and_routes_to_the_stores_of_its_sources_only(tenants):
    roles, conns, admin, sources = tenants
    everything = {(sources[t], k) for t in ("a", "b") for k in (f"{t}-store", "shared")}
    assert {(r["source_id"], r["store_key"]) for r in catalog(admin)} == everything
    router = conns["router"]
    assert {(r["source_id"], r["store_key"]) for r in catalog(router)} == {(sources["b"], "b-store"),
                                                                           (sources["b"], "shared")}
    # names are the stores' own, the same for every reader: a's 'shared' came first and took the plain name
    assert {r["tool_name"] for r in catalog(router)} == {"search_b-store", f"search_shared_{sources['b']}"}
    assert {r["tool_name"] for r in catalog(admin) if r["store_key"] == "shared"} == \
        {"search_shared", f"search_shared_{sources['b']}"}
    # a's store holds this query, but the router never hears of it
    rows = route(router, vec(unit(0)), k=10)
    assert {r["source_id"] for r in rows} == {sources["b"]} and len(rows) == 2
    assert route(admin, vec(unit(0)), k=1)[0]["store_key"] == "a-store"
    assert {r["source_id"] for r in route_text(router, "honey bees", k=10)} == {sources["b"]}
    assert catalog(router, f"source:{sources['a']}") == [] and route(router, vec(unit(0)), 3,
                                                                     f"source:{sources['a']}") == []
    # a role granted nothing may not call them ...
    for stmt, args in (("SELECT * FROM storetopics.catalog()", ()),
                       ("SELECT * FROM storetopics.route(%s::vector)", (vec(unit(0)),)),
                       ("SELECT * FROM storetopics.route_text('honey')", ())):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conns["nobody"].execute(stmt, args)
    # ... a tenant (an attacher, its table's owner) may, and sees its own table's stores only
    assert {r["source_id"] for r in catalog(conns["a"])} == {sources["a"]}
    assert {r["source_id"] for r in route(conns["a"], vec(unit(1)), k=10)} == {sources["a"]}
    assert {r["source_id"] for r in route_text(conns["a"], "honey bees", k=10)} == {sources["a"]}
    # SET ROLE counts, not the login role
    admin.execute(f"SET ROLE {roles['router']}")
    try:
        assert {r["source_id"] for r in catalog(admin)} == {sources["b"]}
        assert {r["source_id"] for r in route(admin, vec(unit(0)), k=10)} == {sources["b"]}
    finally:
        admin.execute("RESET ROLE")


def test_the_routing_functions_are_hardened(conn):
    rows = conn.execute("""
        SELECT p.proname, p.prosecdef, p.provolatile, p.proconfig, obj_description(p.oid, 'pg_proc') IS NOT NULL
          FROM pg_proc p WHERE p.pronamespace = 'storetopics'::regnamespace
           AND p.proname IN ('catalog', 'route', 'route_text') ORDER BY 1""").fetchall()
    assert [r[0] for r in rows] == ["catalog", "route", "route_text"]
    for name, secdef, volatile, config, comment in rows:
        assert secdef and volatile == "s" and comment, name
        assert "search_path=pg_catalog, pg_temp" in config, (name, config)
