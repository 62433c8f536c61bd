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


def _length(body: str) -> int:
    """Lines from CREATE to the END that closes the function (or to its last line for a one-statement body)."""
    lines = body.rstrip("\n").split("\n")
    ends = [i for i, line in enumerate(lines) if re.match(r"^END\b", line)]
    if ends:
        return ends[0] + 1
    return next((i for i, line in enumerate(lines) if not line.strip()), len(lines))


def test_a_function_over_85_lines_says_why_in_its_header():
    """A function of more than about 80 lines carries the reason in its header: '(About N lines: why.)'."""
    long = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text()
        starts = list(START.finditer(text))
        for m, nxt in zip(starts, starts[1:] + [None]):
            n = _length(text[m.start():nxt.start() if nxt else len(text)])
            header = "\n".join(text[:m.start()].rstrip("\n").split("\n")[-6:])
            if n > 85 and not re.search(r"About \d+ lines", header):
                long.append(f"{path.name}: {m.group(1)}, {n} lines")
    assert not long, "\n".join(long)


def _format_calls(text: str) -> list[tuple[int, int]]:
    """(offset, values after the template) of every format(...) call of SQL text, outside its string literals
    ('...', E'...', $tag$...$tag$; $$ is taken for a function body's quotes, and read through) and comments."""
    calls, open_calls, depth, i, n = [], [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "'":
            escapes = i > 0 and text[i - 1] in "eE" and not (i > 1 and (text[i - 2].isalnum() or text[i - 2] == "_"))
            j = i + 1
            while j < n:
                if escapes and text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "'":
                    if text.startswith("''", j):
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            continue
        tag = re.match(r"\$[A-Za-z_]\w*\$", text[i:i + 40])
        if tag:
            i = text.find(tag.group(0), i + len(tag.group(0))) + len(tag.group(0))
            continue
        if c == "(":
            depth += 1
            if re.search(r"(?<![\w.])format\s*$", text[max(0, i - 10):i]):
                open_calls.append([i, depth, 0])
        elif c == ")":
            if open_calls and open_calls[-1][1] == depth:
                start, _, values = open_calls.pop()
                calls.append((start, values))
            depth -= 1
        elif c == "," and open_calls and open_calls[-1][1] == depth:
            open_calls[-1][2] += 1
        i += 1
    return calls


def test_no_format_takes_more_than_a_handful_of_values():
    """Generated SQL is put together from named pieces, a few per format() (the reader's body once took 23
    positional values; the capture trigger's bodies take 6)."""
    many = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text()
        many += [f"{path.name}:{text.count(chr(10), 0, at) + 1}: {values} values"
                 for at, values in _format_calls(text) if values > 6]
    assert not many, "\n".join(many)
