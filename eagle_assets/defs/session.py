"""One Dagster session per instance and data folder: the web UI, the daemon and their code server
for exactly as long as the command that started it (`eagle-assets run`, `eagle-assets ui`).

    with DagsterSession(log=print) as session:            # refuses if another session holds the folder
        run_id = session.launch(["prompts", "synthetic_corpus"])   # as the UI's "Materialize" does
        session.wait(run_id)                              # raises RunFailed with the run's own error
        session.stale(["prompts"])                        # the UI's stale status and its causes

The session is `dagster dev` (webserver, daemon, one code server) started under a small
supervisor process (`python -m eagle_assets.defs.session`) that leads its own process group and
reads a pipe from the command. When the command ends in any way, a SIGKILL included, the pipe
closes, and the supervisor cancels the runs still queued or going (their workers stop the servers
they launched), waits for them, marks any left as cancelled, and stops its whole group: no
daemon, webserver, code server or run worker outlives the command, and no run stays STARTED.
Runs are launched through the webserver's GraphQL API, the calls the UI's buttons make, so a run
of `eagle-assets run` and one of the UI are the same kind of run: Dagster's asset job, queued in
the instance's run queue, launched by the daemon (dagster.yaml), with the same lineage. Dagster
has no public Python API that launches a run of a code location's job; GraphQL is its public one.

One session at a time: an exclusive lock on the instance ($DAGSTER_HOME) and on the data folder
(its local folder; a URL root's local mirror), held by the command and released by the kernel
when it ends, so two commands never write one folder and two daemons never serve one instance.
A second command is refused with the first one's pid, command line and UI address; an instance
that a daemon of another kind serves (a deployment's) is refused too: launch from its UI.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from eagle_assets.paths import PROJECT_ROOT

WORKSPACE_FILE = PROJECT_ROOT / "workspace.yaml"
ASSET_JOB = "__ASSET_JOB"
"""Dagster's own job of every asset: what the UI's "Materialize" launches."""
LOCK_NAME = ".eagle-assets-session.lock"
LOG_DIR = "eagle_assets_logs"
"""Where, under $DAGSTER_HOME, a session's `dagster dev` writes its log (not $DAGSTER_HOME/logs:
that folder is Dagster's telemetry queue, which a running daemon renames and uploads)."""
QUEUE_DAEMON = "QUEUED_RUN_COORDINATOR"
DAEMON_HEARTBEAT_MAX_AGE_S = 90.0
"""A daemon writes a heartbeat every 30 s: one older than this has stopped."""
STARTUP_TIMEOUT_S = 600.0
STOP_WAIT_S = 120.0
WORKER_CHECK_S = 5.0
"""How often the supervisor looks for runs whose worker was killed."""
"""How long runs being cancelled get to tear down (stop the servers they launched)."""
FINISHED = frozenset({dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
IN_FLIGHT = (
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
SESSION_TAG = "eagle_assets/session"
"""Tag on every run a command launches: which command, with its pid."""
STALE, MISSING, FRESH = "STALE", "MISSING", "FRESH"


class SessionBusy(RuntimeError):
    """Another session holds the instance or the data folder; the message names it."""


class RunFailed(RuntimeError):
    """A run failed or was cancelled; the message names it and gives its error."""

    def __init__(self, label: str, run_id: str, reason: str):
        super().__init__(f"{label} (run {run_id}) {reason}")
        self.label, self.run_id, self.reason = label, run_id, reason


# -- the lock -------------------------------------------------------------------------------


@dataclass
class SessionLock:
    """Exclusive locks on the instance's folder and the data folder, with who holds them."""

    folders: tuple[Path, ...]
    _files: list = None

    def acquire(self, holder: dict) -> None:
        self._files = []
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)
            f = open(folder / LOCK_NAME, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                other = _holder_text(f.read())
                f.close()
                self.release()
                raise SessionBusy(
                    f"{folder} is in use by another eagle-assets session: {other}. Two sessions on one data folder or "
                    "one Dagster instance would write the same files and run two daemons: wait for it to finish, use its "
                    "UI, or stop it (Ctrl-C in its terminal)."
                ) from None
            f.seek(0)
            f.truncate()
            f.write(json.dumps(holder))
            f.flush()
            self._files.append(f)

    def update(self, **changes) -> None:
        for f in self._files or []:
            f.seek(0)
            holder = {**json.loads(f.read() or "{}"), **changes}
            f.seek(0)
            f.truncate()
            f.write(json.dumps(holder))
            f.flush()

    def release(self) -> None:
        for f in self._files or []:
            f.close()  # closing the file releases its lock
        self._files = []


def _holder_text(raw: str) -> str:
    try:
        h = json.loads(raw)
    except ValueError:
        return "a process whose record is unreadable"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("started", 0)))
    ui = f", its UI at {h['url']}" if h.get("url") else ""
    return f"pid {h.get('pid')} (`{h.get('command')}`, since {since}{ui})"


def daemon_alive(instance: dg.DagsterInstance, max_age_s: float = DAEMON_HEARTBEAT_MAX_AGE_S) -> bool:
    """Whether a daemon dequeues this instance's runs: a queue heartbeat in the last `max_age_s`."""
    beat = instance.get_daemon_heartbeats().get(QUEUE_DAEMON)
    return beat is not None and time.time() - beat.timestamp < max_age_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the session, seen from the command -------------------------------------------------------


class DagsterSession:
    """`dagster dev` under a supervisor for the duration of the block (module doc).

    `env` is added to the session's environment (the code location's settings: defs/settings.py);
    `data_folder` is locked beside the instance; `port` None picks a free one."""

    def __init__(
        self,
        home: Path | None = None,
        data_folder: Path | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        workspace: Path = WORKSPACE_FILE,
        log: Callable[[str], None] = print,
        command: str | None = None,
        poll_s: float = 1.0,
    ):
        self.home = Path(home or os.environ["DAGSTER_HOME"]).resolve()
        self.data_folder = Path(data_folder).resolve() if data_folder else None
        self.env, self.host, self.workspace, self.log, self.poll_s = dict(env or {}), host, Path(workspace), log, poll_s
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.command = command or " ".join(["eagle-assets", *sys.argv[1:]])
        self.lock = SessionLock(tuple(f for f in (self.home, self.data_folder) if f is not None))
        self.instance: dg.DagsterInstance | None = None
        self.supervisor: subprocess.Popen | None = None
        self.log_file: Path | None = None
        self.location = self.repository = None
        self._cursors: dict[str, str | None] = {}
        self._labels: dict[str, str] = {}

    # entering and leaving

    def __enter__(self) -> DagsterSession:
        self.lock.acquire({"pid": os.getpid(), "command": self.command, "started": time.time()})
        try:
            self.instance = dg.DagsterInstance.from_config(str(self.home))
            if daemon_alive(self.instance):
                raise SessionBusy(
                    f"a Dagster daemon already serves the instance {self.home} (a deployment's, or a session whose command "
                    "was killed in the last 90 s): launch runs from its UI, or stop it first"
                )
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.supervisor is not None:
                self.supervisor.stdin.close()  # the supervisor's signal to cancel runs and stop
                try:
                    self.supervisor.wait(timeout=STOP_WAIT_S + 60)
                except subprocess.TimeoutExpired:
                    os.killpg(self.supervisor.pid, signal.SIGKILL)
                    self.supervisor.wait()
                self.supervisor = None
        finally:
            if self.instance is not None:
                self.instance.dispose()
                self.instance = None
            self.lock.release()

    def _start(self) -> None:
        folder = self.home / LOG_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.log_file = folder / f"session-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        env = {**os.environ, **self.env, "DAGSTER_HOME": str(self.home)}
        cmd = [
            sys.executable,
            "-m",
            "eagle_assets.defs.session",
            "--workspace",
            str(self.workspace),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log",
            str(self.log_file),
        ]
        # Its own process group: a Ctrl-C in this terminal reaches this command alone, which then
        # closes the pipe; the supervisor stops the group as its last act.
        self.supervisor = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdin=subprocess.PIPE, start_new_session=True)
        self.log(f"starting Dagster (webserver, daemon, code server; log {self.log_file})")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.supervisor.poll() is not None:
                raise RuntimeError(f"Dagster stopped before answering (exit {self.supervisor.returncode}); its log ends:\n{self.log_tail()}")
            try:
                repos = self.graphql(
                    "{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name location { name } } } } }", timeout=10
                )
                nodes = repos["repositoriesOrError"].get("nodes") or []
                if nodes:
                    self.repository, self.location = nodes[0]["name"], nodes[0]["location"]["name"]
                    break
                problem = self._location_error()
                if problem:
                    raise RuntimeError(f"the code location did not load: {problem}")
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Dagster did not answer at {self.url} within {STARTUP_TIMEOUT_S:.0f} s; its log ends:\n{self.log_tail()}")
            time.sleep(1)
        self.lock.update(url=self.url)
        self.log(f"Dagster UI at {self.url}/asset-groups (runs, lineage and checks, while this command runs)")

    def _location_error(self) -> str | None:
        out = self.graphql(
            "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename ... on PythonError { message } } } } } }",
            timeout=10,
        )
        for entry in out["workspaceOrError"].get("locationEntries") or []:
            error = entry.get("locationOrLoadError") or {}
            if error.get("__typename") == "PythonError":
                return error["message"].strip()
        return None

    def log_tail(self, lines: int = 30) -> str:
        if self.log_file is None or not self.log_file.is_file():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    # GraphQL: the UI's own calls

    def graphql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise RuntimeError(f"Dagster's GraphQL API refused the request: {out['errors']}")
        return out["data"]

    def asset_nodes(self) -> dict[str, dict]:
        """Every asset as the UI sees it: stale status and causes, checks, latest materialisation."""
        out = self.graphql(ASSET_NODES_QUERY)
        return {"/".join(n["assetKey"]["path"]): n for n in out["assetNodes"]}

    def stale(self, assets: Iterable[str] | None = None) -> dict[str, tuple[str, list[str]]]:
        """{asset: (FRESH, STALE or MISSING, the causes the UI shows)}."""
        nodes = self.asset_nodes()
        wanted = list(assets) if assets is not None else list(nodes)
        return {a: (nodes[a]["staleStatus"], [_cause_text(c) for c in nodes[a]["staleCauses"]]) for a in wanted}

    def launch(self, assets: Sequence[str], tags: dict[str, str] | None = None, label: str | None = None) -> str:
        """Launch a run of `assets` and their checks, as the UI's "Materialize" does; its id."""
        nodes = self.asset_nodes()
        checks = [{"assetKey": {"path": [a]}, "name": c["name"]} for a in assets for c in nodes[a]["assetChecksOrError"].get("checks", [])]
        params = {
            "selector": {
                "repositoryLocationName": self.location,
                "repositoryName": self.repository,
                "pipelineName": ASSET_JOB,
                "assetSelection": [{"path": [a]} for a in assets],
                "assetCheckSelection": checks,
            },
            "runConfigData": {},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        result = self.graphql(LAUNCH_MUTATION, {"params": params})["launchPipelineExecution"]
        if result["__typename"] != "LaunchRunSuccess":
            errors = "; ".join(e["message"] for e in result.get("errors") or []) or result.get("message") or result["__typename"]
            raise RuntimeError(f"Dagster refused the run of {', '.join(assets)}: {errors}")
        run_id = result["run"]["runId"]
        self._labels[run_id] = label or ", ".join(assets)
        self.log(f"materialising {self._labels[run_id]} (run {run_id}: {self.url}/runs/{run_id})")
        return run_id

    # waiting

    def wait(self, run_id: str) -> dg.DagsterRun:
        """Wait for the run, relaying its log messages; raise RunFailed unless it succeeded."""
        label = self._labels.get(run_id, run_id)
        while True:
            self._relay(run_id)
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status in FINISHED:
                self._relay(run_id)
                if run.status != dg.DagsterRunStatus.SUCCESS:
                    raise RunFailed(label, run_id, run_error(self.instance, run))
                self.log(f"done: {label} (run {run_id})")
                return run
            if self.supervisor is not None and self.supervisor.poll() is not None:
                raise RuntimeError(f"Dagster stopped while run {run_id} was going; its log ends:\n{self.log_tail()}")
            time.sleep(self.poll_s)

    def _relay(self, run_id: str) -> None:
        """Pass the run's new log messages (the assets' own, INFO and above) on to `log`."""
        cursor = self._cursors.get(run_id)
        while True:
            page = self.instance.get_records_for_run(run_id, cursor=cursor, limit=500)
            for record in page.records:
                entry = record.event_log_entry
                if entry.dagster_event is None and entry.level >= logging.INFO and entry.user_message:
                    step = f" {entry.step_key}" if entry.step_key else ""
                    self.log(f"  [{run_id[:8]}{step}] {entry.user_message}")
            cursor = page.cursor
            if not page.has_more:
                break
        self._cursors[run_id] = cursor


def _cause_text(cause: dict) -> str:
    dep = cause.get("dependency")
    return cause["reason"] + (f" ({'/'.join(dep['path'])})" if dep else "")


ASSET_NODES_QUERY = """
query {
  assetNodes {
    assetKey { path }
    opVersion
    staleStatus
    staleCauses { reason dependency { path } }
    assetChecksOrError { ... on AssetChecks { checks { name } } }
  }
}
"""

LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""


# -- why a run failed -----------------------------------------------------------------------


def run_error(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """Why a run did not succeed, in its own words: each failed step's error (the innermost cause:
    the exception the asset raised), else the run's failure and engine errors; a worker that
    vanished without a word is named as killed."""
    if run.status == dg.DagsterRunStatus.CANCELED:
        return "was cancelled"
    kinds = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.ENGINE_EVENT, dg.DagsterEventType.RUN_START}
    steps, other, worker = [], [], None
    for entry in instance.all_logs(run.run_id, of_type=kinds):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.RUN_START:
            worker = event.pid
        elif event.event_type == dg.DagsterEventType.STEP_FAILURE:
            steps.append(f"step {event.step_key}: {_innermost(event.step_failure_data.error)}")
        elif event.event_type == dg.DagsterEventType.RUN_FAILURE:
            error = getattr(event.event_specific_data, "error", None)
            other.append(_innermost(error) if error else (entry.user_message or "").strip())
        elif getattr(event.event_specific_data, "error", None) is not None:
            other.append(_innermost(event.event_specific_data.error))
    if steps:
        return "failed: " + "; ".join(dict.fromkeys(steps))
    if worker is not None and not _alive(worker):
        said = "; ".join(dict.fromkeys(r for r in other if r))
        return (
            f"failed: its run worker (pid {worker}) was killed: it ended without reporting an error (a SIGKILL, "
            f"the out-of-memory killer, a lost host)" + (f"; Dagster says: {said}" if said else "")
        )
    reasons = [r for r in other if r] or [f"ended {run.status.value} without an error in its event log"]
    return "failed: " + "; ".join(dict.fromkeys(reasons))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _innermost(error) -> str:
    while getattr(error, "cause", None) is not None:
        error = error.cause
    return error.message.strip() if error is not None else "unknown error"


# -- the supervisor -------------------------------------------------------------------------


def cancel_in_flight(instance: dg.DagsterInstance, log: Callable[[str], None], wait_s: float = STOP_WAIT_S) -> list[str]:
    """Cancel every run of `instance` queued or going (the session holds the instance: they are
    its own), give them `wait_s` to tear down, and mark any still going as cancelled."""
    runs = [r.dagster_run for r in instance.get_run_records(dg.RunsFilter(statuses=list(IN_FLIGHT)))]
    for run in runs:
        log(f"cancelling run {run.run_id} ({run.status.value})")
        try:
            instance.run_coordinator.cancel_run(run.run_id)
        except Exception as exc:  # a run whose worker is already gone: marked below
            log(f"could not cancel run {run.run_id} cleanly: {exc}")
    deadline = time.monotonic() + wait_s
    for run in runs:
        while time.monotonic() < deadline:
            now = instance.get_run_by_id(run.run_id)
            if now is None or now.status in FINISHED:
                break
            time.sleep(1)
        now = instance.get_run_by_id(run.run_id)
        if now is not None and now.status not in FINISHED:
            instance.report_run_canceled(now, message="its eagle-assets session ended before it tore down")
    return [r.run_id for r in runs]


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the run's worker process, from its RUN_START event (None before it started)."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_START):
        if entry.dagster_event is not None:
            return entry.dagster_event.pid
    return None


def fail_killed_runs(instance: dg.DagsterInstance, log: Callable[[str], None]) -> list[str]:
    """Mark failed, naming the kill, every STARTED run whose worker process is gone.

    Dagster's run monitoring cannot see this for the DefaultRunLauncher, which has no worker
    health check: a run whose worker was SIGKILLed (by hand, by the out-of-memory killer) would
    stay STARTED for ever. The session's runs all start on this host, so the worker's pid says."""
    failed = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        run = record.dagster_run
        pid = worker_pid(instance, run.run_id)
        if pid is None or _alive(pid):
            continue
        now = instance.get_run_by_id(run.run_id)
        if now is None or now.status != dg.DagsterRunStatus.STARTED:
            continue  # it finished as it exited
        message = (
            f"its run worker (pid {pid}) was killed: it ended without reporting an error or its end "
            "(a SIGKILL, the out-of-memory killer); what its steps had finished is kept"
        )
        log(f"run {run.run_id}: {message}")
        instance.report_run_failed(now, message)
        failed.append(run.run_id)
    return failed


def supervise(workspace: str, host: str, port: int, log_file: str) -> int:
    """Run `dagster dev` until standard input closes, then stop it as the module doc says."""
    out = open(log_file, "ab", buffering=0)

    def note(message: str) -> None:
        out.write(f"[eagle-assets session {time.strftime('%H:%M:%S')}] {message}\n".encode())

    # SIGINT and SIGTERM (a terminal's Ctrl-C reaches the group only if someone sends it there):
    # stop as when the pipe closes.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *a: stopping.append(1))
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", workspace, "-h", host, "-p", str(port)]
    dev = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    note(f"dagster dev started (pid {dev.pid})")
    instance = dg.DagsterInstance.get()
    checked = time.monotonic()
    while not stopping and dev.poll() is None:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the command ended (or was killed)
        if time.monotonic() - checked > WORKER_CHECK_S:
            checked = time.monotonic()
            try:
                fail_killed_runs(instance, note)
            except Exception as exc:  # the instance busy for a moment: the next check tries again
                note(f"checking run workers failed: {exc!r}")
    note("the command ended: cancelling runs, then stopping Dagster")
    try:
        fail_killed_runs(instance, note)
        cancel_in_flight(instance, note)
        instance.dispose()
    except Exception as exc:  # the group is stopped below whatever happened here
        note(f"cancelling runs failed: {exc!r}")
    if dev.poll() is None:
        dev.send_signal(signal.SIGTERM)
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    # The daemon's heartbeats outlive it in the instance: a next session would take them for a live
    # daemon for 90 s. Only this session's daemon served the instance (its start checked that).
    try:
        with dg.DagsterInstance.get() as ended:
            ended.wipe_daemon_heartbeats()
    except Exception as exc:  # a next session then waits out the 90 s
        note(f"clearing the daemon's heartbeats failed: {exc!r}")
    note("stopping the session's process group")
    out.close()
    # Every process started here (webserver, daemon, code servers, run workers) is in this group.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(os.getpgrp(), signal.SIGKILL)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Supervise one eagle-assets Dagster session (module doc).")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    return supervise(args.workspace, args.host, args.port, args.log)


if __name__ == "__main__":
    sys.exit(main())
