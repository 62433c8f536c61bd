"""Needle and flood benchmarks.

Needle: a uniform store (a whole Debian section of >= 1,000 packages) plus ONE planted package from a distant
section. The default stores are library sections, where every package is of one kind (Rust crates, Haskell
libraries): uniform, as the issue asks. Mixed sections such as science or net are not: a package of another section
usually has close neighbours there (a sound tool among science packages), by words and by meaning; run them with
`--needle-stores science,net`. Each trial inserts the needle's chunks, backfills (incrementally: one file folded),
reads store_topics, deletes the needle and backfills again (the summary must come back byte for byte). A trial
succeeds when a word of the needle's subject (its one-line synopsis and package name, as Postgres lexemes) appears
in store_topics and was not there before. Also counted: any of the needle's words newly in store_topics, and terms
that topics attributes to the needle file (`distinctive[].file`).

Flood: stores whose files each carry a person's name (a surname no other file has) or a one-off token; the
question is whether those names/tokens flood the distinctive list.  Counted: how many one-off names/tokens
appear in store_topics and in topics->'distinctive'.

Needle on the document family (run_docs): the document catalog (evaluation/docs.py, the stores as the routing loads
them) in its own table; each trial plants ONE page of a manual that is never in the catalog (lilypond, ffmpeg,
wireshark, maxima, gnumeric, units) into one host store, as the Debian trials do.  Its subject, as the Debian
needle's is its synopsis and package name: the page's title and its product's name (as lexemes).  Also counted:
the subject widened by the page's top TF-IDF words against the host's pages, and any of its words.
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

import numpy as np

from ..embedding import normalise
from . import data, docs, pg

TABLE = "eval_needle"
FLOOD_TABLE = "eval_flood"
# Needle stores: whole sections of >= 1,000 packages; needles from sections far from all of them.
DEFAULT_STORES = ("rust", "haskell")
DEFAULT_NEEDLE_SECTIONS = ("games", "fonts", "sound", "php", "gnu-r", "lisp", "mail", "editors", "kde", "x11")

FIRST_NAMES = ("Anna", "Maria", "Peter", "John", "Lena", "Omar", "Yuki", "Carlos", "Fatima", "Ivan", "Sofia",
               "Chen", "Priya", "Lucas", "Emma", "Noah", "Amara", "Mateo", "Ingrid", "Kofi")
SYLLABLES = ("ka", "lo", "mi", "ran", "tu", "vel", "sor", "dri", "ne", "bax", "quo", "zen", "fir", "gal", "hom",
             "jus", "pel", "wen", "yor", "cri", "dun", "lix", "mor", "tav")


@dataclass
class NeedleConfig:
    stores: tuple[str, ...] = DEFAULT_STORES
    needle_sections: tuple[str, ...] = DEFAULT_NEEDLE_SECTIONS
    trials_per_store: int = 20
    min_store_files: int = 1000
    flood_files: int = 1000
    flood_section: str = "haskell"  # a uniform section: one-off names stand out most there
    max_store_files: int | None = None  # tests only: a sample of the section instead of all of it


def _h(s: str) -> int:
    return int(hashlib.sha1(s.encode()).hexdigest()[:12], 16)


def one_off_name(i: int) -> tuple[str, str]:
    """A first name from a short list (shared by many files) and a made-up surname no other file has."""
    first = FIRST_NAMES[_h(f"first{i}") % len(FIRST_NAMES)]
    n, parts = i, []
    for _ in range(3):
        parts.append(SYLLABLES[n % len(SYLLABLES)])
        n //= len(SYLLABLES)
    parts.insert(1, SYLLABLES[_h(f"last{i}") % len(SYLLABLES)])
    return first, "".join(parts).capitalize()


def one_off_token(i: int) -> str:
    return "ref" + hashlib.sha1(f"token{i}".encode()).hexdigest()[:7]


NOVELTY_SQL = """
WITH st AS (SELECT greatest(files, 1)::float8 AS n FROM storetopics.store_state
             WHERE source_id = %(src)s AND store_key = %(store)s),
     terms AS (SELECT t.term_id, ln(st.n / t.files) AS idf FROM storetopics.store_terms t, st
                WHERE t.source_id = %(src)s AND t.store_key = %(store)s),
     nov AS (SELECT f.file_key, sum(u.n * t.idf) / sum(u.n) AS nov
               FROM storetopics.file_terms f CROSS JOIN LATERAL unnest(f.term_ids, f.counts) AS u(term_id, n)
               JOIN terms t ON t.term_id = u.term_id
              WHERE f.source_id = %(src)s AND f.store_key = %(store)s AND f.words > 0 GROUP BY f.file_key),
     clus AS (SELECT f.file_key, storetopics._file_apart(f.cluster_chunks, f.cluster_outliers) AS apart,
                     storetopics._file_far(f.distance_ratio) AS far, f.distance_ratio
                FROM storetopics.file_clusters f WHERE f.source_id = %(src)s AND f.store_key = %(store)s),
     med AS (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY nov) AS med FROM nov),
     mad AS (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY abs(nov - med)) AS mad, med FROM nov, med
              GROUP BY med),
     ranked AS (SELECT nov.file_key, nov.nov, mad.med, mad.mad, (nov - med) / (1.4826 * mad + 1e-9) AS z,
                       coalesce(a.apart, false) AS apart, coalesce(a.far, false) AS far, a.distance_ratio,
                       rank() OVER (ORDER BY nov DESC) AS r, count(*) OVER () AS n
                  FROM nov CROSS JOIN mad LEFT JOIN clus a ON a.file_key = nov.file_key),
     -- (keywords()'s own outlier test)
     gated AS (SELECT *, storetopics._novel(nov, apart, far, med, mad) AS passes FROM ranked)
SELECT z, r, n, apart, passes, (SELECT count(*) FROM gated WHERE passes AND file_key <> %(file)s), far,
       distance_ratio
  FROM gated WHERE file_key = %(file)s
"""


# A file's words as an outlier file's are ranked (storetopics._outlier_terms): count x IDF in the store, ties by
# lexeme, of those a summary may show (showable, no noise class in the store, in fewer than all its files).
WORD_RANKS_SQL = """
WITH st AS (SELECT greatest(files, 1)::float8 AS n, words, storetopics._store_script(%(src)s, %(store)s) AS script
              FROM storetopics.store_state WHERE source_id = %(src)s AND store_key = %(store)s)
SELECT l.lexeme, row_number() OVER (ORDER BY u.n * ln(st.n / s.files) DESC, l.lexeme)
  FROM storetopics.file_terms f CROSS JOIN LATERAL unnest(f.term_ids, f.counts) AS u(term_id, n)
  JOIN storetopics.store_terms s ON s.source_id = f.source_id AND s.store_key = f.store_key AND s.term_id = u.term_id
  JOIN storetopics.lexemes l ON l.id = u.term_id
  CROSS JOIN st
 WHERE f.source_id = %(src)s AND f.store_key = %(store)s AND f.file_key = %(file)s AND s.files < st.n
   AND storetopics._showable_term(l.lexeme)
   AND storetopics._noise(l.lexeme, s.files, s.total, s.total_sq, st.n::bigint, st.words, st.script) IS NULL
"""


def word_ranks(conn, source_id: int, store: str, file: str, words) -> dict[str, int | None]:
    """Diagnostic: where each of `words` (lexemes) ranks among the planted file's words as its outlier-file words
    are ranked (a summary shows up to 3 of its 10 best); None for a word it is not ranked by (not held, or not one
    a summary may show)."""
    ranks = dict(conn.execute(WORD_RANKS_SQL, {"src": source_id, "store": store, "file": file}).fetchall())
    return {w: ranks.get(w) for w in sorted(words)}


def subject_words_new(before: set[str], after: set[str], subject: set[str]) -> list[str]:
    """What makes a needle trial a hit: the lexemes of the needle's subject that store_topics shows after the needle
    was planted and did not show before (sorted; a hit when not empty).  before/after: the lexemes of store_topics
    before and after; subject: the lexemes of the needle's subject (Debian: synopsis + package name; documents: the
    page's title + its product's name)."""
    return sorted((after - before) & subject)


def novelty(conn, source_id: int, store: str, file: str) -> dict | None:
    """Diagnostic: the needle file as the keyword ranking sees it, read from the extension's state tables: its
    novelty (mean IDF of its words) as a robust z-score and its rank among the store's files; whether all its chunks
    lie outside the clusters (`apart`), at least 1.5 radii out (`far`; `distance_ratio`: the least of its chunks'
    distance to their cluster's centroid over the cluster's radius); whether it passes keywords()'s outlier gate
    (z >= 3.5, or >= 2.5 when apart, or >= 1.0 when far) and how many other files pass it (the keyword list shows
    the 3 most novel that pass).  None if the state tables differ from what this expects."""
    try:
        with conn.transaction():
            row = conn.execute(NOVELTY_SQL, {"src": source_id, "store": store, "file": file}).fetchone()
    except Exception:
        return None
    if not row:
        return None
    return {"z": float(row[0]), "rank": int(row[1]), "files": int(row[2]), "apart": bool(row[3]),
            "passes": bool(row[4]), "files_over_gate": int(row[5]), "far": bool(row[6]),
            "distance_ratio": None if row[7] is None else float(row[7])}


def isolation_rank(store_files: np.ndarray, needle: np.ndarray) -> int:
    """Diagnostic: how isolated the needle is in embedding space.  store_files: unit mean vectors of the store's
    files; needle: the needle's.  Each file's isolation is the cosine similarity to its nearest other file; the
    rank is 1 + the number of store files more isolated than the needle (1 = the most isolated file of all)."""
    sims = store_files @ store_files.T
    np.fill_diagonal(sims, -np.inf)
    nearest = sims.max(axis=1)
    return 1 + int((nearest < float((store_files @ needle).max())).sum())


def _vectors_by_needle_and_file(needle_rows, nv, store_rows, sv) -> tuple[dict, dict]:
    """The needles' (chunk, vector) pairs by needle name, and per store its files' unit mean vectors (for the
    isolation diagnostic)."""
    nvec: dict[str, list] = {}
    for (name, c), v in zip(needle_rows, nv):
        nvec.setdefault(name, []).append((c, v))
    owner: dict[str, dict[str, list]] = {}
    for (s, f, _), v in zip(store_rows, sv):
        owner.setdefault(s, {}).setdefault(f, []).append(v)
    file_vecs = {s: normalise(np.array([np.mean(vs, axis=0) for vs in fs.values()])) for s, fs in owner.items()}
    return nvec, file_vecs


def _load(conn, table: str, dim: int, store_rows, sv) -> tuple[int, float, dict]:
    """The stores' rows loaded into a fresh table, attached and backfilled: (source id, backfill seconds, the
    stores' rows as pg.stores reads them)."""
    pg.create_chunks(conn, table, dim)
    pg.insert(conn, table, ((s, f, c, v) for (s, f, c), v in zip(store_rows, sv)))
    source_id = pg.attach(conn, table)
    t_backfill = pg.refresh(conn)
    return source_id, t_backfill, pg.stores(conn, table)


def run(dsn: str, cfg: NeedleConfig, embedder, log=print) -> dict:
    t_start = time.perf_counter()
    corpus = data.read_sections({*cfg.stores, *cfg.needle_sections, cfg.flood_section})
    if cfg.max_store_files:
        for s in cfg.stores:
            corpus[s] = sorted(data.by_hash(corpus[s], "needle-store")[:cfg.max_store_files], key=lambda p: p.name)
    small = [s for s in cfg.stores if len(corpus[s]) < cfg.min_store_files]
    if small:
        log(f"needle: WARNING: store section(s) under {cfg.min_store_files} packages: {small}")
    # Needles: per store, trials_per_store packages spread over the needle sections, picked by hash.
    plans: dict[str, list[data.Package]] = {}
    for s in cfg.stores:
        pool = [data.by_hash(corpus[ns], f"needle-{s}") for ns in cfg.needle_sections if ns != s]
        picks, i = [], 0
        while len(picks) < cfg.trials_per_store and any(pool):
            lst = pool[i % len(pool)]
            if lst:
                picks.append(lst.pop(0))
            i += 1
        plans[s] = picks
    store_rows = [(s, p.name, c) for s in cfg.stores for p in corpus[s] for c in p.chunks]
    needle_rows = [(p.name, c) for s in cfg.stores for p in plans[s] for c in p.chunks]

    # Flood stores: each file = a package description of one section + a line with a person's name (or token).
    base = data.by_hash(corpus[cfg.flood_section], "flood")[:cfg.flood_files]
    flood_rows, names, tokens = [], set(), set()
    for i, p in enumerate(base):
        first, last = one_off_name(i)
        names.add(last.lower())
        tok = one_off_token(i)
        tokens.add(tok)
        for c in p.chunks:
            flood_rows.append(("names", p.name, c))
            flood_rows.append(("tokens", p.name, c))
        flood_rows.append(("names", p.name, f"Maintained by {first} {last}; questions go to {first} {last}."))
        flood_rows.append(("tokens", p.name, f"Internal reference {tok}, checked by {tok}."))

    t0 = time.perf_counter()

    def progress(done, total):
        log(f"  embedded {done:,}/{total:,} new texts [{time.perf_counter() - t0:.0f}s]")

    vecs = embedder([c for *_, c in store_rows] + [c for _, c in needle_rows] + [c for *_, c in flood_rows],
                    progress=progress)
    sv, nv, fv = vecs[:len(store_rows)], vecs[len(store_rows):len(store_rows) + len(needle_rows)], \
        vecs[len(store_rows) + len(needle_rows):]
    nvec, file_vecs = _vectors_by_needle_and_file(needle_rows, nv, store_rows, sv)
    t_embed = time.perf_counter() - t0

    trials = []
    with pg.connect(dsn) as conn:
        source_id, t_backfill, base_rows = _load(conn, TABLE, embedder.dim, store_rows, sv)
        sizes = ", ".join(f"{s} {base_rows[s]['files']:,} files" for s in cfg.stores)
        log(f"needle: {len(cfg.stores)} stores ({sizes}), {sum(len(v) for v in plans.values())} trials; "
            f"backfill {t_backfill:.1f}s")
        for s in cfg.stores:
            before = base_rows[s]
            lex_before = pg.lexemes(conn, before["store_topics"])
            for p in plans[s]:
                fname = f"needle:{p.name}"
                t0 = time.perf_counter()
                pg.insert(conn, TABLE, ((s, fname, c, v) for c, v in nvec[p.name]))
                pg.refresh(conn)
                after = pg.stores(conn, TABLE)[s]
                t_add = time.perf_counter() - t0
                subject = pg.lexemes(conn, p.short + " " + p.name.replace("-", " "))
                words = pg.lexemes(conn, p.text + " " + p.name.replace("-", " "))
                lex_after = pg.lexemes(conn, after["store_topics"])
                new = lex_after - lex_before
                found = subject_words_new(lex_before, lex_after, subject)
                attributed = [d["term"] for d in (after["topics"] or {}).get("distinctive", [])
                              if d.get("file") == fname]
                nov = novelty(conn, source_id, s, fname)
                reach = reachable(subject, lex_before, pg.lexemes(conn, " ".join(c for c, _ in nvec[p.name])))
                ranks = word_ranks(conn, source_id, s, fname, reach)
                conn.execute(f"DELETE FROM {TABLE} WHERE file = %s", (fname,))
                pg.refresh(conn)
                restored = pg.stores(conn, TABLE)[s]
                trials.append({
                    "store": s, "needle": p.name, "needle_section": p.section, "synopsis": p.short,
                    "subject_hit": bool(found), "any_word_hit": bool(new & words),
                    "subject_reachable": reach, "subject_ranks": ranks,
                    "subject_words_new": found, "needle_words_new": sorted(new & words),
                    "attributed_terms": attributed, "store_topics": after["store_topics"],
                    "restored_exactly": restored["store_topics"] == before["store_topics"]
                                        and restored["topics"] == before["topics"],
                    "seconds": t_add, "novelty": nov,
                    "isolation_rank": isolation_rank(file_vecs[s],
                                                     normalise(np.mean([v for _, v in nvec[p.name]], axis=0)[None])[0]),
                })
            hits = sum(t["subject_hit"] for t in trials if t["store"] == s)
            log(f"  {s}: subject in store_topics in {hits}/{len(plans[s])} trials")

        # -- flood ---------------------------------------------------------------------------------------------
        pg.create_chunks(conn, FLOOD_TABLE, embedder.dim)
        pg.insert(conn, FLOOD_TABLE, ((s, f, c, v) for (s, f, c), v in zip(flood_rows, fv)))
        pg.attach(conn, FLOOD_TABLE)
        pg.refresh(conn)
        frows = pg.stores(conn, FLOOD_TABLE)
        flood = {}
        for store, oneoffs in (("names", names), ("tokens", tokens)):
            r = frows[store]
            one_lex = pg.lexemes(conn, " ".join(sorted(oneoffs)))
            dist = [d["term"] for d in (r["topics"] or {}).get("distinctive", [])]
            flood[store] = {
                "files": r["files"], "one_off_values": len(oneoffs),
                "one_offs_in_store_topics": sorted(pg.lexemes(conn, r["store_topics"]) & one_lex),
                "one_offs_in_distinctive": [t for t in dist if pg.lexemes(conn, t) & one_lex],
                "distinctive": dist, "store_topics": r["store_topics"],
            }
            log(f"  flood {store!r}: {len(flood[store]['one_offs_in_distinctive'])} of {len(oneoffs)} one-off "
                f"values in the distinctive list ({len(dist)} terms)")
    n = len(trials)
    k = sum(t["subject_hit"] for t in trials)
    from .metrics import wilson
    return {
        "config": cfg.__dict__, "store_files": {s: base_rows[s]["files"] for s in cfg.stores},
        "store_topics": {s: base_rows[s]["store_topics"] for s in cfg.stores},
        "trials": trials,
        "subject_rate": {"value": k / n if n else float("nan"), "hits": k, "n": n, "ci95": list(wilson(k, n))},
        "per_store": {s: {"hits": sum(t["subject_hit"] for t in trials if t["store"] == s),
                          "n": sum(t["store"] == s for t in trials)} for s in cfg.stores},
        "any_word_rate": sum(t["any_word_hit"] for t in trials) / n if n else float("nan"),
        "attributed_rate": sum(bool(t["attributed_terms"]) for t in trials) / n if n else float("nan"),
        "restored_exactly": sum(t["restored_exactly"] for t in trials),
        "trial_seconds_median": float(np.median([t["seconds"] for t in trials])) if trials else None,
        "novelty": _novelty_summary(trials),
        "isolation": {"rank_median": float(np.median([t["isolation_rank"] for t in trials])),
                      "most_isolated": sum(t["isolation_rank"] == 1 for t in trials),
                      "top3": sum(t["isolation_rank"] <= 3 for t in trials), "trials": n} if trials else None,
        "reachable": _reachable_summary(trials),
        "flood": flood,
        "timings": {"embed_seconds": t_embed, "backfill_seconds": t_backfill,
                    "total_seconds": time.perf_counter() - t_start},
    }


def _novelty_summary(trials: list[dict]) -> dict | None:
    nv = [t["novelty"] for t in trials if t.get("novelty")]
    if not nv:
        return None
    return {"trials": len(nv), "z_median": float(np.median([x["z"] for x in nv])),
            "apart": sum(x.get("apart", False) for x in nv), "far": sum(x.get("far", False) for x in nv),
            "over_gate": sum(x.get("passes", x["z"] >= 3.5) for x in nv), "in_top3": sum(x["rank"] <= 3 for x in nv),
            "rank_median": float(np.median([x["rank"] for x in nv])),
            "files_over_gate_median": float(np.median([x["files_over_gate"] for x in nv]))}


# -- the needle on the document family ------------------------------------------------------------------------------
DOC_TABLE = "eval_needle_docs"
# Hosts: the catalog's stores with the most pages at its chunk budget, of four kinds of document (info nodes, HTML
# help pages, man pages, an HTML manual): gnuplot 214 pages, gimp 131, coreutils 85, apache 56.
DOC_HOSTS = ("gnuplot", "gimp", "coreutils", "apache")


@dataclass
class DocNeedleConfig:
    hosts: tuple[str, ...] = DOC_HOSTS
    sources: tuple[str, ...] = docs.ABSTAIN     # manuals never in the catalog: where the needles come from
    catalog: tuple[str, ...] = docs.STORES      # every store of the table (as the routing loads them)
    trials_per_host: int = 10
    max_chunks: int = 3          # a needle is one page of 1-3 chunks (<= ~900 words), a usual page of the hosts
    tfidf_words: int = 5         # the page's top TF-IDF words against the host's pages (the widened subject)
    chunk_budget: int | None = docs.CHUNK_BUDGET
    held_share: float = 0.2


def needle_pages(pages: list[data.Package], host: str, max_chunks: int) -> list[data.Package]:
    """A source's pages that can be a needle in `host`, in the order of a hash salted with the host: one page of
    1..max_chunks chunks, with a title (its subject)."""
    ok = [p for p in pages if 1 <= len(p.chunks) <= max_chunks and docs.clean_title(p.short)]
    return data.by_hash(ok, f"needle-{host}")


def plan_doc_needles(hosts: tuple[str, ...], sources: dict[str, list[data.Package]], trials: int,
                     max_chunks: int) -> dict[str, list[data.Package]]:
    """Per host, `trials` needle pages taken in turn from each source (in the given order), each source's by hash;
    no page twice for a host."""
    plans = {}
    for h in hosts:
        pool = [needle_pages(ps, h, max_chunks) for ps in sources.values()]
        picks, i = [], 0
        while len(picks) < trials and any(pool):
            lst = pool[i % len(pool)]
            if lst:
                picks.append(lst.pop(0))
            i += 1
        plans[h] = picks
    return plans


def top_tfidf(counts: dict[str, int], df: dict[str, int], n_files: int, k: int) -> list[str]:
    """The k lexemes of a page that tell it apart from a store's files: count in the page x ln((1 + n) / (1 + df)),
    df the store files holding the lexeme (a lexeme no file holds weighs most); only lexemes with two letters or
    more (no numbers, no version strings); ties by lexeme."""
    import math
    scored = [(-n * math.log((1 + n_files) / (1 + df.get(x, 0))), x) for x, n in counts.items()
              if len(re.findall(r"[^\W\d_]", x)) >= 2]
    return [x for _, x in sorted(scored)[:k]]


# storetopics._showable_term: letters, maybe inner hyphens or apostrophes (3-40 of them, tested with the match)
SHOWABLE = re.compile(r"[^\W\d_](?:[^\W\d_]|['-])*[^\W\d_]")


def reachable(subject: set[str], shown_before: set[str], held) -> list[str]:
    """What any summary of a planted file's words could show of its subject: the words of it that the stored
    chunks hold (held: their lexemes), that a list may show (storetopics._showable_term), not shown before."""
    return sorted(x for x in subject - shown_before if x in held and SHOWABLE.fullmatch(x) and 3 <= len(x) <= 40)


def _reachable_summary(trials: list[dict]) -> dict:
    return {"trials": sum(bool(t["subject_reachable"]) for t in trials),
            "hits": sum(bool(t["subject_reachable"]) and t["subject_hit"] for t in trials), "n": len(trials)}


def doc_subject(page: data.Package) -> str:
    """The text whose lexemes are a document needle's subject: its title and its product's name (the Debian
    needle's synopsis and package name)."""
    return page.short + " " + page.section.replace("-", " ")


def run_docs(dsn: str, cfg: DocNeedleConfig, embedder, log=print) -> dict:
    """The needle on the document family: cfg.trials_per_host pages of the never-catalogued manuals planted one at
    a time into each host store of the document catalog; found when a word of the page's subject (title, product
    name) newly shows in store_topics; restored when the summary is byte for byte what it was after deleting it."""
    t_start = time.perf_counter()
    corpus = docs.read(cfg.catalog, held_share=cfg.held_share, chunk_budget=cfg.chunk_budget)
    stored = {s: [p for p in corpus[s] if not data.is_held_out(p.name, cfg.held_share)] for s in cfg.catalog}
    sources = docs.read(cfg.sources, chunk_budget=None)
    plans = plan_doc_needles(cfg.hosts, sources, cfg.trials_per_host, cfg.max_chunks)
    store_rows = [(s, p.name, c) for s in sorted(cfg.catalog) for p in stored[s] for c in p.chunks]
    needle_rows = [(p.name, c) for h in cfg.hosts for p in plans[h] for c in p.chunks]
    t0 = time.perf_counter()

    def progress(done, total):
        log(f"  embedded {done:,}/{total:,} new texts [{time.perf_counter() - t0:.0f}s]")

    vecs = embedder([c for *_, c in store_rows] + [c for _, c in needle_rows], progress=progress)
    sv, nv = vecs[:len(store_rows)], vecs[len(store_rows):]
    nvec, file_vecs = _vectors_by_needle_and_file(needle_rows, nv, store_rows, sv)
    t_embed = time.perf_counter() - t0

    trials = []
    with pg.connect(dsn) as conn:
        source_id, t_backfill, base_rows = _load(conn, DOC_TABLE, embedder.dim, store_rows, sv)
        log(f"needle (documents): {len(cfg.catalog)} stores; hosts "
            + ", ".join(f"{h} {base_rows[h]['files']:,} pages" for h in cfg.hosts)
            + f"; {sum(len(v) for v in plans.values())} trials; backfill {t_backfill:.1f}s")
        for h in cfg.hosts:
            before = base_rows[h]
            lex_before = pg.lexemes(conn, before["store_topics"])
            host_counts = pg.lexeme_counts(conn, [p.text for p in stored[h]])
            df: dict[str, int] = {}
            for cnt in host_counts:
                for x in cnt:
                    df[x] = df.get(x, 0) + 1
            for p in plans[h]:
                fname = f"needle:{p.name}"
                t0 = time.perf_counter()
                pg.insert(conn, DOC_TABLE, ((h, fname, c, v) for c, v in nvec[p.name]))
                pg.refresh(conn)
                after = pg.stores(conn, DOC_TABLE)[h]
                t_add = time.perf_counter() - t0
                subject = pg.lexemes(conn, doc_subject(p))
                counts = pg.lexeme_counts(conn, [p.text + " " + p.short])[0]
                tfidf = top_tfidf(counts, df, len(stored[h]), cfg.tfidf_words)
                words = set(counts) | subject
                lex_after = pg.lexemes(conn, after["store_topics"])
                new = lex_after - lex_before
                found = subject_words_new(lex_before, lex_after, subject)
                found_tfidf = subject_words_new(lex_before, lex_after, subject | set(tfidf))
                attributed = [d["term"] for d in (after["topics"] or {}).get("distinctive", [])
                              if d.get("file") == fname]
                nov = novelty(conn, source_id, h, fname)
                reach = reachable(subject, lex_before, pg.lexeme_counts(conn, [" ".join(p.chunks)])[0])
                ranks = word_ranks(conn, source_id, h, fname, reach)
                conn.execute(f"DELETE FROM {DOC_TABLE} WHERE file = %s", (fname,))
                pg.refresh(conn)
                restored = pg.stores(conn, DOC_TABLE)[h]
                trials.append({
                    "store": h, "needle": p.name, "needle_store": p.section, "title": p.short,
                    "chunks": len(p.chunks), "subject": sorted(subject), "tfidf_words": tfidf,
                    "subject_hit": bool(found), "tfidf_hit": bool(found_tfidf), "any_word_hit": bool(new & words),
                    "subject_reachable": reach, "subject_ranks": ranks,
                    "subject_words_new": found, "tfidf_words_new": found_tfidf,
                    "needle_words_new": sorted(new & words), "attributed_terms": attributed,
                    "store_topics": after["store_topics"],
                    "restored_exactly": restored["store_topics"] == before["store_topics"]
                                        and restored["topics"] == before["topics"],
                    "seconds": t_add, "novelty": nov,
                    "isolation_rank": isolation_rank(file_vecs[h],
                                                     normalise(np.mean([v for _, v in nvec[p.name]], axis=0)[None])[0]),
                })
            hits = sum(t["subject_hit"] for t in trials if t["store"] == h)
            log(f"  {h}: subject in store_topics in {hits}/{len(plans[h])} trials")
        conn.execute("SELECT storetopics.detach(%s::regclass)", (DOC_TABLE,))
        conn.execute(f"DROP TABLE {DOC_TABLE}")
    n = len(trials)
    from .metrics import wilson

    def rate(key: str) -> dict:
        k = sum(t[key] for t in trials)
        return {"value": k / n if n else float("nan"), "hits": k, "n": n, "ci95": list(wilson(k, n))}
    return {
        "config": cfg.__dict__, "store_files": {h: base_rows[h]["files"] for h in cfg.hosts},
        "store_topics": {h: base_rows[h]["store_topics"] for h in cfg.hosts},
        "trials": trials, "subject_rate": rate("subject_hit"), "tfidf_rate": rate("tfidf_hit"),
        "per_store": {h: {"hits": sum(t["subject_hit"] for t in trials if t["store"] == h),
                          "n": sum(t["store"] == h for t in trials)} for h in cfg.hosts},
        "per_source": {s: {"hits": sum(t["subject_hit"] for t in trials if t["needle_store"] == s),
                           "n": sum(t["needle_store"] == s for t in trials)} for s in cfg.sources},
        "any_word_rate": sum(t["any_word_hit"] for t in trials) / n if n else float("nan"),
        "attributed_rate": sum(bool(t["attributed_terms"]) for t in trials) / n if n else float("nan"),
        "reachable": _reachable_summary(trials),
        "restored_exactly": sum(t["restored_exactly"] for t in trials),
        "trial_seconds_median": float(np.median([t["seconds"] for t in trials])) if trials else None,
        "novelty": _novelty_summary(trials),
        "isolation": {"rank_median": float(np.median([t["isolation_rank"] for t in trials])),
                      "most_isolated": sum(t["isolation_rank"] == 1 for t in trials),
                      "top3": sum(t["isolation_rank"] <= 3 for t in trials), "trials": n} if trials else None,
        "timings": {"embed_seconds": t_embed, "backfill_seconds": t_backfill,
                    "total_seconds": time.perf_counter() - t_start},
    }
