"""A tiny, dependency-free progress bar for stderr.

On a terminal it redraws one line in place (at most 10 times a second).  Elsewhere (a pipe, a log file, CI) it
writes a plain line every few seconds and one at the end, so logs stay short and readable.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def _fmt_secs(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    m, s = divmod(int(s + 0.5), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


class Progress:
    def __init__(self, label: str, total: int = 0, *, unit: str = "files", stream: TextIO | None = None,
                 width: int = 28, enabled: bool = True, plain_every: float = 5.0):
        self.label = label
        self.total = max(int(total), 0)
        self.done = 0
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"
        self.plain_every = plain_every
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._closed = False
        if self.enabled and self.tty:
            self._draw(force=True)

    # -- public --------------------------------------------------------------------------------
    def update(self, done: int | None = None, total: int | None = None, *, advance: int = 0) -> None:
        if total is not None:
            self.total = max(int(total), 0)
        if done is not None:
            self.done = int(done)
        self.done += advance
        if self.done > self.total:
            self.total = self.done
        self._draw()

    def close(self, note: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        line = self._line(final=True) + (f"  {note}" if note else "")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- drawing -------------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _line(self, final: bool = False) -> str:
        elapsed = self.elapsed
        if self.total > 0:
            frac = min(self.done / self.total, 1.0)
            filled = int(frac * self.width)
            bar = "#" * filled + ("" if filled == self.width else ">") + "." * max(self.width - filled - 1, 0)
            pct = f"{frac * 100:5.1f}%"
        else:
            bar, pct = ("#" * self.width if final else "." * self.width), ("100.0%" if final else "  ...%")
        counts = f"{self.done:,}/{self.total:,} {self.unit}"
        tail = _fmt_secs(elapsed)
        if not final and self.total > 0 and 0 < self.done < self.total and elapsed > 1:
            tail += f", ~{_fmt_secs(elapsed / self.done * (self.total - self.done))} left"
        return f"{self.label} [{bar}] {pct} {counts} {tail}"

    def _draw(self, force: bool = False) -> None:
        if not self.enabled or self._closed:
            return
        now = time.monotonic()
        if self.tty:
            if force or now - self._last_draw >= 0.1:
                self.stream.write("\r" + self._line() + "\x1b[K")
                self.stream.flush()
                self._last_draw = now
        elif now - self.started >= self.plain_every and now - self._last_draw >= self.plain_every:
            self.stream.write(self._line() + "\n")
            self.stream.flush()
            self._last_draw = now
