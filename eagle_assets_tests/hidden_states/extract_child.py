"""Runs `extract_all` in its own process, for the crash test to SIGKILL.

    python -m eagle_assets_tests.hidden_states.extract_child CORPUS OUT FINGERPRINT

The model is a tiny plain-PyTorch decoder (`toy_decoder`), so the process starts without
importing transformers. Prints "shard batch num_batches" after each batch and pauses
briefly, so that the test can kill it while a shard is being written.
"""

import sys
import time

import torch
from torch import nn

from eagle_assets.hidden_states.extract import ExtractSettings, extract_all

SETTINGS = ExtractSettings(aux_layer_ids=(0, 1, 2), num_shards=3, batch_tokens=1, progress=False)


class _Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.mix = nn.Linear(hidden, hidden)

    def forward(self, x):  # (B, S, H) -> (B, S, H), residual
        return x + torch.tanh(self.mix(x))


class ToyDecoder(nn.Module):
    """embed_tokens -> layers -> norm: the parts the extraction hooks into, nothing else."""

    def __init__(self, vocab: int = 49152, hidden: int = 32, layers: int = 2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(_Block(hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def toy_decoder(seed: int = 0) -> ToyDecoder:
    torch.manual_seed(seed)
    return ToyDecoder().to(torch.bfloat16).eval()


def on_batch(shard: int, batch: int, num_batches: int) -> None:
    print(shard, batch, num_batches, flush=True)
    time.sleep(0.3)


if __name__ == "__main__":
    corpus, out, fingerprint = sys.argv[1:4]
    extract_all(toy_decoder(), corpus, out, SETTINGS, target_fingerprint=fingerprint, on_batch=on_batch)
    print("done", flush=True)
