"""What each router sees of a store (one description per store) and how it picks: nearest embedding or BM25.

Descriptions compared (each router sees only this text, nothing of the store's contents):
  names        (a) the store's name, e.g. "sound"
  handwritten  (b) Debian's own section description (aptitude-common): `handwritten_short` is the one-line title,
               `handwritten` the title plus the long text
  keywords     (c) our keyword summary: the terms of topics->'dominant' and topics->'distinctive'
  clusters     (d) our cluster summary: topics->'clusters' labels (with shares and keywords); None while the
               database has no clusters (then reported as not available)
  hybrid       (e) store_topics exactly as the database renders it
  name_hybrid  the store's name and store_topics together, as a router sees a tool's name and description
  tfidf<N>     the strongest simple baseline: the store's name plus its top N words by TF-IDF with the stores as
               the documents (sklearn TfidfVectorizer(stop_words="english") fitted on one concatenated text per
               store; the N highest-weighted words of the store's row), N in BASELINE_WORDS
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

try:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as _STOP
except ImportError:  # pragma: no cover
    _STOP = frozenset()

BASELINE_WORDS = (20, 60, 100, 150)
BASELINES = tuple(f"tfidf{n}" for n in BASELINE_WORDS)
ROUTERS = ("names", "handwritten_short", "handwritten", "keywords", "clusters", "hybrid", "name_hybrid", "name_topics",
           "name_terms", *BASELINES)
LABELS = {
    "names": "(a) store name",
    "handwritten_short": "(b) hand-written, short",
    "handwritten": "(b) hand-written, short + long",
    "keywords": "(c) keyword summary",
    "clusters": "(d) cluster summary",
    "hybrid": "(e) hybrid store_topics",
    "name_hybrid": "(e') name + store_topics",
    "name_topics": "name + the Topics section of store_topics",
    "name_terms": "name + the Terms section of store_topics",
    **{f"tfidf{n}": f"baseline: name + top-{n} TF-IDF words" for n in BASELINE_WORDS},
    "centroid": "reference: store centroid (sees the contents)",
    "route": "storetopics.route(): the stores' clusters (sees the contents)",
    "route_text": "storetopics.route_text(): the stores' term counts (sees the contents)",
    "kmeans20": "reference: nearest of 20 KMeans centroids per store (sees the contents)",
    "nearest_chunk": "reference: store of the nearest chunk (sees the contents)",
}


_SECTION = re.compile(r"(?:^|(?<=\.\s))(Topics|Terms|Distinctive):\s")


def section_of(store_topics: str | None, name: str) -> str | None:
    """One section of a rendered store_topics ("Topics: a, b. Terms: c d. Distinctive: e. N files."), with its
    heading: "Terms: c d."; None when the summary has no such section."""
    if not store_topics:
        return None
    marks = list(_SECTION.finditer(store_topics))
    for i, m in enumerate(marks):
        if m.group(1) == name:
            end = marks[i + 1].start() if i + 1 < len(marks) else len(store_topics)
            body = store_topics[m.start():end].strip()
            if i + 1 == len(marks):     # the last section runs into the "N files." tail
                body = re.sub(r"\s+[\d.,]+[kKmM]?\s+files?\.$", "", body)
            return body
    return None


def keyword_summary(topics: dict | None) -> str | None:
    """(c): the dominant and distinctive terms of topics, as a plain list."""
    if not topics:
        return None
    dom = [d["term"] for d in topics.get("dominant") or []]
    dis = [d["term"] for d in topics.get("distinctive") or [] if d["term"] not in dom]
    if not dom and not dis:
        return None
    return "Main terms: " + ", ".join(dom) + (". Distinctive: " + ", ".join(dis) if dis else "") + "."


def cluster_summary(topics: dict | None, budget: int = 200) -> str | None:
    """(d): the clusters' labels with their shares and keywords, largest first, within `budget` tokens (store_topics'
    own budget); None when there are no clusters."""
    clusters = sorted((topics or {}).get("clusters") or [], key=lambda c: -(c.get("share") or 0))
    parts, used = [], 0
    for c in clusters:
        label = (c.get("label") or "").strip()
        kws = [k for k in c.get("keywords") or [] if k]
        if not label and not kws:
            continue
        share = c.get("share")
        head = f"{label} ({round(100 * share)}%)" if label and isinstance(share, (int, float)) else label
        part = head + (": " + ", ".join(kws[:5]) if kws else "")
        if parts and used + tokens_estimate(part) > budget:
            break  # a summary, not a dump: the largest clusters within the same budget as store_topics
        parts.append(part)
        used += tokens_estimate(part)
    return "Topics: " + "; ".join(parts) + "." if parts else None


def tfidf_words(store_texts: dict[str, str], n: int = max(BASELINE_WORDS)) -> dict[str, list[str]]:
    """The baseline's words: per store, its top n words by TF-IDF with the stores as the documents (sklearn's
    TfidfVectorizer(stop_words="english") on one concatenated text per store), best first."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    stores = sorted(store_texts)
    vec = TfidfVectorizer(stop_words="english")
    m = vec.fit_transform([store_texts[s] for s in stores])
    vocab = np.array(vec.get_feature_names_out())
    out = {}
    for i, s in enumerate(stores):
        row = m[i].toarray().ravel()
        order = np.lexsort((vocab, -row))        # by weight, ties by word: deterministic
        out[s] = [str(vocab[j]) for j in order[:n] if row[j] > 0]
    return out


def describe(store: str, row: dict | None, handwritten: dict[str, tuple[str, str]],
             baseline: dict[str, list[str]] | None = None) -> dict[str, str | None]:
    """Every router's view of one store.  `row` is the store's row of storetopics.stores (store_topics, topics);
    `baseline` the store's TF-IDF words (tfidf_words)."""
    short, long = handwritten.get(store, ("", ""))
    topics = (row or {}).get("topics")
    hybrid = (row or {}).get("store_topics")
    out = {
        "names": store,
        "handwritten_short": short or None,
        "handwritten": (short + ". " + long).strip() if short else None,
        "keywords": keyword_summary(topics),
        "clusters": cluster_summary(topics),
        "hybrid": hybrid,
        "name_hybrid": f"{store}: {hybrid}" if hybrid else None,
    }
    for key, sec in (("name_topics", "Topics"), ("name_terms", "Terms")):
        part = section_of(hybrid, sec)
        out[key] = f"{store}: {part}" if part else None
    for n in BASELINE_WORDS:
        out[f"tfidf{n}"] = f"{store}: " + " ".join(baseline[:n]) if baseline else None
    return out


def truncate_words(text: str | None, n: int | None) -> str | None:
    if text is None or n is None:
        return text
    words = text.split()
    return " ".join(words[:n])


def tokens_estimate(text: str | None) -> int:
    """A rough token count (words and punctuation marks), for the 'summary length' axis."""
    return len(re.findall(r"\w+|[^\w\s]", text or ""))


# ------------------------------------------------------------------------------------------------------------
# Routers
# ------------------------------------------------------------------------------------------------------------
def embedding_scores(query_vecs: np.ndarray, desc_vecs: np.ndarray) -> np.ndarray:
    """Cosine similarity (vectors are unit length): queries x stores."""
    return query_vecs @ desc_vecs.T


_WORD = re.compile(r"[a-z0-9][a-z0-9+#.-]*[a-z0-9+#]|[a-z0-9]")


def bm25_tokens(text: str) -> list[str]:
    out = []
    for w in _WORD.findall((text or "").lower()):
        if w in _STOP or len(w) < 2:
            continue
        if len(w) > 4 and w.endswith("ies"):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


class BM25:
    """Okapi BM25 (k1 = 1.2, b = 0.75) over the store descriptions; the query's terms are the query text's words."""

    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tf = [Counter(bm25_tokens(d)) for d in docs]
        self.len = np.array([sum(c.values()) for c in self.tf], dtype=float)
        self.avg = float(self.len.mean()) if len(self.len) and self.len.mean() > 0 else 1.0
        df = Counter(t for c in self.tf for t in c)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> np.ndarray:
        q = Counter(bm25_tokens(query))
        s = np.zeros(len(self.tf))
        for j, tf in enumerate(self.tf):
            norm = self.k1 * (1 - self.b + self.b * self.len[j] / self.avg)
            for t in q:
                f = tf.get(t)
                if f:
                    s[j] += self.idf[t] * f * (self.k1 + 1) / (f + norm)
        return s


def bm25_scores(queries: list[str], docs: list[str]) -> np.ndarray:
    bm = BM25(docs)
    return np.vstack([bm.scores(q) for q in queries]) if queries else np.zeros((0, len(docs)))
