"""How fast the CLI starts: `storetopics --help` against the bare interpreter and the worker's own entry point,
measured side by side (interleaved, median of N).  Target: `storetopics --help` <= 0.5 s.

    .venv/bin/python -m bench.startup [--reps 15]      (part of `make bench`; writes bench/results/startup-latest.md)
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "storetopics --help": [sys.executable, "-m", "storetopics.cli", "--help"],
    "python -m storetopics.worker --help": [sys.executable, "-m", "storetopics.worker", "--help"],
}
TARGET = 0.5


def measure(reps: int) -> dict[str, list[float]]:
    times = {k: [] for k in COMMANDS}
    for _ in range(reps):
        for name, cmd in COMMANDS.items():   # interleaved: the machine's noise falls on every command alike
            t = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd="/")
            times[name].append(time.perf_counter() - t)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    times = measure(args.reps)
    base = statistics.median(times["python -c pass"])
    lines = [f"# CLI start-up (median of {args.reps}, interleaved)", "",
             "| command | median s | vs bare python | target |", "|---|---:|---:|---|"]
    for name, ts in times.items():
        med = statistics.median(ts)
        verdict = ("PASS" if med <= TARGET else "MISS") + f" (<= {TARGET} s)" if name == "storetopics --help" else ""
        lines.append(f"| `{name}` | {med:.3f} | {med / base:.2f}x | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup-latest.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
