"""The trainer's trackers on the tiny target (test_train.py's run): TensorBoard's event files,
a real MLflow tracking server (SQLite store, loopback port) and W&B in offline mode, each read
back and compared with metrics.jsonl; the benchmark's figures logged into the same run; a
resumed training going on in the run it recorded.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from eagle_assets.drafter.trackers import benchmark_scalars, log_to_recorded_run, read_record, scalars
from eagle_assets.engines.process import free_port
from eagle_assets_tests.drafter.test_train import read_metrics, write_tiny_run

# What a report.json holds of the figures a tracker gets (BenchmarkReport.to_dict's keys).
REPORT = {
    "offline": {"al": 2.25, "per_position_acceptance": [0.75, 0.5, None]},
    "served": {"al": 2.24, "per_position_acceptance": [0.74, 0.5, 0.0]},
    "speedups": {"eagle3": {"1": 1.76, "4": 1.5}, "ngram": {"1": 1.29}, "eagle3 k=2": {"1": float("nan")}},
}
FIGURES = {
    "benchmark/offline_al": 2.25,
    "benchmark/offline_accept/0": 0.75,
    "benchmark/offline_accept/1": 0.5,
    "benchmark/served_al": 2.24,
    "benchmark/served_accept/0": 0.74,
    "benchmark/served_accept/1": 0.5,
    "benchmark/served_accept/2": 0.0,
    "benchmark/speedup/eagle3/c1": 1.76,
    "benchmark/speedup/eagle3/c4": 1.5,
    "benchmark/speedup/ngram/c1": 1.29,
}


def expected_history(out_dir) -> dict[str, list[tuple[int, float]]]:
    """{scalar: [(step, value)]} as metrics.jsonl holds them, lists flattened to name/i."""
    history: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(out_dir):
        for key, value in scalars({k: v for k, v in row.items() if k != "step"}).items():
            history.setdefault(key, []).append((row["step"], value))
    return history


def test_scalars_and_benchmark_figures():
    assert scalars({"loss": 1, "acc": [0.5, 0.25], "note": "x", "flag": True, "none": None}) == {"loss": 1.0, "acc/0": 0.5, "acc/1": 0.25}
    # NaN speedups (a configuration that did not serve) and missing positions are left out;
    # a label becomes a name every tracker accepts
    assert benchmark_scalars(REPORT) == FIGURES
    assert benchmark_scalars({"served": None, "offline": None, "speedups": {}}) == {}


def test_tensorboard_holds_what_metrics_jsonl_holds_and_the_benchmark_joins_it(tmp_path, one_thread):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from eagle_assets.drafter.train import train

    cfg = write_tiny_run(tmp_path, num_samples=8, num_shards=1, max_steps=4, val_fraction=0.25, val_interval=2)
    summary = train(cfg)
    assert read_record(cfg.out_dir) == {"kind": "tensorboard", "log_dir": str(cfg.tensorboard_path)}
    assert log_to_recorded_run(cfg.out_dir, summary["steps"], FIGURES)["kind"] == "tensorboard"
    events = EventAccumulator(str(cfg.tensorboard_path), size_guidance={"scalars": 0})
    events.Reload()
    got = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    want = expected_history(cfg.out_dir) | {k: [(4, v)] for k, v in FIGURES.items()}
    assert set(got) == set(want) and "val_accept/2" in got and "acc/0" in got
    for tag, rows in want.items():  # event files hold float32
        assert got[tag] == [(step, pytest.approx(v, rel=1e-6)) for step, v in rows], tag


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a loopback port with a SQLite store, without its job runner (extra
    worker processes the tests do not use); stopped with its process group."""
    pytest.importorskip("mlflow", reason="MLflow is an optional extra: pip install -e '.[mlflow]'")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root}/mlflow.db",
        "--default-artifact-root",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.25)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_mlflow_server_holds_what_metrics_jsonl_holds_and_a_resume_goes_on_in_the_same_run(tmp_path, one_thread, mlflow_server):
    from mlflow import MlflowClient

    from eagle_assets.drafter.train import train

    cfg = write_tiny_run(
        tmp_path,
        num_samples=8,
        num_shards=1,
        max_steps=3,
        val_fraction=0.25,
        val_interval=2,
        checkpoint_every=3,
        tracker="mlflow",
        tracker_uri=mlflow_server,
        tracker_project="tiny",
    )
    train(cfg)
    record = read_record(cfg.out_dir)
    assert record["kind"] == "mlflow" and record["tracking_uri"] == mlflow_server and record["experiment"] == "tiny"
    # two steps more: resumed from step 3's checkpoint, in the run step 3 recorded
    summary = train(cfg.replace(max_steps=5))
    assert read_record(cfg.out_dir) == record
    log_to_recorded_run(cfg.out_dir, summary["steps"], FIGURES)

    client = MlflowClient(mlflow_server)
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert run.data.params["tracker"] == "mlflow" and run.data.params["lr"] == str(cfg.lr)
    want = expected_history(cfg.out_dir) | {k: [(5, v)] for k, v in FIGURES.items()}
    assert set(run.data.metrics) == set(want)
    for key, rows in want.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(record["run_id"], key))
        assert got == rows, key
    assert [step for step, _ in want["loss"]] == [1, 2, 3, 4, 5]
    assert client.search_experiments(filter_string="name = 'tiny'")[0].experiment_id == run.info.experiment_id


def wandb_records(folder: Path) -> list:
    """Every record of the W&B run files under `folder`, in order of writing.

    wandb 0.31's Python package has no reader of its run files (the Go core writes and syncs
    them), so this reads their framing: a 7-byte W&B header, then LevelDB's log format (32 KiB
    blocks; each chunk a 7-byte header of CRC, length and kind: full, first, middle, last)
    around protobuf `Record`s, parsed with wandb's own classes."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted(folder.glob("wandb/*run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B", path
        pos, pending = 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:  # a block's tail too short for a header is padding
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0 and length == 0:
                break
            pending += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
                pending = b""
    return records


def test_wandb_offline_run_files_hold_what_metrics_jsonl_holds(tmp_path, one_thread, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install -e '.[wandb]'")
    import json

    from eagle_assets.drafter.train import train

    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = write_tiny_run(
        tmp_path, num_samples=8, num_shards=1, max_steps=3, val_fraction=0.25, val_interval=2, tracker="wandb", tracker_project="tiny"
    )
    summary = train(cfg)
    record = read_record(cfg.out_dir)
    assert record == {"kind": "wandb", "project": "tiny", "run_id": record["run_id"], "dir": cfg.out_dir}
    log_to_recorded_run(cfg.out_dir, summary["steps"], FIGURES)

    records = wandb_records(Path(cfg.out_dir))
    runs = {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"}
    assert runs == {record["run_id"]}  # the benchmark's fragment is the same run
    config = next(r.run.config for r in records if r.WhichOneof("record_type") == "run")
    assert json.loads(next(i.value_json for i in config.update if i.key == "tracker")) == "wandb"
    got: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    got.setdefault(key, []).append((items["_step"], value))
    assert got == expected_history(cfg.out_dir) | {k: [(3, v)] for k, v in FIGURES.items()}
    import wandb

    wandb.teardown()  # the W&B service process this test started


def test_a_tracker_or_a_push_setting_makes_nothing_stale():
    from eagle_assets.defs.benchmark import BenchmarkConfig
    from eagle_assets.defs.code_versions import code_version
    from eagle_assets.defs.drafter import DrafterAssetConfig
    from eagle_assets.defs.settings import LocationSettings, with_defaults

    def versions(changes: dict) -> tuple[str, str]:
        settings = LocationSettings("smollm2-default", changes)
        return (
            code_version("drafter_checkpoint", with_defaults(DrafterAssetConfig, "drafter_checkpoint", settings)),
            code_version("benchmark_report", with_defaults(BenchmarkConfig, "benchmark_report", settings)),
        )

    reporting = {
        "drafter_checkpoint": {"tracker": "wandb", "tracker_project": "p", "tracker_uri": "http://127.0.0.1:5000"},
        "benchmark_report": {"push_to_hub": "my-org/drafter", "push_private": True},
    }
    assert versions(reporting) == versions({})
    # what the drafter is, by contrast, moves its version
    assert versions({"drafter_checkpoint": {"epochs": 9}})[0] != versions({})[0]
