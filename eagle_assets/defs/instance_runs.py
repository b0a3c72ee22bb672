"""Runs submitted to the Dagster instance and waited for, as a deployment runs them.

    with RunSession(instance, log=print) as session:
        session.run([RunSpec("corpus_job")])                                  # waits; raises RunFailed
        session.run([RunSpec("hidden_states_job", partition=k) for k in keys])  # side by side, as the queue allows

Each run is created for the code location that the workspace file names (`workspace.yaml`) and
submitted to the instance's run coordinator: with $DAGSTER_HOME/dagster.yaml's
QueuedRunCoordinator it waits in the run queue, and the Dagster daemon dequeues it within the
instance's limits (max_concurrent_runs, tag_concurrency_limits) and hands it to the instance's
run launcher; the run then executes its steps with its job's executor (defs/jobs.py). Where no
daemon serves the instance (no queue heartbeat in the last 90 s), the session starts
`dagster-daemon run` for its own duration, in its own process group and with its log in
$DAGSTER_HOME/eagle_assets_logs/, and stops it when the session ends; a daemon already running
(`eagle-assets ui`, a deployment's) is used as it is. Each run's own log messages are relayed to
`log` as they arrive.

Why the queue and the daemon rather than `instance.launch_run` from this process: Dagster's run
coordinator is the one place that applies the instance's limits ("When you submit a run from the
Dagster UI or the Dagster command line, it's first sent to the run coordinator, which applies any
limits or prioritization policies before eventually sending it to the run launcher", Dagster's
docs, "Run coordinators"). Through it, the runs of `eagle-assets run`, of the UI and of the
schedule share one queue and one set of limits (one Hugging Face extraction at a time, one run of
a retraining wave at a time), and are launched exactly as a deployment launches them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

# Private Dagster names, unavoidable here: Dagster has no public Python API that creates a run of
# a code location's job and submits it to the instance. The documented ways are the web UI with
# its GraphQL API (dagster_graphql's client needs a webserver running) and `dagster job launch`,
# which takes no asset selection (a --stale-only wave runs part of a stage) and loads the code
# location again for every run. What follows mirrors `dagster job launch`
# (dagster/_cli/job.py: execute_launch_command, _create_run) with the asset selection the UI's
# launch adds (dagster_graphql/implementation/execution/run_lifecycle.py:
# create_valid_pipeline_run). eagle_assets_tests/defs/test_instance_runs.py pins these names
# and their behaviour against the pinned Dagster.
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from eagle_assets.paths import PROJECT_ROOT

WORKSPACE_FILE = PROJECT_ROOT / "workspace.yaml"
PARTITION_TAG = "dagster/partition"
QUEUE_DAEMON = "QUEUED_RUN_COORDINATOR"
"""The daemon type that dequeues runs (dagster-daemon's name for it in its heartbeats)."""
DAEMON_HEARTBEAT_MAX_AGE_S = 90.0
"""A daemon writes a heartbeat every 30 s: one older than this has stopped."""
DAEMON_LOG_DIR = "eagle_assets_logs"
"""Where, under $DAGSTER_HOME, a daemon started by a session writes its log."""
FINISHED = frozenset({dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
STOP_WAIT_S = 120.0
"""How long runs being cancelled get to tear down (stop the servers they launched)."""


@dataclass(frozen=True)
class RunSpec:
    """One run to submit: a job (a stage), the assets of it to materialise, at most one partition."""

    job: str
    assets: tuple[str, ...] | None = None
    """Asset keys to materialise; None: all of the job's."""
    partition: str | None = None
    run_config: Mapping = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ", ".join(self.assets or (self.job,)) + (f" [partition {self.partition}]" if self.partition is not None else "")


class RunFailed(RuntimeError):
    """A submitted run failed or was cancelled; the message names it and gives its error."""

    def __init__(self, label: str, run_id: str, reason: str):
        super().__init__(f"{label} (run {run_id}) {reason}")
        self.label, self.run_id, self.reason = label, run_id, reason


def daemon_alive(instance: dg.DagsterInstance, max_age_s: float = DAEMON_HEARTBEAT_MAX_AGE_S) -> bool:
    """Whether a daemon dequeues this instance's runs: a queue heartbeat in the last `max_age_s`."""
    beat = instance.get_daemon_heartbeats().get(QUEUE_DAEMON)
    return beat is not None and time.time() - beat.timestamp < max_age_s


def run_error(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """Why a run did not succeed, in its own words: each failed step's error (the innermost cause:
    the exception the asset raised), else the run's failure and engine errors."""
    if run.status == dg.DagsterRunStatus.CANCELED:
        return "was cancelled"
    kinds = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.ENGINE_EVENT}
    steps, other = [], []
    for entry in instance.all_logs(run.run_id, of_type=kinds):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_FAILURE:
            steps.append(f"step {event.step_key}: {_innermost(event.step_failure_data.error)}")
        elif event.event_type == dg.DagsterEventType.RUN_FAILURE:
            error = getattr(event.event_specific_data, "error", None)
            other.append(_innermost(error) if error else (entry.user_message or "").strip())
        elif getattr(event.event_specific_data, "error", None) is not None:
            other.append(_innermost(event.event_specific_data.error))
    reasons = steps or [r for r in other if r] or [f"ended {run.status.value} without an error in its event log"]
    return "failed: " + "; ".join(dict.fromkeys(reasons))


def _innermost(error) -> str:
    while getattr(error, "cause", None) is not None:
        error = error.cause
    return error.message.strip() if error is not None else "unknown error"


class RunSession:
    """Submits runs to `instance` for the code location of `workspace_file` and waits for them.

    The workspace (a code server for the location) loads at the first submission; the daemon,
    where one is needed, starts right after it. Leaving the session (a failure, Ctrl-C) cancels
    the runs it submitted that are still going, lets them tear down, and stops the daemon it
    started.
    """

    def __init__(self, instance: dg.DagsterInstance, workspace_file: Path = WORKSPACE_FILE, location: str | None = None,
                 log: Callable[[str], None] = print, poll_s: float = 1.0):  # fmt: skip
        if instance.is_ephemeral:
            raise ValueError("runs go to a persistent Dagster instance: set DAGSTER_HOME (eagle-assets does: ./.dagster_home)")
        self.instance, self.workspace_file, self.location, self.log, self.poll_s = instance, Path(workspace_file), location, log, poll_s
        self._workspace: WorkspaceProcessContext | None = None
        self._daemon: DaemonProcess | None = None
        self._daemon_stack = ExitStack()
        self._open: dict[str, str] = {}  # run id -> label, for runs not yet seen finished
        self._cursors: dict[str, str | None] = {}

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._open:
                self._cancel(list(self._open))
        finally:
            try:
                self._daemon = None
                self._daemon_stack.close()
            finally:
                if self._workspace is not None:
                    self._workspace.__exit__(None, None, None)
                    self._workspace = None

    @property
    def daemon_pid(self) -> int | None:
        """The pid (and process group) of the daemon this session started, if it did."""
        return self._daemon.process.pid if self._daemon is not None else None

    # -- submitting ------------------------------------------------------------------------

    def submit(self, spec: RunSpec) -> dg.DagsterRun:
        """Create the run for `spec` in the instance and submit it to the run coordinator."""
        request = self._request_context()
        location = request.get_code_location(self.location)
        [repo] = location.get_repositories().values()
        selector = JobSubsetSelector(
            location_name=location.name,
            repository_name=repo.name,
            job_name=spec.job,
            op_selection=None,
            asset_selection=[dg.AssetKey.from_user_string(a) for a in spec.assets] if spec.assets else None,
        )
        remote_job = location.get_job(selector)
        run_config = dict(spec.run_config)
        plan = location.get_execution_plan(remote_job, run_config, step_keys_to_execute=None, known_state=None, instance=self.instance)
        tags = {**remote_job.tags, **spec.tags, **({PARTITION_TAG: spec.partition} if spec.partition is not None else {})}
        run = self.instance.create_run(
            job_name=spec.job,
            run_id=None,
            run_config=run_config,
            status=dg.DagsterRunStatus.NOT_STARTED,
            tags=tags,
            root_run_id=None,
            parent_run_id=None,
            step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute,
            execution_plan_snapshot=plan.execution_plan_snapshot,
            job_snapshot=remote_job.job_snapshot,
            parent_job_snapshot=remote_job.parent_job_snapshot,
            asset_selection=selector.asset_selection,
            asset_check_selection=None,
            resolved_op_selection=None,
            op_selection=None,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
            asset_graph=repo.asset_graph,
        )
        run = self.instance.submit_run(run.run_id, request)
        self._open[run.run_id] = spec.label
        return run

    def _request_context(self):
        if self._workspace is None:
            self._workspace = WorkspaceProcessContext(self.instance, WorkspaceFileTarget(paths=[str(self.workspace_file)]))
        request = self._workspace.create_request_context()
        names = list(request.get_code_location_entries())
        if self.location is None:
            if len(names) != 1:
                raise ValueError(f"{self.workspace_file} names {len(names)} code locations ({', '.join(names)}): say which one")
            self.location = names[0]
        if request.has_code_location_error(self.location):
            error = request.get_code_location_error(self.location)
            raise RuntimeError(f"the code location {self.location} of {self.workspace_file} did not load: {_innermost(error)}")
        if not request.has_code_location(self.location):
            raise ValueError(f"{self.workspace_file} has no code location {self.location!r}; it has {', '.join(names)}")
        return request

    # -- running ---------------------------------------------------------------------------

    def run(self, specs: Sequence[RunSpec]) -> list[dg.DagsterRun]:
        """Submit every spec (they run side by side, as the queue allows), wait for all of them,
        and return their finished runs. The first run that fails stops the others (cancelled,
        then waited for) and raises RunFailed with its error."""
        if not specs:
            return []
        runs = []
        for spec in specs:
            run = self.submit(spec)
            self.log(f"materialising {spec.label} (run {run.run_id})")
            runs.append(run)
        self._ensure_daemon()
        return self.wait([r.run_id for r in runs])

    def wait(self, run_ids: Sequence[str]) -> list[dg.DagsterRun]:
        """Wait until every run in `run_ids` has finished; raise RunFailed at the first that did not succeed."""
        pending = list(run_ids)
        done: dict[str, dg.DagsterRun] = {}
        while pending:
            self._check_daemon()
            for run_id in list(pending):
                self._relay(run_id)
                run = self.instance.get_run_by_id(run_id)
                if run is None or run.status not in FINISHED:
                    continue
                pending.remove(run_id)
                label = self._open.pop(run_id, run_id)
                if run.status != dg.DagsterRunStatus.SUCCESS:
                    failure = RunFailed(label, run_id, run_error(self.instance, run))
                    self._cancel([r for r in pending if r in self._open])
                    raise failure
                self.log(f"done: {label} (run {run_id})")
                done[run_id] = run
            if pending:
                time.sleep(self.poll_s)
        return [done[r] for r in run_ids]

    def _relay(self, run_id: str) -> None:
        """Pass the run's new log messages (the assets' own, INFO and above) on to `log`."""
        cursor = self._cursors.get(run_id)
        while True:
            page = self.instance.get_records_for_run(run_id, cursor=cursor, limit=500)
            for record in page.records:
                entry = record.event_log_entry
                if entry.dagster_event is None and entry.level >= logging.INFO and entry.user_message:
                    step = f" {entry.step_key}" if entry.step_key else ""
                    self.log(f"  [{self._open.get(run_id, run_id[:8])}{step}] {entry.user_message}")
            cursor = page.cursor
            if not page.has_more:
                break
        self._cursors[run_id] = cursor

    def _cancel(self, run_ids: Sequence[str]) -> None:
        """Cancel runs still queued or going, and give them STOP_WAIT_S to tear down."""
        for run_id in run_ids:
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status not in FINISHED:
                self.log(f"cancelling {self._open.get(run_id, run_id)} (run {run_id})")
                try:
                    self.instance.run_coordinator.cancel_run(run_id)
                except Exception as exc:  # a run whose worker is already gone: mark it below
                    self.log(f"could not cancel run {run_id} cleanly: {exc}")
        deadline = time.monotonic() + STOP_WAIT_S
        for run_id in run_ids:
            while time.monotonic() < deadline:
                run = self.instance.get_run_by_id(run_id)
                if run is None or run.status in FINISHED:
                    break
                time.sleep(self.poll_s)
            else:
                run = self.instance.get_run_by_id(run_id)
                if run is not None and run.status not in FINISHED:
                    self.instance.report_run_canceled(run, message="eagle-assets stopped waiting for it to tear down")
            self._open.pop(run_id, None)

    # -- the daemon ------------------------------------------------------------------------

    def _ensure_daemon(self) -> None:
        if self._daemon is None and not daemon_alive(self.instance):
            self._daemon = self._daemon_stack.enter_context(dagster_daemon(self.instance, self.workspace_file, self.log))

    def _check_daemon(self) -> None:
        if self._daemon is None:
            if not daemon_alive(self.instance) and any(self._queued()):
                self.log("no Dagster daemon dequeues runs any more")  # the one this session relied on stopped
                self._ensure_daemon()
            return
        code = self._daemon.process.poll()
        if code is not None:
            raise RuntimeError(f"the Dagster daemon exited with code {code} while runs were waiting; its log "
                               f"({self._daemon.log_file}) ends:\n{self._daemon.log_tail()}")  # fmt: skip

    def _queued(self):
        for run_id in self._open:
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status == dg.DagsterRunStatus.QUEUED:
                yield run_id


@dataclass
class DaemonProcess:
    """A `dagster-daemon run` started here: its process (the leader of its own group) and log."""

    process: subprocess.Popen
    log_file: Path

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:]) if self.log_file.is_file() else "(no log)"


@contextmanager
def dagster_daemon(instance: dg.DagsterInstance, workspace_file: Path = WORKSPACE_FILE,
                   log: Callable[[str], None] = print) -> Iterator[DaemonProcess]:  # fmt: skip
    """`dagster-daemon run` for `instance` and the code location of `workspace_file`, for the
    duration of the block: schedules, sensors, the run queue and run monitoring, as in a
    deployment. It runs in its own process group, so that one signal stops the daemon, its code
    server and any run worker they started, and a Ctrl-C in this terminal reaches this process
    alone; leaving the block stops the whole group (SIGTERM, then SIGKILL)."""
    exe = Path(sys.executable).with_name("dagster-daemon")
    exe = str(exe) if exe.is_file() else shutil.which("dagster-daemon")
    if exe is None:
        raise RuntimeError(f"no dagster-daemon beside {sys.executable} nor on PATH: reinstall the project (pip install -e .)")
    home = Path(instance.root_directory)
    # Not $DAGSTER_HOME/logs: that folder is Dagster's telemetry queue, which a running daemon
    # renames and uploads (dagster/_core/telemetry_upload.py), telemetry setting or not.
    folder = home / DAEMON_LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    log_file = folder / f"daemon-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    with open(log_file, "ab") as out:
        proc = subprocess.Popen([exe, "run", "-w", str(workspace_file)], cwd=PROJECT_ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    log(f"started a Dagster daemon (pid {proc.pid}; log {log_file})")
    try:
        yield DaemonProcess(proc, log_file)
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # The daemon's code server and run workers are in its group: none may outlive it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
