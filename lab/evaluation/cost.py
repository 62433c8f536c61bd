"""LLM calls and tokens of the labels, counted from storetopics.label_ledger (real counts, not estimates).

A sample of the routing stores (DEFAULT_STORES; all with stores=None) is built a second time in its own table with the Anthropic labeller configured
(`storetopics.configure(table, '{"labeller": "anthropic"}')`), the real `anthropic` SDK talking to the local
Messages API server (lab.fakes.messages: no LLM is reachable from here; it answers like a small model).
Three phases, each followed by the CLI backfill (fit when due, label what is due, render):
  initial  every store built from scratch;
  churn    10% of each store's files deleted and as many other packages of the same section inserted;
  drift    half of one store's files replaced by another section's packages.
The routing table itself runs with the default offline labeller; its ledger is reported next to this one.
"""
from __future__ import annotations

import contextlib
import os
import time

from . import data, pg
from .routing import RoutingConfig

TABLE = "eval_cost"


@contextlib.contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ledger(conn) -> dict:
    r = conn.execute("""SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
                               coalesce(sum(cost_usd), 0)::float8, count(*) FILTER (WHERE outcome = 'ok')
                          FROM storetopics.label_ledger l JOIN storetopics.sources s ON s.id = l.source_id
                         WHERE s.chunks = %s::regclass""", (TABLE,)).fetchone()
    return {"calls": int(r[0]), "input_tokens": int(r[1]), "output_tokens": int(r[2]), "cost_usd": float(r[3]),
            "ok": int(r[4])}


def _clusters(conn) -> int:
    return conn.execute("""SELECT count(*) FROM storetopics.clusters k JOIN storetopics.sources s
                             ON s.id = k.source_id WHERE s.chunks = %s::regclass""", (TABLE,)).fetchone()[0]


DEFAULT_STORES = ("editors", "games", "kde", "math", "perl", "sound")  # a sample of the routing stores


def run(dsn: str, cfg: RoutingConfig, embedder, log=print, churn_share: float = 0.1,
        stores: tuple[str, ...] | None = DEFAULT_STORES) -> dict:
    from ..fakes.messages import MessagesServer

    with pg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('storetopics.label_ledger')").fetchone()[0] is None:
            return {"available": False, "note": "storetopics.label_ledger does not exist in the installed SQL"}
    t_start = time.perf_counter()
    sections = sorted(s for s in cfg.sections if stores is None or s in stores) or sorted(cfg.sections)
    if cfg.drift_store and cfg.drift_store not in sections:
        sections = sorted({*sections, cfg.drift_store})
    corpus = data.read_sections([*sections, cfg.drift_from] if cfg.drift_store else sections)
    sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    rows = [(s, p.name, c) for s in sections for p in sp.store[s] for c in p.chunks]
    # churn: per store, churn_share of its files out, as many held-out packages that are not queries in
    out_files, in_rows = {}, []
    for s in sections:
        n = max(1, round(churn_share * len(sp.store[s])))
        out_files[s] = [p.name for p in data.by_hash(sp.store[s], "churn")[:n]]
        queries = {p.name for p in sp.queries[s]}
        spare = [p for p in data.by_hash(sp.held[s], "churn") if p.name not in queries][:n]
        in_rows += [(s, p.name, c) for p in spare for c in p.chunks]
    drift_rows, drift_out = [], []
    if cfg.drift_store:
        x = cfg.drift_store
        n = int(round(len(sp.store[x]) * cfg.drift_share))
        keep_out = set(out_files.get(x, []))
        drift_out = [p.name for p in data.by_hash(sp.store[x], "drift") if p.name not in keep_out][:n]
        drift_rows = [(x, p.name, c) for p in data.by_hash(sp.store[cfg.drift_from], "drift")[:n] for c in p.chunks]
    vecs = embedder([c for *_, c in rows + in_rows + drift_rows])
    v_rows, v_in, v_drift = vecs[:len(rows)], vecs[len(rows):len(rows) + len(in_rows)], vecs[len(rows) + len(in_rows):]

    phases = []
    with MessagesServer() as server, _env(ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="eval-local"), \
            pg.connect(dsn) as conn:
        pg.create_chunks(conn, TABLE, embedder.dim)
        pg.insert(conn, TABLE, ((s, f, c, v) for (s, f, c), v in zip(rows, v_rows)))
        pg.attach(conn, TABLE)
        conn.execute("SELECT storetopics.configure(%s::regclass, '{\"labeller\": \"anthropic\"}')", (TABLE,))

        def phase(name: str, file_events: int) -> None:
            before = _ledger(conn)
            t0 = time.perf_counter()
            pg.refresh(conn)
            secs = time.perf_counter() - t0
            after = _ledger(conn)
            d = {k: after[k] - before[k] for k in after}
            phases.append({"phase": name, "file_events": file_events, **d, "clusters": _clusters(conn),
                           "backfill_seconds": secs,
                           "calls_per_1000_file_events": 1000 * d["calls"] / file_events if file_events else None,
                           "tokens_per_1000_file_events": 1000 * (d["input_tokens"] + d["output_tokens"]) /
                           file_events if file_events else None})
            log(f"cost: {name}: {file_events:,} file events, {d['calls']} labelling calls, "
                f"{d['input_tokens'] + d['output_tokens']:,} tokens, backfill {secs:.1f}s")

        phase("initial", len({(s, f) for s, f, _ in rows}))
        for s, files in out_files.items():
            pg.delete_files(conn, TABLE, s, files)
        pg.insert(conn, TABLE, ((s, f, c, v) for (s, f, c), v in zip(in_rows, v_in)))
        phase(f"churn ({churn_share:.0%} of each store's files replaced)",
              sum(len(v) for v in out_files.values()) + len({(s, f) for s, f, _ in in_rows}))
        if cfg.drift_store:
            pg.delete_files(conn, TABLE, cfg.drift_store, drift_out)
            pg.insert(conn, TABLE, ((s, f, c, v) for (s, f, c), v in zip(drift_rows, v_drift)))
            phase(f"drift ({len(drift_out)} '{cfg.drift_store}' files replaced by '{cfg.drift_from}')",
                  len(drift_out) + len({f for _, f, _ in drift_rows}))
        total = _ledger(conn)
        requests = len(server.requests)
        conn.execute("SELECT storetopics.detach(%s::regclass)", (TABLE,))
        conn.execute(f"DROP TABLE {TABLE}")
    return {"available": True, "labeller": "anthropic (real SDK) against the local Messages API server",
            "stores": len(sections), "phases": phases, "total": total, "server_requests": requests,
            "calls_per_store_initial": phases[0]["calls"] / len(sections) if phases else None,
            "seconds": time.perf_counter() - t_start}
