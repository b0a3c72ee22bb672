"""Stale status and `--stale-only` on a small real graph with the pipeline's versioning.

The toy graph (`toy_graph.py`) has the real graph's shape (a partitioned stage between
unpartitioned ones) and its machinery (`stage_version` code versions, content-hash data
versions); runs are real Dagster runs in a real on-disk instance (conftest.py).
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph

from eagle_assets.defs.staleness import MISSING, STALE, Step, run_stale, stale_report
from eagle_assets_tests.defs.toy_graph import STAGES, make_assets, materialization_count


def _quiet(_):
    pass


def test_missing_graph_is_built_in_waves_from_its_roots(tmp_path, instance):
    assets = make_assets(tmp_path)
    report = stale_report(AssetGraph.from_assets(assets), instance)
    assert [(i.label, i.status) for i in report.items] == [("a", MISSING), ("b", MISSING), ("c[0]", MISSING), ("c[1]", MISSING), ("d", MISSING)]
    assert report.downstream == ("b", "c", "d")
    assert [i.label for i in report.frontier()] == ["a"]

    run = run_stale(assets, STAGES, instance, {}, log=_quiet)
    # Each wave rebuilds only what has no stale ancestor; the partitioned stage runs per partition.
    assert run.steps == [
        Step("first_job", ("a",), None),
        Step("first_job", ("b",), None),
        Step("shards_job", ("c",), "0"),
        Step("shards_job", ("c",), "1"),
        Step("last_job", ("d",), None),
    ]
    assert stale_report(AssetGraph.from_assets(assets), instance).fresh
    assert run_stale(assets, STAGES, instance, {}, log=_quiet).steps == []


def test_bumped_setting_rebuilds_that_asset_and_what_depends_on_it(built):
    built, instance = built
    bumped = make_assets(built, b_scale=2)  # b's Config default changes: a new code version for b only
    report = stale_report(AssetGraph.from_assets(bumped), instance)
    assert [(i.label, i.status, i.causes) for i in report.items] == [("b", STALE, ("has a new code version",))]
    assert report.downstream == ("c", "d")  # not stale yet: they turn stale when b changes content

    run = run_stale(bumped, STAGES, instance, {}, log=_quiet)
    assert run.materialized == ["b", "c[0]", "c[1]", "d"]
    assert materialization_count(instance, "a") == 1  # the upstream is never rebuilt
    assert (built / "d.txt").read_text() == "0:0:hellohello|1:0:hellohello!"
    assert stale_report(AssetGraph.from_assets(bumped), instance).fresh


def test_identical_rebuild_leaves_everything_downstream_fresh(built):
    built, instance = built
    bumped = make_assets(built, b_note="second")  # new code version, same content
    assert [i.label for i in stale_report(AssetGraph.from_assets(bumped), instance).items] == ["b"]

    run = run_stale(bumped, STAGES, instance, {}, log=_quiet)
    assert run.materialized == ["b"]
    assert [materialization_count(instance, k) for k in "abd"] == [1, 2, 1]
    assert materialization_count(instance, "c", "0") == materialization_count(instance, "c", "1") == 1
    assert stale_report(AssetGraph.from_assets(bumped), instance).fresh


def test_one_partition_with_new_content_makes_only_its_children_stale(built):
    built, instance = built
    assets = make_assets(built)
    dg.materialize(assets, selection=["c"], partition_key="1", instance=instance, run_config={"ops": {"c": {"config": {"salt": 7}}}})
    report = stale_report(AssetGraph.from_assets(assets), instance)
    assert [(i.label, i.status) for i in report.items] == [("d", STALE)]
    assert report.items[0].causes == ("has a new dependency data version (c[1])",)

    run = run_stale(assets, STAGES, instance, {}, log=_quiet)
    assert run.materialized == ["d"]
    assert (built / "d.txt").read_text() == "0:0:hello|1:7:hello!"


def test_changed_run_settings_count_as_stale_and_defaults_do_not(built):
    built, instance = built
    assets = make_assets(built)
    graph = AssetGraph.from_assets(assets)
    # The same values as the Config defaults, spelled out: nothing to do.
    assert stale_report(graph, instance, settings={"b": {"config": {"scale": 1, "note": "first"}}}).fresh

    wanted = {"b": {"config": {"scale": 3}}}
    report = stale_report(graph, instance, settings=wanted)
    assert [(i.label, i.causes) for i in report.items] == [("b", ("settings changed: scale 1 -> 3",))]
    run = run_stale(assets, STAGES, instance, {}, settings=wanted, log=_quiet)
    assert run.materialized == ["b", "c[0]", "c[1]", "d"]
    assert stale_report(graph, instance, settings=wanted).fresh
    # Without named settings, a stale-only run keeps what each asset last ran with.
    assert stale_report(graph, instance).fresh


def test_bad_settings_name_the_asset_and_the_fix(tmp_path, instance):
    assets = make_assets(tmp_path)
    dg.materialize(assets, selection=["a", "b"], instance=instance)
    with pytest.raises(ValueError, match=r"settings for asset b do not fit its Config: .*scale.*Fix the run preset"):
        stale_report(AssetGraph.from_assets(assets), instance, settings={"b": {"config": {"scale": "many"}}})
