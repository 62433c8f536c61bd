"""A source attached after another was folded renders on statistics that have not seen it until the state is analyzed:
by autovacuum (a minute or more), or by storetopics._analyze_if_stale, which a worker role (grant_worker) may not
run, and which waits for a store of 1,000 files.  On those statistics the
planner estimates one row for each of the new source's stores and its catalog, and a join planned on them as a
nested loop reads one side whole once per row of the other: 58 s a store of 14k terms, 1.2 s an upload's render
(bench/README.md).  What a render reads must not depend on them.  Measured in buffers (a function scan's counts
include its statements'), a few per term looked up, where a nested loop over the store's terms reads ~50 per term."""
from __future__ import annotations

import random
import re

import pytest

from tests.helpers import attach_chunks, backfill, buffers, create_chunks, insert_chunks, tenants


@pytest.fixture
def second(dsn):
    """(the admin's connection, source id): tenant b's table, backfilled by a worker role (storetopics.grant_worker:
    it may not ANALYZE the state) on statistics taken when only tenant a's was folded: b's two big stores 's' and 'other' on words of their own, and
    'tiny', one file in 1,001 (under 0.1% of the catalog's files: probed)."""
    rng = random.Random(7)
    vocabulary = ["".join(chr(97 + rng.randrange(26)) for _ in range(6)) for _ in range(6000)]

    def rows(store: str, files: int, words: list[str], first: int = 1) -> list[tuple]:
        return [(store, f, " ".join(rng.choice(words) for _ in range(120))) for f in range(first, first + files)]

    def load(tenant: str, data: list[tuple]) -> None:
        with conns[tenant].cursor() as cur:
            cur.executemany(f"INSERT INTO {tenant}.docs (store, file, content) VALUES (%s, %s, %s)", data)
        conns["worker"].execute("SELECT * FROM storetopics.backfill()")

    def worker(admin, roles) -> None:
        admin.execute("SELECT storetopics.grant_worker(%s)", (roles["worker"],))

    with tenants(dsn, ("worker",), prepare=worker) as (_roles, conns, admin, sources):
        for table in ("store_terms", "catalog_terms", "file_terms", "lexemes"):   # (no autovacuum: they stay stale)
            admin.execute(f"ALTER TABLE storetopics.{table} SET (autovacuum_enabled = false)")
        load("a", rows("s", 200, vocabulary))
        admin.execute("ANALYZE")
        load("b", rows("s", 200, vocabulary[:4000]) + rows("other", 800, vocabulary[2000:], first=201)
             + [("tiny", 5000, " ".join(vocabulary[:400]))])
        assert admin.execute("SELECT count(*) FROM storetopics.catalog_terms WHERE catalog = storetopics._catalog(%s)",
                             (sources["b"],)).fetchone()[0] > 4000
        yield admin, sources["b"]


def join_filtered(conn, sql: str, params: tuple) -> int:
    """The most rows one join of the statement's plans, its functions' statements included, tested and dropped."""
    plans: list[str] = []

    def keep(d) -> None:
        if d.severity == "LOG":
            plans.append(d.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        with conn.transaction():
            conn.execute("LOAD 'auto_explain'")
            for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_nested_statements", "on"),
                                   ("auto_explain.log_analyze", "on"), ("auto_explain.log_timing", "off"),
                                   ("client_min_messages", "log")):
                conn.execute("SELECT set_config(%s, %s, true)", (setting, value))
            conn.execute(sql, params).fetchall()
    finally:
        conn.remove_notice_handler(keep)
    assert any("Query Text" in p for p in plans)
    return max([int(n) for p in plans for n in re.findall(r"Rows Removed by Join Filter: (\d+)", p)], default=0)


def store_terms(conn, source: int, store: str) -> int:
    return conn.execute("SELECT count(*) FROM storetopics.store_terms WHERE source_id = %s AND store_key = %s",
                        (source, store)).fetchone()[0]


@pytest.mark.parametrize("store, per_term", [("s", 5), ("other", 5), ("tiny", 12)])
def test_contrast_terms_read_the_catalog_once(second, store, per_term):
    """Hashed for a store with much of the catalog's files, probed once per term for one with few (the head's
    look-ups of lexemes count too): 'tiny' reads ~9 buffers a term, ~14 when each term's catalog row was probed
    once for each of the three reads of its share of the rest."""
    conn, source = second
    terms = store_terms(conn, source, store)
    assert terms >= 400
    sql = "SELECT * FROM storetopics._contrast_terms(%s, %s, 60)"
    read = buffers(conn, sql, (source, store))
    assert read <= per_term * terms, f"{read:,} buffers read for {terms:,} terms of the store"
    dropped = join_filtered(conn, sql, (source, store))
    assert dropped <= terms, f"{dropped:,} rows tested and dropped by a join for {terms:,} terms of the store"
    assert conn.execute("SHOW enable_nestloop").fetchone()[0] == "on"


def test_the_terms_an_upload_touched_are_read_from_the_kept_state(second):
    """What a render after an upload reads first, the counts now of the terms fold touched since the store's novelty
    was kept, is in novelty_state, in step with the touched terms (each listed once, with its counts now; files 0: the
    store holds it no more): no term is looked up in store_terms, whatever the statistics say."""
    conn, source = second
    words = conn.execute("SELECT string_agg(l.lexeme, ' ') FROM storetopics.store_terms t JOIN storetopics.lexemes l "
                         "ON l.id = t.term_id WHERE t.source_id = %s AND t.store_key = 's' AND t.files = 1",
                         (source,)).fetchone()[0].split()
    assert len(words) >= 10 and store_terms(conn, source, "s") > 3000
    # a new file with new words and some of the store's; then, folded apart, a file changed to hold one of its new
    # words, and a file deleted (some of its words with it)
    conn.execute("INSERT INTO b.docs (store, file, content) VALUES ('s', 9001, %s)",
                 (" ".join(["qqzzyx", "qqzzyw"] * 3 + words[:5]),))
    while conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]:
        pass
    conn.execute("UPDATE b.docs SET content = content || ' qqzzyx' WHERE store = 's' AND file = 8")
    conn.execute("DELETE FROM b.docs WHERE store = 's' AND file = 7")
    while conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]:
        pass
    listed = conn.execute(
        "SELECT x.* FROM storetopics.novelty_state k, unnest(k.touched, k.touched_files, k.touched_totals, "
        "k.touched_totals_sq) x WHERE k.source_id = %s AND k.store_key = 's'", (source,)).fetchall()
    now = {t: (f, n, q) for t, f, n, q in listed}
    assert len(now) == len(listed)
    rows = {t: (f, n, q) for t, f, n, q in conn.execute(
        "SELECT term_id, files, total, total_sq FROM storetopics.store_terms WHERE source_id = %s AND store_key = 's' "
        "AND term_id = ANY (%s)", (source, list(now)))}
    assert len(now) >= 100 and sum(f == 0 for f, _, _ in now.values()) >= 1
    assert {t: v for t, v in now.items() if v[0] > 0} == rows
    assert rows[conn.execute("SELECT id FROM storetopics.lexemes WHERE lexeme = 'qqzzyx'").fetchone()[0]][0] == 2
    top = conn.execute("SELECT max(id) FROM storetopics.lexemes").fetchone()[0]
    sql = ("SELECT (storetopics._novelty_moves(%s, 's', array_fill(0, ARRAY[%s]), 50, storetopics._novelty_bands(), "
           "k.touched, k.touched_files)).dfs FROM storetopics.novelty_state k WHERE k.source_id = %s "
           "AND k.store_key = 's'")
    params = (source, top, source)
    dfs = conn.execute(sql, params).fetchone()[0]
    assert {t: dfs[t - 1] for t in rows} == {t: v[0] for t, v in rows.items()} and sum(dfs) == sum(
        v[0] for v in rows.values())
    read = buffers(conn, sql, params)
    assert read <= 20, f"{read:,} buffers read for the {len(now):,} terms touched"


def test_a_store_new_to_the_statistics_is_analyzed_before_it_is_rendered(conn):
    """A store of 1,000 files or more whose rows the statistics put at under a tenth of its files: fold (for the
    source) and render (for the store) analyze the state first.  Here the statistics were taken with 1,200 other
    files in file_terms, so no rule on the table's size alone would see that 1,000 new ones are unknown."""
    for table in ("store_terms", "catalog_terms", "file_terms", "lexemes", "file_clusters"):
        conn.execute(f"ALTER TABLE storetopics.{table} SET (autovacuum_enabled = false)")
    for name in ("first", "second"):
        create_chunks(conn, name)
        attach_chunks(conn, name, embedding=False)
    words = "harbour crane cargo vessel berth quay tide anchor pilot tug".split()
    insert_chunks(conn, [("a", f, " ".join(words[(f + i) % 10] for i in range(12)), None) for f in range(1200)], "first")
    backfill(conn, "first")
    conn.execute("ANALYZE")
    source = conn.execute("SELECT id FROM storetopics.sources WHERE chunks = 'second'::regclass").fetchone()[0]

    def estimate(store: str) -> float:
        return conn.execute("EXPLAIN (FORMAT JSON) SELECT 1 FROM storetopics.file_terms WHERE source_id = %s "
                            "AND store_key = %s", (source, store)).fetchone()[0][0]["Plan"]["Plan Rows"]

    insert_chunks(conn, [("b", f, " ".join(words[(f + i) % 7] for i in range(12)), None) for f in range(1000)],
                  "second")
    conn.execute("SELECT storetopics._fold(%s, 200)", (source,))   # 200 of its 1,000 files: not yet
    assert estimate("b") < 100
    while conn.execute("SELECT storetopics._fold(%s, 200)", (source,)).fetchone()[0]:
        pass
    assert estimate("b") >= 100   # fold, once the source has 1,000 files
    # a new store of 1,500 files in a source the statistics know 1,000 files of: fold leaves it, render analyzes
    insert_chunks(conn, [("c", f, " ".join(words[(f + i) % 9] for i in range(12)), None)
                         for f in range(1000, 2500)], "second")
    while conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]:
        pass
    assert estimate("c") < 150
    conn.execute("SELECT storetopics._render(%s, 'c')", (source,))
    assert estimate("c") >= 150
