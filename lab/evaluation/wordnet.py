"""The second corpus family: WordNet 3.0's noun synsets, stores by lexicographer file (noun.animal, noun.food, ...).

Real text that nobody on the project wrote, of another kind than Debian's package descriptions: Princeton's
definitions ("a member of the genus Canis (probably descended from the common wolf) that has been domesticated by
man since prehistoric times") with their lemmas and usage examples.  One store per lexicographer file, one file per
synset, one chunk per file (the lemmas, the gloss and its examples).  Held-out synsets (by hash of their offset,
as the Debian split is by hash of the package name) are the queries.  The text comes from Debian's `wordnet-base`
package (/usr/share/wordnet/data.noun), under the WordNet 3.0 licence (permission to use, copy, modify and
distribute, with the copyright notice: "WordNet 3.0 Copyright 2006 by Princeton University"); `make eval` installs
the package when it is missing.  It was not looked at while the summaries were tuned.
"""
from __future__ import annotations

import os
from pathlib import Path

from .data import Package

DATA_NOUN = Path(os.environ.get("STORETOPICS_WORDNET", "/usr/share/wordnet/data.noun"))
# WordNet's lexicographer files, numbered as in lexnames(5WN)
LEXNAMES = ("adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
            "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling",
            "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object", "noun.person",
            "noun.phenomenon", "noun.plant", "noun.possession", "noun.process", "noun.quantity", "noun.relation",
            "noun.shape", "noun.state", "noun.substance", "noun.time")
STORES = ("act", "animal", "artifact", "body", "communication", "food", "location", "person", "plant", "substance")


def available(path: Path = DATA_NOUN) -> bool:
    return path.exists()


def synset_text(line: str) -> tuple[str, str, str, str] | None:
    """(offset, lexname, lemmas, gloss) of one data.noun line; None for the licence header."""
    if line.startswith("  "):
        return None
    head, _, gloss = line.partition(" | ")
    f = head.split(" ")
    offset, lex, n = f[0], LEXNAMES[int(f[1])], int(f[3], 16)
    lemmas = [f[4 + 2 * i].replace("_", " ") for i in range(n)]
    return offset, lex, ", ".join(dict.fromkeys(w.split("(")[0] for w in lemmas)), gloss.strip()


def read(stores=STORES, path: Path = DATA_NOUN) -> dict[str, list[Package]]:
    """store -> its synsets as packages (name = the synset's offset, one chunk: "lemmas: gloss")."""
    out: dict[str, list[Package]] = {s: [] for s in stores}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            rec = synset_text(line)
            if rec is None:
                continue
            offset, lex, lemmas, gloss = rec
            store = lex.split(".", 1)[1]
            if store in out:
                text = f"{lemmas}: {gloss}"
                out[store].append(Package(f"wn{offset}", store, lemmas, gloss, [text]))
    return out
