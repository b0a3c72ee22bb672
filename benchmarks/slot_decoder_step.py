"""Decode-step cost of the in-process generator (`benchmarks/slot_decoder.py`): fp32 next to bf16,
eager steps next to CUDA-graph replays (on a GPU).

    python3 benchmarks/slot_decoder_step.py                    # GPU: SmolLM2-135M-shaped, 1024 slots
    python3 benchmarks/slot_decoder_step.py --smoke            # CPU: 2 layers, 8 slots

A random-weight model of the embedded target's shape (no download: the cost of a step does not
depend on the weights) fills every slot with a prompt, then decodes. Printed per dtype: prefill
time, step time, the tokens/s that `slots / step time` would give (the decoder's own limit,
without the client's host work), and the ratio bf16 / fp32; `--profile N` adds one step's N
costliest operators. Comparing the limit with the corpus stage's measured tokens/s says whether
the GPU or the host bounds generation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from profiling import print_profile  # noqa: E402  (benchmarks/profiling.py, beside this script)

from benchmarks.slot_decoder import SlotDecoder  # noqa: E402


def smollm2_shaped(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model, dtype: torch.dtype, a, device: torch.device, graphs: bool = False) -> dict:
    model = model.to(device=device, dtype=dtype).eval()
    decoder = SlotDecoder(model, slots=a.slots, max_len=a.max_len, cuda_graphs=graphs)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 49152, (a.prompt_len,), generator=g).tolist() for _ in range(a.slots)]
    start = time.perf_counter()
    for first in range(0, a.slots, a.prefill_rows):
        rows = list(range(first, min(a.slots, first + a.prefill_rows)))
        decoder.prefill(rows, [prompts[r] for r in rows], [0.0] * len(rows), [1.0] * len(rows))
    sync(device)
    prefill_s = time.perf_counter() - start
    for _ in range(3):  # warm-up
        decoder.step()
    sync(device)
    start = time.perf_counter()
    for _ in range(a.steps):
        decoder.step()
    sync(device)
    step_s = (time.perf_counter() - start) / a.steps
    if a.profile:
        print_profile(decoder.step, device, a.profile, name_width=60)
    del decoder
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "graphs": graphs,
        "prefill_s": prefill_s,
        "step_ms": step_s * 1e3,
        "tokens_per_s": a.slots / step_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="2 layers, 8 slots, CPU")
    ap.add_argument("--slots", type=int, default=1024)
    ap.add_argument("--prompt-len", type=int, default=384, help="tokens already in each slot: the attention span")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill-rows", type=int, default=64)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    layers = 30
    if a.smoke:
        layers, a.slots, a.prompt_len, a.max_len, a.steps, a.prefill_rows = 2, 8, 16, 64, 4, 4
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as the corpus stage runs it
    model = smollm2_shaped(layers)
    dtypes = [getattr(torch, d) for d in a.dtypes]
    modes = [False, True] if device.type == "cuda" else [False]
    rows = [measure(model, dt, a, device, graphs) for dt in dtypes for graphs in modes]
    print(f"device {device}; {layers} layers, {a.slots} slots, {a.prompt_len} tokens in each")
    print(f"{'dtype':>9} {'step as':>10} {'prefill s':>10} {'step ms':>9} {'tokens/s':>10}")
    for r in rows:
        print(f"{r['dtype']:>9} {'CUDA graph' if r['graphs'] else 'eager':>10} {r['prefill_s']:10.2f} {r['step_ms']:9.2f} {r['tokens_per_s']:10.0f}")
    by = {(r["dtype"], r["graphs"]): r["tokens_per_s"] for r in rows}
    for d in a.dtypes:
        if (d, True) in by:
            print(f"{d}: CUDA graph / eager tokens/s: {by[(d, True)] / by[(d, False)]:.2f}x")
    if ("float32", False) in by and ("bfloat16", False) in by:
        print(f"eager bf16 / fp32 tokens/s: {by[('bfloat16', False)] / by[('float32', False)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
