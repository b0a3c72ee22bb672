"""Every writer that commits a file by renaming it, run once into OUT, for test_durable_writes.py
to watch under strace:

    python -m eagle_assets_tests.durable_writes_child OUT

The corpus store (shards, manifest, failures), the hidden-state shard writer (through
extract_all with the toy decoder), a training checkpoint, a drafter export, and the trainer's
rewrite of metrics.jsonl (`durable.write_durably`).
"""

import json
import sys
from pathlib import Path

import torch

from eagle_assets.corpus.store import CorpusStore
from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.export import export_vllm
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.durable import write_durably
from eagle_assets.hidden_states.extract import extract_all
from eagle_assets_tests.hidden_states.extract_child import SETTINGS, toy_decoder

if __name__ == "__main__":
    out = Path(sys.argv[1])
    rows = []
    for i in range(4):
        ids = [5 + i, 6, 7, 8, 9, 10][: 4 + i % 3]
        rows.append(
            {
                "sample_id": f"s{i}",
                "prompt_id": f"p{i}",
                "source": "file",
                "messages": "[]",
                "input_ids": ids,
                "loss_mask": [0, 0] + [1] * (len(ids) - 2),
                "num_tokens": len(ids),
                "num_turns": 1,
                "finish_reason": "stop",
                "truncated": False,
                "reasoning_captured": False,
                "prompt_tokens": 2,
                "completion_tokens": len(ids) - 2,
                "latency_s": 0.1,
                "sampling": "{}",
                "target": "t",
            }
        )
    with CorpusStore(str(out / "corpus"), shard_size=3) as store:
        for row in rows:
            store.append(row)
        store.record_failure({"sample_id": "s9", "error": "HTTP 500"})
    extract_all(toy_decoder(), str(out / "corpus"), out / "hs", SETTINGS, target_fingerprint="t")

    cfg = tiny_config()
    model = Eagle3Drafter(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[: cfg.draft_vocab_size] = True
    model.set_vocab_mapping(torch.zeros(cfg.draft_vocab_size, dtype=torch.long), t2d)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    ckpt.save_checkpoint(out / "checkpoints", 3, state, {"state": {}, "param_groups": []}, {})
    export_vllm(model, cfg, out / "drafter-vllm")
    write_durably(out / "metrics.jsonl", (json.dumps({"step": 1}) + "\n").encode())
