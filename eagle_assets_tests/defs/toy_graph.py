"""A four-asset graph with the pipeline's shape and staleness machinery, cheap enough for tests.

    a -> b -> c (partitioned "0", "1", like hidden_state_shards) -> d

Like the real assets: code versions from `stage_version` over each asset's Config (changing
a default makes it stale), data versions from the content hash of the files they write,
stages that never mix partitioned and unpartitioned assets. Each asset writes a text file
under `root` whose content depends on its parents' files and its settings.
"""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import time
from pathlib import Path

import dagster as dg

from eagle_assets.defs.common import hash_files, stage_version
from eagle_assets.resources.inference_server import InferenceServerResource

PARTITIONS = dg.StaticPartitionsDefinition(["0", "1"])
STAGES = {"first_job": ["a", "b"], "shards_job": ["c"], "last_job": ["d"]}
BOUND_SERVER = InferenceServerResource(target="toy-target", port=8123, kv_cache_gib=3)
"""The inference-server resource as toy_location.py binds it (values that are not the defaults)."""


def _config_class(name: str, **defaults) -> type[dg.Config]:
    annotations = {k: type(v) for k, v in defaults.items()}
    return type(name, (dg.Config,), {"__annotations__": annotations, **defaults})


def make_assets(root: Path, b_scale: int = 1, b_note: str = "first", c_seconds: float = 0.0,
                c_resources: frozenset[str] = frozenset()) -> list[dg.AssetsDefinition]:  # fmt: skip
    """The toy graph. `b_scale` changes b's output; `b_note` changes only b's code version;
    `c_seconds` makes each partition of c take that long (so parallel runs overlap); c records
    the config of each resource named in `c_resources` in its materialisation's metadata."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    AConfig = _config_class("AConfig", text="hello")
    BConfig = _config_class("BConfig", scale=b_scale, note=b_note)
    CConfig = _config_class("CConfig", salt=0)
    DConfig = _config_class("DConfig", suffix="!")

    def write(name: str, text: str) -> dg.DataVersion:
        path = root / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.rename(path)
        return dg.DataVersion(hash_files([path]))

    @dg.asset(code_version=stage_version(AConfig))
    def a(config: AConfig) -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=write("a.txt", config.text))

    @dg.asset(deps=[a], code_version=stage_version(BConfig))
    def b(config: BConfig) -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=write("b.txt", (root / "a.txt").read_text() * config.scale))

    @dg.asset(deps=[b], partitions_def=PARTITIONS, code_version=stage_version(CConfig), required_resource_keys=set(c_resources),
              check_specs=[dg.AssetCheckSpec("not_empty", asset="c")])  # fmt: skip
    def c(context: dg.AssetExecutionContext, config: CConfig):
        if config.salt < 0:
            raise ValueError(f"salt {config.salt} < 0: a failing run for tests")
        time.sleep(c_seconds)
        text = f"{context.partition_key}:{config.salt}:" + (root / "b.txt").read_text()
        seen = {name: getattr(context.resources, name).model_dump() for name in sorted(c_resources)}
        yield dg.MaterializeResult(data_version=write(f"c{context.partition_key}.txt", text),
                                   metadata={"resources": dg.MetadataValue.json(seen)} if seen else None)  # fmt: skip
        yield dg.AssetCheckResult(check_name="not_empty", passed=bool(text))

    @dg.asset(deps=[c], code_version=stage_version(DConfig))
    def d(config: DConfig) -> dg.MaterializeResult:
        parts = [(root / f"c{k}.txt").read_text() for k in PARTITIONS.get_partition_keys()]
        return dg.MaterializeResult(data_version=write("d.txt", "|".join(parts) + config.suffix))

    return [a, b, c, d]


def make_jobs() -> list:
    return [dg.define_asset_job(name, selection=assets) for name, assets in STAGES.items()]


def persistent_instance(home: Path) -> dg.DagsterInstance:
    """A real on-disk instance (schedule and sensor contexts refuse an ephemeral one), kept fast:
    one SQLite event log for all runs and no captured compute logs."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(
        f"""run_storage:
  module: dagster._core.storage.runs
  class: SqliteRunStorage
  config: {{base_dir: "{home}/history"}}
event_log_storage:
  module: dagster._core.storage.event_log
  class: ConsolidatedSqliteEventLogStorage
  config: {{base_dir: "{home}/history"}}
schedule_storage:
  module: dagster._core.storage.schedules
  class: SqliteScheduleStorage
  config: {{base_dir: "{home}/schedules"}}
compute_logs:
  module: dagster._core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
telemetry: {{enabled: false}}
"""
    )
    return dg.DagsterInstance.from_config(str(home))


def materialization_count(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> int:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None), limit=1000
    ).records
    return len(records)
