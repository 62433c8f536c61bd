"""`make bench` (catalog): does rendering one store cost the same in a catalog of 10 stores and of 10,000?

Issue 14's target: one store of a 10,000-store catalog renders in the same time (± 20%) as one of a 10-store
catalog.  One throwaway cluster, two chunk tables (two sources: each source is its own catalog by default):

* `chunks_small`: the probe store + 9 small stores (a 10-store catalog);
* `chunks_large`: the same probe store + the same 9 small stores + 9,990 more (a 10,000-store catalog).

The probe store is identical in both (the same files, texts and vectors): a few hundred files of a few thousand
words of real text (Debian package descriptions, data/debian).  A small store is a few files of one Debian
section's descriptions (stores are dealt the 34 sections round-robin, so neighbours share a vocabulary, as real
stores of one application do).  Both tables are loaded with binary COPY, attached (which logs a resync), and folded
completely with storetopics._fold(); then `storetopics.backfill(store_key => 'probe')` clusters and renders the
probe in both.  The 9,990 other stores are folded (they are the catalog's background, catalog_terms) but not
rendered: rendering them is not what is measured.

Then the probe store is rendered with `SELECT storetopics._render(source, 'probe')` — the call backfill() and the
worker (work_render) make — repeatedly, the two catalogs interleaved A B, B A, A B, ... (after one untimed warm-up
each).  Each render recomputes everything (keywords, contrast with the catalog, packing) and writes only when the
text changed (here: never after the first).  Reported: each side's median, the ratio large/small taken within
each adjacent pair, then the median of those, and the server process's CPU seconds per side.  The same for the 9
small stores both catalogs share (information: a small store is where a per-catalog cost would weigh most).

    .venv/bin/python -m bench.catalog             # 10 vs 10,000 stores (what `make bench` runs)
    .venv/bin/python -m bench.catalog --quick     # 10 vs 1,000 stores, a smaller probe, fewer pairs
    .venv/bin/python -m bench.catalog --explain   # also print EXPLAIN ANALYZE of contrast_terms() in both catalogs

Writes bench/results/catalog-<stamp>.json and (not for --quick) bench/results/catalog-latest.md.  See
bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench.run import backend_cpu, cpu_times, environment, machine_noise, settle
from storetopics import install as st_install
from tests import harness

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CORPUS = REPO / "data" / "debian" / "descriptions.jsonl.gz"
DIM = 384
TARGET = 0.20          # |ratio - 1| <= 20%
PROBE = "probe"


@dataclass
class Config:
    large_stores: int = 10_000      # stores of the large catalog (the probe included)
    small_stores: int = 10          # stores of the small catalog (the probe included)
    probe_files: int = 300
    probe_chunks_per_file: int = 5
    probe_words_per_chunk: int = 400
    other_files: int = 3            # files of every other store
    other_chunks_per_file: int = 2
    other_words_per_chunk: int = 200
    pairs: int = 12                 # timed render pairs of the probe (A B, B A, ...)
    small_pairs: int = 3            # timed passes over the shared small stores
    seed: int = 20241214

    @classmethod
    def quick(cls) -> Config:
        return cls(large_stores=1_000, probe_files=60, pairs=4, small_pairs=2)


_WORD = re.compile(r"\S+\s*")


class Texts:
    """Streams of words from the Debian descriptions, one per section, each in a seeded shuffled order (reshuffled
    when exhausted), whitespace kept, descriptions separated by a blank line."""

    def __init__(self, seed: int):
        records = [json.loads(line) for line in gzip.open(CORPUS, "rt", encoding="utf-8")]
        self.sections = sorted({r["section"] for r in records})
        self.by_section = {s: [r["long"] for r in records if r["section"] == s] for s in self.sections}
        self.rng = random.Random(seed)
        self.streams = {s: self._stream(s) for s in self.sections}

    def _stream(self, section: str):
        order = list(self.by_section[section])
        while True:
            self.rng.shuffle(order)
            for t in order:
                pieces = _WORD.findall(t)
                if pieces:
                    pieces[-1] = pieces[-1].rstrip() + "\n\n"
                yield from pieces

    def chunk(self, section: str, words: int) -> str:
        s = self.streams[section]
        return "".join(next(s) for _ in range(words)).strip()


def unit_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def build_rows(cfg: Config) -> tuple[list[tuple], list[tuple], dict]:
    """The probe's rows and the other stores' rows: (store, file, chunk_no, content, vector index).  The probe reads
    three sections (a store about a few things); store j of the others reads section j mod 34.  File keys are
    unique within a table; the probe's are the same in both tables."""
    texts = Texts(cfg.seed)
    secs = texts.sections
    probe_secs = [secs[3], secs[11], secs[20]]
    probe: list[tuple] = []
    for f in range(cfg.probe_files):
        sec = probe_secs[f % len(probe_secs)]
        for k in range(cfg.probe_chunks_per_file):
            probe.append((PROBE, f"p{f:05d}", k, texts.chunk(sec, cfg.probe_words_per_chunk)))
    others: list[tuple] = []
    for j in range(cfg.large_stores - 1):
        sec = secs[j % len(secs)]
        for f in range(cfg.other_files):
            for k in range(cfg.other_chunks_per_file):
                others.append((f"s{j:05d}", f"s{j:05d}-{f}", k, texts.chunk(sec, cfg.other_words_per_chunk)))
    words = {"probe": sum(len(r[3].split()) for r in probe), "others": sum(len(r[3].split()) for r in others)}
    return probe, others, words


def create_table(conn, name: str) -> None:
    conn.execute(f"""
        CREATE TABLE {name} (id bigserial PRIMARY KEY, store_id text NOT NULL, file_id text NOT NULL,
                             chunk_no int NOT NULL, content text NOT NULL, embedding vector({DIM}))
          WITH (autovacuum_enabled = false)""")


def load(conn, name: str, rows: list[tuple], vecs: np.ndarray, offset: int) -> None:
    """Binary COPY; row i gets vector (offset + i) mod len(vecs) (the vectors of the other stores matter to no
    measurement: they are too small to be clustered)."""
    with conn.cursor() as cur, cur.copy(f"COPY {name} (store_id, file_id, chunk_no, content, embedding) "
                                        "FROM STDIN WITH (FORMAT BINARY)") as cp:
        cp.set_types(["text", "text", "int4", "text", "vector"])
        for i, (s, f, k, text) in enumerate(rows):
            cp.write_row((s, f, k, text, vecs[(offset + i) % len(vecs)]))


def timed_render(conn, source: int, store: str) -> tuple[float, float | None, bool | None]:
    c0, t0 = backend_cpu(conn), time.perf_counter()
    changed = conn.execute("SELECT storetopics._render(%s, %s)", (source, store)).fetchone()[0]
    secs = time.perf_counter() - t0
    c1 = backend_cpu(conn)
    return secs, (None if c0 is None or c1 is None else c1 - c0), changed


def explain_contrast(conn, sources: dict[str, int], log) -> dict[str, str]:
    """EXPLAIN ANALYZE of the statements render() runs for the probe (auto_explain, nested statements >= 5 ms)."""
    plans = {}
    conn.execute("LOAD 'auto_explain'")
    for side, sid in sources.items():
        lines: list[str] = []
        handler = lambda d: lines.append(d.message_primary or "")  # noqa: E731
        conn.add_notice_handler(handler)
        for k, v in {"auto_explain.log_min_duration": "5", "auto_explain.log_analyze": "on",
                     "auto_explain.log_nested_statements": "on", "auto_explain.log_buffers": "on",
                     "auto_explain.log_level": "notice", "client_min_messages": "notice"}.items():
            conn.execute(f"SET {k} = '{v}'")
        conn.execute("SELECT storetopics._render(%s, %s)", (sid, PROBE))
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.execute("SET client_min_messages = warning")
        conn.remove_notice_handler(handler)
        plans[side] = "\n\n".join(ln for ln in lines if ln.startswith("duration"))
        log(f"--- {side} catalog: render()'s statements >= 5 ms ---\n{plans[side]}")
    return plans


def digests(conn, sources: dict[str, int], stores: list[str]) -> dict[str, str]:
    """MD5 of what render wrote for these stores (store_topics and topics, less the fit's timestamp), per catalog:
    two runs of the same data and SQL agree byte for byte, so a change to render's SQL can be checked for the very
    same output."""
    return {side: conn.execute(
        "SELECT md5(string_agg(st.store_key || E'\\n' || coalesce(st.store_topics, '') || E'\\n' || "
        "(st.topics #- '{fit,at}')::text, E'\\n' ORDER BY st.store_key)) FROM storetopics.store_state st "
        "WHERE st.source_id = %s AND st.store_key = ANY(%s)", (sid, stores)).fetchone()[0]
        for side, sid in sources.items()}


def summarise(a: list[float], b: list[float]) -> dict:
    pairs = [y / x for x, y in zip(a, b) if x]
    ratio = statistics.median(pairs) if pairs else None
    return {"small": a, "large": b, "median_small": statistics.median(a), "median_large": statistics.median(b),
            "pair_ratios": [round(r, 4) for r in pairs], "ratio": ratio,
            "status": "PASS" if ratio is not None and abs(ratio - 1) <= TARGET else "MISS"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.catalog", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 vs 1,000 stores, smaller probe; not written to latest.md")
    ap.add_argument("--stores", type=int, help="stores of the large catalog (default 10,000)")
    ap.add_argument("--pairs", type=int, help="timed render pairs of the probe (default 12)")
    ap.add_argument("--explain", action="store_true", help="print the plans of render()'s statements in both catalogs")
    args = ap.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    if args.stores:
        cfg.large_stores = args.stores
    if args.pairs:
        cfg.pairs = args.pairs
    assert cfg.large_stores > cfg.small_stores >= 2

    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()
    cpu0 = cpu_times()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    log("building rows from data/debian/descriptions.jsonl.gz ...")
    probe, others, words = build_rows(cfg)
    vecs = unit_vectors(4096, cfg.seed)
    shared = others[:(cfg.small_stores - 1) * cfg.other_files * cfg.other_chunks_per_file]
    shared_stores = sorted({r[0] for r in shared})
    log(f"  probe: {cfg.probe_files} files, {len(probe):,} chunks, {words['probe']:,} words; "
        f"{cfg.large_stores - 1:,} other stores: {len(others):,} chunks, {words['others']:,} words")

    out: dict = {"started": started.isoformat(), "quick": args.quick, "config": asdict(cfg), "words": words,
                 "target": f"|large/small - 1| <= {TARGET:.0%}"}
    with harness.server() as admin_dsn:
        db = harness.create_database(admin_dsn, prefix="bench_catalog")
        dsn = harness.with_db(admin_dsn, db)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                # clustering inside the database (backfill fits the probe) where plpython3u is installed
                try:
                    conn.execute("CREATE EXTENSION plpython3u")
                except psycopg.Error as e:
                    log(f"  no plpython3u ({e.diag.message_primary}): the probe is not clustered")
            st_install.install(dsn, extension=True, log=lambda *a: None)
            with psycopg.connect(dsn, autocommit=True) as conn:
                register_vector(conn)
                conn.execute("SET client_min_messages = warning")
                env = environment(conn)
                out["environment"] = env
                log(f"PostgreSQL {env['server_version']}, pgvector {env['vector']}, {env['cpus']} CPUs")
                # -- load -------------------------------------------------------------------------------------
                load_s: dict[str, dict] = {}
                sources: dict[str, int] = {}
                for side, rows in (("small", shared), ("large", others)):
                    name = f"chunks_{side}"
                    t0 = time.perf_counter()
                    create_table(conn, name)
                    load(conn, name, probe, vecs, 0)
                    load(conn, name, rows, vecs, len(probe))
                    conn.execute(f"CREATE INDEX ON {name} (file_id)")
                    conn.execute(f"VACUUM ANALYZE {name}")
                    t_copy = time.perf_counter() - t0
                    sources[side] = conn.execute(
                        "SELECT storetopics.attach(%s, store_key => 'store_id', file_key => 'file_id', "
                        "content => 'content', embedding => 'embedding')", (name,)).fetchone()[0]
                    settle(conn)
                    t0 = time.perf_counter()
                    calls = 0
                    while conn.execute("SELECT storetopics._fold(%s)", (sources[side],)).fetchone()[0] > 0:
                        calls += 1
                    t_fold = time.perf_counter() - t0
                    load_s[side] = {"rows": len(probe) + len(rows), "copy_seconds": round(t_copy, 2),
                                    "fold_seconds": round(t_fold, 2), "fold_calls": calls}
                    log(f"  {name}: {len(probe) + len(rows):,} rows, COPY + index {t_copy:.1f} s, "
                        f"fold {t_fold:.1f} s ({calls} calls)")
                conn.execute("VACUUM ANALYZE storetopics.file_terms, storetopics.store_terms, storetopics.store_state, "
                             "storetopics.catalog_terms, storetopics.lexemes")
                t0 = time.perf_counter()
                rendered = conn.execute("SELECT source_id, store, changed, clusters FROM "
                                        "storetopics.backfill(store_key => %s)", (PROBE,)).fetchall()
                t_backfill = time.perf_counter() - t0
                log(f"  backfill(store_key => 'probe'): {t_backfill:.1f} s, {rendered}")
                out["load"] = load_s
                out["probe_backfill_seconds"] = round(t_backfill, 2)
                sizes = {}
                for side, sid in sources.items():
                    cat = conn.execute("SELECT storetopics._catalog(%s)", (sid,)).fetchone()[0]
                    sizes[side] = dict(zip(
                        ("catalog", "stores", "files", "chunks", "catalog_terms", "store_terms"),
                        conn.execute("""
                            SELECT %s, count(*), sum(files), sum(chunks),
                                   (SELECT count(*) FROM storetopics.catalog_terms WHERE catalog = %s),
                                   (SELECT count(*) FROM storetopics.store_terms WHERE source_id = %s)
                              FROM storetopics.store_state WHERE source_id = %s""",
                                     (cat, cat, sid, sid)).fetchone()))
                    sizes[side] = {k: (int(v) if k != "catalog" else v) for k, v in sizes[side].items()}
                    probe_row = conn.execute(
                        "SELECT store_topics, topics -> 'contrast', fit_k FROM storetopics.store_state "
                        "WHERE source_id = %s AND store_key = %s", (sid, PROBE)).fetchone()
                    sizes[side]["probe_summary"] = probe_row[0]
                    sizes[side]["probe_fit_k"] = probe_row[2]
                    sizes[side]["probe_terms"] = conn.execute(
                        "SELECT count(*) FROM storetopics.store_terms WHERE source_id = %s AND store_key = %s",
                        (sid, PROBE)).fetchone()[0]
                    log(f"  {side} catalog {cat}: {sizes[side]['stores']:,} stores, {sizes[side]['files']:,} files, "
                        f"{sizes[side]['catalog_terms']:,} catalog terms; probe: {sizes[side]['probe_terms']:,} "
                        f"terms, summary: {probe_row[0]!r}")
                out["sizes"] = sizes
                # the shared small stores are rendered once (untimed) in both catalogs: their first render learns
                # surface words; later ones are the steady state, like the probe's
                for sid in sources.values():
                    for s in shared_stores:
                        conn.execute("SELECT storetopics._render(%s, %s)", (sid, s))
                # -- the probe, interleaved ---------------------------------------------------------------------
                settle(conn)
                for side in ("small", "large"):
                    timed_render(conn, sources[side], PROBE)   # warm-up: plans cached, words learnt
                secs = {"small": [], "large": []}
                cpu: dict[str, list[float]] = {"small": [], "large": []}
                changed = []
                for i in range(cfg.pairs):
                    for side in (("small", "large") if i % 2 == 0 else ("large", "small")):
                        t, c, ch = timed_render(conn, sources[side], PROBE)
                        secs[side].append(round(t, 5))
                        if c is not None:
                            cpu[side].append(round(c, 3))
                        changed.append(ch)
                    log(f"  pair {i + 1}/{cfg.pairs}: small {secs['small'][-1] * 1000:.0f} ms, "
                        f"large {secs['large'][-1] * 1000:.0f} ms")
                res = summarise(secs["small"], secs["large"])
                if len(cpu["small"]) == len(cpu["large"]) == cfg.pairs:
                    res["cpu"] = summarise(cpu["small"], cpu["large"])
                res["changed"] = changed
                out["probe_render"] = res
                # -- the shared small stores -----------------------------------------------------------------------
                ss = {"small": [], "large": []}
                for i in range(cfg.small_pairs):
                    for s in shared_stores:
                        for side in (("small", "large") if i % 2 == 0 else ("large", "small")):
                            ss[side].append(round(timed_render(conn, sources[side], s)[0], 5))
                out["small_store_render"] = summarise(ss["small"], ss["large"])
                out["small_store_render"]["stores"] = shared_stores
                out["digests"] = digests(conn, sources, [PROBE] + shared_stores)
                log(f"  digests of what render wrote: {out['digests']}")
                if args.explain:
                    out["plans"] = explain_contrast(conn, sources, log)
        finally:
            harness.drop_database(admin_dsn, db)

    elapsed = time.perf_counter() - t_start
    out["elapsed_seconds"] = round(elapsed, 1)
    out["machine_during_run"] = machine_noise(cpu0, cpu_times())
    md = markdown(out, cfg, started)
    print()
    print(md)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    path = RESULTS / f"catalog-{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    if not args.quick:
        (RESULTS / "catalog-latest.md").write_text(md)
        print(f"wrote {(RESULTS / 'catalog-latest.md').relative_to(REPO)}")
    return 0


def markdown(out: dict, cfg: Config, started: dt.datetime) -> str:
    env, sz, pr, sm = out["environment"], out["sizes"], out["probe_render"], out["small_store_render"]
    ld, noise = out["load"], out["machine_during_run"]

    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    rows = [f"# Catalog benchmark ({started:%Y-%m-%d %H:%M} UTC, {env['cpus']} CPUs)", "",
            f"PostgreSQL {env['server_version']}, pgvector {env['vector']}, storetopics {env['storetopics']} "
            f"(git {env['git']}, sql sha1 {env['sql_sha1']}), total {out['elapsed_seconds']:.0f} s. "
            "`storetopics._render(source, store)` of the same store in a catalog of "
            f"{sz['small']['stores']:,} stores and in one of {sz['large']['stores']:,}, interleaved (A B, B A, ...); "
            "ratio = median of the large/small ratios of adjacent renders. See bench/README.md.", "",
            "| what | 10-store catalog | large catalog | ratio | target | PASS/MISS |",
            "|---|---:|---:|---:|---|:---:|",
            f"| render the probe store ({pr['small'].__len__()} pairs), median | {ms(pr['median_small'])} | "
            f"{ms(pr['median_large'])} | {pr['ratio']:.3f}× | 0.8–1.2× | {pr['status']} |"]
    if "cpu" in pr:
        c = pr["cpu"]
        rows.append(f"| … server process CPU, median | {c['median_small'] * 1000:.0f} ms | "
                    f"{c['median_large'] * 1000:.0f} ms | {c['ratio']:.3f}× | info | |")
    rows += [f"| render one of the {len(sm['stores'])} small stores both catalogs share ({cfg.small_pairs} passes), "
             f"median | {ms(sm['median_small'])} | {ms(sm['median_large'])} | {sm['ratio']:.3f}× | info | |", "",
             "Details:", "",
             f"- Per-pair ratios (probe): {', '.join(f'{x:.3f}' for x in pr['pair_ratios'])}.",
             f"- Probe store: {cfg.probe_files} files of {cfg.probe_chunks_per_file} chunks of "
             f"{cfg.probe_words_per_chunk} words (Debian descriptions of 3 sections, {out['words']['probe']:,} words), "
             f"{sz['small']['probe_terms']:,} terms, K = {sz['small']['probe_fit_k']}; identical in both tables.",
             f"- Other stores: {cfg.other_files} files of {cfg.other_chunks_per_file} chunks of "
             f"{cfg.other_words_per_chunk} words each, one Debian section per store (round-robin).",
             *[f"- {side} catalog `{sz[side]['catalog']}`: {sz[side]['stores']:,} stores, {sz[side]['files']:,} files, "
               f"{sz[side]['chunks']:,} chunks, {sz[side]['catalog_terms']:,} rows in catalog_terms, "
               f"{sz[side]['store_terms']:,} in store_terms; loaded in {ld[side]['copy_seconds']} s (binary COPY + "
               f"index), folded in {ld[side]['fold_seconds']} s ({ld[side]['fold_calls']} fold() calls)."
               for side in ("small", "large")],
             f"- backfill(store_key => 'probe') (clusters and renders the probe in both): "
             f"{out['probe_backfill_seconds']} s.",
             f"- The probe's summary, 10-store catalog: `{sz['small']['probe_summary']}`",
             f"- The probe's summary, large catalog: `{sz['large']['probe_summary']}`",
             f"- Machine during the run: busy {noise.get('busy_share', 0):.0%} of CPU time, steal "
             f"{noise.get('steal_share', 0):.0%}, load average at the end {' '.join(noise.get('loadavg_at_end', []))}.",
             ""]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
