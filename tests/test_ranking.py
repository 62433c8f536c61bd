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


# A planted page: its title (the first chunk) and a body that says other rare words more often than the title's.
TITLE = "Gramophone records transferred to disc"
BODY = ("The turntable stylus reads the vinyl groove. " * 4
        + "Each gramophone side is played whole, then transferred to a disc.")


def planted_words(conn, chunks: list[tuple[int | None, str]], table: str = "chunks") -> list[str]:
    """The distinctive words render attributes to the planted file (file 0), its chunks written in the given order
    (id, text; id NULL: the table's own)."""
    for i, text in chunks:
        if i is None:
            conn.execute(f"INSERT INTO {table} (store_id, file_id, content) VALUES ('home', 0, %s)", (text,))
        else:
            conn.execute(f"INSERT INTO {table} (id, store_id, file_id, content) VALUES (%s, 'home', 0, %s)",
                         (i, text))
    backfill(conn)
    topics = conn.execute("SELECT topics FROM storetopics.stores WHERE store_key = 'home'").fetchone()[0]
    conn.execute(f"DELETE FROM {table} WHERE file_id = 0")
    backfill(conn)
    return [t["lexeme"] for t in topics["distinctive"] if t.get("file") == "0"]


def test_an_outlier_files_title_words_follow_its_best_word_by_the_chunks_written_order(conn):
    create_chunks(conn)
    load_ordinary_files(conn, 2_000)
    attach_chunks(conn)
    backfill(conn)
    # without a title (the body's first words lead): the file's three best words by count x IDF
    assert planted_words(conn, [(None, BODY)]) == ["groov", "read", "stylus"]
    # its first chunk by the integer primary key is the title, though the heap has the body first: after its best
    # word, the title's words among the file's ten best ("transfer" ties with "disc" and "gramophone", ranked by name)
    assert planted_words(conn, [(10**6 + 2, BODY), (10**6 + 1, TITLE)]) == ["groov", "disc", "gramophon"]
    # the title written first in the heap, but second by the key: not the lead
    assert planted_words(conn, [(10**6 + 2, TITLE), (10**6 + 1, BODY)]) == ["groov", "read", "stylus"]


def test_without_an_integer_key_the_first_chunk_is_the_first_in_the_table(conn):
    conn.execute("CREATE TABLE notes (id text PRIMARY KEY DEFAULT md5(random()::text), store_id text, file_id int, "
                 "content text)")
    conn.execute("INSERT INTO notes (store_id, file_id, content) SELECT 'home', f.g, string_agg(w, ' ') "
                 "FROM generate_series(1, 500) f(g), LATERAL (SELECT (%s::text[])[1 + (f.g * k) %% 30] AS w "
                 "FROM generate_series(1, 30) k) x GROUP BY f.g", (RENOVATION,))
    conn.execute("SELECT storetopics.attach('notes', store_key => 'store_id', file_key => 'file_id', "
                 "content => 'content')")
    backfill(conn)
    assert planted_words(conn, [(None, TITLE), (None, BODY)], "notes") == ["groov", "disc", "gramophon"]
    assert planted_words(conn, [(None, BODY), (None, TITLE)], "notes") == ["groov", "read", "stylus"]
