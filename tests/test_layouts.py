"""The three table layouts of the spec, each attached after its data exists (backfill picks it up) and before (the
triggers keep it current): exact counts, and summaries that name what the stores hold.  No plpython3u anywhere."""
from __future__ import annotations

import json
import uuid

import pytest

from tests import helpers

RECIPES = ["pasta with tomato sauce and garlic", "tomato soup with basil and garlic bread",
           "fresh pasta dough, knead and rest", "garlic butter for the pasta"]
CARS = ["engine oil change every year", "brake pads and brake discs wear out",
        "the engine needs a new timing belt", "tyre pressure and brake fluid"]
GARDEN = ["prune the roses in spring", "compost for the vegetable garden", "roses need sun and compost"]


def _docs(texts, n_files, prefix):
    """n_files documents of len(texts) chunks each: (file key, chunk number, text)."""
    return [(f"{prefix}-{f}.txt", i, f"{t} ({prefix} {f}.{i})") for f in range(n_files) for i, t in enumerate(texts)]


def _vec(seed: int, dim: int = 8) -> str:
    return "[" + ",".join(str((seed * 7 + k) % 11 / 10) for k in range(dim)) + "]"


def _no_plpython(conn):
    assert conn.execute("SELECT count(*) FROM pg_language WHERE lanname LIKE 'plpython%'").fetchone()[0] == 0


def _check(conn, src, expect_words: dict[str, list[str]]):
    rows = helpers.backfill(conn)
    assert rows is not None
    st = helpers.state(conn, src)
    assert st == helpers.recount(conn, src)
    assert helpers.pending(conn, src) == []
    for store, words in expect_words.items():
        text = helpers.summary(conn, src, store)[0]
        files, chunks = st["stores"][store][:2]
        assert helpers.sections(text)["files"] == str(files) and helpers.sections(text)["terms"], text
        for w in words:
            assert w in text, (store, w, text)
    return st


# --------------------------------------------------------------------------------------------------------------
# (a) LangChain: one table for every collection; store = collection_id, file = cmetadata->>'source'
# --------------------------------------------------------------------------------------------------------------
def _langchain_tables(conn):
    conn.execute("CREATE TABLE langchain_pg_collection (uuid uuid PRIMARY KEY, name varchar, cmetadata json)")
    conn.execute("""CREATE TABLE langchain_pg_embedding (
                      id varchar PRIMARY KEY,
                      collection_id uuid REFERENCES langchain_pg_collection (uuid) ON DELETE CASCADE,
                      embedding vector, document text, cmetadata jsonb)""")


def _langchain_add(conn, coll, docs):
    for source, i, text in docs:
        conn.execute("INSERT INTO langchain_pg_embedding (id, collection_id, embedding, document, cmetadata) "
                     "VALUES (%s, %s, %s, %s, %s)",
                     (str(uuid.uuid4()), coll, _vec(i), text, json.dumps({"source": source, "page": i})))


def _langchain_attach(conn):
    return conn.execute("""SELECT storetopics.attach('langchain_pg_embedding', store_key => 'collection_id',
                                                      file_key => $$c.cmetadata->>'source'$$, content => 'document',
                                                      embedding => 'embedding')""").fetchone()[0]


@pytest.mark.parametrize("when", ["after", "before"])
def test_langchain(conn, when):
    _no_plpython(conn)
    _langchain_tables(conn)
    recipes, cars = uuid.UUID(int=1), uuid.UUID(int=2)
    conn.execute("INSERT INTO langchain_pg_collection VALUES (%s, 'recipes', '{}'), (%s, 'cars', '{}')",
                 (recipes, cars))
    if when == "before":
        src = _langchain_attach(conn)
    _langchain_add(conn, recipes, _docs(RECIPES, 5, "recipe"))
    _langchain_add(conn, cars, _docs(CARS, 4, "car"))
    # chunks without a source are counted as skipped (no file key)
    conn.execute("INSERT INTO langchain_pg_embedding (id, collection_id, document, cmetadata) "
                 "VALUES ('orphan', %s, 'pasta without a source', '{}')", (recipes,))
    if when == "after":
        src = _langchain_attach(conn)
    st = _check(conn, src, {str(recipes): ["pasta", "garlic", "tomato"], str(cars): ["brake", "engine"]})
    assert st["stores"] == {str(recipes): (5, 20, st["stores"][str(recipes)][2], 0),
                            str(cars): (4, 16, st["stores"][str(cars)][2], 0)}
    assert st["terms"][(str(recipes), "pasta")] == (5, 15, 45)
    assert st["terms"][(str(cars), "brake")] == (4, 12, 36)
    assert st["null_key_rows"] == 1

    # the application keeps working: a document re-ingested, one deleted, one re-labelled to another source
    conn.execute("DELETE FROM langchain_pg_embedding WHERE cmetadata->>'source' = 'recipe-0.txt'")
    _langchain_add(conn, recipes, [("recipe-0.txt", 0, "pasta carbonara")])
    conn.execute("DELETE FROM langchain_pg_embedding WHERE cmetadata->>'source' = 'car-3.txt'")
    conn.execute("""UPDATE langchain_pg_embedding SET cmetadata = jsonb_set(cmetadata, '{source}', '"car-9.txt"')
                     WHERE cmetadata->>'source' = 'car-2.txt'""")
    st = _check(conn, src, {str(recipes): ["pasta", "garlic"], str(cars): ["brake", "engine"]})
    assert st["stores"][str(recipes)][:2] == (5, 17)
    assert st["stores"][str(cars)][:2] == (3, 12)
    assert st["terms"][(str(recipes), "pasta")] == (5, 13, 37)
    assert ("car-9.txt", str(cars)) in st["files"] and ("car-2.txt", str(cars)) not in st["files"]

    # deleting a collection cascades to its chunks
    conn.execute("DELETE FROM langchain_pg_collection WHERE uuid = %s", (cars,))
    st = _check(conn, src, {str(recipes): ["pasta"]})
    assert set(st["stores"]) == {str(recipes)}


# --------------------------------------------------------------------------------------------------------------
# (b) LlamaIndex: one table per store; store = a constant, file = metadata_->>'ref_doc_id'
# --------------------------------------------------------------------------------------------------------------
def _llama_add(conn, docs):
    for ref, i, text in docs:
        conn.execute("INSERT INTO data_docs (text, metadata_, node_id, embedding) VALUES (%s, %s, %s, %s)",
                     (text, json.dumps({"ref_doc_id": ref, "doc_id": ref}), str(uuid.uuid4()), _vec(i)))


def _llama_attach(conn):
    return conn.execute("""SELECT storetopics.attach('data_docs', store_key => $$'docs'$$,
                                                      file_key => $$c.metadata_->>'ref_doc_id'$$, content => 'text',
                                                      embedding => 'embedding')""").fetchone()[0]


@pytest.mark.parametrize("when", ["after", "before"])
def test_llamaindex(conn, when):
    _no_plpython(conn)
    conn.execute("CREATE TABLE data_docs (id bigserial PRIMARY KEY, text varchar NOT NULL, metadata_ jsonb, "
                 "node_id varchar, embedding vector(8))")
    if when == "before":
        src = _llama_attach(conn)
    _llama_add(conn, _docs(GARDEN, 6, "g"))
    _llama_add(conn, _docs(CARS, 2, "c"))
    if when == "after":
        src = _llama_attach(conn)
    st = _check(conn, src, {"docs": ["roses", "compost"]})
    assert set(st["stores"]) == {"docs"}
    assert st["stores"]["docs"][:2] == (8, 26)
    assert st["terms"][("docs", "rose")] == (6, 12, 24)

    conn.execute("UPDATE data_docs SET text = 'roses roses roses' WHERE metadata_->>'ref_doc_id' = 'g-0.txt'")
    conn.execute("DELETE FROM data_docs WHERE metadata_->>'ref_doc_id' LIKE 'c-%'")
    st = _check(conn, src, {"docs": ["roses", "compost"]})
    assert st["stores"]["docs"][:2] == (6, 18)
    assert st["terms"][("docs", "rose")] == (6, 19, 5 * 4 + 81)
    assert ("docs", "brake") not in st["terms"]


# --------------------------------------------------------------------------------------------------------------
# (c) hand-rolled: files(id, store_id, name) + chunks(file_id -> files ON DELETE CASCADE); the store key is a
#     subquery through files
# --------------------------------------------------------------------------------------------------------------
STORE_OF_FILE = "(SELECT f.store_id FROM public.files f WHERE f.id = c.file_id)"


def _hand_attach(conn):
    return conn.execute("SELECT storetopics.attach('chunks', store_key => %s, file_key => 'file_id', "
                        "content => 'content', embedding => 'embedding')", (STORE_OF_FILE,)).fetchone()[0]


def _hand_add(conn, store, first_id, texts, n_files):
    for f in range(n_files):
        fid = first_id + f
        conn.execute("INSERT INTO files (id, store_id, name) VALUES (%s, %s, %s)", (fid, store, f"doc{fid}.pdf"))
        conn.execute("INSERT INTO chunks (file_id, content, embedding) SELECT %s, t, %s FROM unnest(%s::text[]) t",
                     (fid, _vec(fid), texts))


@pytest.mark.parametrize("when", ["after", "before"])
def test_hand_rolled_with_cascade(conn, when):
    _no_plpython(conn)
    conn.execute("CREATE TABLE files (id int PRIMARY KEY, store_id text NOT NULL, name text)")
    conn.execute("CREATE TABLE chunks (id serial PRIMARY KEY, file_id int NOT NULL REFERENCES files ON DELETE CASCADE, "
                 "content text, embedding vector(8))")
    if when == "before":
        src = _hand_attach(conn)
    _hand_add(conn, "kitchen", 1, RECIPES, 3)
    _hand_add(conn, "garage", 10, CARS, 3)
    _hand_add(conn, "garage", 20, ["brake brake brake pads"], 1)
    if when == "after":
        src = _hand_attach(conn)
    st = _check(conn, src, {"kitchen": ["pasta", "garlic"], "garage": ["brake", "engine"]})
    assert st["stores"]["kitchen"][:2] == (3, 12)
    assert st["stores"]["garage"][:2] == (4, 13)
    assert st["terms"][("garage", "brake")] == (4, 12, 3 * 9 + 9)
    assert st["terms"][("garage", "pad")] == (4, 4, 4)
    before = st

    # Deleting a files row deletes its chunks by cascade; the counts drop by exactly that file.
    conn.execute("DELETE FROM files WHERE id = 20")
    assert conn.execute("SELECT count(*) FROM chunks WHERE file_id = 20").fetchone()[0] == 0
    assert conn.execute("SELECT dirty FROM storetopics.stores WHERE source_id = %s AND store_key = 'garage'",
                        (src,)).fetchone()[0] is True
    st = _check(conn, src, {"kitchen": ["pasta"], "garage": ["brake", "engine"]})
    g0, g1 = before["stores"]["garage"], st["stores"]["garage"]
    assert g1 == (g0[0] - 1, g0[1] - 1, g0[2] - 4, 0)
    assert st["terms"][("garage", "brake")] == (3, 9, 27)
    assert st["terms"][("garage", "pad")] == (3, 3, 3)
    assert st["stores"]["kitchen"] == before["stores"]["kitchen"]
    assert {k: v for k, v in st["terms"].items() if k[0] == "kitchen"} == \
        {k: v for k, v in before["terms"].items() if k[0] == "kitchen"}

    # A whole store's files deleted: the store disappears.
    conn.execute("DELETE FROM files WHERE store_id = 'kitchen'")
    st = _check(conn, src, {"garage": ["brake"]})
    assert set(st["stores"]) == {"garage"}
    assert [k for k in st["terms"] if k[0] == "kitchen"] == []

    # Chunks added to an existing file and deleted directly.
    conn.execute("INSERT INTO chunks (file_id, content) VALUES (10, 'engine engine')")
    conn.execute("DELETE FROM chunks WHERE file_id = 11")
    st = _check(conn, src, {"garage": ["engine"]})
    assert st["stores"]["garage"][:2] == (2, 9)
