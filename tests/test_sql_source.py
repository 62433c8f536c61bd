"""The SQL sources themselves (sql/idempotent), read as text: results pass between functions as return values, not
through temp tables (issue 32)."""
from __future__ import annotations

import re
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent.parent / "sql" / "idempotent"
START = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION storetopics\.(\w+)\(", re.M)


def functions() -> list[tuple[str, str, str]]:
    """(file, function name, text from its CREATE to the next function's, without comments) for every function of
    sql/idempotent."""
    out = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())
        starts = list(START.finditer(text))
        for m, nxt in zip(starts, starts[1:] + [None]):
            out.append((path.name, m.group(1), text[m.start():nxt.start() if nxt else len(text)]))
    return out


def test_a_temp_table_is_read_only_by_the_function_that_makes_it():
    """A pg_temp.storetopics_* table is made and read inside one function: no result is parked in a temp table for
    another function to read (storetopics_probe, in 010, is a temp view and function, also made and dropped inside
    one function)."""
    shared = []
    for file, name, body in functions():
        made = set(re.findall(r"CREATE TEMP (?:TABLE|VIEW) (storetopics_\w+)", body))
        read = set(re.findall(r"pg_temp\.(storetopics_\w+)", body))
        shared += [f"{file}: {name} reads pg_temp.{t}, made elsewhere" for t in sorted(read - made)
                   if t != "storetopics_probe"]
    assert not shared, "\n".join(shared)

