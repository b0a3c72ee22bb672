"""Which assets and partitions are stale, and what to run next: the `--stale-only` logic.

    >>> report = stale_report(defs.resolve_asset_graph(), instance)
    >>> print(report.render())
    >>> for step in report.next_steps(stage_of): ...     # what `eagle-assets run --stale-only` runs

Dagster decides staleness per asset partition from code versions (each asset's
`stage_version`) and data versions (each asset's content hash), through its own
`CachingStaleStatusResolver`: the same status the web UI shows as "unsynced". Two facts of
Dagster 1.13 shape this module (docs/design.md, "Components and what they impose"):

* Staleness is not transitive: when an asset gets a new code version, its children are not
  stale yet; they turn stale only once it is rebuilt with a new data version (an identical
  rebuild leaves them fresh). So a stale-only run goes in waves: it rebuilds the stale assets
  that have no stale ancestor (the frontier), asks Dagster again, and repeats.
* Partitioned assets are judged per partition (Dagster's run-request filter treats a
  partitioned asset without a partition as fresh), so each partition is asked on its own.

Settings given as run config are not part of a code version. When a run names its settings
(a preset), an asset whose last materialisation ran with other settings counts as stale too,
with the changed fields as its cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

import dagster as dg

# Private Dagster names, unavoidable here: Dagster has no public Python API for staleness. The
# UI's "unsynced" status and its causes come from CachingStaleStatusResolver (through GraphQL,
# which needs a webserver); the resolver takes an AssetGraph (public code gets one from
# Definitions.resolve_asset_graph()) and an AssetGraphView at a TemporalContext, and answers in
# StaleStatus. process_config: no public function fills a config schema's defaults into a value
# (dg.validate_run_config does it for a whole job's run config, which needs a job per asset).
# eagle_assets_tests/test_private_dagster_imports.py lists these for a Dagster upgrade's review.
from dagster._config import process_config
from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus

STALE = "stale"
MISSING = "missing"
STALE_ONLY_TAG = "eagle_assets/stale_only"
"""Tag on every run of a stale-only wave."""


@dataclass(frozen=True)
class StaleItem:
    """One asset (or one partition of it) that a stale-only run must rebuild."""

    asset: str
    """Asset key, as the UI writes it (e.g. "synthetic_corpus")."""
    partition: str | None
    """Partition key for a partitioned asset, else None."""
    status: str
    """"stale" (materialised, out of date) or "missing" (never materialised)."""
    causes: tuple[str, ...] = ()
    """Why it is stale, in Dagster's words plus changed settings (e.g. "has a new code version")."""

    @property
    def label(self) -> str:
        return self.asset + (f"[{self.partition}]" if self.partition is not None else "")


@dataclass(frozen=True)
class Step:
    """One Dagster run of a stale-only wave: assets of one stage, at most one partition."""

    stage: str
    """The stage (job name) the assets belong to; runs never mix stages."""
    assets: tuple[str, ...]
    """Asset keys to materialise, in topological order."""
    partition: str | None
    """Partition key when the stage is partitioned."""


@dataclass(frozen=True)
class StaleReport:
    """Stale and missing assets now, and the assets below them that may turn stale next."""

    items: tuple[StaleItem, ...]
    """Every stale or missing asset partition, in topological order."""
    downstream: tuple[str, ...] = ()
    """Assets below a stale one: fresh now, stale once it is rebuilt with new content."""
    order: tuple[str, ...] = field(default=(), repr=False)
    """All asset keys in topological order (for sorting steps)."""

    @property
    def fresh(self) -> bool:
        return not self.items

    def frontier(self) -> tuple[StaleItem, ...]:
        """The stale items with no stale ancestor: what can be rebuilt now without waste."""
        below = set(self.downstream)
        return tuple(i for i in self.items if i.asset not in below)

    def next_steps(self, stage_of: Callable[[str], str]) -> list[Step]:
        """The frontier as runs: one per stage for unpartitioned assets, one per partition."""
        groups: dict[tuple[str, str | None], list[str]] = {}
        for item in self.frontier():
            assets = groups.setdefault((stage_of(item.asset), item.partition), [])
            if item.asset not in assets:
                assets.append(item.asset)
        rank = {a: i for i, a in enumerate(self.order)}
        steps = [Step(stage, tuple(sorted(a, key=lambda x: rank.get(x, 0))), part) for (stage, part), a in groups.items()]
        return sorted(steps, key=lambda s: (min(rank.get(a, 0) for a in s.assets), s.partition or ""))

    def render(self) -> str:
        if self.fresh:
            return "every asset is up to date"
        lines = [f"{i.label}: {i.status}" + (f" ({'; '.join(i.causes)})" if i.causes else "") for i in self.items]
        if self.downstream:
            lines.append("may turn stale once those are rebuilt: " + ", ".join(self.downstream))
        return "\n".join(lines)


def _resolver(asset_graph: AssetGraph, instance: dg.DagsterInstance) -> CachingStaleStatusResolver:
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=datetime.now(timezone.utc), last_event_id=None),
        instance=instance,
        asset_graph=asset_graph,
    )
    return CachingStaleStatusResolver(instance=instance, asset_graph=asset_graph, loading_context=view)


def partition_keys(asset_graph: AssetGraph, key: dg.AssetKey, instance: dg.DagsterInstance) -> list[str | None]:
    """[None] for an unpartitioned asset, else its partition keys (dynamic ones from the instance)."""
    pdef = asset_graph.get(key).partitions_def
    if pdef is None:
        return [None]
    return list(pdef.get_partition_keys(dynamic_partitions_store=instance))


def stale_report(asset_graph: AssetGraph, instance: dg.DagsterInstance, settings: Mapping[str, dict] | None = None) -> StaleReport:
    """Ask Dagster which materialisable assets (and partitions) are stale or missing.

    `settings` maps an asset to the op config a run would give it now (`run_config()["ops"]`
    shape: {"prompts": {"config": {...}}}); when given, an asset last built with other
    settings is stale too. Without it, only code and data versions count, as in the UI.
    """
    resolver = _resolver(asset_graph, instance)
    order = [k for k in asset_graph.toposorted_asset_keys if asset_graph.get(k).is_materializable]
    items: list[StaleItem] = []
    for key in order:
        for partition in partition_keys(asset_graph, key, instance):
            status = resolver.get_status(key, partition)
            causes = [_describe(c) for c in resolver.get_stale_causes(key, partition)] if status == StaleStatus.STALE else []
            if settings is not None and status != StaleStatus.MISSING:
                changed = settings_change(asset_graph, instance, key, partition, settings)
                if changed:
                    causes.append(changed)
            if status == StaleStatus.MISSING:
                items.append(StaleItem(key.to_user_string(), partition, MISSING, ("never materialised",)))
            elif causes:
                items.append(StaleItem(key.to_user_string(), partition, STALE, tuple(causes)))
    stale_keys = {dg.AssetKey.from_user_string(i.asset) for i in items}
    below = _descendants(asset_graph, stale_keys)
    return StaleReport(
        items=tuple(items),
        downstream=tuple(k.to_user_string() for k in order if k in below),
        order=tuple(k.to_user_string() for k in order),
    )


def _describe(cause) -> str:
    where = cause.dependency.asset_key.to_user_string() if cause.dependency else None
    partition = cause.dependency.partition_key if cause.dependency else None
    text = cause.reason
    if where:
        text += f" ({where}" + (f"[{partition}]" if partition else "") + ")"
    return text


def _descendants(asset_graph: AssetGraph, roots: Iterable[dg.AssetKey]) -> set[dg.AssetKey]:
    seen: set[dg.AssetKey] = set()
    todo = [c for r in roots for c in asset_graph.get(r).child_keys]
    while todo:
        key = todo.pop()
        if key not in seen:
            seen.add(key)
            todo.extend(asset_graph.get(key).child_keys)
    return seen


def last_run_config(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None = None) -> dict | None:
    """The op config the latest materialisation of `key` (at `partition`) ran with; None if never built."""
    record = instance.get_latest_data_version_record(key, False, partition)
    if record is None or record.run_id is None:
        return None
    run = instance.get_run_by_id(record.run_id)
    if run is None:
        return None
    op = key.to_python_identifier()
    return dict(((run.run_config or {}).get("ops") or {}).get(op, {}).get("config") or {})


def resolved_config(asset_graph: AssetGraph, key: dg.AssetKey, config: dict) -> dict:
    """`config` with the asset's Config defaults filled in, so that {} and the defaults compare equal."""
    schema = asset_graph.assets_def_for_key(key).op.config_schema
    if schema is None or schema.config_type is None:
        return dict(config)
    result = process_config(schema.config_type, config)
    if not result.success:
        errors = "; ".join(e.message for e in result.errors or [])
        raise ValueError(f"settings for asset {key.to_user_string()} do not fit its Config: {errors}. Fix the run preset.")
    return dict(result.value or {})


def settings_change(asset_graph: AssetGraph, instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None,
                    settings: Mapping[str, dict]) -> str | None:  # fmt: skip
    """ "settings changed: a 1 -> 2" when the wanted settings differ from the last build's."""
    before = last_run_config(instance, key, partition)
    if before is None:
        return None
    wanted = (settings.get(key.to_python_identifier()) or {}).get("config") or {}
    new = resolved_config(asset_graph, key, wanted)
    try:
        old = resolved_config(asset_graph, key, before)
    except ValueError:
        # The Config changed since that build (a field renamed or removed): rebuild.
        return "settings changed: the last build's settings no longer fit this version's Config"
    diffs = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return ("settings changed: " + ", ".join(diffs)) if diffs else None


def step_run_config(step: Step, instance: dg.DagsterInstance, settings: Mapping[str, dict] | None,
                    fallback: Mapping[str, dict]) -> dict:  # fmt: skip
    """Run config of one step: the wanted settings if given, else what each asset last ran with,
    else `fallback` (a default preset) for an asset never built."""
    ops = {}
    for asset in step.assets:
        op = dg.AssetKey.from_user_string(asset).to_python_identifier()
        if settings is not None:
            config = (settings.get(op) or {}).get("config")
        else:
            config = last_run_config(instance, dg.AssetKey.from_user_string(asset), step.partition)
            if config is None:
                config = (fallback.get(op) or {}).get("config")
        if config:
            ops[op] = {"config": config}
    return {"ops": ops}


def stage_lookup(stages: Mapping[str, Iterable[str]]) -> Callable[[str], str]:
    """A function from asset key to the name of the stage (job) that holds it."""
    owner = {asset: name for name, assets in stages.items() for asset in assets}

    def stage_of(asset: str) -> str:
        if asset not in owner:
            raise KeyError(f"asset {asset!r} belongs to no stage job: add it to one of {', '.join(stages)}")
        return owner[asset]

    return stage_of


@dataclass
class StaleRun:
    """What a stale-only run did: the report it started from and each step it ran."""

    initial: StaleReport
    steps: list[Step] = field(default_factory=list)
    results: list = field(default_factory=list)

    @property
    def materialized(self) -> list[str]:
        """Asset partitions materialised, as "asset" or "asset[partition]", in run order."""
        return [a + (f"[{s.partition}]" if s.partition is not None else "") for s in self.steps for a in s.assets]


def run_stale(
    assets: list,
    stages: Mapping[str, Iterable[str]],
    instance: dg.DagsterInstance,
    resources: dict,
    settings: Mapping[str, dict] | None = None,
    fallback: Mapping[str, dict] | None = None,
    log: Callable[[str], None] = print,
    execute: Callable[[list[Step], list[dict]], list] | None = None,
) -> StaleRun:
    """Materialise exactly what is stale, wave by wave, as real Dagster runs in `instance`.

    Each wave rebuilds the frontier (stale assets without a stale ancestor); then Dagster is
    asked again, so a child is rebuilt only if its parent's content really changed. A wave's
    steps never depend on each other: `execute(steps, run_configs)` runs them and returns their
    results, raising on a failed one (default: in process, one after another, with `resources`;
    `eagle-assets run --stale-only` submits them to the instance, defs/runner.py).
    """
    asset_graph = AssetGraph.from_assets(assets)
    stage_of = stage_lookup(stages)
    report = stale_report(asset_graph, instance, settings)
    run = StaleRun(initial=report)
    log(report.render())
    done: set[tuple[str, str | None]] = set()
    execute = execute or _in_process(assets, instance, resources, log)
    while not report.fresh:
        steps = report.next_steps(stage_of)
        for step in steps:
            for asset in step.assets:
                if (asset, step.partition) in done:
                    raise RuntimeError(
                        f"{asset}{f'[{step.partition}]' if step.partition else ''} is still stale after it was rebuilt "
                        f"in this run: {report.render()}. Its data version or settings do not settle; check that the "
                        "asset returns a content hash as its data version."
                    )
                done.add((asset, step.partition))
        results = execute(steps, [step_run_config(step, instance, settings, fallback or {}) for step in steps])
        run.steps.extend(steps)
        run.results.extend(results)
        report = stale_report(asset_graph, instance, settings)
    return run


def _in_process(assets: list, instance: dg.DagsterInstance, resources: dict, log: Callable[[str], None]):
    def execute(steps: list[Step], configs: list[dict]) -> list:
        results = []
        for step, config in zip(steps, configs):
            label = ", ".join(step.assets) + (f" [partition {step.partition}]" if step.partition else "")
            log(f"materialising {label}")
            result = dg.materialize(
                assets,
                selection=list(step.assets),
                instance=instance,
                resources=resources,
                run_config=config,
                partition_key=step.partition,
                tags={STALE_ONLY_TAG: "true"},
                raise_on_error=True,
            )
            results.append(result)
            log(f"done: {label} (run {result.run_id})")
        return results

    return execute
