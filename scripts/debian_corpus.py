#!/usr/bin/env python3
"""Build a compact extract of Debian's own package descriptions.

The corpus is real text nobody on this project wrote: the English package
descriptions of Debian bookworm ``main`` (Packages + Translation-en), as
published in the Debian archive.  It is used by ``make demo``, the benchmarks
and the routing evaluation.

Subcommands
-----------
fetch   download the bookworm main Packages and Translation-en lists into a
        PRIVATE apt state directory (the system's /etc/apt and
        /var/lib/apt/lists are left alone), decompress them into --raw-dir,
        and try to download aptitude-common for its hand-written section
        descriptions.
build   parse the raw lists in --raw-dir and write
        <out>/descriptions.jsonl.gz, <out>/section-descriptions (if fetched)
        and <out>/README.md.
stats   print the sections of <out>/descriptions.jsonl.gz with their counts.
all     fetch + build, with a temporary raw dir that is removed afterwards.

Regenerate the shipped files with::

    python3 scripts/debian_corpus.py all

Only the Python standard library is used, plus apt-get, apt-helper and
dpkg-deb from the machine (any Debian-based system with network access to a
Debian mirror).  The mirror URI is derived from the machine's own apt
sources; no host name is written anywhere.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

SUITE = "bookworm"
COMPONENT = "main"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
APT_HELPER = "/usr/lib/apt/apt-helper"
SECTION_DESC_PATH = "usr/share/aptitude/section-descriptions"

MIN_LONG_CHARS = 80      # drop packages with a shorter long description
MIN_SECTION_SIZE = 150   # keep sections with at least this many packages
MAX_SECTION_SIZE = 1500  # cap per section (deterministic, by sha1 of name)
DROP_SUFFIXES = ("-dbgsym", "-dbg")  # debug-symbol families: never chosen

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data" / "debian"
DEFAULT_RAW = Path(tempfile.gettempdir()) / "storetopics-debian-raw"

PACKAGES_RAW = "Packages"
TRANSLATION_RAW = "Translation-en"
SECTION_DESC_RAW = "section-descriptions"
OUTPUT_NAME = "descriptions.jsonl.gz"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# fetch
# --------------------------------------------------------------------------

def _is_security(uri: str) -> bool:
    return "security" in uri.lower()


def _debian_uri_candidates(etc_apt: Path = Path("/etc/apt")) -> list[str]:
    """URIs of the machine's apt sources, in file order."""
    uris: list[str] = []
    # deb822 .sources files
    for f in sorted(etc_apt.glob("sources.list.d/*.sources")):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            m = re.match(r"^URIs:\s*(.*)$", line, re.IGNORECASE)
            if m:
                uris.extend(m.group(1).split())
    # one-line-style sources.list and *.list
    list_files = [etc_apt / "sources.list"] + sorted(etc_apt.glob("sources.list.d/*.list"))
    for f in list_files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("deb ") and not line.startswith("deb\t"):
                continue
            rest = line[3:].strip()
            if rest.startswith("["):
                end = rest.find("]")
                if end < 0:
                    continue
                rest = rest[end + 1:].strip()
            parts = rest.split()
            if len(parts) >= 2:
                uris.append(parts[0])
    return uris


def find_debian_uri() -> str:
    for uri in _debian_uri_candidates():
        u = uri.rstrip("/")
        if u.endswith("/debian") and not _is_security(u):
            return u
    raise SystemExit(
        "no Debian archive URI (ending in /debian, not security) found in "
        "/etc/apt/sources.list{,.d/*.list,.d/*.sources}"
    )


def _apt_opts(state: Path) -> list[str]:
    """apt options that confine apt to the private state directory."""
    return [
        "-o", f"Dir::Etc::SourceList={state / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={state / 'lists'}",
        "-o", f"Dir::Cache={state / 'cache'}",
        "-o", f"Dir::Cache::Archives={state / 'archives'}",
        "-o", "Acquire::Languages=en",
        "-o", "APT::Sandbox::User=root",
    ]


def _cat_file(path: str) -> bytes:
    """Decompress an apt list file (.lz4, .gz, .xz, plain) with apt-helper."""
    return subprocess.run([APT_HELPER, "cat-file", path], check=True,
                          stdout=subprocess.PIPE).stdout


def _find_list(lists: Path, pattern: str) -> str:
    hits = sorted(p for p in glob.glob(str(lists / pattern))
                  if not p.endswith((".diff", "_Index")))
    if not hits:
        raise SystemExit(f"apt update produced no list matching {pattern} in {lists}")
    return hits[0]


def fetch(raw_dir: Path) -> None:
    raw_dir.mkdir(parents=True, exist_ok=True)
    uri = find_debian_uri()
    log(f"fetch: using the machine's Debian archive URI ({len(uri)} chars, from /etc/apt)")
    with tempfile.TemporaryDirectory(prefix="debian-corpus-apt-") as tmp:
        state = Path(tmp)
        for d in ("lists/partial", "cache", "archives/partial", "download"):
            (state / d).mkdir(parents=True, exist_ok=True)
        (state / "sources.list").write_text(
            f"deb [signed-by={KEYRING}] {uri} {SUITE} {COMPONENT}\n")
        opts = _apt_opts(state)
        subprocess.run(["apt-get", *opts, "-qq", "update"], check=True)

        lists = state / "lists"
        pk = _find_list(lists, f"*_dists_{SUITE}_{COMPONENT}_binary-*_Packages*")
        tr = _find_list(lists, f"*_dists_{SUITE}_{COMPONENT}_i18n_Translation-en*")
        (raw_dir / PACKAGES_RAW).write_bytes(_cat_file(pk))
        (raw_dir / TRANSLATION_RAW).write_bytes(_cat_file(tr))
        log(f"fetch: Packages {os.path.getsize(raw_dir / PACKAGES_RAW):,} bytes, "
            f"Translation-en {os.path.getsize(raw_dir / TRANSLATION_RAW):,} bytes")

        # Debian's hand-written section descriptions, shipped by aptitude-common.
        sd_target = raw_dir / SECTION_DESC_RAW
        if sd_target.exists():
            sd_target.unlink()
        try:
            dl = state / "download"
            subprocess.run(["apt-get", *opts, "-qq", "download", "aptitude-common"],
                           check=True, cwd=dl)
            debs = sorted(dl.glob("aptitude-common_*.deb"))
            if not debs:
                raise RuntimeError("apt-get download produced no .deb")
            x = state / "extract"
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(x)], check=True)
            src = x / SECTION_DESC_PATH
            if not src.is_file():
                raise RuntimeError(f"{SECTION_DESC_PATH} not in {debs[0].name}")
            shutil.copyfile(src, sd_target)
            log(f"fetch: section-descriptions extracted from {debs[0].name}")
        except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
            log(f"fetch: WARNING: could not extract section descriptions: {e}")


# --------------------------------------------------------------------------
# parse
# --------------------------------------------------------------------------

def iter_stanzas(text: str):
    """Yield deb822 stanzas as dicts (continuation lines kept with '\\n')."""
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, None
            continue
        if line[0] in " \t":
            if key is not None:
                fields[key] += "\n" + line
            continue
        k, sep, v = line.partition(":")
        if not sep:
            continue
        key = k.strip()
        fields[key] = v.strip()
    if fields:
        yield fields


_BULLET = re.compile(r"^([*+\-o\u2022]|\d+[.)])\s")


def long_to_text(lines: list[str]) -> str:
    """Debian long description lines (each starting with a space) -> text.

    " ." separates paragraphs; within a paragraph, ordinary lines are joined
    with spaces; bullet lines (and other indented lines) start a new line,
    indented continuation lines of a bullet are joined onto it.
    """
    paragraphs: list[list[str]] = [[]]
    in_bullet = False
    for raw in lines:
        s = raw[1:] if raw[:1] in (" ", "\t") else raw
        if s.strip() == ".":
            if paragraphs[-1]:
                paragraphs.append([])
            in_bullet = False
            continue
        stripped = s.strip()
        if not stripped:
            continue
        cur = paragraphs[-1]
        indented = s[:1] in (" ", "\t")
        if _BULLET.match(stripped):
            cur.append(stripped)
            in_bullet = True
        elif indented and in_bullet and cur:
            cur[-1] += " " + stripped
        elif indented:
            cur.append(stripped)
            in_bullet = False
        elif cur and not in_bullet:
            cur[-1] += " " + stripped
        else:
            cur.append(stripped)
            in_bullet = False
    return "\n\n".join("\n".join(p) for p in paragraphs if p)


def parse_translations(text: str) -> dict[str, tuple[str, str]]:
    """Description-md5 -> (short, long plain text)."""
    out: dict[str, tuple[str, str]] = {}
    for st in iter_stanzas(text):
        md5 = st.get("Description-md5")
        desc = st.get("Description-en")
        if not md5 or desc is None:
            continue
        first, *rest = desc.split("\n")
        out[md5] = (first.strip(), long_to_text(rest))
    return out


def parse_packages(text: str) -> list[dict[str, str]]:
    pkgs: dict[str, dict[str, str]] = {}
    for st in iter_stanzas(text):
        name = st.get("Package")
        if not name or name in pkgs:
            continue
        source = st.get("Source", name).split()[0] if st.get("Source") else name
        section = st.get("Section", "unknown")
        section = section.rsplit("/", 1)[-1]
        pkgs[name] = {
            "package": name,
            "source": source,
            "section": section,
            "md5": st.get("Description-md5", ""),
        }
    return list(pkgs.values())


def _name_hash(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8")).hexdigest()


def select_records(packages: list[dict[str, str]],
                   translations: dict[str, tuple[str, str]],
                   min_section: int = MIN_SECTION_SIZE,
                   max_section: int = MAX_SECTION_SIZE):
    """Join, dedupe per source, filter, cap. Returns (records, stats)."""
    stats: Counter = Counter()
    by_source: dict[str, list[dict[str, str]]] = defaultdict(list)
    for p in packages:
        stats["packages"] += 1
        if p["package"].endswith(DROP_SUFFIXES):
            stats["dropped_dbg"] += 1
            continue
        tr = translations.get(p["md5"])
        if tr is None:
            stats["no_translation"] += 1
            continue
        short, long = tr
        by_source[p["source"]].append({
            "package": p["package"], "source": p["source"],
            "section": p["section"], "short": short, "long": long,
        })

    chosen: list[dict[str, str]] = []
    for source in sorted(by_source):
        cands = by_source[source]
        same = [c for c in cands if c["package"] == source]
        if same:
            pick = same[0]
        else:
            pick = sorted(cands, key=lambda c: (-len(c["long"]), c["package"]))[0]
        chosen.append(pick)
    stats["sources"] = len(chosen)

    kept = [r for r in chosen if len(r["long"]) >= MIN_LONG_CHARS]
    stats["dropped_short_long"] = len(chosen) - len(kept)

    by_section: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in kept:
        by_section[r["section"]].append(r)
    before_cap = {s: len(v) for s, v in by_section.items()}

    records: list[dict[str, str]] = []
    for section in sorted(by_section):
        rs = by_section[section]
        if len(rs) < min_section:
            stats["dropped_small_sections"] += 1
            stats["dropped_small_section_pkgs"] += len(rs)
            continue
        rs = sorted(rs, key=lambda r: _name_hash(r["package"]))[:max_section]
        records.extend(sorted(rs, key=lambda r: r["package"]))
    return records, stats, before_cap


# --------------------------------------------------------------------------
# build / stats
# --------------------------------------------------------------------------

def write_jsonl_gz(path: Path, records: list[dict[str, str]]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0,
                       compresslevel=9) as gz:
        for r in records:
            line = json.dumps({k: r[k] for k in ("package", "source", "section",
                                                 "short", "long")},
                              ensure_ascii=False, sort_keys=False)
            gz.write(line.encode("utf-8") + b"\n")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def read_records(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def section_table(records: list[dict[str, str]], before_cap: dict[str, int] | None) -> str:
    counts = Counter(r["section"] for r in records)
    rows = ["| section | records | packages before cap |",
            "| --- | ---: | ---: |"]
    for s in sorted(counts):
        bc = before_cap.get(s, "") if before_cap else ""
        rows.append(f"| {s} | {counts[s]} | {bc} |")
    rows.append(f"| **total** | **{sum(counts.values())}** | |")
    return "\n".join(rows)


README_TEMPLATE = """\
# Debian package descriptions (bookworm main)

A compact, shipped extract of Debian's own package descriptions: real
English text written by Debian maintainers, not by this project. It is the
corpus used by `make demo`, the benchmarks and the routing evaluation.

## Files

- `descriptions.jsonl.gz` — gzip, one JSON object per line, sorted by
  section then package. Keys:
  - `package` — binary package name
  - `source` — source package name
  - `section` — archive section (e.g. `admin`, `science`, `sound`)
  - `short` — the one-line synopsis
  - `long` — the long description as plain text (paragraphs separated by a
    blank line, bullet items on their own lines)
- `section-descriptions` — {section_desc_note}
- `README.md` — this file (generated by the script).

## Where it comes from

Debian **bookworm**, component **main**: the binary `Packages` index
(Package, Source, Section, Description-md5) joined on `Description-md5` with
the `Translation-en` index (the English descriptions). Both are downloaded
with `apt-get update` into a private, temporary apt state directory, using
the Debian archive URI already configured on the machine, verified with
`debian-archive-keyring`. The machine's own apt configuration and lists are
not modified.

Selection, all deterministic:

1. `-dbg` / `-dbgsym` packages are ignored.
2. One binary package per source package: the package named like the source
   if there is one, else the one with the longest long description (ties:
   alphabetical).
3. Packages whose long description is shorter than {min_long} characters are
   dropped.
4. Sections with fewer than {min_section} packages (after steps 1–3) are
   dropped; larger sections are capped at {max_section} packages, chosen as the
   first {max_section} by SHA-1 of the package name.

Stats of this build: {n_packages:,} binary packages in the index,
{n_sources:,} source packages with an English description,
{n_short:,} dropped for a short long description,
{n_small} small sections dropped ({n_small_pkgs:,} packages: {small_list});
**{n_records:,} records**, {n_words:,} words in the long descriptions,
`descriptions.jsonl.gz` is {size:,} bytes.

## License

The package descriptions are part of the Debian archive (the `Packages` and
`Translation-en` indices of bookworm main) and are reproduced here as
published by Debian; only whitespace was normalised (Debian's description
formatting converted to plain text). Each description belongs to the
corresponding Debian package and is distributed under that package's terms
as part of the Debian archive. `section-descriptions` is a verbatim copy of
a file from Debian's `aptitude-common` package (GPL-2+).

## Regenerate

```
python3 scripts/debian_corpus.py all      # fetch + build into data/debian/
python3 scripts/debian_corpus.py stats    # sections with counts
```

Needs a Debian-based machine with `apt-get`, `dpkg-deb` and network access to
the Debian archive it is configured for. The output is deterministic for a
given state of the archive (gzip mtime is 0).

## Sections

{table}
"""


def build(raw_dir: Path, out_dir: Path, min_section: int = MIN_SECTION_SIZE,
          max_section: int = MAX_SECTION_SIZE) -> None:
    pk_path, tr_path = raw_dir / PACKAGES_RAW, raw_dir / TRANSLATION_RAW
    if not pk_path.exists() or not tr_path.exists():
        raise SystemExit(f"no raw lists in {raw_dir}: run the fetch subcommand first")
    translations = parse_translations(tr_path.read_text(encoding="utf-8", errors="replace"))
    packages = parse_packages(pk_path.read_text(encoding="utf-8", errors="replace"))
    records, stats, before_cap = select_records(packages, translations,
                                                min_section, max_section)

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / OUTPUT_NAME
    write_jsonl_gz(out, records)
    size = out.stat().st_size

    sd_src = raw_dir / SECTION_DESC_RAW
    if sd_src.is_file():
        shutil.copyfile(sd_src, out_dir / SECTION_DESC_RAW)
        sd_note = ("Debian's hand-written descriptions of the archive sections, "
                   "copied verbatim from `/usr/share/aptitude/section-descriptions` "
                   "of the bookworm `aptitude-common` package.")
    elif (out_dir / SECTION_DESC_RAW).is_file():
        sd_note = ("Debian's hand-written descriptions of the archive sections, "
                   "copied verbatim from `/usr/share/aptitude/section-descriptions` "
                   "of the `aptitude-common` package (kept from an earlier build).")
        log("build: section-descriptions not fetched this time; keeping the existing file")
    else:
        sd_note = "not present: `aptitude-common` could not be obtained."

    n_words = sum(len(r["long"].split()) for r in records)
    readme = README_TEMPLATE.format(
        section_desc_note=sd_note, min_long=MIN_LONG_CHARS,
        min_section=min_section, max_section=max_section,
        n_packages=stats["packages"], n_sources=stats["sources"],
        n_short=stats["dropped_short_long"], n_small=stats["dropped_small_sections"],
        n_small_pkgs=stats["dropped_small_section_pkgs"], n_records=len(records),
        n_words=n_words, size=size, table=section_table(records, before_cap),
        small_list=", ".join(f"{k} {v}" for k, v in sorted(
            before_cap.items(), key=lambda kv: (-kv[1], kv[0])) if v < min_section),
    )
    (out_dir / "README.md").write_text(readme, encoding="utf-8")

    log(f"build: {stats['packages']:,} packages, {stats['sources']:,} sources, "
        f"{len(records):,} records in {len(set(r['section'] for r in records))} sections, "
        f"{n_words:,} words; {out} = {size:,} bytes ({size / 1e6:.2f} MB)")
    if size > 8_000_000:
        log("build: WARNING: output is over 8 MB")


def print_stats(out_dir: Path) -> None:
    path = out_dir / OUTPUT_NAME
    records = read_records(path)
    counts = Counter(r["section"] for r in records)
    width = max(len(s) for s in counts) if counts else 7
    for s in sorted(counts):
        print(f"{s:<{width}}  {counts[s]:>5}")
    print(f"{'total':<{width}}  {sum(counts.values()):>5}")
    print(f"sections: {len(counts)}; words in long descriptions: "
          f"{sum(len(r['long'].split()) for r in records):,}; "
          f"file: {path.stat().st_size:,} bytes")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="download the lists into --raw-dir")
    p_fetch.add_argument("--raw-dir", type=Path, default=DEFAULT_RAW)
    p_build = sub.add_parser("build", help="write the corpus from --raw-dir")
    p_build.add_argument("--raw-dir", type=Path, default=DEFAULT_RAW)
    p_build.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p_build.add_argument("--min-section", type=int, default=MIN_SECTION_SIZE)
    p_build.add_argument("--max-section", type=int, default=MAX_SECTION_SIZE)
    p_stats = sub.add_parser("stats", help="print sections with counts")
    p_stats.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p_all = sub.add_parser("all", help="fetch + build using a temporary raw dir")
    p_all.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p_all.add_argument("--min-section", type=int, default=MIN_SECTION_SIZE)
    p_all.add_argument("--max-section", type=int, default=MAX_SECTION_SIZE)
    args = ap.parse_args(argv)

    if args.cmd == "fetch":
        fetch(args.raw_dir)
    elif args.cmd == "build":
        build(args.raw_dir, args.out, args.min_section, args.max_section)
    elif args.cmd == "stats":
        print_stats(args.out)
    elif args.cmd == "all":
        with tempfile.TemporaryDirectory(prefix="debian-corpus-raw-") as tmp:
            fetch(Path(tmp))
            build(Path(tmp), args.out, args.min_section, args.max_section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
