"""Logging for the CLI and the worker: Python `logging`, one line per event, as text or JSON.

    text: 12:00:01.123 storetopics worker host:42:ab12cd: claim 1:docs generation 3
    json: {"ts": "2026-12-01T12:00:01.123Z", "level": "info", "logger": "storetopics.worker",
           "worker": "host:42:ab12cd", "message": "claim 1:docs generation 3", "source": 1, "store": "docs"}

Fields given as `extra=` (worker, source, store, ...) are kept as fields in JSON; the text line names the worker.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

from . import config

_STANDARD = set(vars(logging.LogRecord("x", 0, "", 0, "", None, None))) | {"message", "asctime"}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        who = record.name.replace(".", " ", 1)
        if getattr(record, "worker", None):
            who += f" {record.worker}"
        line = f"{stamp} {who}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup(level: str = config.LOG_LEVEL, fmt: str = config.LOG_FORMAT, stream: TextIO | None = None) -> None:
    """Send the `storetopics` loggers to `stream` (stderr) at `level`, formatted as `fmt` (text or json)."""
    if level not in config.LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(config.LOG_LEVELS)}, not {level!r}")
    if fmt not in config.LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(config.LOG_FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("storetopics")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
