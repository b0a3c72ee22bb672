"""A five-asset graph with the pipeline's machinery, cheap enough for tests.

    a -> b -> c0, c1 (side by side, like two steps a Celery worker may run at once) -> d

Like the real assets: code versions from each asset's Config defaults (changing a default makes
it stale), data versions from the content hash of the files they write. Each asset writes a text
file under `root` whose content depends on its parents' files and its settings.
"""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import hashlib
import json
import time
from pathlib import Path

import dagster as dg

from eagle_assets.defs.common import hash_files

CS = ("0", "1")


def _config_class(name: str, **defaults) -> type[dg.Config]:
    annotations = {k: type(v) for k, v in defaults.items()}
    return type(name, (dg.Config,), {"__annotations__": annotations, **defaults})


def _version(config: type[dg.Config]) -> str:
    defaults = {name: repr(field.default) for name, field in config.model_fields.items()}
    return hashlib.sha256(json.dumps(defaults, sort_keys=True).encode()).hexdigest()[:16]


def make_assets(root: Path, b_scale: int = 1, b_note: str = "first", c_seconds: float = 0.0) -> list[dg.AssetsDefinition]:
    """The toy graph. `b_scale` changes b's output; `b_note` changes only b's code version;
    `c_seconds` makes each c take that long (so steps run side by side overlap)."""
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

    @dg.asset(code_version=_version(AConfig))
    def a(config: AConfig) -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=write("a.txt", config.text))

    @dg.asset(deps=[a], code_version=_version(BConfig))
    def b(config: BConfig) -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=write("b.txt", (root / "a.txt").read_text() * config.scale))

    def make_c(index: str):
        @dg.asset(name=f"c{index}", deps=[b], code_version=_version(CConfig))
        def c(config: CConfig) -> dg.MaterializeResult:
            if config.salt < 0:
                raise ValueError(f"salt {config.salt} < 0: a failing run for tests")
            time.sleep(c_seconds)
            return dg.MaterializeResult(data_version=write(f"c{index}.txt", f"{index}:{config.salt}:" + (root / "b.txt").read_text()))

        return c

    cs = [make_c(i) for i in CS]

    @dg.asset(deps=cs, code_version=_version(DConfig))
    def d(config: DConfig) -> dg.MaterializeResult:
        parts = [(root / f"c{i}.txt").read_text() for i in CS]
        return dg.MaterializeResult(data_version=write("d.txt", "|".join(parts) + config.suffix))

    return [a, b, *cs, d]


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


def materialization_count(instance: dg.DagsterInstance, asset: str) -> int:
    return len(instance.fetch_materializations(dg.AssetKey(asset), limit=1000).records)
