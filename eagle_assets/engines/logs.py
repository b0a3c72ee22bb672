"""Reading a serving engine's log for the root cause of a failure.

An engine that dies at start prints a long traceback whose useful part is its last lines: the
exception and its message. The frames above it (uvloop, asyncio, contextlib) say nothing about
the cause, and a log read 60 s later and cut to 30 lines shows only them. `LogWatcher` reads
the log as it grows and `root_cause` keeps what a person needs: the exception, its message,
the innermost frame of the engine's own code, and any ERROR lines the engine logged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# "(APIServer pid=3064) " or "(EngineCore_DP0 pid=3111) " in front of every line of a vLLM process.
_PROCESS_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w.]*)(?: pid=\d+)?\)\s?")
# "ERROR 11-30 14:54:39 [core.py:123] message"
_ERROR_LINE = re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s*(?P<msg>.*)$")
_LOG_LINE = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)|[A-Za-z_][\w.]*\.\w+Error)(?::\s?(?P<msg>.*))?$")
_NOISE_FRAMES = ("uvloop", "/asyncio/", "contextlib.py", "/pydantic/", "runpy.py", "/concurrent/futures/", "/multiprocessing/")


def strip_prefix(line: str) -> str:
    return _PROCESS_PREFIX.sub("", line.rstrip("\n"))


def _fatal_traceback_starts(clean: list[str]) -> list[int]:
    """Indices of tracebacks that can kill the process. Python prints "Exception ignored in: ..."
    before a traceback it swallowed (a finaliser failing at exit, say): those are harmless."""
    return [
        i
        for i, line in enumerate(clean)
        if line.startswith("Traceback (most recent call last)")
        and not (i > 0 and clean[i - 1].startswith("Exception ignored"))
    ]


@dataclass
class RootCause:
    """What went wrong, in the lines a person should read first."""

    exception: str | None = None
    """`Type: message`, message lines joined (pydantic and vLLM messages span several lines)."""
    location: str | None = None
    """The innermost frame outside asyncio/uvloop/pydantic: `file:line in func`."""
    error_lines: list[str] = field(default_factory=list)
    """ERROR/CRITICAL log lines, in order, without their process prefix."""

    def __bool__(self) -> bool:
        return bool(self.exception or self.error_lines)

    def summary(self) -> str:
        parts = []
        if self.exception:
            parts.append(self.exception)
        if self.location:
            parts.append(f"  at {self.location}")
        extra = [e for e in self.error_lines if not self.exception or e not in self.exception][-3:]
        if extra:
            parts.append("engine errors logged:")
            parts += [f"  {e}" for e in extra]
        return "\n".join(parts) or "(no traceback or ERROR line in the log)"


def root_cause(lines: list[str]) -> RootCause:
    """The last traceback's exception and engine frame, plus ERROR lines, from log `lines`."""
    clean = [strip_prefix(line) for line in lines]
    cause = RootCause()
    for line in clean:
        m = _ERROR_LINE.match(line)
        if m and m.group("msg").strip():
            cause.error_lines.append(m.group("msg").strip())
    starts = _fatal_traceback_starts(clean)
    if not starts:
        return cause
    block = clean[starts[-1] + 1 :]
    last_frame = None
    exc_at = None
    for i, line in enumerate(block):
        fm = _FRAME.match(line)
        if fm:
            if not any(n in fm.group("file") for n in _NOISE_FRAMES):
                last_frame = f"{fm.group('file')}:{fm.group('line')} in {fm.group('func')}"
            exc_at = None
            continue
        if exc_at is None and not line.startswith(" ") and _EXCEPTION.match(line):
            exc_at = i
    if exc_at is not None:
        message = [block[exc_at]]
        for line in block[exc_at + 1 :]:
            if _LOG_LINE.match(line) or line.startswith("Traceback") or _FRAME.match(line):
                break
            if line.strip():
                message.append(line.strip())
        cause.exception = "\n".join(message[:12])
    cause.location = last_frame
    return cause


def traceback_complete(lines: list[str]) -> bool:
    """True once the last traceback in `lines` has reached its exception line."""
    clean = [strip_prefix(line) for line in lines]
    starts = _fatal_traceback_starts(clean)
    if not starts:
        return False
    return any(not line.startswith(" ") and _EXCEPTION.match(line) for line in clean[starts[-1] + 1 :])


class LogWatcher:
    """Follows a growing log file; `poll()` returns new lines and whether trouble appeared."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = ""
        self.lines: list[str] = []
        self.trouble_seen_at: int | None = None  # index of the first alarming line

    def poll(self) -> list[str]:
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        *complete, self._partial = text.split("\n")
        start = len(self.lines)
        self.lines.extend(complete)
        if self.trouble_seen_at is None:
            for i in range(start, len(self.lines)):
                s = strip_prefix(self.lines[i])
                previous = strip_prefix(self.lines[i - 1]) if i else ""
                swallowed = previous.startswith("Exception ignored")
                if (s.startswith("Traceback (most recent call last)") and not swallowed) or _ERROR_LINE.match(s):
                    self.trouble_seen_at = i
                    break
        return complete

    def tail(self, n: int = 30) -> list[str]:
        return [strip_prefix(x) for x in self.lines[-n:]]
