"""Hidden-state shards from an extraction server, in a process of its own, for the stall tests.

    python -m eagle_assets_tests.stall_child CORPUS OUT URL DEADLINE_S

A tiny target's shape (2 layers, width 8, aux ids 0 and 1, 2 shards) and an identity final
norm: `EngineStateClient` and `EngineExtractor` as the hidden_state_shards asset runs them,
with `DEADLINE_S` for every request's deadline. Prints "done" after the last shard; a failure
is one line on stderr, exit 1.
"""

import sys

import torch

from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, EngineStateError, FinalNorm
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all

LAYERS, HIDDEN, VOCAB = 2, 8, 49152
SETTINGS = ExtractSettings(aux_layer_ids=(0, 1), num_shards=2, progress=False)

if __name__ == "__main__":
    corpus, out, url, deadline = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = EngineStateClient(url, "m", (0, 1, LAYERS), concurrency=2, deadline_base_s=deadline, deadline_per_token_s=0.0)
    try:
        with EngineExtractor(client, SETTINGS, LAYERS, HIDDEN, VOCAB, FinalNorm(torch.ones(HIDDEN), 1e-6)) as extractor:
            extract_all(extractor, corpus, out, SETTINGS, target_fingerprint="stall-test")
    except EngineStateError as exc:
        print(f"extraction failed: {exc}", file=sys.stderr)
        sys.exit(1)
    print("done", flush=True)
