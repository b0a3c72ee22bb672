"""Settings of one drafter training run: a frozen pydantic model that round-trips through JSON.

The trainer is launched out of process (`torchrun -m eagle_assets.drafter.train --config
run.json`), so everything a run needs is in this one file: where the data and the target are,
the drafter's shape, the optimiser, the schedule, the parallelism and the checkpoint policy.

    cfg = TrainConfig(shard_dirs=("data/shards",), vocab_mapping="data/vocab_mapping.safetensors",
                      target="/models/llama", out_dir="runs/d1")
    cfg.save("runs/d1/run.json")
    assert TrainConfig.load("runs/d1/run.json") == cfg

Unknown keys are an error naming the key and listing the known ones (a typo must not silently
train with a default), and so is text where a number belongs (`"lr": "1e-4"` fails here, not
mid-run). Each field's type, choices (`Literal`) and range (`Field`) are declared once, here; the
Dagster asset's settings take their defaults from this model (defs/drafter.py).
"""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from eagle_assets.durable import write_durably

Parallelism = Literal["ddp", "fsdp2"]
Precision = Literal["auto", "fp32", "bf16"]
HiddenStateSource = Literal["shards", "target", "server"]
Tracker = Literal["tensorboard", "mlflow", "wandb", "none"]
ExportEngine = Literal["vllm", "sglang"]
ParentNumbering = Literal["measure", "vllm", "sglang"]
PARALLELISMS = typing.get_args(Parallelism)
PRECISIONS = typing.get_args(Precision)
HIDDEN_STATE_SOURCES = typing.get_args(HiddenStateSource)
TRACKERS = typing.get_args(Tracker)
EXPORT_ENGINES = typing.get_args(ExportEngine)

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class TrainConfig(BaseModel):
    """One training run of an EAGLE-3 drafter."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

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
    hidden_states: HiddenStateSource = "shards"
    """"shards": read from `shard_dirs` (extracted once, read every epoch). Online, never written
    to disk: "target", the target loaded beside the drafter (frozen), each micro-batch's states
    computed by its forward pass in the step; "server", an extraction server (`extraction_url`,
    `eagle-assets serve --extract`) asked for the states of the samples a few steps ahead. The
    online sources read the corpus (`corpus_dir`)."""
    corpus_dir: str | None = None
    """Online sources: the corpus folder (the synthetic_corpus asset's output)."""
    num_shards: Positive = 4
    """Online sources number the corpus's samples as `hidden_state_shards` in this many shards
    stores them, so one seed trains the same samples in the same order online as from shards."""
    extraction_url: str | None = None
    """"server": the extraction server's URL (http://host:port)."""
    extraction_model: str | None = None
    """"server": the model name it serves; None = the first it lists."""
    extraction_api_key_env: str | None = None
    """"server": the environment variable holding its API key (the key itself is never written here)."""
    lookahead_steps: Positive = 4
    """"server": optimiser steps whose states are asked for ahead of the one training; with
    `extraction_concurrency` it bounds the states held in memory and the server's spool."""
    extraction_concurrency: Positive = 16
    """"server": requests in flight at once (the engine batches them; each leaves one file in its
    spool until read)."""

    # --- drafter ---
    drafter: Union[dict, str, None] = None
    """A `DrafterConfig` as a dict, a drafter preset name, or None to derive the drafter from
    the target's `config.json`, the draft vocabulary size and the shards' aux layer ids."""
    drafter_num_layers: Positive = 1
    """Decoder layers of a new drafter derived from the target (`drafter` None or a preset name).
    More than one serves in vLLM only (SGLang's later layers compute another function), so
    `export_engines` must then leave SGLang out."""
    drafter_intermediate_size: Positive | None = None
    """MLP width of a new drafter derived from the target (`drafter` None or a preset name);
    None = the target's own MLP width. The engines read it from the exported config."""
    ttt_steps: Positive = 7
    """Training-time-test unroll length K (draft tokens per step at serving time)."""
    target_temperature: Annotated[float, Field(gt=0)] = 1.0
    """The drafter learns softmax(target logits / this) over the draft vocabulary; below 1
    sharpens it towards the target's greedy token (what greedy verification accepts)."""
    unreached_weight: Annotated[float, Field(ge=0, le=1)] = 1.0
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
    min_finetune_samples: NonNegative = 256
    """A warm start with fewer training samples than this is not fine-tuned: so few cannot move a
    parent measurably, and the few samples such a corpus holds out cannot tell a fine-tune from
    its parent. The parent is then exported as it is, measured on every sample of the corpus."""
    parent_numbering: ParentNumbering = "measure"
    """How the warm start's parent counts its layer ids where its config does not say (no
    `layer_id_numbering` marker): "measure" (its held-out acceptance at both readings, "vllm"
    as written and "sglang" one more, where the shards hold both; the better is trained and
    recorded), "vllm" or "sglang"."""

    # --- data ---
    max_seq_len: Positive = 2048
    """Samples longer than this are cut to their first `max_seq_len` tokens."""
    micro_batch_tokens: Positive | None = 4096
    """Budget of one micro-batch in padded tokens (samples x longest sample); None = no limit."""
    micro_batch_samples: Positive | None = None
    """Most samples in one micro-batch; None = only the token budget applies."""
    grad_accum: Positive = 1
    """Micro-batches each process accumulates per optimiser step. The global batch is
    world_size x grad_accum micro-batches, independent of how it is split over processes."""
    length_window: Positive = 512
    """Length-aware batching sorts the shuffled samples by length inside windows of this many
    samples: similar lengths share a micro-batch (little padding), the order stays random."""
    val_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.02
    """Share of samples held out for validation, chosen by a stable hash of sample_id."""

    # --- optimisation ---
    epochs: Positive = 1
    """Passes over the training split (when `max_steps` is None)."""
    max_steps: Positive | None = None
    """Exactly this many optimiser steps, the data repeating as needed (`epochs` is then
    ignored); None = `epochs` full passes."""
    lr: Annotated[float, Field(gt=0)] = 1e-4
    """Peak learning rate of AdamW."""
    warmup_steps: NonNegative = 100
    """Linear warm-up from 0 to `lr` over this many steps."""
    cosine: bool = True
    """Cosine decay from `lr` to `min_lr_ratio * lr` after warm-up; False keeps `lr` constant."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Final learning rate as a fraction of `lr` (cosine schedule only)."""
    weight_decay: float = 0.0
    """AdamW weight decay, applied to matrices only (never to norms)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: Annotated[float, Field(gt=0)] | None = 0.5
    """Clip the global gradient norm to this value; None = no clipping."""
    seed: int = 0
    """Seeds weight initialisation, data order (with the epoch) and every RNG."""

    # --- parallelism and precision ---
    parallelism: Parallelism = "ddp"
    """"ddp" (replicated weights) or "fsdp2" (sharded weights, `fully_shard`)."""
    precision: Precision = "auto"
    """"auto": bf16 autocast on CUDA, fp32 on a CPU; "fp32": always fp32; "bf16": bf16 autocast
    on any device. The weights, optimiser state and loss sums stay fp32 either way. A CPU trains
    in fp32 by default because its bf16 matmuls run other kernels on each processor kind (AMX,
    AVX-512 BF16, or emulated), so a bf16 run's numbers would depend on the host; on a GPU bf16
    is the tensor cores' rate and the field's practice."""

    # --- validation, checkpoints, logging ---
    val_interval: NonNegative = 500
    """Validate every this many optimiser steps (and at the end); 0 = only at the end."""
    val_max_batches: Positive | None = None
    """Cap on validation micro-batches per validation (None = the whole held-out split)."""
    checkpoint_every: NonNegative = 500
    """Write a resumable checkpoint every this many optimiser steps; 0 = never."""
    keep_last: Annotated[int, Field(ge=1)] = 2
    """Checkpoints kept on disk; older ones are deleted once a newer one is complete."""
    resume: bool = True
    """Resume from the newest complete checkpoint in `out_dir` when there is one."""
    log_every: NonNegative = 10
    """Write scalars (TensorBoard, metrics.jsonl, reporter) every this many steps."""
    tensorboard_dir: str | None = None
    """TensorBoard event folder; None = `out_dir/tensorboard`."""
    tracker: Tracker = "tensorboard"
    """Where the scalars of metrics.jsonl also go (`trackers.py`): "tensorboard", "mlflow",
    "wandb" (the last two: pip install -e '.[mlflow]' / '.[wandb]') or "none"."""
    tracker_project: str | None = None
    """The MLflow experiment or W&B project of the run; None = "eagle_assets"."""
    tracker_uri: str | None = None
    """MLflow's tracking URI (e.g. http://mlflow.internal:5000); None = MLFLOW_TRACKING_URI, else
    MLflow's own default. W&B reads its server from its own settings (WANDB_BASE_URL)."""
    export_engines: tuple[ExportEngine, ...] = ("vllm",)
    """Engines to export the final drafter for, each to `out_dir/drafter-<engine>` with
    export.py: "vllm" and/or "sglang"; empty = no export."""

    extra: dict = Field(default_factory=dict)
    """Free-form notes carried into the checkpoint and summary (lineage, run ids)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(readable(exc, "TrainConfig", list(type(self).model_fields))) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_text_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Text where the field takes no text is refused (pydantic would read "1e-4" as a number);
        paths (any field that takes text) become text, and one shard folder a tuple of one."""
        if info.field_name == "shard_dirs" and isinstance(value, (str, os.PathLike)):
            return (str(value),)
        if info.field_name == "shard_dirs" and isinstance(value, (list, tuple)):
            return tuple(str(v) if isinstance(v, os.PathLike) else v for v in value)
        if isinstance(value, os.PathLike) and _takes_text(cls.model_fields[info.field_name].annotation):
            return str(value)
        if isinstance(value, str) and not _takes_text(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{info.field_name}={value!r} should be {_kind(cls.model_fields[info.field_name].annotation)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        """The settings that depend on each other; a ValueError names the setting and what to write instead."""
        problems = []
        if self.hidden_states == "shards" and not self.shard_dirs:
            problems.append("shard_dirs is empty: give at least one hidden-state shard folder (or train online: hidden_states target or server)")
        elif self.hidden_states != "shards" and not self.corpus_dir:
            problems.append(f"hidden_states={self.hidden_states!r} reads the corpus: set corpus_dir to the synthetic_corpus folder")
        if self.hidden_states == "server" and not self.extraction_url:
            problems.append("hidden_states='server' needs extraction_url, an extraction server's URL (`eagle-assets serve --extract`)")
        if self.micro_batch_tokens is None and self.micro_batch_samples is None:
            problems.append("set micro_batch_tokens or micro_batch_samples (both are None)")
        if self.drafter_intermediate_size is not None:
            if isinstance(self.drafter, dict):
                problems.append("drafter_intermediate_size is set beside a `drafter` dict: put intermediate_size in the dict")
            if self.warm_start:
                problems.append("drafter_intermediate_size is set with warm_start: a warm start keeps the parent's architecture")
        if self.drafter_num_layers != 1:
            if isinstance(self.drafter, dict):
                problems.append("drafter_num_layers is set beside a `drafter` dict: put num_hidden_layers in the dict")
            if self.warm_start:
                problems.append("drafter_num_layers is set with warm_start: a warm start keeps the parent's architecture")
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
        if problems:
            raise ValueError("invalid TrainConfig:\n  - " + "\n  - ".join(problems))
        return self

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
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "TrainConfig":
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

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
        write_durably(path, self.to_json().encode())
        return path

    def replace(self, **changes) -> "TrainConfig":
        """A copy with `changes`, validated as a new config is."""
        return type(self)(**{**self.model_dump(), **changes})


def defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's default (a factory's value), for the fields that have one."""
    return {name: f.get_default(call_default_factory=True) for name, f in model.model_fields.items() if not f.is_required()}


def readable(exc: ValidationError, what: str, known: list[str]) -> str:
    """pydantic's errors as one line per setting: the setting, its value, what to give instead."""
    unknown = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    lines = [f"unknown {what} key(s) {sorted(unknown)}; known keys: {sorted(known)}"] if unknown else []
    for e in exc.errors():
        if e["type"] == "extra_forbidden":
            continue
        name = ".".join(str(part) for part in e["loc"]) or what
        message = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "literal_error":
            message = f"use one of {e['ctx']['expected']}"
        lines.append(message if message.startswith(f"{name}=") or message.startswith("invalid ") else f"{name}={e.get('input')!r}: {message}")
    return "\n".join(lines)


def _takes_text(annotation: Any) -> bool:
    if annotation is str:
        return True
    return any(_takes_text(arg) for arg in typing.get_args(annotation)) or typing.get_origin(annotation) is Literal


def _kind(annotation: Any) -> str:
    """A field's type in a word or two, for a refusal (`int`, `float`, `int/null`)."""
    kinds = []
    for arg in typing.get_args(annotation) or (annotation,):
        base = typing.get_args(arg)[0] if typing.get_origin(arg) is Annotated else arg
        kinds.append("null" if base is type(None) else getattr(base, "__name__", str(base)))
    return "/".join(kinds)
