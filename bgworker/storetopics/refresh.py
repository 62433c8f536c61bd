"""One refresh pass over one store, from outside the database: fit its clusters when due, refresh their words
(the keyword gate), label what is due, render.

`refresh_store()` is the pass, read top to bottom: `storetopics backfill` (api.backfill) runs it on every store with
work due after a fold, and the worker runs it on the store it claimed, under its lease (a Lease: the lease is checked
in SQL between steps and before each labelling call, and the render is written only while it holds).  After the
render, the store's file novelty is kept again when the uploads piled up since make renders dearer than a keep
(keep_worn): the summary is already written, and the next upload's render does not pay for the keep.  Which stores
have work due is one SQL function, storetopics._stores_due(), which the SQL backfill() uses too; whether a source's
stores get LLM labels is one SQL function too, storetopics._llm_labeller(), asked once per pass (llm_labeller()).  The
connection must be in autocommit mode: no transaction is held open while clustering runs or while a labelling call
waits on the network.  The fit itself is the same code that runs inside Postgres where plpython3u exists
(clustering.fit_store, from plpy/storetopics_clustering.py).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

import psycopg

from .errors import Unavailable, require
from .labels import ClusterInput, LabelError, StoreInput, make_labeler

log = logging.getLogger("storetopics.refresh")
worker_log = logging.getLogger("storetopics.worker")


class Stopping(Exception):
    """SIGTERM arrived: give the store back."""


class LeaseLost(Exception):
    """Another worker holds the store now (ours expired): write nothing more."""


@dataclass
class Lease:
    """A worker's lease on the store of a pass (storetopics._claim): the pass checks it between steps and before each
    labelling call (raising Stopping once `stopping` is set, LeaseLost once another worker holds the store), logs
    each labelling call under the worker's name, and renders with storetopics._work_render (nothing is written once
    the lease is gone)."""
    worker: str
    stopping: threading.Event = field(default_factory=threading.Event)
    verbose: bool = False      # the labelling calls logged at info level, not debug

    def check(self, conn: psycopg.Connection, source: int, store: str) -> None:
        if self.stopping.is_set():
            raise Stopping()
        if not conn.execute("SELECT storetopics._lease_held(%s, %s, %s)", (self.worker, source, store)).fetchone()[0]:
            raise LeaseLost()

    def log(self, msg: str) -> None:
        worker_log.log(logging.INFO if self.verbose else logging.DEBUG, msg, extra={"worker": self.worker})


@dataclass
class LabelStats:
    calls: int = 0
    ok: int = 0
    rejected: int = 0
    errors: int = 0
    last_error: str | None = None
    details: list = field(default_factory=list)
    unavailable: Unavailable | None = None   # the labeller cannot work (no key, SDK or server): nothing was recorded


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


def llm_labeller(conn: psycopg.Connection, source: int, labellers: Labellers | None = None):
    """The source's LLM labeller, or None when its labels are the offline ones: the decision is SQL's
    (storetopics._llm_labeller), made here once for a pass.  Raises errors.Unavailable when the labeller cannot be
    made here (its SDK missing)."""
    name, model = conn.execute("SELECT CASE WHEN storetopics._llm_labeller(%s) THEN s ->> 'labeller' END, "
                               "s ->> 'model' FROM storetopics._settings(%s) s", (source, source)).fetchone()
    if name is None:
        return None
    return labellers.get(name, model) if labellers is not None else make_labeler(name, model)


def label(conn: psycopg.Connection, source: int, store: str, labeller=None, *, lease: Lease | None = None,
          labellers: Labellers | None = None) -> LabelStats:
    """Ask the source's LLM labeller for the clusters whose label is due, and for a keyword-only store's labels when
    they are due (none with the offline labeller: storetopics._labels_due and store_labels_due return nothing, its
    label is derived in SQL from the cluster's words).  One call per cluster, one per such store; each call is
    recorded in the ledger.  The labeller is made (llm_labeller()) only when something is due, unless one is given;
    under a lease, the lease is checked before each call."""
    if not conn.autocommit:
        raise ValueError("refresh.label needs an autocommit connection (no transaction open during LLM calls)")
    stats = LabelStats()
    due = conn.execute("SELECT cluster_id, keywords, representatives, share, siblings, others "
                       "FROM storetopics._labels_due(%s, %s)", (source, store)).fetchall()
    store_due = conn.execute("SELECT terms, phrases, others, files FROM storetopics._store_labels_due(%s, %s)",
                             (source, store)).fetchone()
    if not due and not store_due:
        return stats
    try:
        labeller = labeller or llm_labeller(conn, source, labellers)
    except Unavailable as e:   # no SDK: nothing asked, nothing recorded, the old labels stay
        stats.unavailable = e
        return stats
    if labeller is None:       # (offline: nothing is due)
        return stats
    if store_due:
        store_input = StoreInput(terms=list(store_due[0] or []), phrases=list(store_due[1] or []),
                                 others=list(store_due[2] or []), files=int(store_due[3] or 0))
        asked = _ask(conn, stats, labeller, labeller.label_store, store_input, "_record_store_labels",
                     (source, store), lambda r: r.labels, lease)
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
                     (source, store, cluster_id), lambda r: r.text, lease)
        if asked:
            result, ok = asked
            stats.rejected += bool(result.rejected)
            stats.ok += not result.rejected
            stats.details.append((cluster_id, "rejected" if result.rejected else "ok",
                                  result.rejected or result.text, ok))
    if stats.unavailable and labellers is not None:
        labellers.failed(labeller, stats.unavailable)
    return stats


def _ask(conn: psycopg.Connection, stats: LabelStats, labeller, call, what, record: str, key: tuple, answer,
         lease: Lease | None = None):
    """One labelling call (call(what)), written back whatever happened by storetopics.<record>(key..., outcome, answer,
    labeller, model, tokens in and out, detail), which judges the answer.  Returns (the Label, what record returned),
    or None when the call failed (recorded as an error: retried with backoff).  A labeller that cannot work at all
    (labels.LabellerUnavailable: no key, no server, a key refused) is no call: nothing is recorded (the labels stay
    due, so the next run asks again at once once it is fixed) and stats.unavailable says why; the caller stops.
    Under a lease, the lease is checked first (no call for a store another worker has taken)."""
    model = getattr(labeller, "model", None)
    sql = f"SELECT storetopics.{record}({', '.join(['%s'] * (len(key) + 7))})"
    try:
        if lease is not None:
            lease.check(conn, key[0], key[1])
            lease.log(f"label call {key[0]}:{key[1]}")
        try:
            result = call(what)
        finally:
            if lease is not None:
                lease.log(f"label done {key[0]}:{key[1]}")
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
    return bool(_render_counted(conn, source, store))


def _render_counted(conn: psycopg.Connection, source: int, store: str, lease: Lease | None = None) -> bool | None:
    """Render; when the candidates hold uncounted chunks, count them and render again, in one transaction: the
    second render packs what the first computed (storetopics._render keeps it until commit).  Under a lease,
    storetopics._work_render renders, and writes nothing (returns None) once the lease is gone."""
    def render_once(count_first: bool) -> bool | None:
        if lease is None:
            return conn.execute("SELECT storetopics._render(%s, %s, %s)", (source, store, count_first)).fetchone()[0]
        return conn.execute("SELECT storetopics._work_render(%s, %s, %s, %s)",
                            (lease.worker, source, store, count_first)).fetchone()[0]

    with conn.transaction():
        changed = render_once(True)
        if changed is None and count_tokens(conn, source, store):
            changed = render_once(False)
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


@dataclass
class Pass:
    fit: dict | None = None            # the fit's report when one ran
    labels: LabelStats = field(default_factory=LabelStats)
    changed: bool | None = None        # whether the summary changed; None: not rendered (the lease was gone)
    fit_unavailable: Unavailable | None = None   # a fit was due and cannot run here (the extra `cluster` missing)
    novelty_kept: bool = False         # the store's file novelty was kept again after the render (keep_worn)

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

    def failed(self, labeller, e: Unavailable) -> None:
        """A labeller made here turned out not to work (no key, no server): the rest of the run is not asked."""
        for key, made in self._made.items():
            if made is labeller:
                self._made[key] = e


def refresh_store(conn: psycopg.Connection, source: int, store: str, *, lease: Lease | None = None,
                  labeller=None, labellers: Labellers | None = None) -> Pass:
    """The pass over one store, after its source was folded: fit (when fit_due says so), the clusters' words and
    the keyword gate (refresh_words, gated in SQL on the store's version), the labels that are due (LLM labeller
    only), render (counting unknown token counts with tiktoken first: one write, one NOTIFY).  What cannot run here
    (a fit without the extra `cluster`, a labeller without its key, SDK or server) is skipped and reported in
    Pass.unavailable: the store is rendered from what it has (its keywords, its old labels).  Under a worker's
    lease, the lease is checked after the fit, before each labelling call and before the render (Stopping,
    LeaseLost), and the render is written only while the lease holds (Pass.changed None otherwise).  A render
    written, the store's file novelty is kept again when it is worn (keep_worn; Pass.novelty_kept)."""
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
        if lease is not None:
            lease.check(conn, source, store)
    conn.execute("SELECT storetopics._refresh_words(%s, %s)", (source, store))
    result.labels = label(conn, source, store, labeller, lease=lease, labellers=labellers)
    if result.labels.errors:
        log.warning("%s labelling call(s) failed for %s:%s (old labels kept, retried later): %s",
                    result.labels.errors, source, store, result.labels.last_error,
                    extra={"source": source, "store": store})
    if lease is not None:
        lease.check(conn, source, store)
    result.changed = _render_counted(conn, source, store, lease)
    if result.changed is not None and not (lease is not None and lease.stopping.is_set()):
        try:
            result.novelty_kept = keep_worn(conn, source, store)
        except psycopg.Error as e:   # the summary is written: a worn state not kept now is kept by the next render
            if conn.closed or conn.broken or (lease is not None and lease.stopping.is_set()):
                raise
            log.warning("could not keep the file novelty of %s:%s again (the next render will): %s", source, store,
                        " ".join(str(e).split()), extra={"source": source, "store": store})
    return result


def keep_worn(conn: psycopg.Connection, source: int, store: str) -> bool:
    """After a render: keep the store's file novelty again when the uploads piled up since it was kept make renders
    dearer than a keep (storetopics._keep_worn), so that the next upload's render does not pay for the keep.  Its
    own transaction; a store another session holds is left to it.  Returns whether it kept."""
    t0 = time.monotonic()
    kept = conn.execute("SELECT storetopics._keep_worn(%s, %s)", (source, store)).fetchone()[0]
    if kept:
        log.debug("kept the file novelty of %s:%s again (%.2fs)", source, store, time.monotonic() - t0,
                  extra={"source": source, "store": store})
    return kept


def stores_to_label(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    return [r[0] for r in conn.execute("SELECT store_key FROM storetopics._stores_due(%s, %s) WHERE label",
                                       (source, store))]
