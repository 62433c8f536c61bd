"""What ingestion left in the document stores' summaries: issue 29's classes of residue, judged against the pages.

audit(texts, pages) reads each store's rendered `store_topics` and the text of the pages loaded into that store, and
lists the shown words (and topics) of each class:

* navigation: previous/next links, alone or glued ("nextchapter"); a word the store's pages write only glued to the
  next one by HTML-to-text, a word run into a capitalised one ("Report a bugSee also" shows "bugsee"), or
  only inside a link's target ("<#std-iscman-named>" shows "iscman"); a language selector's locale code ("zh-cn");
* not written: a word the store's pages never write, whole or as a part between hyphens or other punctuation: the
  half of a word a line break hyphenated ("tions"), a stem no one wrote ("request-s" from "max-request-size");
* script: letters of another script than most of the store's words;
* date: month and weekday names and their abbreviations;
* sentence piece: a topic with an auxiliary verb, a determiner as its second of three or more words, or a function
  word last ("value is specified", "cover the new").

The judge is this module's, not the extension's: it reads the pages, which the extension does not keep.
"""
from __future__ import annotations

import re
from collections import Counter

CLASSES = ("navigation", "not written", "script", "date", "sentence piece")

MONTHS = set("jan feb mar apr may jun jul aug sep sept oct nov dec january february march april june july august "
             "september october november december mon tue tues wed thu thur thurs fri sat sun monday tuesday "
             "wednesday thursday friday saturday sunday".split())
AUXILIARY = {"is", "are", "was", "were", "be", "been", "has", "have", "can", "may", "must", "should", "will"}
DETERMINER = {"the", "a", "an", "this", "its", "their", "any"}
FUNCTION_LAST = {"the", "a", "an", "of", "to", "for", "with", "and", "or", "in", "on", "by", "from", "at", "as",
                 "into", "is", "are"}
LOCALE = re.compile(r"^(zh|pt|en|es|fr|de|ja|ko|ru|it|nl|sv|pl|tr|da|fi|nb|nn|cs|hu|ro|uk|el|he|ar|id|vi|th)"
                    r"-[a-z]{2}$")


def _sections(text: str) -> tuple[list[str], list[str]]:
    """The topics and the words (terms and distinctive) of a rendered text."""
    topics = re.search(r"Topics: (.*?)\. (?:Terms|Distinctive|\d)", text)
    words = []
    for part in ("Terms", "Distinctive"):
        m = re.search(part + r": (.*?)\. (?:Distinctive|\d)", text)
        if m:
            words += [w for w in re.split(r"[,\s]+", m.group(1)) if w]
    return ([t.strip() for t in topics.group(1).split(", ")] if topics else []), words


def _script(w: str) -> str:
    if re.fullmatch(r"[\x01-\x7f\u00c0-\u024f]*", w):
        return "latin"
    for name, rx in (("cyrillic", r"[\u0400-\u04ff]"), ("greek", r"[\u0370-\u03ff]"),
                     ("cjk", r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")):
        if re.search(rx, w):
            return name
    return "other"


LINK = re.compile(r"<(?:#|[A-Za-z][\w+.-]*:)\s*([^<>\s]+)>")


def written_forms(pages_text: str) -> tuple[Counter, Counter, Counter]:
    """(words the text writes outside links' targets, lower-cased: runs of letters with inner hyphens or apostrophes,
    their parts and runs of parts; words written glued, a lower-case or capitals word run into a capitalised one
    ("bugSee", "FILEUse"), lower-cased; the words of links' targets ("<#std-iscman-named>"), counted as the first)."""
    linked = _runs(" ".join(LINK.findall(pages_text)), Counter())
    whole, glued = Counter(), Counter()
    _runs(LINK.sub(" ", pages_text), whole, glued)
    return whole, glued, linked


def _runs(text: str, whole: Counter, glued: Counter | None = None) -> Counter:
    for word in re.findall(r"[^\W\d_]+(?:['’-][^\W\d_]+)*", text):
        if glued is not None and re.fullmatch(r"[a-z]{2,}[A-Z][a-z]+|[A-Z]{2,}[A-Z][a-z]{2,}", word):
            glued[word.lower()] += 1
            continue
        parts = re.split(r"([-'’])", word.lower())
        words, seps = parts[::2], parts[1::2]
        for i in range(len(words)):
            run = words[i]
            whole[run] += 1
            for j in range(i + 1, len(words)):
                run += seps[j - 1] + words[j]
                whole[run] += 1
    return whole


NAVIGATION = re.compile(r"^(prev|previous|next|toc|sitemap|breadcrumb|navbar|permalink)$"
                        r"|^(prev|previous|next)[a-z]{3,}$|^[a-z]{3,}(prev|previous|next)[a-z]*$")


def audit(texts: dict[str, str], pages: dict[str, str]) -> dict:
    """texts: store -> its rendered store_topics; pages: store -> the text of the pages loaded into it."""
    found = {c: [] for c in CLASSES}
    for store, text in texts.items():
        if not text or store not in pages:
            continue
        topics, words = _sections(text)
        whole, glued, linked = written_forms(pages[store])
        scripts = Counter(_script(w) for w in words)
        main = scripts.most_common(1)[0][0] if scripts else "latin"
        for w in words:
            low = w.lower()
            if (NAVIGATION.match(low) and not low.startswith(("prevent", "preview", "prevail", "prevalen"))
                    or LOCALE.match(low) or (glued[low] or linked[low]) and not whole[low]):
                found["navigation"].append(f"{store}: {w}")
            elif not whole[low] and _script(w) == "latin":
                found["not written"].append(f"{store}: {w}")
            if _script(w) != main:
                found["script"].append(f"{store}: {w}")
            if low in MONTHS:
                found["date"].append(f"{store}: {w}")
        for t in topics:
            ws = t.lower().split()
            if (AUXILIARY & set(ws) or len(ws) >= 3 and ws[1] in DETERMINER or ws and ws[-1] in FUNCTION_LAST
                    or any(NAVIGATION.match(w) for w in ws)):
                found["sentence piece"].append(f"{store}: {t}")
    return {"stores": len(texts), "classes": {c: {"count": len(v), "examples": v} for c, v in found.items()}}
