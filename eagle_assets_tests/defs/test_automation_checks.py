"""Dagster's automation (defs/sensors.py's condition) waits for a parent's blocking checks,
evaluated against a real instance as the daemon's automation sensor evaluates it."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import dagster as dg

from eagle_assets.defs.sensors import with_automation


class ParentConfig(dg.Config):
    """What the parent writes."""

    text: str = "one"


def test_automation_waits_for_a_parents_blocking_checks_on_its_newest_content(tmp_path, instance):
    """The drafter's checks run after it; the benchmark below is requested only once they passed
    on the drafter's newest materialisation, and not while they fail."""

    written = tmp_path / "parent.txt"

    @dg.asset(code_version="1")
    def parent(config: ParentConfig) -> dg.MaterializeResult:
        written.write_text(config.text)
        return dg.MaterializeResult(data_version=dg.DataVersion(config.text))

    @dg.asset_check(asset=parent, blocking=True)
    def good() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=written.read_text() != "bad")

    @dg.asset(deps=[parent], code_version="1")
    def child() -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=dg.DataVersion("c"))

    assets = with_automation([parent, child])

    def requested(cursor):
        result = dg.evaluate_automation_conditions(defs=[*assets, good], instance=instance, cursor=cursor)
        return sorted(r.key.to_user_string() for r in result.results if r.true_subset.size and isinstance(r.key, dg.AssetKey)), result.cursor

    def run(selection, text):
        config = {"ops": {"parent": {"config": {"text": text}}}} if text else {}
        dg.materialize([*assets, good], selection=selection, instance=instance, run_config=config, raise_on_error=False)

    run(dg.AssetSelection.all() | dg.AssetSelection.checks(good), "one")
    asked, cursor = requested(None)
    assert asked == []
    run(dg.AssetSelection.assets("parent").without_checks(), "two")  # new content, its check not yet run
    asked, cursor = requested(cursor)
    assert asked == []
    run(dg.AssetSelection.checks(good), None)  # the check passes on it
    asked, cursor = requested(cursor)
    assert asked == ["child"]
    dg.materialize([*assets, good], selection=["child"], instance=instance)
    run(dg.AssetSelection.assets("parent").without_checks(), "bad")
    run(dg.AssetSelection.checks(good), None)  # new content whose blocking check fails
    asked, cursor = requested(cursor)
    assert asked == []


def test_a_check_defined_beside_its_asset_runs_after_the_automation_rebuilds_it(tmp_path, instance):
    """The drafter's checks are definitions of their own (not the asset's step): the automation
    requests them once their asset has new content, and its child once they passed; without
    their condition the child would wait for ever."""
    from eagle_assets.defs.sensors import after_its_asset

    written = tmp_path / "parent.txt"

    @dg.asset(code_version="1")
    def parent(config: ParentConfig) -> dg.MaterializeResult:
        written.write_text(config.text)
        return dg.MaterializeResult(data_version=dg.DataVersion(config.text))

    @dg.asset_check(asset=parent, blocking=True, automation_condition=after_its_asset())
    def good() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(passed=written.read_text() != "bad")

    @dg.asset(deps=[parent], code_version="1")
    def child() -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=dg.DataVersion("c"))

    assets = with_automation([parent, child])

    def requested(cursor):
        result = dg.evaluate_automation_conditions(defs=[*assets, good], instance=instance, cursor=cursor)
        return sorted(r.key.to_user_string() for r in result.results if r.true_subset.size), result.cursor

    def run(selection, text=None):
        config = {"ops": {"parent": {"config": {"text": text}}}} if text else {}
        dg.materialize([*assets, good], selection=selection, instance=instance, run_config=config, raise_on_error=False)

    run(dg.AssetSelection.all() | dg.AssetSelection.checks(good), "one")
    _, cursor = requested(None)
    run(dg.AssetSelection.assets("parent").without_checks(), "two")  # as an automation run that asked for the asset alone
    asked, cursor = requested(cursor)
    assert asked == ["parent:good"]  # the check, and not yet the child
    run(dg.AssetSelection.checks(good))
    asked, cursor = requested(cursor)
    assert asked == ["child"]


def test_the_checks_condition_runs_nothing_on_a_first_tick_over_a_built_graph(tmp_path, instance):
    """A session started over an instance where the asset was built without the check: the first
    tick asks for nothing (the check waits for the asset's next rebuild)."""
    from eagle_assets.defs.sensors import after_its_asset

    @dg.asset(code_version="1")
    def parent() -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=dg.DataVersion("one"))

    def first_tick(condition) -> list[str]:
        @dg.asset_check(asset=parent, blocking=True, automation_condition=condition)
        def good() -> dg.AssetCheckResult:
            return dg.AssetCheckResult(passed=True)

        result = dg.evaluate_automation_conditions(defs=[parent, good], instance=instance)
        return sorted(r.key.to_user_string() for r in result.results if r.true_subset.size)

    dg.materialize([parent], instance=instance)  # no check ran on it
    assert first_tick(after_its_asset()) == []
