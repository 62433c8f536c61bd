"""The package is the product: the runtime package holds what a user runs and nothing of the lab; no import
circles; the CLI starts without loading the heavy libraries; the wheel, installed into a fresh virtualenv, installs,
attaches, backfills and runs the worker against a real Postgres."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest

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


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new virtualenv holding the wheel alone; its dependencies are those already installed in the project's
    environment (put on its path by a .pth file, which does not load the project's editable install)."""
    env = tmp_path_factory.mktemp("venv") / "v"
    venv.EnvBuilder(with_pip=False).create(env)
    site = next(env.glob("lib/python*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, text=True)
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "psycopg").is_dir())
    (site / "project-deps.pth").write_text(str(deps) + "\n")
    return env


def _run(env: Path, *args: str, dsn: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    return subprocess.run([str(env / "bin" / "storetopics"), "--dsn", dsn, *args], capture_output=True, text=True,
                          env=e, cwd="/", timeout=300)


def test_the_wheel_installs_attaches_backfills_and_runs_the_worker(fresh_venv, pg_admin_dsn, make_db):
    from lab import testing
    r = subprocess.run([str(fresh_venv / "bin" / "python"), "-c",
                        "import storetopics, storetopics.sql; print(storetopics.__file__)"],
                       capture_output=True, text=True, check=True, cwd="/")
    assert r.stdout.startswith(str(fresh_venv)), r.stdout   # the wheel's copy, not the checkout's
    name = testing.create_database(pg_admin_dsn, prefix="wheel")
    dsn = testing.with_db(pg_admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE TABLE docs (id serial PRIMARY KEY, store text, file text, content text, "
                         "embedding vector(3))")
            conn.execute("INSERT INTO docs (store, file, content, embedding) "
                         "SELECT 'garden', 'f' || (g % 12), 'roses tulips compost soil watering pruning ' || g, "
                         "ARRAY[1 + g % 3, 1, g % 5]::vector FROM generate_series(1, 60) g")
        for args in (["install"], ["attach", "docs", "--store-key", "store", "--file-key", "file",
                                   "--embedding", "embedding"], ["backfill", "-q"]):
            r = _run(fresh_venv, *args, dsn=dsn)
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        with psycopg.connect(dsn, autocommit=True) as conn:
            text, clusters = conn.execute("SELECT store_topics, jsonb_array_length(topics -> 'clusters') "
                                          "FROM storetopics.stores").fetchone()
            assert "12 files" in text and clusters >= 1, text
            conn.execute("INSERT INTO docs (store, file, content) VALUES ('garden', 'new', 'greenhouse tomatoes')")
            conn.execute("SELECT storetopics.configure('docs', '{\"debounce\": 0}')")
        r = _run(fresh_venv, "worker", "--once", "--poll", "0.2", dsn=dsn)
        assert r.returncode == 0, r.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT store_topics FROM storetopics.stores").fetchone()[0].endswith("13 files.")
            assert conn.execute("SELECT count(*) FROM storetopics.pending").fetchone()[0] == 0
    finally:
        testing.drop_database(pg_admin_dsn, name)
