"""Two torchrun agents on 127.0.0.1, as two nodes of one process each, train as one process
does on the same global batch, launched with the very command `TrainerResource` builds; and
the resource refuses multi-node settings torchrun would fail on (or hang on) late.

The two-node run takes one micro-batch per rank (grad_accum 1 x 2 ranks); the one process
accumulates two (grad_accum 2). The planner deals a step's micro-batches to ranks by rank
(`data.rank_micro_batches`), and the trainer normalises by the all-reduced count of trained
positions, so both runs take the same steps.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets_tests.drafter.test_distributed import free_ports
from eagle_assets_tests.drafter.test_train import pipes_environment, read_metrics, read_pipes_messages, write_tiny_run

STEPS = 4
LAUNCH_TIMEOUT_S = 180
# fp32 on CPU, one thread per process. Each step's loss and gradient are sums over the same
# positions with the same weights; the runs differ only in where partial sums meet (the
# all-reduce adds two ranks' sums, the one process accumulates two micro-batches). With two
# summands that order cannot change the result (a + b = b + a; DDP's halving and the
# trainer's rescaling by world size are exact powers of two), so here the runs agree to the
# bit; the tolerance leaves room for a reduction that regroups sums (another gloo algorithm,
# more ranks): a few fp32 ulps (1.2e-7 relative each) per step, carried through AdamW's
# updates over STEPS steps. A micro-batch dealt to the wrong rank, or counted twice, moves
# the loss by whole percents.
LOSS_TOLERANCE = dict(rel=1e-6, abs=1e-7)
WEIGHT_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
# The export is bf16: fp32 weights that agree to ~1e-6 round to the same bf16 value except
# where they straddle a rounding boundary, and then differ by one bf16 step (2^-8 to 2^-7 of
# the value).
EXPORT_TOLERANCE = dict(rtol=2**-7, atol=1e-30)


def _start(resource: TrainerResource, config_path: Path, log: Path, extra_env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """One torchrun agent: the resource's own command line and environment."""
    env = {**os.environ, **resource.environment(), **extra_env}
    with open(log, "wb") as out:
        return subprocess.Popen(resource.command(config_path), env=env, stdout=out, stderr=subprocess.STDOUT), log


def _wait(runs: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    try:
        for name, (proc, log) in runs.items():
            rc = proc.wait(timeout=LAUNCH_TIMEOUT_S)
            assert rc == 0, f"{name} exited with {rc}:\n{log.read_text()[-4000:]}"
    finally:
        for proc, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _losses(cfg: TrainConfig) -> list[float]:
    return [r["loss"] for r in read_metrics(cfg.out_dir) if "loss" in r]


def _assert_weights_close(actual: dict, expected: dict, what: str, tolerance: dict) -> None:
    assert set(actual) == set(expected), what
    for name, w in expected.items():
        torch.testing.assert_close(actual[name].float(), w.float(), msg=lambda m, name=name: f"{what} {name}: {m}", **tolerance)


def test_two_nodes_train_as_one_process(tmp_path):
    """Same per-step losses, final checkpoint and export as one process; Dagster's node reports."""
    base = write_tiny_run(
        tmp_path,
        num_samples=16,
        max_steps=STEPS,
        micro_batch_samples=2,
        warmup_steps=1,
        lr=1e-2,
        checkpoint_every=STEPS,
        export_engines=("vllm",),
    )
    one = base.replace(out_dir=str(tmp_path / "one"), grad_accum=2)
    two = base.replace(out_dir=str(tmp_path / "two"))
    (port,) = free_ports(1)
    nodes = [TrainerResource(nnodes=2, node_rank=r, rdzv_endpoint=f"127.0.0.1:{port}", threads_per_process=1) for r in (0, 1)]
    pipes_env, messages = pipes_environment(tmp_path)

    # Node 1's agent starts first. Dagster launches node 0 (the Pipes variables are set there
    # only), but the c10d rendezvous ignores --node_rank and orders agents by host, then process
    # id: on one host the earlier agent becomes rank 0, as another node's may on a cluster.
    two_json, one_json = two.save(tmp_path / "two.json"), one.save(tmp_path / "one.json")
    runs = {"node 1": _start(nodes[1], two_json, tmp_path / "node1.log", {})}
    runs["node 0"] = _start(nodes[0], two_json, tmp_path / "node0.log", pipes_env)
    runs["one process"] = _start(TrainerResource(threads_per_process=1), one_json, tmp_path / "one.log", {})
    _wait(runs)

    # Rank 0 (the only process that prints progress) ran on node 1: Dagster's node was rank 1.
    assert f"training {STEPS} steps" in (tmp_path / "node1.log").read_text()
    assert f"training {STEPS} steps" not in (tmp_path / "node0.log").read_text()

    ref = _losses(one)
    assert len(ref) == STEPS and ref[-1] < ref[0]  # it trains
    assert _losses(two) == pytest.approx(ref, **LOSS_TOLERANCE)

    summaries = {cfg.out_dir: json.loads((Path(cfg.out_dir) / "summary.json").read_text()) for cfg in (one, two)}
    assert [summaries[c.out_dir]["world_size"] for c in (one, two)] == [1, 2]
    assert summaries[two.out_dir]["tokens_seen"] == summaries[one.out_dir]["tokens_seen"]

    # The final checkpoint (fp32) and the exported drafter (bf16) of both runs.
    final = f"{ckpt.checkpoint_name(STEPS)}/{ckpt.MODEL_FILE}"
    _assert_weights_close(
        load_file(str(two.checkpoint_dir / final)), load_file(str(one.checkpoint_dir / final)), "checkpoint weight", WEIGHT_TOLERANCE
    )
    exported = [load_file(str(Path(summaries[cfg.out_dir]["exports"]["vllm"]) / "model.safetensors")) for cfg in (one, two)]
    _assert_weights_close(exported[1], exported[0], "exported weight", EXPORT_TOLERANCE)

    # Dagster, through node 0's Pipes session, saw every step's loss and the final summary.
    sent = read_pipes_messages(messages)
    assert sent[0]["method"] == "opened" and sent[-1]["method"] == "closed"
    reported = [m["params"]["payload"] for m in sent if m["method"] == "report_custom_message"]
    reported = [r for r in reported if "loss" in r]  # the training rows
    assert [r["step"] for r in reported] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in reported] == _losses(two)  # all-reduced: rank 1 holds rank 0's numbers
    (done,) = [m for m in sent if m["method"] == "report_asset_materialization"]
    assert done["params"]["metadata"]["world_size"]["raw_value"] == 2


@pytest.mark.parametrize(
    "settings, problem",
    [
        (dict(nnodes=2), "nnodes=2 needs rdzv_endpoint"),
        (dict(nnodes=2, node_rank=2, rdzv_endpoint="host0:29500"), r"node_rank=2 must be in 0\.\.1"),
        (dict(node_rank=1), r"node_rank=1 must be in 0\.\.0"),
        (dict(nnodes=2, rdzv_endpoint="host0"), "rdzv_endpoint='host0' is not host:port"),
        (dict(nnodes=2, rdzv_endpoint="tcp://host0:29500"), "is not host:port"),
        (dict(nnodes=2, rdzv_endpoint="host0:70000"), "is not host:port"),
        (dict(nnodes=2, rdzv_endpoint="::1:29500"), "is not host:port"),
        (dict(nnodes=0), "nnodes=0 must be >= 1"),
        (dict(nnodes=2, rdzv_endpoint="host0:29500", rdzv_backend="tcp"), "rdzv_backend='tcp'"),
    ],
)
def test_trainer_refuses_bad_multinode_settings(settings, problem):
    with pytest.raises(ValueError, match=problem):
        TrainerResource(**settings)


def test_trainer_command_carries_the_rendezvous():
    for endpoint in ("host-0.cluster.local:29500", "10.0.0.1:29500", "[fd00::1]:29500"):
        cmd = TrainerResource(nnodes=2, node_rank=1, rdzv_endpoint=endpoint, nproc_per_node=8).command(Path("run.json"))
        flags = dict(zip(cmd[3:-4:2], cmd[4:-4:2]))
        assert flags == {"--nproc_per_node": "8", "--nnodes": "2", "--node_rank": "1", "--rdzv-backend": "c10d", "--rdzv-endpoint": endpoint}
    assert "--standalone" in TrainerResource().command(Path("run.json"))
