"""The `TrainerResource`: launches the standalone trainer with torchrun, through Dagster Pipes.

What runs is exactly what a user runs by hand:

    torchrun --nproc_per_node N [--nnodes M --node_rank R --rdzv-backend c10d --rdzv-endpoint HOST:PORT] \
        -m eagle_assets.drafter.train --config run.json

Pipes passes its context through the environment to every process on the node Dagster
launches; only the first of them opens a session and reports logs and metrics (every process
opening one fails the run). Under the c10d rendezvous torchrun numbers the nodes in its own
order and ignores `node_rank`, so that process need not be global rank 0; the trainer reports
from it all the same (eagle_assets/drafter/train.py).

Kubernetes: run the same command in a pod per node (for example a PyTorchJob, or Dagster's
`PipesK8sClient` with the image in `docker/`), with `nnodes`, `node_rank` and
`rdzv_endpoint` set from the job's environment; the run config and shards live on shared
storage (an fsspec URL or a mounted volume).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

import dagster as dg
from pydantic import model_validator

from eagle_assets.drafter.run_config import TrainConfig

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
"""The rendezvous backends torchrun registers."""

# host:port, the host a name, an IPv4 address or a bracketed IPv6 address.
_ENDPOINT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


class TrainerResource(dg.ConfigurableResource):
    """How drafter training is launched: processes per node, nodes, rendezvous."""

    nproc_per_node: int = 1
    """Processes (GPUs) per node; 1 on a CPU host."""
    nnodes: int = 1
    node_rank: int = 0
    """This node's rank, 0 to nnodes - 1 (torchrun's c10d rendezvous orders nodes itself)."""
    rdzv_endpoint: Optional[str] = None
    """host:port of the rendezvous; required when nnodes > 1."""
    rdzv_backend: str = "c10d"
    python: Optional[str] = None
    """Interpreter with eagle_assets installed (default: this one)."""
    threads_per_process: Optional[int] = None
    """OMP_NUM_THREADS for CPU training; default: cores / processes."""

    @model_validator(mode="after")
    def _check_launch(self) -> "TrainerResource":
        """Refuse settings torchrun would reject, or hang on, only once every node is up."""
        problems = []
        for name in ("nproc_per_node", "nnodes"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if not 0 <= self.node_rank < max(self.nnodes, 1):
            problems.append(f"node_rank={self.node_rank} must be in 0..{self.nnodes - 1} (nnodes={self.nnodes}): number the nodes from 0")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            problems.append(
                f"nnodes={self.nnodes} needs rdzv_endpoint: host:port of the rendezvous, reachable "
                "from every node (for example node 0's host and a free port, host0:29500)"
            )
        if self.rdzv_endpoint is not None:
            match = _ENDPOINT.match(self.rdzv_endpoint)
            if match is None or not 1 <= int(match["port"]) <= 65535:
                problems.append(
                    f"rdzv_endpoint={self.rdzv_endpoint!r} is not host:port (port 1-65535): write it as "
                    "host0:29500, 10.0.0.1:29500 or [fd00::1]:29500"
                )
        if self.rdzv_backend not in RDZV_BACKENDS:
            problems.append(f"rdzv_backend={self.rdzv_backend!r}: use one of {RDZV_BACKENDS}")
        if self.threads_per_process is not None and self.threads_per_process < 1:
            problems.append(f"threads_per_process={self.threads_per_process} must be >= 1 or unset")
        if problems:
            raise ValueError("invalid trainer settings:\n  - " + "\n  - ".join(problems))
        return self

    def command(self, config_path: Path) -> list[str]:
        """The torchrun command line this node runs (every node runs it with its own node_rank)."""
        cmd = [self.python or sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.nproc_per_node)]
        if self.nnodes > 1:
            cmd += [
                "--nnodes",
                str(self.nnodes),
                "--node_rank",
                str(self.node_rank),
                "--rdzv-backend",
                self.rdzv_backend,
                "--rdzv-endpoint",
                str(self.rdzv_endpoint),
            ]
        else:
            cmd += ["--standalone"]
        return cmd + ["-m", "eagle_assets.drafter.train", "--config", str(config_path)]

    def environment(self) -> dict[str, str]:
        """Variables the launch sets on top of the inherited environment."""
        env = {"PYTHONUNBUFFERED": "1"}
        if self.threads_per_process or self.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = str(self.threads_per_process or max(1, (os.cpu_count() or 1) // self.nproc_per_node))
        return env

    def train(self, context: dg.AssetExecutionContext, config: TrainConfig) -> dict:
        """Run training to completion; returns the trainer's summary (summary.json)."""
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config_path = out / "run.json"
        config.save(config_path)
        context.log.info("launching: " + " ".join(self.command(config_path)))
        dg.PipesSubprocessClient().run(context=context, command=self.command(config_path), env=self.environment()).get_results()
        summary = out / "summary.json"
        if not summary.is_file():
            raise RuntimeError(f"training finished without {summary}: see the run's logs")
        return json.loads(summary.read_text())
