"""The schemas real libraries create, with rows written and deleted by those libraries through their public APIs:

* LangChain `langchain-postgres` PGVector (langchain_pg_collection + langchain_pg_embedding; store = collection,
  file = cmetadata->>'source') and PGVectorStore (one table per store, a custom `source` column);
* LlamaIndex `llama-index-vector-stores-postgres` PGVectorStore (data_<name> per store, file = ref_doc_id).

Each is attached after its data exists (backfill picks it up) and before (the triggers keep it current).  Additions
made through the library show in the summary; deleting them through the library restores the earlier summary and
keyword state exactly.  Embeddings come from the libraries' own deterministic fake embedders.
The hand-rolled and keyword-only layouts are in test_recipes.py."""
from __future__ import annotations

import uuid

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_postgres import Column, PGEngine, PGVector, PGVectorStore
from llama_index.core import Document as LlamaDocument
from llama_index.core import VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.vector_stores.postgres import PGVectorStore as LlamaPGVectorStore
from psycopg import conninfo
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from tests import helpers

DIM = 8
# file -> its chunks
KITCHEN = {"pasta.txt": ["pasta with tomato sauce and garlic", "fresh pasta dough, knead and rest the pasta"],
           "soup.txt": ["tomato soup with basil and garlic bread", "garlic butter for the soup"],
           "bread.txt": ["bread dough rises overnight", "bake the bread with garlic and rosemary"]}
GARAGE = {"brakes.txt": ["brake pads and brake discs wear out", "brake fluid every two years"],
          "engine.txt": ["engine oil change every year", "the engine needs a new timing belt"],
          "tyres.txt": ["tyre pressure and tyre tread", "winter tyres for the engine of the van"]}
# what is added through the library and deleted again
STARS = {"telescope.txt": ["the telescope observes distant galaxies", "galaxies and nebulae through the telescope"],
         "orbit.txt": ["rockets launch satellites into orbit", "the telescope in orbit sees galaxies"]}


def sa_url(dsn: str, driver: str) -> str:
    """A SQLAlchemy URL for the test database over its unix socket (psycopg, psycopg2 or asyncpg)."""
    p = conninfo.conninfo_to_dict(dsn)
    return f"postgresql+{driver}://{p.get('user', 'postgres')}@/{p['dbname']}?host={p['host']}&port={p['port']}"


def lc_docs(files: dict[str, list[str]]) -> list[Document]:
    return [Document(page_content=t, metadata={"source": f, "part": i})
            for f, texts in files.items() for i, t in enumerate(texts)]


def n_chunks(files: dict) -> int:
    return sum(len(t) for t in files.values())


def check(conn, src: int, words: dict[str, list[str]]) -> dict:
    """Backfill; the state is exactly a recount from scratch, nothing is pending, each store's summary names its
    words.  Returns the summaries."""
    helpers.backfill(conn)
    st = helpers.state(conn, src)
    assert st == helpers.recount(conn, src)
    assert helpers.pending(conn, src) == []
    out = helpers.summaries(conn, src)
    for store, ws in words.items():
        files, chunks = st["stores"][store][:2]
        text = out[store][0]
        assert helpers.sections(text)["files"] == str(files) and helpers.sections(text)["terms"], text
        for w in ws:
            assert w in text, (store, w, text)
    return out


def add_and_delete_restores(conn, src: int, store: str, add, delete, base: dict, other: str | None = None) -> None:
    """add() STARS through the library into `store`, check the summary shows them, delete() them through the
    library, and check the summary and the keyword state are exactly as before."""
    before_state = helpers.state(conn, src)
    add()
    during = check(conn, src, {store: ["telescope", "galaxies"]})
    files, chunks = base[store][1]["files"], base[store][1]["chunks"]
    assert during[store][1]["files"] == files + len(STARS)
    assert during[store][1]["chunks"] == chunks + n_chunks(STARS)
    if other is not None:
        assert during[other] == base[other]
    delete()
    after = check(conn, src, {})
    assert "telescope" not in after[store][0]
    helpers.assert_restored(conn, src, base, before_state)


# --------------------------------------------------------------------------------------------------------------
# LangChain PGVector: langchain_pg_embedding for every collection.  store = the collection's name (looked up),
# file = cmetadata->>'source'.
# --------------------------------------------------------------------------------------------------------------
LC_STORE = "(SELECT x.name FROM public.langchain_pg_collection x WHERE x.uuid = c.collection_id)"


def lc_attach(conn) -> int:
    return conn.execute("SELECT storetopics.attach('langchain_pg_embedding', store_key => %s, "
                        "file_key => $$c.cmetadata->>'source'$$, content => 'document', embedding => 'embedding')",
                        (LC_STORE,)).fetchone()[0]


@pytest.mark.parametrize("when", ["after", "before"])
def test_langchain_pgvector(dsn, conn, when):
    engine = create_engine(sa_url(dsn, "psycopg"), poolclass=NullPool)
    emb = DeterministicFakeEmbedding(size=DIM)
    try:
        kitchen = PGVector(embeddings=emb, collection_name="kitchen", connection=engine)
        garage = PGVector(embeddings=emb, collection_name="garage", connection=engine)
        if when == "before":
            src = lc_attach(conn)
        kitchen.add_documents(lc_docs(KITCHEN), ids=[f"k{i}" for i in range(n_chunks(KITCHEN))])
        garage.add_documents(lc_docs(GARAGE), ids=[f"g{i}" for i in range(n_chunks(GARAGE))])
        if when == "after":
            src = lc_attach(conn)
        base = check(conn, src, {"kitchen": ["pasta", "garlic"], "garage": ["brake", "engine", "tyre"]})
        st = helpers.state(conn, src)
        assert st["stores"]["kitchen"][:2] == (3, 6) and st["stores"]["garage"][:2] == (3, 6)
        assert st["terms"][("kitchen", "garlic")] == (3, 4, 1 + 2 * 2 + 1)  # files, total, sum of squared per-file counts

        ids = [f"s{i}" for i in range(n_chunks(STARS))]
        add_and_delete_restores(conn, src, "kitchen", lambda: kitchen.add_documents(lc_docs(STARS), ids=ids),
                                lambda: kitchen.delete(ids=ids), base, other="garage")

        # Re-adding a document under an existing id is an upsert (INSERT ... ON CONFLICT DO UPDATE).
        kitchen.add_documents([Document(page_content="pasta pasta pasta", metadata={"source": "pasta.txt"})],
                              ids=["k0"])
        st = helpers.state(conn, src)
        check(conn, src, {"kitchen": ["pasta"]})
        assert helpers.state(conn, src)["terms"][("kitchen", "pasta")] != st["terms"][("kitchen", "pasta")]

        # Deleting a collection cascades to its chunks: the store goes.
        garage.delete_collection()
        check(conn, src, {"kitchen": ["pasta"]})
        assert set(helpers.summaries(conn, src)) == {"kitchen"}
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------------------------
# LangChain PGVectorStore (v2): a table per store, with `source` as a metadata column of its own.
# --------------------------------------------------------------------------------------------------------------
def lc2_attach(conn, table: str, store: str) -> int:
    return conn.execute("SELECT storetopics.attach(%s, store_key => %s, file_key => 'source', content => 'content', "
                        "embedding => 'embedding')", (table, f"'{store}'")).fetchone()[0]


@pytest.mark.parametrize("when", ["after", "before"])
def test_langchain_pgvectorstore(dsn, conn, when):
    # NullPool: no connection outlives its use, nothing to close afterwards
    engine = PGEngine.from_connection_string(sa_url(dsn, "psycopg"), poolclass=NullPool)
    emb = DeterministicFakeEmbedding(size=DIM)
    for table in ("kitchen_docs", "garage_docs"):
        engine.init_vectorstore_table(table_name=table, vector_size=DIM,
                                      metadata_columns=[Column("source", "TEXT")])
    kitchen = PGVectorStore.create_sync(engine=engine, table_name="kitchen_docs", embedding_service=emb,
                                        metadata_columns=["source"])
    garage = PGVectorStore.create_sync(engine=engine, table_name="garage_docs", embedding_service=emb,
                                       metadata_columns=["source"])
    if when == "before":
        src_k, src_g = lc2_attach(conn, "kitchen_docs", "kitchen"), lc2_attach(conn, "garage_docs", "garage")
    kitchen.add_documents(lc_docs(KITCHEN))
    garage.add_documents(lc_docs(GARAGE))
    if when == "after":
        src_k, src_g = lc2_attach(conn, "kitchen_docs", "kitchen"), lc2_attach(conn, "garage_docs", "garage")
    base = check(conn, src_k, {"kitchen": ["pasta", "garlic"]})
    base_g = check(conn, src_g, {"garage": ["brake", "engine"]})
    assert helpers.state(conn, src_k)["stores"]["kitchen"][:2] == (3, 6)

    ids = [str(uuid.uuid4()) for _ in range(n_chunks(STARS))]
    add_and_delete_restores(conn, src_k, "kitchen", lambda: kitchen.add_documents(lc_docs(STARS), ids=ids),
                            lambda: kitchen.delete(ids=ids), base)
    assert helpers.summaries(conn, src_g) == base_g


# --------------------------------------------------------------------------------------------------------------
# LlamaIndex PGVectorStore: data_<name> per store; file = metadata_->>'ref_doc_id' (the library indexes it).
# --------------------------------------------------------------------------------------------------------------
def llama_store(dsn: str, name: str) -> LlamaPGVectorStore:
    # NullPool: no connection outlives its use, nothing to close afterwards
    return LlamaPGVectorStore.from_params(connection_string=sa_url(dsn, "psycopg2"),
                                          async_connection_string=sa_url(dsn, "asyncpg"), table_name=name,
                                          embed_dim=DIM, create_engine_kwargs={"poolclass": NullPool})


def llama_nodes(files: dict[str, list[str]], embed: MockEmbedding) -> list[TextNode]:
    """Several chunks per document, each pointing at its document (ref_doc_id), as a node parser makes them."""
    return [TextNode(text=t, embedding=embed.get_text_embedding(t),
                     relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f)})
            for f, texts in files.items() for t in texts]


def llama_attach(conn, name: str) -> int:
    return conn.execute("SELECT storetopics.attach(%s, store_key => %s, file_key => $$c.metadata_->>'ref_doc_id'$$, "
                        "content => 'text', embedding => 'embedding')",
                        (f"data_{name}", f"'{name}'")).fetchone()[0]


@pytest.mark.parametrize("when", ["after", "before"])
def test_llamaindex_pgvectorstore(dsn, conn, when):
    embed = MockEmbedding(embed_dim=DIM)
    store = llama_store(dsn, "kitchen")
    if when == "before":
        store.clear()  # the library creates its table on first use
        src = llama_attach(conn, "kitchen")
    store.add(llama_nodes({k: v for k, v in KITCHEN.items() if k != "bread.txt"}, embed))
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed)
    index.insert(LlamaDocument(text=" ".join(KITCHEN["bread.txt"]), id_="bread.txt"))
    if when == "after":
        src = llama_attach(conn, "kitchen")
    base = check(conn, src, {"kitchen": ["pasta", "garlic", "bread"]})
    st = helpers.state(conn, src)
    assert st["stores"]["kitchen"][:2] == (3, 5)  # bread.txt was inserted as one document: one node
    assert {f for f, _ in st["files"]} == set(KITCHEN)

    def add():
        store.add(llama_nodes({"telescope.txt": STARS["telescope.txt"]}, embed))
        index.insert(LlamaDocument(text=STARS["orbit.txt"][0], id_="orbit.txt"))
        store.add(llama_nodes({"orbit.txt": STARS["orbit.txt"][1:]}, embed))

    def delete():
        store.delete("telescope.txt")
        index.delete_ref_doc("orbit.txt")

    add_and_delete_restores(conn, src, "kitchen", add, delete, base)
