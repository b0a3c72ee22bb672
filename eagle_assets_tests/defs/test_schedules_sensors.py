"""The retraining schedule, its follow-up sensor, the prompt-file sensor and the automation
option, evaluated against real Dagster instances.

The schedule and the follow-up sensor run on the toy graph (`toy_graph.py`: the real graph's
shape and versioning, cheap assets); what they request is then launched as a real run, as
the daemon would, and the next tick is evaluated on the result. The prompt-file sensor is
the project's own, built for the real stages, watching a real folder.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import dagster as dg
import pytest

from eagle_assets.defs import build_definitions
from eagle_assets.defs.schedules import RETRAIN_TAG, build_retrain_schedule, default_schedules, is_valid_cron
from eagle_assets.defs.sensors import build_followup_sensor, build_prompt_files_sensor, stale_condition, with_automation
from eagle_assets.defs.staleness import resolved_config
from eagle_assets.run_presets import run_config
from eagle_assets_tests.defs.toy_graph import STAGES, make_assets

SCHEDULE = build_retrain_schedule(cron="0 3 * * 0", stages=STAGES)
SUNDAY = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
FOLLOWUP = build_followup_sensor(stages=STAGES)


def _repo(assets):
    return dg.Definitions(assets=assets, schedules=[SCHEDULE], sensors=[FOLLOWUP]).get_repository_def()


# Evaluation contexts are closed as the daemon closes them: one left open can enter an instance
# of its own and leave Dagster's current defs-state storage pointing at it after it is collected
# ("Attempted to resolve undefined DagsterInstance weakref" in a later test).
def _schedule_tick(assets, instance):
    with dg.build_schedule_context(instance=instance, repository_def=_repo(assets), scheduled_execution_time=SUNDAY) as context:
        return SCHEDULE.evaluate_tick(context)


def _followup_tick(assets, instance):
    with dg.build_sensor_context(instance=instance, repository_def=_repo(assets)) as context:
        return FOLLOWUP.evaluate_tick(context)


def _launch(assets, instance, requests, fail_partition=None):
    """Run what was requested, as the daemon would launch it."""
    for r in requests:
        config = r.run_config
        if fail_partition is not None and r.partition_key == fail_partition:
            config = {"ops": {"c": {"config": {"salt": -1}}}}
        dg.materialize(assets, selection=r.asset_selection, partition_key=r.partition_key, run_config=config,
                       tags=r.tags, instance=instance, raise_on_error=False)  # fmt: skip


def _asked(requests):
    return [(tuple(k.to_user_string() for k in r.asset_selection), r.partition_key, r.stale_assets_only) for r in requests]


def test_schedule_starts_a_wave_that_the_followup_carries_to_exactly_the_stale_assets(built):
    data, instance = built
    assets = make_assets(data)
    assert "up to date" in _schedule_tick(assets, instance).skip_message
    assert "not part of a retraining wave" in _followup_tick(assets, instance).skip_message

    bumped = make_assets(data, b_scale=2)  # b's setting changes: b and what depends on it
    tick = _schedule_tick(bumped, instance)
    assert _asked(tick.run_requests) == [(("b",), None, True)]  # the daemon re-checks staleness at launch
    wave = tick.run_requests[0].tags[RETRAIN_TAG]
    assert wave == "schedule-20261129T0300"
    _launch(bumped, instance, tick.run_requests)

    # b's content changed: both partitions of c, one run each (the daemon's stale filter would drop them).
    tick = _followup_tick(bumped, instance)
    assert _asked(tick.run_requests) == [(("c",), "0", False), (("c",), "1", False)]
    assert {r.tags[RETRAIN_TAG] for r in tick.run_requests} == {wave}
    _launch(bumped, instance, tick.run_requests)

    tick = _followup_tick(bumped, instance)
    assert _asked(tick.run_requests) == [(("d",), None, True)]
    _launch(bumped, instance, tick.run_requests)
    assert "complete" in _followup_tick(bumped, instance).skip_message
    assert (data / "d.txt").read_text() == "0:0:hellohello|1:0:hellohello!"
    counts = {k: len(instance.fetch_materializations(dg.AssetKey(k), limit=100).records) for k in "abcd"}
    assert counts == {"a": 1, "b": 2, "c": 4, "d": 2}


def test_identical_rebuild_ends_the_wave_and_a_failed_run_stops_it(built):
    data, instance = built
    renamed = make_assets(data, b_note="second")  # new code version, same bytes
    tick = _schedule_tick(renamed, instance)
    _launch(renamed, instance, tick.run_requests)
    assert "complete" in _followup_tick(renamed, instance).skip_message

    bumped = make_assets(data, b_scale=3)
    _launch(bumped, instance, _schedule_tick(bumped, instance).run_requests)
    _launch(bumped, instance, _followup_tick(bumped, instance).run_requests, fail_partition="1")
    skip = _followup_tick(bumped, instance).skip_message
    assert "stopped" in skip and "did not succeed" in skip


def test_schedule_skips_while_a_run_is_queued_or_going(built):
    data, instance = built
    bumped = make_assets(data, b_scale=2)
    for status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED):
        busy = instance.add_run(dg.DagsterRun(job_name="first_job", run_id=f"{status.value[:1].lower()}" * 36, status=status))
        assert (
            _schedule_tick(bumped, instance).skip_message
            == f"run {busy.run_id} (first_job) is {status.value.lower()}: it may be rebuilding what is stale"
        )
        instance.report_run_canceled(busy)
    assert _asked(_schedule_tick(bumped, instance).run_requests) == [(("b",), None, True)]


def test_prompt_file_sensor_grows_the_corpus_one_new_file_at_a_time(tmp_path, instance):
    folder = tmp_path / "incoming"
    folder.mkdir()
    sensor = build_prompt_files_sensor(str(folder))
    graph = build_definitions(automation=False).resolve_asset_graph()

    def tick(cursor=None):
        with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
            return sensor.evaluate_tick(context)

    assert "no new prompt files" in tick().skip_message
    (folder / "week1.jsonl").write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    (folder / "notes.txt").write_text("not prompts")
    first = tick()
    [request] = first.run_requests
    assert [k.to_user_string() for k in request.asset_selection] == ["prompts", "synthetic_corpus", "vocab_mapping"]
    prompts = request.run_config["ops"]["prompts"]["config"]
    assert prompts["source"] == "file" and prompts["file_url"].endswith("incoming/week1.jsonl")
    # Never-built assets get the default preset's settings, and the whole config fits the real assets.
    assert request.run_config["ops"]["synthetic_corpus"] == run_config("smollm2-default")["ops"]["synthetic_corpus"]
    for op, body in request.run_config["ops"].items():
        resolved_config(graph, dg.AssetKey(op), body["config"])
    assert request.tags[RETRAIN_TAG].startswith("prompts-week1.jsonl-")

    assert "no new prompt files" in tick(first.cursor).skip_message
    (folder / "week2.parquet").write_bytes(b"PAR1")
    for status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED):  # one not yet started would write the same store
        busy = instance.add_run(dg.DagsterRun(job_name="corpus_job", run_id=status.value[:1].lower() * 36, status=status))
        assert f"wait for run {busy.run_id}" in tick(first.cursor).skip_message
        instance.report_run_canceled(busy)
    second = tick(first.cursor)
    assert second.run_requests[0].run_config["ops"]["prompts"]["config"]["file_url"].endswith("week2.parquet")
    assert sorted(json.loads(second.cursor)) == sorted(
        [prompts["file_url"], second.run_requests[0].run_config["ops"]["prompts"]["config"]["file_url"]]
    )


def test_prompt_file_sensor_names_a_missing_folder_and_an_unset_url(tmp_path, instance):
    with dg.build_sensor_context(instance=instance) as context:
        assert "EAGLE_ASSETS_PROMPTS_URL is not set" in build_prompt_files_sensor(None).evaluate_tick(context).skip_message
        with pytest.raises(Exception, match=r"prompt folder .*nowhere does not exist: create it or fix EAGLE_ASSETS_PROMPTS_URL"):
            build_prompt_files_sensor(str(tmp_path / "nowhere")).evaluate_tick(context)


def test_automation_rebuilds_on_new_content_or_code_and_not_on_identical_content(built):
    data, instance = built
    assets = with_automation(make_assets(data))

    def requested(assets, cursor):
        result = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=cursor)
        return sorted(r.key.to_user_string() for r in result.results if r.true_subset.size), result.cursor

    asked, cursor = requested(assets, None)
    assert asked == []
    dg.materialize(assets, selection=["a"], instance=instance, run_config={"ops": {"a": {"config": {"text": "bye"}}}})
    asked, cursor = requested(assets, cursor)
    assert asked == ["b"]  # a's content changed; c and d wait for b
    dg.materialize(assets, selection=["a"], instance=instance, run_config={"ops": {"a": {"config": {"text": "bye"}}}})
    asked, cursor = requested(assets, cursor)
    assert asked == []  # the same bytes again: nothing below it is rebuilt
    asked, cursor = requested(with_automation(make_assets(data, b_scale=2)), cursor)
    assert asked == ["b"]


def test_project_definitions_carry_schedule_sensors_and_optional_automation():
    plain = build_definitions(automation=False).get_repository_def()
    assert [s.name for s in plain.schedule_defs] == ["retrain_stale"]
    assert plain.get_schedule_def("retrain_stale").cron_schedule == "0 3 * * 0"
    assert sorted(s.name for s in plain.sensor_defs) == ["new_prompt_files", "retrain_followup"]
    assert all(plain.assets_defs_by_key[k].automation_conditions_by_key.get(k) is None for k in plain.assets_defs_by_key)

    auto = build_definitions(automation=True).get_repository_def()
    assert auto.schedule_defs == []
    sensor = auto.get_sensor_def("eagle3_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert {a.automation_conditions_by_key[k].get_label() for k, a in auto.assets_defs_by_key.items()} == {stale_condition().get_label()}


def test_the_retrain_cron_is_refused_where_dagster_would_refuse_the_schedule(monkeypatch):
    assert [is_valid_cron(c) for c in ("0 3 * * 0", "@daily", "* * * * * *", "0 0 30 2 *", "every sunday")] == [True, True, False, False, False]
    monkeypatch.setenv("EAGLE_ASSETS_RETRAIN_CRON", "0 0 30 2 *")  # five fields, but no such day
    with pytest.raises(ValueError, match=r"EAGLE_ASSETS_RETRAIN_CRON='0 0 30 2 \*' is not a cron string of five fields"):
        default_schedules()
