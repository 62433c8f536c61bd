"""`make bench` (scale): the scaling curve of issues 17 and 33, one source with one dominant store at 10k, 100k, 1M
chunks (`make bench-large` adds 5M), 384-d vectors, on one of two texts (--text):

- short (issue 17, the default): 10 words per chunk, 10 chunks per file;
- docs (issue 33): realistic text, 200-300 words per chunk, windows of real manuals (bench.doctext: the document
  corpus of scripts/doc_corpus.py, built when missing; one product per vector centre), 3 chunks per file (the seed
  deployment has 1.4M chunks in ~540k files).

Everything else is the same code, the same steps and the same report, parameterised by the text.

For each size, a fresh database in one throwaway cluster:

1. Load: the chunk table (primary key, index on the file key) is attached first, then loaded with COPY, 1,000 files
   (10,000 chunks) per statement, each its own transaction: the capture trigger runs (attached load).  The rows are
   bench.clusters' synthetic chunks (vectors around 20 centres, each file's chunks from one centre), 90% of the
   files in store `big`, the other 10% in 5 small stores (2% each; every store holds all 20 themes).  Short text:
   each chunk says its centre's two words and WORDS_FILLER words drawn (Zipf, s = 1) from the 5,000 commonest words
   of the Debian descriptions.  Docs: each chunk is a 200-300-word window of the manual of product t % themes for
   centre t (bench.doctext.DocTexts; the 17 products for 20 centres: centres 17-19 share the text of 0-2 but not their
   vectors).  Rows are generated outside the timed COPY.
2. Backfill, step by step as `storetopics backfill`'s pass does it, each step in a fresh connection (so each
   backend's VmHWM is that step's own): fold (`storetopics._fold(source)` until 0), fit (`storetopics._cluster` of every
   store whose fit is due, inside Postgres via plpython3u), words (`refresh_words`), labels (`refresh.label`, the
   Anthropic labeller through the SDK against the local Messages API server), render (`refresh.render`, store by
   store: `big` first, and its time alone is the render from scratch of section 3b).  Peak
   memory: each step's backend VmHWM, and the largest VmHWM of any server process (parallel workers included)
   sampled every 0.2 s.  VmHWM counts the shared buffers a process touched (shared_buffers = 256 MB).
3. State size: after a VACUUM ANALYZE (what autovacuum does to storetopics' tables), pg_total_relation_size of
   STATE_TABLES (the term counts, the files' chunks per cluster, the catalog's, the vocabulary, the clusters and the
   kept novelty; every storetopics table in the JSON) vs. the chunk table's (heap, TOAST, primary key and file
   index; no vector index); and of it STATE_FLOOR_TABLES, the exact counts as these tables store them (each file's
   term counts, the store-wide term table, the terms' names: a row each), the part of the state the rest is added to.
3b. One upload's pass by hand, UPLOADS_BY_HAND times, step by step (fold, refresh_words, render; when new words need
   counting, tiktoken and render again, in the same transaction as refresh.render does it).  The render of `big`
   after a 1-file upload (render + count + render again) is compared with its render from scratch: the backfill's
   render of `big` (step 2), the first render of its state, when nothing a render keeps is there yet (no token
   counts, no rendered summary; the SQL has no way to drop what a render keeps, so a later render "from scratch"
   cannot be forced).  Targets (issue 33): after an upload <= 5% of from scratch, and <= 2 s at 1M.  The uploads
   follow one another as on a store that gets one every minute, and after each render the pass keeps the store's
   novelty again when the uploads piled up since make renders dearer than a keep (refresh.keep_worn, timed apart:
   the summary is written by then): the median is over all of them, the 1st, 30th, 60th and last, the 90th
   percentile and the uploads after which the novelty was kept again are shown.  Each uploaded file holds one word
   no file held before (a made-up name, in its first chunk): a real upload brings some (names, codes, new terms),
   and the windows of the same manuals seldom do once their vocabulary is in (a term id past the kept document
   frequencies took a render that never met one from 62 to 171 ms at 10k chunks: bench/README.md).
3c. The same, MIXED_UPLOADS times, each upload to `big` after MIXED_OTHERS to the small stores (folded with it): the
   other stores' files grow the catalog, which moves the bound the kept contrast head vouches for, the more so the
   bigger `big`'s part of it (bench/README.md); the render keeps the head again past a point, and the row counts the
   renders that did.  Information, no target.
4. Event -> summary: a `storetopics worker` process (debounce 1 s, --poll 1), one new file (10 or 3 chunks) of an existing
   theme copied into `big`, EVENTS times, one at a time: from the COPY's commit until NOTIFY storetopics_updated for
   `big` arrives with the new file counted in store_state.topics (the rendered files count, which every upload moves;
   the text itself says "100k files" and need not change).  The worker's own "pass" log line gives how much of it
   was the pass (fold + refresh + render) rather than the debounce and the wake-up.
5. Re-fit by the worker: a new theme (6% of `big`'s chunks, over refit_outliers = 5%) copied in one statement; time
   from its commit until the NOTIFY of the re-fitted summary (the worker fits outside the database: sample read,
   KMeans in the worker process, apply_fit).  The worker's VmHWM (and its backends') after 4 and after 5.

Per-chunk cost = backfill seconds (fold + fit + words + labels + render) / chunks; its growth per decade is the ratio
of consecutive sizes' per-chunk costs scaled to one decade ((c2/c1) ** (1/log10(n2/n1))).  Targets: <= 1.3x per
decade; every peak <= 1 GB.

    python -m bench.scale [--text short|docs] [--sizes 10000,100000,1000000] [--events 10] [--quick]
    python -m bench.scale --replot bench/results/scale-<stamp>.json     # rewrite scale-latest.md and scale.png
Results: bench/results/scale-<stamp>.json, scale-latest.md, scale.png; with --text docs scale-docs-<stamp>.json,
scale-docs-latest.md, scale-docs.png (not for --quick: its JSON only).
"""
from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from bench import clusters as bc
from bench import doctext
from bench.worker import wait_quiet
from storetopics import install as st_install
from storetopics import refresh
from tests import harness
from tests.fakes.messages import MessagesServer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CHUNKS_PER_COPY = 10_000               # rows per COPY statement (short text: 1,000 files)
WORDS_FILLER = 8                       # + the centre's two words: 10 words per chunk
UPLOADS_BY_HAND = 100                  # 3b: one-file uploads passed by hand (render after an upload: their median;
                                       # what render keeps is kept before the first; later uploads pile up until the
                                       # pass keeps the novelty again, refresh.keep_worn)
MIXED_UPLOADS = 20                     # 3c: the same, with MIXED_OTHERS uploads to the small stores before each
MIXED_OTHERS = 2
VOCABULARY = 5_000
SMALL_STORES = 5                       # 2% of the files each; `big` has the other 90%
DEBOUNCE = 1.0
POLL = 1.0
NEW_THEME = "zulu yankee xray whiskey"
TARGET_GROWTH = 1.3
TARGET_MB = 1024
TARGET_RENDER_RATIO = 0.05             # render after a 1-file upload / render from scratch
TARGET_RENDER_S = 2.0                  # render after a 1-file upload at 1M chunks
# what storetopics keeps about the data (the kept novelty of issue 33 included); not the tokenizer's fixed ranks
# (cl100k), the fit's scratch table (file_means) or the configuration and worker tables
STATE_TABLES = ("file_terms", "file_clusters", "store_terms", "store_state", "clusters", "pending", "catalog_terms",
                "catalog_touched", "lexemes", "term_words", "store_words", "token_counts", "novelty_state",
                "file_novelty", "novelty_postings")


# the exact counts, whatever else is kept, as these tables store them (a row per file, per store term, per term name):
# each file's term counts (what a deletion subtracts), the store-wide term table (each term's files and counts: its
# IDF) and the names of the terms those two number
STATE_FLOOR_TABLES = ("file_terms", "store_terms", "lexemes")


def state_bytes(state: dict, tables: tuple[str, ...] = STATE_TABLES) -> int:
    """The state's bytes from a result's sizes by table (STATE_TABLES, also for results of an older list)."""
    return sum(state["by_table_bytes"].get(t, 0) for t in tables)


# -- the data ------------------------------------------------------------------------------------------------------
def vocabulary(n: int = VOCABULARY) -> list[str]:
    """The n commonest lower-case words (3-12 letters) of the Debian descriptions (data/debian)."""
    counts: Counter = Counter()
    with gzip.open(REPO / "data" / "debian" / "descriptions.jsonl.gz", "rt") as f:
        for line in f:
            d = json.loads(line)
            counts.update(w for w in re.findall(r"[a-z]{3,12}", (d.get("short", "") + " " + d.get("long", "")).lower()))
    return [w for w, _ in counts.most_common(n)]


def new_word(n: int) -> str:
    """A made-up name for upload n, in letters only (a word of its own for to_tsvector), never in the corpus."""
    letters = ""
    while True:
        n, r = divmod(n, 26)
        letters += chr(ord("a") + r)
        if n == 0:
            return "qzv" + letters


def with_new_word(rows, n: int) -> list:
    """The rows of an uploaded file (synth.rows), its first chunk ending in new_word(n)."""
    rows = list(rows)
    i, store, file, content, vector = rows[0]
    rows[0] = (i, store, file, content + " " + new_word(n), vector)
    return rows


def store_of(file_ids: np.ndarray) -> list[str]:
    """Blocks of CENTRES consecutive files (one of each theme) are dealt to the stores, 45 of every 50 blocks to
    `big` and one each to the small stores: every store holds every theme, in the same proportions."""
    h = (file_ids // bc.CENTRES) % 50
    return ["big" if x < 50 - SMALL_STORES else f"small{x - 50 + SMALL_STORES}" for x in h.tolist()]


class Texts:
    """The centre's two words (as bench.clusters says them) and WORDS_FILLER Zipf-drawn common words, per chunk."""

    def __init__(self, seed: int):
        self.words = np.array(vocabulary())
        p = 1.0 / np.arange(1, len(self.words) + 1)
        self.p = p / p.sum()
        self.rng = np.random.default_rng(seed + 1000)

    def filler(self, n: int) -> list[str]:
        idx = self.rng.choice(len(self.words), size=(n, WORDS_FILLER), p=self.p)
        return [" ".join(r) for r in self.words[idx].tolist()]

    def __call__(self, topics: np.ndarray, n: int) -> list[str]:
        return [f"{bc.THEMES[t]} {bc.THEMES[(t + 7) % bc.CENTRES]} {f}" for t, f in zip(topics.tolist(), self.filler(n))]

    def new_theme(self, n: int) -> list[str]:
        return [f"{NEW_THEME[:11]} {f}" for f in self.filler(n)]      # "zulu yankee" + filler


@dataclass(frozen=True)
class TextKind:
    """What the chunks say (--text): how many make a file, how the report describes them, where results go."""
    name: str
    per_file: int
    words_per_chunk: float
    describe: str
    suffix: str                        # scale<suffix>-<stamp>.json, scale<suffix>-latest.md, scale<suffix>.png

    def texts(self, seed: int):
        return Texts(seed) if self.name == "short" else doctext.DocTexts(seed)


TEXTS = {
    "short": TextKind("short", 10, 2 + WORDS_FILLER,
                      f"short synthetic text: {2 + WORDS_FILLER} words per chunk (the centre's 2 + {WORDS_FILLER} "
                      "Zipf-drawn common words of the Debian descriptions)", ""),
    "docs": TextKind("docs", 3, (doctext.MIN_WORDS + doctext.MAX_WORDS) / 2,
                     f"realistic text: {doctext.MIN_WORDS}–{doctext.MAX_WORDS} words per chunk, windows of real "
                     "manuals (bench.doctext: Debian's documentation of 17 products, one product per vector centre, "
                     "the centre's number modulo 17)", "-docs"),
}


def text_kind(res: dict) -> TextKind:
    """The text a result was measured on (results from before --text are the short text)."""
    return TEXTS[res.get("text", {}).get("name", "short")]


# -- memory --------------------------------------------------------------------------------------------------------
def proc_kb(pid: int, key: str = "VmHWM:") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def ppid(pid: int) -> int | None:
    return proc_kb(pid, "PPid:")


class ServerSampler:
    """Every 0.2 s, the VmHWM of every child of the postmaster (backends, parallel workers, checkpointer...): the
    largest per step (`step` is set by the caller) and which kind of process had it."""

    def __init__(self, postmaster: int):
        self.postmaster = postmaster
        self.step = None
        self.peaks: dict[str, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._th.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join(2)

    def _run(self):
        while not self._stop.is_set():
            step = self.step
            if step:
                for d in os.listdir("/proc"):
                    if not d.isdigit():
                        continue
                    try:
                        text = Path(f"/proc/{d}/status").read_text()
                        if f"\nPPid:\t{self.postmaster}\n" not in text:
                            continue
                        hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1))
                        cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    except (OSError, AttributeError):
                        continue
                    if hwm > self.peaks.get(step, (0, ""))[0]:
                        self.peaks[step] = (hwm, " ".join(cmd.split()[:3])[:60])
            self._stop.wait(0.2)


def mb(kb: int | None) -> float | None:
    return round(kb / 1024, 1) if kb else None


# -- one size ------------------------------------------------------------------------------------------------------
def connect(dsn: str, vector: bool = True) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET client_min_messages = warning")
    if vector:
        register_vector(conn)
    return conn


def backend_pid(conn) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def percentile(xs, p):
    return float(np.percentile(np.array(xs), p)) if xs else None


def big_state(conn, source: int) -> tuple[int, int, int]:
    return conn.execute("SELECT (topics ->> 'files')::int, fit_generation, files FROM storetopics.store_state "
                        "WHERE source_id = %s AND store_key = 'big'", (source,)).fetchone()


def wait_notify(listener, payload: str, done, timeout: float) -> float:
    """Waits for NOTIFY storetopics_updated `payload` after which done() holds; returns when it arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in listener.notifies(timeout=max(0.1, deadline - time.monotonic()), stop_after=1):
            if n.payload == payload:
                t = time.monotonic()
                if done():
                    return t
    raise TimeoutError(f"no NOTIFY storetopics_updated {payload} with the change")


def pass_seconds(logpath: Path, skip: int) -> list[float]:
    lines = [ln for ln in logpath.read_text(errors="replace").splitlines() if re.search(r"pass \d+:big:", ln)]
    return [float(m.group(1)) for ln in lines[skip:] if (m := re.search(r"\((\d+\.\d+)s\)\s*$", ln))]


def run_size(admin: str, chunks: int, events: int, llm_env: dict, log, kind: TextKind = TEXTS["short"]) -> dict:
    per_file = kind.per_file
    files = math.ceil(chunks / per_file)          # (the last file may be short)
    out: dict = {"chunks": chunks, "files": files, "dim": bc.DIM, "per_file": per_file,
                 "words_per_chunk": kind.words_per_chunk, "stores": 1 + SMALL_STORES}
    db = harness.create_database(admin, prefix="bench_scale")
    dsn = harness.with_db(admin, db)
    proc = None
    try:
        with connect(dsn, vector=False) as conn:
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE EXTENSION plpython3u")
        st_install.install(dsn, extension=True, log=lambda *a: None)
        texts = kind.texts(seed=1)
        synth = bc.Synth(seed=1, per_file=per_file, store_of=store_of, text_of=texts)
        with connect(dsn) as conn:
            postmaster = ppid(backend_pid(conn))
            bc.create_table(conn, "docs")
            conn.execute("CREATE INDEX ON docs (file)")
            source = conn.execute(
                "SELECT storetopics.attach('docs', 'store', 'file', 'content', 'embedding', settings => %s)",
                (json.dumps({"labeller": "anthropic", "debounce": DEBOUNCE}),)).fetchone()[0]
            conn.execute("CHECKPOINT")
            # -- 1. load (attached) -----------------------------------------------------------------------------
            load_s = gen_s = 0.0
            content_bytes = 0
            step = CHUNKS_PER_COPY
            for start in range(0, chunks, step):
                t0 = time.perf_counter()
                rows = list(synth.rows(start, min(step, chunks - start)))
                t1 = time.perf_counter()
                bc.copy_rows(conn, "docs", rows)
                t2 = time.perf_counter()
                content_bytes += sum(len(r[3]) for r in rows)
                gen_s += t1 - t0
                load_s += t2 - t1
                if (start // step) % 20 == 19:
                    log(f"  loaded {start + len(rows):,} chunks (COPY {load_s:.0f}s, generating {gen_s:.0f}s)")
            pending = conn.execute("SELECT count(*) FROM storetopics.pending WHERE source_id = %s",
                                   (source,)).fetchone()[0]
            t0 = time.perf_counter()
            conn.execute("VACUUM ANALYZE docs")
            vac_s = time.perf_counter() - t0
            conn.execute("CHECKPOINT")
            out["load"] = {"copy_seconds": round(load_s, 1), "rows_per_s": round(chunks / load_s),
                           "generate_seconds_untimed": round(gen_s, 1), "copy_statements": math.ceil(chunks / step),
                           "content_mb": round(content_bytes / 2**20, 1),
                           "pending_rows_logged": pending, "vacuum_analyze_seconds": round(vac_s, 1)}
            log(f"  load: {chunks:,} chunks by COPY (attached) in {load_s:.1f}s ({chunks / load_s:,.0f} rows/s); "
                f"VACUUM ANALYZE {vac_s:.1f}s")

        # -- 2. backfill, step by step -------------------------------------------------------------------------
        steps: dict = {}
        with ServerSampler(postmaster) as sampler:
            def timed(name, fn):
                with connect(dsn) as c:
                    sampler.step = name
                    t0 = time.perf_counter()
                    extra = fn(c)
                    secs = time.perf_counter() - t0
                    peak = proc_kb(backend_pid(c))
                    time.sleep(0.25)
                    sampler.step = None
                steps[name] = {"seconds": round(secs, 2), "backend_peak_mb": mb(peak),
                               "server_peak_mb": mb(sampler.peaks.get(name, (None,))[0]),
                               "server_peak_process": sampler.peaks.get(name, (None, None))[1], **(extra or {})}
                log(f"  {name}: {secs:.1f}s, backend peak {mb(peak)} MB, any server process "
                    f"{steps[name]['server_peak_mb']} MB ({steps[name]['server_peak_process']})")

            def fold(c):
                n = calls = 0
                while (k := c.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]):
                    n += k
                    calls += 1
                return {"files": n, "calls": calls}

            def fit(c):
                reports = {}
                for (store,) in c.execute("SELECT store_key FROM storetopics._stores_due(%s) WHERE fit IS NOT NULL "
                                          "ORDER BY store_key", (source,)).fetchall():
                    t0 = time.perf_counter()
                    rep = c.execute("SELECT storetopics._cluster(%s, %s)", (source, store)).fetchone()[0]
                    reports[store] = {"seconds": round(time.perf_counter() - t0, 2), "k": rep.get("k"),
                                      "sampling": rep.get("sampling"),
                                      **{k: rep.get(f"seconds_{k}") for k in ("read_sample", "fit", "apply")}}
                return {"stores": reports}

            def stores(c):
                return [r[0] for r in c.execute("SELECT store_key FROM storetopics.store_state WHERE source_id = %s "
                                                "ORDER BY store_key", (source,))]

            def words(c):
                for s in stores(c):
                    c.execute("SELECT storetopics._refresh_words(%s, %s)", (source, s))

            def labels(c):
                calls = 0
                for s in stores(c):
                    calls += refresh.label(c, source, s).calls
                return {"llm_calls": calls}

            def render(c):
                # store by store, `big` first: its time is its render from scratch (3b compares it with an upload's)
                changed, secs = 0, {}
                for s in sorted(stores(c), key=lambda s: s != "big"):
                    t0 = time.perf_counter()
                    changed += refresh.render(c, source, s)
                    secs[s] = round(time.perf_counter() - t0, 3)
                return {"changed": changed, "stores_seconds": secs}

            for name, fn in (("fold", fold), ("fit", fit), ("words", words), ("labels", labels), ("render", render)):
                timed(name, fn)
        total = sum(s["seconds"] for s in steps.values())
        out["backfill"] = {"seconds": round(total, 1), "steps": steps,
                           "per_chunk_us": round(total / chunks * 1e6, 2),
                           "per_chunk_us_by_step": {k: round(v["seconds"] / chunks * 1e6, 2)
                                                    for k, v in steps.items()}}
        log(f"  backfill {total:.1f}s = {total / chunks * 1e6:.1f} us/chunk")

        with connect(dsn) as conn:
            row = conn.execute("SELECT files, chunks, words, fit_k, store_topics FROM storetopics.store_state "
                               "WHERE source_id = %s AND store_key = 'big'", (source,)).fetchone()
            out["big"] = {"files": row[0], "chunks": row[1], "words": row[2], "k": row[3], "summary": row[4]}
            out["small_stores"] = [dict(zip(("store", "files", "chunks", "k"), r)) for r in conn.execute(
                "SELECT store_key, files, chunks, fit_k FROM storetopics.store_state WHERE source_id = %s "
                "AND store_key <> 'big' ORDER BY 1", (source,))]
            log(f"  big: {row[0]:,} files, {row[1]:,} chunks, K={row[3]}: {row[4]}")
            # -- 3. state size -------------------------------------------------------------------------------------
            conn.execute("VACUUM ANALYZE")    # what autovacuum does to storetopics' tables in production
            sizes = {r[0]: r[1] for r in conn.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'storetopics' AND c.relkind IN ('r', 'p') ORDER BY 2 DESC")}
            table = conn.execute("SELECT pg_total_relation_size('docs')").fetchone()[0]
            state = sum(sizes.get(t, 0) for t in STATE_TABLES)
            counts = {t: conn.execute(f"SELECT count(*) FROM storetopics.{t}").fetchone()[0]
                      for t in ("file_terms", "store_terms", "clusters")}
            out["state"] = {"table_bytes": table, "state_bytes": state, "share": round(state / table, 4),
                            "all_storetopics_bytes": sum(sizes.values()), "by_table_bytes": sizes, "rows": counts,
                            "state_bytes_per_chunk": round(state / chunks, 1)}
            log(f"  state {state / 2**20:.1f} MB vs table {table / 2**20:.0f} MB ({state / table:.1%}); "
                f"all storetopics tables {sum(sizes.values()) / 2**20:.1f} MB")

            # -- 3b. one upload's pass, step by step, in this session (no worker running yet) -----------------------
            next_file = files

            def upload_to(store: str) -> None:
                nonlocal next_file
                while store_of(np.array([next_file]))[0] != store:
                    next_file += 1
                bc.copy_rows(conn, "docs", with_new_word(synth.rows(next_file * per_file, per_file), next_file))
                next_file += 1

            def upload_by_hand(others: tuple[str, ...] = ()) -> dict:
                for store in others:   # (3c: folded with big's file)
                    upload_to(store)
                upload_to("big")
                kept = "SELECT catalog_position FROM storetopics.novelty_state WHERE source_id = %s AND store_key = 'big'"
                position = conn.execute(kept, (source,)).fetchone()
                anatomy = {}
                t0 = time.perf_counter()
                anatomy["fold"] = conn.execute("SELECT storetopics._fold(%s)", (source,)).fetchone()[0]
                anatomy["fold_s"] = round(time.perf_counter() - t0, 3)
                t0 = time.perf_counter()
                anatomy["fit_due"] = conn.execute("SELECT storetopics._fit_due(%s, 'big')", (source,)).fetchone()[0]
                conn.execute("SELECT storetopics._refresh_words(%s, 'big')", (source,))
                anatomy["refresh_words_s"] = round(time.perf_counter() - t0, 3)
                # (in one transaction, as the pass renders: the second render packs what the first computed)
                with conn.transaction():
                    t0 = time.perf_counter()
                    first = conn.execute("SELECT storetopics._render(%s, 'big', true)", (source,)).fetchone()[0]
                    anatomy["render_s"] = round(time.perf_counter() - t0, 3)
                    if first is None:    # new words to count with tiktoken, then render again (what the pass does)
                        t0 = time.perf_counter()
                        anatomy["counted"] = refresh.count_tokens(conn, source, "big")
                        conn.execute("SELECT storetopics._render(%s, 'big', false)", (source,))
                        anatomy["count_and_render_again_s"] = round(time.perf_counter() - t0, 3)
                anatomy["render_total_s"] = round(anatomy["render_s"] + anatomy.get("count_and_render_again_s", 0), 3)
                anatomy["contrast_kept_again"] = conn.execute(kept, (source,)).fetchone() != position
                # (after the render, as the pass does: the novelty kept again when the uploads piled up since make
                # renders dearer than a keep; not part of the render)
                t0 = time.perf_counter()
                anatomy["novelty_kept_again"] = refresh.keep_worn(conn, source, "big")
                anatomy["keep_worn_s"] = round(time.perf_counter() - t0, 3)
                return anatomy

            uploads = [upload_by_hand() for _ in range(UPLOADS_BY_HAND)]
            out["one_upload_pass"] = uploads[0]
            out["one_upload_passes"] = uploads
            scratch = steps["render"]["stores_seconds"]["big"]
            after = percentile([u["render_total_s"] for u in uploads], 50)
            out["render_big"] = {
                "scratch_s": scratch, "after_upload_s": round(after, 3),
                "after_upload_p90_s": round(percentile([u["render_total_s"] for u in uploads], 90), 3),
                "after_upload_all_s": [u["render_total_s"] for u in uploads],
                "novelty_kept_again_at": [i + 1 for i, u in enumerate(uploads) if u["novelty_kept_again"]],
                "novelty_keeps_s": [u["keep_worn_s"] for u in uploads if u["novelty_kept_again"]],
                "ratio": round(after / scratch, 4) if scratch else None,
                "scratch_is": "the backfill's render of `big` (refresh.render: render, count with tiktoken, render "
                              "again), the first render of its state",
                "after_upload_is": f"median over {UPLOADS_BY_HAND} one-file uploads passed by hand: _render "
                                   "(+ count + _render again), in one transaction"}
            log(f"  one upload's pass, step by step: {uploads}")
            log(f"  render of big: from scratch {scratch:.2f}s, after a 1-file upload {after:.3f}s "
                f"(ratio {out['render_big']['ratio']})")
            # -- 3c. the same with uploads to the other stores between big's: they grow the catalog ------------------
            mixed = [upload_by_hand(tuple(f"small{(i * MIXED_OTHERS + j) % SMALL_STORES}" for j in range(MIXED_OTHERS)))
                     for i in range(MIXED_UPLOADS)]
            out["render_big_mixed"] = {
                "others_per_upload": MIXED_OTHERS,
                "after_upload_s": round(percentile([u["render_total_s"] for u in mixed], 50), 3),
                "after_upload_all_s": [u["render_total_s"] for u in mixed],
                "contrast_kept_again": sum(u["contrast_kept_again"] for u in mixed),
                "contrast_kept_again_at": [i + 1 for i, u in enumerate(mixed) if u["contrast_kept_again"]],
                "novelty_kept_again_at": [i + 1 for i, u in enumerate(mixed) if u["novelty_kept_again"]],
                "is": f"median over {MIXED_UPLOADS} one-file uploads into `big`, each after {MIXED_OTHERS} to the "
                      "small stores, folded together, passed by hand as in 3b"}
            log(f"  render of big with uploads to the other stores between: {out['render_big_mixed']}")

            # -- 4. event -> summary with a running worker ---------------------------------------------------------
            logpath = Path(tempfile.gettempdir()) / f"storetopics-bench-scale-{os.getpid()}-{chunks}.log"
            proc = subprocess.Popen([sys.executable, "-m", "storetopics.worker", "--dsn", dsn, "-v", "--lease", "60",
                                     "--poll", str(POLL)], stdout=open(logpath, "w"), stderr=subprocess.STDOUT,
                                    env=dict(os.environ, **llm_env))
            listener = psycopg.connect(dsn, autocommit=True)
            listener.execute("LISTEN storetopics_updated")
            time.sleep(3)
            wait_quiet(conn, 600)
            passes_before = len(pass_seconds(logpath, 0))
            payload = f"{source}:big"
            lat = []
            for i in range(events):
                while store_of(np.array([next_file]))[0] != "big":
                    next_file += 1
                rows = list(synth.rows(next_file * per_file, per_file))
                expect = big_state(conn, source)[0] + 1
                bc.copy_rows(conn, "docs", rows)
                t0 = time.monotonic()
                got = wait_notify(listener, payload, lambda: big_state(conn, source)[0] >= expect, 300)
                lat.append(got - t0)
                next_file += 1
                time.sleep(0.5)
            wait_quiet(conn, 120)
            passes = pass_seconds(logpath, passes_before)
            worker_pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity "
                                                      "WHERE application_name = 'storetopics-worker'")]
            out["event_to_summary"] = {
                "n": len(lat), "p50_s": round(percentile(lat, 50), 2), "p95_s": round(percentile(lat, 95), 2),
                "max_s": round(max(lat), 2), "all_s": [round(x, 2) for x in lat], "debounce_s": DEBOUNCE,
                "poll_s": POLL, "until": "NOTIFY storetopics_updated with the new file in topics.files",
                "worker_pass_s": passes, "worker_pass_p50_s": round(percentile(passes, 50), 2) if passes else None,
                "worker_peak_mb": mb(proc_kb(proc.pid)),
                "worker_backends_peak_mb": max((mb(proc_kb(p)) or 0 for p in worker_pids), default=None)}
            e = out["event_to_summary"]
            log(f"  event -> summary: p50 {e['p50_s']}s, p95 {e['p95_s']}s (worker pass p50 "
                f"{e['worker_pass_p50_s']}s); worker peak {e['worker_peak_mb']} MB, its backends "
                f"{e['worker_backends_peak_mb']} MB")

            # -- 5. a re-fit by the worker -------------------------------------------------------------------------
            _, gen0, big_files = big_state(conn, source)
            new_files = math.ceil(0.06 * big_files)
            centre = synth.rng.normal(size=bc.DIM).astype(np.float32)
            centre /= np.linalg.norm(centre)
            rows = []
            for j in range(new_files):
                while store_of(np.array([next_file]))[0] != "big":
                    next_file += 1
                rows += list(synth.rows(next_file * per_file, per_file, centre=centre, text=texts.new_theme))
                next_file += 1
            calls0 = conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0]
            t_copy = time.monotonic()
            bc.copy_rows(conn, "docs", rows)
            t0 = time.monotonic()
            got = wait_notify(listener, payload, lambda: big_state(conn, source)[1] > gen0, 900)
            wait_quiet(conn, 300)
            worker_pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity "
                                                      "WHERE application_name = 'storetopics-worker'")]
            k1 = conn.execute("SELECT fit_k FROM storetopics.store_state WHERE source_id = %s AND store_key = 'big'",
                              (source,)).fetchone()[0]
            out["worker_refit"] = {
                "new_chunks": len(rows), "copy_seconds": round(t0 - t_copy, 1), "commit_to_summary_s": round(got - t0, 1),
                "k": k1, "llm_calls": conn.execute("SELECT count(*) FROM storetopics.label_ledger").fetchone()[0]
                - calls0, "worker_passes_s": pass_seconds(logpath, passes_before + len(passes)),
                "worker_peak_mb": mb(proc_kb(proc.pid)),
                "worker_backends_peak_mb": max((mb(proc_kb(p)) or 0 for p in worker_pids), default=None)}
            r = out["worker_refit"]
            log(f"  worker re-fit after {len(rows):,} new-theme chunks: {r['commit_to_summary_s']}s, K={k1}, "
                f"{r['llm_calls']} LLM calls; worker peak {r['worker_peak_mb']} MB, its backends "
                f"{r['worker_backends_peak_mb']} MB")
            listener.close()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        harness.drop_database(admin, db)
    peaks = [s["backend_peak_mb"] for s in out["backfill"]["steps"].values()] + \
            [s["server_peak_mb"] for s in out["backfill"]["steps"].values()]
    out["peak_backend_mb"] = max(p for p in peaks if p)
    out["peak_worker_mb"] = max(out["event_to_summary"]["worker_peak_mb"] or 0, out["worker_refit"]["worker_peak_mb"] or 0)
    out["peak_worker_backends_mb"] = max(out["event_to_summary"]["worker_backends_peak_mb"] or 0,
                                         out["worker_refit"]["worker_backends_peak_mb"] or 0)
    return out


# -- the report ----------------------------------------------------------------------------------------------------
def growth(runs: list[dict], key=lambda r: r["backfill"]["per_chunk_us"]) -> list[dict]:
    out = []
    for a, b in zip(runs, runs[1:]):
        decades = math.log10(b["chunks"] / a["chunks"])
        out.append({"from": a["chunks"], "to": b["chunks"],
                    "per_decade": round((key(b) / key(a)) ** (1 / decades), 3) if key(a) else None})
    return out


def verdicts(res: dict) -> dict:
    runs = res["sizes"]
    g = growth(runs)
    worst_mem = max(max(r["peak_backend_mb"], r["peak_worker_mb"], r["peak_worker_backends_mb"]) for r in runs)
    out = {"growth": g, "growth_pass": all(x["per_decade"] <= TARGET_GROWTH for x in g),
           "memory_max_mb": worst_mem, "memory_pass": worst_mem <= TARGET_MB,
           "growth_by_step": {s: growth(runs, key=lambda r, s=s: r["backfill"]["per_chunk_us_by_step"][s])
                              for s in ("fold", "fit", "words", "labels", "render")}}
    rendered = [r for r in runs if r.get("render_big")]          # (results from before the comparison have none)
    if rendered:
        out["render_ratio_pass"] = all(r["render_big"]["ratio"] <= TARGET_RENDER_RATIO for r in rendered)
        at_1m = [r for r in rendered if r["chunks"] == 1_000_000]
        out["render_1m_s"] = at_1m[0]["render_big"]["after_upload_s"] if at_1m else None
        out["render_1m_pass"] = out["render_1m_s"] <= TARGET_RENDER_S if at_1m else None
    return out


def human(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def markdown(res: dict) -> str:
    runs, v = res["sizes"], res["verdicts"]
    head = "| measure | " + " | ".join(human(r["chunks"]) for r in runs) + " |"
    sep = "|---|" + "---:|" * len(runs)

    def row(label, f):
        return f"| {label} | " + " | ".join(f(r) for r in runs) + " |"

    st = lambda r, s: r["backfill"]["steps"][s]  # noqa: E731
    kind = text_kind(res)
    per_file = runs[0]["per_file"]
    rb = lambda r: r.get("render_big") or {}  # noqa: E731
    content = [r["load"].get("content_mb") for r in runs]
    lines = [f"# Scaling curve, {kind.name} text ({res['started'][:16].replace('T', ' ')} UTC, {res['cpus']} CPUs, "
             f"load average {res['loadavg_before']} before the run)", "",
             f"**Text: {kind.describe}.** One source, one dominant store `big` (90% of the files) + {SMALL_STORES} "
             f"small stores (2% each), {per_file} chunks per file, {bc.DIM}-d vectors around {bc.CENTRES} centres. "
             f"git {res['git']}, sql sha1 {res['sql_sha1'][:12]}.", "",
             head, sep,
             row("load: COPY, attached (s)", lambda r: f"{r['load']['copy_seconds']}"),
             row("load rate (rows/s)", lambda r: f"{r['load']['rows_per_s']:,}"),
             *([row("chunk text loaded (MB)", lambda r: f"{r['load']['content_mb']:,}")] if all(content) else []),
             row("**backfill total (s)**", lambda r: f"**{r['backfill']['seconds']}**"),
             row("… fold (s)", lambda r: f"{st(r, 'fold')['seconds']}"),
             row("… fit, in Postgres (s)", lambda r: f"{st(r, 'fit')['seconds']}"),
             row("… words (s)", lambda r: f"{st(r, 'words')['seconds']}"),
             row("… labels (s; LLM calls)", lambda r: f"{st(r, 'labels')['seconds']} ({st(r, 'labels')['llm_calls']})"),
             row("… render (s)", lambda r: f"{st(r, 'render')['seconds']}"),
             row("**per-chunk cost (µs)**", lambda r: f"**{r['backfill']['per_chunk_us']}**"),
             row("K of `big`", lambda r: f"{r['big']['k']}"),
             row("peak backend (MB, VmHWM; step)", lambda r: "{} ({})".format(
                 *max((s["backend_peak_mb"] or 0, k) for k, s in r["backfill"]["steps"].items()))),
             row("peak any server process (MB, sampled)", lambda r: "{} ({})".format(
                 *max((s["server_peak_mb"] or 0, k) for k, s in r["backfill"]["steps"].items()))),
             row("peak worker process (MB, VmHWM)", lambda r: f"{r['peak_worker_mb']}"),
             row("peak worker's backends (MB)", lambda r: f"{r['peak_worker_backends_mb']}"),
             row("chunk table (MB)", lambda r: f"{r['state']['table_bytes'] / 2**20:,.0f}"),
             row("state (MB; % of table)", lambda r: f"{state_bytes(r['state']) / 2**20:,.1f} "
                                                    f"({state_bytes(r['state']) / r['state']['table_bytes']:.1%})"),
             row("… of which per-file counts, store terms, lexemes (MB; % of table)",
                 lambda r: f"{state_bytes(r['state'], STATE_FLOOR_TABLES) / 2**20:,.1f} "
                           f"({state_bytes(r['state'], STATE_FLOOR_TABLES) / r['state']['table_bytes']:.1%})"),
             row("state per chunk (bytes)", lambda r: f"{state_bytes(r['state']) / r['chunks']:.1f}"),
             row("file_terms rows (one per file) / store_terms rows",
                 lambda r: f"{r['state']['rows']['file_terms']:,} / {r['state']['rows']['store_terms']:,}"),
             row("event → summary p50 / p95 (s)", lambda r: f"{r['event_to_summary']['p50_s']} / "
                                                            f"{r['event_to_summary']['p95_s']}"),
             row("… of which the worker's pass, p50 (s)", lambda r: f"{r['event_to_summary']['worker_pass_p50_s']:.2f}"),
             row("one upload's pass by hand: fold / refresh_words / render (+ count, render again) (s)",
                 lambda r: "{} / {} / {}{}".format(
                     r["one_upload_pass"]["fold_s"], r["one_upload_pass"]["refresh_words_s"],
                     r["one_upload_pass"]["render_s"],
                     f" + {r['one_upload_pass']['count_and_render_again_s']}"
                     if "count_and_render_again_s" in r["one_upload_pass"] else "")),
             *([row("**render of `big` from scratch (s; the backfill's)**", lambda r: f"**{rb(r)['scratch_s']}**"),
                row(f"**render of `big` after a 1-file upload (s; median of {UPLOADS_BY_HAND})**",
                    lambda r: f"**{rb(r)['after_upload_s']}**"),
                row("… after an upload / from scratch", lambda r: f"{rb(r)['ratio']:.3f}×"),
                row(f"… each upload's render: 1st / 30th / 60th / {UPLOADS_BY_HAND}th; 90th percentile, max (s)",
                    lambda r: " / ".join(str(rb(r)["after_upload_all_s"][i - 1])
                                         for i in (1, 30, 60, UPLOADS_BY_HAND) if i <= len(rb(r)["after_upload_all_s"]))
                    + f"; {rb(r).get('after_upload_p90_s', '–')}, {max(rb(r)['after_upload_all_s'])}"),
                row("… the pass kept the novelty again after upload (s each)",
                    lambda r: ", ".join(f"{i} ({t})" for i, t in zip(rb(r).get("novelty_kept_again_at", []),
                                                                    rb(r).get("novelty_keeps_s", []))) or "–")]
               if v.get("render_ratio_pass") is not None else []),
             *([row(f"render of `big` after a 1-file upload, {MIXED_OTHERS} uploads to the small stores before each "
                    f"(s; median of {MIXED_UPLOADS}; max; renders that kept the contrast head again)",
                    lambda r: f"{r['render_big_mixed']['after_upload_s']}; {max(r['render_big_mixed']['after_upload_all_s'])}; "
                              f"{r['render_big_mixed']['contrast_kept_again']}")]
               if all("render_big_mixed" in r for r in runs) else []),
             row("worker re-fit, new theme 6%: commit → summary (s)",
                 lambda r: f"{r['worker_refit']['commit_to_summary_s']}"),
             "",
             "| target | measured | |", "|---|---|---|",
             f"| per-chunk cost grows ≤ {TARGET_GROWTH}× per decade | " + ", ".join(
                 f"{human(x['from'])}→{human(x['to'])}: {x['per_decade']}×" for x in v["growth"]) +
             f" | **{'PASS' if v['growth_pass'] else 'MISS'}** |",
             f"| memory ≤ {TARGET_MB} MB at every size (backends, any server process, worker and its backends) | "
             f"max {v['memory_max_mb']} MB | **{'PASS' if v['memory_pass'] else 'MISS'}** |",
             "| (information: bench.worker's target) event → summary p95 ≤ debounce + 30 s | " + ", ".join(
                 f"{human(r['chunks'])}: {r['event_to_summary']['p95_s']} s" for r in runs) + " | " + ", ".join(
                 "met" if r["event_to_summary"]["p95_s"] <= DEBOUNCE + 30 else "missed" for r in runs) + " |",
             *([f"| render of `big` after a 1-file upload ≤ {TARGET_RENDER_RATIO:g}× its render from scratch | "
                + ", ".join(f"{human(r['chunks'])}: {rb(r)['ratio']:.3f}× ({rb(r)['after_upload_s']} s vs "
                            f"{rb(r)['scratch_s']} s)" for r in runs)
                + f" | **{'PASS' if v['render_ratio_pass'] else 'MISS'}** |",
                f"| … and ≤ {TARGET_RENDER_S:g} s at 1M chunks | "
                + (f"{v['render_1m_s']} s | **{'PASS' if v['render_1m_pass'] else 'MISS'}** |"
                   if v["render_1m_s"] is not None else "1M not in this run | – |")]
               if v.get("render_ratio_pass") is not None else []),
             "",
             "Per-chunk cost growth per decade by step: " + "; ".join(
                 f"{s} " + ", ".join(f"{x['per_decade']}×" if x["per_decade"] else "–" for x in g)
                 for s, g in v["growth_by_step"].items()) + ".",
             "",
             *([f"Render from scratch: the backfill's render of `big` (refresh.render: render, count the new words with "
                "tiktoken, render again), the first render of its state: no token counts, no rendered summary yet (the "
                "SQL has no way to drop what a render keeps, so a later render from scratch cannot be forced). After "
                f"an upload: {UPLOADS_BY_HAND} one-file uploads into `big`, each folded and rendered by hand the same "
                "way (in one transaction); their median. Both exclude refresh_words (the words step and the pass's own "
                "step). After each render, the pass's keep of the novelty when it is worn (refresh.keep_worn), timed "
                "apart: the summary is written by then.", ""] if v.get("render_ratio_pass") is not None else []),
             f"Event → summary: {res['sizes'][0]['event_to_summary']['n']} uploads of one {per_file}-chunk file into "
             "`big`, "
             f"one at a time, worker debounce {DEBOUNCE:g} s, --poll {POLL:g} s; from the COPY's commit until NOTIFY "
             "storetopics_updated for `big` arrived with the file counted in `topics.files` (every upload changes "
             "`topics`; the text says the file count rounded, so it need not change). VmHWM includes the shared "
             "buffers a process touched (shared_buffers = 256 MB).", ""]
    for r in runs:
        lines.append(f"- {human(r['chunks'])}: `big` {r['big']['files']:,} files, K={r['big']['k']}, fit sampling "
                     f"{r['backfill']['steps']['fit']['stores'].get('big', {}).get('sampling')}; summary: "
                     f"`{r['big']['summary'][:300]}…`")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = res["sizes"]
    x = np.array([r["chunks"] for r in runs], dtype=float)
    kind = text_kind(res)
    rendered = all(r.get("render_big") for r in runs)
    fig, axes = plt.subplots(1, 4 if rendered else 3, figsize=(20 if rendered else 15, 4.4))
    a1, a2, a3 = axes[:3]
    total = np.array([r["backfill"]["per_chunk_us"] for r in runs])
    a1.plot(x, total, "k-o", lw=2, label="backfill total")
    for s in ("fold", "fit", "labels", "render"):
        a1.plot(x, [max(0.01, r["backfill"]["per_chunk_us_by_step"][s]) for r in runs], "-o", ms=4, label=s)
    a1.plot(x, total[0] * (x / x[0]) ** math.log10(TARGET_GROWTH), "r--", lw=1,
            label=f"limit: {TARGET_GROWTH}x per decade")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("chunks in the source")
    a1.set_ylabel("µs per chunk")
    a1.set_title("backfill cost per chunk")
    a1.legend(fontsize=8)
    a1.grid(True, which="both", alpha=0.3)
    for key, label in (("peak_backend_mb", "backfill: peak backend"), ("peak_worker_mb", "worker process"),
                       ("peak_worker_backends_mb", "worker's backends")):
        a2.plot(x, [r[key] for r in runs], "-o", label=label)
    a2.axhline(TARGET_MB, color="r", ls="--", lw=1, label="limit: 1 GB")
    a2.set_xscale("log")
    a2.set_ylim(0, max(TARGET_MB * 1.15, max(r["peak_backend_mb"] for r in runs) * 1.1))
    a2.set_xlabel("chunks in the source")
    a2.set_ylabel("MB (VmHWM)")
    a2.set_title("peak memory")
    a2.legend(fontsize=8)
    a2.grid(True, which="both", alpha=0.3)
    e = [r["event_to_summary"] for r in runs]
    a3.plot(x, [v["p95_s"] for v in e], "-o", label="event → summary p95")
    a3.plot(x, [v["p50_s"] for v in e], "-o", label="event → summary p50")
    a3.plot(x, [v["worker_pass_p50_s"] for v in e], ":o", label="worker's pass, p50")
    a3.axhline(DEBOUNCE + 30, color="grey", ls="--", lw=1, label="bench.worker's p95 target (debounce + 30 s)")
    a3.set_xscale("log")
    a3.set_ylim(bottom=0)
    a3.set_xlabel("chunks in the source")
    a3.set_ylabel("seconds")
    a3.set_title(f"one uploaded file → summary (debounce {DEBOUNCE:g} s)")
    a3.legend(fontsize=8)
    a3.grid(True, which="both", alpha=0.3)
    if rendered:
        a4 = axes[3]
        a4.plot(x, [r["render_big"]["scratch_s"] for r in runs], "-o", label="from scratch (the backfill's)")
        a4.plot(x, [r["render_big"]["after_upload_s"] for r in runs], "-o", label="after a 1-file upload")
        a4.plot(x, [r["render_big"]["scratch_s"] * TARGET_RENDER_RATIO for r in runs], "r--", lw=1,
                label=f"limit: {TARGET_RENDER_RATIO:g}x from scratch")
        a4.axhline(TARGET_RENDER_S, color="grey", ls="--", lw=1, label=f"limit at 1M: {TARGET_RENDER_S:g} s")
        a4.set_xscale("log")
        a4.set_yscale("log")
        a4.set_xlabel("chunks in the source")
        a4.set_ylabel("seconds")
        a4.set_title("render of `big`")
        a4.legend(fontsize=8)
        a4.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"storetopics scaling, {kind.name} text: one source, one dominant store, {bc.DIM}-d, "
                 f"{runs[0]['per_file']} chunks per file ({res['started'][:10]}, git {res['git']}, {res['cpus']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sql_sha1() -> str:
    h = hashlib.sha1()
    for p in sorted((REPO / "sql").glob("storetopics--*.sql")) + [REPO / "plpy" / "storetopics_clustering.py"]:
        h.update(p.read_bytes())
    return h.hexdigest()


def write_reports(res: dict, where: Path = RESULTS) -> None:
    res["verdicts"] = verdicts(res)
    suffix = text_kind(res).suffix
    (where / f"scale{suffix}-latest.md").write_text(markdown(res))
    plot(res, where / f"scale{suffix}.png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", choices=sorted(TEXTS), default="short",
                    help="short: 10 words per chunk, 10 chunks per file (issue 17); docs: 200-300-word windows of "
                         "real manuals, 3 chunks per file (issue 33)")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="chunk counts, comma-separated")
    ap.add_argument("--events", type=int, default=10, help="single-file uploads per size for event -> summary")
    ap.add_argument("--quick", action="store_true", help="sizes 5000,50000 and 3 events; writes the JSON only")
    ap.add_argument("--replot", metavar="JSON", help="rewrite scale[-docs]-latest.md and scale[-docs].png from a "
                                                     "result file (its text says which)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where --replot writes (default bench/results)")
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.replot:
        res = json.loads(Path(args.replot).read_text())
        write_reports(res, args.out)
        print(markdown(res))
        return 0
    sizes = [5_000, 50_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    events = 3 if args.quick else args.events
    kind = TEXTS[args.text]
    if kind.name == "docs":
        doctext.ensure_corpus()
    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[bench.scale {time.perf_counter() - t_start:6.0f}s] {msg}", flush=True)

    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "sql", "plpy", "bgworker"],
                           capture_output=True, text=True).stdout.strip()
    res: dict = {"started": started.isoformat(), "cpus": os.cpu_count(), "git": git + ("+dirty" if dirty else ""),
                 "sql_sha1": sql_sha1(), "loadavg_before": round(os.getloadavg()[0], 2),
                 "text": {"name": kind.name, "per_file": kind.per_file, "words_per_chunk": kind.words_per_chunk,
                          "describe": kind.describe}, "sizes": []}
    try:
        from storetopics.plpy import storetopics_clustering as wc
        res["worker_clustering_module"] = wc.__file__
        res["worker_clustering_sha1"] = hashlib.sha1(Path(wc.__file__).read_bytes()).hexdigest()
    except ImportError:
        pass
    with harness.server() as admin, MessagesServer() as llm:
        env = {"ANTHROPIC_BASE_URL": llm.base_url, "ANTHROPIC_API_KEY": "bench"}
        os.environ.update(env)
        for n in sizes:
            log(f"{n:,} chunks")
            t0 = time.perf_counter()
            r = run_size(admin, n, events, env, log, kind)
            r["elapsed_seconds"] = round(time.perf_counter() - t0, 1)
            r["loadavg_after"] = round(os.getloadavg()[0], 2)
            res["sizes"].append(r)
            log(f"{n:,} chunks done in {r['elapsed_seconds']:.0f}s")
    res["elapsed_seconds"] = round(time.perf_counter() - t_start, 1)
    res["verdicts"] = verdicts(res)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    (RESULTS / f"scale{kind.suffix}-{stamp}{'-quick' if args.quick else ''}.json").write_text(json.dumps(res, indent=2) + "\n")
    if not args.quick:
        write_reports(res)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
