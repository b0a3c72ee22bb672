"""The automation conditions, the prompt-file sensor and the definitions that carry them,
evaluated against real Dagster instances.

The automation conditions run on the toy graph (`toy_graph.py`: the real graph's versioning,
cheap assets), evaluated by Dagster's own evaluator as the daemon's automation sensor evaluates
them; the real graph under a real daemon is test_ui_browser.py's. The prompt-file sensor is the
project's own, watching a real folder.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from eagle_assets.defs.graph import build_definitions
from eagle_assets.defs.sensors import AUTOMATION_RUN_TAGS, RETRAIN_TAG, build_prompt_files_sensor, stale_condition, with_automation
from eagle_assets_tests.defs.toy_graph import make_assets


def test_automation_rebuilds_on_new_content_or_code_down_the_graph_and_not_on_identical_content(tmp_path, instance):
    def requested(assets, cursor):
        result = dg.evaluate_automation_conditions(defs=assets, instance=instance, cursor=cursor)
        return sorted(r.key.to_user_string() for r in result.results if r.true_subset.size), result.cursor

    assets = with_automation(make_assets(tmp_path))
    asked, cursor = requested(assets, None)
    assert asked == []  # a graph never built is not built by the automation
    dg.materialize(assets, instance=instance)
    asked, cursor = requested(assets, cursor)
    assert asked == []
    dg.materialize(assets, selection=["a"], instance=instance, run_config={"ops": {"a": {"config": {"text": "bye"}}}})
    asked, cursor = requested(assets, cursor)
    assert asked == ["b"]  # a's content changed; the c's and d wait for b
    dg.materialize(assets, selection=["b"], instance=instance)
    asked, cursor = requested(assets, cursor)
    assert asked == ["c0", "c1"]  # and so on down, tick by tick
    dg.materialize(assets, selection=["c0", "c1"], instance=instance)
    asked, cursor = requested(assets, cursor)
    assert asked == ["d"]
    dg.materialize(assets, selection=["d"], instance=instance)
    dg.materialize(assets, selection=["a"], instance=instance, run_config={"ops": {"a": {"config": {"text": "bye"}}}})
    asked, cursor = requested(assets, cursor)
    assert asked == []  # the same bytes again: nothing below it is rebuilt
    asked, cursor = requested(with_automation(make_assets(tmp_path, b_note="second")), cursor)
    assert asked == ["b"]  # a new code version of b alone


def test_prompt_file_sensor_grows_the_corpus_one_new_file_at_a_time(tmp_path, instance):
    folder = tmp_path / "incoming"
    folder.mkdir()
    sensor = build_prompt_files_sensor(str(folder))

    def tick(cursor=None):
        with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
            return sensor.evaluate_tick(context)

    assert "no new prompt files" in tick().skip_message
    (folder / "week1.jsonl").write_text(json.dumps({"prompt": "Name three rivers."}) + "\n")
    (folder / "notes.txt").write_text("not prompts")
    first = tick()
    [request] = first.run_requests
    assert [k.to_user_string() for k in request.asset_selection] == ["prompts", "synthetic_corpus"]
    # Only the prompt source travels: every other setting is the code location's (the assets' defaults).
    assert request.run_config == {
        "ops": {"prompts": {"config": {"source": "file", "file_url": request.run_config["ops"]["prompts"]["config"]["file_url"]}}}
    }
    assert request.run_config["ops"]["prompts"]["config"]["file_url"].endswith("incoming/week1.jsonl")
    assert request.tags[RETRAIN_TAG].startswith("prompts-week1.jsonl-")

    assert "no new prompt files" in tick(first.cursor).skip_message
    (folder / "week2.parquet").write_bytes(b"PAR1")
    for status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED):  # one not yet started would write the same store
        busy = instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id=status.value[:1].lower() * 36, status=status))
        assert f"wait for run {busy.run_id}" in tick(first.cursor).skip_message
        instance.report_run_canceled(busy)
    second = tick(first.cursor)
    assert second.run_requests[0].run_config["ops"]["prompts"]["config"]["file_url"].endswith("week2.parquet")
    assert len(json.loads(second.cursor)) == 2


def test_prompt_file_sensor_names_a_missing_folder_and_an_unset_url(tmp_path, instance):
    with dg.build_sensor_context(instance=instance) as context:
        assert "EAGLE_ASSETS_PROMPTS_URL is not set" in build_prompt_files_sensor(None).evaluate_tick(context).skip_message
        with pytest.raises(Exception, match=r"prompt folder .*nowhere does not exist: create it or fix EAGLE_ASSETS_PROMPTS_URL"):
            build_prompt_files_sensor(str(tmp_path / "nowhere")).evaluate_tick(context)


def test_project_definitions_carry_automation_by_default_and_no_schedule_or_partitions():
    auto = build_definitions(automation=True).get_repository_def()
    assert auto.schedule_defs == []
    sensor = auto.get_sensor_def("eagle3_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING and sensor.run_tags == AUTOMATION_RUN_TAGS
    assert sorted(s.name for s in auto.sensor_defs) == ["eagle3_automation", "new_prompt_files"]
    assert {a.automation_conditions_by_key[k].get_label() for k, a in auto.assets_defs_by_key.items()} == {stale_condition().get_label()}
    assert not any(auto.asset_graph.get(k).is_partitioned for k in auto.asset_graph.get_all_asset_keys())
    checks = {key: auto.asset_graph.get(key).automation_condition for key in auto.asset_graph.asset_check_keys}
    drafter = {key: c for key, c in checks.items() if key.asset_key.to_user_string() == "drafter_checkpoint"}
    assert drafter and {c.get_label() for c in drafter.values()} == {"after its asset"}, checks

    plain = build_definitions(automation=False).get_repository_def()
    assert [s.name for s in plain.sensor_defs] == ["new_prompt_files"]
    assert all(plain.assets_defs_by_key[k].automation_conditions_by_key.get(k) is None for k in plain.assets_defs_by_key)


def test_the_automation_sensor_evaluates_as_often_as_its_setting_says_and_refuses_less_than_the_daemons_loop(monkeypatch):
    from eagle_assets.defs.sensors import AUTOMATION_INTERVAL_ENV, automation_sensor
    from eagle_assets.settings_env import SettingError

    assert automation_sensor().minimum_interval_seconds == 30
    monkeypatch.setenv(AUTOMATION_INTERVAL_ENV, "5")
    assert automation_sensor().minimum_interval_seconds == 5
    monkeypatch.setenv(AUTOMATION_INTERVAL_ENV, "2")
    with pytest.raises(SettingError, match="EAGLE_ASSETS_AUTOMATION_INTERVAL_S"):
        automation_sensor()
