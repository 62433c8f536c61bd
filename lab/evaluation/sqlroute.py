"""The extension's own routers, storetopics.route() (the stores' clusters) and storetopics.route_text() (the stores'
term counts), on the routing benchmark's queries, and the retrieve-or-not question: queries whose answer is in no
store (held-out packages of Debian sections that have no store in the set), on which a router should abstain.

Both routers see the stores' contents (as the centroid reference does), not a description.  route() gets the
query's all-MiniLM-L6-v2 embedding the harness already computed, route_text() the query text.  Each query is routed
once over every store of the set (k = the number of stores), which gives the rank of the true store (top-1,
recall@k, the same Wilson intervals as the other routers) and the best store's score (abstain below a threshold).
The threshold is chosen on the tuning half (best abstention F1 there; run.py) and reported on the other half.

`variants()` is the measurement route()'s score was chosen by: the same clusters (read from the database), scored
in Python several ways.
"""
from __future__ import annotations

import numpy as np
import psycopg

from . import metrics

ROUTERS = ("route", "route_text")
# Scores tried for route() (d: cosine distance to a cluster, r: its radius, share: its share of the store's chunks;
# "mixture": ln(sum_c share_c exp(kappa (1 - d_c))) / kappa, the one route() uses with kappa 20).
VARIANTS = ("cosine, best cluster", "cosine + 0.02 ln share", "cosine + 0.05 ln share", "1 - d / radius",
            "radius - d", "1 - d / radius + 0.05 ln share", "mixture, kappa 10", "mixture, kappa 20",
            "mixture, kappa 40", "mixture, kappa 20, equal shares")


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v.tolist()) + "]"


def catalog_of(conn: psycopg.Connection, table: str) -> str:
    return conn.execute("SELECT 'source:' || id FROM storetopics.sources WHERE chunks = %s::regclass",
                        (table,)).fetchone()[0]


def scores(conn: psycopg.Connection, fn: str, queries, stores: list[str], catalog: str) -> tuple[np.ndarray, np.ndarray]:
    """(queries x stores scores, -inf where the store got no row; whether route asked to search any store)."""
    sidx = {s: i for i, s in enumerate(stores)}
    m = np.full((len(queries), len(stores)), -np.inf)
    searched = np.zeros(len(queries), dtype=bool)
    sql = (f"SELECT store_key, score, search FROM storetopics.{fn}(%s{'::vector' if fn == 'route' else ''}, %s, %s)")
    for i, q in enumerate(queries):
        for key, score, search in conn.execute(sql, (_vec(q) if fn == "route" else q, len(stores), catalog)):
            m[i, sidx[key]] = score
            searched[i] |= bool(search)
    return m, searched


def evaluate(conn: psycopg.Connection, table: str, stores: list[str], *, q_texts, q_vecs, truth, syn_texts,
             syn_vecs, out_texts, out_vecs, out_sections, k: int, log=print) -> dict:
    """Per router: the routing metrics on the in-store queries (entries shaped like evaluate()'s, the main figures
    under "embedding" like every router's) and the abstention material (top scores of in-store and out-of-store
    queries, the curve, the installed default's decisions)."""
    cat = catalog_of(conn, table)
    out: dict = {}
    for fn in ROUTERS:
        dim_ok = fn != "route" or conn.execute(
            "SELECT EXISTS (SELECT 1 FROM storetopics.clusters k JOIN storetopics.sources s ON s.id = k.source_id "
            "WHERE s.chunks = %s::regclass AND k.chunks > 0)", (table,)).fetchone()[0]
        if not dim_ok:
            out[fn] = {"available": False, "note": "no clusters in this set"}
            continue
        qa = q_vecs if fn == "route" else q_texts
        sa = syn_vecs if fn == "route" else syn_texts
        oa = out_vecs if fn == "route" else out_texts
        m_in, s_in = scores(conn, fn, qa, stores, cat)
        m_syn = scores(conn, fn, sa, stores, cat)[0] if sa is not None else None
        m_out, s_out = scores(conn, fn, oa, stores, cat) if len(oa) else (np.zeros((0, len(stores))), np.zeros(0))
        top_in, top_out = m_in.max(axis=1), m_out.max(axis=1) if len(m_out) else np.zeros(0)
        default = conn.execute(f"SELECT (storetopics.default_settings() ->> '{fn}_threshold')::float8").fetchone()[0]
        entry = {"available": True, "available_stores": int(np.sum(np.isfinite(m_in).any(axis=0))),
                 "stores": len(stores), "embedding": metrics.rank_metrics(m_in, truth, k),
                 "top_in": top_in.tolist(), "top_out": top_out.tolist(), "out_sections": list(out_sections),
                 "default_threshold": default,
                 # what the function itself returned at the installed default: queries some store holds that it
                 # sends to a search (some row with search = true), queries no store holds that it does not
                 "search_in": metrics.summarize(s_in), "no_search_out": metrics.summarize(~s_out.astype(bool))}
        if m_syn is not None:
            entry["embedding_synopsis"] = metrics.rank_metrics(m_syn, truth, k)
        if len(top_out):
            lo, hi = np.percentile(np.concatenate([top_in, top_out]), [1, 99])
            grid = np.round(np.linspace(lo, hi, 41), 4)
            entry["auc"] = metrics.auc(top_in, top_out)
            entry["curve"] = metrics.abstention_curve(top_in, top_out, grid)
            entry["at_default"] = metrics.abstention(top_in, top_out, default)
            # the decisions route() itself returned (search on no row = abstain): the same as the default's, read
            # from the function rather than recomputed
            entry["function_abstained"] = {"in": int(np.sum(~s_in)), "out": int(np.sum(~s_out)),
                                           "agrees_with_threshold": bool(
                                               np.all((~s_in) == (top_in < default))
                                               and np.all((~s_out) == (top_out < default)))}
            entry["out_abstained_by_section"] = {
                s: float(np.mean(top_out[np.array(out_sections) == s] < default)) for s in sorted(set(out_sections))}
        out[fn] = entry
        log(f"  {fn:10s} top-1 {100 * entry['embedding']['top1']['value']:5.1f}%  "
            f"recall@{k} {100 * entry['embedding'][f'recall@{k}']['value']:5.1f}%"
            + (f"  abstention F1 at the default {default:g}: {entry['at_default']['f1']['value']:.3f}"
               if "at_default" in entry else ""))
    return out


def at(entry: dict, threshold: float) -> dict:
    """Abstention figures of one set's router entry at a threshold."""
    return metrics.abstention(entry["top_in"], entry["top_out"], threshold)


# ------------------------------------------------------------------------------------------------------------
# The measurement route()'s score was chosen by
# ------------------------------------------------------------------------------------------------------------
def _clusters(conn: psycopg.Connection, table: str, stores: list[str]):
    rows = conn.execute("""
        SELECT k.store_key, k.centroid::text, k.radius, k.chunks FROM storetopics.clusters k
          JOIN storetopics.sources s ON s.id = k.source_id
         WHERE s.chunks = %s::regclass AND k.chunks > 0 ORDER BY k.store_key, k.cluster_id""", (table,)).fetchall()
    sidx = {s: i for i, s in enumerate(stores)}
    keep = [r for r in rows if r[0] in sidx]
    cen = np.array([[float(x) for x in r[1].strip("[]").split(",")] for r in keep])
    sid = np.array([sidx[r[0]] for r in keep])
    radius = np.array([r[2] for r in keep], float)
    n = np.array([r[3] for r in keep], float)
    share = n / np.array([n[sid == s].sum() for s in sid])
    return cen, sid, radius, share


def _variant_scores(name: str, q: np.ndarray, cen, sid, radius, share, n_stores: int) -> np.ndarray:
    d = 1 - q @ cen.T
    if name.startswith("mixture"):
        kappa = float(name.split("kappa ")[1].split(",")[0])
        equal = "equal" in name
        a = kappa * (1 - d) + (0.0 if equal else np.log(share)[None, :])
        out = np.full((len(q), n_stores), -np.inf)
        for j in range(n_stores):
            m = sid == j
            if m.any():   # equal shares: 1 / (the store's clusters) each
                out[:, j] = (np.logaddexp.reduce(a[:, m], axis=1) - (np.log(m.sum()) if equal else 0.0)) / kappa
        return out
    s = {"cosine, best cluster": lambda: 1 - d,
         "cosine + 0.02 ln share": lambda: 1 - d + 0.02 * np.log(share)[None, :],
         "cosine + 0.05 ln share": lambda: 1 - d + 0.05 * np.log(share)[None, :],
         "1 - d / radius": lambda: 1 - d / radius[None, :],
         "radius - d": lambda: radius[None, :] - d,
         "1 - d / radius + 0.05 ln share": lambda: 1 - d / radius[None, :] + 0.05 * np.log(share)[None, :]}[name]()
    out = np.full((len(q), n_stores), -np.inf)
    for j in range(n_stores):
        m = sid == j
        if m.any():
            out[:, j] = s[:, m].max(axis=1)
    return out


def variants(conn: psycopg.Connection, table: str, stores: list[str], q_vecs, truth, out_vecs, k: int,
             sql_top_in=None) -> dict:
    """Each score of VARIANTS on the same clusters and queries: top-1, recall@k, AUC of the best store's score
    (in-store vs no-store queries) and the best abstention F1 on this set (an oracle threshold: comparable between
    variants, not a result).  Also how far route()'s own scores are from "mixture, kappa 20" (a check of the SQL)."""
    cen, sid, radius, share = _clusters(conn, table, stores)
    if not len(cen):
        return {}
    out = {}
    for name in VARIANTS:
        p = _variant_scores(name, q_vecs, cen, sid, radius, share, len(stores))
        r = metrics.rank_metrics(p, truth, k)
        e = {"top1": r["top1"]["value"], f"recall@{k}": r[f"recall@{k}"]["value"]}
        if len(out_vecs):
            o = _variant_scores(name, out_vecs, cen, sid, radius, share, len(stores))
            ti, to = p.max(axis=1), o.max(axis=1)
            t = metrics.best_threshold(ti, to)
            e.update(auc=metrics.auc(ti, to), best_f1=metrics.abstention(ti, to, t, reps=0)["f1"]["value"],
                     best_threshold=t)
        out[name] = e
        if name == "mixture, kappa 20" and sql_top_in is not None:
            out["sql_vs_python_max_abs_diff"] = float(np.max(np.abs(p.max(axis=1) - np.asarray(sql_top_in))))
    return out
