"""The evaluation harness's code path on a tiny configuration, against a real Postgres.

The embedder here is the deterministic hashing stand-in (storetopics.embedding.HashEmbedder), whether or not the
model is installed: these tests check the pipeline (split, load, attach, backfill, descriptions, routers, metrics,
drift, needle, flood, report), not routing accuracy.  `make eval` measures accuracy with all-MiniLM-L6-v2.
"""
from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from lab import embedding
from lab.evaluation import cost, data, metrics, needle, pg, quality, report, residue, routers, routing


def test_wilson_and_ranks():
    lo, hi = metrics.wilson(81, 100)
    assert lo == pytest.approx(0.7222, abs=1e-3) and hi == pytest.approx(0.8748, abs=1e-3)
    assert metrics.wilson(0, 10)[0] == 0.0
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.2, 0.1], [0.1, 0.3, 0.2]])
    # ties count against the router: query 1's true store 0 ties with store 1 -> rank 2
    assert metrics.ranks(scores, np.array([0, 0, 2])).tolist() == [1, 2, 2]
    m = metrics.rank_metrics(scores, np.array([0, 0, 2]), k=2)
    assert m["top1"]["hits"] == 1 and m["recall@2"]["hits"] == 3


def test_split_is_by_hash_and_disjoint():
    corpus = data.read_sections(["math", "kde"])
    sp = data.split(corpus, held_share=0.2, store_cap=50, queries_per_section=10)
    for s in ("math", "kde"):
        stored = {p.name for p in sp.store[s]}
        held = {p.name for p in sp.held[s]}
        assert not stored & held and len(stored) == 50 and len(sp.queries[s]) == 10
        assert {p.name for p in sp.queries[s]} <= held
        assert all(data.is_held_out(n, 0.2) for n in held)
    again = data.split(corpus, held_share=0.2, store_cap=50, queries_per_section=10)
    assert [p.name for p in again.queries["math"]] == [p.name for p in sp.queries["math"]]


def test_descriptions_and_bm25():
    hand = data.section_descriptions()
    assert hand["sound"][0].startswith("Utilities to play and record sound")
    topics = {"dominant": [{"term": "audio"}, {"term": "sound"}], "distinctive": [{"term": "midi"}],
              "clusters": []}
    d = routers.describe("sound", {"store_topics": "3 files. Main terms: audio", "topics": topics}, hand)
    assert d["names"] == "sound" and d["keywords"] == "Main terms: audio, sound. Distinctive: midi."
    assert d["clusters"] is None  # no clusters: reported as not available, never faked
    topics["clusters"] = [{"label": "midi sequencers", "share": 0.4, "keywords": ["midi", "sequencer"]}]
    assert routers.describe("sound", {"topics": topics}, hand)["clusters"] == \
        "Topics: midi sequencers (40%): midi, sequencer."
    s = routers.bm25_scores(["a midi sequencer for audio"], ["audio midi sound", "chess game board"])
    assert s[0, 0] > s[0, 1] == 0


def test_embedding_cache_roundtrip(tmp_path):
    calls = []

    def enc(texts):
        calls.append(list(texts))
        return embedding.HashEmbedder().encode(texts)

    e = embedding.Embedder("test-model", enc, cache_dir=tmp_path)
    a = e(["alpha beta", "gamma", "alpha beta"])
    assert a.shape == (3, embedding.DIM) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5) and np.allclose(a[0], a[2])
    assert calls == [["alpha beta", "gamma"]]
    b = embedding.Embedder("test-model", enc, cache_dir=tmp_path)(["gamma", "delta"])  # a new process's view
    assert calls[-1] == ["delta"] and np.allclose(b[0], a[1])
    q = embedding.to_int8(a)
    assert q.dtype == np.int8 and np.all(np.sum(embedding.from_int8(q) * a, axis=1) > 0.99)


def test_harness_end_to_end(make_db, tmp_path, monkeypatch):
    monkeypatch.setattr(pg, "ATTACH_SETTINGS", {"k_min": 2, "k_max": 4})  # a small K search: speed, not accuracy
    dsn = make_db()
    emb = embedding.HashEmbedder()
    cfg = routing.RoutingConfig(sections=("math", "games", "kde"), store_cap=25, queries_per_section=10,
                                drift_store="games", drift_from="fonts", lengths=(5,))
    res, pooled = routing.run(dsn, cfg, emb, log=lambda *a: None)
    assert res["queries"] == 30 and set(res["stores"]) == {"games", "kde", "math"}
    for r in ("names", "handwritten", "keywords", "hybrid"):
        e = res["before"][r]
        assert e["available"] and e["embedding"]["top1"]["n"] == 30
        lo, hi = e["embedding"]["top1"]["ci95"]
        assert 0 <= lo <= e["embedding"]["top1"]["value"] <= hi <= 1
        assert "bm25" in e
    # The hybrid router read store_topics from the database, as rendered after the backfill.
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute("SELECT store_key, store_topics FROM storetopics.stores").fetchall())
    assert res["stores"]["kde"]["descriptions"]["hybrid"] == rows["kde"]
    # the second query style (synopses, the package's name removed) beside the first, every router again
    st = res["styles"]["synopses"]
    assert res["style"] == "descriptions" and 0 < st["queries"] <= 30
    for r in ("names", "name_hybrid", "name_topics", "tfidf20", "kmeans20", "nearest_chunk", "centroid"):
        assert st["before"][r]["available"] and st["before"][r]["embedding"]["top1"]["n"] == st["queries"], r
    assert "bm25" in st["before"]["name_hybrid"] and "route" in st["before"]
    # the content references and the sections of store_topics
    assert res["before"]["kmeans20"]["embedding"]["top1"]["n"] == 30
    kde = res["stores"]["kde"]["descriptions"]
    assert kde["name_topics"] is None or kde["name_topics"].startswith("kde: Topics: ")
    assert kde["name_terms"] is None or kde["name_terms"].startswith("kde: Terms: ")
    d = res["drift"]
    assert d["files_replaced"] == 12 and d["drifted_in_queries"] == 10 and not d["dirty_after_backfill"]
    assert d["store_topics_after"] != d["store_topics_before"]
    assert d["per_router"]["names"]["drifted_in_queries"]["n"] == 10

    ncfg = needle.NeedleConfig(stores=("editors",), needle_sections=("games", "fonts"), trials_per_store=1,
                               min_store_files=1, flood_files=15, flood_section="editors",
                               max_store_files=30)
    nd = needle.run(dsn, ncfg, emb, log=lambda *a: None)
    # (restored byte for byte is measured, not asserted: in a 30-file store one needle can pass the re-fit gate)
    assert nd["subject_rate"]["n"] == 1 and nd["restored_exactly"] in (0, 1) and nd["trials"][0]["store_topics"]
    assert set(nd["flood"]) == {"names", "tokens"} and nd["flood"]["names"]["files"] == 15
    # where the needle's subject words rank among its words (the report's misses say it)
    t = nd["trials"][0]
    assert set(t["subject_ranks"]) == set(t["subject_reachable"])
    assert all(r is None or r >= 1 for r in t["subject_ranks"].values())

    # the Anthropic labeller via the local Messages API server, on one store (the drifting one)
    co = cost.run(dsn, cfg, emb, log=lambda *a: None, stores=("games",))
    if co["available"]:
        assert co["stores"] == 1 and [p["file_events"] for p in co["phases"]] == [25, 4, 24]
        assert co["total"]["calls"] == co["server_requests"] == sum(p["calls"] for p in co["phases"])

    # stability: churn in half the stores, a CLI backfill after the first round and the SQL one after the second
    sp = data.split(data.read_sections(["math", "games", "kde"]), held_share=0.2, store_cap=25,
                    queries_per_section=10)
    stab = cost.stability(dsn, "debian", sp.store, emb, log=lambda *a: None, rounds=("cli", "sql"), events=10)
    assert [r["backfill"] for r in stab["rounds"]] == ["cli", "sql"] and len(stab["touched"]) == 1
    assert all(r["file_events"] == 10 and r["untouched"] == 2 and r["touched_changed"] == 1 for r in stab["rounds"])
    assert stab["all"]["untouched_store_rounds"] == 4 and stab["rounds"][0]["example"]["store"] == stab["touched"][0]

    texts, vecs, truth, files = pooled
    q = quality.clusterings(texts, vecs, truth, files, sample=200, with_bertopic=False, log=lambda *a: None)
    assert 0 <= q["ours"]["nmi"] <= 1 and 0 <= q["ours_chunks_alone"]["nmi"] <= 1
    assert q["ours"]["method"] == quality.OURS and q["bertopic"]["available"] is False
    assert q["bertopic_file_context"]["available"] is False

    out = {"routing": res, "needle": nd, "quality": q, "cost": co, "stability": {"debian": stab}, "embedder": {"name": emb.name, **emb.stats},
           "fallback_embedder": True, "elapsed_seconds": 1.0, "timings": {"total": 1.0},
           "environment": {"started": "now", "cpus": 2, "git": "test", "sql_sha1": "x"}}
    files = report.write(out, tmp_path, plots_too=False)
    md = (tmp_path / "report.md").read_text()
    assert "hashing stand-in" in md and "| (e) hybrid store_topics |" in md
    assert "## Every family, both query styles" in md and "**Debian sections, synopses**" in md
    assert f"- **kde** ({res['stores']['kde']['files']} files" in md      # every store's store_topics printed
    assert "### Stability for prompt caches" in md, md[md.find("## Cost"):][:3000]
    assert "| Debian sections | 3 (1) | 1 × 10 | sql |" in md and "| Debian sections | 3 (1) | 2 × 10 | all |" in md
    assert json.loads((tmp_path / "eval.json").read_text())["routing"]["queries"] == 30
    assert len(files) == 2


def test_needle_found_is_a_new_subject_word():
    # found: a word of the needle's subject that store_topics shows now and did not show before
    before, after = {"haskel", "librari", "font"}, {"haskel", "librari", "font", "luatex", "lilypond", "pdf"}
    assert needle.subject_words_new(before, after, {"lilypond", "applic", "usag", "luatex"}) == ["lilypond", "luatex"]
    assert needle.subject_words_new(before, after, {"font", "haskel"}) == []      # shown before: not the needle's
    assert needle.subject_words_new(before, before, {"font"}) == []
    page = data.Package("units/units.info#Precision", "units", "14.4 Precision", "", ["a", "b"])
    assert needle.doc_subject(page) == "14.4 Precision units"


def test_a_missed_needle_says_where_its_subject_words_rank():
    t = {"subject_reachable": ["dot", "maxima"], "subject_ranks": {"dot": 11, "maxima": None}}
    assert report._reach_note(t) == (" (subject words it holds, not shown before: dot, its 11th word; "
                                     "maxima, not a word a summary may show there)")
    assert report._reach_note({"subject_reachable": ["hord", "http"]}) == \
        " (subject words it holds, not shown before: hord, http)"       # results from before the ranks
    assert report._reach_note({"subject_reachable": []}) == " (it holds no word of its subject a summary could add)"
    assert [report._ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_needle_tfidf_words():
    df = {"option": 9, "file": 10, "luatex": 0, "pdf": 2}
    counts = {"option": 5, "file": 3, "luatex": 2, "pdf": 2, "4.4.1": 7, "x": 9}
    # a word no host file holds outweighs a frequent word every file holds; numbers and one-letter lexemes never
    assert needle.top_tfidf(counts, df, 10, 2) == ["luatex", "pdf"]
    assert needle.top_tfidf(counts, df, 10, 10)[-1] == "file"        # in every file: weight 0, last
    assert needle.top_tfidf({}, df, 10, 3) == []


def test_doc_needle_plan_is_reproducible_and_spread():
    def pages(store, n, chunks=1):
        return [data.Package(f"{store}/p{i}", store, f"Page {i} of {store}", "", ["w"] * (chunks if i else 9))
                for i in range(n)]
    sources = {"lilypond": pages("lilypond", 6), "units": pages("units", 2), "ffmpeg": pages("ffmpeg", 1)}
    sources["units"].append(data.Package("units/untitled", "units", "", "", ["w"]))   # no title: no subject
    plan = needle.plan_doc_needles(("gimp", "apache"), sources, 6, 3)
    again = needle.plan_doc_needles(("gimp", "apache"), sources, 6, 3)
    for host in ("gimp", "apache"):
        names = [p.name for p in plan[host]]
        assert names == [p.name for p in again[host]] and len(set(names)) == len(names)
        # p0 of each source has 9 chunks (over the cap), ffmpeg has no other page, units/untitled no title
        assert len(names) == 6 and not any(n.endswith("/p0") or n == "units/untitled" for n in names)
        # taken in turn from each source while it has pages
        assert [p.section for p in plan[host]][:2] == ["lilypond", "units"]
    assert [p.name for p in plan["gimp"]] != [p.name for p in plan["apache"]]      # salted by host


def test_churn_plan_touches_only_half_and_keeps_files_consistent():
    files = {s: [f"{s}-{i}" for i in range(n)] for s, n in (("a", 40), ("b", 20), ("c", 30), ("d", 10))}
    touched = cost.touched_half(list(files))
    assert len(touched) == 2 and touched == cost.touched_half(list(reversed(list(files))))
    start, plan = cost.churn_plan(files, touched, rounds=4, events=30)
    assert start == cost.churn_plan(files, touched, rounds=4, events=30)[0]
    for s in files:
        if s not in touched:
            assert sorted(start[s]) == sorted(files[s])
    state = {s: dict(v) for s, v in start.items()}
    for evs in plan:
        assert len(evs) == 30 and {e[1] for e in evs} <= set(touched)
        keys = [(e[1], e[2]) for e in evs]
        assert len(keys) == len(set(keys))                      # a file touched at most once per round
        assert {e[0] for e in evs} == {"add", "delete", "replace"}
        for kind, s, key, page in evs:
            if kind == "add":
                assert key not in state[s]
                state[s][key] = page
            elif kind == "delete":
                del state[s][key]
            else:
                assert key in state[s] and state[s][key] != page
                state[s][key] = page
        for s in touched:                                       # no page stored twice, none foreign
            assert len(set(state[s].values())) == len(state[s]) and set(state[s].values()) <= set(files[s])
    assert cost._allocate(10, {"a": 30, "b": 10}) == {"a": 8, "b": 2}
    assert sum(cost._allocate(7, {"a": 1, "b": 1, "c": 1}).values()) == 7


def test_stability_shares():
    assert cost.text_change("Topics: a, b. 10 files.", "Topics: a, b. 10 files.")["changed"] is False
    ch = cost.text_change("Topics: a, b. Terms: c. 10 files.", "Topics: a, b. Terms: d. 11 files.")
    assert ch["changed"] and 0 < ch["words_changed"] < 1 and 0 < ch["prefix_kept"] < 1
    assert ch["words_new"] == pytest.approx(2 / 7)                         # "d." and "11" of 7 distinct words
    moved = cost.text_change("Terms: a, b, c.", "Terms: b, a, c.")          # reordered: changed, nothing new
    assert moved["changed"] and moved["words_changed"] > 0 and moved["words_new"] == 0
    before = {"a": "x 1", "b": "y 2", "c": "z 3", "d": "w 4", "e": "v 5"}
    after = {"a": "x 2", "b": "y 2", "c": "z 3", "d": "w 4 changed", "e": "v 5"}
    r = cost.stability_round(before, after, ["a", "b"], events=50)
    assert r["untouched"] == 3 and r["untouched_changed"] == ["d"]
    assert r["untouched_changed_share"] == pytest.approx(1 / 3)
    assert r["untouched_changed_share_per_100_events"] == pytest.approx(2 / 3)   # 50 events: twice per 100
    assert r["touched"] == 2 and r["touched_changed"] == 1
    rounds = [dict(r, backfill="cli"), dict(cost.stability_round(before, before, ["a", "b"], 100), backfill="sql")]
    s = cost.summarize_stability("t", sorted(before), ["a", "b"], rounds, 1.0)
    assert s["all"]["untouched_changed"] == 1 and s["all"]["untouched_store_rounds"] == 6
    # 1 changed store-round in 6 over 150 events: 1/6 of the stores per round, rounds of 75 events on average
    assert s["all"]["untouched_changed_share_per_100_events"] == pytest.approx((1 / 6) * 100 * 2 / 150)
    assert s["by_backfill"]["sql"]["untouched_changed"] == 0 and s["by_backfill"]["cli"]["touched_changed"] == 1


def test_residue_audit_judges_shown_words_against_the_pages():
    pages = ("Known issuesReport a bugSee also\n\nmod_proxy sets server.max-request-size and keep-alive. "
             "Available Languages: en | zh-cn\nA patch fixes the pro-\ngram's output on Jan 3, see named <#\n"
             "std-iscman-named>.")
    text = ("Topics: proxy server, value is specified. Terms: proxy bugsee request-s request-size zh-cn keep-alive "
            "responsive jan nextchapter iscman named. Distinctive: patch. 3 files.")
    got = {c: v["examples"] for c, v in residue.audit({"web": text}, {"web": pages})["classes"].items()}
    assert got["navigation"] == ["web: bugsee", "web: zh-cn", "web: nextchapter", "web: iscman"]
    # a stem no one wrote, a word of another store; "request-size" is written inside "max-request-size"
    assert got["not written"] == ["web: request-s", "web: responsive"]
    assert got["date"] == ["web: jan"]
    assert got["sentence piece"] == ["web: value is specified"]
    assert got["script"] == []
    lines = report.residue_lines(residue.audit({"web": text}, {"web": pages}))
    assert lines[0].startswith("Residue in these 1 texts") and "| navigation | 4 |" in "\n".join(lines)


def test_text_study_reshapes_sections_and_keeps_the_rest():
    from lab.evaluation import text_study as ts
    text = "Topics: text editor, syntax highlighting. Terms: emacs vim buffers lisp. Distinctive: evil, nvi. 183 files."
    d = {"tfidf150": "editors: vim emacs editor plugin", "clusters":
         "Topics: text editor (40%): editor, text, nano; syntax highlighting (20%): syntax, colors, vim."}
    t = ts.TRANSFORMS
    assert t["ident"]("editors", text, d) == text
    assert ts.section(text, "Terms") == "emacs vim buffers lisp" and ts.section(text, "Distinctive") == "evil, nvi"
    assert t["no_file_count"]("editors", text, d).endswith("Distinctive: evil, nvi.")
    assert t["no_topics"]("editors", text, d).startswith("Terms: emacs")
    assert t["terms_first"]("editors", text, d) == ("Terms: emacs vim buffers lisp. Distinctive: evil, nvi. "
                                                    "Topics: text editor, syntax highlighting. 183 files.")
    # ours and the baseline's in turn, each word once, as many words as ours
    assert ts.section(t["terms_mix_ob"]("editors", text, d), "Terms") == "emacs vim buffers editor"
    assert ts.section(t["labels_kw2"]("editors", text, d), "Topics") == "editor text, syntax colors"
    assert ts.section(t["label_plus_1"]("editors", text, d), "Topics") == "text editor nano, syntax highlighting colors"
    # the longer labels are paid for by the last terms: no longer than the text was, in the eval's estimate
    longer = text.replace("lisp.", "lisp dired org elpa folding keys undo cursor ctags regexp paste.")
    plus2 = t["label_plus_2"]("editors", longer, d)
    assert ts.section(plus2, "Topics") == "text editor (nano), syntax highlighting (colors vim)"
    assert routers.tokens_estimate(plus2) <= routers.tokens_estimate(longer)
    assert ts.section(longer, "Terms").startswith(ts.section(plus2, "Terms")) and len(ts.section(plus2, "Terms")) < 80


def test_forms_study_reads_words_as_runs_and_their_parts():
    from lab.evaluation import forms_study
    assert list(forms_study.words_of("The server's max-request-size, 'quoted' x 42")) == [
        "the", "server's", "max-request-size", "max", "request", "size", "quoted"]
