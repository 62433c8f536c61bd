"""`make bench`: what storetopics costs the application, measured side by side in one run.

Every write measurement runs the same statements against an attached and an unattached chunk table (or, for HNSW, one
table attached for half of the statements), interleaved, several repetitions; it reports each side's median and the
median of the attached/unattached ratios of neighbouring statements or repetitions.  Nothing here is a timed
assertion: the run always completes, and a missed target is reported as MISS.

    .venv/bin/python -m bench.run                 # the full run (what `make bench` does)
    .venv/bin/python -m bench.run --quick         # a small smoke run (not written to latest.md)
    .venv/bin/python -m bench.run --explain       # also print the plans of fold()'s statements (auto_explain)

The server is a throwaway cluster (tests.harness.server(), fast settings: fsync off) or STORETOPICS_TEST_DSN;
in both cases the bench works in a database of its own, created and dropped here.  See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from lab.localpg import FAST_SETTINGS
from storetopics import install as st_install
from tests import harness

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CORPUS = REPO / "data" / "debian" / "descriptions.jsonl.gz"
DIM = 384
COLUMNS = "store_id, file_id, chunk_no, content, embedding"


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Config:
    chunks: int = 20_000            # rows of the bulk load, the DELETE and the catch-up
    words_per_chunk: int = 400
    chunks_per_file: int = 20
    stores: int = 4
    copy_batch: int = 1_000         # rows per COPY statement (each its own transaction)
    reps: int = 5                   # repetitions of each attached/unattached pair (bulk, DELETE)
    small_reps: int = 5             # repetitions of the per-row INSERT measurement
    per_row: int = 2_000            # single-row INSERT statements, one transaction
    per_row_block: int = 100        # of them in a row into one table, then as many into the other
    hnsw_rows: int = 8_000          # rows per repetition into one HNSW-indexed table, half attached (slow: ~5 ms/row)
    hnsw_preload: int = 2_000       # untimed rows loaded first, so the graph is not empty when timing starts
    hnsw_reps: int = 3
    delete_files: int = 1_000
    delete_batch: int = 100         # files per DELETE statement
    writers: int = 8
    files_per_writer: int = 25      # one COPY of one file (chunks_per_file rows) per statement
    concurrent_reps: int = 10       # short runs, sides alternating, so a burst of other load hits both
    catchup_reps: int = 1           # one backfill() of 8M words takes ~1 min here
    seed: int = 20240501

    @classmethod
    def quick(cls) -> Config:
        return cls(chunks=3_000, reps=2, small_reps=2, per_row=200, hnsw_rows=2_000, hnsw_preload=1_000, hnsw_reps=2,
                   delete_files=100, files_per_writer=3, concurrent_reps=2, catchup_reps=1)


# ----------------------------------------------------------------------------------------------------------------
# Data: real text (Debian package descriptions), random unit vectors
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Chunk:
    store: str
    file_id: int
    chunk_no: int
    content: str
    vec: str                        # pgvector text form '[x,y,...]'

    def copy_line(self, store: str | None = None, file_id: int | None = None) -> str:
        return (f"{store or self.store}\t{file_id if file_id is not None else self.file_id}\t{self.chunk_no}\t"
                f"{_copy_escape(self.content)}\t{self.vec}\n")


def _copy_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


_WORD = re.compile(r"\S+\s*")


def build_chunks(cfg: Config) -> list[Chunk]:
    """cfg.chunks chunks of exactly cfg.words_per_chunk whitespace-separated words, cut from a stream of concatenated
    long descriptions (whitespace kept, descriptions separated by a blank line).  Each store reads the sections
    dealt to it round-robin, in a seeded shuffled order, reshuffled when exhausted (the corpus has 1.6M words, a full
    run needs 8M, so each description appears about five times, cut at different chunk boundaries).  Files are
    cfg.chunks_per_file consecutive chunks of one store; file i belongs to store i mod cfg.stores."""
    rng = random.Random(cfg.seed)
    records = [json.loads(line) for line in gzip.open(CORPUS, "rt", encoding="utf-8")]
    sections = sorted({r["section"] for r in records})
    store_names = [f"store-{chr(ord('a') + i)}" for i in range(cfg.stores)]
    by_store: dict[str, list[str]] = {s: [] for s in store_names}
    for i, sec in enumerate(sections):
        by_store[store_names[i % cfg.stores]].extend(r["long"] for r in records if r["section"] == sec)

    def stream(texts: list[str]):
        order = list(texts)
        while True:
            rng.shuffle(order)
            for t in order:
                pieces = _WORD.findall(t)
                if pieces:
                    pieces[-1] = pieces[-1].rstrip() + "\n\n"
                yield from pieces

    streams = {s: stream(by_store[s]) for s in store_names}
    vecs = random_unit_vectors(cfg.chunks, cfg.seed)
    out: list[Chunk] = []
    n_files = -(-cfg.chunks // cfg.chunks_per_file)
    for f in range(1, n_files + 1):
        store = store_names[f % cfg.stores]
        for k in range(cfg.chunks_per_file):
            if len(out) == cfg.chunks:
                break
            words = [next(streams[store]) for _ in range(cfg.words_per_chunk)]
            out.append(Chunk(store, f, k, "".join(words).strip(), vecs[len(out)]))
    return out


def build_doc_chunks(cfg: Config) -> list[Chunk]:
    """Realistic chunks (bench.doctext: 200-300-word windows of the manuals of the document corpus), laid out as
    build_chunks lays out its own: cfg.chunks chunks, files of cfg.chunks_per_file chunks, file i in store i mod
    cfg.stores.  A file is one product's windows (a manual's section); store s holds the products s, s + stores, ...
    (its files take them in turn)."""
    from bench.doctext import DocTexts
    texts = DocTexts(cfg.seed)
    store_names = [f"store-{chr(ord('a') + i)}" for i in range(cfg.stores)]
    n_files = -(-cfg.chunks // cfg.chunks_per_file)
    themes = []
    for f in range(1, n_files + 1):
        s = f % cfg.stores
        mine = list(range(s, texts.themes, cfg.stores)) or [s % texts.themes]
        themes += [mine[(f // cfg.stores) % len(mine)]] * cfg.chunks_per_file
    themes = themes[:cfg.chunks]
    contents = texts(np.array(themes), len(themes))
    vecs = random_unit_vectors(cfg.chunks, cfg.seed)
    return [Chunk(store_names[(i // cfg.chunks_per_file + 1) % cfg.stores], i // cfg.chunks_per_file + 1,
                  i % cfg.chunks_per_file, t, vecs[i]) for i, t in enumerate(contents)]


TEXT_KINDS = {"debian": ("Debian package descriptions (400-word chunks)", build_chunks),
              "docs": ("manuals of the document corpus (bench.doctext, 200-300-word chunks)", build_doc_chunks)}


def random_unit_vectors(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    # %.9g round-trips float32; clients that send str(float(x)) send longer text (more parsing on both sides).
    fmt = ",".join(["%.9g"] * DIM)
    return ["[" + (fmt % tuple(row)) + "]" for row in v.tolist()]


def copy_batches(chunks: list[Chunk], batch: int) -> list[bytes]:
    return ["".join(c.copy_line() for c in chunks[i:i + batch]).encode() for i in range(0, len(chunks), batch)]


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------
class Tables:
    """Creates identical chunk tables, attached or not, and drops them (detaching first)."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self.n = 0
        self.attached: set[str] = set()

    def create(self, attached: bool, hnsw: bool = False) -> str:
        self.n += 1
        name = f"chunks_{'a' if attached else 'u'}{self.n}"
        # autovacuum off on the chunk tables (both sides), so that a vacuum of an earlier table does not land in a
        # random timed interval; storetopics' own tables keep their defaults.
        self.conn.execute(f"""
            CREATE TABLE {name} (
              id        bigserial PRIMARY KEY,
              store_id  text NOT NULL,
              file_id   int NOT NULL,
              chunk_no  int NOT NULL,
              content   text NOT NULL,
              embedding vector({DIM})
            ) WITH (autovacuum_enabled = false)""")
        self.conn.execute(f"CREATE INDEX ON {name} (file_id)")
        if hnsw:
            self.conn.execute(f"CREATE INDEX ON {name} USING hnsw (embedding vector_cosine_ops)")
        if attached:
            self.conn.execute("SELECT storetopics.attach(%s, store_key => 'store_id', file_key => 'file_id', "
                              "content => 'content', embedding => 'embedding')", (name,))
            self.attached.add(name)
        return name

    def drop(self, name: str) -> None:
        if name in self.attached:
            self.conn.execute("SELECT storetopics.detach(%s)", (name,))
            self.attached.discard(name)
        self.conn.execute(f"DROP TABLE {name}")


def backend_cpu(conn: psycopg.Connection) -> float | None:
    """CPU seconds used so far by the connection's server process (user + system), when the server runs on this
    machine and /proc is readable; parallel workers are not included.  Unlike wall time, it barely moves when other
    jobs share the machine."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# One-file uploads whose render after each is timed (their median: render after a 1-file change).
ONE_FILE_UPLOADS = 5


def settle(conn: psycopg.Connection) -> None:
    """Between timed intervals: write dirty buffers now rather than in the middle of the next measurement."""
    conn.execute("CHECKPOINT")


def copy_load(conn: psycopg.Connection, table: str, batches: list[bytes]) -> float:
    """COPY ... FROM STDIN (text format), one statement and one transaction per batch.  Returns seconds."""
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for b in batches:
            with cur.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as cp:
                cp.write(b)
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Metric:
    key: str
    name: str
    unit: str
    attached: list[float] = field(default_factory=list)
    unattached: list[float] = field(default_factory=list)
    target: float | None = None
    op: str = "<="                    # the ratio must be <= target, or >= target
    higher_is_better: bool = False    # for the unit (throughput)
    ratio_override: float | None = None
    value_override: tuple[float | None, float | None] | None = None
    extra: dict = field(default_factory=dict)
    statement_pairs: list[tuple[float, float]] = field(default_factory=list)  # adjacent (attached, unattached)
    note: str = ""
    force_miss: str = ""              # e.g. a deadlock: MISS whatever the ratio

    @property
    def med_a(self) -> float | None:
        if self.value_override:
            return self.value_override[0]
        return statistics.median(self.attached) if self.attached else None

    @property
    def med_u(self) -> float | None:
        if self.value_override:
            return self.value_override[1]
        return statistics.median(self.unattached) if self.unattached else None

    @property
    def ratio(self) -> float | None:
        if self.ratio_override is not None:
            return self.ratio_override
        if self.statement_pairs:
            # Interleaved statements: each attached statement ran right next to its unattached twin; the median of
            # those ratios is robust to a burst of other work on the machine hitting a few statements.
            return statistics.median(a / u for a, u in self.statement_pairs if u)
        pairs = self.pair_ratios()
        if pairs and len(self.attached) == len(self.unattached):
            # Paired design: each repetition measures both sides interleaved, so the ratio is taken within each
            # pair (drift between repetitions cancels) and the median of those is reported.
            return statistics.median(pairs)
        if self.med_a is None or not self.med_u:
            return None
        return self.med_a / self.med_u

    @property
    def status(self) -> str:
        if self.target is None:
            return "info"
        if self.force_miss:
            return "MISS"
        r = self.ratio
        if r is None:
            return "MISS"
        ok = r <= self.target if self.op == "<=" else r >= self.target
        return "PASS" if ok else "MISS"

    def pair_ratios(self) -> list[float]:
        return [a / u for a, u in zip(self.attached, self.unattached) if u]

    def as_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "unit": self.unit, "attached": self.attached,
                "unattached": self.unattached, "median_attached": self.med_a, "median_unattached": self.med_u,
                "ratio": self.ratio, "pair_ratios": self.pair_ratios(), "statement_pairs": self.statement_pairs,
                "target": self.target, "op": self.op,
                "status": self.status, "note": self.note, "force_miss": self.force_miss, "extra": self.extra}


def fmt_val(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v:.3f} s"
    if unit == "rows/s":
        return f"{v:,.0f} rows/s"
    if unit == "words/s":
        return f"{v / 1e6:.2f} M words/s"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "problems":
        return "none" if v == 0 else f"{v:g} problems"
    if unit == "MB":
        return f"{v / 1e6:.1f} MB"
    return f"{v:g} {unit}"


def fmt_ratio(m: Metric) -> str:
    r = m.ratio
    if r is None or m.key == "deadlocks":
        return "—"
    return f"{r:.1%}" if m.key.startswith("storage") else f"{r:.3f}×"


def fmt_target(m: Metric) -> str:
    if m.target is None:
        return "—"
    if m.unit == "words/s" and m.target >= 1000:
        return f"{m.op} {m.target / 1e6:g} M words/s"
    if m.key.startswith("storage"):
        return f"{m.op} {m.target:.0%}"
    if m.key == "deadlocks":
        return "none"
    return f"{m.op} {m.target:g}×"


def table_rows(metrics: list[Metric]) -> list[list[str]]:
    return [[m.name, fmt_val(m.med_a, m.unit), fmt_val(m.med_u, m.unit), fmt_ratio(m), fmt_target(m), m.status]
            for m in metrics]


HEADER = ["metric", "attached", "unattached", "ratio", "target", "PASS/MISS"]


def print_table(metrics: list[Metric]) -> None:
    rows = [HEADER] + table_rows(metrics)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    line = "  ".join("-" * w for w in widths)
    print(line)
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print(line)
    print(line)


def markdown(metrics: list[Metric], env: dict, cfg: Config, elapsed: float) -> str:
    out = [f"# storetopics bench — {env['started']}", "",
           f"`make bench` on {env['cpus']} CPUs, PostgreSQL {env['server_version']}, pgvector {env['vector']}, "
           f"storetopics {env['storetopics']} (git {env['git']}, sql sha1 {env['sql_sha1']}), total {elapsed:.0f} s. "
           "Each write metric: attached and unattached run alternately in the same run; the columns are the medians "
           "over repetitions of each side's time; the ratio is the median of the attached/unattached ratios of "
           "adjacent statement pairs (interleaved COPY/DELETE statements), or of repetitions (per-row INSERTs, "
           "concurrent writers).  See bench/README.md.", "",
           "| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["---:"] * 4 + [":---:"]) + "|"]
    for r in table_rows(metrics):
        out.append("| " + " | ".join(r) + " |")
    out += ["", "Details:", ""]
    for m in metrics:
        detail = f"- **{m.name}**: {m.note}" if m.note else f"- **{m.name}**"
        pr = m.pair_ratios()
        if m.statement_pairs:
            sa = sum(a for a, _ in m.statement_pairs)
            su = sum(u for _, u in m.statement_pairs)
            detail += (f" Ratio = median over {len(m.statement_pairs)} adjacent statement pairs; ratio of all "
                       f"statements' summed times: {sa / su:.3f}×; per-repetition total ratios: "
                       f"{', '.join(f'{x:.3f}' for x in pr)}.")
        elif pr and m.key not in ("storage",):
            detail += f" Per-repetition ratios: {', '.join(f'{x:.3f}' for x in pr)}."
        ca, cu = m.extra.get("cpu_attached"), m.extra.get("cpu_unattached")
        if ca and cu:
            cr = statistics.median(a / u for a, u in zip(ca, cu) if u)
            detail += (f" Server process CPU, medians: {statistics.median(ca):.3f} s vs {statistics.median(cu):.3f} s,"
                       f" ratio {cr:.3f}× (median of pairs).")
        if m.force_miss:
            detail += f" MISS because: {m.force_miss}."
        out.append(detail)
    noise = env.get("machine_during_run", {})
    out += ["", f"Machine during the run: busy {noise.get('busy_share', 0):.0%} of CPU time (this bench and anything "
            f"else running), hypervisor steal {noise.get('steal_share', 0):.0%}, load average at the end "
            f"{' '.join(noise.get('loadavg_at_end', []))}.",
            "", f"Settings: {json.dumps(env['settings'])}", "",
            f"Config: {json.dumps(cfg.__dict__)}", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------------------------
def order(rep: int) -> list[bool]:
    return [True, False] if rep % 2 == 0 else [False, True]


def interleaved(conn, names: dict[bool, str], steps: list, run_step, first: bool, m: Metric) -> None:
    """Runs every step on both tables, alternating which goes first in an ABBA pattern (A B, B A, A B, ...), so that
    a drift in machine load (other jobs, CPU steal, checkpoints) lands on both sides alike.  Appends the summed
    seconds per side to m, and the server process's CPU seconds per side to m.extra (a cross-check that other jobs
    on the machine barely affect)."""
    secs = {True: 0.0, False: 0.0}
    cpu: dict[bool, float | None] = {True: 0.0, False: 0.0}
    for i, step in enumerate(steps):
        this = {}
        for attached in ([first, not first] if i % 2 == 0 else [not first, first]):
            c0, t0 = backend_cpu(conn), time.perf_counter()
            run_step(names[attached], step)
            this[attached] = time.perf_counter() - t0
            secs[attached] += this[attached]
            c1 = backend_cpu(conn)
            cpu[attached] = None if c0 is None or c1 is None or cpu[attached] is None else cpu[attached] + c1 - c0
        m.statement_pairs.append((round(this[True], 5), round(this[False], 5)))
    m.attached.append(secs[True])
    m.unattached.append(secs[False])
    if cpu[True] is not None and cpu[False] is not None:
        m.extra.setdefault("cpu_attached", []).append(round(cpu[True], 3))
        m.extra.setdefault("cpu_unattached", []).append(round(cpu[False], 3))


def bench_bulk_and_delete(conn, tables: Tables, cfg: Config, chunks: list[Chunk], log) -> tuple[Metric, Metric]:
    batches = copy_batches(chunks, cfg.copy_batch)
    files = sorted({c.file_id for c in chunks})[:cfg.delete_files]
    groups = [files[i:i + cfg.delete_batch] for i in range(0, len(files), cfg.delete_batch)]
    deleted_rows = sum(1 for c in chunks if c.file_id in set(files))
    ins = Metric("bulk", f"COPY {len(chunks):,} chunks, no vector index", "s", target=1.05,
                 note=(f"{len(chunks):,} rows of {cfg.words_per_chunk} words + {DIM}-d vector, COPY text format, "
                       f"{cfg.copy_batch:,} rows per COPY statement, each its own transaction, batches alternating "
                       "ABBA between the two tables; tables have a primary key and a btree on file_id."))
    dele = Metric("delete", f"DELETE {len(files):,} files ({deleted_rows:,} rows)", "s", target=1.1,
                  note=(f"DELETE ... WHERE file_id = ANY($1), {cfg.delete_batch} files per statement, each its own "
                        "transaction, statements alternating ABBA between the tables just loaded by the COPY "
                        "measurement (attached side: changes logged, not folded)."))

    def copy_step(table: str, batch: bytes) -> None:
        with conn.cursor() as cur, cur.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as cp:
            cp.write(batch)

    def delete_step(table: str, group: list[int]) -> None:
        conn.execute(f"DELETE FROM {table} WHERE file_id = ANY(%s)", (group,))

    for rep in range(cfg.reps):
        names = {attached: tables.create(attached) for attached in order(rep)}
        settle(conn)
        interleaved(conn, names, batches, copy_step, rep % 2 == 0, ins)
        settle(conn)
        interleaved(conn, names, groups, delete_step, rep % 2 == 0, dele)
        for n in names.values():
            tables.drop(n)
        log(f"  rep {rep + 1}/{cfg.reps}: COPY a/u {ins.attached[-1]:.2f}/{ins.unattached[-1]:.2f} s, "
            f"DELETE a/u {dele.attached[-1]:.2f}/{dele.unattached[-1]:.2f} s")
    return ins, dele


def bench_per_row(conn, tables: Tables, cfg: Config, chunks: list[Chunk], log) -> Metric:
    rows = [(c.store, c.file_id, c.chunk_no, c.content, c.vec) for c in chunks[:cfg.per_row]]
    blocks = [rows[i:i + cfg.per_row_block] for i in range(0, len(rows), cfg.per_row_block)]
    m = Metric("per_row", f"{len(rows):,} single-row INSERTs, one transaction", "s", target=1.25,
               note=("one INSERT ... VALUES ($1..$5) statement per row (pipelined executemany, prepared), the chunks "
                     "in file order (20 statements per file); each statement fires the statement-level trigger once, "
                     "so its fixed cost is the whole overhead.  Both tables are written in one transaction per "
                     f"repetition, in blocks of {cfg.per_row_block} statements alternating ABBA between them (the same "
                     "rows into each)."))
    def step(table: str, block: list[tuple]) -> None:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s::vector)", block)

    for rep in range(cfg.small_reps):
        names = {attached: tables.create(attached) for attached in order(rep)}
        settle(conn)
        with conn.transaction():
            interleaved(conn, names, blocks, step, rep % 2 == 0, m)
        for n in names.values():
            tables.drop(n)
        log(f"  rep {rep + 1}/{cfg.small_reps}: per-row a/u {m.attached[-1]:.2f}/{m.unattached[-1]:.2f} s")
    return m


def thue_morse(i: int) -> bool:
    """A B B A B A A B ...: over 2^k steps both sides get the same sum of positions, squares, ... so a trend that
    grows with the step (an index that gets bigger) cancels."""
    return bin(i).count("1") % 2 == 0


def bench_hnsw(conn, tables: Tables, cfg: Config, chunks: list[Chunk], log) -> Metric:
    assert cfg.hnsw_rows + cfg.hnsw_preload <= len(chunks), "not enough chunks for the HNSW measurement"
    rows = chunks[:cfg.hnsw_rows]
    batches = copy_batches(rows, cfg.copy_batch)
    preload = copy_batches(chunks[cfg.hnsw_rows:cfg.hnsw_rows + cfg.hnsw_preload], cfg.copy_batch)
    m = Metric("hnsw", f"COPY {len(rows) // 2:,} + {len(rows) // 2:,} chunks, HNSW index", "s", target=1.05,
               note=(f"one table with an HNSW index (vector_cosine_ops, m=16, ef_construction=64), preloaded with "
                     f"{cfg.hnsw_preload:,} rows (untimed), then {len(batches)} COPY statements of {cfg.copy_batch:,} "
                     "rows; the table is attached for half of "
                     "them and not for the other half, in Thue-Morse order (A B B A B A A B, flipped every other "
                     "repetition), attach()/detach() between statements, untimed. Both sides insert into the same "
                     "graph at the same sizes: pgvector draws HNSW levels at random, so two separate tables get "
                     "different graphs whose insert costs differ by up to ±20%, which would drown a few-% effect. "
                     f"{len(rows):,} rows per repetition, not {cfg.chunks:,}, because HNSW inserts cost 2–6 ms per "
                     "row here; a smaller graph makes each insert cheaper, so the ratio is, if anything, stricter."))
    for rep in range(cfg.hnsw_reps):
        name = tables.create(False, hnsw=True)
        with conn.cursor() as cur:
            for b in preload:
                with cur.copy(f"COPY {name} ({COLUMNS}) FROM STDIN") as cp:
                    cp.write(b)
        secs = {True: 0.0, False: 0.0}
        cpu: dict[bool, float | None] = {True: 0.0, False: 0.0}
        this: dict[bool, float] = {}
        for i, batch in enumerate(batches):
            attached = thue_morse(i) ^ (rep % 2 == 1)
            if attached:
                conn.execute("SELECT storetopics.attach(%s, store_key => 'store_id', file_key => 'file_id', "
                             "content => 'content', embedding => 'embedding')", (name,))
            settle(conn)
            c0, t0 = backend_cpu(conn), time.perf_counter()
            with conn.cursor() as cur, cur.copy(f"COPY {name} ({COLUMNS}) FROM STDIN") as cp:
                cp.write(batch)
            this[attached] = time.perf_counter() - t0
            secs[attached] += this[attached]
            c1 = backend_cpu(conn)
            cpu[attached] = None if c0 is None or c1 is None or cpu[attached] is None else cpu[attached] + c1 - c0
            if attached:
                conn.execute("SELECT storetopics.detach(%s)", (name,))
            if i % 2 == 1:  # statements 2k and 2k+1 are always one of each side in Thue-Morse order
                m.statement_pairs.append((round(this[True], 5), round(this[False], 5)))
        tables.drop(name)
        m.attached.append(secs[True])
        m.unattached.append(secs[False])
        if cpu[True] is not None and cpu[False] is not None:
            m.extra.setdefault("cpu_attached", []).append(round(cpu[True], 3))
            m.extra.setdefault("cpu_unattached", []).append(round(cpu[False], 3))
        log(f"  rep {rep + 1}/{cfg.hnsw_reps}: HNSW COPY a/u {m.attached[-1]:.2f}/{m.unattached[-1]:.2f} s")
    return m


def bench_concurrent(conn, dsn: str, tables: Tables, cfg: Config, chunks: list[Chunk], log) -> tuple[Metric, ...]:
    # Each writer gets its own files (distinct file ids), all in the same store.
    per_file = cfg.chunks_per_file
    work: list[list[bytes]] = []
    fid = 1_000_000
    src_files = [chunks[i:i + per_file] for i in range(0, len(chunks), per_file)]
    k = 0
    for w in range(cfg.writers):
        mine = []
        for _ in range(cfg.files_per_writer):
            fid += 1
            mine.append("".join(c.copy_line(store="shared", file_id=fid) for c in src_files[k % len(src_files)])
                        .encode())
            k += 1
        work.append(mine)
    total_rows = sum(len(src_files[i % len(src_files)]) for i in range(k))
    m = Metric("concurrent", f"{cfg.writers} writers, same store", "rows/s", target=0.9, op=">=",
               higher_is_better=True,
               note=(f"{cfg.writers} threads, own connections, {cfg.files_per_writer} files each "
                     f"({total_rows:,} rows in all), one COPY of one file ({per_file} rows) per statement and "
                     "transaction, all rows in store 'shared'; throughput = rows / wall time. Each connection "
                     "first writes one file in a rolled-back transaction (untimed warm-up, see the next row), so "
                     "this is the steady state of pooled connections."))
    cold = Metric("first_write", f"  first write on a new connection ({per_file} rows)", "ms",
                  note=("information only: the warm-up statement each writer runs (and rolls back) before the timed "
                        "part — all 8 writers at once, so contended — median over writers, then over repetitions. "
                        "On the attached side it includes "
                        "compiling the capture function and planning its statements in the new backend."))
    dead = Metric("deadlocks", f"{cfg.writers} writers: deadlocks / errors", "",
                  note="deadlocks (pg_stat_database delta), writer errors, rows missing, and the most writers "
                       "seen waiting on a heavyweight lock at once (pg_stat_activity sampled every 20 ms).")
    problems: list[str] = []
    max_waiters = {True: 0, False: 0}
    profile: dict[bool, dict[str, int]] = {True: {}, False: {}}

    def deadlocks() -> int:
        return conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]

    for rep in range(cfg.concurrent_reps):
        for attached in order(rep):
            name = tables.create(attached)
            settle(conn)
            d0 = deadlocks()
            server_cpu: list[float] = []
            first_write: list[float] = []
            errors: list[BaseException] = []
            barrier = threading.Barrier(cfg.writers + 1)
            stop = threading.Event()

            def writer(batches: list[bytes]) -> None:
                try:
                    with psycopg.connect(dsn, autocommit=True) as c, c.cursor() as cur:
                        # Warm-up, untimed for the throughput: the first write of a connection, rolled back.  On
                        # the attached side it compiles the capture function and plans its statements in this
                        # backend, a once-per-connection cost that a connection pool amortises.
                        t0 = time.perf_counter()
                        with c.transaction(force_rollback=True), cur.copy(
                                f"COPY {name} ({COLUMNS}) FROM STDIN") as cp:
                            cp.write(batches[0])
                        first_write.append(time.perf_counter() - t0)
                        c0 = backend_cpu(c)
                        barrier.wait()
                        for b in batches:
                            with cur.copy(f"COPY {name} ({COLUMNS}) FROM STDIN") as cp:
                                cp.write(b)
                        c1 = backend_cpu(c)
                        if c0 is not None and c1 is not None:
                            server_cpu.append(c1 - c0)
                except BaseException as e:  # noqa: BLE001 - reported
                    errors.append(e)
                    barrier.abort()

            def monitor(att: bool = attached) -> None:
                """Samples what the writers are doing every 20 ms: wait events (Lock:*, LWLock:*, ...; 'CPU' when
                none) and how many wait on a heavyweight lock."""
                with psycopg.connect(dsn, autocommit=True) as c:
                    while not stop.is_set():
                        rows = c.execute(
                            "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) "
                            "FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                            "AND query LIKE 'COPY%%' GROUP BY 1").fetchall()
                        for ev, n in rows:
                            profile[att][ev] = profile[att].get(ev, 0) + n
                        waiting = sum(n for ev, n in rows if ev.startswith("Lock:"))
                        max_waiters[att] = max(max_waiters[att], waiting)
                        stop.wait(0.02)

            threads = [threading.Thread(target=writer, args=(w,)) for w in work]
            mon = threading.Thread(target=monitor)
            for t in threads:
                t.start()
            mon.start()
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            stop.set()
            mon.join()
            d = deadlocks() - d0
            n_rows = conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
            if errors:
                problems.append(f"{'attached' if attached else 'unattached'} rep {rep + 1}: {errors[0]!r}")
            if d:
                problems.append(f"{'attached' if attached else 'unattached'} rep {rep + 1}: {d} deadlocks")
            if n_rows != total_rows:
                problems.append(f"{'attached' if attached else 'unattached'} rep {rep + 1}: {n_rows} rows, "
                                f"expected {total_rows}")
            (m.attached if attached else m.unattached).append(total_rows / elapsed)
            if first_write:
                (cold.attached if attached else cold.unattached).append(statistics.median(first_write))
            if len(server_cpu) == cfg.writers:
                m.extra.setdefault("cpu_attached" if attached else "cpu_unattached", []).append(
                    round(sum(server_cpu), 3))
            if attached:
                pend = conn.execute("SELECT count(*) FROM storetopics.pending p JOIN storetopics.sources s "
                                    "ON s.id = p.source_id WHERE s.chunks = %s::regclass", (name,)).fetchone()[0]
                m.extra.setdefault("pending_rows_after", []).append(pend)
            tables.drop(name)
        log(f"  rep {rep + 1}/{cfg.concurrent_reps}: 8 writers a/u {m.attached[-1]:,.0f}/{m.unattached[-1]:,.0f} rows/s")
    m.extra["max_lock_waiters"] = {"attached": max_waiters[True], "unattached": max_waiters[False]}

    def share(p: dict[str, int]) -> dict[str, float]:
        tot = sum(p.values()) or 1
        return {k: round(v / tot, 3) for k, v in sorted(p.items(), key=lambda kv: -kv[1])}

    m.extra["wait_profile"] = {"attached": share(profile[True]), "unattached": share(profile[False])}
    top = lambda p: ", ".join(f"{k} {v:.0%}" for k, v in list(share(p).items())[:4])  # noqa: E731
    m.note += (f" Writer samples (wait event share, 20 ms sampling) attached: {top(profile[True])}; "
               f"unattached: {top(profile[False])}.")
    dead.target = 0
    dead.value_override = (float(len(problems)), None)
    dead.unit = "problems"
    dead.ratio_override = float(len(problems))
    dead.extra = {"problems": problems, "max_lock_waiters": m.extra["max_lock_waiters"]}
    dead.note += (f" Max lock waiters attached/unattached: {max_waiters[True]}/{max_waiters[False]}. "
                  f"Problems: {problems or 'none'}.")
    if problems:
        dead.force_miss = "; ".join(problems)
        m.force_miss = "deadlock or writer error"
    cold.attached = [x * 1000 for x in cold.attached]
    cold.unattached = [x * 1000 for x in cold.unattached]
    return m, cold, dead


def bench_catchup(conn, tables: Tables, cfg: Config, chunks: list[Chunk], explain: bool, log,
                  kind: str = "debian") -> list[Metric]:
    """The catch-up rows on one kind of text (TEXT_KINDS).  The Debian rows keep their keys and names; another
    kind's rows have its name appended to theirs and to their keys."""
    words = sum(len(c.content.split()) for c in chunks)
    # (the state tables compacted first: an earlier catch-up's rows are gone, not the space they took, which the
    # state's size below would count as this text's: the docs row read 40% in one run and 87% in the next)
    conn.execute("VACUUM FULL storetopics.pending, storetopics.file_terms, storetopics.store_terms, "
                 "storetopics.store_state")
    name = tables.create(True)
    sid = conn.execute("SELECT id FROM storetopics.sources WHERE chunks = %s::regclass", (name,)).fetchone()[0]
    t_load = copy_load(conn, name, copy_batches(chunks, cfg.copy_batch))
    pending = conn.execute("SELECT count(*) FROM storetopics.pending WHERE source_id = %s", (sid,)).fetchone()[0]
    conn.execute(f"VACUUM ANALYZE {name}")
    log(f"  loaded {len(chunks):,} chunks ({words:,} words) attached in {t_load:.1f} s; {pending} pending rows")

    def fresh() -> None:
        """Start over from 'nothing folded': resync the source, forget learnt surface words."""
        conn.execute("SELECT storetopics.resync(%s)", (name,))
        conn.execute("DELETE FROM storetopics.term_words")
        conn.execute("DELETE FROM storetopics.store_words")
        conn.execute("VACUUM ANALYZE storetopics.pending, storetopics.file_terms, storetopics.store_terms, "
                     "storetopics.store_state, storetopics.term_words, storetopics.store_words")
        settle(conn)

    # Catch-up is judged against the tokeniser's own speed on the same table in the same run (issue 17): the
    # "unattached" column of these rows is that reference (to_tsvector alone), and a full render against the fold.
    total = Metric("catchup", f"catch-up: backfill() of {words / 1e6:.1f}M words, vs to_tsvector alone", "words/s",
                   target=0.5, op=">=", higher_is_better=True)
    fold = Metric("fold", "  fold alone (recount + store terms), vs to_tsvector alone", "words/s", target=0.7,
                  op=">=", higher_is_better=True)
    render = Metric("render", "  render alone (keywords + summary, per store), vs fold alone", "s", target=0.2)
    reference = Metric("tsvector", "  to_tsvector alone (parallel scan, reference)", "words/s")
    one_file = Metric("render_one", "  render after a 1-file change, vs a render from scratch (per store)", "s",
                      target=0.05)
    secs_total, secs_fold, secs_render = [], [], []
    cpu: dict[str, list[float]] = {"backfill": [], "fold": [], "render": []}

    def timed(what: str, sql: str, params=(), until_zero: bool = False) -> float:
        c0, t0 = backend_cpu(conn), time.perf_counter()
        while True:
            rows = conn.execute(sql, params).fetchall()
            if not until_zero or rows[0][0] == 0:
                break
        secs = time.perf_counter() - t0
        c1 = backend_cpu(conn)
        if c0 is not None and c1 is not None:
            cpu[what].append(c1 - c0)
        return secs

    storage = None
    out: list = []
    for rep in range(cfg.catchup_reps):
        if rep > 0:
            fresh()
        else:
            settle(conn)
        secs_total.append(timed("backfill", "SELECT * FROM storetopics.backfill()"))
        if rep == 0:
            out = conn.execute("SELECT store_key FROM storetopics.store_state WHERE source_id = %s", (sid,)).fetchall()
            storage = bench_storage(conn, name, sid)
            folded = conn.execute("SELECT sum(files), sum(chunks), sum(words) FROM storetopics.store_state "
                                  "WHERE source_id = %s", (sid,)).fetchone()
            total.extra.update(stores=len(out), files=int(folded[0]), chunks=int(folded[1]),
                               counted_terms=int(folded[2]))
        fresh()
        secs_fold.append(timed("fold", "SELECT storetopics._fold(%s)", (sid,), until_zero=True))
        secs_render.append(timed("render", "SELECT * FROM storetopics.backfill()"))
        log(f"  rep {rep + 1}/{cfg.catchup_reps}: backfill {secs_total[-1]:.2f} s, fold {secs_fold[-1]:.2f} s, "
            f"render {secs_render[-1]:.2f} s (backend CPU s: "
            f"{', '.join(f'{k} {v[-1]:.1f}' for k, v in cpu.items() if v) or 'n/a'})")
    total.attached = [words / s for s in secs_total]
    fold.attached = [words / s for s in secs_fold]
    render.attached = secs_render
    total.extra.update(words=words, seconds=secs_total, pending_rows_before=pending, load_seconds=t_load,
                       backend_cpu_seconds=cpu["backfill"])
    fold.extra.update(seconds=secs_fold, backend_cpu_seconds=cpu["fold"])
    render.extra.update(backend_cpu_seconds=cpu["render"])

    def cpu_note(what: str) -> str:
        return f" Server process CPU {statistics.median(cpu[what]):.1f} s." if cpu[what] else ""

    total.note = (f"words = whitespace-separated words of the loaded texts ({words:,}); backfill() = fold every "
                  f"pending file + render each of the {len(out)} stores. Median {statistics.median(secs_total):.2f} s. "
                  f"The stores counted {total.extra['counted_terms']:,} terms (to_tsvector lexeme occurrences, "
                  f"after stopwords). First rep: the state right after the attached load; later reps: after "
                  f"storetopics.resync() and emptying storetopics.term_words and store_words (nothing folded or "
                  f"learnt)." + cpu_note("backfill"))
    fold.note = (f"fold() loop until 0 after storetopics.resync(), same words. Median "
                 f"{statistics.median(secs_fold):.2f} s." + cpu_note("fold"))
    render.note = ("backfill() right after the fold loop: renders every store (keywords(), learns surface words)."
                   + cpu_note("render"))
    # One uploaded file: fold it (untimed: fold's cost), then the render it makes due, against a store's render from
    # scratch (the render-alone time per store: nothing learnt, every piece computed).  Five uploads, one after the
    # other, each another store's file: their median (one render is ~0.1 s, where a single sample varied by half).
    store = out[0][0]
    donors = sorted({c.file_id for c in chunks if c.store != store})[:ONE_FILE_UPLOADS]
    new_file = max(c.file_id for c in chunks)
    secs_one, rendered = [], 0
    for donor_file in donors:
        donor = [c for c in chunks if c.file_id == donor_file][:cfg.chunks_per_file]
        new_file += 1
        with conn.cursor() as cur, cur.copy(f"COPY {name} ({COLUMNS}) FROM STDIN") as cp:
            cp.write("".join(c.copy_line(store=store, file_id=new_file) for c in donor).encode())
        conn.execute("SELECT storetopics._fold(%s)", (sid,))
        settle(conn)
        t0 = time.perf_counter()
        rendered = conn.execute("SELECT count(*) FROM storetopics.backfill()").fetchone()[0]
        secs_one.append(time.perf_counter() - t0)
    t_one = statistics.median(secs_one)
    one_file.attached = [t_one]
    one_file.unattached = [statistics.median(secs_render) / len(out)]
    one_file.extra.update(seconds=t_one, each=secs_one, stores_rendered=rendered, store=store)
    one_file.note = (f"{len(secs_one)} uploads one after the other, each {cfg.chunks_per_file} chunks of another "
                     f"store's file COPYed into {store} as a new file, folded (untimed), then backfill() "
                     f"({rendered} store(s) rendered): median {t_one:.3f} s "
                     f"({', '.join(f'{x:.3f}' for x in secs_one)}), against the render-alone time per store "
                     f"({one_file.unattached[0]:.2f} s). What a render recomputes whatever changed: every file's "
                     "novelty (keywords()) and the store's contrastive terms.")
    log(f"  render after a 1-file change: median {t_one:.3f} s of {len(secs_one)} ({rendered} store(s) each), "
        f"from scratch {one_file.unattached[0]:.2f} s per store")
    # The tokeniser alone, for reference: the same texts through to_tsvector with a parallel plan, nothing stored.
    # Beside it, two floors: what any exact fold written in SQL has to compute at least, timed the same way and
    # thrown away -- the lexeme occurrences (unnest of each tsvector), and the per-(file, term) counts that make a
    # deletion an exact subtraction (grouped by hashing, as the recount is, with the recount's parallel settings).
    # Each query runs twice, in the order A B C C B A; medians.
    settle(conn)
    reference_sql = f"SELECT sum(length(to_tsvector('english', content))) FROM {name}"
    floor_sql = {
        "floor_unnest": f"SELECT sum(cardinality(x.positions)) FROM {name} c, unnest(to_tsvector('english', c.content)) x",
        "floor_counts": f"SELECT count(*), sum(q.n) FROM (SELECT c.file_id, x.lexeme, sum(cardinality(x.positions)) AS n "
                        f"FROM {name} c, unnest(to_tsvector('english', c.content)) x GROUP BY 1, 2) q",
    }
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {reference_sql}").fetchall())
    query_secs: dict[str, list[float]] = {"reference": [], **{k: [] for k in floor_sql}}
    for key in ["reference", *floor_sql, *reversed(floor_sql), "reference"]:
        with conn.transaction():
            if key != "reference":
                for setting, value in {"parallel_setup_cost": "0", "parallel_tuple_cost": "0",
                                       "min_parallel_table_scan_size": "0", "jit": "off", "work_mem": "128MB"}.items():
                    conn.execute("SELECT set_config(%s, %s, true)", (setting, value))
            t0 = time.perf_counter()
            conn.execute(reference_sql if key == "reference" else floor_sql[key]).fetchone()
            query_secs[key].append(time.perf_counter() - t0)
    t_reference = statistics.median(query_secs["reference"])
    reference.attached = [words / t_reference]
    floors = []
    for key, label in (("floor_unnest", "  floor: to_tsvector + unnest (lexeme occurrences), vs to_tsvector alone"),
                       ("floor_counts", "  floor: per-(file, term) counts, computed and discarded, vs to_tsvector alone")):
        m = Metric(key, label, "words/s", higher_is_better=True)
        m.attached = [words / statistics.median(query_secs[key])]
        m.unattached = reference.attached
        m.extra.update(seconds=query_secs[key], reference_seconds=query_secs["reference"])
        m.note = (f"{floor_sql[key].replace(name, 'chunks')}: {statistics.median(query_secs[key]):.2f} s (median of 2, "
                  f"interleaved with the reference), the recount's parallel settings. The least an exact fold in SQL "
                  f"computes: it cannot be faster than this row.")
        floors.append(m)
    total.unattached = fold.unattached = reference.attached
    render.unattached = secs_fold
    reference.extra.update(seconds=t_reference, runs=query_secs["reference"], plan=plan)
    workers = re.search(r"Workers Planned: (\d+)", plan)
    reference.note = (f"{reference_sql.replace(name, 'chunks')}, the same table: {t_reference:.2f} s (median of 2), "
                      f"{'parallel, ' + workers.group(1) + ' workers planned' if workers else 'no parallel plan'}. "
                      "The cost of tokenising alone, which any fold built on to_tsvector pays.")
    log(f"  to_tsvector alone: {t_reference:.2f} s ({words / t_reference / 1e6:.2f} M words/s); floors: "
        + ", ".join(f"{m.key} {m.ratio:.3f}x" for m in floors))
    counts = floors[-1]
    vs_floor = Metric("fold_floor", "  fold vs its floor (fold alone / floor: per-(file, term) counts)", "words/s",
                      target=0.8, op=">=", higher_is_better=True)
    vs_floor.attached, vs_floor.unattached = fold.attached, counts.attached
    vs_floor.note = ("Row 5a against row 5e, same table, same run: what the fold does beyond computing the "
                     "per-(file, term) counts it cannot avoid (numbering the lexemes, the per-file arrays, the store "
                     "terms' difference, writing).")
    log(f"  fold {statistics.median(fold.attached) / 1e6:.2f} M words/s, floor_counts "
        f"{statistics.median(counts.attached) / 1e6:.2f} M words/s: fold/floor {vs_floor.ratio:.3f}")
    if explain:
        explain_fold(conn, name, sid, log)
    tables.drop(name)
    out_metrics = [total, fold, render, one_file, reference, *floors, vs_floor, storage]
    if kind != "debian":
        for m in out_metrics:
            m.key, m.name = f"{m.key}_{kind}", f"{m.name} [{kind}]"
            m.extra["text"] = kind
    return out_metrics


def bench_storage(conn, name: str, sid: int) -> Metric:
    conn.execute(f"VACUUM ANALYZE {name}")
    conn.execute("VACUUM ANALYZE storetopics.pending, storetopics.file_terms, storetopics.store_terms, "
                 "storetopics.store_state")
    parts = dict(conn.execute("""
        SELECT c, pg_total_relation_size(c::regclass) FROM unnest(ARRAY['storetopics.file_terms',
          'storetopics.store_terms', 'storetopics.store_state', 'storetopics.pending']) c""").fetchall())
    chunk_bytes = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()[0]
    state = sum(parts.values())
    listing = ", ".join(f"{k.split('.')[1]} {v / 1e6:.1f} MB" for k, v in parts.items())
    m = Metric("storage", "keyword state size vs chunk table", "MB", target=0.30, ratio_override=state / chunk_bytes,
               value_override=(float(state), float(chunk_bytes)),
               note=(f"attached = pg_total_relation_size of storetopics.file_terms + store_terms + store_state + "
                     f"pending ({listing}), "
                     f"after the first backfill and a VACUUM (the state tables compacted before the load); "
                     f"unattached = the chunk table incl. TOAST and indexes "
                     f"(primary key, file_id btree, no vector index). Only this source is in the state tables."))
    m.extra = {"parts": parts, "chunk_table": chunk_bytes}
    return m


def explain_fold(conn, name: str, sid: int, log) -> None:
    """Plans and timings of the statements fold() runs (auto_explain, nested statements), printed."""
    conn.execute("SELECT storetopics.resync(%s)", (name,))
    lines: list[str] = []
    conn.add_notice_handler(lambda d: lines.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for k, v in {"auto_explain.log_min_duration": "50", "auto_explain.log_analyze": "on",
                 "auto_explain.log_nested_statements": "on", "auto_explain.log_timing": "on",
                 "auto_explain.log_level": "notice", "client_min_messages": "notice"}.items():
        conn.execute(f"SET {k} = '{v}'")
    t0 = time.perf_counter()
    while conn.execute("SELECT storetopics._fold(%s)", (sid,)).fetchone()[0] > 0:
        pass
    t_fold = time.perf_counter() - t0
    t0 = time.perf_counter()
    conn.execute("SELECT * FROM storetopics.backfill()").fetchall()
    t_render = time.perf_counter() - t0
    conn.execute("SET auto_explain.log_min_duration = -1")
    conn.execute("SET client_min_messages = warning")
    log(f"--- auto_explain of fold ({t_fold:.2f} s) and render ({t_render:.2f} s), statements >= 50 ms ---")
    for ln in lines:
        if ln.startswith("duration"):
            log(ln)


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------
def cpu_times() -> list[int] | None:
    """The machine's CPU counters (/proc/stat): user nice system idle iowait irq softirq steal."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None


def machine_noise(before: list[int] | None, after: list[int] | None) -> dict:
    """How busy the machine was during the run (ours included) and how much CPU the hypervisor took (steal)."""
    if not before or not after:
        return {}
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = []
    return {"busy_share": round((total - d[3] - d[4]) / total, 3), "steal_share": round(d[7] / total, 3),
            "loadavg_at_end": load}


def sql_digest() -> str:
    """Short SHA-1 of the extension scripts in the working tree (what `make ext-install` installed), so a result can
    be tied to the exact SQL even when it was not committed."""
    import hashlib
    h = hashlib.sha1()
    for f in sorted((REPO / "sql").glob("storetopics--*.sql")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def environment(conn) -> dict:
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sql", "bgworker"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        git += "+dirty" if dirty else ""
    except OSError:
        git = "?"
    names = ["fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "work_mem",
             "maintenance_work_mem", "max_parallel_workers_per_gather", "max_worker_processes", "jit"]
    settings = dict(conn.execute("SELECT name, setting || coalesce(unit, '') FROM pg_settings "
                                 "WHERE name = ANY(%s)", (names,)).fetchall())
    return {
        "server_version": conn.execute("SHOW server_version").fetchone()[0],
        "vector": conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0],
        "storetopics": conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'storetopics'").fetchone()[0],
        "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "git": git, "sql_sha1": sql_digest(), "settings": settings, "throwaway_cluster_settings": FAST_SETTINGS,
        "dsn_from_env": bool(os.environ.get("STORETOPICS_TEST_DSN")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run; results not written to latest.md")
    ap.add_argument("--explain", action="store_true", help="also print auto_explain plans of fold()'s statements")
    ap.add_argument("--reps", type=int, help="repetitions of each attached/unattached pair")
    ap.add_argument("--only", help="comma list of: bulk,per_row,hnsw,concurrent,catchup "
                    "(`--only catchup`: the catch-up rows alone)")
    ap.add_argument("--text", default="debian,docs",
                    help="the catch-up's texts, comma list of: " + ",".join(TEXT_KINDS) + " (default both)")
    args = ap.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    if args.reps:
        cfg.reps = cfg.small_reps = cfg.hnsw_reps = cfg.concurrent_reps = args.reps
    only = set(args.only.split(",")) if args.only else {"bulk", "per_row", "hnsw", "concurrent", "catchup"}

    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()
    cpu0 = cpu_times()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    texts = [t for t in args.text.split(",") if t]
    if unknown := set(texts) - set(TEXT_KINDS):
        ap.error(f"unknown --text {','.join(sorted(unknown))}")
    # The write rows use the Debian chunks; the catch-up runs on each kind of text asked for.
    kinds = (["debian"] if only - {"catchup"} else []) + (texts if "catchup" in only else [])
    corpora: dict[str, list[Chunk]] = {}
    for kind in dict.fromkeys(kinds):
        log(f"building chunks: {TEXT_KINDS[kind][0]} ...")
        corpora[kind] = c = TEXT_KINDS[kind][1](cfg)
        log(f"  {len(c):,} chunks, {len({x.file_id for x in c}):,} files, {len({x.store for x in c})} stores, "
            f"{sum(len(x.content.split()) for x in c) / 1e6:.1f}M words, {sum(len(x.content) for x in c) / 1e6:.1f} MB "
            "of text")
    chunks = corpora.get("debian", [])

    metrics: list[Metric] = []
    with harness.server() as admin_dsn:
        db = harness.create_database(admin_dsn, prefix="bench")
        dsn = harness.with_db(admin_dsn, db)
        try:
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SET client_min_messages = warning")
                env = environment(conn)
                env["started"] = started.strftime("%Y-%m-%d %H:%M UTC")
                log(f"PostgreSQL {env['server_version']}, pgvector {env['vector']}, {env['cpus']} CPUs, "
                    f"fsync={env['settings'].get('fsync')}")
                tables = Tables(conn)
                if "bulk" in only:
                    log(f"1+3. bulk COPY {cfg.chunks:,} chunks, then DELETE {cfg.delete_files:,} files, "
                        f"{cfg.reps} reps")
                    ins, dele = bench_bulk_and_delete(conn, tables, cfg, chunks, log)
                    metrics += [ins]
                if "per_row" in only:
                    log(f"1b. {cfg.per_row:,} single-row INSERTs, {cfg.small_reps} reps")
                    metrics.append(bench_per_row(conn, tables, cfg, chunks, log))
                if "hnsw" in only:
                    log(f"2. COPY {cfg.hnsw_rows:,} chunks into an HNSW-indexed table, half attached, "
                        f"{cfg.hnsw_reps} reps")
                    metrics.append(bench_hnsw(conn, tables, cfg, chunks, log))
                if "bulk" in only:
                    metrics.append(dele)
                if "concurrent" in only:
                    log(f"4. {cfg.writers} concurrent writers, same store, {cfg.concurrent_reps} reps")
                    metrics += list(bench_concurrent(conn, dsn, tables, cfg, chunks, log))
                if "catchup" in only:
                    for kind in texts:
                        log(f"5+6. catch-up of {cfg.chunks:,} chunks ({kind}), {cfg.catchup_reps} reps; storage")
                        metrics += bench_catchup(conn, tables, cfg, corpora[kind], args.explain, log, kind=kind)
        finally:
            harness.drop_database(admin_dsn, db)

    elapsed = time.perf_counter() - t_start
    env["machine_during_run"] = machine_noise(cpu0, cpu_times())
    print()
    print_table(metrics)
    noise = env["machine_during_run"]
    print(f"total {elapsed:.0f} s; machine busy {noise.get('busy_share', 0):.0%} of the time, "
          f"CPU steal {noise.get('steal_share', 0):.0%}, load average at end {' '.join(noise.get('loadavg_at_end', []))}")

    result = {"started": started.isoformat(), "elapsed_seconds": elapsed, "quick": args.quick,
              "config": cfg.__dict__, "environment": env, "metrics": [m.as_dict() for m in metrics]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    suffix = "-quick" if args.quick else ""
    path = RESULTS / f"bench-{stamp}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    if not args.quick and not args.only:
        (RESULTS / "latest.md").write_text(markdown(metrics, env, cfg, elapsed))
        print(f"wrote {(RESULTS / 'latest.md').relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
