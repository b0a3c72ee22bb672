"""Settings of one drafter training run, as a frozen dataclass that round-trips through JSON.

The trainer is launched out of process (`torchrun -m eagle_assets.drafter.train --config
run.json`), so everything a run needs is in this one file: where the data and the target are,
the drafter's shape, the optimiser, the schedule, the parallelism and the checkpoint policy.

    cfg = TrainConfig(shard_dirs=("data/shards",), vocab_mapping="data/vocab_mapping.safetensors",
                      target="/models/llama", out_dir="runs/d1")
    cfg.save("runs/d1/run.json")
    assert TrainConfig.load("runs/d1/run.json") == cfg

Unknown keys in a JSON file are an error naming the key and listing the known ones: a typo
must not silently train with a default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

PARALLELISMS = ("ddp", "fsdp2")
PRECISIONS = ("auto", "fp32", "bf16")
HIDDEN_STATE_SOURCES = ("shards", "target", "server")
TRACKERS = ("tensorboard", "mlflow", "wandb", "none")
EXPORT_ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class TrainConfig:
    """One training run of an EAGLE-3 drafter."""

    # --- inputs ---
    shard_dirs: tuple[str, ...]
    """Hidden-state shard folders, or folders holding `shard-*` folders (formats.py layout)."""
    vocab_mapping: str
    """The `vocab_mapping.safetensors` file (d2t, t2d) of the draft vocabulary."""
    target: str
    """The target's HF folder: `config.json` plus safetensors with embed_tokens and lm_head."""
    out_dir: str
    """Where checkpoints, logs, TensorBoard events and the exported drafter go."""

    # --- where the hidden states come from (drafter/sources.py) ---
    hidden_states: str = "shards"
    """"shards": read from `shard_dirs` (extracted once, read every epoch). Online, never written
    to disk: "target", the target loaded beside the drafter (frozen), each micro-batch's states
    computed by its forward pass in the step; "server", an extraction server (`extraction_url`,
    `eagle-assets serve --extract`) asked for the states of the samples a few steps ahead. The
    online sources read the corpus (`corpus_dir`)."""
    corpus_dir: str | None = None
    """Online sources: the corpus folder (the synthetic_corpus asset's output)."""
    num_shards: int = 4
    """Online sources number the corpus's samples as `hidden_state_shards` in this many shards
    stores them, so one seed trains the same samples in the same order online as from shards."""
    extraction_url: str | None = None
    """"server": the extraction server's URL (http://host:port)."""
    extraction_model: str | None = None
    """"server": the model name it serves; None = the first it lists."""
    extraction_api_key_env: str | None = None
    """"server": the environment variable holding its API key (the key itself is never written here)."""
    lookahead_steps: int = 4
    """"server": optimiser steps whose states are asked for ahead of the one training; with
    `extraction_concurrency` it bounds the states held in memory and the server's spool."""
    extraction_concurrency: int = 16
    """"server": requests in flight at once (the engine batches them; each leaves one file in its
    spool until read)."""

    # --- drafter ---
    drafter: dict | str | None = None
    """A `DrafterConfig` as a dict, a drafter preset name, or None to derive the drafter from
    the target's `config.json`, the draft vocabulary size and the shards' aux layer ids."""
    drafter_num_layers: int = 1
    """Decoder layers of a new drafter derived from the target (`drafter` None or a preset name).
    More than one serves in vLLM only (SGLang's later layers compute another function), so
    `export_engines` must then leave SGLang out."""
    drafter_intermediate_size: int | None = None
    """MLP width of a new drafter derived from the target (`drafter` None or a preset name);
    None = the target's own MLP width. The engines read it from the exported config."""
    ttt_steps: int = 7
    """Training-time-test unroll length K (draft tokens per step at serving time)."""
    target_temperature: float = 1.0
    """The drafter learns softmax(target logits / this) over the draft vocabulary; below 1
    sharpens it towards the target's greedy token (what greedy verification accepts)."""
    unreached_weight: float = 1.0
    """Weight of a draft step's position when an earlier step there drafted another token than
    the target's (serving never verifies that draft): 1 trains every position alike (EAGLE-3),
    0 only the chains serving reaches (GRIFFIN's token-alignable training)."""
    ptd_token_id: int | None = None
    """Set: train a new drafter for parallel drafting (vLLM's `parallel_drafting`, P-EAGLE),
    whose draft steps after the first are mask slots reading this token's embedding and a
    learned state; the export carries it (vLLM only). None: chain drafting (EAGLE-3)."""
    mask_undraftable: bool = True
    """Train only on positions whose target argmax is in the draft vocabulary (as SpecForge):
    the drafter cannot propose the others. Needs the target lm_head's other rows on device."""
    aux_layer_ids: tuple[int, ...] | None = None
    """Train on these of the shards' aux layers (project numbering, a subset of what the shards
    hold); None = all of them. Shards extracted once at more layers then serve several layer
    choices without a second forward pass over the corpus."""
    drafter_shape: dict | None = None
    """For a new drafter: `DrafterConfig` fields set over those taken from the target (the
    field's drafter shape for the target's family, `TargetPreset.drafter_shape`); None: the
    target's attention and MLP shapes."""
    warm_start: str | None = None
    """A parent drafter's HF folder to start from; its d2t/t2d must equal `vocab_mapping`'s. The
    run ends by comparing the fine-tune with the parent on the same held-out samples
    (`parent_gate.py`) and exports whichever measured higher."""
    min_finetune_samples: int = 256
    """A warm start with fewer training samples than this is not fine-tuned: so few cannot move a
    parent measurably, and the few samples such a corpus holds out cannot tell a fine-tune from
    its parent. The parent is then exported as it is, measured on every sample of the corpus."""
    parent_numbering: str = "measure"
    """How the warm start's parent counts its layer ids where its config does not say (no
    `layer_id_numbering` marker): "measure" (its held-out acceptance at both readings, "vllm"
    as written and "sglang" one more, where the shards hold both; the better is trained and
    recorded), "vllm" or "sglang"."""

    # --- data ---
    max_seq_len: int = 2048
    """Samples longer than this are cut to their first `max_seq_len` tokens."""
    micro_batch_tokens: int | None = 4096
    """Budget of one micro-batch in padded tokens (samples x longest sample); None = no limit."""
    micro_batch_samples: int | None = None
    """Most samples in one micro-batch; None = only the token budget applies."""
    grad_accum: int = 1
    """Micro-batches each process accumulates per optimiser step. The global batch is
    world_size x grad_accum micro-batches, independent of how it is split over processes."""
    length_window: int = 512
    """Length-aware batching sorts the shuffled samples by length inside windows of this many
    samples: similar lengths share a micro-batch (little padding), the order stays random."""
    val_fraction: float = 0.02
    """Share of samples held out for validation, chosen by a stable hash of sample_id."""

    # --- optimisation ---
    epochs: int = 1
    """Passes over the training split (when `max_steps` is None)."""
    max_steps: int | None = None
    """Exactly this many optimiser steps, the data repeating as needed (`epochs` is then
    ignored); None = `epochs` full passes."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 100
    """Linear warm-up from 0 to `lr` over this many steps."""
    cosine: bool = True
    """Cosine decay from `lr` to `min_lr_ratio * lr` after warm-up; False keeps `lr` constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of `lr` (cosine schedule only)."""
    weight_decay: float = 0.0
    """AdamW weight decay, applied to matrices only (never to norms)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float | None = 0.5
    """Clip the global gradient norm to this value; None = no clipping."""
    seed: int = 0
    """Seeds weight initialisation, data order (with the epoch) and every RNG."""

    # --- parallelism and precision ---
    parallelism: str = "ddp"
    """"ddp" (replicated weights) or "fsdp2" (sharded weights, `fully_shard`)."""
    precision: str = "auto"
    """"auto": bf16 autocast on CUDA, fp32 on a CPU; "fp32": always fp32; "bf16": bf16 autocast
    on any device. The weights, optimiser state and loss sums stay fp32 either way. A CPU trains
    in fp32 by default because its bf16 matmuls run other kernels on each processor kind (AMX,
    AVX-512 BF16, or emulated), so a bf16 run's numbers would depend on the host; on a GPU bf16
    is the tensor cores' rate and the field's practice."""

    # --- validation, checkpoints, logging ---
    val_interval: int = 500
    """Validate every this many optimiser steps (and at the end); 0 = only at the end."""
    val_max_batches: int | None = None
    """Cap on validation micro-batches per validation (None = the whole held-out split)."""
    checkpoint_every: int = 500
    """Write a resumable checkpoint every this many optimiser steps; 0 = never."""
    keep_last: int = 2
    """Checkpoints kept on disk; older ones are deleted once a newer one is complete."""
    resume: bool = True
    """Resume from the newest complete checkpoint in `out_dir` when there is one."""
    log_every: int = 10
    """Write scalars (TensorBoard, metrics.jsonl, reporter) every this many steps."""
    tensorboard_dir: str | None = None
    """TensorBoard event folder; None = `out_dir/tensorboard`."""
    tracker: str = "tensorboard"
    """Where the scalars of metrics.jsonl also go (`trackers.py`): "tensorboard", "mlflow",
    "wandb" (the last two: pip install -e '.[mlflow]' / '.[wandb]') or "none"."""
    tracker_project: str | None = None
    """The MLflow experiment or W&B project of the run; None = "eagle_assets"."""
    tracker_uri: str | None = None
    """MLflow's tracking URI (e.g. http://mlflow.internal:5000); None = MLFLOW_TRACKING_URI, else
    MLflow's own default. W&B reads its server from its own settings (WANDB_BASE_URL)."""
    export_engines: tuple[str, ...] = ("vllm",)
    """Engines to export the final drafter for, each to `out_dir/drafter-<engine>` with
    export.py: "vllm" and/or "sglang"; empty = no export."""

    extra: dict = field(default_factory=dict)
    """Free-form notes carried into the checkpoint and summary (lineage, run ids)."""

    def __post_init__(self) -> None:
        # JSON gives lists; the dataclass is frozen and hashable-minded, so store tuples.
        if isinstance(self.shard_dirs, (str, os.PathLike)):
            object.__setattr__(self, "shard_dirs", (str(self.shard_dirs),))
        object.__setattr__(self, "shard_dirs", tuple(str(p) for p in self.shard_dirs))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        object.__setattr__(self, "export_engines", tuple(str(e) for e in self.export_engines))
        if self.aux_layer_ids is not None:
            object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
        for name in ("vocab_mapping", "target", "out_dir"):
            object.__setattr__(self, name, str(getattr(self, name)))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the setting and what to write instead."""
        problems = []
        if self.precision not in PRECISIONS:
            problems.append(f"precision={self.precision!r}: use one of {PRECISIONS}")
        if self.hidden_states not in HIDDEN_STATE_SOURCES:
            problems.append(f"hidden_states={self.hidden_states!r}: use one of {HIDDEN_STATE_SOURCES}")
        elif self.hidden_states == "shards" and not self.shard_dirs:
            problems.append("shard_dirs is empty: give at least one hidden-state shard folder (or train online: hidden_states target or server)")
        elif self.hidden_states != "shards" and not self.corpus_dir:
            problems.append(f"hidden_states={self.hidden_states!r} reads the corpus: set corpus_dir to the synthetic_corpus folder")
        if self.hidden_states == "server" and not self.extraction_url:
            problems.append("hidden_states='server' needs extraction_url, an extraction server's URL (`eagle-assets serve --extract`)")
        for name in ("num_shards", "lookahead_steps", "extraction_concurrency"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.parallelism not in PARALLELISMS:
            problems.append(f"parallelism={self.parallelism!r}: use one of {PARALLELISMS}")
        if self.micro_batch_tokens is None and self.micro_batch_samples is None:
            problems.append("set micro_batch_tokens or micro_batch_samples (both are None)")
        for name in ("grad_accum", "epochs", "max_seq_len", "length_window", "ttt_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("micro_batch_tokens", "micro_batch_samples", "max_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name}={value} must be >= 1 or null")
        for name in ("warmup_steps", "val_interval", "checkpoint_every", "log_every"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0")
        if self.min_finetune_samples < 0:
            problems.append(f"min_finetune_samples={self.min_finetune_samples} must be >= 0")
        if self.keep_last < 1:
            problems.append(f"keep_last={self.keep_last} must be >= 1 (the newest checkpoint is what resume reads)")
        if not 0.0 <= self.val_fraction < 1.0:
            problems.append(f"val_fraction={self.val_fraction} must be in [0, 1)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.lr <= 0:
            problems.append(f"lr={self.lr} must be > 0")
        if self.drafter_intermediate_size is not None:
            if self.drafter_intermediate_size < 1:
                problems.append(f"drafter_intermediate_size={self.drafter_intermediate_size} must be >= 1 or null")
            if isinstance(self.drafter, dict):
                problems.append("drafter_intermediate_size is set beside a `drafter` dict: put intermediate_size in the dict")
            if self.warm_start:
                problems.append("drafter_intermediate_size is set with warm_start: a warm start keeps the parent's architecture")
        if self.drafter_num_layers != 1:
            if self.drafter_num_layers < 1:
                problems.append(f"drafter_num_layers={self.drafter_num_layers} must be >= 1")
            if isinstance(self.drafter, dict):
                problems.append("drafter_num_layers is set beside a `drafter` dict: put num_hidden_layers in the dict")
            if self.warm_start:
                problems.append("drafter_num_layers is set with warm_start: a warm start keeps the parent's architecture")
        if self.parent_numbering not in ("measure", "vllm", "sglang"):
            problems.append(f"parent_numbering={self.parent_numbering!r}: give measure, vllm or sglang")
        if self.ptd_token_id is not None and self.warm_start:
            problems.append(
                "ptd_token_id is set with warm_start: a warm start keeps the parent's architecture (a parent trained "
                "for parallel drafting keeps its ptd_token_id); train from scratch to add parallel drafting"
            )
        layers = self.drafter.get("num_hidden_layers", 1) if isinstance(self.drafter, dict) else self.drafter_num_layers
        if layers > 1 and "sglang" in self.export_engines:
            problems.append(
                f"a {layers}-layer drafter cannot be exported for SGLang (its layers after the first drop the "
                "residual stream vLLM carries): set export_engines to ('vllm',) or train one layer"
            )
        if self.aux_layer_ids is not None and list(self.aux_layer_ids) != sorted(set(self.aux_layer_ids)):
            problems.append(
                f"aux_layer_ids={list(self.aux_layer_ids)} must be distinct and ascending (the engines concatenate "
                f"the captured states in ascending order): use {sorted(set(self.aux_layer_ids))}"
            )
        if not self.target_temperature > 0:
            problems.append(f"target_temperature={self.target_temperature} must be > 0 (1 = the target's distribution)")
        if not 0.0 <= self.unreached_weight <= 1.0:
            problems.append(f"unreached_weight={self.unreached_weight} must be in [0, 1] (1 = every position trains alike)")
        if len(self.betas) != 2:
            problems.append(f"betas={self.betas} must be two numbers")
        if self.grad_clip is not None and self.grad_clip <= 0:
            problems.append(f"grad_clip={self.grad_clip} must be > 0 or null")
        if self.tracker not in TRACKERS:
            problems.append(f"tracker={self.tracker!r}: use one of {TRACKERS}")
        bad_engines = sorted(set(self.export_engines) - set(EXPORT_ENGINES))
        if bad_engines:
            problems.append(f"export_engines has {bad_engines}: use a subset of {EXPORT_ENGINES}")
        if problems:
            raise ValueError("invalid TrainConfig:\n  - " + "\n  - ".join(problems))

    # --- paths derived from out_dir ---
    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out_dir) / "checkpoints"

    def export_dir(self, engine: str) -> Path:
        return Path(self.out_dir) / f"drafter-{engine}"

    @property
    def tensorboard_path(self) -> Path:
        return Path(self.tensorboard_dir) if self.tensorboard_dir else Path(self.out_dir) / "tensorboard"

    # --- JSON ---
    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{source}: unknown TrainConfig key(s) {unknown}; known keys: {sorted(known)}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise ValueError(f"{source}: missing required TrainConfig key(s) {missing}")
        _check_types(cls, data, source)
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TrainConfig":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training config {path} does not exist; write one with TrainConfig(...).save()")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object of TrainConfig keys, got {type(data).__name__}")
        return cls.from_dict(data, source=str(path))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file then rename), so a reader never sees half a config."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


def _check_types(cls, data: dict, source: str) -> None:
    """A light type check of JSON values, so `"lr": "1e-4"` fails here and not mid-run."""
    hints = typing.get_type_hints(cls)
    problems = []
    for key, value in data.items():
        allowed = _json_kinds(hints[key])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            kinds = "/".join(sorted({k.__name__ for k in allowed}))
            problems.append(f"{key}={value!r} should be {kinds}")
    if problems:
        raise ValueError(f"{source}: wrong type for " + "; ".join(problems))


def _json_kinds(hint) -> tuple[type, ...]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds: tuple[type, ...] = ()
        for arg in typing.get_args(hint):
            kinds += _json_kinds(arg)
        return kinds
    if hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)
    if origin in (tuple, list) or hint in (tuple, list):
        return (list, tuple)
    if origin is dict or hint is dict:
        return (dict,)
    return (hint,)
