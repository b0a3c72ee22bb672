"""Acceptance on the same data: our drafter recipe against SpecForge 0.2.0's, same shards, same steps, same decoder.

    python3 benchmarks/quality_drafter.py --data /tmp/q --stages target,corpus,shards ...   # the data, once
    python3 benchmarks/quality_vs_specforge.py --data /tmp/q --out $OUT --epochs 4 --offline-workers 4 --deadline-s 560
    python3 benchmarks/quality_vs_specforge.py --smoke --data /tmp/s --out /tmp/s/out       # CPU: every stage, tiny

One GPU, no Dagster, no serving engine: it imports only the project's pure modules, the
benchmarks beside it and SpecForge (from `.whl/specforge-0.2.0-*.whl`, `specforge_glue.py`).
It reads a data folder that `quality_drafter.py --stages target,corpus,shards` prepared (the
asset graph's layout: `hidden_states/`, `vocab_mapping.safetensors`, the embedded target in
EAGLE_ASSETS_CACHE) and works in `DATA/<--work>/` (default `vs_specforge`). Stages, each
resumable (a finished one is reused when the command runs again; a training cut by
`--deadline-s` resumes from its last checkpoint, which the deadline writes):

  init       our TrainConfig, exactly as `quality_drafter.py --stages train` builds it for the
             preset (`--epochs N` to shorten); the drafter's initial weights (our trainer's
             seeded initialisation) rounded to bf16, which both sides start from; SpecForge's
             `BF16Optimizer` schedule compared with our `WarmupCosine`, step by step
  ours       our trainer (`drafter/train.py`), in a child process, starting from those weights;
             exported for vLLM by the trainer (`drafter/export.py`)
  specforge  SpecForge's `OnlineEagle3Model` over its `LlamaForCausalLMEagle3` (flex_attention,
             bf16 weights, fp32 masters in its `BF16Optimizer`), in a child process: the same
             micro-batches in the same order (our `BatchPlanner` over the same split), the same
             optimiser steps, peak lr, warm-up and cosine floor (its scheduler's `eta_min` set
             to ours), TTT steps, AdamW betas (set on its param groups) and clip; its own loss
             (teacher from our shards' `final` through `target_hidden_for_compact` and the
             target's lm_head) and its own input shift (`TargetHead.preprocess`)
  export     SpecForge's weights mapped onto our `Eagle3Drafter` (`midlayer.` -> `layers.0.`;
             every tensor accounted for) and exported with our exporter
  check      our drafter on SpecForge's mapped weights gives SpecForge's draft-model logits on
             one held-out batch (fp32); the script fails when it does not
  validate   held-out AL of both exports, replayed along the held-out answers by our trainer's
             own validation (`Trainer.validate`)
  offline    both exports through the reference decoder (`bench.benchmark.offline_results`, as
             quality_drafter.py's offline stage: MT-Bench first turns, fp32 target, the preset
             benchmark's K, prompts and length), `--offline-workers N` processes per drafter on
             the one device, the two drafters at once
  report     JSON to `--out` (with both exports, files over 15 MB in parts), a final table

Timing: each optimiser step is timed by CUDA events around it (data to device, forward,
backward, optimiser update; no host synchronisation added) on the GPU, by the wall clock on a
CPU. Tokens/s = the real (unpadded) tokens of the steps after the first `--timing-skip-steps`
of each process (warm-up and compilation) over their summed time; steps taking over 4x the
median time per token (a recompilation for a new shape) are left out too, on both sides, and
counted in the JSON. Validation, checkpoints and data loading between steps are outside the
steps on both sides.

`--smoke` (CPU) builds a tiny random target (hidden 64, 8 layers, the embedded SmolLM2's
tokenizer) and tiny shards on its widths (synthetic states, tokens that follow a fixed chain)
and runs every stage on them, 2 prompts of 16 tokens offline; SpecForge's training forward
needs its Triton loss (a GPU kernel), so on a CPU its training is skipped, said so in the
output and the JSON, and its "trained" weights are the shared initial weights: the rest of its
path (model, weights, optimiser and schedule, mapping, export, logits check, validation,
offline) runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
for p in (str(PROJECT_ROOT), str(BENCH_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

import quality_drafter as qd  # noqa: E402  (benchmarks/quality_drafter.py)
import torch  # noqa: E402
from specforge_glue import (  # noqa: E402
    SPECFORGE_VERSION,
    STEP_DECAY,
    import_specforge,
    ours_from_specforge,
    shift_batch,
    specforge_config,
    specforge_state,
)

from eagle_assets.drafter.train import WarmupCosine  # noqa: E402
from eagle_assets.durable import file_sha256  # noqa: E402

STAGES = ("init", "ours", "specforge", "export", "check", "validate", "offline", "report")
SIDES = ("ours", "specforge")
INITIAL_WEIGHTS = "initial_weights.safetensors"
DRAFTER_CONFIG = "drafter_config.json"
FINAL_STATE = "final_state.safetensors"  # SpecForge's trained draft weights, its own names, bf16
SUMMARY = "summary.json"
TIMING = "timing.json"
EXPORT = "drafter-vllm"
RESULTS = "quality_vs_specforge.json"
OUTLIER_FACTOR = 4.0  # a step over 4x the median time per token is a (re)compilation
LOGITS_REL_TOL = 1e-3  # fp32 on both sides: max |difference| <= this x max |logit|
DEADLINE_EXIT = 3  # a worker stopped by the deadline (checkpoint written): run again
SMOKE_SAMPLES, SMOKE_SHARDS, SMOKE_DRAFT_VOCAB = 24, 2, 256
SMOKE_TARGET = "smoke_target"  # under --data: the smoke run's tiny target


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.is_file() else default


class DeadlineReached(Exception):
    """A training stopped at `--deadline-s` after writing a checkpoint of the step it had reached."""


# ----------------------------------------------------------------------------- settings


def embedded_target() -> Path:
    from eagle_assets.targets.embedded import pull

    return pull(log=lambda m: None)


def target_of(a, data: Path) -> tuple[Path, tuple[int, ...]]:
    """The target and the aux layer ids training reads: the embedded SmolLM2 and its preset's ids
    (as quality_drafter.py's stages), or the smoke run's tiny target and its default ids."""
    from eagle_assets.targets import EMBEDDED_TARGET, default_aux_layer_ids, get_preset

    if a.smoke:
        folder = data / SMOKE_TARGET
        return folder, tuple(default_aux_layer_ids(json.loads((folder / "config.json").read_text())["num_hidden_layers"]))
    return embedded_target(), tuple(get_preset(EMBEDDED_TARGET).default_aux_layer_ids)


def train_config(a, data: Path, work: Path, target: Path, aux: tuple[int, ...]):
    """Our run, exactly as `quality_drafter.stage_train` builds it for the preset (no variant
    options), exporting for vLLM only (the comparison serves nothing else)."""
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.targets import EMBEDDED_TARGET, get_preset

    preset, d = get_preset(EMBEDDED_TARGET), qd.settings_of(a.preset, "drafter_checkpoint")
    return TrainConfig(
        shard_dirs=(str(data / "hidden_states"),),
        vocab_mapping=str(data / "vocab_mapping.safetensors"),
        drafter=None,
        target=str(target),
        out_dir=str(work / "ours"),
        ttt_steps=d["ttt_steps"] or preset.ttt_steps,
        epochs=a.epochs or d["epochs"],
        max_steps=d["max_steps"],
        lr=d["lr"],
        warmup_steps=d["warmup_steps"],
        target_temperature=1.0,
        unreached_weight=1.0,
        drafter_intermediate_size=d["drafter_intermediate_size"],
        micro_batch_tokens=d["micro_batch_tokens"],
        grad_accum=d["grad_accum"],
        val_fraction=d["val_fraction"],
        val_interval=d["val_interval"],
        checkpoint_every=d["checkpoint_every"],
        seed=d["seed"],
        drafter_num_layers=1,
        aux_layer_ids=aux,
        ptd_token_id=None,
        export_engines=("vllm",),
    )


def planner_for(cfg):
    """Our trainer's dataset, split and batch plan for `cfg` (one process: world_size 1)."""
    from eagle_assets.drafter.data import BatchingSpec, BatchPlanner, ShardDataset

    ds = ShardDataset(cfg.shard_dirs, cfg.max_seq_len, aux_layer_ids=cfg.aux_layer_ids)
    train_ids, val_ids = ds.split(cfg.val_fraction)
    spec = BatchingSpec(
        micro_batch_tokens=cfg.micro_batch_tokens,
        micro_batch_samples=cfg.micro_batch_samples,
        batches_per_step=cfg.grad_accum,
        length_window=cfg.length_window,
    )
    planner = BatchPlanner(ds.lengths(train_ids), train_ids, spec, cfg.seed)
    total = cfg.max_steps if cfg.max_steps is not None else planner.total_steps(cfg.epochs, None)
    return ds, train_ids, val_ids, planner, total


def load_drafter_config(work: Path):
    from eagle_assets.drafter.config import DrafterConfig

    return DrafterConfig.from_dict(read_json(work / "init" / DRAFTER_CONFIG))


def load_initial_weights(work: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(work / "init" / INITIAL_WEIGHTS))


# ----------------------------------------------------------------------------- step timing


class StepClock:
    """Each optimiser step's time and real tokens: CUDA events around the step on a GPU (no host
    synchronisation per step), the wall clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.rows: list[list[float]] = []  # [tokens, ms] per step, in order
        self.pending: list[tuple[int, object, object]] = []
        self.first_step: int | None = None
        self.loop_start: float | None = None
        self.loop_end: float | None = None  # when the last step was issued

    @contextlib.contextmanager
    def step(self, step: int, tokens: int):
        if self.first_step is None:
            self.first_step, self.loop_start = step, time.perf_counter()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.loop_end = time.perf_counter()
            self.pending.append((tokens, start, end))
            if len(self.pending) > 256:  # the oldest ones finished long ago: resolving them does not wait
                self._resolve(len(self.pending) - 128)
        else:
            t0 = time.perf_counter()
            yield
            self.loop_end = time.perf_counter()
            self.rows.append([tokens, (self.loop_end - t0) * 1e3])

    def _resolve(self, n: int) -> None:
        for tokens, start, end in self.pending[:n]:
            end.synchronize()
            self.rows.append([tokens, start.elapsed_time(end)])
        del self.pending[:n]

    def segment(self) -> dict | None:
        """This process's steps, for `timing.json`; None when it ran none. `loop_wall_s`: from the
        first step's start to the last step's issue, everything between the steps included."""
        self._resolve(len(self.pending))
        if not self.rows:
            return None
        return {"first_step": self.first_step, "steps": len(self.rows), "loop_wall_s": self.loop_end - self.loop_start, "rows": self.rows}


def save_timing(out: Path, segment: dict | None) -> None:
    if segment is None:
        return
    timing = read_json(out / TIMING, {"segments": []})
    timing["segments"].append(segment)
    write_json(out / TIMING, timing)


def timing_summary(out: Path, skip: int) -> dict:
    """Tokens/s over the steps after the first `skip` of each process, without recompilation outliers."""
    segments = read_json(out / TIMING, {"segments": []})["segments"]
    every = [r for s in segments for r in s["rows"]]
    steady = [r for s in segments for r in s["rows"][skip:]]
    if not steady:
        return {
            "segments": len(segments),
            "steps_timed": len(every),
            "tokens_per_s": None,
            "why": f"no step after the first {skip} of a process was timed",
        }
    per_token = sorted(ms / max(tok, 1) for tok, ms in steady)
    median = per_token[len(per_token) // 2]
    kept = [r for r in steady if r[1] / max(r[0], 1) <= OUTLIER_FACTOR * median]
    rate = lambda rows: sum(r[0] for r in rows) / (sum(r[1] for r in rows) / 1e3)  # noqa: E731
    return {
        "tokens_per_s": rate(kept),
        "tokens_per_s_with_outliers": rate(steady),
        "tokens_per_s_all_steps": rate(every),
        "steps_timed": len(kept),
        "outlier_steps": len(steady) - len(kept),
        "warmup_steps_skipped": len(every) - len(steady),
        "timed_tokens": int(sum(r[0] for r in kept)),
        "timed_s": sum(r[1] for r in kept) / 1e3,
        "segments": len(segments),
        "loop_wall_s": sum(s["loop_wall_s"] for s in segments),
        "steps_all_segments": len(every),
        "tokens_per_s_loop_wall": sum(r[0] for r in every) / max(sum(s["loop_wall_s"] for s in segments), 1e-9),
    }


# ----------------------------------------------------------------------------- smoke data


def build_smoke_target(folder: Path, seed: int = 0) -> Path:
    """A tiny random Llama (hidden 64, 8 layers) with the embedded target's tokenizer and chat
    template: what the smoke run's trainer, validation and reference decoder read as the target,
    at a cost a CPU test affords."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors").is_file():
        return folder
    source = embedded_target()
    base = json.loads((source / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=base["vocab_size"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=base.get("bos_token_id"),
        eos_token_id=base.get("eos_token_id"),
        pad_token_id=base.get("pad_token_id"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    os.replace(tmp, folder)
    return folder


def build_smoke_data(data: Path, seed: int = 0) -> dict:
    """Tiny shards for the smoke target, written in the asset graph's layout: tokens follow a
    fixed chain over a few hundred ids (x_{t+1} = chain[x_t]), the final state points at
    lm_head's row of the next token (a peaked target), aux states are a per-token table plus
    noise. Learnable, so training moves the drafter; no target forward is run."""
    from safetensors.torch import save_file

    from eagle_assets.drafter.target_head import read_target_head
    from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, ShardManifest, shard_name, shard_of, stable_id
    from eagle_assets.hidden_states.vocab import build_vocab_mapping, save_vocab_mapping
    from eagle_assets.targets import default_aux_layer_ids

    target = build_smoke_target(data / SMOKE_TARGET, seed)
    if (data / "hidden_states").is_dir() and (data / "vocab_mapping.safetensors").is_file():
        return {"built": False}
    _, lm_head = read_target_head(target)  # (V, H) bf16
    V, H = lm_head.shape
    aux_ids = list(default_aux_layer_ids(json.loads((target / "config.json").read_text())["num_hidden_layers"]))
    g = torch.Generator().manual_seed(seed)
    ids_used = torch.randperm(V, generator=g)[: SMOKE_DRAFT_VOCAB * 3 // 4]  # every one of them a draft token
    chain = torch.zeros(V, dtype=torch.long)
    chain[ids_used] = ids_used[torch.randperm(len(ids_used), generator=g)]
    table = torch.zeros(V, len(aux_ids) * H)
    table[ids_used] = torch.randn(len(ids_used), len(aux_ids) * H, generator=g)
    samples = []
    for i in range(SMOKE_SAMPLES):
        n = int(torch.randint(16, 41, (1,), generator=g))
        ids = [int(ids_used[torch.randint(len(ids_used), (1,), generator=g)])]
        for _ in range(n - 1):
            ids.append(int(chain[ids[-1]]))
        ids = torch.tensor(ids)
        rows = lm_head[torch.cat([ids[1:], ids[-1:]])].float()  # (n, H): the next token's rows
        final = 4.0 * math.sqrt(H) * rows / rows.norm(dim=-1, keepdim=True) + 0.3 * torch.randn(n, H, generator=g)
        mask = torch.ones(n, dtype=torch.uint8)
        mask[:4] = 0  # a prompt
        samples.append(
            {
                "sample_id": stable_id("smoke", seed, i),
                "input_ids": ids,
                "loss_mask": mask,
                "aux": table[ids] + 0.1 * torch.randn(n, len(aux_ids) * H, generator=g),
                "final": final,
            }
        )
    counts = torch.zeros(V, dtype=torch.int64)
    for smp in samples:
        counts += torch.bincount(smp["input_ids"][smp["loss_mask"].bool()], minlength=V)
    save_vocab_mapping(build_vocab_mapping(counts, V, SMOKE_DRAFT_VOCAB), data / "vocab_mapping.safetensors")
    by_shard: dict[int, list[dict]] = {}
    for smp in samples:
        by_shard.setdefault(shard_of(smp["sample_id"], SMOKE_SHARDS), []).append(smp)
    for k, group in sorted(by_shard.items()):
        folder = data / "hidden_states" / shard_name(k)
        folder.mkdir(parents=True, exist_ok=True)
        lengths = [len(smp["input_ids"]) for smp in group]
        save_file(
            {
                "offsets": torch.tensor([0] + lengths).cumsum(0).to(torch.int64),
                "input_ids": torch.cat([smp["input_ids"] for smp in group]).to(torch.int32),
                "aux": torch.cat([smp["aux"] for smp in group]).to(torch.bfloat16),
                "final": torch.cat([smp["final"] for smp in group]).to(torch.bfloat16),
                "loss_mask": torch.cat([smp["loss_mask"] for smp in group]).to(torch.uint8),
            },
            str(folder / SHARD_STATES_FILE),
        )
        manifest = ShardManifest(
            shard=k,
            num_shards=SMOKE_SHARDS,
            sample_ids=[smp["sample_id"] for smp in group],
            token_counts=lengths,
            aux_layer_ids=aux_ids,
            hidden_size=H,
            target_fingerprint="smoke",
            corpus_fingerprint="smoke",
        )
        (folder / SHARD_MANIFEST_FILE).write_text(manifest.to_json())
    return {"built": True, "samples": len(samples), "tokens": sum(len(smp["input_ids"]) for smp in samples)}


def check_data(data: Path) -> None:
    missing = [p for p in (data / "hidden_states", data / "vocab_mapping.safetensors") if not p.exists()]
    if missing:
        raise SystemExit(
            f"{data} is not a prepared data folder ({', '.join(str(p) for p in missing)} missing): run "
            f"`python3 benchmarks/quality_drafter.py --data {data} --stages target,corpus,shards` first (or pass --smoke)"
        )


# ----------------------------------------------------------------------------- SpecForge pieces


def make_bf16_optimizer(sf: dict, draft: torch.nn.Module, cfg, total: int):
    """SpecForge's `BF16Optimizer` with our schedule, as far as its options reach.

    Warm-up: its `warmup_ratio` chosen so that int(ratio x total) is our warm-up step count.
    Cosine floor: it leaves its `CosineAnnealingWarmupLR`'s `eta_min` at 0; set to ours
    (min_lr_ratio x lr) on that scheduler. Betas: it builds `torch.optim.AdamW` with torch's
    defaults (0.9, 0.999) and has no option for them; set to ours on its param groups.
    """
    if not cfg.cosine and cfg.warmup_steps >= total:
        raise ValueError(f"SpecForge's constant schedule needs fewer warm-up steps ({cfg.warmup_steps}) than steps ({total})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = sf["BF16Optimizer"](
            draft,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.grad_clip if cfg.grad_clip is not None else float("inf"),
            total_steps=total,
            warmup_ratio=(cfg.warmup_steps + 0.5) / total,
            lr_scheduler="cosine" if cfg.cosine else "constant",
        )
    if opt.scheduler.warmup_epochs != cfg.warmup_steps:
        raise RuntimeError(f"SpecForge's warm-up came out at {opt.scheduler.warmup_epochs} steps, ours is {cfg.warmup_steps}")
    for group in opt.optimizer.param_groups:
        group["betas"] = tuple(cfg.betas)
    if cfg.cosine:
        opt.scheduler.after_scheduler.eta_min = cfg.min_lr_ratio * cfg.lr
    return opt


def restore_bf16_optimizer(opt, state: dict) -> None:
    """`BF16Optimizer.load_state_dict` without its log line, which asks torch.distributed for the
    rank and so fails in a process without a process group (this benchmark runs one process and
    starts none: `BF16Optimizer.step` then skips its gradient-norm all-reduce, a no-op at one rank)."""
    opt.optimizer.load_state_dict(state["optimizer_state_dict"])
    opt.scheduler.load_state_dict(state["scheduler_state_dict"])
    with torch.no_grad():
        for saved, master in zip(state["fp32_params"], opt.fp32_params, strict=True):
            master.copy_(saved.to(master.device, master.dtype))


def schedule_check(sf: dict, cfg, total: int) -> dict:
    """The learning rate of every step under SpecForge's scheduler (as `make_bf16_optimizer` sets
    it up) against our trainer's `WarmupCosine`, as fractions of the peak. (Where torch's chainable
    `CosineAnnealingLR` evaluates its first decay step from the formula at step -1, as 2.13 does,
    SpecForge's decay runs above ours by up to tan^2(pi/2T) ~ (pi/T)^2/4 of the peak, T its cosine steps.)"""
    ours = WarmupCosine(cfg.warmup_steps, total, cfg.min_lr_ratio, cfg.cosine)
    opt = make_bf16_optimizer(sf, torch.nn.Linear(1, 1, bias=False), cfg, total)
    diffs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scheduler steps here without optimiser steps
        for s in range(total):
            diffs.append(abs(opt.optimizer.param_groups[0]["lr"] - cfg.lr * ours(s)) / cfg.lr)
            opt.scheduler.step()
    worst = max(range(total), key=diffs.__getitem__)
    return {
        "steps": total,
        "max_abs_diff_over_peak_lr": diffs[worst],
        "at_step": worst,
        "max_abs_diff_in_warmup": max(diffs[: cfg.warmup_steps], default=0.0),
        "warmup_steps": cfg.warmup_steps,
        "floor": cfg.min_lr_ratio * cfg.lr,
        "betas": list(opt.optimizer.param_groups[0]["betas"]),
        "torch": torch.__version__,
    }


def build_specforge_draft(
    sf: dict, config, state: dict[str, torch.Tensor], embedding: torch.Tensor, d2t, t2d, device: torch.device, backend: str, dtype: torch.dtype
):
    """SpecForge's `LlamaForCausalLMEagle3` holding `state` (SpecForge names, without the
    embedding), the target's embedding (frozen, as its trainer loads it) and the vocab mapping."""
    draft = sf["LlamaForCausalLMEagle3"](specforge_config(config), attention_backend=backend)
    missing, unexpected = draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight", "d2t", "t2d"}:
        raise RuntimeError(f"weight names do not line up with SpecForge's: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embedding.float())
        draft.d2t.copy_(d2t.long())
        draft.t2d.copy_(t2d.bool())
    draft.embed_tokens.weight.requires_grad_(False)
    return draft.to(device=device, dtype=dtype)  # d2t (int64) and t2d (bool) keep their dtypes


def specforge_eager():
    """On a CPU, SpecForge's torch.compile'd helpers (norms, rotary) run eagerly: Inductor would
    spend tens of seconds compiling them for one forward."""
    return torch.compiler.set_stance("force_eager")


# ----------------------------------------------------------------------------- workers (child processes)


def worker_ours(a, work: Path, deadline: float) -> int:
    """Our trainer on `run.json`, starting from the shared initial weights, steps timed."""
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.train import Trainer, setup_distributed

    cfg = TrainConfig.load(work / "run.json")
    initial = load_initial_weights(work)

    class TimedTrainer(Trainer):
        def setup(self):
            super().setup()
            self.clock = StepClock(self.env.device)
            if self.resumed is None:  # a fresh run starts from the shared (bf16-rounded) weights
                drafter = self.objective.drafter
                missing, unexpected = drafter.load_state_dict(initial, strict=False)
                if unexpected or set(missing) - {"embed_tokens.weight", "d2t", "t2d"}:
                    raise RuntimeError(f"initial weights do not fit our drafter: missing {missing}, unexpected {unexpected}")

        def train_step(self, micro_batches):
            if time.time() > deadline:
                # The step about to run is the first one a rerun takes. Before the first step there
                # is nothing to keep (a rerun starts from the initial weights), and a checkpoint would
                # not resume exactly: saving an optimiser without state has torch's state_dict API
                # run one zero-gradient step to create it (AdamW's step count then starts at 1).
                if self.step > 0:
                    self.save()
                raise DeadlineReached(self.step)
            tokens = sum(int(b["lengths"].sum()) for b in micro_batches)
            with self.clock.step(self.step, tokens):
                return super().train_step(micro_batches)

    trainer = TimedTrainer(cfg, setup_distributed())
    try:
        trainer.run()
    except DeadlineReached as stop:
        save_timing(Path(cfg.out_dir), trainer.clock.segment())
        log(f"ours: deadline at step {stop.args[0]}; run again to continue from there")
        return DEADLINE_EXIT
    save_timing(Path(cfg.out_dir), trainer.clock.segment())
    return 0


def worker_specforge(a, work: Path, deadline: float) -> int:
    """SpecForge's training on our batch plan; writes its final weights and summary."""
    from safetensors.torch import save_file

    from eagle_assets.drafter.data import Prefetcher, SamplerState
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.target_head import read_target_head
    from eagle_assets.hidden_states.vocab import load_vocab_mapping

    cfg = TrainConfig.load(work / "run.json")
    out = work / "specforge"
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sf, why = import_specforge(training=True)
    if sf is None:
        raise SystemExit(f"SpecForge cannot train here: {why}")
    ds, train_ids, _, planner, total = planner_for(cfg)
    expected_total = read_json(work / "init" / "plan.json")["total_steps"]
    if total != expected_total:
        raise RuntimeError(f"the batch plan has {total} steps, init planned {expected_total}")
    config = load_drafter_config(work)
    mapping = load_vocab_mapping(cfg.vocab_mapping)
    embedding, lm_head = read_target_head(cfg.target)
    head = lm_head.to(device, torch.bfloat16)  # (V, Ht): its compact teacher reads the whole lm_head
    backend = a.specforge_attention
    draft = build_specforge_draft(
        sf, config, specforge_state(load_initial_weights(work)), embedding, mapping.d2t, mapping.t2d, device, backend, torch.bfloat16
    )
    model = sf["OnlineEagle3Model"](draft, length=cfg.ttt_steps, attention_backend=backend)
    model.train()
    opt = make_bf16_optimizer(sf, draft, cfg, total)
    step, sampler, tokens_seen = 0, SamplerState(), 0
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)  # written by this function
        draft.load_state_dict(ckpt["draft"], strict=False)
        restore_bf16_optimizer(opt, ckpt["optimizer"])
        step, sampler, tokens_seen = ckpt["step"], SamplerState.from_dict(ckpt["sampler"]), ckpt["tokens_seen"]
        log(f"specforge: resumed at step {step} (epoch {sampler.epoch}, step {sampler.step} of it)")

    def save_checkpoint() -> None:
        state = {k: v.detach().cpu() for k, v in draft.state_dict().items() if not k.startswith("embed_tokens.")}
        tmp = out / ".checkpoint.pt.tmp"
        torch.save({"step": step, "sampler": sampler.to_dict(), "tokens_seen": tokens_seen, "draft": state, "optimizer": opt.state_dict()}, tmp)
        os.replace(tmp, ckpt_path)

    pad = sf["padding"]
    epoch_limit = cfg.epochs if cfg.max_steps is None else sys.maxsize

    def batches():
        for here, step_batches in planner.iterate(SamplerState(sampler.epoch, sampler.step), epoch_limit):
            collated = [ds.collate(b, torch.bfloat16) for b in step_batches]
            if device.type == "cuda":
                collated = [{k: v.pin_memory() for k, v in b.items()} for b in collated]
            yield SamplerState(here.epoch, here.step + 1), collated

    clock = StepClock(device)
    metrics_file = out / "metrics.jsonl"
    if metrics_file.is_file():  # rows past the resumed step are logged again
        keep = [line for line in metrics_file.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        metrics_file.write_text("".join(line + "\n" for line in keep))
    log(f"specforge: training {total} steps from step {step} on {device} ({backend}, bf16 weights, TTT {cfg.ttt_steps})")
    window_tokens, window_start, last = 0, time.perf_counter(), None
    stream = Prefetcher(batches(), depth=2)
    try:
        for next_pos, micro in stream:
            if step >= total:
                break
            if time.time() > deadline:
                if step > 0:  # before the first step a rerun starts from the initial weights anyway
                    save_checkpoint()
                save_timing(out, clock.segment())
                log(f"specforge: deadline at step {step}; run again to continue from there")
                return DEADLINE_EXIT
            tokens = sum(int(b["lengths"].sum()) for b in micro)
            lr = opt.get_learning_rate()
            with clock.step(step, tokens):
                for b in micro:
                    b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
                    plosses, _, acces, *_ = model(target=None, target_head_weight=head, **shift_batch(b, pad))
                    loss = sum(STEP_DECAY**i * p for i, p in enumerate(plosses)) / len(micro)
                    loss.backward()
                opt.step()
            step, sampler, tokens_seen = step + 1, next_pos, tokens_seen + tokens
            window_tokens += tokens
            last = (loss.detach(), [x.detach() for x in acces])
            if cfg.log_every and (step % cfg.log_every == 0 or step == total):
                now = time.perf_counter()
                row = {
                    "step": step,
                    "loss": float(last[0]) * len(micro),
                    "acc": [float(x) for x in last[1]],
                    "lr": lr,
                    "tokens_per_s": window_tokens / max(now - window_start, 1e-9),
                    "epoch": sampler.epoch,
                    "tokens_seen": tokens_seen,
                }
                if not math.isfinite(row["loss"]):
                    raise FloatingPointError(f"SpecForge's loss is {row['loss']} at step {step}")
                with open(metrics_file, "a") as f:
                    f.write(json.dumps(row) + "\n")
                window_tokens, window_start = 0, now
                if step % (cfg.log_every * 50) == 0 or step == total:
                    log(f"specforge: step {step}/{total}, loss {row['loss']:.4f}, acc {[round(x, 3) for x in row['acc']]}, lr {lr:.3g}")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total:
                save_checkpoint()
    finally:
        stream.close()
    save_checkpoint()
    save_timing(out, clock.segment())
    final = {
        k: v.detach().cpu().to(torch.bfloat16) if v.is_floating_point() else v.detach().cpu()
        for k, v in draft.state_dict().items()
        if not k.startswith("embed_tokens.")
    }
    save_file(final, str(out / FINAL_STATE))
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()] if metrics_file.is_file() else []
    write_json(
        out / SUMMARY,
        {
            "trained": True,
            "steps": step,
            "tokens_seen": tokens_seen,
            "epochs": cfg.epochs,
            "final_loss": rows[-1]["loss"] if rows else None,
            "final_acc": rows[-1]["acc"] if rows else None,
            "attention": backend,
            "where": sf["where"],
        },
    )
    log(f"specforge: trained {step} steps")
    return 0


def specforge_untrained(work: Path, why: str) -> dict:
    """Where SpecForge cannot train: its draft model built and loaded from the shared initial
    weights, its optimiser built with our schedule, and those initial weights written as its
    "final" weights, so the mapping, export, check, validation and offline stages still run."""
    from safetensors.torch import save_file

    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.target_head import read_target_embedding
    from eagle_assets.hidden_states.vocab import load_vocab_mapping

    cfg = TrainConfig.load(work / "run.json")
    out = work / "specforge"
    out.mkdir(parents=True, exist_ok=True)
    sf, err = import_specforge(training=False)
    if sf is None:
        raise RuntimeError(f"SpecForge's draft model does not import either: {err}")
    config, mapping = load_drafter_config(work), load_vocab_mapping(cfg.vocab_mapping)
    with specforge_eager():
        draft = build_specforge_draft(
            sf,
            config,
            specforge_state(load_initial_weights(work)),
            read_target_embedding(cfg.target),
            mapping.d2t,
            mapping.t2d,
            torch.device("cpu"),
            "flex_attention",
            torch.bfloat16,
        )
    total = read_json(work / "init" / "plan.json")["total_steps"]
    opt = make_bf16_optimizer(sf, draft, cfg, total)
    final = {k: v.detach().cpu() for k, v in draft.state_dict().items() if not k.startswith("embed_tokens.")}
    save_file(final, str(out / FINAL_STATE))
    summary = {
        "trained": False,
        "steps": 0,
        "tokens_seen": 0,
        "epochs": cfg.epochs,
        "why_not_trained": why,
        "built": {
            "draft_model": "LlamaForCausalLMEagle3 (flex_attention, bf16)",
            "optimizer": type(opt).__name__,
            "trainable_tensors": len(opt.model_params),
        },
        "where": sf["where"],
    }
    write_json(out / SUMMARY, summary)
    return summary


# ----------------------------------------------------------------------------- stages (main process)


def stage_init(a, data: Path, work: Path) -> dict:
    from safetensors.torch import save_file

    from eagle_assets.drafter.data import describe
    from eagle_assets.drafter.model import Eagle3Drafter
    from eagle_assets.drafter.train import resolve_drafter_config
    from eagle_assets.hidden_states.vocab import load_vocab_mapping

    target, aux = target_of(a, data)
    cfg = train_config(a, data, work, target, aux)
    saved = work / "run.json"
    if saved.is_file() and read_json(saved) != json.loads(cfg.to_json()):
        old, new = read_json(saved), json.loads(cfg.to_json())
        diff = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
        raise SystemExit(f"{work} holds a comparison run with other settings {diff}: pass another --work, or delete {work}")
    cfg.save(saved)
    ds, train_ids, val_ids, planner, total = planner_for(cfg)
    mapping = load_vocab_mapping(cfg.vocab_mapping)
    target_config = json.loads((target / "config.json").read_text())
    config = resolve_drafter_config(cfg, target_config, ds.aux_layer_ids, int(mapping.d2t.shape[0]))
    torch.manual_seed(cfg.seed)  # what our trainer's build_drafter does before building the drafter
    drafter = Eagle3Drafter(config)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in drafter.trainable_state_dict().items() if k not in ("d2t", "t2d")}
    (work / "init").mkdir(parents=True, exist_ok=True)
    save_file(weights, str(work / "init" / INITIAL_WEIGHTS))
    write_json(work / "init" / DRAFTER_CONFIG, config.to_dict())
    plan = {
        "total_steps": total,
        "steps_per_epoch": [planner.steps_per_epoch(e) for e in range(min(cfg.epochs, 3))],
        "train_samples": len(train_ids),
        "val_samples": len(val_ids),
        "train_tokens": sum(ds.lengths(train_ids)),
        "data": describe(ds, train_ids, val_ids),
    }
    write_json(work / "init" / "plan.json", plan)
    sf, why = import_specforge(training=False)
    schedule = schedule_check(sf, cfg, total) if sf is not None else {"skipped": why}
    log(
        f"init: {plan['data']}; {total} steps ({cfg.epochs} epochs); SpecForge's schedule vs ours: "
        + (f"max |lr difference| {schedule['max_abs_diff_over_peak_lr']:.2e} of the peak" if sf else why)
    )
    return {
        "plan": plan,
        "schedule": schedule,
        "drafter_config": config.to_dict(),
        "run": json.loads(cfg.to_json()),
        "target": str(target),
        "initial_weights_sha256": file_sha256(work / "init" / INITIAL_WEIGHTS),
    }


def specforge_cpu_block(a) -> str:
    """Why SpecForge cannot train on this CPU; "" when it can: its loss is a Triton kernel, which
    a CPU runs only under Triton's interpreter (triton importable, TRITON_INTERPRET=1), and torch's
    flex_attention has no backward on a CPU, so its sdpa backend (`--specforge-attention sdpa`)."""
    sf, err = import_specforge(training=True)
    if sf is None:
        return err
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "its loss is a Triton GPU kernel; a CPU runs it only under Triton's interpreter (TRITON_INTERPRET=1)"
    if a.specforge_attention != "sdpa":
        return (
            "torch's flex_attention has no backward on a CPU ('FlexAttention does not support backward on CPU'); "
            "--specforge-attention sdpa trains with SpecForge's sdpa backend instead"
        )
    return ""


def run_worker(a, side: str, work: Path, deadline: float) -> int:
    """One training in a child process; killed (with its children) past the deadline's grace."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--data",
        a.data,
        "--work",
        a.work,
        "--device",
        a.device,
        "--worker",
        side,
        "--worker-deadline",
        str(deadline),
        "--specforge-attention",
        a.specforge_attention,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", "30")}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, deadline - time.time() + 90))
    except subprocess.TimeoutExpired:
        log(f"{side}: still running 90 s past the deadline; stopped (run again: it resumes from its last checkpoint)")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return DEADLINE_EXIT


def stage_train(a, side: str, work: Path, deadline: float) -> dict:
    out = work / side
    summary = read_json(out / SUMMARY)
    if summary is not None:
        log(f"{side}: trained earlier ({summary.get('steps')} steps), reused")
    else:
        why = specforge_cpu_block(a) if side == "specforge" and a.device != "cuda" else ""
        if why:
            summary = specforge_untrained(work, why)
            log(f"specforge: training skipped ({why}); built its model and optimiser, its weights stay the shared initial ones")
        else:
            code = run_worker(a, side, work, deadline)
            if code == DEADLINE_EXIT:
                return {"done": False, "why": "deadline: run again to continue from the last checkpoint"}
            if code != 0:
                return {"done": False, "failed": True, "why": f"the {side} training exited with status {code} (its output is above)"}
            summary = read_json(out / SUMMARY)
    timing = timing_summary(out, a.timing_skip_steps)
    keys = (
        "trained",
        "steps",
        "tokens_seen",
        "epochs",
        "final_loss",
        "final_acc",
        "val_al",
        "val_accept",
        "seconds",
        "precision",
        "why_not_trained",
        "built",
        "attention",
        "where",
    )
    return {"summary": {k: summary[k] for k in keys if k in summary}, "timing": timing}


def stage_export(work: Path) -> dict:
    """SpecForge's final weights onto our drafter, exported with our exporter; both exports' sizes."""
    from safetensors.torch import load_file

    from eagle_assets.drafter.export import export_vllm
    from eagle_assets.drafter.model import Eagle3Drafter

    config = load_drafter_config(work)
    mapped = ours_from_specforge(load_file(str(work / "specforge" / FINAL_STATE)), config)
    model = Eagle3Drafter(config)
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    if unexpected or set(missing) != {"embed_tokens.weight"}:
        raise RuntimeError(f"SpecForge's weights do not fill our drafter: missing {missing}, unexpected {unexpected}")
    export_vllm(model, config, work / "specforge" / EXPORT)
    result = {"mapped_tensors": len(mapped), "our_tensors": len(model.trainable_state_dict()), "mapping": "midlayer. -> layers.0."}
    for side in SIDES:
        weights = work / side / EXPORT / "model.safetensors"
        if weights.is_file():  # ours exists once its training finished
            result[side] = {"path": str(weights.parent), "bytes": weights.stat().st_size, "sha256": file_sha256(weights)}
    log(
        f"export: {result['mapped_tensors']} of our {result['our_tensors']} tensors filled from SpecForge's; exported to "
        f"{result['specforge']['path']}"
    )
    return result


def check_batch(cfg, device: torch.device, rows: int = 4) -> dict[str, torch.Tensor]:
    """A held-out micro-batch (fp32, at most `rows` samples), the training split's if none is held out."""
    ds, train_ids, val_ids, _, _ = planner_for(cfg)
    chosen = (val_ids or train_ids)[:rows]
    return {k: v.to(device) for k, v in ds.collate(chosen, torch.float32).items()}


@torch.no_grad()
def compare_logits(
    sf: dict, config, state: dict[str, torch.Tensor], ours, embedding: torch.Tensor, d2t, t2d, batch: dict[str, torch.Tensor], backend: str
) -> dict:
    """SpecForge's draft model holding `state` (its names) against our drafter `ours` (on the
    batch's device): the first TTT step's logits (OnlineEagle3Model's step 0: fc of the aux
    states, the shifted tokens' embedding, one decoder pass, lm_head(norm(h))), fp32, compared
    at every unpadded position. ok: max |difference| <= LOGITS_REL_TOL x max |logit|."""
    from transformers.cache_utils import DynamicCache

    device = batch["input_ids"].device
    shifted = shift_batch(batch, sf["padding"])
    valid = shifted["attention_mask"].bool()  # (B, T)
    ids, (B, T) = shifted["input_ids"], shifted["input_ids"].shape
    _, h_post = ours(ours.project_hidden_states(shifted["hidden_states"]), input_ids=ids)
    ours_logits = ours.compute_logits(h_post)  # (B, T, N)
    with specforge_eager() if device.type == "cpu" else contextlib.nullcontext():
        draft = build_specforge_draft(sf, config, state, embedding, d2t, t2d, device, backend, torch.float32).eval()
        g = draft.project_hidden_states(shifted["hidden_states"])
        e = draft.embed_input_ids(ids).to(g.dtype)
        positions = torch.arange(T, device=device)[None]
        if backend == "flex_attention":  # as OnlineEagle3Model calls it
            h = draft.backbone(e, g, None, shifted["attention_mask"], positions, past_key_values=DynamicCache(), use_cache=True)
        else:
            mask = draft.prepare_decoder_attention_mask(
                attention_mask=shifted["attention_mask"], hidden_states=g, batch_size=B, seq_length=T, past_key_values_length=0
            )
            h = draft.backbone(e, g, None, mask, positions)
        sf_logits = draft.compute_logits(h)
    diff = float((sf_logits - ours_logits)[valid].abs().max())
    scale = float(ours_logits[valid].abs().max())
    agree = float((sf_logits.argmax(-1) == ours_logits.argmax(-1))[valid].float().mean())
    return {
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "argmax_agreement": agree,
        "positions": int(valid.sum()),
        "ok": diff <= LOGITS_REL_TOL * scale + 1e-6,
    }


def stage_check(a, work: Path) -> dict:
    """Our drafter, loaded from SpecForge's export, against SpecForge's draft model holding its
    final weights, on one held-out batch: with flex_attention (its training backend) and sdpa on
    a GPU; on a CPU with sdpa alone (flex_attention compiles through Inductor there, ~30 s a shape)."""
    from safetensors.torch import load_file

    from eagle_assets.drafter.export import load_drafter
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.target_head import read_target_embedding
    from eagle_assets.hidden_states.vocab import load_vocab_mapping
    from eagle_assets.precision import use_exact_fp32

    cfg = TrainConfig.load(work / "run.json")
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    sf, why = import_specforge(training=False)
    if sf is None:
        raise RuntimeError(f"the logits check needs SpecForge's draft model: {why}")
    use_exact_fp32(device)  # fp32 on both sides (no TF32), as the reference decoder runs
    config, mapping = load_drafter_config(work), load_vocab_mapping(cfg.vocab_mapping)
    embedding = read_target_embedding(cfg.target, torch.float32)
    ours, _ = load_drafter(work / "specforge" / EXPORT, dtype=torch.float32)
    ours.load_target_embedding(embedding)
    ours.to(device).eval()
    batch = check_batch(cfg, device)
    state = load_file(str(work / "specforge" / FINAL_STATE))
    results = {}
    for backend in ["flex_attention", "sdpa"] if device.type == "cuda" else ["sdpa"]:
        r = results[backend] = compare_logits(sf, config, state, ours, embedding, mapping.d2t, mapping.t2d, batch, backend)
        log(
            f"check ({backend}): max |logit difference| {r['max_abs_diff']:.3g} (max |logit| {r['max_abs_logit']:.3g}, tolerance "
            f"{LOGITS_REL_TOL:g} of it), argmax agreement {r['argmax_agreement']:.4f} over {r['positions']} positions: "
            + ("same logits" if r["ok"] else "DIFFERENT LOGITS")
        )
    return {
        "ok": all(r["ok"] for r in results.values()),
        "samples": int(batch["input_ids"].shape[0]),
        "backends": results,
        "tolerance_rel": LOGITS_REL_TOL,
    }


def validation_of(cfg, export: Path, scratch: Path) -> dict:
    """Held-out loss, p_k and AL of the drafter in `export`, by our trainer's own validation
    (`Trainer.setup` on the same shards and split, then `Trainer.validate`)."""
    from eagle_assets.drafter.export import load_drafter
    from eagle_assets.drafter.train import Trainer, setup_distributed

    trainer = Trainer(cfg.replace(out_dir=str(scratch), resume=False, export_engines=(), log_every=0), setup_distributed())
    trainer.setup()
    model, _ = load_drafter(export, dtype=torch.float32)
    missing, unexpected = trainer.objective.drafter.load_state_dict(model.trainable_state_dict(), strict=False)
    if unexpected or set(missing) != {"embed_tokens.weight"}:
        raise RuntimeError(f"{export} does not fit the validation drafter: missing {missing}, unexpected {unexpected}")
    metrics = trainer.validate()
    shutil.rmtree(scratch, ignore_errors=True)
    return {k: metrics.get(k) for k in ("val_al", "val_accept", "val_loss", "val_tokens", "val_rounds", "val_acc")}


def stage_validate(work: Path, sides: list[str]) -> dict:
    from eagle_assets.drafter.run_config import TrainConfig

    cfg = TrainConfig.load(work / "run.json")
    out = {}
    for side in sides:
        out[side] = validation_of(cfg, work / side / EXPORT, work / f".validate-{side}")
        log(f"validate {side}: held-out AL {out[side]['val_al']:.3f}, p_k {[round(p, 3) for p in out[side]['val_accept']]}")
    return out


def bench_settings(a):
    """The reference decoder's settings: the preset benchmark's prompts, answer length and K
    (`--offline-num-prompts` / `--offline-output-len` override), as quality_drafter.py's offline stage."""
    from eagle_assets.bench.settings import BenchmarkSettings
    from eagle_assets.targets import EMBEDDED_TARGET, get_preset

    b = qd.settings_of(a.preset, "benchmark_report")
    return BenchmarkSettings(
        num_prompts=a.offline_num_prompts or b["num_prompts"],
        output_len=a.offline_output_len or b["output_len"],
        k=b["k"] or get_preset(EMBEDDED_TARGET).ttt_steps,
        concurrencies=(1,),
    )


def offline_settings(a) -> dict:
    s = bench_settings(a)
    return {"num_prompts": s.num_prompts, "output_len": s.output_len, "k": s.k, "workers": a.offline_workers, "prompts": "MT-Bench first turns"}


def worker_offline(a, work: Path) -> int:
    """One reference-decoder process: MT-Bench first turns i, i + N, ... (`--offline-part i/N`)
    of one side's export, fp32 target (`bench.benchmark.offline_results`)."""
    from eagle_assets.bench.benchmark import offline_results
    from eagle_assets.bench.served import mt_bench_categories, mt_bench_prompts
    from eagle_assets.drafter.run_config import TrainConfig

    cfg = TrainConfig.load(work / "run.json")
    settings = bench_settings(a)
    i, n = (int(x) for x in a.offline_part.split("/"))
    prompts, categories = mt_bench_prompts(settings.num_prompts), mt_bench_categories(settings.num_prompts)
    mine = list(range(i, len(prompts), n))
    results = offline_results(Path(cfg.target), work / a.side / EXPORT, [prompts[j] for j in mine], settings, log=lambda m: None, device=a.device)
    rows = [
        {"index": j, "category": categories[j], "tokens": r.tokens, "accepted_per_step": r.accepted_per_step, "answer_end": r.answer_end}
        for j, r in zip(mine, results)
    ]
    write_json(Path(a.offline_out), rows)
    return 0


def stage_offline(a, work: Path, deadline: float, sides: list[str]) -> dict:
    """Both exports through the reference decoder at once, `--offline-workers` processes each on
    the one device; pooled as quality_drafter.py's offline stage pools its parts."""
    from eagle_assets.bench.breakdown import answers_ending_early, offline_slices
    from eagle_assets.bench.parity import AcceptanceNumbers
    from eagle_assets.bench.reference_decoder import Result

    settings = bench_settings(a)
    workers = max(1, min(a.offline_workers, settings.num_prompts))
    procs: dict[str, list] = {}
    start = time.perf_counter()
    # Every process would start one CPU thread per core: share the cores out instead (the work is
    # the device's; the threads only feed it).
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // (workers * len(sides))))
    for side in sides:
        parts = [work / side / f"offline-part-{i}-of-{workers}.json" for i in range(workers)]
        for part in parts:
            part.unlink(missing_ok=True)
        procs[side] = [
            (
                part,
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--data",
                        a.data,
                        "--work",
                        a.work,
                        "--device",
                        a.device,
                        "--preset",
                        a.preset,
                        "--side",
                        side,
                        "--offline-part",
                        f"{i}/{workers}",
                        "--offline-out",
                        str(part),
                    ]
                    + [
                        x
                        for flag, v in (("--offline-num-prompts", a.offline_num_prompts), ("--offline-output-len", a.offline_output_len))
                        if v
                        for x in (flag, str(v))
                    ],
                    env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads},
                    start_new_session=True,
                ),
            )
            for i, part in enumerate(parts)
        ]
    log(
        f"offline: {workers} reference-decoder process(es) for each of {', '.join(sides)}, {settings.num_prompts} MT-Bench turns x "
        f"{settings.output_len} tokens, K={settings.k}, fp32 target on {a.device}"
    )
    results: dict = {}
    for side in sides:
        codes = []
        for _part, proc in procs[side]:
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                codes.append(None)
        if any(c != 0 for c in codes):
            why = "deadline" if None in codes else f"reference-decoder processes exited with {codes} (their output is above)"
            results[side] = {"done": False, "why": why}
            continue
        rows = sorted((r for part, _ in procs[side] for r in read_json(part)), key=lambda r: r["index"])
        decoded = [Result(tokens=r["tokens"], accepted_per_step=r["accepted_per_step"], k=settings.k, answer_end=r["answer_end"]) for r in rows]
        slices = offline_slices(decoded, [r["category"] for r in rows], settings.k)
        numbers = AcceptanceNumbers.from_results(decoded, settings.k)
        results[side] = {
            "al": numbers.al,
            "per_position_acceptance": list(numbers.per_position_acceptance),
            "num_drafts": numbers.num_drafts,
            "prompts": len(rows),
            "output_len": settings.output_len,
            "k": settings.k,
            "workers": workers,
            "seconds": time.perf_counter() - start,
            "answers_ending_early": answers_ending_early(decoded),
            "slices": {x.source: {"al": x.al, "p_k": list(x.per_position_acceptance), "drafts": x.num_drafts} for x in slices},
        }
        log(f"offline {side}: AL {numbers.al:.3f}, p_k {[round(p, 3) for p in numbers.per_position_acceptance]} ({numbers.num_drafts} drafts)")
    return results


# ----------------------------------------------------------------------------- report


def differences(run: dict, schedule: dict, sf_summary: dict) -> list[str]:
    out = [
        "Loss normalisation: ours divides each step's summed soft cross-entropy by the step's count of trained "
        "positions; SpecForge's LogSoftmaxLoss takes the mean over all B x T rows (padding included), so the gradient "
        "scale moves with padding and batch shape (AdamW absorbs most of it; the 0.5 gradient clip does not).",
        "Loss mask: ours trains position t at step i when token t+2+i is an answer token inside the sample; SpecForge "
        "pairs loss_mask[t+i] with the target of token t+2+i (its shift moves tokens and target states, not the mask), "
        "and at a sample's last position its shifted target state is the zero padding.",
        "Both train only positions whose target argmax over the whole vocabulary is a draft token, against the target's "
        "softmax over the draft vocabulary (temperature 1); ours computes that mask once per sample and looks it up "
        "afterwards, SpecForge's compact teacher recomputes the full-vocabulary log-sum-exp and argmax every step.",
        "Precision: ours keeps fp32 weights under bf16 autocast (norms and residual adds in fp32), fused CUDA AdamW; "
        "SpecForge keeps bf16 weights with fp32 masters in its BF16Optimizer (torch AdamW, foreach), bf16 residual adds.",
        f"AdamW: betas {tuple(run['betas'])} on both (BF16Optimizer has no betas option: set on its param groups; its "
        f"default is (0.9, 0.999)); eps 1e-8 and weight decay {run['weight_decay']} on both (ours decays matrices only, "
        "SpecForge every parameter: equal at 0).",
        f"Gradient clip {run['grad_clip']} on the global norm on both.",
        f"Schedule: warm-up {run['warmup_steps']} steps then cosine to {run['min_lr_ratio']} x lr on both (BF16Optimizer's "
        "warmup_ratio chosen to give the same warm-up steps; its cosine floor eta_min, which it leaves at 0, set to ours)"
        + (
            f"; largest per-step difference {schedule['max_abs_diff_over_peak_lr']:.1e} of the peak lr."
            if "max_abs_diff_over_peak_lr" in schedule
            else "."
        ),
        "Attention: ours a causal flash attention merged with each step's diagonal keys; SpecForge "
        + (
            "sdpa with its dense TTT masks."
            if sf_summary.get("attention") == "sdpa"
            else "flex_attention (compiled for sequences over 128 tokens, eager below)."
        ),
        f"Same micro-batches in the same order (our BatchPlanner over the same split, micro_batch_tokens "
        f"{run['micro_batch_tokens']}, grad_accum {run['grad_accum']}), same TTT steps ({run['ttt_steps']}), same initial "
        "weights (our trainer's seeded initialisation rounded to bf16), the target's frozen embedding on both.",
        f"During training ours validates every {run['val_interval']} steps and both checkpoint every "
        f"{run['checkpoint_every']} steps: outside the timed steps on both sides.",
        "Export: ours rounds its fp32 weights to bf16; SpecForge's weights are bf16 already.",
    ]
    if not sf_summary.get("trained", False):
        out.insert(
            0,
            f"SpecForge was NOT trained here: {sf_summary.get('why_not_trained', 'its training did not finish')}; "
            "its numbers are those of the shared initial weights.",
        )
    return out


def build_report(a, work: Path, figures: dict) -> dict:
    init = figures.get("init", {})
    run, schedule = init.get("run", {}), init.get("schedule", {})
    plan = init.get("plan", {})
    report = {
        "specforge_version": SPECFORGE_VERSION,
        "preset": a.preset,
        "smoke": a.smoke,
        "device": a.device,
        "torch": torch.__version__,
        "epochs": run.get("epochs"),
        "total_steps": plan.get("total_steps"),
        "ttt_steps": run.get("ttt_steps"),
        "plan": plan,
        "schedule": schedule,
        "offline_settings": offline_settings(a),
        "timing_method": (
            f"CUDA events around each optimiser step (host copy, forward, backward, update) on a GPU, wall clock "
            f"on a CPU; real tokens of the steps after the first {a.timing_skip_steps} of each process, without "
            f"steps over {OUTLIER_FACTOR:g}x the median time per token (recompilations), over their summed time"
        ),
        "stages": {s: figures[s].get("done", True) for s in STAGES if s in figures},
    }
    offline, validate = figures.get("offline", {}), figures.get("validate", {})
    for side in SIDES:
        t = figures.get(side, {})
        summary, timing = t.get("summary", {}), t.get("timing", {})
        o = offline.get(side, {})
        report[side] = {
            "trained": summary.get("trained", side == "ours" and bool(summary)),
            "steps": summary.get("steps"),
            "epochs": summary.get("epochs"),
            "tokens_per_s": timing.get("tokens_per_s"),
            "timing": timing,
            "offline_al": o.get("al"),
            "offline_p_k": o.get("per_position_acceptance"),
            "offline": o,
            "val_al": validate.get(side, {}).get("val_al"),
            "val_p_k": validate.get(side, {}).get("val_accept"),
            "validation": validate.get(side),
            "trainer_val_al": summary.get("val_al"),
            "final_loss": summary.get("final_loss"),
            "export": figures.get("export", {}).get(side),
            "attention": summary.get("attention", "flash + diagonal merge" if side == "ours" else None),
        }
        if not report[side]["trained"] and side == "specforge":
            report[side]["why_not_trained"] = summary.get("why_not_trained") or t.get("why")
    o_rate, s_rate = report["ours"]["tokens_per_s"], report["specforge"]["tokens_per_s"]
    report["tokens_per_s_ratio"] = o_rate / s_rate if o_rate and s_rate else None
    o_al, s_al = report["ours"]["offline_al"], report["specforge"]["offline_al"]
    report["goal"] = {
        "offline_al_at_least_specforge": None if o_al is None or s_al is None else o_al >= s_al,
        "speed_ratio_at_least_1.3": None if report["tokens_per_s_ratio"] is None else report["tokens_per_s_ratio"] >= 1.3,
    }
    report["logits_check"] = figures.get("check")
    report["weights_mapped"] = {k: figures.get("export", {}).get(k) for k in ("mapped_tensors", "our_tensors", "mapping")}
    report["differences"] = differences(run, schedule, figures.get("specforge", {}).get("summary", {})) if run else []
    skipped = []
    sf_sum = figures.get("specforge", {}).get("summary", {})
    if sf_sum and not sf_sum.get("trained", True):
        skipped.append(
            f"SpecForge training: {sf_sum.get('why_not_trained')}; ran instead: its draft model (flex_attention, "
            "bf16) built and loaded from the shared initial weights, its BF16Optimizer with our schedule (compared "
            "step by step), the weight mapping, export, logits check, validation and offline measurement of those "
            "weights"
        )
    if a.device != "cuda":
        skipped.append(
            "logits check with SpecForge's flex_attention backend (its training backend): on a CPU flex_attention "
            "compiles through Inductor (~30 s a shape); checked with its sdpa backend, eager, instead"
        )
    report["skipped"] = skipped
    return report


def copy_out(work: Path, out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    for side in SIDES:
        export = work / side / EXPORT
        if (export / "model.safetensors").is_file():
            dest = out / f"{side}-vllm"
            shutil.rmtree(dest, ignore_errors=True)
            qd.copy_in_parts(export, dest)
            size = (export / "model.safetensors").stat().st_size
            if size > qd.PART_BYTES:
                notes.append(
                    f"{side}: model.safetensors is {size / 2**20:.1f} MiB (bf16), over the 16 MiB a file may come back "
                    f"from the GPU host: written as parts; join with `cat {dest.name}/model.safetensors.part-* > "
                    f"{dest.name}/model.safetensors`"
                )
    report["out_notes"] = notes
    write_json(out / RESULTS, report)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    files = sum(1 for f in out.rglob("*") if f.is_file())
    report["out_bytes"], report["out_files"] = total, files
    if total > 60 * 2**20 or files > 8:
        notes.append(f"{out} holds {files} files, {total / 2**20:.1f} MiB: more than the GPU host returns (8 files, 60 MiB)")
    write_json(out / RESULTS, report)


def _f(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def print_table(report: dict) -> None:
    o, s = report["ours"], report["specforge"]
    for line in report["differences"]:
        print(f"  - {line}")
    for line in report["skipped"]:
        print(f"  skipped: {line}")
    for note in report.get("out_notes", []):
        print(f"  note: {note}")
    print(f"  timing: {report['timing_method']}")
    k = report["offline_settings"]
    print(
        f"\nour recipe vs SpecForge {SPECFORGE_VERSION}, same shards ({report['preset']}, {report['epochs']} epochs, "
        f"{report['total_steps']} steps, TTT {report['ttt_steps']}); offline: {k['num_prompts']} MT-Bench turns x "
        f"{k['output_len']} tokens, K={k['k']}"
    )
    pk = lambda v: "n/a" if not v else " / ".join(f"{p:.2f}" for p in v)  # noqa: E731
    rows = [
        ("offline AL (MT-Bench)", _f(o["offline_al"]), _f(s["offline_al"])),
        ("  p_1 .. p_K", pk(o["offline_p_k"]), pk(s["offline_p_k"])),
        ("held-out val AL", _f(o["val_al"]), _f(s["val_al"])),
        ("  p_1 .. p_K", pk(o["val_p_k"]), pk(s["val_p_k"])),
        ("train tokens/s", _f(o["tokens_per_s"], ",.0f"), _f(s["tokens_per_s"], ",.0f")),
        (
            "  with outlier steps",
            _f(o["timing"].get("tokens_per_s_with_outliers"), ",.0f"),
            _f(s["timing"].get("tokens_per_s_with_outliers"), ",.0f"),
        ),
        (
            "  outlier / timed steps",
            f"{o['timing'].get('outlier_steps', 'n/a')} / {o['timing'].get('steps_timed', 'n/a')}",
            f"{s['timing'].get('outlier_steps', 'n/a')} / {s['timing'].get('steps_timed', 'n/a')}",
        ),
        ("steps / epochs", f"{o['steps']} / {o['epochs']}", f"{s['steps']} / {s['epochs']}" + ("" if s["trained"] else " (not trained)")),
    ]
    print(f"{'':24} {'ours':>22} {'SpecForge':>22}")
    for name, x, y in rows:
        print(f"{name:24} {x:>22} {y:>22}")
    ratio, goal = report["tokens_per_s_ratio"], report["goal"]
    check = report.get("logits_check") or {}
    print(
        f"tokens/s ours / SpecForge: {_f(ratio, '.2f') + 'x' if ratio else 'n/a'}; logits check: {'passed' if check.get('ok') else 'FAILED' if check else 'not run'}"
    )
    met = goal["offline_al_at_least_specforge"] and goal["speed_ratio_at_least_1.3"]
    print(
        f"goal (offline AL >= SpecForge's at >= 1.3x its tokens/s): "
        f"{'met' if met else 'not met' if None not in goal.values() else 'undecided (a side is missing)'}"
    )


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    from eagle_assets.run_presets import RUN_PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a folder prepared by quality_drafter.py --stages target,corpus,shards")
    ap.add_argument("--out", help="write the JSON and both vLLM exports here (files over 15 MB in parts)")
    ap.add_argument("--preset", default=None, choices=sorted(RUN_PRESETS), help="run preset (default smollm2-quality; smoke smollm2-tiny)")
    ap.add_argument("--epochs", type=int, help="train this many epochs instead of the preset's (both sides)")
    ap.add_argument("--work", default="vs_specforge", help="folder under --data for this comparison (resumable state)")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu (default with --smoke)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from {', '.join(STAGES)}")
    ap.add_argument(
        "--deadline-s", type=float, default=None, help="stop after this many seconds (trainings checkpoint and stop; run again to continue)"
    )
    ap.add_argument("--timing-skip-steps", type=int, default=None, help="untimed first steps of each training process (default 20; smoke 1)")
    ap.add_argument("--offline-workers", type=int, default=1, help="reference-decoder processes per drafter (on one GPU)")
    ap.add_argument("--offline-num-prompts", type=int, help="MT-Bench first turns (default the preset benchmark's: 80 for smollm2-quality)")
    ap.add_argument("--offline-output-len", type=int, help="tokens per answer (default the preset benchmark's: 128 for smollm2-quality)")
    ap.add_argument(
        "--specforge-attention",
        default="flex_attention",
        choices=["flex_attention", "sdpa"],
        help="SpecForge's attention backend in training (its trainer's default: flex_attention)",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny shards built here, every stage, 2 prompts")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--worker-deadline", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # with --offline-part: one reference-decoder process
    ap.add_argument("--offline-part", help=argparse.SUPPRESS)  # i/N
    ap.add_argument("--offline-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.device = a.device or ("cpu" if a.smoke else "cuda")
    a.preset = a.preset or ("smollm2-tiny" if a.smoke else "smollm2-quality")
    a.timing_skip_steps = a.timing_skip_steps if a.timing_skip_steps is not None else (1 if a.smoke else 20)
    if a.smoke:
        a.epochs = a.epochs or 2
        a.offline_num_prompts = a.offline_num_prompts or 2
        a.offline_output_len = a.offline_output_len or 16
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    data = Path(a.data)
    work = data / a.work
    if a.worker:
        fn = worker_ours if a.worker == "ours" else worker_specforge
        return fn(a, work, float("inf") if a.worker_deadline is None else a.worker_deadline)
    if a.offline_part:
        return worker_offline(a, work)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this comparison trains on a GPU; on a CPU run --smoke (or pass --device cpu)", file=sys.stderr)
        return 2
    sf, why = import_specforge(training=False)
    if sf is None:
        print(f"SpecForge's draft model is needed on both the CPU and the GPU path: {why}", file=sys.stderr)
        return 2
    start = time.time()
    deadline = start + (a.deadline_s or 1e9)
    stop_trainings = deadline - 20  # time to write a checkpoint, then the report
    data.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        made = build_smoke_data(data)
        if made["built"]:
            log(f"smoke data: {made['samples']} samples, {made['tokens']} tokens of synthetic states on the embedded target's widths")
    check_data(data)
    work.mkdir(parents=True, exist_ok=True)
    figures_file = work / "figures.json"
    figures = read_json(figures_file, {})
    wanted = [s.strip() for s in a.stages.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STAGES]
    if unknown:
        print(f"unknown stage(s) {unknown}; known: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    log(
        f"quality vs SpecForge {SPECFORGE_VERSION}: data {data}, work {work}, preset {a.preset}, device {a.device}"
        + (f", deadline in {a.deadline_s:.0f} s" if a.deadline_s else "")
    )
    incomplete, failed = [], []

    def weights_sha(path: Path) -> str | None:
        return file_sha256(path) if path.is_file() else None

    def side_inputs(stage: str, side: str) -> str | None:
        """What a per-side measurement measured: its export (and the offline settings)."""
        sha = weights_sha(work / side / EXPORT / "model.safetensors")
        return None if sha is None else json.dumps([sha] + ([offline_settings(a)] if stage == "offline" else []))

    def done(stage: str) -> bool:
        return bool(figures.get(stage)) and figures[stage].get("done", True)

    for stage in [s for s in STAGES if s in wanted and s != "report"]:
        # What a stage reads, to rerun it when that changed; None: a training (read again from its
        # summary every time, cheap once trained) or init (settings pinned by run.json).
        inputs = {
            "export": weights_sha(work / "specforge" / FINAL_STATE),
            "check": weights_sha(work / "specforge" / EXPORT / "model.safetensors"),
        }.get(stage)
        sides: list[str] = []
        if stage in ("validate", "offline"):  # per side: a side measured on its current export is not measured again
            ready = [side for side in SIDES if side_inputs(stage, side)]
            previous = figures.get(stage, {})
            sides = [
                side
                for side in ready
                if previous.get(side, {}).get("inputs") != side_inputs(stage, side) or not previous.get(side, {}).get("done", True)
            ]
            if not sides:
                if len(ready) == len(SIDES):
                    log(f"{stage}: done earlier, reused")
                else:
                    log(f"{stage}: not started, no export of {', '.join(sorted(set(SIDES) - set(ready)))} yet")
                    incomplete.append(stage)
                continue
        elif stage not in SIDES and done(stage) and figures[stage].get("inputs") == inputs:
            log(f"{stage}: done earlier, reused")
            continue
        needs = {"ours": ("init",), "specforge": ("init",), "export": ("specforge",), "check": ("export",)}.get(stage, ())
        blocked = [n for n in needs if not done(n)]
        if blocked:
            log(f"{stage}: not started, it needs {', '.join(blocked)} first")
            incomplete.append(stage)
            continue
        left = deadline - time.time()
        if left < (60 if stage in ("ours", "specforge", "offline") else 25):
            log(f"{stage}: not started, {left:.0f} s left before the deadline; run again to continue")
            incomplete.append(stage)
            continue
        log(f"{stage}: start" + (f" ({', '.join(sides)})" if sides else ""))
        t0 = time.perf_counter()
        if stage == "init":
            result = stage_init(a, data, work)
        elif stage in SIDES:
            result = stage_train(a, stage, work, stop_trainings)
        elif stage == "export":
            result = stage_export(work)
        elif stage == "check":
            result = stage_check(a, work)
        else:
            fresh = stage_validate(work, sides) if stage == "validate" else stage_offline(a, work, deadline - 10, sides)
            result = {side: v for side, v in figures.get(stage, {}).items() if side in SIDES}
            for side in sides:
                result[side] = {**fresh[side], "inputs": side_inputs(stage, side)}
            result["done"] = all(side in result and result[side].get("done", True) for side in SIDES)
            if not result["done"]:
                missing = [side for side in SIDES if not result.get(side, {}).get("done", side in result)]
                result["why"] = f"not measured yet: {', '.join(missing)}"
        result.setdefault("done", True)
        result["inputs"] = inputs
        result["stage_seconds"] = time.perf_counter() - t0
        figures[stage] = result
        write_json(figures_file, figures)
        if not result["done"]:
            (failed if result.get("failed") else incomplete).append(stage)
            log(f"{stage}: not finished: {result.get('why', 'see above')}")
        else:
            log(f"{stage}: done in {result['stage_seconds']:.1f} s")
        if stage == "check" and not result["ok"]:
            failed.append("check")
    report = build_report(a, work, figures)
    report["incomplete"], report["failed"] = incomplete, failed
    report["seconds"] = time.time() - start
    write_json(work / RESULTS, report)
    if a.out:
        copy_out(work, Path(a.out), report)
    print_table(report)
    if failed:
        print(f"FAILED: {', '.join(failed)}" + (" (our drafter does not give SpecForge's logits on its weights)" if "check" in failed else ""))
        return 1
    if incomplete:
        print(f"incomplete: {', '.join(incomplete)}: run the same command again to continue")
        return DEADLINE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
