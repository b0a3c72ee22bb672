"""The retraining schedule ticked by the real Dagster daemon, against a real instance.

The toy graph is built in full, then `dagster-daemon run` starts (the same `dagster_daemon` that
`eagle-assets run` uses) over a code location in which b's setting has changed (a new code
version: b is stale, nothing else is) and the project's `retrain_stale` schedule runs every
minute. At the next minute the scheduler evaluates it, the daemon turns its run request into a
run (re-checking staleness: `stale_assets_only`), queues it and launches it. The run must rebuild
b and nothing else; what b's new content makes stale below it is the follow-up sensor's work.
"""

from __future__ import annotations

import time

import dagster as dg

from eagle_assets.defs.instance_runs import FINISHED, dagster_daemon
from eagle_assets.defs.schedules import RETRAIN_TAG
from eagle_assets_tests.defs.toy_graph import PARTITIONS, make_assets, materialization_count

SCHEDULE_TAG = "dagster/schedule_name"
WAIT_S = 240  # the next minute, the daemon's and the run worker's start, on a loaded 2-core host


def test_a_real_daemon_tick_of_the_retrain_schedule_rebuilds_exactly_the_stale_asset(toy_location, monkeypatch):
    instance, data = toy_location.instance, toy_location.data
    assets = make_assets(data)
    dg.materialize(assets, selection=["a", "b"], instance=instance)
    for partition in PARTITIONS.get_partition_keys():
        dg.materialize(assets, selection=["c"], partition_key=partition, instance=instance)
    dg.materialize(assets, selection=["d"], instance=instance)

    monkeypatch.setenv("EAGLE_TOY_CRON", "* * * * *")
    monkeypatch.setenv("EAGLE_TOY_B_SCALE", "2")  # the daemon's code location: b has a new code version
    lines: list[str] = []
    with dagster_daemon(instance, toy_location.workspace, log=lines.append) as daemon:
        deadline = time.monotonic() + WAIT_S
        while True:
            runs = instance.get_runs(dg.RunsFilter(tags={SCHEDULE_TAG: "retrain_stale"}), ascending=True)
            if runs and runs[0].status in FINISHED:
                break
            assert daemon.process.poll() is None, f"the daemon exited; its log ends:\n{daemon.log_tail()}"
            assert time.monotonic() < deadline, f"no scheduled run finished in {WAIT_S} s; the daemon's log ends:\n{daemon.log_tail()}"
            time.sleep(1)
    run = runs[0]
    assert run.status == dg.DagsterRunStatus.SUCCESS, daemon.log_tail()
    assert run.asset_selection == {dg.AssetKey("b")}
    assert run.tags[RETRAIN_TAG].startswith("schedule-")
    assert [e.dagster_event.event_type for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED)] == [
        dg.DagsterEventType.RUN_ENQUEUED
    ]
    # Exactly the stale asset was rebuilt, with the daemon's code: b's new setting doubled a's text.
    assert materialization_count(instance, "b") == 2 and (data / "b.txt").read_text() == "hellohello"
    assert materialization_count(instance, "a") == materialization_count(instance, "d") == 1
    assert all(materialization_count(instance, "c", p) == 1 for p in PARTITIONS.get_partition_keys())
