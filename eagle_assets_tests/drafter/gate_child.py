"""Run by test_cpu_caps.py in a process of its own, under one CPU cap: a tiny parent drafter, then
three warm starts from it (one that leaves it as it was, one that costs it a little, one that
wrecks it), each judged against the parent by the trainer. Prints one JSON line: per fine-tune, the comparison and whether the exported weights are
the parent's.

    python -m eagle_assets_tests.drafter.gate_child OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle_assets.drafter.train import train
from eagle_assets_tests.drafter.test_train import write_tiny_run


def weights(export: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(export) / "model.safetensors"))


def main(out: Path) -> None:
    torch.set_num_threads(1)
    parent_cfg = write_tiny_run(out, num_samples=32, num_shards=1, max_steps=40, lr=1e-2, warmup_steps=3, val_fraction=0.5, export_engines=("vllm",))
    parent = train(parent_cfg)["exports"]["vllm"]
    results = {}
    fine_tunes = {
        "gentle": {"lr": 1e-6, "max_steps": 1},
        "slight": {"lr": 1.5e-3, "max_steps": 1, "grad_clip": None},
        "wrecking": {"lr": 2.0, "max_steps": 6, "grad_clip": None},
    }
    for name, settings in fine_tunes.items():
        cfg = parent_cfg.replace(out_dir=str(out / name), warm_start=parent, min_finetune_samples=0, warmup_steps=0, **settings)
        summary = train(cfg)
        exported = weights(summary["exports"]["vllm"])
        same = all(torch.equal(exported[k], v) for k, v in weights(parent).items() if k in exported)
        results[name] = {
            "comparison": summary["parent_comparison"],
            "exported": summary["exported"],
            "parent_weights": same,
            "val_al": summary["val_al"],
        }
    print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), **results}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
