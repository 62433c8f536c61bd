"""The evaluation's outputs: bench/results/eval.json (everything measured), bench/results/report.md (for people),
and PNG plots next to it (matplotlib, Agg backend)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .routers import BASELINE_WORDS, BASELINES, LABELS, ROUTERS

ORDER = (*ROUTERS, "centroid", "kmeans20", "nearest_chunk", "route", "route_text")
# routers that see the stores' contents rather than a description: no description tokens, no BM25 column
CONTENT_ROUTERS = ("centroid", "kmeans20", "nearest_chunk", "route", "route_text")
SHORT = {"names": "(a) name", "handwritten_short": "(b) hand-written\nshort", "handwritten": "(b) hand-written\nshort+long",
         "keywords": "(c) keywords", "clusters": "(d) clusters", "hybrid": "(e) hybrid\nstore_topics",
         "name_hybrid": "(e') name +\nstore_topics", **{f"tfidf{n}": f"TF-IDF\ntop {n}" for n in BASELINE_WORDS},
         "centroid": "centroid\n(reference)", "route": "route()",
         "route_text": "route_text()", "name_topics": "name +\nTopics", "name_terms": "name +\nTerms",
         "kmeans20": "nearest of\n20 clusters", "nearest_chunk": "nearest\nchunk"}


def pct(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{100 * x:.{digits}f}"


def ci(m: dict | None) -> str:
    if not m:
        return "–"
    lo, hi = m["ci95"]
    return f"{pct(m['value'])} [{pct(lo)}–{pct(hi)}]"


def routing_table(before: dict, k: int) -> list[str]:
    rk = f"recall@{k}"
    out = [f"| router (sees only the description) | top-1 % [95% CI] | recall@{k} % [95% CI] | BM25 top-1 % | "
           f"BM25 recall@{k} % | top-1, synopsis-only queries % | description tokens (mean) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in ORDER:
        e = before.get(r)
        if e is None:
            continue
        if not e.get("available"):
            out.append(f"| {LABELS[r]} | not available | | | | | |")
            continue
        emb = e["embedding"]
        bm = e.get("bm25")
        syn = e.get("embedding_synopsis")
        partial = "" if e["available_stores"] == e["stores"] else f" ({e['available_stores']}/{e['stores']} stores)"
        out.append(f"| {LABELS[r]}{partial} | {ci(emb['top1'])} | {ci(emb[rk])} | "
                   f"{pct(bm['top1']['value']) if bm else '–'} | {pct(bm[rk]['value']) if bm else '–'} | "
                   f"{pct(syn['top1']['value']) if syn else '–'} | "
                   f"{e.get('tokens_mean', 0):.0f} |" if r not in CONTENT_ROUTERS else
                   f"| {LABELS[r]} | {ci(emb['top1'])} | {ci(emb[rk])} | – | – | "
                   f"{pct(syn['top1']['value']) if syn else '–'} | – |")
    return out


def targets(res: dict) -> list[str]:
    b = res["routing"]["before"]
    out = []
    if not b["hybrid"].get("available"):
        return ["- hybrid store_topics not available: targets not evaluated"]
    h = b["hybrid"]["embedding"]["top1"]["value"]
    n = b["names"]["embedding"]["top1"]["value"]
    w = b["handwritten"]["embedding"]["top1"]["value"]
    ws = b["handwritten_short"]["embedding"]["top1"]["value"]
    p = res["routing"]["paired"]

    def diff(key):
        d = p.get(key)
        return f" (paired bootstrap difference {pct(d['diff'])} points, 95% CI [{pct(d['ci95'][0])}, " \
               f"{pct(d['ci95'][1])}])" if d else ""

    gap = h - (n + 0.10)
    out.append(f"- hybrid ≥ names-only + 10 points: hybrid {pct(h)} %, names {pct(n)} % → "
               + ("**met**" if gap >= 0 else f"**missed by {pct(-gap)} points**") + diff("hybrid - names"))
    for label, v, key in (("short + long", w, "hybrid - handwritten"), ("short", ws, "hybrid - handwritten_short")):
        gap = h - v
        d = p.get(key)
        weak = " — met on the point estimate only: the interval includes 0" if gap >= 0 and d and \
            d["ci95"][0] < 0 else ""
        out.append(f"- hybrid ≥ hand-written ({label}): hybrid {pct(h)} %, hand-written {pct(v)} % → "
                   + ("**met**" if gap >= 0 else f"**missed by {pct(-gap)} points**") + diff(key) + weak)
    return out


SETS = (("routing", "Debian, 16 sections"), ("halves.tune", "Debian, tuning half (8 sections)"),
        ("halves.report", "Debian, reporting half (8 sections)"), ("family2", "WordNet nouns (second family)"))


def _set(res: dict, key: str) -> dict | None:
    node = res
    for part in key.split("."):
        node = (node or {}).get(part)
    return node


def baseline_table(res: dict) -> list[str]:
    """name + store_topics against the strongest simple baseline of no greater length, per set and router."""
    out = ["| set | router | name + store_topics top-1 % | best baseline of ≤ its length | baseline top-1 % | "
           "difference, points [paired 95% CI] | tokens (ours / baseline) | target: ≥ the baseline |",
           "|---|---|---:|---|---:|---:|---:|:---:|"]
    for key, title in SETS:
        r = _set(res, key)
        if not r:
            continue
        for router, v in (r.get("versus_baseline") or {}).items():
            lo, hi = v["ci95"]
            met = "met" if v["diff"] >= 0 else "missed"
            out.append(f"| {title} | {'MiniLM cosine' if router == 'embedding' else 'BM25'} | {ci(v['ours'])} | "
                       f"{LABELS[v['baseline']]} | {ci(v['best'])} | {pct(v['diff'])} [{pct(lo)}, {pct(hi)}] | "
                       f"{v['tokens']['ours']:.0f} / {v['tokens']['baseline']:.0f} | {met} |")
    return out


def set_table(r: dict, k: int) -> list[str]:
    """The main routers on one set: top-1 of both routers."""
    rows = ["| router | top-1 % [95% CI] | BM25 top-1 % | tokens |", "|---|---:|---:|---:|"]
    for key in ("names", *BASELINES, "hybrid", "name_hybrid", "centroid", "route",
                "route_text"):
        e = r["before"].get(key)
        if not e or not e.get("available"):
            continue
        bm = e.get("bm25")
        rows.append(f"| {LABELS[key]} | {ci(e['embedding']['top1'])} | {pct(bm['top1']['value']) if bm else '–'} | "
                    + ("– |" if key in CONTENT_ROUTERS else f"{e.get('tokens_mean', 0):.0f} |"))
    return rows


def _abst_row(label: str, where: str, a: dict | None) -> str:
    if not a:
        return f"| {label} | {where} | – | – | – | – | – |"
    return (f"| {label} | {where} | {a['threshold']:g} | {ci(a['precision'])} | {ci(a['recall'])} | "
            f"{a['f1']['value']:.3f} [{a['f1']['ci95'][0]:.3f}–{a['f1']['ci95'][1]:.3f}] | "
            f"{a['abstained_in']}/{a['in']} |")


# The families and their sets: (title, all, tuning half, reporting half) as keys of the results
FAMILIES = (("Debian sections", "routing", "halves.tune", "halves.report"),
            ("WordNet nouns", "family2", "family2_halves.tune", "family2_halves.report"),
            ("Document stores", "docs", "docs_halves.tune", "docs_halves.report"))
FAMILY_ROWS = ("names", "name_hybrid", "name_topics", "name_terms", *BASELINES)
SET_NAMES = (("tune", "tuning half"), ("report", "reporting half"), ("all", "all"))


def _style_node(r: dict | None, style: str) -> dict | None:
    """One style's results of a set: {"before", "versus_baseline", "queries", ...}."""
    if not r:
        return None
    if r.get("style", style) == style:
        return {"before": r["before"], "versus_baseline": r.get("versus_baseline") or {}, "queries": r["queries"],
                "out_queries": r.get("out_queries", 0), "examples": r.get("examples") or {}}
    return (r.get("styles") or {}).get(style)


def _family_sets(res: dict, fam: tuple) -> dict[str, dict]:
    _, a, t, rp = fam
    return {k: v for k, v in (("tune", _set(res, t)), ("report", _set(res, rp)), ("all", _set(res, a))) if v}


def _styles_of(sets: dict[str, dict]) -> list[str]:
    r = sets.get("all") or next(iter(sets.values()))
    return [r.get("style") or "descriptions", *(r.get("styles") or {})]


def _top1(e: dict | None, router: str = "embedding") -> str:
    if not e or not e.get("available") or router not in e:
        return "–"
    return ci(e[router]["top1"])


def families_section(res: dict) -> list[str]:
    """Every family x query style x router: name alone, name + store_topics, name + its Topics section, name + its
    Terms section and the TF-IDF baselines, on the tuning half, the reporting half and all the stores; then name +
    store_topics against the best TF-IDF baseline no longer than it (paired bootstrap)."""
    from .routing import STYLE_LABELS
    L = ["## Every family, both query styles", "",
         "Three corpus families, each in two query styles: Debian sections (the held-out package's whole description; "
         "its synopsis line with the package's name removed), WordNet nouns (the held-out synset's lemmas and gloss; "
         "its lemmas alone) and document stores (30-word passages of held-out pages; the held-out pages' titles with "
         "the product's names removed). Each half is its own catalog (`store_topics` contrasts a store with its "
         "siblings), so a half's summaries are not those of the whole set. Top-1 % [Wilson 95%] with the MiniLM "
         "cosine router and with BM25 over the descriptions; tokens: mean description length.", ""]
    vb_rows, met, topics_met, n_cells = [], 0, 0, 0
    for fam in FAMILIES:
        sets = _family_sets(res, fam)
        if not sets:
            continue
        for style in _styles_of(sets):
            nodes = {k: _style_node(v, style) for k, v in sets.items()}
            nodes = {k: v for k, v in nodes.items() if v}
            if not nodes:
                continue
            counts = ", ".join(f"{name} {nodes[k]['queries']}" for k, name in SET_NAMES if k in nodes)
            L += [f"**{fam[0]}, {style}** ({STYLE_LABELS.get(style, style)}; queries: {counts})", "",
                  "| description | MiniLM tuning half | MiniLM reporting half | MiniLM all | BM25 tuning half | "
                  "BM25 reporting half | BM25 all | tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for row in FAMILY_ROWS:
                cells = [_top1((nodes.get(k) or {}).get("before", {}).get(row), rt) for rt in ("embedding", "bm25")
                         for k, _ in SET_NAMES]
                e = (nodes.get("all") or next(iter(nodes.values())))["before"].get(row) or {}
                L.append(f"| {LABELS[row]} | " + " | ".join(cells) + f" | {e.get('tokens_mean', 0):.0f} |")
            L += [""]
            for k, name in SET_NAMES:
                for router, v in ((nodes.get(k) or {}).get("versus_baseline") or {}).items():
                    lo, hi = v["ci95"]
                    top1 = {r: ((nodes[k]["before"].get(r) or {}).get(router) or {}).get("top1", {}).get("value")
                            for r in ("names", "name_topics")}
                    gain = None if None in top1.values() else top1["name_topics"] - top1["names"]
                    n_cells, met = n_cells + 1, met + (v["diff"] >= 0)
                    topics_met += gain is not None and gain >= 0.10 - 1e-9
                    vb_rows.append(f"| {fam[0]} | {style} | {name} | {'MiniLM' if router == 'embedding' else 'BM25'} "
                                   f"| {ci(v['ours'])} | {LABELS[v['baseline']]} | {ci(v['best'])} | "
                                   f"{pct(v['diff'])} [{pct(lo)}, {pct(hi)}] | {v['tokens']['ours']:.0f} / "
                                   f"{v['tokens']['baseline']:.0f} | {'–' if gain is None else pct(gain)} |")
    if vb_rows:
        L += ["Name + `store_topics` against the best TF-IDF baseline no longer than it (mean tokens), per family, "
              "style, set and router (paired bootstrap of the top-1 differences on the same queries), and what the "
              "Topics section alone adds to the name:", "",
              "| family | style | set | router | name + store_topics top-1 % | best baseline ≤ its length | "
              "baseline top-1 % | difference, points [95% CI] | tokens (ours / baseline) | Topics − name, points |",
              "|---|---|---|---|---:|---|---:|---:|---:|---:|", *vb_rows, "",
              "Targets (issue 29, on every row):",
              f"- name + `store_topics` ≥ the best baseline no longer than it (point estimate): {met} of {n_cells} → "
              + ("**met**" if met == n_cells else "**missed**"),
              f"- name + the Topics section ≥ the name alone + 10 points: {topics_met} of {n_cells} → "
              + ("**met**" if topics_met == n_cells else "**missed**"), ""]
    return L


def content_section(res: dict) -> list[str]:
    """route() and route_text() against the references that see the contents (nearest of 20 KMeans clusters per
    store, the store centroid, the nearest chunk), per family and style; and what route()/route_text() decide at the
    installed default thresholds on queries some store holds and on queries none holds."""
    from .routing import KMEANS_K
    L = ["## `route()` against the content references, and search or not at the default thresholds", "",
         f"Routers that see the stores' contents: `storetopics.route()` (the stores' clusters, the query's MiniLM "
         f"vector), `storetopics.route_text()` (the stores' term counts, the query text), and three references "
         f"computed here from the stored chunk vectors: each store's chunks clustered with sklearn KMeans (K = "
         f"{KMEANS_K}) and the query sent to the store of the nearest centroid of any store; the store's centroid; "
         f"the store of the nearest chunk. Top-1 % [Wilson 95%] / recall@3 %.", ""]
    ab_rows = []
    for fam in FAMILIES:
        sets = _family_sets(res, fam)
        if not sets:
            continue
        for style in _styles_of(sets):
            nodes = {k: _style_node(v, style) for k, v in sets.items()}
            nodes = {k: v for k, v in nodes.items() if v}
            L += [f"**{fam[0]}, {style}**", "",
                  "| router | tuning half | reporting half | all |", "|---|---:|---:|---:|"]
            for row in ("route", "route_text", "kmeans20", "centroid", "nearest_chunk"):
                cells = []
                for k, _ in SET_NAMES:
                    e = (nodes.get(k) or {}).get("before", {}).get(row)
                    cells.append(f"{ci(e['embedding']['top1'])} / {pct(e['embedding']['recall@3']['value'])}"
                                 if e and e.get("available") and "embedding" in e else "–")
                L.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
            L += [""]
            for k, name in SET_NAMES:
                node = nodes.get(k) or {}
                for fn in ("route", "route_text"):
                    e = node.get("before", {}).get(fn) or {}
                    if not e.get("available") or not e.get("search_in") or not node.get("out_queries"):
                        continue
                    ab_rows.append(f"| {fam[0]} | {style} | {name} | `{fn}()` | {e['default_threshold']:g} | "
                                   f"{ci(e['search_in'])} ({e['search_in']['hits']}/{e['search_in']['n']}) | "
                                   f"{ci(e['no_search_out'])} ({e['no_search_out']['hits']}/"
                                   f"{e['no_search_out']['n']}) |")
    if ab_rows:
        L += ["What the functions returned at the installed default thresholds: the share of queries some store "
              "holds that they send to a search (a row with `search = true`), and of queries no store holds (held-out "
              "packages of sections with no store; held-out pages of the products never in the catalog) that they "
              "send nowhere. The reporting halves are the figures to read; the thresholds were not chosen on "
              "them.", "",
              "| family | style | set | function | default threshold | in-catalog: search = true % [95% CI] | "
              "out-of-catalog: search = false % [95% CI] |", "|---|---|---|---|---:|---:|---:|", *ab_rows, ""]
    dab = res.get("docs_abstention") or {}
    if any(v.get("available") for v in dab.values()):
        L += ["Document stores, passages: the abstention threshold with the best F1 on the documents' tuning half "
              "(out-of-catalog products there: " + ", ".join((_set(res, "docs_halves.tune") or {}).get(
                  "abstain_sections") or []) + "), on the reporting half (" + ", ".join(
                  (_set(res, "docs_halves.report") or {}).get("abstain_sections") or []) + ") and on all stores:", "",
              "| router | set | threshold | abstention precision % [95% CI] | recall % [95% CI] | F1 [95% CI] | "
              "queries with a store abstained on |", "|---|---|---:|---:|---:|---:|---:|"]
        for fn in ("route", "route_text"):
            e = dab.get(fn) or {}
            if not e.get("available"):
                continue
            for key, where in (("tune", "tuning half (chosen here)"), ("report", "reporting half"), ("all", "all")):
                L.append(_abst_row(f"`{fn}()`", where, (e.get(key) or {}).get("chosen")))
            for key, where in (("report", "reporting half"), ("all", "all")):
                L.append(_abst_row(f"`{fn}()`, installed default", where, (e.get(key) or {}).get("default")))
        L += [""]
    return L


def summaries_section(res: dict) -> list[str]:
    """Every store's store_topics, of every family (the run over all its stores), and a few queries of each."""
    L = ["## Every store's `store_topics`", "",
         "As the extension rendered them for the run over all of a family's stores (what the routers above read), "
         "with two queries of each store in each style.", ""]
    for fam in FAMILIES:
        r = _set(res, fam[1])
        if not r:
            continue
        L += [f"### {fam[0]}", ""]
        styles = _styles_of({"all": r})
        ex = {st: (_style_node(r, st) or {}).get("examples") or {} for st in styles}
        for s, v in r["stores"].items():
            L.append(f"- **{s}** ({v['files']:,} files, {v['chunks']:,} chunks): "
                     f"{v['descriptions'].get('hybrid') or '(no summary)'}")
            for st in styles:
                if ex[st].get(s):
                    L.append(f"  - {st}: " + " · ".join(f"“{q}”" for q in ex[st][s]))
        outs = [s for s in next(iter(ex.values()), {}) if s not in r["stores"]]
        if outs:
            L.append("- queries no store holds: " + "; ".join(
                f"{s}: " + " · ".join(f"“{q}”" for st in styles for q in ex[st].get(s, [])[:1]) for s in outs))
        L += [""] + residue_lines(r.get("residue"))
    return L


def residue_lines(res: dict | None) -> list[str]:
    """Issue 29's classes of ingestion residue in the texts above, judged against each store's pages
    (evaluation/residue.py)."""
    if not res:
        return []
    L = [f"Residue in these {res['stores']} texts, judged against the pages each store holds (`lab/evaluation/"
         "residue.py`; target: none of any class):", "",
         "| class | shown | which (store: word or topic) |", "|---|---:|---|"]
    for c, v in res["classes"].items():
        L.append(f"| {c} | {v['count']} | {', '.join(v['examples']) or '–'} |")
    return L + [""]


def abstention_section(res: dict) -> list[str]:
    """Retrieve or not: the extension's routers on queries no store holds, the threshold chosen on the tuning half,
    the figures on the reporting half and on all the stores, the curve, and the measurement behind route()'s
    score."""
    r = res["routing"]
    ab = res.get("abstention") or {}
    if not any(v.get("available") for v in ab.values()):
        return []
    b = r["before"]
    L = ["## Retrieve or not: `route()` and `route_text()`", "",
         f"The extension's own routers rank the stores from what they hold: `storetopics.route(query_embedding)` "
         f"from the stores' clusters (the query's all-MiniLM-L6-v2 embedding), `storetopics.route_text(query)` from "
         f"their term counts (for stores without embeddings); both are in the routing table above, beside the "
         f"centroid reference. Each also says whether to search at all: no row has `search` when the best store's "
         f"score is below a threshold (settings `route_threshold`, `route_text_threshold`). The queries no store "
         f"holds: {r.get('out_queries', 0)} held-out packages of the sections that have no store "
         f"({', '.join(r.get('abstain_sections') or [])}; the catch-all sections libs, libdevel, devel, doc and misc "
         f"left out, as their packages may be about what a store holds), beside the {r['queries']} queries that "
         f"have a store. Abstaining is the positive class: precision = share of abstentions that were on a query no "
         f"store holds, recall = share of those queries abstained on (Wilson 95%), F1 with a bootstrap 95% interval. "
         f"The threshold was chosen on the tuning half (its own out-of-store sections: "
         f"{', '.join((res.get('halves') or {}).get('tune', {}).get('abstain_sections') or [])}), best F1 there, "
         f"and is reported on the reporting half (sections "
         f"{', '.join((res.get('halves') or {}).get('report', {}).get('abstain_sections') or [])}) and on all "
         f"{len(r['stores'])} stores.", "",
         "| router | set | threshold | abstention precision % [95% CI] | recall % [95% CI] | F1 [95% CI] | "
         "queries with a store abstained on |", "|---|---|---:|---:|---:|---:|---:|"]
    for fn in ("route", "route_text"):
        e = ab.get(fn) or {}
        if not e.get("available"):
            continue
        for key, where in (("tune", "tuning half (chosen here)"), ("report", "reporting half"),
                           ("all", f"all {len(r['stores'])} stores")):
            L.append(_abst_row(f"`{fn}()`", where, (e.get(key) or {}).get("chosen")))
        if abs(e["default"] - e["threshold"]) > 1e-9:
            for key, where in (("report", "reporting half"), ("all", f"all {len(r['stores'])} stores")):
                L.append(_abst_row(f"`{fn}()`, installed default", where, (e.get(key) or {}).get("default")))
    L += [""]
    e = ab.get("route") or {}
    cen = b.get("centroid", {}).get("embedding", {}).get("top1", {}).get("value")
    rt = b.get("route", {})
    if e.get("available") and rt.get("available"):
        t1 = rt["embedding"]["top1"]["value"]
        rep_f1 = ((e.get("report") or {}).get("chosen") or {}).get("f1", {}).get("value")
        all_f1 = ((e.get("all") or {}).get("chosen") or {}).get("f1", {}).get("value")
        L += ["Targets:",
              f"- `route()` top-1 ≥ the centroid reference: {pct(t1)} % vs {pct(cen)} % → "
              + ("**met**" if cen is not None and t1 >= cen else "**missed**"),
              f"- abstention F1 ≥ 0.8 (threshold from the tuning half): reporting half "
              f"{rep_f1:.3f} → " + ("**met**" if rep_f1 is not None and rep_f1 >= 0.8 else "**missed**")
              + (f"; all {len(r['stores'])} stores {all_f1:.3f} → "
                 + ("**met**" if all_f1 >= 0.8 else "**missed**") if all_f1 is not None else "")
              + (f"; tuning half {e['tune']['chosen']['f1']['value']:.3f}" if e.get("tune") else ""), ""]
        if rt.get("out_abstained_by_section"):
            L += [f"Out-of-store queries abstained on at the installed default ({rt['default_threshold']:g}), per "
                  f"section (all stores): " + ", ".join(f"{k} {pct(v, 0)} %"
                                                          for k, v in rt["out_abstained_by_section"].items())
                  + f". AUC of the best store's score, queries with a store above those without: "
                  f"{rt.get('auc', float('nan')):.3f}.", ""]
    tune = (res.get("halves") or {}).get("tune", {}).get("before", {}).get("route", {})
    if tune.get("curve"):
        L += ["The curve on the tuning half (`route()`; every fourth point):", "",
              "| threshold | precision % | recall % | F1 |", "|---:|---:|---:|---:|"]
        for pt in tune["curve"][::4]:
            L.append(f"| {pt['threshold']:.3f} | {pct(pt['precision'])} | {pct(pt['recall'])} | {pt['f1']:.3f} |")
        L += [""]
    for key, title in (("halves.tune", "tuning half (where the score was chosen)"),
                       ("halves.report", "reporting half")):
        v = (_set(res, key) or {}).get("route_variants") or {}
        if not v:
            continue
        k = r["config"]["k"]
        L += [f"How `route()` scores a store, measured on the {title}: the same clusters scored in Python (d: the "
              f"query's cosine distance to a cluster, radius: the cluster's, share: its share of the store's chunks; "
              f"mixture: ln Σ share·exp(κ(1−d)) / κ). Best F1 uses the best threshold of that set (comparable "
              f"between rows, not a result). `route()` is mixture, κ 20"
              + (f" (its SQL scores within {v['sql_vs_python_max_abs_diff']:.1e} of this)"
                 if "sql_vs_python_max_abs_diff" in v else "") + ".", "",
              f"| score | top-1 % | recall@{k} % | AUC | best F1 |", "|---|---:|---:|---:|---:|"]
        for name, x in v.items():
            if not isinstance(x, dict):
                continue
            L.append(f"| {name} | {pct(x['top1'])} | {pct(x[f'recall@{k}'])} | "
                     f"{x.get('auc', float('nan')):.3f} | {x.get('best_f1', float('nan')):.3f} |")
        L += [""]
    return L


def _rate(m: dict | None) -> str:
    return f"{m['hits']}/{m['n']} = {ci(m)} %" if m and m.get("n") else "–"


def needle_summary(res: dict) -> list[str]:
    """Both families' needle figures side by side (the target is >= 95% found)."""
    L = ["| family | host stores | trials | subject newly in `store_topics` (target ≥ 95%) | summary restored byte "
         "for byte | flood: one-off values in the distinctive list |", "|---|---|---:|---|---:|---|"]
    nd, dd = res.get("needle"), res.get("needle_docs")
    if nd:
        fl = nd.get("flood") or {}
        flood = ", ".join(f"{s} {len(f['one_offs_in_distinctive'])}/{f['one_off_values']:,}" for s, f in fl.items())
        L.append(f"| Debian sections | {', '.join(nd['store_files'])} | {nd['subject_rate']['n']} | "
                 f"{_rate(nd['subject_rate'])} | {nd['restored_exactly']}/{nd['subject_rate']['n']} | "
                 f"{flood or '–'} |")
    if dd:
        L.append(f"| document stores | {', '.join(dd['store_files'])} | {dd['subject_rate']['n']} | "
                 f"{_rate(dd['subject_rate'])} | {dd['restored_exactly']}/{dd['subject_rate']['n']} | "
                 f"not run |")
    return L + [""]


def _reach_note(trial: dict) -> str:
    """A missed needle's subject words that any summary of its words could have shown (needle.reachable)."""
    if "subject_reachable" not in trial:
        return ""
    if not trial["subject_reachable"]:
        return " (it holds no word of its subject a summary could add)"
    ranks = trial.get("subject_ranks") or {}

    def ranked(w: str) -> str:
        if w not in ranks:
            return w
        return f"{w}, its {_ordinal(ranks[w])} word" if ranks[w] else f"{w}, not a word a summary may show there"
    words = ("; " if ranks else ", ").join(ranked(w) for w in trial["subject_reachable"])
    return f" (subject words it holds, not shown before: {words})"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def needle_docs_section(res: dict) -> list[str]:
    dd = res.get("needle_docs")
    if not dd:
        return []
    sr, cfg = dd["subject_rate"], dd["config"]
    L = ["### Needle in document stores", "",
         f"The document catalog ({len(cfg['catalog'])} stores, the pages the routing loads) in its own table; hosts "
         + ", ".join(f"{h} ({n:,} pages)" for h, n in dd["store_files"].items())
         + f". Each trial plants ONE page of a manual that is never in the catalog "
         f"({', '.join(cfg['sources'])}; in turn, each source's pages in the order of a hash salted with the host; "
         f"pages of 1–{cfg['max_chunks']} chunks with a title), backfills, reads `store_topics`, deletes the page "
         f"and backfills again. Found, as for Debian (synopsis + package name): a word of the page's title or its "
         f"product's name newly in `store_topics`. {sr['n']} trials.", "",
         f"- page's subject (title or product name) newly in `store_topics`: **{_rate(sr)}** (target ≥ 95%: "
         + ("met" if sr["value"] >= 0.95 else f"missed by {pct(0.95 - sr['value'])} points") + ")",
         "- per host: " + ", ".join(f"{h} {v['hits']}/{v['n']}" for h, v in dd["per_store"].items()),
         "- per source: " + ", ".join(f"{s} {v['hits']}/{v['n']}" for s, v in dd["per_source"].items() if v["n"]),
         f"- subject widened by the page's top {cfg['tfidf_words']} TF-IDF words (against the host's pages): "
         f"{_rate(dd['tfidf_rate'])}",
         f"- any word of the page newly in `store_topics`: {pct(dd['any_word_rate'])} %",
         *([f"- trials whose stored page holds a word of its subject that a summary may show (3–40 letters) and "
            f"`store_topics` did not show before the plant: {dd['reachable']['trials']}/{dd['reachable']['n']} (in "
            f"the others no summary of the page's words can name it); found in {dd['reachable']['hits']} of them"]
           if "reachable" in dd else []),
         f"- trials where topics attributes distinctive terms to the page: {pct(dd['attributed_rate'])} %",
         f"- summary restored byte for byte after deleting the page: **{dd['restored_exactly']}/{sr['n']}**",
         f"- median time of insert + backfill + read: {dd['trial_seconds_median']:.2f} s", ""]
    nv, iso = dd.get("novelty"), dd.get("isolation")
    if nv:
        L += [f"Diagnostics as for Debian: the page's median novelty z-score {nv['z_median']:.1f}; all its chunks "
              f"outside the clusters in {nv['apart']}/{nv['trials']} trials"
              + (f", 1.5 radii out or more in {nv['far']}/{nv['trials']}" if "far" in nv else "") + "; over the outlier gate in "
              f"{nv['over_gate']}/{nv['trials']}, among the 3 most novel files in {nv['in_top3']}/{nv['trials']}"
              + (f"; the most isolated file of its host by embedding in {iso['most_isolated']}/{iso['trials']}, "
                 f"among the 3 most isolated in {iso['top3']}/{iso['trials']}" if iso else "") + ".", ""]
    misses = [t for t in dd["trials"] if not t["subject_hit"]]
    if misses:
        L += ["Misses (host + page: title → new words of the page in `store_topics`; a subject word's rank among "
              "the words of the page a summary may show, by count × IDF in the host, as an outlier file's are "
              "ranked: it shows its best and then up to two of its 10 best, its title's words first):", ""]
        for t in misses[:10]:
            L.append(f"- {t['store']} + {t['needle_store']}: \"{t['title']}\" → "
                     f"{', '.join(t['needle_words_new']) or 'none'}" + _reach_note(t))
        L.append("")
    hits = [t for t in dd["trials"] if t["subject_hit"]][:3]
    if hits:
        L += ["Hits, for example:", ""]
        for t in hits:
            L.append(f"- {t['store']} + {t['needle_store']}: \"{t['title']}\" → {', '.join(t['subject_words_new'])}")
        L.append("")
    return L


def stability_section(res: dict) -> list[str]:
    st = res.get("stability")
    if not st:
        return []
    L = ["", "### Stability for prompt caches", "",
         "A prompt that holds the catalog (the MCP tool list, a system prompt) keeps its cache only while the texts "
         "before the change stay byte for byte the same. Each catalog below was built again in its own table; half "
         "of its stores (by hash) then churned in rounds of file events (files added, replaced by another of the "
         "store's files, deleted; in proportion to the stores' files) and the other half got none; after each round "
         "a backfill (the first rounds `storetopics.api.backfill`, the CLI path; the last rounds SQL "
         "`storetopics.backfill()`, which here does not re-cluster: no plpython3u). Goal: ≤ 5% of the untouched "
         "stores' texts change per 100 file events.", "",
         "| catalog | stores (touched) | rounds × file events | backfill | untouched stores changed per 100 file "
         "events | touched stores changed | touched: words changed or moved (median) | touched: new words "
         "(median) | touched: text kept as common prefix (median) |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    names = {"debian": "Debian sections", "docs": "document stores"}
    for fam, f in st.items():
        for path, agg in [*f["by_backfill"].items(), ("all", f["all"])]:
            if not agg:
                continue
            L.append(f"| {names.get(fam, fam)} | {f['stores']} ({len(f['touched'])}) | {agg['rounds']} × "
                     f"{agg['file_events'] // max(agg['rounds'], 1)} | {path} | "
                     f"{pct(agg['untouched_changed_share_per_100_events'])} % ({agg['untouched_changed']}/"
                     f"{agg['untouched_store_rounds']} store-rounds) | {agg['touched_changed']}/"
                     f"{agg['touched_store_rounds']} | {pct(agg['touched_words_changed_median'])} % | "
                     f"{pct(agg.get('touched_words_new_median'))} % | {pct(agg['touched_prefix_kept_median'])} % |")
    L.append("")
    for fam, f in st.items():
        cu = f.get("cumulative") or {}
        ok = all((a or {}).get("untouched_changed_share_per_100_events", 1) <= 0.05 for a in [f["all"]])
        L.append(f"- {names.get(fam, fam)}: touched {', '.join(f['touched'])}; untouched {', '.join(f['untouched'])}"
                 f". Goal ≤ 5% per 100 file events: **{'met' if ok else 'missed'}**"
                 + (f"; after all {cu['file_events']:,} events, {len(cu['untouched_changed'])}/{cu['untouched']} "
                    f"untouched stores differ from their first text"
                    + (f" ({', '.join(cu['untouched_changed'])})" if cu['untouched_changed'] else "") if cu else "")
                 + ".")
    for fam, f in st.items():
        ex = next((r["example"] for r in f["rounds"] if r.get("example")), None)
        if ex:
            L += ["", f"{names.get(fam, fam).capitalize()}, round 1, the touched store of the median change: "
                      f"`{ex['store']}` ({ex['files_before']} files, {ex['file_events']} file events in the round):",
                  "", f"- before: {ex['before']}", f"- after: {ex['after']}"]
    return L + [""]


def plots(res: dict, out_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    r = res["routing"]
    k = r["config"]["k"]
    rk = f"recall@{k}"
    # 1. routing accuracy per router
    names, t1, lo, hi, rec, bm = [], [], [], [], [], []
    for key in ORDER:
        e = r["before"].get(key)
        if not e or not e.get("available"):
            continue
        m = e["embedding"]["top1"]
        names.append(LABELS[key])
        t1.append(100 * m["value"])
        lo.append(100 * (m["value"] - m["ci95"][0]))
        hi.append(100 * (m["ci95"][1] - m["value"]))
        rec.append(100 * e["embedding"][rk]["value"])
        bm.append(100 * e["bm25"]["top1"]["value"] if e.get("bm25") else float("nan"))
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(names) + 2.0))
    y = list(range(len(names)))[::-1]
    ax.barh([v + 0.2 for v in y], t1, height=0.38, xerr=[lo, hi], capsize=3, color="#3b6ea8",
            label="top-1, embedding router (95% CI)")
    ax.barh([v - 0.2 for v in y], bm, height=0.38, color="#c9a227", label="top-1, BM25 router")
    ax.scatter(rec, [v + 0.2 for v in y], marker="|", s=200, color="black", zorder=3, label=f"{rk}, embedding")
    ax.set_yticks(y)
    ax.set_yticklabels(names)
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of queries routed to the right store")
    ax.set_title(f"Routing {r['queries']} held-out queries to {len(r['stores'])} stores")
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.13), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "eval-routing.png", dpi=110)
    plt.close(fig)
    made.append("eval-routing.png")

    # 2. accuracy vs summary length
    if r.get("length_curve"):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for key, pts in r["length_curve"].items():
            if not pts:
                continue
            ax.plot([p["tokens_mean"] for p in pts], [100 * p["top1"] for p in pts], marker="o", label=LABELS[key])
        n = r["before"]["names"]["embedding"]["top1"]["value"] if r["before"]["names"].get("available") else None
        if n is not None:
            ax.axhline(100 * n, color="grey", ls="--", lw=1, label=LABELS["names"])
        ax.set_xscale("log")
        ax.set_xlabel("description length, mean tokens per store (first n words kept)")
        ax.set_ylabel("top-1 %")
        ax.set_title("Routing accuracy vs. summary length")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "eval-length.png", dpi=110)
        plt.close(fig)
        made.append("eval-length.png")

    # 3. drift
    d = r.get("drift")
    if d:
        keys = [k_ for k_ in ORDER if d["per_router"].get(k_)]
        fig, ax = plt.subplots(figsize=(9, 4.2))
        w = 0.27
        xs = range(len(keys))
        for j, (field, label, color) in enumerate((
                ("store_queries_before", f"queries of '{d['store']}', before drift", "#7a9cc6"),
                ("store_queries_after", f"queries of '{d['store']}', after drift (its own + drifted-in)", "#3b6ea8"),
                ("drifted_in_queries", f"drifted-in '{d['from_section']}' queries only", "#c0504d"))):
            vals = [100 * d["per_router"][k_][field]["value"] for k_ in keys]
            ax.bar([x + (j - 1) * w for x in xs], vals, width=w, label=label, color=color)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([SHORT[k_] for k_ in keys], fontsize=8)
        ax.set_ylabel("top-1 %")
        ax.set_ylim(0, 100)
        ax.set_title(f"Drift: {d['files_replaced']} of the '{d['store']}' store's files replaced by "
                     f"'{d['from_section']}' packages")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "eval-drift.png", dpi=110)
        plt.close(fig)
        made.append("eval-drift.png")

    # 4. retrieve or not: abstention precision, recall and F1 against the threshold, per half
    ab = res.get("abstention") or {}
    halves = res.get("halves") or {}
    if any(v.get("available") for v in ab.values()):
        fns = [fn for fn in ("route", "route_text") if (ab.get(fn) or {}).get("available")]
        fig, axes = plt.subplots(1, len(fns), figsize=(6 * len(fns), 4.0), squeeze=False)
        for ax, fn in zip(axes[0], fns):
            for half, ls in (("tune", "-"), ("report", "--")):
                e = ((halves.get(half) or {}).get("before") or {}).get(fn) or {}
                if not e.get("curve"):
                    continue
                xs = [p_["threshold"] for p_ in e["curve"]]
                for field, color in (("f1", "black"), ("precision", "#3b6ea8"), ("recall", "#c0504d")):
                    ax.plot(xs, [p_[field] for p_ in e["curve"]], ls=ls, color=color,
                            label=f"{field}, {half} half")
            ax.axvline(ab[fn]["threshold"], color="grey", lw=1, ls=":", label="chosen on the tuning half")
            ax.set_ylim(0, 1.02)
            ax.set_xlabel(f"{fn}() threshold (abstain below)")
            ax.set_title(f"{fn}(): abstaining on queries no store holds")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "eval-abstention.png", dpi=110)
        plt.close(fig)
        made.append("eval-abstention.png")

    # 5. needle
    nd = res.get("needle")
    if nd and nd.get("trials"):
        stores = sorted({t["store"] for t in nd["trials"]})
        fig, ax = plt.subplots(figsize=(6.5, 4.0))
        for j, (field, label, color) in enumerate((("subject_hit", "subject word in store_topics", "#3b6ea8"),
                                                   ("any_word_hit", "any needle word in store_topics", "#7a9cc6"))):
            vals = [100 * sum(t[field] for t in nd["trials"] if t["store"] == s) /
                    max(1, sum(1 for t in nd["trials"] if t["store"] == s)) for s in stores]
            ax.bar([i + (j - 0.5) * 0.38 for i in range(len(stores))], vals, width=0.38, label=label, color=color)
        ax.axhline(95, color="grey", ls="--", lw=1, label="target 95%")
        ax.set_xticks(range(len(stores)))
        ax.set_xticklabels([f"{s}\n({nd['store_files'][s]:,} files)" for s in stores])
        ax.set_ylim(0, 105)
        ax.set_ylabel("% of trials")
        ax.set_title("Needle: one planted package from a distant section")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
        fig.tight_layout()
        fig.savefig(out_dir / "eval-needle.png", dpi=110)
        plt.close(fig)
        made.append("eval-needle.png")
    return made


def markdown(res: dict, images: list[str]) -> str:
    r = res["routing"]
    k = r["config"]["k"]
    env = res["environment"]
    L = ["# storetopics evaluation report",
         "",
         f"Generated by `make eval` (`python -m lab.evaluation all`) on {env['started']}: {env.get('cpus')} CPUs, "
         f"PostgreSQL {r['server'].get('server_version')}, pgvector {r['server'].get('vector')}, storetopics "
         f"{r['server'].get('storetopics')} (git {env.get('git')}, working-tree SQL {env.get('sql_sha1')}, installed "
         f"extension files {env.get('installed_extension_sha1')}); total "
         f"{res['elapsed_seconds'] / 60:.1f} min. Embeddings: `{res['embedder']['name']}` "
         f"({res['embedder']['embedded']:,} texts embedded this run, {res['embedder']['cached']:,} from the disk "
         f"cache). Machine-readable: `eval.json`.",
         ""]
    if res.get("fallback_embedder"):
        L += ["> **The model was not installed: a hashing stand-in embedder was used. These numbers test the "
              "pipeline, they say nothing about routing accuracy.**", ""]
    L += ["## Routing",
          "",
          f"{len(r['stores'])} stores, one per Debian section (bookworm main; one file per package, one chunk per "
          f"paragraph, up to {r['config']['store_cap']} packages per store, real all-MiniLM-L6-v2 vectors in the "
          f"`embedding` column), attached with `storetopics.attach` and summarised by the extension "
          f"(`backfill`). Look-alike pairs: "
          + ", ".join(f"{a}/{b}" for a, b in (p.split("/") for p in r["lookalike_top1"])) + ". "
          f"**{r['queries']} queries**: held-out packages ({r['config']['held_share']:.0%} of each section by "
          f"SHA-1 of the package name, never loaded into any store), {r['config']['queries_per_section']} per "
          f"section; the query text is the package's whole description. A router sees one description per store "
          f"and picks the nearest (cosine of all-MiniLM-L6-v2 embeddings) or the best BM25 score. Intervals: "
          f"Wilson 95%.",
          "",
          *routing_table(r["before"], k),
          "",
          "Targets:",
          *targets(res),
          "",
          "### Against the strongest simple baseline",
          "",
          "The baseline: the store's name plus its top N words by TF-IDF with the stores as the documents (sklearn "
          "`TfidfVectorizer(stop_words=\"english\")` on one concatenated text per store), N = "
          + ", ".join(map(str, BASELINE_WORDS)) + ". Ours: the store's name plus `store_topics` (a router sees a "
          "tool's name and its description). Compared with the "
          "best baseline whose descriptions are no longer (mean cl100k-ish tokens), on the same queries (paired "
          "bootstrap). Settings were chosen on the tuning half only; the reporting half and WordNet were not looked "
          "at while tuning.",
          "",
          *baseline_table(res),
          ""]
    L += families_section(res)
    L += content_section(res)
    L += abstention_section(res)
    if "eval-abstention.png" in images:
        L += ["![abstention against the threshold](eval-abstention.png)", ""]
    lab = r.get("labels")
    if lab and lab["clusters"]:
        L += ["### Offline labels: phrases people wrote", "",
              f"Of {lab['clusters']} clusters in the 16 stores, the shown offline label occurs verbatim (case aside) "
              f"in the text of the cluster's own files for **{pct(lab['new_verbatim'])}%** (goal ≥ 90%; a mined "
              f"phrase for {pct(lab['mined'])}%, the cluster's first words otherwise); 0.1's label (the cluster's "
              f"first three words) did for {pct(lab['old_verbatim'])}%. Twenty clusters, 0.1 → now:", "",
              "| store | 0.1 label | now |", "|---|---|---|"]
        step = max(1, len(lab["pairs"]) // 20)
        for x in lab["pairs"][::step][:20]:
            L.append(f"| {x['store']} | {x['old']} | {x['new']} |")
        L += [""]
    for key, title in SETS[1:]:
        s = _set(res, key)
        if s:
            L += [f"**{title}**: {len(s['stores'])} stores, {s['queries']} queries.", "", *set_table(s, k), ""]
    if res.get("family2"):
        w = res["family2"]
        L += [f"WordNet stores: {', '.join(w['stores'])} (noun lexicographer files; one file per synset; "
              f"{w['config']['store_cap']} synsets per store; held-out synsets as queries). Example summary "
              f"(`{next(iter(w['stores']))}`): {next(iter(w['stores'].values()))['descriptions']['hybrid']}", ""]
    if not r["before"]["clusters"].get("available"):
        L += ["(d) **cluster summary: not available** — `topics->'clusters'` is empty in every store with the "
              "installed SQL (the cluster signal is not there yet). The harness reads it from the database after "
              "`backfill`, so it is measured as soon as the extension fills it.", ""]
    if images and "eval-routing.png" in images:
        L += ["![routing accuracy per router](eval-routing.png)", ""]
    L += ["Top-1 % on the queries of each look-alike pair (embedding router):", "",
          "| pair | " + " | ".join(LABELS[x] for x in ORDER if x in next(iter(r["lookalike_top1"].values()), {})) +
          " |",
          "|---|" + "---:|" * len(next(iter(r["lookalike_top1"].values()), {}))]
    for pair, vals in r["lookalike_top1"].items():
        L.append(f"| {pair} | " + " | ".join(pct(vals[x], 0) for x in ORDER if x in vals) + " |")
    L += ["", "Most frequent confusions (true → chosen, queries):", ""]
    for key, conf in r["confusions"].items():
        L.append(f"- {LABELS[key]}: " + ", ".join(f"{c['true']}→{c['chosen']} {c['queries']}" for c in conf[:6]))
    L += [""]
    if "eval-length.png" in images:
        L += ["Accuracy vs. summary length (each description cut to its first n words):", "",
              "![accuracy vs summary length](eval-length.png)", ""]
    L += ["What the routers saw, for three stores:", ""]
    for s in list(r["stores"])[:3]:
        dsc = r["stores"][s]["descriptions"]
        L += [f"- **{s}** ({r['stores'][s]['files']} files, {r['stores'][s]['chunks']} chunks)"]
        for key in ("handwritten_short", "keywords", "clusters", "hybrid"):
            L.append(f"  - {LABELS[key]}: {dsc.get(key) or '(not available)'}")
    L += [""]

    d = r.get("drift")
    if d:
        L += ["## Drift", "",
              f"{d['files_replaced']} of the `{d['store']}` store's files were deleted and as many `"
              f"{d['from_section']}` packages inserted (real DELETE + COPY, then an incremental backfill: "
              f"{d['backfill_seconds']:.1f} s). Names and hand-written descriptions stay as they were (stale); "
              f"the maintained summaries are read again. The store's queries after drift: its "
              f"{d['store_queries_before']} own held-out queries plus {d['drifted_in_queries']} held-out "
              f"`{d['from_section']}` packages, whose right answer is now `{d['store']}`.", "",
              f"| router | top-1 on `{d['store']}` queries before % | after (own + drifted-in) % | drifted-in only % "
              f"| all queries after % |",
              "|---|---:|---:|---:|---:|"]
        for key in ORDER:
            pr = d["per_router"].get(key)
            if pr is None:
                if key in d["per_router"]:
                    L.append(f"| {LABELS[key]} | not available | | | |")
                continue
            L.append(f"| {LABELS[key]} | {ci(pr['store_queries_before'])} | {ci(pr['store_queries_after'])} | "
                     f"{ci(pr['drifted_in_queries'])} | {pct(pr['all_queries_after']['value'])} |")
        L += ["", f"`{d['store']}` store_topics before: {d['store_topics_before']}", "",
              f"after: {d['store_topics_after']}", ""]
        hy, hw = d["per_router"].get("hybrid"), d["per_router"].get("handwritten")
        if hy and hw:
            keep = hy["store_queries_after"]["value"] - hy["store_queries_before"]["value"]
            lose = hw["store_queries_after"]["value"] - hw["store_queries_before"]["value"]
            hs = d["per_router"].get("handwritten_short")
            lose_s = hs["store_queries_after"]["value"] - hs["store_queries_before"]["value"] if hs else float("nan")
            L += [f"Change on the store's queries: hybrid {keep * 100:+.1f} points; stale hand-written "
                  f"{lose_s * 100:+.1f} points (short), {lose * 100:+.1f} points (short + long).", ""]
            ref = d["per_router"].get("centroid")
            if ref:
                def gap(pr, when):
                    return 100 * (pr[when]["value"] - ref[when]["value"])
                L += [f"A store that is half `{d['store']}` and half `{d['from_section']}` is harder to route to "
                      f"whatever describes it: the reference that sees the contents (the store's centroid) moves "
                      f"{pct(ref['store_queries_before']['value'])} → {pct(ref['store_queries_after']['value'])} %. "
                      f"Measured against that reference, the hybrid summary is {gap(hy, 'store_queries_before'):+.1f} "
                      f"points before and {gap(hy, 'store_queries_after'):+.1f} after; the stale hand-written "
                      f"sentences {gap(hs, 'store_queries_before'):+.1f} → {gap(hs, 'store_queries_after'):+.1f} "
                      f"(short) and {gap(hw, 'store_queries_before'):+.1f} → {gap(hw, 'store_queries_after'):+.1f} "
                      f"(short + long). On the drifted-in queries alone: hybrid "
                      f"{pct(hy['drifted_in_queries']['value'])} %, hand-written "
                      f"{pct(hs['drifted_in_queries']['value'])} % (short), "
                      f"{pct(hw['drifted_in_queries']['value'])} % (short + long).", ""]
        if "eval-drift.png" in images:
            L += ["![drift](eval-drift.png)", ""]

    nd = res.get("needle")
    if nd or res.get("needle_docs"):
        L += ["## Needle", ""]
        L += needle_summary(res)
    if nd:
        sr = nd["subject_rate"]
        L += ["### Needle in Debian sections", "",
              f"Uniform stores: whole Debian sections ({', '.join(f'{s}: {n:,} packages' for s, n in nd['store_files'].items())}), "
              f"library sections by default, where every package is of one kind; mixed sections such as science or net "
              f"are not uniform (a package of another section usually has close neighbours there) and run with "
              f"`--needle-stores science,net`. "
              f"Each trial plants ONE package from a distant section "
              f"({', '.join(nd['config']['needle_sections'])}), backfills, reads `store_topics`, deletes the "
              f"needle and backfills again. {sr['n']} trials.", "",
              f"- needle's subject (a word of its synopsis or name) newly in `store_topics`: **{sr['hits']}/{sr['n']} "
              f"= {ci(sr)} %** (target ≥ 95%: "
              + ("met" if sr["value"] >= 0.95 else f"missed by {pct(0.95 - sr['value'])} points") + ")",
              *(["- per store: " + ", ".join(f"{st} {v['hits']}/{v['n']}" for st, v in nd["per_store"].items())]
                if nd.get("per_store") else []),
              f"- any word of the needle newly in `store_topics`: {pct(nd['any_word_rate'])} %",
              *([f"- trials whose stored needle holds a word of its subject that a summary may show (3–40 letters) "
                 f"and `store_topics` did not show before the plant: {nd['reachable']['trials']}/"
                 f"{nd['reachable']['n']} (in the others no summary of its words can name it); found in "
                 f"{nd['reachable']['hits']} of them"] if "reachable" in nd else []),
              f"- trials where topics attributes distinctive terms to the needle file: "
              f"{pct(nd['attributed_rate'])} %",
              f"- summary restored byte for byte after deleting the needle: {nd['restored_exactly']}/{sr['n']}",
              f"- median time of insert + backfill + read: {nd['trial_seconds_median']:.2f} s", ""]
        nv = nd.get("novelty")
        if nv:
            L += [f"How (diagnostic, from the extension's state tables): the keyword side shows the terms of up to 3 "
                  f"outlier files, the most novel (mean IDF of their words) of those whose novelty has a robust "
                  f"z-score ≥ 3.5, or ≥ 2.5 when every chunk of the file lies outside the clusters (beyond its "
                  f"nearest cluster's radius), or ≥ 1.0 when every chunk lies 1.5 radii out or more. The planted "
                  f"needle's median z-score was {nv['z_median']:.1f}; "
                  + (f"all its chunks lay outside the clusters in {nv['apart']}/{nv['trials']} trials; "
                     if "apart" in nv else "")
                  + (f"1.5 radii out or more in {nv['far']}/{nv['trials']}; " if "far" in nv else "")
                  + f"it passed the gate in {nv['over_gate']}/{nv['trials']} trials and was among the 3 most novel "
                  f"files in {nv['in_top3']}/{nv['trials']} (median rank {nv['rank_median']:.0f}); the stores have a "
                  f"median of {nv['files_over_gate_median']:.0f} files of their own passing the gate.", ""]
        iso = nd.get("isolation")
        if iso:
            L += [f"Embedding side (diagnostic, computed here): ranked by isolation (cosine similarity of a file's "
                  f"mean vector to its nearest other file), the needle was the most isolated file of its store in "
                  f"{iso['most_isolated']}/{iso['trials']} trials and among the 3 most isolated in "
                  f"{iso['top3']}/{iso['trials']} (median rank {iso['rank_median']:.0f}).", ""]
        misses = [t for t in nd["trials"] if not t["subject_hit"]]
        if misses:
            L += ["Misses (needle: synopsis → what the summary showed of it; a subject word's rank among the "
                  "needle's words a summary may show, by count × IDF in the store, as an outlier file's are ranked: "
                  "it shows its best and then up to two of its 10 best, its synopsis' words first):", ""]
            for t in misses[:8]:
                L.append(f"- {t['store']} + {t['needle']} ({t['needle_section']}): \"{t['synopsis']}\" → new "
                         f"needle words {', '.join(t['needle_words_new']) or 'none'}" + _reach_note(t))
            L.append("")
        hits = [t for t in nd["trials"] if t["subject_hit"]][:3]
        if hits:
            L += ["Hits, for example:", ""]
            for t in hits:
                L.append(f"- {t['store']} + {t['needle']}: \"{t['synopsis']}\" → {', '.join(t['subject_words_new'])}")
            L.append("")
        if "eval-needle.png" in images:
            L += ["![needle](eval-needle.png)", ""]
        L += ["Flood: stores whose every file carries a one-off value (a made-up surname, or a `ref…` token, each "
              "in one file only, twice in that file):", "",
              "| store | files | one-off values | in the distinctive list | in store_topics |", "|---|---:|---:|---:|---:|"]
        for s, f in nd["flood"].items():
            L.append(f"| {s} | {f['files']:,} | {f['one_off_values']:,} | {len(f['one_offs_in_distinctive'])} | "
                     f"{len(f['one_offs_in_store_topics'])} |")
        L += [""]
        for s, f in nd["flood"].items():
            L.append(f"- `{s}` store_topics: {f['store_topics']}")
        L += [""]
    L += needle_docs_section(res)

    q = res.get("quality")
    L += ["## Cost and label quality", ""]
    led = r.get("ledger", {})
    if not led.get("available") or not led.get("by_labeller"):
        L += [f"- Offline labeller (the routing run): {led.get('note', 'no ledger')} — no LLM call.", ""]
    else:
        L += ["| labeller | model | calls | ok | input tokens | output tokens | calls / store | "
              "calls / 1,000 file events |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for b in led["by_labeller"]:
            L.append(f"| {b['labeller']} | {b['model']} | {b['calls']} | {b['ok']} | {b['input_tokens']:,} | "
                     f"{b['output_tokens']:,} | {b['calls_per_store']:.2f} | "
                     f"{b['calls_per_1000_file_events']:.1f} |")
        L += [""]
    co = res.get("cost")
    if co and co.get("available"):
        L += ["", f"Labelling calls counted in `storetopics.label_ledger` with the **{co['labeller']}**, the "
                  f"{co['stores']} of the routing stores built again in their own table, then changed (real counts: every "
                  f"call went through the SDK to the server, {co['server_requests']} requests seen):", "",
              "| phase | file events | clusters after | calls | ok | input tokens | output tokens | calls / 1,000 "
              "file events | tokens / 1,000 file events | backfill s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for ph in co["phases"]:
            L.append(f"| {ph['phase']} | {ph['file_events']:,} | {ph['clusters']} | {ph['calls']} | {ph['ok']} | "
                     f"{ph['input_tokens']:,} | {ph['output_tokens']:,} | "
                     f"{ph['calls_per_1000_file_events']:.1f} | {ph['tokens_per_1000_file_events']:,.0f} | "
                     f"{ph['backfill_seconds']:.1f} |")
        L += ["", f"Initial build: {co['calls_per_store_initial']:.1f} calls per store. The offline labeller "
                  f"(the routing table above) makes no LLM call.", ""]
        churn = next((ph for ph in co["phases"] if ph["phase"].startswith("churn")), None)
        if churn and churn["file_events"]:
            per = churn["calls_per_1000_file_events"]
            L += [f"Target: like-for-like churn (files replaced by files of the same section) costs <= 50 labelling "
                  f"calls per 1,000 file events: {per:.1f} → **{'met' if per <= 50 else 'missed'}**.", ""]
    elif co:
        L += [f"- Anthropic labeller against the local Messages API server: not measured ({co.get('note')})."]
    L += stability_section(res)
    dbc = r.get("db_clusters", {})
    L += ["- Clusters held by the database: " + (f"{dbc['stores_with_clusters']} stores have clusters."
                                                   if dbc.get("available") else f"none ({dbc.get('note')}).")]
    if q:
        L += ["", f"Clusterings of the routing stores' chunks pooled together ({q['chunks']:,} chunks sampled, "
                  f"{q['sections']} sections as ground truth), on the same all-MiniLM-L6-v2 embeddings:", "",
              "| method | topics | NMI vs sections | topic diversity (top-10 words) | notes | seconds |",
              "|---|---:|---:|---:|---|---:|"]
        for key in ("ours", "ours_chunks_alone"):
            o = q.get(key)
            if o:
                L.append(f"| {o['method']} | {o['topics']} | {o['nmi']:.3f} | {o['diversity']:.2f} | silhouette "
                         f"{o['silhouette']:.3f} | {o['seconds']:.0f} |")
        for key in ("bertopic", "bertopic_file_context"):
            b = q.get(key)
            if not b:
                continue
            if b.get("available"):
                L.append(f"| {b['method']} | {b['topics']} | {b['nmi']:.3f} (inliers only {b['nmi_inliers']:.3f}) | "
                         f"{b['diversity']:.2f} | outliers {pct(b['outlier_share'])} %, largest topic "
                         f"{pct(b['largest_topic_share'])} % | {b['seconds']:.0f} |")
            else:
                L.append(f"| {b['method']} | – | – | – | not run: {b.get('note')} | – |")
        o, b = q["ours"], q.get("bertopic", {})
        if b.get("available"):
            L += ["", f"Ours as the extension clusters (chunks in their file's context) vs BERTopic's default "
                      f"pipeline on the chunk embeddings: NMI {o['nmi']:.3f} vs {b['nmi']:.3f} (target ≥: "
                      + ("met" if o["nmi"] >= b["nmi"] else f"missed by {b['nmi'] - o['nmi']:.3f}")
                      + f"), in {o['seconds']:.0f} s vs {b['seconds']:.0f} s "
                      f"({b['seconds'] / max(o['seconds'], 1e-9):.0f}x less time; target ≥ 10x)."]
        L += [""]
    L += summaries_section(res)
    L += ["## Timings", ""]
    for part, t in res["timings"].items():
        L.append(f"- {part}: {t:.0f} s")
    L += ["", "## Not measured here", "",
          "- Ingest overhead ratios, backfill time and memory vs. store size: `make bench` (`bench/results/latest.md`).",
          "- A real LLM's labels: no LLM is reachable from this machine; the Anthropic path is exercised end to end "
          "against the local Messages API server, whose labels are made from the keywords (so label quality is "
          "not measured, call and token counts are).", ""]
    return "\n".join(L)


def write(res: dict, out_dir: Path, *, plots_too: bool = True) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / "eval.json"
    js.write_text(json.dumps(res, indent=1, default=_default) + "\n")
    import importlib.util
    images = plots(res, out_dir) if plots_too and importlib.util.find_spec("matplotlib") else []
    md = out_dir / "report.md"
    md.write_text(markdown(res, images))
    return [js, md, *(out_dir / i for i in images)]


def _default(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")
