"""One refresh pass over one store, from outside the database: fit its clusters when due, refresh their words
(the keyword gate), label what is due, render.

`refresh_store()` is the pass: `storetopics backfill` (api.backfill) runs it on every store with work due after a
fold, and the worker runs it on the store it claimed, adding its lease check between steps and rendering under its
lease (Hooks).  Which stores have work due is one SQL function, storetopics._stores_due(), which the SQL backfill()
uses too.  The connection must be in autocommit mode: no transaction is
held open while clustering runs or while a labelling call waits on the network.  The fit itself is the same code
that runs inside Postgres where plpython3u exists (clustering.fit_store, from plpy/storetopics_clustering.py).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import psycopg

from .errors import Unavailable, require
from .labels import ClusterInput, LabelError, StoreInput, make_labeler

log = logging.getLogger("storetopics.refresh")


@dataclass
class LabelStats:
    calls: int = 0
    ok: int = 0
    rejected: int = 0
    errors: int = 0
    last_error: str | None = None
    details: list = field(default_factory=list)
    unavailable: Unavailable | None = None   # the labeller cannot work (no key, SDK or server): nothing was recorded


def settings(conn: psycopg.Connection, source: int) -> dict:
    return conn.execute("SELECT storetopics._settings(%s)", (source,)).fetchone()[0]


def fit_due(conn: psycopg.Connection, source: int, store: str) -> str | None:
    """Why the store needs a (re-)fit now, or None."""
    return conn.execute("SELECT storetopics._fit_due(%s, %s)", (source, store)).fetchone()[0]


def fit(conn: psycopg.Connection, source: int, store: str) -> dict:
    """Sample, fit, match and apply one store's clusters (storetopics._apply_fit writes it, compare-and-set)."""
    if not conn.autocommit:
        raise ValueError("refresh.fit needs an autocommit connection (no transaction open while fitting)")
    clustering = clustering_module()
    return json.loads(clustering.fit_store(clustering.PsycopgDatabase(conn), source, store))


def clustering_module():
    """plpy/storetopics_clustering.py, loaded when a fit runs: it needs numpy, scikit-learn and scipy (the extra
    `cluster`); without them, errors.MissingExtra."""
    for module in ("numpy", "sklearn", "scipy"):
        require(module, "cluster", "clustering the embeddings outside the database")
    from .plpy import storetopics_clustering
    return storetopics_clustering


def label(conn: psycopg.Connection, source: int, store: str, labeller=None) -> LabelStats:
    """Ask the configured labeller for the clusters whose label is due (none with the offline labeller: its label
    is derived in SQL from the cluster's words), and for a keyword-only store's labels when they are due.  One call
    per cluster, one per such store; each call is recorded in the ledger."""
    if not conn.autocommit:
        raise ValueError("refresh.label needs an autocommit connection (no transaction open during LLM calls)")
    stats = LabelStats()
    cfg = settings(conn, source)
    if cfg.get("labeller", "offline") == "offline":
        return stats
    due = conn.execute("SELECT cluster_id, keywords, representatives, share, siblings, others "
                       "FROM storetopics._labels_due(%s, %s)", (source, store)).fetchall()
    store_due = conn.execute("SELECT terms, phrases, others, files FROM storetopics._store_labels_due(%s, %s)",
                             (source, store)).fetchone()
    if not due and not store_due:
        return stats
    try:
        labeller = labeller or make_labeler(cfg["labeller"], cfg.get("model"))
    except Unavailable as e:   # no SDK: nothing asked, nothing recorded, the old labels stay
        stats.unavailable = e
        return stats
    if store_due:
        store_input = StoreInput(terms=list(store_due[0] or []), phrases=list(store_due[1] or []),
                                 others=list(store_due[2] or []), files=int(store_due[3] or 0))
        asked = _ask(conn, stats, labeller, labeller.label_store, store_input, "_record_store_labels",
                     (source, store), lambda r: r.labels)
        if asked:
            kept = asked[1]
            stats.ok += bool(kept)
            stats.rejected += not kept
            stats.details.append((None, "ok" if kept else "rejected", kept or asked[0].rejected, kept is not None))
    for cluster_id, keywords, reps, share, siblings, others in due:
        if stats.unavailable:
            break
        cluster = ClusterInput(keywords=list(keywords or []), representatives=[r.get("text") or "" for r in reps or []],
                               share=float(share or 0), siblings=list(siblings or []), others=list(others or []))
        asked = _ask(conn, stats, labeller, labeller.label, cluster, "_record_label",
                     (source, store, cluster_id), lambda r: r.text)
        if asked:
            result, ok = asked
            stats.rejected += bool(result.rejected)
            stats.ok += not result.rejected
            stats.details.append((cluster_id, "rejected" if result.rejected else "ok",
                                  result.rejected or result.text, ok))
    return stats


def _ask(conn: psycopg.Connection, stats: LabelStats, labeller, call, what, record: str, key: tuple, answer):
    """One labelling call (call(what)), written back whatever happened by storetopics._<record>(key..., outcome, answer,
    labeller, model, tokens in and out, detail), which judges the answer.  Returns (the Label, what record returned),
    or None when the call failed (recorded as an error: retried with backoff).  A labeller that cannot work at all
    (labels.LabellerUnavailable: no key, no server, a key refused) is no call: nothing is recorded (the labels stay
    due, so the next run asks again at once once it is fixed) and stats.unavailable says why; the caller stops."""
    model = getattr(labeller, "model", None)
    sql = f"SELECT storetopics.{record}({', '.join(['%s'] * (len(key) + 7))})"
    try:
        result = call(what)
    except Unavailable as e:
        stats.unavailable = e
        return None
    except LabelError as e:
        stats.calls += 1
        stats.errors += 1
        stats.last_error = str(e)
        conn.execute(sql, (*key, "error", None, labeller.name, model, 0, 0, str(e)))
        return None
    stats.calls += 1
    kept = conn.execute(sql, (*key, "rejected" if result.rejected else "ok",
                              None if result.rejected else answer(result), labeller.name, result.model or model,
                              result.input_tokens, result.output_tokens, result.rejected)).fetchone()[0]
    return result, kept


def render(conn: psycopg.Connection, source: int, store: str) -> bool:
    """Render a store's summary.  When its candidates hold chunks whose cl100k token count is not known yet (SQL
    alone takes them at a token per byte), count them with the real tokenizer first, then render: one write, one
    NOTIFY.  Returns whether the summary changed."""
    return bool(_render_counted(conn, source, store, Hooks()))


def _render_counted(conn: psycopg.Connection, source: int, store: str, hooks: Hooks) -> bool | None:
    """Render; when the candidates hold uncounted chunks, count them and render again, in one transaction: the
    second render packs what the first computed (storetopics._render keeps it until commit)."""
    with conn.transaction():
        changed = hooks.render(conn, source, store, True)
        if changed is None and count_tokens(conn, source, store):
            changed = hooks.render(conn, source, store, False)
    return changed


def count_tokens(conn: psycopg.Connection, source: int, store: str) -> int:
    """Count with tiktoken (cl100k, offline) the chunks of a store's candidate summary that storetopics.token_counts
    does not know yet (store_state.uncounted, left by the last render), and record them.  Returns how many."""
    row = conn.execute("SELECT uncounted FROM storetopics.store_state WHERE source_id = %s AND store_key = %s",
                       (source, store)).fetchone()
    chunks = list(row[0] or []) if row else []
    if chunks:
        from . import tokens
        conn.execute("SELECT storetopics._record_token_counts(%s, %s)", (chunks, [tokens.count(c) for c in chunks]))
    return len(chunks)


def stores_due(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    """The stores of a source (or the one store) with work due: a fit, stale words, a label, a render."""
    return [r[0] for r in conn.execute("SELECT store_key FROM storetopics._stores_due(%s, %s)", (source, store))]


class Hooks:
    """What a caller adds to a pass.  The worker overrides these to check its lease between steps (check raises to
    stop the pass), to check it again before each labelling call (labeller), and to render under its lease
    (render returns None when the lease is gone)."""

    def check(self) -> None:
        pass

    def labeller(self, labeller):
        return labeller

    def render(self, conn: psycopg.Connection, source: int, store: str, count_first: bool) -> bool | None:
        return conn.execute("SELECT storetopics._render(%s, %s, %s)", (source, store, count_first)).fetchone()[0]


@dataclass
class Pass:
    fit: dict | None = None            # the fit's report when one ran
    labels: LabelStats = field(default_factory=LabelStats)
    changed: bool | None = None        # whether the summary changed; None: not rendered (Hooks.render refused)
    fit_unavailable: Unavailable | None = None   # a fit was due and cannot run here (the extra `cluster` missing)

    @property
    def fitted(self) -> bool:
        return bool(self.fit and self.fit.get("applied"))

    @property
    def unavailable(self) -> list[Unavailable]:
        """What this pass could not do here, whatever the data (said once by the caller, with its hint)."""
        return [e for e in (self.fit_unavailable, self.labels.unavailable) if e is not None]


class Labellers:
    """The LLM labellers of one run over many stores (`storetopics backfill`), made once per (labeller, model).  One
    that cannot work (no key, no SDK, no server) is asked once in the run, not once per store."""

    def __init__(self):
        self._made: dict[tuple[str, str | None], object] = {}

    def get(self, name: str, model: str | None):
        key = (name.lower(), model)
        if key not in self._made:
            try:
                self._made[key] = make_labeler(name, model)
            except Unavailable as e:
                self._made[key] = e
        made = self._made[key]
        if isinstance(made, Unavailable):
            raise made
        return made

    def failed(self, name: str, model: str | None, e: Unavailable) -> None:
        self._made[(name.lower(), model)] = e


def refresh_store(conn: psycopg.Connection, source: int, store: str, hooks: Hooks | None = None,
                  labeller=None, labellers: Labellers | None = None) -> Pass:
    """The pass over one store, after its source was folded: fit (when fit_due says so), the clusters' words and
    the keyword gate (refresh_words, gated in SQL on the store's version), the labels that are due (LLM labeller
    only), render (counting unknown token counts with tiktoken first: one write, one NOTIFY).  What cannot run here
    (a fit without the extra `cluster`, a labeller without its key, SDK or server) is skipped and reported in
    Pass.unavailable: the store is rendered from what it has (its keywords, its old labels)."""
    hooks = hooks or Hooks()
    result = Pass()
    why = fit_due(conn, source, store)
    if why:
        log.debug("fit %s:%s (%s)", source, store, why, extra={"source": source, "store": store})
        try:
            result.fit = fit(conn, source, store)
        except Unavailable as e:
            result.fit_unavailable = e
        else:
            log.debug("fitted %s:%s: k=%s applied=%s in %ss", source, store, result.fit.get("k"), result.fitted,
                      result.fit.get("seconds"), extra={"source": source, "store": store})
        hooks.check()
    conn.execute("SELECT storetopics._refresh_words(%s, %s)", (source, store))
    cfg = settings(conn, source)
    if cfg.get("labeller", "offline") != "offline" and stores_to_label(conn, source, store):
        name, model = cfg["labeller"], cfg.get("model")
        try:
            inner = labeller or (labellers.get(name, model) if labellers else make_labeler(name, model))
        except Unavailable as e:
            result.labels = LabelStats(unavailable=e)
        else:
            result.labels = label(conn, source, store, hooks.labeller(inner))
            if result.labels.unavailable and labellers is not None:
                labellers.failed(name, model, result.labels.unavailable)
        if result.labels.errors:
            log.warning("%s labelling call(s) failed for %s:%s (old labels kept, retried later): %s",
                        result.labels.errors, source, store, result.labels.last_error,
                        extra={"source": source, "store": store})
    hooks.check()
    result.changed = _render_counted(conn, source, store, hooks)
    return result


def stores_to_label(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    return [r[0] for r in conn.execute("SELECT store_key FROM storetopics._stores_due(%s, %s) WHERE label",
                                       (source, store))]
