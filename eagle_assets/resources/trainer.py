"""The `TrainerResource`: launches the standalone trainer with torchrun, through Dagster Pipes.

What runs is exactly what a user runs by hand:

    torchrun --nproc_per_node N [--nnodes M --rdzv-backend c10d --rdzv-endpoint HOST:PORT] \
        -m eagle_assets.drafter.train --config run.json

Pipes passes its context through the environment to every rank; only rank 0 opens a session
and reports logs and metrics (every rank opening one fails the run).

Kubernetes: run the same command in a pod per node (for example a PyTorchJob, or Dagster's
`PipesK8sClient` with the image in `docker/`), with `nnodes`, `node_rank` and
`rdzv_endpoint` set from the job's environment; the run config and shards live on shared
storage (an fsspec URL or a mounted volume).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import dagster as dg

from eagle_assets.drafter.run_config import TrainConfig


class TrainerResource(dg.ConfigurableResource):
    """How drafter training is launched: processes per node, nodes, rendezvous."""

    nproc_per_node: int = 1
    """Processes (GPUs) per node; 1 on a CPU host."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None
    """host:port of the rendezvous; required when nnodes > 1."""
    rdzv_backend: str = "c10d"
    python: Optional[str] = None
    """Interpreter with eagle_assets installed (default: this one)."""
    threads_per_process: Optional[int] = None
    """OMP_NUM_THREADS for CPU training; default: cores / processes."""

    def command(self, config_path: Path) -> list[str]:
        cmd = [self.python or sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.nproc_per_node)]
        if self.nnodes > 1:
            if not self.rdzv_endpoint:
                raise ValueError("nnodes > 1 needs rdzv_endpoint (host:port reachable from every node)")
            cmd += ["--nnodes", str(self.nnodes), "--node_rank", str(self.node_rank),
                    "--rdzv-backend", self.rdzv_backend, "--rdzv-endpoint", self.rdzv_endpoint]  # fmt: skip
        else:
            cmd += ["--standalone"]
        return cmd + ["-m", "eagle_assets.drafter.train", "--config", str(config_path)]

    def train(self, context: dg.AssetExecutionContext, config: TrainConfig) -> dict:
        """Run training to completion; returns the trainer's summary (summary.json)."""
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config_path = out / "run.json"
        config.save(config_path)
        env = {"PYTHONUNBUFFERED": "1"}
        if self.threads_per_process or self.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = str(self.threads_per_process or max(1, (os.cpu_count() or 1) // self.nproc_per_node))
        context.log.info("launching: " + " ".join(self.command(config_path)))
        dg.PipesSubprocessClient().run(context=context, command=self.command(config_path), env=env).get_results()
        summary = out / "summary.json"
        if not summary.is_file():
            raise RuntimeError(f"training finished without {summary}: see the run's logs")
        return json.loads(summary.read_text())
