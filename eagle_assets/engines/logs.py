"""Reading a serving engine's log for the root cause of a failure.

An engine that dies at start prints a long traceback whose useful part is its last lines: the
exception and its message. The frames above it (uvloop, asyncio, contextlib) say nothing about
the cause, and a log read 60 s later and cut to 30 lines shows only them. `LogWatcher` reads
the log as it grows and `root_cause` keeps what a person needs: the exception, its message,
the innermost frame of the engine's own code, and any ERROR lines the engine logged.
`tail_lines` gives the last lines of a log of any length, for a server that died after it started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# "(APIServer pid=3064) " or "(EngineCore_DP0 pid=3111) " in front of every line of a vLLM process.
_PROCESS_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w.]*)(?: pid=\d+)?\)\s?")
# "ERROR 11-30 14:54:39 [core.py:123] message"
_ERROR_LINE = re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?(?P<msg>.*)$")
_LOG_LINE = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_EXCEPTION = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning)|[A-Za-z_][\w.]*\.\w+Error)(?::\s?(?P<msg>.*))?$"
)
_NOISE_FRAMES = ("uvloop", "/asyncio/", "contextlib.py", "/pydantic/", "runpy", "/concurrent/futures/", "/multiprocessing/", "<string>")


def strip_prefix(line: str) -> str:
    return _PROCESS_PREFIX.sub("", line.rstrip("\n"))


def _fatal_traceback_starts(clean: list[str]) -> list[int]:
    """Indices of tracebacks that can kill the process. Python prints "Exception ignored in: ..."
    before a traceback it swallowed (a finaliser failing at exit, say): those are harmless."""
    return [
        i
        for i, line in enumerate(clean)
        if line.startswith("Traceback (most recent call last)") and not (i > 0 and clean[i - 1].startswith("Exception ignored"))
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


def _content(lines: list[str]) -> list[str]:
    """Log lines without process prefixes; a traceback logged through ERROR lines (vLLM's
    EngineCore does this) is unwrapped to its plain text so it parses like any other."""
    out = []
    for line in lines:
        s = strip_prefix(line)
        m = _ERROR_LINE.match(s)
        out.append(m.group("msg") if m and _looks_like_traceback(m.group("msg")) else s)
    return out


def _looks_like_traceback(msg: str) -> bool:
    return msg.startswith(("Traceback (most recent call last)", "  File ", "    ")) or bool(_EXCEPTION.match(msg))


# "FileNotFoundError(EngineCore pid=1) INFO ..." then ": [Errno 2] ..." on the next line: two
# processes wrote to the log at once; the exception's name and message are split around it.
_INTERLEAVED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception))\((?:[A-Za-z_][\w.]*) pid=\d+\)")


def _traceback_exception(block: list[str]) -> tuple[str | None, str | None]:
    """(exception text, innermost non-noise frame) of the traceback whose body is `block`."""
    last_frame, innermost, exc_at = None, None, None
    for i, line in enumerate(block):
        if line.startswith("Traceback (most recent call last)"):
            break
        fm = _FRAME.match(line)
        if fm:
            innermost = f"{fm.group('file')}:{fm.group('line')} in {fm.group('func')}"
            if not any(n in fm.group("file") for n in _NOISE_FRAMES):
                last_frame = innermost
            continue
        if not line.startswith(" ") and (_EXCEPTION.match(line) or _INTERLEAVED.match(line)):
            exc_at = i
            break
    last_frame = last_frame or innermost  # all frames were plumbing: the innermost still helps
    if exc_at is None:
        return None, last_frame
    first = block[exc_at]
    m = _INTERLEAVED.match(first)
    if m:
        following = next((x for x in block[exc_at + 1 :] if x.startswith(": ")), "")
        return m.group("type") + following, last_frame
    message = [first]
    for line in block[exc_at + 1 :]:
        if _LOG_LINE.match(line) or line.startswith("Traceback") or _FRAME.match(line):
            break
        if line.strip():
            message.append(line.strip())
    return "\n".join(message[:12]), last_frame


def root_cause(lines: list[str]) -> RootCause:
    """The first fatal traceback's exception and engine frame (the later ones are usually its
    consequences: an engine core reporting that a worker died), plus the ERROR lines."""
    clean = _content(lines)
    cause = RootCause()
    for line in lines:
        m = _ERROR_LINE.match(strip_prefix(line))
        if m and m.group("msg").strip() and not _looks_like_traceback(m.group("msg")) and not m.group("msg").lstrip().startswith("^"):
            cause.error_lines.append(m.group("msg").strip())
    starts = _fatal_traceback_starts(clean)
    found = [_traceback_exception(clean[i + 1 :]) for i in starts]
    found = [f for f in found if f[0]]
    if not found:
        if starts:
            cause.location = _traceback_exception(clean[starts[0] + 1 :])[1]
        return cause
    cause.exception, cause.location = found[0]
    if len(found) > 1 and found[-1][0] != found[0][0]:
        cause.error_lines.append("then: " + found[-1][0].splitlines()[0])
    return cause


def traceback_complete(lines: list[str]) -> bool:
    """True once the last traceback in `lines` has reached its exception line."""
    clean = _content(lines)
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

    def last_record(self) -> str:
        """The engine's last log record ("INFO 12-03 17:05:09 [file.py:12] ..."), for progress
        lines: a traceback Python printed and ignored (a finaliser failing during compilation,
        say) would otherwise show its last line, "RecursionError: ...", while the start goes on."""
        for line in reversed(self.lines):
            if _LOG_LINE.match(clean := strip_prefix(line)):
                return clean
        return (self.tail(1) or [""])[0]


def tail_lines(path: Path, n: int = 20, max_bytes: int = 1 << 16) -> list[str]:
    """The last `n` lines of a log, without their process prefixes, read from its last
    `max_bytes` only (a server's log grows with every request it serves). [] when it is missing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            chunk = f.read()
    except OSError:
        return []
    lines = chunk.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line read is most likely cut
    return [strip_prefix(line) for line in lines if line.strip()][-n:]


KERNELS_MARK = "eagle_assets kernels:"
"""The prefix of the lines the engine plugin logs for each kernel choice
(engine_site/eagle_assets_vllm_fixes.py, `announce_cpu_kernels`)."""


def engine_kernels(path: Path, max_bytes: int = 1 << 22) -> list[str]:
    """The kernel choices a launched CPU engine logged, each once, in order: "library _C",
    "backend CPU_MLA", "attention path vec16 (float32, block size 16)"; [] when none were logged
    (a GPU engine, or a log that is missing)."""
    try:
        with open(path, "rb") as f:
            text = f.read(max_bytes).decode("utf-8", errors="replace")
    except OSError:
        return []
    seen: list[str] = []
    for line in text.splitlines():
        _, mark, choice = line.partition(KERNELS_MARK)
        if mark and choice.strip() and choice.strip() not in seen:
            seen.append(choice.strip())
    return seen
