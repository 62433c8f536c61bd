"""The documentation runs as written: every fenced code block of README.md and docs/*.md, in order, one database
per file, prepared with the tables, rows and small embeddings its examples use (docs/development.md has the rules).

* ```sql: on a connection as an administrator, or as the role a `<!-- run: as ROLE -->` before the block names; no
  statement may raise a WARNING (an attach before its file-key index does);
* ```sh: line by line through bash, with the installed `storetopics` first on PATH and $DATABASE_URL set to the
  file's database; only `storetopics ...` and `python -m storetopics...` commands; long-running ones (the worker
  without --once, `mcp --http`) must still be running after a few seconds and stop on SIGTERM; `storetopics mcp` on
  stdio must list a tool per store to an MCP client;
* ```python: exec'd, each block in a namespace of its own;
* `<!-- run: fresh database -->`: the block runs in an empty database of its own (the install examples);
  `<!-- run: pg_cron -->`: in a database `app` with storetopics, on a cluster with pg_cron preloaded;
* ```text is output; every other block is marked `<!-- not run: why -->`.

In every block, `postgresql[+driver]://ROLE@db-host/app` is the file's database as ROLE (`admin` and `app`: the
administrator).  Also checked: the README's length, every relative link and anchor, the settings table, and that the
generated parts (docs/cli.md, the end of docs/sql.md) are what scripts/gen_docs.py writes."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import conninfo

from storetopics import cli as st_cli
from storetopics import install as st_install
from tests import harness, helpers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gen_docs  # noqa: E402

DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
LINKED = [*DOCS, "bench/README.md", "docker/README.md", "CHANGELOG.md"]
README_LIMIT = 15_000
RUNNABLE = {"sql", "sh", "python"}
ROLES = ("router", "worker", "app_owner", "monitoring")   # the roles the examples create (roles are cluster-wide)
ADMIN_USERS = ("admin", "app")
BIN = Path(sys.executable).parent
LONG_RUNNING_SECONDS = 3.0
DIM = 384
SUBCOMMANDS = set(gen_docs._subparsers(st_cli.build_parser()))

FENCE = re.compile(r"^(\s*)(```+)([\w-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*((?:not run|run):.*?)\s*-->\s*$")
URL = re.compile(r"postgresql(\+\w+)?://(\w+)@db-host(?::\d+)?/app")


# --------------------------------------------------------------------------------------------------------------
# The blocks
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Block:
    path: str
    line: int
    lang: str
    code: str
    directive: str | None   # "not run: why", "run: as ROLE", "run: fresh database"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def role(self) -> str | None:
        m = re.fullmatch(r"run: as (\w+)", self.directive or "")
        return m and m.group(1)

    @property
    def fresh(self) -> bool:
        return self.directive == "run: fresh database"

    @property
    def pg_cron(self) -> bool:
        return self.directive == "run: pg_cron"

    @property
    def skipped(self) -> bool:
        return bool(self.directive and self.directive.startswith("not run:"))


def blocks(path: str) -> list[Block]:
    lines = (REPO / path).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        d = DIRECTIVE.match(lines[j]) if j >= 0 else None
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        assert i < len(lines), f"{path}:{start}: a code block that is never closed"
        out.append(Block(path, start, lang, "\n".join(body) + "\n", d and d.group(1)))
        i += 1
    return out


def test_every_block_runs_or_says_why_not():
    for path in DOCS:
        for b in blocks(path):
            if b.lang == "text":
                assert b.directive is None, f"{b.where}: a text block (output) needs no directive"
                continue
            if b.skipped:
                assert len(b.directive) > len("not run: ") + 5, f"{b.where}: say why the block does not run"
                continue
            assert b.lang in RUNNABLE, (f"{b.where}: a ```{b.lang or '(no language)'} block neither runs nor is "
                                        f"marked <!-- not run: why -->")
            assert b.directive is None or b.role or b.fresh or b.pg_cron, f"{b.where}: unknown directive {b.directive!r}"


# --------------------------------------------------------------------------------------------------------------
# The databases the files' examples run in
# --------------------------------------------------------------------------------------------------------------
STORES = {"games": {"chess": "chess opening endgame gambit rook bishop knight pawn checkmate tournament grandmaster",
                    "poker": "poker bluff chips dealer flop river blinds cards hand showdown casino"},
          "editors": {"vim": "vim modal editing buffers plugin keybindings syntax highlighting macros registers",
                      "emacs": "emacs lisp mode buffers package elisp org keybindings minibuffer dired"}}


def _vector(short: str) -> str:
    """topical_rows' 8-dimensional vector as a vector(384)."""
    return short[:-1] + ",0" * (DIM - 8) + "]"


def chunks_table(conn: psycopg.Connection, index: bool = False) -> None:
    """The README's table: public.chunks with 24 chunks (12 files) in each of the stores games and editors."""
    conn.execute(f"CREATE TABLE public.chunks (id bigserial PRIMARY KEY, store_id text, file_id bigint, content text, "
                 f"embedding vector({DIM}))")
    if index:
        conn.execute("CREATE INDEX ON public.chunks (file_id)")
    rows = [(s, f, t, _vector(v)) for s, f, t, v in helpers.topical_rows(STORES, files=6, chunks=2)]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.chunks (store_id, file_id, content, embedding) VALUES (%s, %s, %s, %s)",
                        rows)


def sa_url(dsn: str, driver: str, user: str | None = None) -> str:
    p = conninfo.conninfo_to_dict(dsn)
    return f"postgresql+{driver}://{user or p['user']}@/{p['dbname']}?host={p['host']}&port={p['port']}"


def library_tables(conn: psycopg.Connection, dsn: str) -> None:
    """The tables the recipes attach, made as their libraries and applications make them."""
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_postgres import Column, PGEngine, PGVector, PGVectorStore
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
    from llama_index.vector_stores.postgres import PGVectorStore as LlamaPGVectorStore
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from tests.test_libraries import GARAGE, KITCHEN

    def docs(files):
        return [Document(page_content=t, metadata={"source": f}) for f, texts in files.items() for t in texts]

    emb = DeterministicFakeEmbedding(size=DIM)
    engine = create_engine(sa_url(dsn, "psycopg"), poolclass=NullPool)
    try:
        for name, files in (("kitchen", KITCHEN), ("garage", GARAGE)):
            PGVector(embeddings=emb, collection_name=name, connection=engine).add_documents(docs(files))
    finally:
        engine.dispose()
    pg = PGEngine.from_connection_string(sa_url(dsn, "psycopg"), poolclass=NullPool)
    pg.init_vectorstore_table(table_name="kitchen_docs", vector_size=DIM, metadata_columns=[Column("source", "TEXT")])
    PGVectorStore.create_sync(engine=pg, table_name="kitchen_docs", embedding_service=emb,
                              metadata_columns=["source"]).add_documents(docs(KITCHEN))
    embed = MockEmbedding(embed_dim=DIM)
    store = LlamaPGVectorStore.from_params(connection_string=sa_url(dsn, "psycopg2"),
                                           async_connection_string=sa_url(dsn, "asyncpg"), table_name="kitchen",
                                           embed_dim=DIM, create_engine_kwargs={"poolclass": NullPool})
    store.add([TextNode(text=t, embedding=embed.get_text_embedding(t),
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f)})
               for f, texts in KITCHEN.items() for t in texts])

    # hand-rolled: only files knows the store; the summaries are mirrored into stores
    conn.execute(f"""
        CREATE TABLE public.stores (id int PRIMARY KEY, name text NOT NULL, store_topics text);
        CREATE TABLE public.files (id bigint PRIMARY KEY, store_id int NOT NULL REFERENCES public.stores,
                                   name text NOT NULL);
        CREATE TABLE public.chunks (id bigserial PRIMARY KEY,
                                    file_id bigint NOT NULL REFERENCES public.files ON DELETE CASCADE,
                                    content text NOT NULL, embedding vector({DIM}));
        INSERT INTO public.stores VALUES (1, 'kitchen', NULL), (2, 'garage', NULL)""")
    file_id = 100
    for store, files in ((1, KITCHEN), (2, GARAGE)):
        for name, texts in files.items():
            conn.execute("INSERT INTO public.files VALUES (%s, %s, %s)", (file_id, store, name))
            conn.execute("INSERT INTO public.chunks (file_id, content, embedding) SELECT %s, t, %s "
                         "FROM unnest(%s::text[]) t", (file_id, _vector(f"[{store},1,0,0,0,0,0,0]"), texts))
            file_id += 1
    # keyword-only, and a partitioned table
    conn.execute("""
        CREATE TABLE public.notes (id bigserial PRIMARY KEY, notebook text, path text, body text);
        INSERT INTO public.notes (notebook, path, body) VALUES
          ('garden', 'roses.md', 'prune the roses in march, feed the roses after flowering'),
          ('garden', 'tomatoes.md', 'tomatoes need sun, water the tomatoes at the roots'),
          ('travel', 'lisbon.md', 'trams and tiles in lisbon, custard tarts in belem');
        CREATE TABLE public.messages (id bigserial, tenant text NOT NULL, thread_id bigint, body text)
          PARTITION BY LIST (tenant);
        CREATE TABLE public.messages_acme PARTITION OF public.messages FOR VALUES IN ('acme');
        CREATE TABLE public.messages_globex PARTITION OF public.messages FOR VALUES IN ('globex');
        INSERT INTO public.messages (tenant, thread_id, body) VALUES
          ('acme', 1, 'anvils and rocket skates for the coyote'), ('acme', 2, 'rocket skates back-ordered'),
          ('globex', 3, 'the doomsday device needs a new hammock');""")


# path -> (install, plpython3u, prepare(conn, dsn))
SETUPS = {
    "README.md": ("extension", False, lambda conn, dsn: chunks_table(conn)),
    "docs/sql.md": ("extension", True, lambda conn, dsn: chunks_table(conn, index=True)),
    "docs/operations.md": ("extension", False, lambda conn, dsn: chunks_table(conn)),
    "docs/recipes.md": ("extension", False, lambda conn, dsn: library_tables(conn, dsn)),
}


def _drop_roles(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for role in ROLES:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


# --------------------------------------------------------------------------------------------------------------
# Running a block
# --------------------------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, dsn: str):
        self.dsn = dsn
        self.admin_user = conninfo.conninfo_to_dict(dsn)["user"]

    def role_exists(self, role: str) -> bool:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None

    def user(self, name: str, where: str) -> str:
        if name in ADMIN_USERS:
            return self.admin_user
        assert self.role_exists(name), f"{where}: the block connects as {name}, a role no earlier block created"
        return name

    def dsn_as(self, user: str) -> str:
        return conninfo.make_conninfo(self.dsn, user=user)

    def urls(self, code: str, where: str) -> str:
        """Each postgresql[+driver]://ROLE@db-host/app as this database, ROLE as given."""
        p = conninfo.conninfo_to_dict(self.dsn)

        def sub(m: re.Match) -> str:
            driver, user = m.group(1), self.user(m.group(2), where)
            if driver:   # SQLAlchemy: the socket as a query parameter
                return f"postgresql{driver}://{user}@/{p['dbname']}?host={p['host']}&port={p['port']}"
            return f"postgresql://{user}@{quote(p['host'], safe='')}:{p['port']}/{p['dbname']}"
        return URL.sub(sub, code)

    # ---- sql
    def sql(self, b: Block) -> None:
        user = self.user(b.role, b.where) if b.role else self.admin_user
        warnings = []
        with psycopg.connect(self.dsn_as(user), autocommit=True) as conn:
            conn.add_notice_handler(lambda d: d.severity == "WARNING" and warnings.append(d.message_primary))
            try:
                cur = conn.execute(b.code)
                while cur.nextset():
                    pass
            except psycopg.Error as e:
                pytest.fail(f"{b.where}: {type(e).__name__}: {e}\n{b.code}")
        assert not warnings, f"{b.where}: WARNING {warnings}\n{b.code}"

    # ---- python
    def python(self, b: Block) -> None:
        code = self.urls(b.code, b.where)
        out = io.StringIO()
        saved = os.environ.get("DATABASE_URL")
        os.environ["DATABASE_URL"] = self.dsn
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, b.where, "exec"), {"__name__": "__docs__"})
        finally:
            if saved is None:
                os.environ.pop("DATABASE_URL", None)
            else:
                os.environ["DATABASE_URL"] = saved

    # ---- sh
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STORETOPICS_") and not k.startswith("PG")}
        env.update(PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}", DATABASE_URL=self.dsn)
        return env

    def sh(self, b: Block) -> None:
        for cmd in commands(b.code):
            argv = _argv(cmd)
            assert argv[:1] == ["storetopics"] or argv[:3] == ["python", "-m", "storetopics.worker"], (
                f"{b.where}: `{cmd}` is not a storetopics command: mark the block <!-- not run: why -->")
            line = self.urls(cmd, b.where)
            sub = "worker" if argv[0] == "python" else next((a for a in argv[1:] if a in SUBCOMMANDS), None)
            if sub == "worker" and "--once" not in argv:
                self.long_running(b, line, worker=True)
            elif sub == "mcp" and "--http" in argv:
                self.long_running(b, line)
            elif sub == "mcp":
                self.mcp_stdio(b, line)
            else:
                r = subprocess.run(["bash", "-c", line], env=self.env(), capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, f"{b.where}: `{cmd}` exited {r.returncode}\n{r.stdout}\n{r.stderr}"
                assert not re.search(r"(?im)^.*\bwarning\b", r.stderr) and "Traceback" not in r.stderr, (
                    f"{b.where}: `{cmd}` warned:\n{r.stderr}")

    def long_running(self, b: Block, line: str, worker: bool = False) -> None:
        proc = subprocess.Popen(["bash", "-c", line], env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            time.sleep(LONG_RUNNING_SECONDS)
            deadline = time.monotonic() + 30
            while worker and not self.worker_alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert proc.poll() is None, f"{b.where}: `{line}` stopped ({proc.returncode}):\n{proc.communicate()}"
            assert not worker or self.worker_alive(), f"{b.where}: `{line}` runs, but no worker is alive"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), (
            f"{b.where}: `{line}` exited {proc.returncode} on SIGTERM\n{err}")
        assert "Traceback" not in err, f"{b.where}: `{line}`\n{err}"

    def worker_alive(self) -> bool:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute("SELECT count(*) FROM storetopics.worker_status() "
                                "WHERE alive AND stopped_at IS NULL").fetchone()[0] > 0

    def mcp_stdio(self, b: Block, line: str) -> None:
        """An MCP client's first steps over stdio: initialize, then tools/list: a search tool per store."""
        proc = subprocess.Popen(["bash", "-c", line], env=self.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                                "clientInfo": {"name": "test_docs", "version": "0"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
        tools = None
        try:
            proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
            proc.stdin.flush()
            deadline = time.monotonic() + 60
            while tools is None and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
                if not ready:
                    break
                reply = proc.stdout.readline()
                if not reply:
                    break
                msg = json.loads(reply)
                if msg.get("id") == 2:
                    tools = [t["name"] for t in msg["result"]["tools"]]
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        err = proc.stderr.read()
        assert tools is not None, f"{b.where}: `{line}` answered no tools/list\n{err}"
        assert any(t.startswith("search_") for t in tools), f"{b.where}: no search tool in {tools}"


def commands(code: str) -> list[str]:
    """The block's commands: lines joined at a trailing backslash, comment-only and blank lines left out."""
    out, cur = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd, comments=True)
    while argv and re.fullmatch(r"\w+=.*", argv[0]):   # VAR=value before the command
        argv = argv[1:]
    return argv


@contextlib.contextmanager
def pg_cron_database():
    """A database `app` with storetopics, on a cluster of its own whose pg_cron scheduler runs in `app`."""
    if not harness.pg_cron_installed():
        pytest.skip("pg_cron is not installed (make setup installs postgresql-15-cron)")
    with harness.cluster(harness.pg_cron_settings("app")) as pg:
        admin = pg.dsn("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        dsn = pg.dsn("app")
        st_install.install(dsn, extension=True, log=lambda *a: None)
        yield dsn


@contextlib.contextmanager
def database(pg_admin_dsn: str, template: str | None):
    name = harness.create_database(pg_admin_dsn, template=template, prefix="docs")
    try:
        yield harness.with_db(pg_admin_dsn, name)
    finally:
        harness.drop_database(pg_admin_dsn, name)


RAN: Counter = Counter()


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.lang in RUNNABLE and not b.skipped for b in blocks(p))])
def test_the_examples_run_as_written(path, pg_admin_dsn, templates):
    todo = [b for b in blocks(path) if b.lang in RUNNABLE and not b.skipped]
    how, plpython, prepare = SETUPS.get(path, ("extension", False, lambda conn, dsn: None))
    _drop_roles(pg_admin_dsn)
    try:
        with database(pg_admin_dsn, templates(how, plpython)) as dsn:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                prepare(conn, dsn)
            for b in todo:
                if b.fresh:
                    with database(pg_admin_dsn, None) as fresh:
                        getattr(Runner(fresh), b.lang)(b)
                elif b.pg_cron:
                    with pg_cron_database() as app:
                        getattr(Runner(app), b.lang)(b)
                        with psycopg.connect(app) as conn:
                            assert conn.execute("SELECT count(*) FROM cron.job").fetchone()[0] == 1
                else:
                    getattr(Runner(dsn), b.lang)(b)
                RAN[b.lang] += 1
            CHECKS.get(path, lambda dsn: None)(dsn)
    finally:
        _drop_roles(pg_admin_dsn)
    print(f"{path}: {len(todo)} blocks ran ({', '.join(f'{k} {v}' for k, v in Counter(b.lang for b in todo).items())})")


# What the examples must have done, beyond running without an error or a warning
def _readme(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        stores = dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores").fetchall())
        assert set(stores) == {"games", "editors"} and all(stores.values()), stores
        assert "chess" in stores["games"] or "poker" in stores["games"], stores["games"]
        assert conn.execute("SELECT count(*) FROM storetopics.clusters").fetchone()[0] > 0   # storetopics backfill
    with psycopg.connect(conninfo.make_conninfo(dsn, user="router")) as conn:
        assert len(conn.execute("SELECT * FROM storetopics.catalog()").fetchall()) == 2
        assert conn.execute("SELECT count(*) FROM storetopics.route(array_fill(0.05, ARRAY[384])::vector, 3)"
                            ).fetchone()[0] == 2


def _recipes(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        sources = {s for (s,) in conn.execute("SELECT chunks::text FROM storetopics.sources").fetchall()}
        assert sources == {"langchain_pg_embedding", "kitchen_docs", "data_kitchen", "chunks", "notes", "messages"}
        mirrored = dict(conn.execute("SELECT name, store_topics FROM public.stores").fetchall())
        assert "pasta" in mirrored["kitchen"] and "brake" in mirrored["garage"], mirrored
        tenants = {k for (k,) in conn.execute("SELECT store_key FROM storetopics.stores "
                                              "WHERE source = 'public.messages'::regclass").fetchall()}
        assert tenants == {"acme", "globex", "initech"}


CHECKS = {"README.md": _readme, "docs/recipes.md": _recipes}


# --------------------------------------------------------------------------------------------------------------
# The README's size, the links, the generated parts
# --------------------------------------------------------------------------------------------------------------
def test_the_readme_is_short():
    n = len((REPO / "README.md").read_text())
    assert n <= README_LIMIT, f"README.md has {n:,} characters; at most {README_LIMIT:,} (move the rest to docs/)"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", path.read_text())
    seen: Counter = Counter()
    out = set()
    for m in re.finditer(r"(?m)^#{1,6}\s+(.*?)\s*$", text):
        slug = _slug(m.group(1))
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


@pytest.mark.parametrize("path", LINKED)
def test_relative_links_and_anchors_resolve(path):
    doc = REPO / path
    text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", doc.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading for #{anchor}")
    assert not broken, f"{path}: " + "; ".join(broken)


def test_cli_reference_is_generated_from_the_parser():
    text = (REPO / "docs" / "cli.md").read_text()
    made = re.search(r"<!-- python (\d+\.\d+) -->", text).group(1)
    if made != gen_docs.PYTHON:
        pytest.skip(f"docs/cli.md was generated with Python {made}'s argparse; this is {gen_docs.PYTHON}")
    assert text == gen_docs.cli_markdown(), "docs/cli.md is not the parser's help: run scripts/gen_docs.py"


def test_sql_reference_is_generated_from_the_schema(dsn):
    text = (REPO / "docs" / "sql.md").read_text()
    assert text == gen_docs.splice(text, gen_docs.sql_reference(dsn)), (
        "the end of docs/sql.md is not the installed schema's functions and views: run scripts/gen_docs.py")


def test_every_setting_is_in_the_settings_table(conn):
    keys = conn.execute("SELECT jsonb_object_keys(storetopics.default_settings())").fetchall()
    text = (REPO / "docs" / "sql.md").read_text()
    table = text[text.index("## Settings"):text.index("## Clusters and labels")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    missing = [k for (k,) in keys if not any(f"`{k}`" in row.split("|")[1] for row in rows)]
    assert not missing, f"settings without a row in docs/sql.md's table: {missing}"


def test_the_roles_the_examples_create_are_dropped_again():
    """Roles are cluster-wide and other tests create roles of the same names: the examples may create only those
    ROLES lists, which each file's run drops before and after."""
    created = {m.group(1) for p in DOCS for m in re.finditer(r"CREATE ROLE (\w+)", (REPO / p).read_text())}
    assert created <= set(ROLES), created - set(ROLES)
