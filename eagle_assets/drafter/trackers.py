"""Where the trainer's scalars go besides metrics.jsonl: TensorBoard (the default), MLflow or
Weights & Biases, chosen by `TrainConfig.tracker`; and the benchmark's figures, into the same run.

    tracker = open_tracker(cfg, resumed_at=0)                 # the main rank only
    tracker.log(12, {"loss": 0.31, "acc": [0.92, 0.71]})    # lists become acc/0, acc/1
    tracker.close()
    log_to_recorded_run(out_dir, 120, benchmark_scalars(report.to_dict()))   # later, elsewhere

The tracker gets exactly the numbers metrics.jsonl holds, under the names TensorBoard has
always shown. The run a tracker opened is recorded in `out_dir/tracker.json`, so a training
resumed from a checkpoint goes on in the same run, and the benchmark adds its figures (AL per
position, speedups) to it: one run shows both. MLflow and W&B are optional extras
(`pip install -e '.[mlflow]'`, `'.[wandb]'`); each reads its own environment as usual
(MLFLOW_TRACKING_URI; WANDB_API_KEY, WANDB_MODE=offline, WANDB_ENTITY ...).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Protocol

from eagle_assets.drafter.run_config import TRACKERS
from eagle_assets.durable import write_durably

RECORD_FILE = "tracker.json"
DEFAULT_PROJECT = "eagle_assets"
"""The MLflow experiment or W&B project when `tracker_project` names none."""
BENCHMARK_PREFIX = "benchmark"


class Tracker(Protocol):
    """An open run of a tracker: scalars by step, then closed; `record` says how to find the run again."""

    record: dict

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row as flat scalars: a list `acc` becomes `acc/0`, `acc/1` ...;
    what is not a number (a note, None) is left out."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        elif isinstance(value, (list, tuple)):
            for i, x in enumerate(value):
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    out[f"{key}/{i}"] = float(x)
    return out


def benchmark_scalars(report: Mapping[str, Any]) -> dict[str, float]:
    """The benchmark's figures from a report's dict (report.json): offline and served AL, the
    acceptance at each draft position, and each configuration's speedup over no speculation per
    concurrency, under `benchmark/`."""
    out: dict[str, float] = {}
    for side in ("offline", "served"):
        numbers = report.get(side) or {}
        if numbers.get("al") is not None:
            out[f"{BENCHMARK_PREFIX}/{side}_al"] = float(numbers["al"])
        for i, p in enumerate(numbers.get("per_position_acceptance") or []):
            if p is not None:
                out[f"{BENCHMARK_PREFIX}/{side}_accept/{i}"] = float(p)
    for label, by_concurrency in (report.get("speedups") or {}).items():
        for concurrency, ratio in by_concurrency.items():
            if ratio is not None and math.isfinite(ratio):
                out[f"{BENCHMARK_PREFIX}/speedup/{_key(label)}/c{concurrency}"] = float(ratio)
    return out


def _key(name: str) -> str:
    # MLflow allows letters, digits, "_", "-", ".", " " and "/" in metric names.
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def _needs(kind: str, module: str):
    try:
        return __import__(module)
    except ImportError:
        raise RuntimeError(f"tracker {kind!r} needs the {module} package: pip install -e '.[{kind}]' (or set tracker: tensorboard)") from None


# ----------------------------------------------------------------------------- the trackers


class TensorBoardTracker:
    """Event files in `log_dir`; a resumed run drops the events after its checkpoint's step."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        self.record = {"kind": "tensorboard", "log_dir": str(log_dir)}
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard missing: keep training, metrics.jsonl still has everything
            print("tensorboard is not installed: scalars go to metrics.jsonl only", file=sys.stderr)
            self.writer = None
            return
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.writer is not None:
            for key, value in scalars(metrics).items():
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class MlflowTracker:
    """A run of an MLflow tracking server (or store) through `MlflowClient`: the client, not the
    fluent `mlflow.start_run`, so that no process-wide active run is left behind and a later
    process (the benchmark) can log into the same run by its id."""

    def __init__(self, uri: str | None, experiment: str, run_name: str, run_id: str | None = None, params: Mapping[str, Any] | None = None):
        _needs("mlflow", "mlflow")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            if params:  # parameters are immutable in MLflow: written once, when the run is created
                self.client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.record = {"kind": "mlflow", "tracking_uri": self.client.tracking_uri, "experiment": experiment, "run_id": run_id}

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_key(k), v, now, step) for k, v in scalars(metrics).items()]
        for start in range(0, len(batch), 1000):  # the REST API's limit per request
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run, its local files under `folder/wandb` (what `wandb sync` uploads from an offline
    run). W&B's console capture is off: the trainer's progress bar and the Dagster Pipes
    messages stay on the process's own streams."""

    def __init__(self, folder: str | Path, project: str, run_name: str, run_id: str | None = None, params: Mapping[str, Any] | None = None):
        wandb = _needs("wandb", "wandb")
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=run_name,
            dir=str(folder),
            id=run_id,
            resume="allow" if run_id else None,
            config=dict(params or {}),
            settings=wandb.Settings(console="off"),
            reinit="create_new",
        )
        self.record = {"kind": "wandb", "project": project, "run_id": self.run.id, "dir": str(folder)}

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


# ----------------------------------------------------------------------------- opening and reopening


def read_record(out_dir: str | Path) -> dict | None:
    """The run recorded in `out_dir/tracker.json`, or None."""
    path = Path(out_dir) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("kind") in TRACKERS else None


def open_tracker(cfg, resumed_at: int = 0) -> Tracker | None:
    """The tracker `cfg` (a TrainConfig) names, opened on the main rank; None for "none". A run
    resumed from the checkpoint of step `resumed_at` (> 0) goes on in the run it recorded."""
    kind = getattr(cfg, "tracker", "tensorboard")
    if kind == "none":
        return None
    if kind == "tensorboard":
        tracker: Tracker = TensorBoardTracker(cfg.tensorboard_path, purge_step=resumed_at + 1 if resumed_at else None)
    else:
        earlier = read_record(cfg.out_dir) if resumed_at else None
        run_id = earlier["run_id"] if earlier and earlier.get("kind") == kind else None
        project = cfg.tracker_project or DEFAULT_PROJECT
        run_name = Path(cfg.out_dir).resolve().parent.name or "drafter"
        params = {k: v for k, v in cfg.to_dict().items() if k != "extra"}
        if kind == "mlflow":
            tracker = MlflowTracker(cfg.tracker_uri, project, run_name, run_id, params)
        elif kind == "wandb":
            tracker = WandbTracker(cfg.out_dir, project, run_name, run_id, params)
        else:
            raise ValueError(f"tracker={kind!r}: use one of {TRACKERS}")
    write_durably(Path(cfg.out_dir) / RECORD_FILE, json.dumps(tracker.record, indent=2).encode())
    return tracker


def reopen(record: Mapping[str, Any]) -> Tracker:
    """The run a `tracker.json` record names, opened again to log more into it."""
    kind = record["kind"]
    if kind == "tensorboard":
        return TensorBoardTracker(record["log_dir"])
    if kind == "mlflow":
        return MlflowTracker(record["tracking_uri"], record["experiment"], "", run_id=record["run_id"])
    if kind == "wandb":
        return WandbTracker(record["dir"], record["project"], "", run_id=record["run_id"])
    raise ValueError(f"{RECORD_FILE} names tracker {kind!r}; known: {TRACKERS}")


def log_to_recorded_run(out_dir: str | Path, step: int, metrics: Mapping[str, Any]) -> dict | None:
    """Log `metrics` at `step` into the run recorded in `out_dir` (the training's), and return
    its record; None, logging nothing, when the training recorded none (tracker "none")."""
    record = read_record(out_dir)
    if record is None:
        return None
    tracker = reopen(record)
    try:
        tracker.log(step, metrics)
    finally:
        tracker.close()
    return record
