"""Extracts one shard in its own process through `extract_all`, as a hidden-state run does
beside another writer into the same folder.

    python -m eagle_assets_tests.hidden_states.reserve_child CORPUS OUT FINGERPRINT SHARD GO_FILE

Prints "writing" after its first batch and then waits until GO_FILE exists (so the test can
start the other partition while this one's shard is half written), then "done"; or, when its
reservation is refused, "refused: <message>" (exit 0 either way: the test reads the line).
"""

import sys
import time
from pathlib import Path

import torch

from eagle_assets.hidden_states.extract import ExtractSettings, extract_all

from .extract_child import ToyDecoder

SETTINGS = ExtractSettings(aux_layer_ids=(0, 1, 2), num_shards=2, batch_tokens=1, progress=False)
HIDDEN = 512
"""Wide enough that a shard takes about a megabyte: a tmpfs of a few can hold one and not two."""


def model() -> ToyDecoder:
    torch.manual_seed(0)
    return ToyDecoder(hidden=HIDDEN).to(torch.bfloat16).eval()


if __name__ == "__main__":
    corpus, out, fingerprint, shard, go = sys.argv[1:6]
    first = True

    def on_batch(shard_index: int, batch: int, num_batches: int) -> None:
        global first
        if first:
            first = False
            print("writing", flush=True)
            while not Path(go).exists():
                time.sleep(0.05)

    try:
        extract_all(model(), corpus, out, SETTINGS, target_fingerprint=fingerprint, shards=[int(shard)], on_batch=on_batch)
    except OSError as exc:
        print(f"refused: {exc}", flush=True)
    else:
        print("done", flush=True)
