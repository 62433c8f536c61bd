"""`python -m lab.evaluation {routing,all}` and `make eval`: run the evaluation against a real Postgres, write the results.

    python -m lab.evaluation all              # what `make eval` runs: routing + drift, needle + flood, label quality
    python -m lab.evaluation routing          # the routing benchmark and the drift scenario only
    python -m lab.evaluation all --quick      # a small smoke run (results go to .cache/eval-quick/ unless --out)
    python -m lab.evaluation all --only needle-docs,stability --out /tmp/x   # some parts only (eval.json only)

The database is a throwaway cluster started for the run (or $STORETOPICS_TEST_DSN's server), with vector and
storetopics installed like the tests do.  Embeddings: all-MiniLM-L6-v2 (extra `eval`), cached under
.cache/embeddings/; `--embedder hash` uses a deterministic stand-in that only exercises the code paths.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from .. import embedding
from . import cost, data, docs, metrics, needle, pg, quality, report, residue, routing, sqlroute, wordnet

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "sql", "bgworker", "plpy"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return (rev or "?") + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def sql_digest() -> str:
    h = hashlib.sha1()
    for f in sorted((REPO / "sql").glob("storetopics--*.sql")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def installed_sql_digest() -> str | None:
    """SHA-1 of the extension files the server loads (what `make ext-install` last installed): the SQL that made
    these summaries, which may differ from the working tree while others edit it."""
    from ..localpg import DEFAULT_BINDIR
    try:
        share = subprocess.run([str(Path(DEFAULT_BINDIR) / "pg_config"), "--sharedir"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    files = sorted((Path(share) / "extension").glob("storetopics*"))
    if not files:
        return None
    h = hashlib.sha1()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.evaluation", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", default="all", choices=("routing", "all"),
                    help="routing: routing + drift only; all: also needle, flood and label quality (default)")
    ap.add_argument("--quick", action="store_true", help="small smoke configuration")
    ap.add_argument("--out", type=Path, help=f"output directory (default {RESULTS.relative_to(REPO)})")
    ap.add_argument("--sections", help="comma-separated Debian sections, one store each")
    ap.add_argument("--store-cap", type=int, help="packages per store (0: all)")
    ap.add_argument("--queries", type=int, help="held-out queries per section")
    ap.add_argument("--drift-store", help="store that drifts ('' to skip the drift scenario)")
    ap.add_argument("--drift-from", help="section whose packages drift in")
    ap.add_argument("--needle-stores", help="comma-separated sections of >= 1,000 packages")
    ap.add_argument("--trials", type=int, help="needle trials per store")
    ap.add_argument("--flood-files", type=int, help="files per flood store")
    ap.add_argument("--quality-sample", type=int, default=None, help="chunks clustered for NMI/diversity")
    ap.add_argument("--no-bertopic", action="store_true", help="skip BERTopic in the label-quality section")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-cost", action="store_true", help="skip the labelling-cost phase (Anthropic labeller "
                                                           "against the local Messages API server)")
    ap.add_argument("--only", type=lambda v: {x.strip() for x in v.split(",") if x.strip()},
                    help=f"comma-separated parts to run ({', '.join(PARTS)}); the others are skipped and only "
                         f"eval.json is written (report.md needs the routing part)")
    ap.add_argument("--report-only", type=Path, metavar="EVAL_JSON",
                    help="only write report.md and the plots again from an eval.json (next to it unless --out)")
    ap.add_argument("--embedder", choices=("minilm", "hash"), default="minilm",
                    help="hash: deterministic stand-in (tests the pipeline; accuracy numbers mean nothing)")
    return ap


PARTS = ("routing", "wordnet", "docs", "needle", "cost", "quality", "needle-docs", "stability")


def configs(args) -> tuple[routing.RoutingConfig, needle.NeedleConfig, int]:
    rc, nc, sample = routing.RoutingConfig(), needle.NeedleConfig(), 6000
    if args.quick:
        rc.sections = ("math", "science", "games", "sound", "gnome", "kde")
        rc.store_cap, rc.queries_per_section, rc.drift_store, rc.drift_from = 40, 10, "games", "fonts"
        rc.lengths = (5, 20)
        rc.abstain_sections = ("golang", "gnu-r", "graphics", "interpreters")   # two per half
        nc.stores, nc.trials_per_store, nc.min_store_files, nc.flood_files = ("rust",), 4, 1000, 150
        sample = 1500
    if args.sections:
        rc.sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    if args.store_cap is not None:
        rc.store_cap = args.store_cap or None
    if args.queries is not None:
        rc.queries_per_section = args.queries
    if args.drift_store is not None:
        rc.drift_store = args.drift_store or None
    if args.drift_from:
        rc.drift_from = args.drift_from
    if rc.drift_store and rc.drift_store not in rc.sections:
        rc.drift_store = None
    if args.needle_stores:
        nc.stores = tuple(s.strip() for s in args.needle_stores.split(",") if s.strip())
    if args.trials is not None:
        nc.trials_per_store = args.trials
    if args.flood_files is not None:
        nc.flood_files = args.flood_files
    if args.quality_sample is not None:
        sample = args.quality_sample
    return rc, nc, sample


# WordNet's stores in two halves, for the reporting half of every family (WordNet was not looked at while tuning)
WORDNET_HALVES = {"tune": ("act", "communication", "animal", "plant", "body"),
                  "report": ("artifact", "substance", "food", "location", "person")}


def abstention(res: dict, log=print, halves_key: str = "halves", all_key: str = "routing") -> dict:
    """Retrieve or not, per extension router: the threshold with the best abstention F1 on the tuning half, and
    what it gives on the reporting half and on all the stores; beside the installed default's figures."""
    out = {}
    tune = (res.get(halves_key) or {}).get("tune", {}).get("before", {})
    for fn in sqlroute.ROUTERS:
        t = tune.get(fn, {})
        if not t.get("top_out"):
            out[fn] = {"available": False, "note": "no tuning half with queries no store holds"}
            continue
        chosen = round(metrics.best_threshold(t["top_in"], t["top_out"]), 2)
        e = {"available": True, "chosen_on": "tune", "threshold": chosen, "default": t["default_threshold"]}
        for key, node in (("tune", tune), ("report", (res[halves_key].get("report") or {}).get("before", {})),
                          ("all", res[all_key]["before"])):
            r = node.get(fn, {})
            if r.get("top_out"):
                e[key] = {"chosen": sqlroute.at(r, chosen), "default": r["at_default"]}
        out[fn] = e
        rep = e.get("report", {}).get("chosen")
        log(f"  {fn}: abstention threshold {chosen:g} chosen on the tuning half (F1 there "
            f"{e['tune']['chosen']['f1']['value']:.3f}); reporting half F1 "
            + (f"{rep['f1']['value']:.3f} [{rep['f1']['ci95'][0]:.3f}-{rep['f1']['ci95'][1]:.3f}]" if rep else "-")
            + f"; installed default {e['default']:g}")
    return out


def doc_family(dsn: str, rc: routing.RoutingConfig, emb, log=print, quick: bool = False) -> dict:
    """The document stores (evaluation/docs.py): all of them, then each half as its own catalog; the abstention
    threshold chosen on the tuning half as for Debian."""
    stores, abstain, budget, n = docs.STORES, docs.ABSTAIN, docs.CHUNK_BUDGET, 30
    if quick:
        stores, abstain, budget, n = ("apache", "lighttpd", "postfix", "exim"), ("lilypond", "ffmpeg"), 60, 10
    halves = {h: tuple(s for s in v if s in stores) for h, v in docs.HALVES.items()}
    ab_halves = {h: tuple(s for s in v if s in abstain) for h, v in docs.ABSTAIN_HALVES.items()}
    if quick:
        ab_halves = {"tune": ("lilypond",), "report": ("ffmpeg",)}
    corpus = docs.read((*stores, *abstain), held_share=rc.held_share, chunk_budget=budget)
    dc = dataclasses.replace(rc, sections=stores, drift_store=None, table="eval_docs", lengths=(), family="docs",
                             abstain_sections=abstain, store_cap=None, queries_per_section=n)
    log(f"third family: document stores ({', '.join(stores)}; never in the catalog: {', '.join(abstain)})")
    out = {"docs": routing.run(dsn, dc, emb, log, corpus=corpus, handwritten={}, query_styles=docs.query_styles,
                               lookalike_pairs=docs.LOOKALIKE_PAIRS)[0], "docs_halves": {}}
    # what ingestion left in the summaries, judged against the pages each store was loaded with
    out["docs"]["residue"] = residue.audit(
        {s: v["descriptions"].get("hybrid") or "" for s, v in out["docs"]["stores"].items()},
        {s: "\n".join(c for p in corpus[s] if not data.is_held_out(p.name, rc.held_share) for c in p.chunks)
         for s in stores})
    for name, secs in halves.items():
        if len(secs) < 2:
            continue
        log(f"documents half '{name}': {', '.join(secs)}")
        hc = dataclasses.replace(dc, sections=secs, table=f"eval_docs_{name}", abstain_sections=ab_halves[name])
        out["docs_halves"][name], _ = routing.run(
            dsn, hc, emb, log, corpus={s: corpus[s] for s in (*secs, *ab_halves[name])}, handwritten={},
            query_styles=docs.query_styles, lookalike_pairs=docs.LOOKALIKE_PAIRS)
    out["docs_abstention"] = abstention(out, log, halves_key="docs_halves", all_key="docs")
    return out


def doc_needle_config(quick: bool = False) -> needle.DocNeedleConfig:
    if quick:
        return needle.DocNeedleConfig(hosts=("apache", "postfix"), sources=("lilypond", "ffmpeg", "units"),
                                      catalog=("apache", "lighttpd", "postfix", "exim"), trials_per_host=3,
                                      chunk_budget=60)
    return needle.DocNeedleConfig()


def stability(dsn: str, rc: routing.RoutingConfig, emb, log=print, quick: bool = False) -> dict:
    """The churn scenario of cost.stability on the Debian routing stores (the files the routing loads) and on the
    document stores (the pages the routing loads)."""
    rounds, events = (("cli", "sql"), 30) if quick else (("cli", "cli", "cli", "sql", "sql", "sql"), 100)
    sp = data.split(data.read_sections(rc.sections), held_share=rc.held_share, store_cap=rc.store_cap,
                    queries_per_section=rc.queries_per_section)
    out = {"debian": cost.stability(dsn, "debian", sp.store, emb, log, rounds=rounds, events=events,
                                    table="eval_stability_debian")}
    if docs.available():
        stores, budget = (("apache", "lighttpd", "postfix", "exim"), 60) if quick else (docs.STORES,
                                                                                        docs.CHUNK_BUDGET)
        corpus = docs.read(stores, held_share=rc.held_share, chunk_budget=budget)
        pages = {s: [p for p in corpus[s] if not data.is_held_out(p.name, rc.held_share)] for s in stores}
        out["docs"] = cost.stability(dsn, "docs", pages, emb, log, rounds=rounds, events=events,
                                     table="eval_stability_docs")
    return out


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Runs what the parsed arguments ask for (`python -m lab.evaluation` and `make eval`)."""
    if args.report_only:
        import json
        res = json.loads(args.report_only.read_text())
        for f in report.write(res, args.out or args.report_only.parent, plots_too=not args.no_plots):
            print(f"wrote {f}")
        return 0
    rc, nc, sample = configs(args)
    out_dir = args.out or (REPO / ".cache" / "eval-quick" if args.quick else RESULTS)
    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    if args.embedder == "hash":
        emb = embedding.HashEmbedder()
    else:
        try:
            emb = embedding.default_embedder()
        except embedding.ModelUnavailable as e:
            print(f"lab.evaluation: {e}", file=sys.stderr)
            return 2
    log(f"embedder: {emb.name}")
    res: dict = {"started": started.isoformat(), "what": args.what, "quick": args.quick,
                 "fallback_embedder": isinstance(emb, embedding.HashEmbedder),
                 "environment": {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
                                 "machine": platform.machine(), "python": platform.python_version(),
                                 "git": git_rev(), "sql_sha1": sql_digest(),
                                 "installed_extension_sha1": installed_sql_digest()}}
    timings: dict[str, float] = {}
    only = getattr(args, "only", None)
    unknown = sorted((only or set()) - set(PARTS))
    if unknown:
        print(f"lab.evaluation: --only: unknown part(s) {', '.join(unknown)}; the parts: {', '.join(PARTS)}",
              file=sys.stderr)
        return 2

    def want(part: str) -> bool:
        return only is None or part in only

    with pg.database(log) as dsn:
        pooled = None
        if want("routing"):
            t0 = time.perf_counter()
            res["routing"], pooled = routing.run(dsn, rc, emb, log)
            timings["routing + drift"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            res["halves"] = {}
            for name, secs in routing.HALVES.items():
                hc = dataclasses.replace(rc, sections=tuple(s for s in secs if s in rc.sections), drift_store=None,
                                         table=f"eval_{name}", lengths=(),
                                         abstain_sections=tuple(s for s in routing.ABSTAIN_HALVES[name]
                                                                if s in rc.abstain_sections))
                if len(hc.sections) >= 2:
                    log(f"half '{name}': {', '.join(hc.sections)}")
                    res["halves"][name], _ = routing.run(dsn, hc, emb, log)
            timings["routing, halves"] = time.perf_counter() - t0
        if want("wordnet") and wordnet.available():
            t0 = time.perf_counter()
            wc = dataclasses.replace(rc, sections=wordnet.STORES, drift_store=None, table="eval_wordnet", lengths=(),
                                     family="wordnet", abstain_sections=())
            log("second family: WordNet noun synsets, one store per lexicographer file")
            corpus = wordnet.read()
            res["family2"], _ = routing.run(dsn, wc, emb, log, corpus=corpus, handwritten={})
            res["family2_halves"] = {}
            for name, stores in WORDNET_HALVES.items():
                log(f"WordNet half '{name}': {', '.join(stores)}")
                res["family2_halves"][name], _ = routing.run(
                    dsn, dataclasses.replace(wc, sections=stores, table=f"eval_wordnet_{name}"), emb, log,
                    corpus={s: corpus[s] for s in stores}, handwritten={})
            timings["routing, WordNet"] = time.perf_counter() - t0
        elif want("wordnet"):
            log(f"second family skipped: {wordnet.DATA_NOUN} missing (Debian package wordnet-base)")
        if want("routing"):
            res["abstention"] = abstention(res, log)
        if want("docs") and docs.available():
            t0 = time.perf_counter()
            try:
                res.update(doc_family(dsn, rc, emb, log, quick=args.quick))
            except Exception as e:  # reported, not hidden; the other families' results are kept
                log(f"third family: FAILED: {e!r}")
                res["docs_failed"] = repr(e)
            timings["routing, documents"] = time.perf_counter() - t0
        elif want("docs"):
            log(f"third family skipped: {docs.CORPUS} missing (build it with scripts/doc_corpus.py; make eval does)")
        b = res["routing"]["before"] if "routing" in res else {}
        for r in ("names", "handwritten", "keywords", "clusters", "hybrid", "centroid", *sqlroute.ROUTERS):
            if not b:
                break
            e = b.get(r, {})
            if e.get("available"):
                log(f"  {r:12s} top-1 {100 * e['embedding']['top1']['value']:5.1f}%  "
                    f"recall@{rc.k} {100 * e['embedding'][f'recall@{rc.k}']['value']:5.1f}%"
                    + (f"  BM25 top-1 {100 * e['bm25']['top1']['value']:5.1f}%" if e.get("bm25") else ""))
            else:
                log(f"  {r:12s} not available")
        if args.what == "all":
            if want("needle"):
                t0 = time.perf_counter()
                res["needle"] = needle.run(dsn, nc, emb, log)
                timings["needle + flood"] = time.perf_counter() - t0
            if not args.no_cost and want("cost"):
                t0 = time.perf_counter()
                try:
                    res["cost"] = cost.run(dsn, rc, emb, log)
                except Exception as e:  # reported, not hidden: the labeller path is another engineer's moving part
                    log(f"cost: FAILED: {e!r}")
                    res["cost"] = {"available": False, "note": f"the run failed: {e!r}"}
                timings["LLM cost (ledger)"] = time.perf_counter() - t0
            if want("quality") and pooled is not None:
                t0 = time.perf_counter()
                texts, vecs, truth, files = pooled
                res["quality"] = quality.clusterings(texts, vecs, truth, files, sample=sample,
                                                     with_bertopic=not args.no_bertopic, log=log)
                timings["label quality (clusterings)"] = time.perf_counter() - t0
            # last: the parts above run on the same database as before these two were added (learnt surface words
            # and lexeme ids are shared by all tables of a database)
            if want("needle-docs") and docs.available():
                t0 = time.perf_counter()
                res["needle_docs"] = needle.run_docs(dsn, doc_needle_config(args.quick), emb, log)
                timings["needle, documents"] = time.perf_counter() - t0
            if want("stability"):
                t0 = time.perf_counter()
                res["stability"] = stability(dsn, rc, emb, log, quick=args.quick)
                timings["stability (churn in half the stores)"] = time.perf_counter() - t0
    res["embedder"] = {"name": emb.name, **emb.stats}
    res["elapsed_seconds"] = time.perf_counter() - t_start
    timings["total"] = res["elapsed_seconds"]
    res["timings"] = timings
    if "routing" not in res:   # a partial run (--only without routing): the results, no report
        import json
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "eval.json").write_text(json.dumps(res, indent=1, default=report._default) + "\n")
        log(f"wrote {out_dir / 'eval.json'} (no report.md: --only without the routing part)")
        return 0
    files = report.write(res, out_dir, plots_too=not args.no_plots)
    for f in files:
        log(f"wrote {f.relative_to(REPO) if f.is_relative_to(REPO) else f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
