"""Runs submitted to a real instance and launched by the real daemon: what `eagle-assets run` does.

Each test gets an instance with the project's own dagster.yaml (its run queue, run launcher and
limits) and the toy graph as a code location (`toy_location.py`), and drives it through the same
`RunSession` that `materialize_graph` uses. The session starts `dagster-daemon run`, which
dequeues the runs and launches each one as a process of its code server; the partitioned stage
runs under the multiprocess executor, the chained ones in the run's own process (defs/jobs.py).
The toy graph stands in for the real one, whose partitions need a corpus and a vLLM server: the
session, the queue, the launcher and the executors are the same for both.
"""

from __future__ import annotations

import os

import dagster as dg
import pytest
from dagster._core.definitions.selector import JobSubsetSelector
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from eagle_assets.defs.instance_runs import RunFailed, RunSession, RunSpec
from eagle_assets.defs.runner import resource_run_config
from eagle_assets_tests.defs.conftest import live_group_members
from eagle_assets_tests.defs.toy_graph import BOUND_SERVER, PARTITIONS, STAGES, make_assets, materialization_count

STEP_EVENTS = {dg.DagsterEventType.RUN_START, dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS,
               dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_STARTING}  # fmt: skip


def step_times(instance: dg.DagsterInstance, run_id: str, step: str) -> dict:
    """When the run's worker started, and when and in which process `step` started and ended."""
    out = {}
    for entry in instance.all_logs(run_id, of_type=STEP_EVENTS):
        event = entry.dagster_event
        if event.step_key in (None, step):
            out[event.event_type] = (entry.timestamp, event.pid)
    return out


def test_partition_runs_are_queued_launched_by_the_daemon_and_overlap_under_the_multiprocess_executor(toy_location, monkeypatch):
    monkeypatch.setenv("EAGLE_TOY_C_SECONDS", "4")
    instance = toy_location.instance
    lines: list[str] = []
    # What runner.shared_extraction_server hands the hidden-state runs: a server URL in the resource's run config.
    server = resource_run_config("inference_server", BOUND_SERVER, extraction_url="http://127.0.0.1:9/extraction")
    with RunSession(instance, toy_location.workspace, log=lines.append) as session:
        [first] = session.run([RunSpec("first_job", ("a", "b"))])
        shards = session.run([RunSpec("shards_job", ("c",), partition=p, run_config=server) for p in PARTITIONS.get_partition_keys()])
        daemon = session.daemon_pid
    assert daemon is not None and any(line.startswith(f"started a Dagster daemon (pid {daemon}") for line in lines)
    assert live_group_members(daemon) == []  # the daemon's whole process group is gone

    for run in [first, *shards]:
        assert run.status == dg.DagsterRunStatus.SUCCESS
        events = step_times(instance, run.run_id, "c")
        # Through the queue: enqueued by the session, then handed to the run launcher by the daemon.
        assert events[dg.DagsterEventType.RUN_ENQUEUED][0] < events[dg.DagsterEventType.RUN_STARTING][0]
    assert [r.tags.get("dagster/partition") for r in shards] == PARTITIONS.get_partition_keys()
    assert {f"done: c [partition {p}] (run {r.run_id})" for p, r in zip(PARTITIONS.get_partition_keys(), shards)} <= set(lines)

    # The chained stage ran its steps in the run's own process; each partition's step in a process of its own.
    first_events = step_times(instance, first.run_id, "a")
    assert first_events[dg.DagsterEventType.STEP_START][1] == first_events[dg.DagsterEventType.RUN_START][1]
    spans = []
    for run in shards:
        events = step_times(instance, run.run_id, "c")
        (start, step_pid), (end, _) = events[dg.DagsterEventType.STEP_START], events[dg.DagsterEventType.STEP_SUCCESS]
        assert step_pid != events[dg.DagsterEventType.RUN_START][1]
        assert end - start >= 4
        spans.append((start, end))
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"the partition runs did not overlap: {spans}"

    for p in PARTITIONS.get_partition_keys():
        assert materialization_count(instance, "c", p) == 1
        assert (toy_location.data / f"c{p}.txt").read_text() == f"{p}:0:hello"
        # The run config reached the run's resource, with every other bound value kept.
        record = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("c"), asset_partitions=[p]), limit=1).records[0]
        seen = record.asset_materialization.metadata["resources"].value["inference_server"]
        assert seen == {**BOUND_SERVER.model_dump(), "extraction_url": "http://127.0.0.1:9/extraction"}
        assert (seen["target"], seen["port"], seen["kv_cache_gib"]) == ("toy-target", 8123, 3)


def test_the_first_failed_run_stops_the_stage_with_its_error_and_leaves_nothing_running(toy_location, monkeypatch):
    # Long enough that the other partition is still going when its neighbour fails, however
    # slowly a loaded host starts run workers; cancelled, it ends at once.
    monkeypatch.setenv("EAGLE_TOY_C_SECONDS", "300")
    instance = toy_location.instance
    lines: list[str] = []
    failing = {"ops": {"c": {"config": {"salt": -1}}}}
    dg.materialize(make_assets(toy_location.data), selection=["a", "b"], instance=instance)  # the stage before, in process
    with RunSession(instance, toy_location.workspace, log=lines.append) as session:
        with pytest.raises(
            RunFailed, match=r"^c \[partition 1\] \(run [0-9a-f-]+\) failed: step c: ValueError: salt -1 < 0: a failing run for tests$"
        ) as failed:
            session.run([RunSpec("shards_job", ("c",), partition="0"), RunSpec("shards_job", ("c",), partition="1", run_config=failing)])
    assert instance.get_run_by_id(failed.value.run_id).status == dg.DagsterRunStatus.FAILURE
    # The other partition was cancelled rather than waited for.
    [other] = [r for r in instance.get_runs(dg.RunsFilter(job_name="shards_job")) if r.run_id != failed.value.run_id]
    assert other.status == dg.DagsterRunStatus.CANCELED
    assert any(line.startswith("cancelling c [partition 0]") for line in lines)
    assert materialization_count(instance, "c", "0") == 0
    # The toy_location fixture then checks that no daemon, code server or run worker is left.


def test_a_stale_only_wave_goes_to_the_instance_and_rebuilds_exactly_the_stale_asset(toy_location, monkeypatch):
    """What `eagle-assets run --stale-only` does (runner.materialize_stale): staleness.run_stale's
    waves, each submitted through the session. b gets a new code version with the same content."""
    from eagle_assets.defs.runner import wave_submitter
    from eagle_assets.defs.staleness import STALE_ONLY_TAG, Step, run_stale

    instance, data = toy_location.instance, toy_location.data
    built = make_assets(data)
    dg.materialize(built, selection=["a", "b"], instance=instance)
    for partition in PARTITIONS.get_partition_keys():
        dg.materialize(built, selection=["c"], partition_key=partition, instance=instance)
    dg.materialize(built, selection=["d"], instance=instance)
    monkeypatch.setenv("EAGLE_TOY_B_NOTE", "second")  # the code location's b, as the one asked about below
    with RunSession(instance, toy_location.workspace, log=lambda m: None) as session:
        done = run_stale(make_assets(data, b_note="second"), STAGES, instance, {}, log=lambda m: None, execute=wave_submitter(session))
    assert done.steps == [Step("first_job", ("b",), None)]
    [run] = done.results
    assert run.status == dg.DagsterRunStatus.SUCCESS and run.asset_selection == {dg.AssetKey("b")}
    assert run.tags[STALE_ONLY_TAG] == "true" and run.tags["eagle_assets/stage"] == "first_job"
    assert [materialization_count(instance, k) for k in "abd"] == [1, 2, 1]  # identical content: nothing below is rebuilt


def test_private_dagster_names_the_session_uses_keep_their_shape_and_bad_requests_are_refused(toy_location):
    """instance_runs.py imports these from dagster._core (no public API submits a run of a code
    location's job): they and the calls made on them must still exist in the pinned Dagster."""
    import inspect

    assert dg.__version__ == "1.13.27"
    assert {"location_name", "repository_name", "job_name", "op_selection", "asset_selection"} <= set(inspect.signature(JobSubsetSelector).parameters)
    with WorkspaceProcessContext(toy_location.instance, WorkspaceFileTarget(paths=[str(toy_location.workspace)])) as context:
        request = context.create_request_context()
        assert list(request.get_code_location_entries()) == ["toy"] and not request.has_code_location_error("toy")
        location = request.get_code_location("toy")
        [repo] = location.get_repositories().values()
        job = location.get_job(JobSubsetSelector("toy", repo.name, "shards_job", None, asset_selection=[dg.AssetKey("c")]))
        assert job.get_remote_origin().location_name == "toy"
        assert job.get_python_origin().repository_origin.code_pointer.module == "eagle_assets_tests.defs.toy_location"
    assert {"asset_selection", "remote_job_origin", "job_code_origin", "asset_graph"} <= set(
        inspect.signature(dg.DagsterInstance.create_run).parameters
    )

    with RunSession(toy_location.instance, toy_location.workspace, log=lambda m: None) as session:
        with pytest.raises(Exception, match="no_such_job"):
            session.submit(RunSpec("no_such_job"))
    with dg.DagsterInstance.ephemeral() as ephemeral:
        with pytest.raises(ValueError, match="persistent Dagster instance: set DAGSTER_HOME"):
            RunSession(ephemeral)


def test_relative_paths_in_the_environment_become_absolute_for_the_daemon_and_runs(tmp_path, monkeypatch):
    from eagle_assets.defs.runner import absolute_path_variables

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-target").mkdir()
    monkeypatch.setenv("EAGLE_ASSETS_DATA", "data")
    monkeypatch.setenv("EAGLE_ASSETS_CACHE", "s3://bucket/cache")
    monkeypatch.setenv("EAGLE_ASSETS_TARGET", "my-target")
    monkeypatch.setenv("EAGLE_ASSETS_PROMPTS_URL", "incoming")  # no such folder here: left as it is
    absolute_path_variables()
    assert os.environ["EAGLE_ASSETS_DATA"] == str(tmp_path / "data")
    assert os.environ["EAGLE_ASSETS_CACHE"] == "s3://bucket/cache"
    assert os.environ["EAGLE_ASSETS_TARGET"] == str(tmp_path / "my-target")
    assert os.environ["EAGLE_ASSETS_PROMPTS_URL"] == "incoming"
