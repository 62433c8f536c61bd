"""Issue 33: render's term lists rank a store's terms by score alone in a bounded sort and name and test only the
head (storetopics._keywords, storetopics._contrast_terms).  Whatever the store, the lists must be the ones the whole
ranking gives: here, the queries those functions ran before, over every term.  The store is made so that the first
bounded sort cannot finish the lists (its best terms by count, density and contrast are tokens with digits, which
no list shows, and they tie), so the sort must grow, and ties straddle its cut."""
from __future__ import annotations

import random

import psycopg
import pytest

from tests.helpers import attach_chunks, backfill, create_chunks, insert_chunks

# The whole ranking, as _keywords ran it before: every term of the store with its text, sorted, then tested.
KEYWORDS = """
    WITH st AS MATERIALIZED (   -- (once: inlined, the script would be found again for every term)
        SELECT greatest(s.files, 1)::float8 AS n, s.words AS words, storetopics._store_script(%(source)s, %(store)s) AS script
          FROM storetopics.store_state s
         WHERE s.source_id = %(source)s AND s.store_key = %(store)s
      ), terms AS (
        SELECT t.term_id, x.lexeme AS term, t.files, t.total, t.total_sq, ln(st.n / t.files) AS idf, st.n, st.words,
               st.script
          FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id, st
         WHERE t.source_id = %(source)s AND t.store_key = %(store)s
      ), dominant AS (
        SELECT 'dominant'::text AS kind, t.term, t.total::float8 AS score, t.files, t.total, NULL::text AS file_key
          -- ranked first, then the test, until n pass (OFFSET 0 keeps the test above the sort, off most terms)
          FROM (SELECT * FROM terms ORDER BY total DESC, term OFFSET 0) t
         WHERE storetopics._showable_term(t.term)
           AND storetopics._noise(t.term, t.files, t.total, t.total_sq, t.n::bigint, t.words, t.script) IS NULL
         ORDER BY t.total DESC, t.term LIMIT %(n_dominant)s
      ), outliers AS (
        -- (storetopics._outlier_files: the files, best first, and their novelty; their leads' first 20 words)
        SELECT o.file_key, o.nov,
               (SELECT array_agg(l.lexeme) FROM (SELECT w FROM regexp_split_to_table(btrim(o.lead), '[[:space:]]+')
                                                 WITH ORDINALITY AS x(w, i) WHERE i <= 20) y,
                       unnest(to_tsvector('english', y.w)) AS l) AS lead
          FROM unnest(%(files)s::text[], %(novelty)s::float8[], %(leads)s::text[]) AS o(file_key, nov, lead)
      ), outlier_terms AS (
        -- the top 3 terms of each outlier file, its best then its lead's words among its 10 best, even when they also
        -- rank as dominant (in a small store a needle's words do: they are still what the file is about); a term two
        -- outlier files share is kept once, with its best file
        SELECT DISTINCT ON (x.term) x.term, x.score, x.files, x.total, x.file_key, x.nov FROM (
          SELECT w.*, row_number() OVER (PARTITION BY w.file_key
                                         ORDER BY w.r = 1 DESC,
                                                  w.r <= 10 AND w.term = ANY (coalesce(w.lead, '{}')) DESC, w.r) AS pick
            FROM (
          SELECT w.term, w.n * w.idf AS score, w.files, w.total, w.file_key, w.nov, w.lead,
                 row_number() OVER (PARTITION BY w.file_key ORDER BY w.n * w.idf DESC, w.term) AS r
            -- only the outlier files' words, then the test (OFFSET 0 keeps it above the joins: pushed down into the
            -- scan of terms, it ran on every term of the store)
            FROM (SELECT u.file_key, o.nov, o.lead, t.term, u.n, t.idf, t.files, t.total, t.total_sq,
                         t.n AS store_files, t.words AS store_words, t.script
                    FROM (SELECT f.file_key, unnest(f.term_ids) AS term_id, unnest(f.counts) AS n
                            FROM storetopics.file_terms f
                           WHERE f.source_id = %(source)s AND f.store_key = %(store)s
                             AND f.file_key IN (SELECT o.file_key FROM outliers o)) u
                    JOIN outliers o ON o.file_key = u.file_key
                    JOIN terms t ON t.term_id = u.term_id
                  OFFSET 0) w
           WHERE storetopics._showable_term(w.term) AND w.idf > 0
             AND storetopics._noise(w.term, w.files, w.total, w.total_sq, w.store_files::bigint, w.store_words,
                                    w.script) IS NULL) w) x
         WHERE x.pick <= 3
         ORDER BY x.term, x.nov DESC, x.score DESC, x.file_key
      ), dense AS (
        -- no more than the list takes, ranked first, then the tests (OFFSET 0, as in dominant)
        SELECT t.term, t.score, t.files, t.total
          FROM (SELECT t.term, (t.total_sq::float8 / t.total) * t.idf AS score, t.files, t.total, t.total_sq, t.n,
                       t.words, t.script FROM terms t
                 WHERE t.files >= 3 AND t.total_sq >= 2 * t.total AND t.idf > 0
                 ORDER BY 2 DESC, 1 OFFSET 0) t
         WHERE storetopics._showable_term(t.term)
           AND storetopics._noise(t.term, t.files, t.total, t.total_sq, t.n::bigint, t.words, t.script) IS NULL
           AND t.term NOT IN (SELECT d.term FROM dominant d)
           AND t.term NOT IN (SELECT o.term FROM outlier_terms o)
         ORDER BY t.score DESC, t.term LIMIT %(n_distinctive)s
      ), distinctive AS (
        SELECT 'distinctive'::text AS kind, x.term, x.score, x.files, x.total, x.file_key
          FROM (SELECT o.term, o.score, o.files, o.total, o.file_key, 0 AS pass, -o.nov AS k1, -o.score AS k2
                  FROM outlier_terms o
                UNION ALL
                SELECT d.term, d.score, d.files, d.total, NULL, 1, 0, -d.score FROM dense d) x
         ORDER BY x.pass, x.k1, x.k2, x.term LIMIT %(n_distinctive)s
      )
      SELECT d.kind, (row_number() OVER (ORDER BY d.score DESC, d.term))::int, d.term, d.score, d.files, d.total,
             d.file_key FROM dominant d
      UNION ALL
      SELECT x.kind, (row_number() OVER ())::int, x.term, x.score, x.files, x.total, x.file_key FROM distinctive x
"""

# The whole ranking, as _contrast_terms ran it before.
CONTRAST = """
    WITH cat AS MATERIALIZED (
        SELECT storetopics._catalog(%(source)s) AS name, storetopics._store_script(%(source)s, %(store)s) AS script
      ), own AS (
        SELECT greatest(st.files, 1)::float8 AS files, st.words FROM storetopics.store_state st
         WHERE st.source_id = %(source)s AND st.store_key = %(store)s
      ), whole AS (
        -- the catalog's size from its sources' counters (kept by fold), not from every store's row
        SELECT coalesce(sum(s.store_count), 0) AS stores, coalesce(sum(s.file_count), 0)::float8 AS files
          FROM storetopics.sources s, cat WHERE storetopics._catalog(s.id) = cat.name
      ), scored AS (
        SELECT x.lexeme, t.files, t.files / own.files AS p,
               (coalesce(c.files, t.files) - t.files + 0.5) / (whole.files - own.files + 0.5) AS q, whole.stores,
               t.total, t.total_sq, own.files AS store_files, own.words AS store_words, cat.script
          FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id
          CROSS JOIN own CROSS JOIN whole CROSS JOIN cat
          LEFT JOIN storetopics.catalog_terms c ON c.catalog = cat.name AND c.term_id = t.term_id
         WHERE t.source_id = %(source)s AND t.store_key = %(store)s AND (t.files >= 2 OR own.files < 20)
      ), ranked AS (
        SELECT s.lexeme, round((CASE WHEN s.stores < 2 THEN s.p ELSE s.p * ln(s.p / s.q) END)::numeric, 9)::float8
                 AS score, s.files, s.p, s.q, s.total, s.total_sq, s.store_files, s.store_words, s.script
          FROM scored s
         WHERE s.stores < 2 OR s.p > s.q
         ORDER BY 2 DESC, 1
        OFFSET 0
      )
      -- ranked first, then tested in that order until n pass (OFFSET 0 keeps the test above the sort): showable_term
      -- is a call per term, and a store has tens of thousands of terms
      SELECT r.lexeme, r.score, r.files, r.p, r.q FROM ranked r
       WHERE storetopics._showable_term(r.lexeme)
         AND storetopics._noise(r.lexeme, r.files, r.total, r.total_sq, r.store_files::bigint, r.store_words,
                                r.script) IS NULL
       ORDER BY r.score DESC, r.lexeme
       LIMIT %(n)s
"""

OTHER = "violin cello viola bow rosin bridge fingerboard scroll chinrest tailpiece".split()
TIED = [f"bxq{a}{b}" for a in "abc" for b in "abcdefghij"]   # 30 words that tie on every score


def rows() -> list[tuple]:
    """Store a: 40 tokens with digits, 20 times in every other file and one more (first by count and by density,
    second by contrast), 30 more once in every file (first by contrast), and 30 words in each of the other files,
    twice or six times (a count that varies: not boilerplate); store b: other words."""
    out = []
    for f in range(40):
        text = [f"zq{i}x" for i in range(40) for _ in range(20)] if f % 2 == 0 or f == 1 else []
        text += [w for w in TIED for _ in range(2 if f % 4 == 1 else 6)] if f % 2 == 1 else []
        text += [f"yq{i}x" for i in range(30)]
        out.append(("a", f, " ".join(text), None))
    rng = random.Random(7)
    for f in range(40, 60):
        out.append(("b", f, " ".join(rng.choice(OTHER) for _ in range(80)), None))
    return out


@pytest.fixture(params=["ids along the lists", "ids against the lists"])
def store(make_db, request):
    with psycopg.connect(make_db(), autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        create_chunks(conn)
        source = attach_chunks(conn, embedding=False)
        # the tied words first seen in their order, or in its reverse (one file of store b each, folded one by one):
        # their ids, and so the order a bounded sort meets them in, run along or against the order of the lists
        for k, word in enumerate(TIED if request.param == "ids along the lists" else reversed(TIED)):
            insert_chunks(conn, [("b", 100 + k, f"{word} violin cello", None)])
            backfill(conn)
        insert_chunks(conn, rows())
        backfill(conn)
        yield conn, source


def test_term_lists_are_the_whole_rankings_heads(store):
    conn, source = store
    # the store is as described: the 40 best terms by count are tokens with digits, the next 30 words tie
    totals = [r[0] for r in conn.execute(
        "SELECT t.total FROM storetopics.store_terms t WHERE t.source_id = %s AND t.store_key = 'a' "
        "ORDER BY t.total DESC", (source,))]
    assert totals == [420] * 40 + [80] * 30 + [40] * 30
    files = [r[0] for r in conn.execute("SELECT file_key FROM storetopics.file_terms WHERE source_id = %s "
                                        "AND store_key = 'a' ORDER BY file_key LIMIT 2", (source,))]
    checked = 0
    for store_key in ("a", "b"):
        # leads: of the first file, none; of the second, two words its counts tie at (ranked by name: the 5th and
        # the 9th of its ten best, bxqae and bxqai), one ranked past its tenth (bxqba), one past the lead's 20th word
        # (bxqaf)
        leads = [None, "bxqba bxqae bxqai " + "filler " * 17 + "bxqaf and more"]
        for outliers, novelty, lead in ((None, None, None), ([], [], []), (files, [3.5, 2.0], None),
                                        (files, [3.5, 2.0], leads)):
            for n_dominant, n_distinctive in ((10, 8), (1, 1), (5, 5), (40, 30), (0, 0)):
                args = dict(source=source, store=store_key, files=outliers, novelty=novelty, leads=lead,
                            n_dominant=n_dominant, n_distinctive=n_distinctive)
                got = conn.execute("SELECT * FROM storetopics._keywords(%(source)s, %(store)s, %(files)s, "
                                   "%(novelty)s, %(n_dominant)s, %(n_distinctive)s, outlier_leads => %(leads)s)",
                                   args).fetchall()
                assert got == conn.execute(KEYWORDS, args).fetchall(), args
                checked += len(got)
                # the outlier files' terms ranked from the store's document frequencies by term id (as render gives
                # them, from _outlier_files), all of them or every other one (the rest looked up)
                for every in (1, 2):
                    assert conn.execute(
                        "SELECT * FROM storetopics._keywords(%(source)s, %(store)s, %(files)s, %(novelty)s, "
                        "%(n_dominant)s, %(n_distinctive)s, outlier_leads => %(leads)s, outlier_dfs => ("
                        "SELECT array_agg(CASE WHEN i %% %(every)s = 0 THEN d ELSE 0 END ORDER BY i) "
                        "FROM unnest(storetopics._store_dfs(%(source)s, %(store)s)) WITH ORDINALITY AS u(d, i)))",
                        dict(args, every=every)).fetchall() == got, (args, every)
        # its best word, then the lead's words among the second file's ten best (store a: its words tie, ranked by name)
        args = dict(source=source, files=files, novelty=[3.5, 2.0])
        picked = {lead and "lead": [r[0] for r in conn.execute(
            "SELECT lexeme FROM storetopics._keywords(%(source)s, 'a', %(files)s, %(novelty)s, 10, 30, "
            "outlier_leads => %(leads)s) WHERE kind = 'distinctive' AND file_key = %(file)s ORDER BY rank",
            dict(args, leads=lead, file=files[1]))] for lead in (None, leads)}
        if store_key == "a":
            assert picked == {None: ["bxqaa", "bxqab", "bxqac"], "lead": ["bxqaa", "bxqae", "bxqai"]}, picked
        for n in (1, 5, 10, 20, 80, 1000):
            args = dict(source=source, store=store_key, n=n)
            got = conn.execute("SELECT * FROM storetopics._contrast_terms(%(source)s, %(store)s, %(n)s)",
                               args).fetchall()
            assert got == conn.execute(CONTRAST, args).fetchall(), args
            checked += len(got)
    assert checked > 100
    # and what render shows of them
    kinds = conn.execute("SELECT count(*) FILTER (WHERE kind = 'dominant'), count(*) FILTER (WHERE kind = 'distinctive') "
                         "FROM storetopics._keywords(%s, 'a', NULL, NULL)", (source,)).fetchone()
    assert kinds == (10, 8)

