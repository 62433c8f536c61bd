"""Which word should a store show for a stem?  `python -m lab.evaluation.forms_study --dsn DSN [MODE ...]`

The words shown for stems were learnt once per owner, from the first store that needed each: another store of the
owner may never write that word ("organize" in an anatomy store that says "organ").  This replays, with
lab.evaluation.text_study (no storetopics needed; DSN is any Postgres, for `to_tsvector('english', ...)`), what
`make eval`'s 36 cells would be had the words of each Terms and Distinctive section come from the store's own pages
(the pages `make eval` loads into it), on the texts of bench/results/eval.json (or --eval: the results of a run
before store_words, e.g. `git show fec58e2:bench/results/eval.json`):
  every        every shown word replaced by the word the store's pages write most for its stem;
  unwritten    only a word the store's pages never write;
  first-K      only a word none of the first K pages (by name) that hold its stem writes, by the word those K
               pages write most (K 1, 5, 20: what a look at K files would find).
What it measured is in bench/README.md ("A store's stems in words it writes").
"""
from __future__ import annotations

import argparse
import collections
import functools
import re
from pathlib import Path

import psycopg

from . import data, docs, routing, text_study, wordnet

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def words_of(text: str):
    """The words as storetopics' learner reads them: runs of letters, quotes and hyphens, and their hyphen parts
    (not the runs of parts of a word of three or more, "request-size" of "max-request-size")."""
    for r in re.split(r"[^A-Za-z'-]+", text.lower()):
        r = r.strip("'-")
        if 2 <= len(r) <= 40:
            yield r
            if "-" in r:
                yield from (p.strip("'") for p in r.split("-") if len(p.strip("'")) >= 2)


def store_pages() -> dict[str, list]:
    """Each store's stored pages, as `make eval` loads them (by name)."""
    cfg = routing.RoutingConfig()
    out = {}
    for corpus, stores, cap in ((data.read_sections(list(cfg.sections)), cfg.sections, cfg.store_cap),
                                (wordnet.read(), wordnet.STORES, cfg.store_cap),
                                (docs.read(docs.STORES, held_share=cfg.held_share), docs.STORES, None)):
        sp = data.split(corpus, held_share=cfg.held_share, store_cap=cap, queries_per_section=cfg.queries_per_section)
        out.update({s: sorted(sp.store[s], key=lambda p: p.name) for s in stores})
    return out


def transform(dsn: str, mode: str, changed: set):
    """The transform of `mode`; each (store, shown word, new word) it makes is added to `changed`."""
    pages = store_pages()
    page_words = {s: [collections.Counter(words_of(p.text)) for p in ps] for s, ps in pages.items()}
    vocab = sorted({w for c in page_words.values() for pc in c for w in pc})
    with psycopg.connect(dsn) as conn:
        lex = {w: (ls[0] if len(ls) == 1 else None) for w, ls in conn.execute(
            "SELECT w, tsvector_to_array(to_tsvector('english', w)) FROM unnest(%s::text[]) w", (vocab,))}
    k = int(mode.split("-")[1]) if mode.startswith("first-") else None

    @functools.cache
    def forms(store: str, lexeme: str) -> tuple[collections.Counter, collections.Counter]:
        """The store's counts of the stem's words: in all its pages, and in the first k that hold it."""
        every, first, held = collections.Counter(), collections.Counter(), 0
        for pc in page_words[store]:
            mine = {w: n for w, n in pc.items() if lex.get(w) == lexeme}
            every.update(mine)
            if mine and k is not None and held < k:
                first.update(mine)
                held += 1
        return every, first

    def sub(store: str, word: str) -> str:
        lexeme = lex.get(word.lower()) if word.islower() else None
        if lexeme is None:
            return word
        every, first = forms(store, lexeme)
        pool = every if mode in ("every", "unwritten") else first
        if not pool or (mode != "every" and pool.get(word, 0) > 0):
            return word
        new = sorted(pool.items(), key=lambda x: (-x[1], len(x[0]), x[0]))[0][0]
        if new != word:
            changed.add((store, word, new))
        return new

    def fn(store: str, text: str, d: dict) -> str:
        for sec in ("Terms", "Distinctive"):
            body = text_study.section(text, sec)
            if body:
                text = text.replace(f"{sec}: {body}.", f"{sec}: " + _WORD.sub(lambda m: sub(store, m.group(0)), body)
                                    + ".")
        return text
    return fn


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", required=True, help="any Postgres (only to_tsvector('english', ...) is used)")
    ap.add_argument("--eval", type=Path, default=text_study.RESULTS / "eval.json",
                    help="make eval's results to start from (default: the last run's)")
    ap.add_argument("modes", nargs="*", default=["unwritten", "first-20"], metavar="MODE",
                    help="every, unwritten, first-K")
    args = ap.parse_args(argv)
    for mode in args.modes:
        changed: set = set()
        rows = text_study.cells(transform(args.dsn, mode, changed), path=args.eval)
        print(f"{mode:10} {len({(s, w) for s, w, _ in changed})} (store, word) pairs changed; "
              f"{text_study.totals(rows)}")


if __name__ == "__main__":
    main()
