"""Bring stores up to date from outside the database: fit clusters when due, label them, render.

Used by `storetopics backfill` and by the worker.  The connection must be in autocommit mode: no transaction is
held open while clustering runs or while a labelling call waits on the network.  The fit itself is the same code
that runs inside Postgres where plpython3u exists (clustering.fit_store, from plpy/storetopics_clustering.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import psycopg

from .plpy import storetopics_clustering as clustering
from .labels import ClusterInput, LabelError, make_labeler


@dataclass
class LabelStats:
    calls: int = 0
    ok: int = 0
    rejected: int = 0
    errors: int = 0
    last_error: str | None = None
    details: list = field(default_factory=list)


def settings(conn: psycopg.Connection, source: int) -> dict:
    return conn.execute("SELECT storetopics._settings(%s)", (source,)).fetchone()[0]


def fit_due(conn: psycopg.Connection, source: int, store: str) -> str | None:
    """Why the store needs a (re-)fit now, or None."""
    return conn.execute("SELECT storetopics.fit_due(%s, %s)", (source, store)).fetchone()[0]


def fit(conn: psycopg.Connection, source: int, store: str) -> dict:
    """Sample, fit, match and apply one store's clusters (storetopics.apply_fit writes it, compare-and-set)."""
    if not conn.autocommit:
        raise ValueError("refresh.fit needs an autocommit connection (no transaction open while fitting)")
    return json.loads(clustering.fit_store(clustering.PsycopgDatabase(conn), source, store))


def label(conn: psycopg.Connection, source: int, store: str, labeller=None) -> LabelStats:
    """Ask the configured labeller for the clusters whose label is due (none with the offline labeller: its label
    is derived in SQL from the cluster's words).  One call per cluster; each call is recorded in the ledger."""
    if not conn.autocommit:
        raise ValueError("refresh.label needs an autocommit connection (no transaction open during LLM calls)")
    stats = LabelStats()
    cfg = settings(conn, source)
    if cfg.get("labeller", "offline") == "offline":
        return stats
    due = conn.execute("SELECT cluster_id, keywords, representatives, share, siblings, others "
                       "FROM storetopics.labels_due(%s, %s)", (source, store)).fetchall()
    if not due:
        return stats
    labeller = labeller or make_labeler(cfg["labeller"], cfg.get("model"))
    model = getattr(labeller, "model", None)
    for cluster_id, keywords, reps, share, siblings, others in due:
        cluster = ClusterInput(keywords=list(keywords or []), representatives=[r.get("text") or "" for r in reps or []],
                               share=float(share or 0), siblings=list(siblings or []), others=list(others or []))
        stats.calls += 1
        try:
            result = labeller.label(cluster)
        except LabelError as e:
            stats.errors += 1
            stats.last_error = str(e)
            conn.execute("SELECT storetopics.record_label(%s, %s, %s, 'error', NULL, %s, %s, 0, 0, %s)",
                         (source, store, cluster_id, labeller.name, model, str(e)))
            continue
        outcome = "rejected" if result.rejected else "ok"
        ok = conn.execute("SELECT storetopics.record_label(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                          (source, store, cluster_id, outcome, None if result.rejected else result.text,
                           labeller.name, result.model or model, result.input_tokens, result.output_tokens,
                           result.rejected)).fetchone()[0]
        if result.rejected:
            stats.rejected += 1
        else:
            stats.ok += 1
        stats.details.append((cluster_id, outcome, result.text if not result.rejected else result.rejected, ok))
    return stats


def render(conn: psycopg.Connection, source: int, store: str) -> bool:
    """Render a store's summary.  When its candidates hold chunks whose cl100k token count is not known yet (SQL
    alone takes them at a token per byte), count them with the real tokenizer first, then render: one write, one
    NOTIFY.  Returns whether the summary changed."""
    changed = conn.execute("SELECT storetopics.render(%s, %s, true)", (source, store)).fetchone()[0]
    if changed is None:
        count_tokens(conn, source, store)
        changed = conn.execute("SELECT storetopics.render(%s, %s)", (source, store)).fetchone()[0]
    return bool(changed)


def count_tokens(conn: psycopg.Connection, source: int, store: str) -> int:
    """Count with tiktoken (cl100k, offline) the chunks of a store's candidate summary that storetopics.token_counts
    does not know yet (store_state.uncounted, left by the last render), and record them.  Returns how many."""
    row = conn.execute("SELECT uncounted FROM storetopics.store_state WHERE source_id = %s AND store_key = %s",
                       (source, store)).fetchone()
    chunks = list(row[0] or []) if row else []
    if chunks:
        from . import tokens
        conn.execute("SELECT storetopics.record_token_counts(%s, %s)", (chunks, [tokens.count(c) for c in chunks]))
    return len(chunks)


def stores_to_fit(conn: psycopg.Connection, source: int, store: str | None = None) -> list[tuple[str, str]]:
    return [tuple(r) for r in conn.execute(
        """SELECT st.store_key, storetopics.fit_due(st.source_id, st.store_key) FROM storetopics.store_state st
            WHERE st.source_id = %s AND (%s::text IS NULL OR st.store_key = %s) AND st.files > 0
              AND storetopics.fit_due(st.source_id, st.store_key) IS NOT NULL
            ORDER BY st.store_key""", (source, store, store))]


def stores_with_stale_words(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    """Stores whose clusters' words predate their last change (storetopics.refresh_words recomputes them and runs
    the keyword gate: labels due where the words moved)."""
    return [r[0] for r in conn.execute(
        """SELECT st.store_key FROM storetopics.store_state st
            WHERE st.source_id = %s AND (%s::text IS NULL OR st.store_key = %s) AND st.words_version <> st.version
              AND EXISTS (SELECT 1 FROM storetopics.clusters k
                           WHERE k.source_id = st.source_id AND k.store_key = st.store_key)
            ORDER BY 1""", (source, store, store))]


def stores_to_label(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    return [r[0] for r in conn.execute(
        """SELECT DISTINCT k.store_key FROM storetopics.clusters k
            WHERE k.source_id = %s AND (%s::text IS NULL OR k.store_key = %s) AND k.label_needed AND k.chunks > 0
              AND coalesce(k.label_retry_at, '-infinity') <= now()
              AND storetopics._settings(k.source_id) ->> 'labeller' <> 'offline'
            ORDER BY 1""", (source, store, store))]


def stores_to_render(conn: psycopg.Connection, source: int, store: str | None = None) -> list[str]:
    return [r[0] for r in conn.execute(
        """SELECT st.store_key FROM storetopics.store_state st
            WHERE st.source_id = %s AND (%s::text IS NULL OR st.store_key = %s) AND storetopics.render_due(st)
            ORDER BY st.store_key""", (source, store, store))]
