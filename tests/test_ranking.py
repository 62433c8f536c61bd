"""The two keyword lists at scale: a dense rare file surfaces among 100k ordinary files, and one-off tokens such as
people's names do not flood the distinctive list."""
from __future__ import annotations

from tests.helpers import attach_chunks, backfill, create_chunks

RENOVATION = ("kitchen renovation bathroom tiles cabinets plumbing flooring paint contractor budget wall ceiling "
              "window door insulation roof garden patio lighting electrician permit estimate quote carpenter "
              "drywall countertop sink shower bathtub heating boiler").split()

FOOTBALL = ("The football club won the league match on Saturday. The striker scored a goal in the first half and "
            "the goalkeeper saved a penalty. Football fans of the club celebrated the league title in the stadium. "
            "The coach praised the midfielder and the defender; the club will play the next league match away. ")


def load_ordinary_files(conn, n_files: int, store: str = "home") -> None:
    """n_files small files of renovation vocabulary; each also names one person (a one-off token, said twice)."""
    conn.execute("""
        INSERT INTO chunks (store_id, file_id, content)
        SELECT %(store)s, g,
               (SELECT string_agg(v.w[1 + abs(hashint4(g * 31 + k)) %% cardinality(v.w)], ' ')
                  FROM generate_series(1, 30) k)
               || ' signed by ' || nm || ', call ' || nm || ' for the quote'
          FROM generate_series(1, %(n)s) g,
               (SELECT %(words)s::text[] AS w) v,
               LATERAL (SELECT translate(substr(md5(g::text), 1, 8), '0123456789', 'ghijklmnop') AS nm) n""",
                 {"store": store, "n": n_files, "words": RENOVATION})


def distinctive(conn, store: str = "home") -> list[str]:
    topics = conn.execute("SELECT topics FROM storetopics.stores WHERE store_key = %s", (store,)).fetchone()[0]
    return [t["term"] for t in topics["distinctive"]]


def dominant(conn, store: str = "home") -> list[str]:
    topics = conn.execute("SELECT topics FROM storetopics.stores WHERE store_key = %s", (store,)).fetchone()[0]
    return [t["term"] for t in topics["dominant"]]


def test_one_dense_file_surfaces_among_100k_files_and_names_do_not_flood(conn):
    create_chunks(conn)
    load_ordinary_files(conn, 100_000)
    attach_chunks(conn)
    backfill(conn)
    before_text = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
    # 100k distinct names, each said twice in its own file: none is distinctive of the store.
    names = {r[0] for r in conn.execute("SELECT DISTINCT translate(substr(md5(g::text), 1, 8), '0123456789', "
                                        "'ghijklmnop') FROM generate_series(1, 100000) g")}
    assert not set(distinctive(conn)) & names, distinctive(conn)

    conn.execute("INSERT INTO chunks (store_id, file_id, content) VALUES ('home', 0, %s)", (FOOTBALL * 3,))
    backfill(conn)
    dist = distinctive(conn)
    assert {"football", "league", "club"} <= set(dist), dist
    assert not set(dist) & names, dist
    text = conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0]
    assert "football" in text.split("Distinctive:")[1]
    # Ranked on store-wide sums the file is buried: the dominant list has none of its words.
    assert not {"football", "league", "club"} & set(dominant(conn))
    total_football, total_kitchen = conn.execute("""
        SELECT max(t.total) FILTER (WHERE x.lexeme = 'footbal'), max(t.total) FILTER (WHERE x.lexeme = 'kitchen')
          FROM storetopics.store_terms t JOIN storetopics.lexemes x ON x.id = t.term_id""").fetchone()
    assert total_football * 1000 < total_kitchen

    conn.execute("DELETE FROM chunks WHERE file_id = 0")
    backfill(conn)
    assert conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0] == before_text


def test_a_store_of_one_off_tokens_has_no_distinctive_flood(conn):
    create_chunks(conn)
    # Every file: a few common words and three names nobody else mentions.
    conn.execute("""
        INSERT INTO chunks (store_id, file_id, content)
        SELECT 'people', g, 'meeting notes with ' || string_agg(translate(substr(md5((g * 7 + k)::text), 1, 9),
                                                            '0123456789', 'ghijklmnop'), ' and ')
          FROM generate_series(1, 5000) g, generate_series(1, 3) k GROUP BY g""")
    attach_chunks(conn)
    backfill(conn)
    assert distinctive(conn, "people") == []
    assert set(dominant(conn, "people")) >= {"meeting", "notes"}
