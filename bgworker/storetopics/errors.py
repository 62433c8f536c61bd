"""Errors a user can act on, shared by every module (api re-exports StoretopicsError).

    StoretopicsError    a message and a hint saying what to do; the CLI prints it as one line, exit status 1
    Unavailable         something a refresh pass needs cannot work here (a labeller without its key, its SDK or its
                        server; clustering without numpy and scikit-learn): the pass does what it can without it
                        (old labels kept, keywords rendered) and its caller says so once
    MissingExtra        an optional extra is not installed: the hint is the pip command that installs it
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TextIO


class StoretopicsError(Exception):
    """An error the user can act on: `message`, and a `hint` saying what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f" (hint: {self.hint})" if self.hint else "")


class Unavailable(StoretopicsError):
    """Something a refresh pass needs cannot work in this environment, whatever the data: asking again for the next
    cluster or store would fail the same way.  The pass goes on without it; the caller reports it once."""


class MissingExtra(Unavailable, ImportError):
    """An optional extra is not installed (`pip install 'storetopics[<extra>]'`)."""

    def __init__(self, what: str, extra: str, missing: str | None = None):
        super().__init__(f"{what} needs the extra `{extra}`" + (f" ({missing} is not installed)" if missing else ""),
                         f"pip install 'storetopics[{extra}]'")
        self.extra = extra


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`, which the extra `extra` installs, or raise MissingExtra saying what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(what, extra, e.name or module) from e


def report_error(message: str, hint: str | None = None, stream: TextIO | None = None) -> None:
    """An error as the command line shows it: one line, `storetopics: error: <message> (hint: <hint>)`."""
    stream = stream if stream is not None else sys.stderr
    message = " ".join(message.split())
    if message.startswith("storetopics: "):
        message = message[len("storetopics: "):]
    line = f"storetopics: error: {message}"
    if hint:
        line += f" (hint: {' '.join(hint.split())})"
    stream.write(line + "\n")
    stream.flush()
