"""The routing benchmark: given only each store's description, does a router pick the store a query belongs to?

Stores: one per Debian section (one file per package, one chunk per paragraph, all-MiniLM-L6-v2 vectors in the
`embedding` column), attached with storetopics.attach and summarised by the real extension (backfill).  Queries:
held-out packages of each section (split by a hash of the package name: no query's package is in any store).
Each query is embedded and routed to the store whose description is nearest (cosine), or scored with BM25 against
the descriptions.  The drift scenario then replaces half of one store's files with another section's, backfills
incrementally, and routes again: the maintained summaries are re-read, the names and hand-written descriptions stay
as they were.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import data, docs, metrics, pg, quality, routers, sqlroute

# 16 sections, 7 look-alike pairs: admin/utils, net/web, math/science, gnome/kde, editors/text, haskell/ocaml,
# python/perl; plus sound and games.
DEFAULT_SECTIONS = ("admin", "utils", "net", "web", "math", "science", "gnome", "kde", "editors", "text",
                    "haskell", "ocaml", "python", "perl", "sound", "games")
LOOKALIKE_PAIRS = (("admin", "utils"), ("net", "web"), ("math", "science"), ("gnome", "kde"), ("editors", "text"),
                   ("haskell", "ocaml"), ("python", "perl"))
TABLE = "eval_routing"
# Tune on half, report on the other half: settings were chosen on the first half (look-alike pairs kept together),
# every figure is also reported on the second, and on all 16 sections together.
HALVES = {"tune": ("admin", "utils", "net", "web", "math", "science", "gnome", "kde"),
          "report": ("editors", "text", "haskell", "ocaml", "python", "perl", "sound", "games")}
# Retrieve or not: queries whose answer is in no store, held-out packages of sections with no store.  Every section
# of the corpus that is none of the 16 stores, except the catch-all ones whose packages may be about anything a
# store holds (libs, libdevel, devel, doc, misc) and fonts (the drift's section); alternately to each half, so that
# the threshold is chosen on sections the reporting half never sees.
ABSTAIN_SECTIONS = ("golang", "gnu-r", "graphics", "interpreters", "java", "javascript", "lisp", "mail", "php",
                    "ruby", "rust", "x11")
ABSTAIN_HALVES = {"tune": ABSTAIN_SECTIONS[0::2], "report": ABSTAIN_SECTIONS[1::2]}


# Query styles per family: the first is the family's main one (the routing table, drift, the abstention threshold),
# the second a short natural query (Debian: the held-out package's synopsis without its name; WordNet: the synset's
# lemmas; documents: the held-out page's title without the product's names).
STYLES = {"debian": ("descriptions", "synopses"), "wordnet": ("glosses", "lemmas"), "docs": ("passages", "titles")}
STYLE_LABELS = {"descriptions": "the held-out package's description", "synopses": "its synopsis line, name removed",
                "glosses": "the held-out synset's lemmas and gloss", "lemmas": "its lemmas",
                "passages": "30-word passages of held-out pages", "titles": "held-out pages' titles, product names "
                                                                          "removed"}
KMEANS_K = 20          # the nearest-cluster reference: KMeans clusters per store


def default_query_styles(family: str):
    """The query builder of the Debian and WordNet families: the held-out packages (sp.queries) as style one (their
    whole text), their synopsis line (WordNet: lemmas) as style two."""
    first, second = STYLES.get(family, STYLES["debian"])

    def build(sp: data.Split, sections: list[str], n: int) -> dict[str, list[tuple[str, str, str]]]:
        out: dict[str, list[tuple[str, str, str]]] = {first: [], second: []}
        for s in sections:
            for p in sp.queries[s]:
                out[first].append((s, p.text, p.short))
                q = p.short if family == "wordnet" else docs.strip_name(p.short, p.name)
                if q:
                    out[second].append((s, q, p.short))
        return out
    return build


def content_references(stores: list[str], store_vecs: np.ndarray, store_of: list[str], k: int = KMEANS_K,
                       seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """References that see the contents, as (vectors, store index per vector): each store's chunk vectors clustered
    with KMeans (K = k, unit-length centroids; a query goes to the store of its nearest centroid), and the chunks
    themselves (the store of the nearest chunk)."""
    from sklearn.cluster import KMeans
    sidx = {s: i for i, s in enumerate(stores)}
    sid = np.array([sidx[s] for s in store_of])
    cents, csid = [], []
    for j in range(len(stores)):
        v = store_vecs[sid == j]
        if not len(v):
            continue
        km = KMeans(n_clusters=min(k, len(v)), n_init=3, random_state=seed).fit(v)
        c = km.cluster_centers_
        cents.append(c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12))
        csid += [j] * len(c)
    return {"kmeans20": (np.vstack(cents).astype(np.float32), np.array(csid)), "nearest_chunk": (store_vecs, sid)}


def max_by_store(q_vecs: np.ndarray, mat: np.ndarray, sid: np.ndarray, n_stores: int) -> np.ndarray:
    """queries x stores: the best cosine of each query to any vector of the store (-inf for a store with none)."""
    out = np.full((len(q_vecs), n_stores), -np.inf)
    for lo in range(0, len(q_vecs), 256):
        sim = q_vecs[lo:lo + 256] @ mat.T
        for j in range(n_stores):
            m = sid == j
            if m.any():
                out[lo:lo + 256, j] = sim[:, m].max(axis=1)
    return out


@dataclass
class RoutingConfig:
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    held_share: float = 0.2             # share of each section's packages held out (by hash of the name)
    store_cap: int | None = 250         # files per store (a uniform sample by hash); None: all
    queries_per_section: int = 30       # held-out packages used as queries, per section
    drift_store: str | None = "editors"  # the store that drifts ...
    drift_from: str = "fonts"           # ... towards this section (not one of the stores)
    drift_share: float = 0.5            # share of its files replaced
    lengths: tuple[int, ...] = (5, 10, 20, 40, 80, 160)  # words kept of a summary, for the length curve
    bm25: bool = True
    k: int = 3                          # recall@k
    table: str = TABLE                  # the chunk table (one source: its own catalog)
    family: str = "debian"              # the corpus family, for the report
    abstain_sections: tuple[str, ...] = ABSTAIN_SECTIONS  # sections with no store whose held-out packages are
                                        # queries no store holds (retrieve or not)


@dataclass
class Stage:
    """Everything measured at one state of the stores (before or after drift)."""
    name: str
    descriptions: dict[str, dict[str, str | None]]  # router -> store -> text
    results: dict = field(default_factory=dict)


def _desc_matrix(embedder, texts: list[str | None]) -> np.ndarray:
    return embedder([t or "" for t in texts])


def evaluate(stores: list[str], descs: dict[str, dict[str, str | None]], q_texts: list[str], q_vecs: np.ndarray,
             truth: np.ndarray, embedder, *, k: int, bm25: bool, centroids: np.ndarray | None = None,
             synopsis: tuple[list[str], np.ndarray] | None = None, refs: dict | None = None) -> dict:
    """Per router: embedding and BM25 metrics (None when the router's descriptions are not available)."""
    out = {}
    for r in routers.ROUTERS:
        texts = [descs[r].get(s) for s in stores]
        have = sum(t is not None and t.strip() != "" for t in texts)
        entry = {"available_stores": have, "stores": len(stores),
                 "tokens_mean": float(np.mean([routers.tokens_estimate(t) for t in texts])) if have else 0.0}
        if have == 0:
            entry["available"] = False
            out[r] = entry
            continue
        entry["available"] = True
        dv = _desc_matrix(embedder, texts)
        entry["embedding"] = metrics.rank_metrics(routers.embedding_scores(q_vecs, dv), truth, k)
        if synopsis is not None:
            entry["embedding_synopsis"] = metrics.rank_metrics(routers.embedding_scores(synopsis[1], dv), truth, k)
        if bm25:
            entry["bm25"] = metrics.rank_metrics(routers.bm25_scores(q_texts, [t or "" for t in texts]), truth, k)
        out[r] = entry
    if centroids is not None:
        out["centroid"] = {"available": True, "available_stores": len(stores), "stores": len(stores),
                           "embedding": metrics.rank_metrics(routers.embedding_scores(q_vecs, centroids), truth, k)}
        if synopsis is not None:
            out["centroid"]["embedding_synopsis"] = metrics.rank_metrics(
                routers.embedding_scores(synopsis[1], centroids), truth, k)
    for name, (mat, sid) in (refs or {}).items():
        out[name] = {"available": True, "available_stores": len(set(sid.tolist())), "stores": len(stores),
                     "embedding": metrics.rank_metrics(max_by_store(q_vecs, mat, sid, len(stores)), truth, k)}
        if synopsis is not None:
            out[name]["embedding_synopsis"] = metrics.rank_metrics(max_by_store(synopsis[1], mat, sid, len(stores)),
                                                                   truth, k)
    return out


def length_curve(stores, descs, q_vecs, truth, embedder, lengths, k) -> dict:
    """Top-1 of the embedding router when each summary is cut to its first n words."""
    out: dict[str, list] = {}
    for r in ("keywords", "clusters", "hybrid", "name_hybrid", "handwritten", "tfidf150"):
        texts = [descs[r].get(s) for s in stores]
        if not any(texts):
            continue
        full = max(len((t or "").split()) for t in texts)
        pts = []
        for n in [*lengths, None]:
            if n is not None and n >= full:
                continue
            cut = [routers.truncate_words(t, n) for t in texts]
            m = metrics.rank_metrics(routers.embedding_scores(q_vecs, _desc_matrix(embedder, cut)), truth, k)
            pts.append({"words": n if n is not None else full,
                        "tokens_mean": float(np.mean([routers.tokens_estimate(t) for t in cut])),
                        "top1": m["top1"]["value"], "top1_ci95": m["top1"]["ci95"],
                        f"recall@{k}": m[f"recall@{k}"]["value"]})
        out[r] = pts
    return out


def confusions(stores: list[str], ranks_top: np.ndarray, truth: np.ndarray) -> list[dict]:
    """The most frequent (true store -> chosen store) mistakes."""
    pairs: dict[tuple[str, str], int] = {}
    for t, p in zip(truth.tolist(), ranks_top.tolist()):
        if t != p:
            pairs[(stores[t], stores[p])] = pairs.get((stores[t], stores[p]), 0) + 1
    return [{"true": a, "chosen": b, "queries": n} for (a, b), n in sorted(pairs.items(), key=lambda x: -x[1])[:10]]


def versus_baseline(before: dict) -> dict:
    """name + store_topics against the best baseline (name + top-N TF-IDF words) whose descriptions are no longer on
    average, per router: paired bootstrap of the top-1 differences on the same queries."""
    ours = before.get("name_hybrid", {})
    if not ours.get("available"):
        return {}
    out = {}
    for router in ("embedding", "bm25"):
        if router not in ours:
            continue
        fits = [b for b in routers.BASELINES if before.get(b, {}).get("available")
                and before[b]["tokens_mean"] <= ours["tokens_mean"] + 0.5 and router in before[b]]
        if not fits:
            continue
        best = max(fits, key=lambda b: (before[b][router]["top1"]["value"], -before[b]["tokens_mean"]))
        a = np.array(ours[router]["ranks"]) == 1
        b = np.array(before[best][router]["ranks"]) == 1
        out[router] = {"baseline": best, "ours": ours[router]["top1"], "best": before[best][router]["top1"],
                       "tokens": {"ours": ours["tokens_mean"], "baseline": before[best]["tokens_mean"]},
                       **metrics.paired_bootstrap(a, b)}
    return out


def label_verbatim(conn, table: str) -> dict:
    """Offline labels that are phrases people wrote: the share of clusters whose shown offline label occurs verbatim
    (case aside) in the text of the cluster's files, next to the 0.1 label (the cluster's first three words), and
    before/after pairs."""
    rows = conn.execute("""
        SELECT k.store_key, k.cluster_id, storetopics._offline_label(k.keywords) AS old,
               coalesce(k.phrase, storetopics._offline_label(k.keywords)) AS new, k.phrase IS NOT NULL AS mined,
               k.chunks
          FROM storetopics.clusters k JOIN storetopics.sources s ON s.id = k.source_id
         WHERE s.chunks = %s::regclass AND k.chunks > 0
         ORDER BY k.store_key, k.chunks DESC, k.cluster_id""", (table,)).fetchall()
    out = []
    for store, cid, old, new, mined, chunks in rows:
        def verbatim(label):
            return conn.execute(f"""
                SELECT EXISTS (SELECT 1 FROM storetopics.file_clusters f JOIN {table} c
                                   ON c.file = f.file_key AND c.store = f.store_key
                                WHERE f.store_key = %s AND %s = ANY (f.cluster_ids)
                                  AND f.source_id = (SELECT id FROM storetopics.sources WHERE chunks = %s::regclass)
                                  AND strpos(lower(c.content), lower(%s)) > 0)""",
                                (store, cid, table, label)).fetchone()[0]
        out.append({"store": store, "cluster": cid, "old": old, "new": new, "mined": mined, "chunks": chunks,
                    "old_verbatim": verbatim(old), "new_verbatim": verbatim(new)})
    n = len(out)
    return {"clusters": n, "new_verbatim": sum(x["new_verbatim"] for x in out) / n if n else None,
            "old_verbatim": sum(x["old_verbatim"] for x in out) / n if n else None,
            "mined": sum(x["mined"] for x in out) / n if n else None, "pairs": out}


def run(dsn: str, cfg: RoutingConfig, embedder, log=print, corpus: dict | None = None,
        handwritten: dict | None = None, query_styles=None, lookalike_pairs=LOOKALIKE_PAIRS) -> dict:
    """The routing benchmark on Debian sections (corpus None) or on another family's stores (corpus: store ->
    [data.Package]; handwritten: store -> (short, long) descriptions if the family has any).  query_styles(split,
    stores, n) -> {style: [(store, query, its synopsis)]} gives the queries (default: default_query_styles); the
    first style is the main one, every other is measured beside it (result["styles"])."""
    t_start = time.perf_counter()
    sections = list(cfg.sections)
    extra = [cfg.drift_from] if cfg.drift_store else []
    abstain = [s for s in cfg.abstain_sections if s not in sections and s not in extra]
    if corpus is None:
        corpus = data.read_sections([*sections, *extra, *abstain])
        handwritten = data.section_descriptions()
    abstain = [s for s in abstain if s in corpus]
    handwritten = handwritten or {}
    table = cfg.table
    sp = data.split(corpus, held_share=cfg.held_share, store_cap=cfg.store_cap,
                    queries_per_section=cfg.queries_per_section)
    stores = sorted(sections)
    sidx = {s: i for i, s in enumerate(stores)}

    # -- embeddings of the store chunks and the queries (cached on disk) ---------------------------------------
    store_rows = [(s, p.name, c) for s in stores for p in sp.store[s] for c in p.chunks]
    drift_pkgs = []
    if cfg.drift_store:
        n_replace = int(round(len(sp.store[cfg.drift_store]) * cfg.drift_share))
        drift_pkgs = data.by_hash(sp.store[cfg.drift_from], "drift")[:n_replace]
    drift_rows = [(cfg.drift_store, p.name, c) for p in drift_pkgs for c in p.chunks]
    qs = (query_styles or default_query_styles(cfg.family))(sp, [*stores, *abstain], cfg.queries_per_section)
    main_style, *other_styles = list(qs)
    queries = [q for q in qs[main_style] if q[0] in sidx]
    truth = np.array([sidx[q[0]] for q in queries], dtype=int)
    q_texts = [q[1] for q in queries]
    q_syn = [q[2] for q in queries]
    drift_queries = sp.queries[cfg.drift_from] if cfg.drift_store else []
    out_queries = [q for q in qs[main_style] if q[0] not in sidx]   # held out like the others; no store holds them
    log(f"routing: {len(stores)} stores, {sum(len(sp.store[s]) for s in stores):,} files, "
        f"{len(store_rows):,} chunks; {len(queries)} queries ({main_style}; held out by hash, "
        f"{cfg.held_share:.0%})")
    t0 = time.perf_counter()

    def progress(done, total):
        log(f"  embedded {done:,}/{total:,} new texts [{time.perf_counter() - t0:.0f}s]")

    all_texts = [c for _, _, c in store_rows] + [c for _, _, c in drift_rows] + q_texts + q_syn + \
        [p.text for p in drift_queries] + [p.short for p in drift_queries]
    vec_all = embedder(all_texts, progress=progress)
    out_vecs = embedder([q[1] for q in out_queries]) if out_queries else np.zeros((0, embedder.dim), np.float32)
    n1, n2, n3 = len(store_rows), len(store_rows) + len(drift_rows), len(store_rows) + len(drift_rows) + len(q_texts)
    store_vecs, drift_vecs = vec_all[:n1], vec_all[n1:n2]
    q_vecs, q_syn_vecs = vec_all[n2:n3], vec_all[n3:n3 + len(q_syn)]
    dq_vecs = vec_all[n3 + len(q_syn):n3 + len(q_syn) + len(drift_queries)]
    dq_syn_vecs = vec_all[n3 + len(q_syn) + len(drift_queries):]
    t_embed = time.perf_counter() - t0
    log(f"  embeddings ready in {t_embed:.0f}s ({embedder.name})")

    # -- the stores in Postgres ---------------------------------------------------------------------------------
    timings = {"embed_seconds": t_embed}
    with pg.connect(dsn) as conn:
        server = pg.server_info(conn)
        pg.create_chunks(conn, table, embedder.dim)
        t0 = time.perf_counter()
        pg.insert(conn, table, ((s, f, c, v) for (s, f, c), v in zip(store_rows, store_vecs)))
        timings["load_seconds"] = time.perf_counter() - t0
        pg.attach(conn, table)
        timings["backfill_seconds"] = pg.refresh(conn)
        rows = pg.stores(conn, table)
        log(f"  loaded, attached and backfilled: {len(rows)} stores in {timings['backfill_seconds']:.1f}s")
        missing = [s for s in stores if s not in rows]
        if missing:
            raise RuntimeError(f"stores without a summary after backfill: {missing}")

        def centroid_matrix(vecs_by_store: dict[str, list[np.ndarray]]) -> np.ndarray:
            return np.vstack([routers_unit(np.mean(vecs_by_store[s], axis=0)) for s in stores])

        by_store: dict[str, list] = {s: [] for s in stores}
        for (s, _, _), v in zip(store_rows, store_vecs):
            by_store[s].append(v)
        store_texts = {s: "\n".join(p.text for p in sp.store[s]) for s in stores}
        baseline = routers.tfidf_words(store_texts)
        descs = {r: {} for r in routers.ROUTERS}
        for s in stores:
            for r, t in routers.describe(s, rows[s], handwritten, baseline[s]).items():
                descs[r][s] = t
        t0 = time.perf_counter()
        refs = content_references(stores, store_vecs, [s for s, _, _ in store_rows])
        centroids = centroid_matrix(by_store)
        timings["references_seconds"] = time.perf_counter() - t0
        before = evaluate(stores, descs, q_texts, q_vecs, truth, embedder, k=cfg.k, bm25=cfg.bm25,
                          centroids=centroids, synopsis=(q_syn, q_syn_vecs), refs=refs)
        # the extension's own routers (they see the contents, as the centroid does), on the same queries, and on
        # the queries no store holds
        t0 = time.perf_counter()
        before.update(sqlroute.evaluate(conn, table, stores, q_texts=q_texts, q_vecs=q_vecs, truth=truth,
                                        syn_texts=q_syn, syn_vecs=q_syn_vecs, out_texts=[q[1] for q in out_queries],
                                        out_vecs=out_vecs, out_sections=[q[0] for q in out_queries], k=cfg.k,
                                        log=log))
        timings["route_seconds"] = time.perf_counter() - t0
        # -- the other query styles: every router again on the same stores and descriptions ------------------------
        styles = {}
        for st in other_styles:
            t0 = time.perf_counter()
            ins = [q for q in qs[st] if q[0] in sidx]
            outs = [q for q in qs[st] if q[0] not in sidx]
            tr = np.array([sidx[q[0]] for q in ins], dtype=int)
            v_in = embedder([q[1] for q in ins])
            v_out = embedder([q[1] for q in outs]) if outs else np.zeros((0, embedder.dim), np.float32)
            log(f"  style '{st}': {len(ins)} queries, {len(outs)} no store holds")
            ev = evaluate(stores, descs, [q[1] for q in ins], v_in, tr, embedder, k=cfg.k, bm25=cfg.bm25,
                          centroids=centroids, refs=refs)
            ev.update(sqlroute.evaluate(conn, table, stores, q_texts=[q[1] for q in ins], q_vecs=v_in, truth=tr,
                                        syn_texts=None, syn_vecs=None, out_texts=[q[1] for q in outs],
                                        out_vecs=v_out, out_sections=[q[0] for q in outs], k=cfg.k, log=log))
            styles[st] = {"queries": len(ins), "out_queries": len(outs), "before": ev,
                          "versus_baseline": versus_baseline(ev), "examples": examples(ins + outs)}
            timings[f"style_{st}_seconds"] = time.perf_counter() - t0
        route_variants = sqlroute.variants(conn, table, stores, q_vecs, truth, out_vecs, cfg.k,
                                           sql_top_in=before["route"].get("top_in"))
        curve = length_curve(stores, descs, q_vecs, truth, embedder, cfg.lengths, cfg.k)
        conf = {}
        for r in ("names", "handwritten", "hybrid", "name_hybrid", "tfidf60"):
            if before[r].get("available"):
                dv = _desc_matrix(embedder, [descs[r][s] for s in stores])
                conf[r] = confusions(stores, np.argmax(routers.embedding_scores(q_vecs, dv), axis=1), truth)
        paired = {}
        hyb = before["hybrid"]
        for other in ("names", "handwritten", "handwritten_short", "keywords", "clusters", *routers.BASELINES):
            if hyb.get("available") and before[other].get("available"):
                a = np.array(hyb["embedding"]["ranks"]) == 1
                b = np.array(before[other]["embedding"]["ranks"]) == 1
                paired[f"hybrid - {other}"] = metrics.paired_bootstrap(a, b)
        lookalike = {}
        for a_, b_ in lookalike_pairs:
            if a_ in sidx and b_ in sidx:
                mask = np.isin(truth, [sidx[a_], sidx[b_]])
                lookalike[f"{a_}/{b_}"] = {
                    r: float(np.mean(np.array(before[r]["embedding"]["ranks"])[mask] == 1))
                    for r in (*routers.ROUTERS, "centroid", *sqlroute.ROUTERS) if before.get(r, {}).get("available")}

        result = {
            "config": {**cfg.__dict__, "sections": stores},
            "server": server,
            "stores": {s: {"files": rows[s]["files"], "chunks": rows[s]["chunks"],
                           "queries": sum(q[0] == s for q in queries), "held_out": len(sp.held[s]),
                           "descriptions": {r: descs[r][s] for r in routers.ROUTERS}} for s in stores},
            "queries": len(queries),
            "before": before, "length_curve": curve, "confusions": conf, "paired": paired,
            "versus_baseline": versus_baseline(before),
            "lookalike_top1": lookalike,
            "abstain_sections": abstain, "out_queries": len(out_queries),
            "route_variants": route_variants,
            "style": main_style, "examples": examples(queries + out_queries), "styles": styles,
        }

        # -- drift ------------------------------------------------------------------------------------------------
        if cfg.drift_store:
            x = cfg.drift_store
            victims = [p.name for p in data.by_hash(sp.store[x], "drift")[:len(drift_pkgs)]]
            t0 = time.perf_counter()
            deleted = pg.delete_files(conn, table, x, victims)
            pg.insert(conn, table, ((s, f, c, v) for (s, f, c), v in zip(drift_rows, drift_vecs)))
            t_refresh = pg.refresh(conn)
            timings["drift_seconds"] = time.perf_counter() - t0
            rows2 = pg.stores(conn, table)
            by_store[x] = [v for (s, f, _), v in zip(store_rows, store_vecs) if s == x and f not in set(victims)] + \
                list(drift_vecs)
            descs2 = {r: dict(descs[r]) for r in routers.ROUTERS}
            # maintained: re-read (the baseline too: computed again from the contents); names/hand-written stay stale
            texts2 = dict(store_texts)
            texts2[x] = "\n".join([p.text for p in sp.store[x] if p.name not in set(victims)] +
                                  [p.text for p in drift_pkgs])
            baseline2 = routers.tfidf_words(texts2)
            for r in ("keywords", "clusters", "hybrid", "name_hybrid", "name_topics", "name_terms", *routers.BASELINES):
                for s in stores:
                    descs2[r][s] = routers.describe(s, rows2[s], handwritten, baseline2[s])[r]
            # Queries after drift: all the old ones, plus the drifted-in section's held-out packages, now owned by x.
            q2_texts = q_texts + [p.text for p in drift_queries]
            q2_vecs = np.vstack([q_vecs, dq_vecs])
            q2_syn = (q_syn + [p.short for p in drift_queries], np.vstack([q_syn_vecs, dq_syn_vecs]))
            truth2 = np.concatenate([truth, np.full(len(drift_queries), sidx[x])])
            after = evaluate(stores, descs2, q2_texts, q2_vecs, truth2, embedder, k=cfg.k, bm25=cfg.bm25,
                             centroids=centroid_matrix(by_store), synopsis=q2_syn)
            own_before = truth == sidx[x]
            own_after = truth2 == sidx[x]
            new_only = np.arange(len(truth2)) >= len(truth)
            per = {}
            for r in (*routers.ROUTERS, "centroid"):
                if not after.get(r, {}).get("available"):
                    per[r] = None
                    continue
                rb = np.array(before[r]["embedding"]["ranks"])
                ra = np.array(after[r]["embedding"]["ranks"])
                per[r] = {
                    "store_queries_before": metrics.summarize(rb[own_before] == 1),
                    "store_queries_after": metrics.summarize(ra[own_after] == 1),
                    "drifted_in_queries": metrics.summarize(ra[new_only] == 1),
                    "all_queries_after": after[r]["embedding"]["top1"],
                }
                if "bm25" in after[r]:
                    rab = np.array(after[r]["bm25"]["ranks"])
                    per[r]["bm25_store_queries_after"] = metrics.summarize(rab[own_after] == 1)
            result["drift"] = {
                "store": x, "from_section": cfg.drift_from, "files_replaced": len(victims),
                "files_after": rows2[x]["files"], "chunks_deleted": deleted, "chunks_added": len(drift_rows),
                "backfill_seconds": t_refresh, "dirty_after_backfill": rows2[x]["dirty"],
                "store_topics_before": rows[x]["store_topics"], "store_topics_after": rows2[x]["store_topics"],
                "drifted_in_queries": len(drift_queries), "store_queries_before": int(own_before.sum()),
                "store_queries_after": int(own_after.sum()),
                "per_router": per, "after": {r: {kk: vv for kk, vv in v.items()} for r, v in after.items()},
            }
            log(f"  drift: {len(victims)} files of {x!r} replaced by {cfg.drift_from!r} files; backfill "
                f"{t_refresh:.1f}s")
        events = len(store_rows and {(s, f) for s, f, _ in store_rows}) + \
            (result["drift"]["files_replaced"] * 2 if cfg.drift_store else 0)
        result["labels"] = label_verbatim(conn, table)
        result["ledger"] = quality.ledger(conn, events, len(stores))
        result["db_clusters"] = quality.db_clusters({s: rows[s]["topics"] for s in stores})
    timings["total_seconds"] = time.perf_counter() - t_start
    result["timings"] = timings
    result["embedder"] = {"name": embedder.name, **embedder.stats}
    pooled = ([c for _, _, c in store_rows], store_vecs, [s for s, _, _ in store_rows], [f for _, f, _ in store_rows])
    return result, pooled


def examples(queries: list[tuple[str, str, str]], per_store: int = 2, chars: int = 160) -> dict[str, list[str]]:
    """A few queries of each store, for the report."""
    out: dict[str, list[str]] = {}
    for s, q, _ in queries:
        if len(out.setdefault(s, [])) < per_store:
            out[s].append(q if len(q) <= chars else q[:chars].rsplit(" ", 1)[0] + " …")
    return out


def routers_unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n if n else v).astype(np.float32)
