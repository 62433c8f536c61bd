"""LLM calls and tokens of the labels, counted from storetopics.label_ledger (real counts, not estimates).

A sample of the routing stores (DEFAULT_STORES; all with stores=None) is built a second time in its own table with the Anthropic labeller configured
(`storetopics.configure(table, '{"labeller": "anthropic"}')`), the real `anthropic` SDK talking to the local
Messages API server (tests.fakes.messages: no LLM is reachable from here; it answers like a small model).
Three phases, each followed by the CLI backfill (fit when due, label what is due, render):
  initial  every store built from scratch;
  churn    10% of each store's files deleted and as many other packages of the same section inserted;
  drift    half of one store's files replaced by another section's packages.
The routing table itself runs with the default offline labeller; its ledger is reported next to this one.

Stability for prompt caches (stability()): a catalog (the Debian routing stores, the document stores) in its own
table, half of its stores touched by churn and the other half not: rounds of file events (files added, replaced,
deleted) in the touched stores only, each round followed by a backfill (the first rounds with the CLI path,
storetopics.api.backfill, the others with the SQL storetopics.backfill()).  Measured per round: the share of the
untouched stores whose store_topics text changed (a prompt that holds the catalog loses its cache from the first
changed byte), and how much the touched stores' texts changed.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import statistics
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
    from tests.fakes.messages import MessagesServer

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


# -- stability for prompt caches ------------------------------------------------------------------------------------
KINDS = ("add", "delete", "replace")
STABILITY_TABLE = "eval_stability"


def _hash(*parts: object) -> str:
    return hashlib.sha1("\0".join(map(str, parts)).encode()).hexdigest()


def touched_half(stores: list[str] | tuple[str, ...], salt: str = "stability") -> list[str]:
    """The stores that churn: half of them (rounded down), picked by a hash of their names; sorted."""
    return sorted(sorted(stores, key=lambda s: _hash(salt, s))[:len(stores) // 2])


def _allocate(total: int, sizes: dict[str, int]) -> dict[str, int]:
    """total events over the stores in proportion to their sizes (largest remainder; ties by name)."""
    whole = sum(sizes.values()) or 1
    quota = {s: total * n / whole for s, n in sizes.items()}
    out = {s: int(q) for s, q in quota.items()}
    for s in sorted(quota, key=lambda s: (-(quota[s] - out[s]), s))[:total - sum(out.values())]:
        out[s] += 1
    return out


def churn_plan(files: dict[str, list[str]], touched: list[str], rounds: int, events: int,
               reserve_share: float = 0.15) -> tuple[dict[str, dict[str, str]], list[list[tuple]]]:
    """The churn scenario, decided before anything runs.  files: store -> its pages (names).  Each touched store
    keeps a reserve of its pages out at the start (reserve_share, at least 3, by hash); every round has `events` file
    events over the touched stores, in proportion to their files, each store's cycling through add (a reserve page
    in, under a new file key), delete (a file out; its page back to the reserve) and replace (a file's rows deleted
    and another reserve page's rows inserted under the same key; the old page back to the reserve), a delete when
    the reserve is empty.  A file key is touched at most once per round and a page taken out returns to the reserve
    only when the round ends; the untouched stores get no event.  Returns (the starting state, store -> {file
    key: page}, and per round the events (kind, store, file key, page in or None))."""
    state: dict[str, dict[str, str]] = {}
    reserve: dict[str, list[str]] = {}
    for s, pages in files.items():
        pages = sorted(pages)
        if s in touched:
            out = set(sorted(pages, key=lambda p: _hash("reserve", s, p))[:max(3, round(reserve_share * len(pages)))])
            reserve[s] = [p for p in pages if p in out]
            pages = [p for p in pages if p not in out]
        state[s] = {p: p for p in pages}
    start = {s: dict(v) for s, v in state.items()}
    plan = []
    for r in range(rounds):
        per = _allocate(events, {s: len(state[s]) for s in touched})
        evs = []
        for s in touched:
            used: set[str] = set()
            back: list[str] = []        # pages taken out this round: back in the reserve when the round ends
            for i in range(per[s]):
                kind = KINDS[(i + r) % 3]
                if kind != "delete" and not reserve[s]:
                    kind = "delete"
                free = [k for k in state[s] if k not in used]
                if kind != "add" and not free:
                    continue
                if kind == "add":
                    page = reserve[s].pop(0)
                    key, n = page, 1
                    while key in state[s] or key in used:
                        n += 1
                        key = f"{page}~{n}"
                    state[s][key] = page
                    evs.append(("add", s, key, page))
                else:
                    key = min(free, key=lambda k: _hash(r, i, s, k))
                    old = state[s].pop(key)
                    if kind == "replace":
                        page = reserve[s].pop(0)
                        state[s][key] = page
                        evs.append(("replace", s, key, page))
                    else:
                        evs.append(("delete", s, key, None))
                    back.append(old)
                used.add(key)
            reserve[s] += back
        plan.append(evs)
    return start, plan


def text_change(a: str | None, b: str | None) -> dict:
    """How much a store's text changed: changed at all; the share of its words not kept in order (1 - difflib's
    ratio over the word sequences: a word that moved counts); the share of the new text's distinct words the old one
    did not have (order aside); the share of the old text (characters) that stays a common prefix."""
    a, b = a or "", b or ""
    if a == b:
        return {"changed": False, "words_changed": 0.0, "words_new": 0.0, "prefix_kept": 1.0}
    wa, wb = a.split(), b.split()
    sm = difflib.SequenceMatcher(None, wa, wb, autojunk=False)
    prefix = len(os.path.commonprefix([a, b]))
    return {"changed": True, "words_changed": 1.0 - sm.ratio(),
            "words_new": len(set(wb) - set(wa)) / len(set(wb)) if wb else 0.0,
            "prefix_kept": prefix / len(a) if a else 0.0}


def stability_round(before: dict[str, str | None], after: dict[str, str | None], touched, events: int) -> dict:
    """One round's figures: the untouched stores whose store_topics changed (their share, and that share per 100
    file events), and for the touched stores how many changed and how much (medians of text_change)."""
    touched = set(touched)
    untouched = sorted(s for s in before if s not in touched)
    changed_u = [s for s in untouched if (before[s] or "") != (after.get(s) or "")]
    ch_t = {s: text_change(before[s], after.get(s)) for s in sorted(touched) if s in before}
    share = len(changed_u) / len(untouched) if untouched else float("nan")
    changed_t = [c for c in ch_t.values() if c["changed"]]
    return {
        "file_events": events, "untouched": len(untouched), "untouched_changed": changed_u,
        "untouched_changed_share": share,
        "untouched_changed_share_per_100_events": share * 100 / events if events else float("nan"),
        "touched": len(ch_t), "touched_changed": len(changed_t),
        "touched_words_changed_median": statistics.median(c["words_changed"] for c in changed_t) if changed_t
        else 0.0,
        "touched_words_new_median": statistics.median(c["words_new"] for c in changed_t) if changed_t else 0.0,
        "touched_prefix_kept_median": statistics.median(c["prefix_kept"] for c in changed_t) if changed_t else 1.0,
        "touched_per_store": ch_t,
    }


def _backfill(conn, path: str) -> float:
    t0 = time.perf_counter()
    if path == "sql":
        conn.execute("SELECT * FROM storetopics.backfill()").fetchall()
    else:
        pg.refresh(conn)
    return time.perf_counter() - t0


def stability(dsn: str, family: str, pages: dict[str, list[data.Package]], embedder, log=print, *,
              rounds: tuple[str, ...] = ("cli", "cli", "cli", "sql", "sql", "sql"), events: int = 100,
              reserve_share: float = 0.15, table: str = STABILITY_TABLE) -> dict:
    """The churn scenario on one catalog (pages: store -> its files as data.Package, all of them loaded but each
    touched store's reserve).  rounds: the backfill path after each round, 'cli' (storetopics.api.backfill: fold,
    fit, labels, render) or 'sql' (SELECT storetopics.backfill(): fold and render; it clusters only where plpython3u
    is installed, which the evaluation's database is not)."""
    t_start = time.perf_counter()
    stores = sorted(pages)
    by_name = {s: {p.name: p for p in pages[s]} for s in stores}
    touched = touched_half(stores)
    start, plan = churn_plan({s: list(by_name[s]) for s in stores}, touched, len(rounds), events, reserve_share)
    texts = sorted({c for s in stores for p in pages[s] for c in p.chunks})
    vec = dict(zip(texts, embedder(texts)))
    results = []
    with pg.connect(dsn) as conn:
        pg.create_chunks(conn, table, embedder.dim)
        pg.insert(conn, table, ((s, key, c, vec[c]) for s in stores for key, page in start[s].items()
                                for c in by_name[s][page].chunks))
        pg.attach(conn, table)
        t0 = pg.refresh(conn)
        rows = pg.stores(conn, table)
        texts_now = {s: r["store_topics"] for s, r in rows.items()}
        n_files = {s: r["files"] for s, r in rows.items()}
        initial = texts_now
        log(f"stability ({family}): {len(stores)} stores, {len(touched)} touched ({', '.join(touched)}); "
            f"initial backfill {t0:.1f}s")
        for r, (path, evs) in enumerate(zip(rounds, plan), 1):
            for s in touched:
                gone = [k for kind, st, k, _ in evs if st == s and kind != "add"]
                if gone:
                    pg.delete_files(conn, table, s, gone)
            pg.insert(conn, table, ((s, key, c, vec[c]) for kind, s, key, page in evs if page is not None
                                    for c in by_name[s][page].chunks))
            secs = _backfill(conn, path)
            after = {s: row["store_topics"] for s, row in pg.stores(conn, table).items()}
            rr = stability_round(texts_now, after, touched, len(evs))
            rr.update({"round": r, "backfill": path, "backfill_seconds": secs,
                       "events": {k: sum(e[0] == k for e in evs) for k in KINDS}})
            if r == 1 and rr["touched_changed"]:   # for the report: the touched store of the median change
                ch = sorted((v["words_changed"], st) for st, v in rr["touched_per_store"].items() if v["changed"])
                ex = ch[(len(ch) - 1) // 2][1]
                rr["example"] = {"store": ex, "file_events": sum(e[1] == ex for e in evs),
                                 "files_before": n_files.get(ex), "before": texts_now[ex], "after": after[ex]}
            results.append(rr)
            log(f"  round {r} ({len(evs)} file events, {path} backfill {secs:.1f}s): untouched changed "
                f"{len(rr['untouched_changed'])}/{rr['untouched']}, touched changed {rr['touched_changed']}/"
                f"{rr['touched']} (median {rr['touched_words_changed_median']:.0%} of words)")
            texts_now = after
        conn.execute("SELECT storetopics.detach(%s::regclass)", (table,))
        conn.execute(f"DROP TABLE {table}")
    out = summarize_stability(family, stores, touched, results, time.perf_counter() - t_start)
    whole = stability_round(initial, texts_now, touched, sum(r["file_events"] for r in results))
    out["cumulative"] = {k: v for k, v in whole.items() if k != "touched_per_store"}
    out["initial_backfill_seconds"] = t0
    return out


def summarize_stability(family: str, stores: list[str], touched: list[str], rounds: list[dict],
                        seconds: float) -> dict:
    """The rounds' figures pooled: per backfill path and over all rounds, the untouched stores changed per 100 file
    events (changed store-rounds / untouched store-rounds, scaled by the events), and the touched stores' medians."""
    def pool(rs: list[dict]) -> dict | None:
        if not rs:
            return None
        ev = sum(r["file_events"] for r in rs)
        n_u = sum(r["untouched"] for r in rs)
        k_u = sum(len(r["untouched_changed"]) for r in rs)
        share = k_u / n_u if n_u else float("nan")
        return {"rounds": len(rs), "file_events": ev, "untouched_store_rounds": n_u, "untouched_changed": k_u,
                "untouched_changed_share": share,
                "untouched_changed_share_per_100_events": share * 100 * len(rs) / ev if ev else float("nan"),
                "touched_store_rounds": sum(r["touched"] for r in rs),
                "touched_changed": sum(r["touched_changed"] for r in rs),
                "touched_words_changed_median": statistics.median(r["touched_words_changed_median"] for r in rs),
                "touched_words_new_median": statistics.median(r["touched_words_new_median"] for r in rs),
                "touched_prefix_kept_median": statistics.median(r["touched_prefix_kept_median"] for r in rs)}
    paths = sorted({r["backfill"] for r in rounds})
    return {"family": family, "stores": len(stores), "touched": touched,
            "untouched": [s for s in stores if s not in touched], "rounds": rounds,
            "all": pool(rounds), "by_backfill": {p: pool([r for r in rounds if r["backfill"] == p]) for p in paths},
            "seconds": seconds}
