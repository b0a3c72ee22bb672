"""The target's forward pass over the corpus, saving exactly the states an EAGLE-3 drafter needs.

For every corpus token we save the aux states r_k (k in `aux_layer_ids`, the project's layer
id convention: id k = HF `output_hidden_states[k]` = residual stream after k decoder layers,
un-normed, 0 = embeddings) and the final *normed* state (the final norm's output, whose
lm_head gives the target's logits). They are taken with forward hooks on the decoder layers
and the final norm of the base model, so that no other layer's states are kept
(`output_hidden_states=True` would hold all L+1) and no (T, vocab) logits are computed (the
lm_head never runs).

    from eagle_assets.hidden_states.extract import ExtractSettings, extract_all, load_target
    model, tokenizer = load_target("/models/smollm2")                  # CPU or one GPU
    settings = ExtractSettings(aux_layer_ids=(2, 15, 27), num_shards=16)
    results = extract_all(model, "data/corpus", "data/hidden_states", settings, tokenizer=tokenizer)
    one = extract_shard(model, "data/corpus", "data/hidden_states", 7, settings, tokenizer=tokenizer)

`extract_all` skips complete shards whose manifest matches the corpus and the settings, and
rebuilds the others; `extract_shard` always rebuilds its shard. The bytes of every shard to
build are reserved before the first is written (`budget.reserve_space`) and held until the last
is committed, so that another writer into the same folder cannot overfill the disk meanwhile. Samples are batched longest-first with
right padding and an attention mask, up to `batch_tokens` padded tokens per batch, and only
the real tokens' rows are kept. The host copy and the disk writes overlap the next forward
pass (see `writer.py`).

Large targets (Kimi-K2.5: 61 layers, hidden 7168, MLA MoE, INT4 weights, 3 aux + final =
57,349 bytes per token) load with plain Hugging Face pipeline sharding across the GPUs of one
host, without tensor parallelism:

    model, tokenizer = load_target(
        "/models/Kimi-K2.5", device="auto", max_memory_per_device="130GiB", trust_remote_code=True
    )

`device_map="auto"` places consecutive layers on consecutive GPUs; the hooks gather each
state on the GPU that produced it and collect the rows on the GPU of the final norm. Leave a
few GiB per GPU for activations (`max_memory_per_device` below the card's size) and size
`batch_tokens` so that one batch's activations fit. Its INT4 (compressed-tensors) checkpoint
needs the `compressed-tensors` package in the extraction environment; 8 x H200 hold it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from eagle_assets.formats import ShardManifest, hidden_state_bytes_per_token, shard_name
from eagle_assets.hidden_states.budget import reserve_space
from eagle_assets.hidden_states.corpus_io import (
    ShardSamples,
    corpus_token_counts,
    load_shard_samples,
    tokenizer_fingerprint,
)
from eagle_assets.hidden_states.reader import read_manifest, shard_index
from eagle_assets.hidden_states.writer import BufferPool, ShardLayout, ShardWriter, remove_stale

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractSettings:
    """What to extract and how; the same settings must be used for every shard of one output."""

    aux_layer_ids: tuple[int, ...]
    """Aux ids to save (our convention, 0..L); stored in ascending order whatever the order given."""
    num_shards: int
    """Shards the corpus is split into by `formats.shard_of(sample_id, num_shards)`."""
    batch_tokens: int = 16384
    """Padded tokens per forward pass (batch size x longest sample); one sample longer than this runs alone."""
    queue_depth: int = 3
    """Batches whose states may wait for the disk while the next forward runs. The host holds
    queue_depth + 1 buffers of batch_tokens x (n_aux + 1) x H bf16 (pinned on GPU targets)."""
    progress: bool = True
    """Show a tqdm bar per shard (log lines are written either way)."""


@dataclass(frozen=True)
class ShardResult:
    """What one shard's extraction did; `manifest` is what the shard folder holds."""

    shard_dir: Path
    manifest: ShardManifest
    built: bool
    """False when `extract_all` found the shard complete and current and skipped it."""
    seconds: float
    tokens_per_s: float
    reason: str = ""
    """Why the shard was (re)built or skipped."""


def load_target(
    path: str | Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    max_memory_per_device: str | None = None,
    trust_remote_code: bool = False,
):
    """Load a target (HF folder) for extraction: returns (model, tokenizer), in eval mode.

    `device`: "cpu", "cuda" / "cuda:1" (one GPU) or "auto" (accelerate's `device_map="auto"`:
    consecutive layers on consecutive GPUs, every visible one, or the host where there is
    none), each device given at most `max_memory_per_device` (e.g. "130GiB"; default: what
    it has). `trust_remote_code` is for targets whose config or tokenizer is code in the
    folder (Kimi-K2.5's): the preset says so.
    """
    from eagle_assets.corpus.target import load_tokenizer

    kwargs: dict = dict(dtype=dtype, trust_remote_code=trust_remote_code)
    if device != "cpu":
        kwargs["device_map"] = device  # weights go straight to the GPU(s), never all through host memory
    if device == "auto" and max_memory_per_device is not None:
        gpus = torch.cuda.device_count()
        kwargs["max_memory"] = {i: max_memory_per_device for i in range(gpus)} if gpus else {"cpu": max_memory_per_device}
    auto_class = causal_lm_class(path, trust_remote_code)
    try:
        model = auto_class.from_pretrained(path, **kwargs, **grouped_experts(path, auto_class, trust_remote_code))
    except ValueError as exc:
        if "offloaded to the disk" not in str(exc):
            raise
        # accelerate's own message asks for an offload folder; extraction from disk-offloaded
        # weights would crawl, so say what to change instead.
        where = f"{torch.cuda.device_count()} GPU(s)" if torch.cuda.device_count() else "the host"
        raise ValueError(
            f"the target at {path} does not fit on {where} at max_memory_per_device={max_memory_per_device}: accelerate "
            "would put weights on disk. Raise max_memory_per_device, give the run more GPUs, or take the states from the "
            "serving engine (hidden_state_shards config source: engine)"
        ) from exc
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return model.eval(), tokenizer


def grouped_experts(path: str | Path, auto_class, trust_remote_code: bool = False) -> dict:
    """`{"experts_implementation": "grouped_mm"}` for a mixture-of-experts target where this
    transformers has grouped experts (one grouped matmul over all experts instead of a loop over
    them), else {}: a dense model, or an older transformers, takes no such argument."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    text = getattr(config, "text_config", None)
    candidates = [(auto_class, config)] + ([(AutoModelForCausalLM, text)] if text is not None else [])
    for key, (mapping_class, cfg) in zip(("", "text_config"), candidates):  # a wrapper's experts sit in its language model
        model_class = mapping_class._model_mapping.get(type(cfg), None) if hasattr(mapping_class, "_model_mapping") else None
        can_set = getattr(model_class, "_can_set_experts_implementation", None)
        if callable(can_set) and can_set():
            return {"experts_implementation": "grouped_mm" if not key else {key: "grouped_mm"}}
    return {}


def causal_lm_class(path: str | Path, trust_remote_code: bool = False):
    """The transformers auto class that loads the target with its language-model head.

    A plain causal LM loads with AutoModelForCausalLM. A multimodal wrapper around one (Kimi-K2.5's
    `kimi_k25`: a vision tower beside a DeepSeek-V3 language model) has no causal-LM class there,
    only an image-text-to-text one; its decoder stack is found inside it (`target_parts`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if type(config) not in AutoModelForCausalLM._model_mapping and type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


@dataclass(frozen=True)
class TargetParts:
    """The pieces of a decoder-only target the extraction hooks into."""

    base: nn.Module
    """The decoder stack without the lm_head (e.g. `LlamaModel`): calling it never makes logits."""
    layers: nn.ModuleList
    norm: nn.Module
    """Final norm: its output is the state whose lm_head gives the target logits."""
    vocab_size: int
    hidden_size: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def input_device(self) -> torch.device:
        return self.base.embed_tokens.weight.device

    @property
    def output_device(self) -> torch.device:
        return self.norm.weight.device


def target_parts(model: nn.Module) -> TargetParts:
    """Find the decoder stack of a HF causal LM (or of a base model passed directly).

    The stack is the module with `layers` (ModuleList), `norm` and an input embedding; when a
    multimodal wrapper holds several (a vision tower has layers too), the one with the most
    layers that has an embedding table is the language model.
    """
    candidates = []
    for _, mod in model.named_modules():
        layers = getattr(mod, "layers", None)
        norm = getattr(mod, "norm", None)
        emb = getattr(mod, "embed_tokens", None)
        if isinstance(layers, nn.ModuleList) and isinstance(norm, nn.Module) and isinstance(emb, nn.Embedding):
            candidates.append((len(layers), mod))
    if not candidates:
        raise ValueError(
            f"cannot find the decoder stack of {type(model).__name__}: no submodule has `layers`, "
            "`norm` and `embed_tokens`. Pass the base model (the one whose output is the normed "
            "last hidden state) or extend `target_parts` for this architecture."
        )
    base = max(candidates, key=lambda c: c[0])[1]
    return TargetParts(
        base=base,
        layers=base.layers,
        norm=base.norm,
        vocab_size=base.embed_tokens.num_embeddings,
        hidden_size=base.embed_tokens.embedding_dim,
    )


def validate_aux_layer_ids(aux_layer_ids, num_layers: int) -> tuple[int, ...]:
    """Ascending, unique ids within 0..L, or a clear error naming the setting and the valid range."""
    ids = tuple(int(k) for k in aux_layer_ids)
    hint = (
        f"id k = HF hidden_states[k]: 0 = embeddings, {num_layers} = the last layer's output before "
        f"the final norm; the engines' default for this target is (2, {num_layers // 2}, {num_layers - 3})"
    )
    if not ids:
        raise ValueError(f"aux_layer_ids is empty; EAGLE-3 needs at least one aux state ({hint})")
    bad = [k for k in ids if not 0 <= k <= num_layers]
    if bad:
        raise ValueError(
            f"aux_layer_ids={list(ids)} has {bad} outside the valid range 0..{num_layers} for a target with {num_layers} decoder layers ({hint})"
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"aux_layer_ids={list(ids)} repeats an id; each state is saved once")
    return tuple(sorted(ids))


class _Capture:
    """Forward hooks that copy the real tokens' rows of the needed states into per-batch buffers."""

    def __init__(self, parts: TargetParts, aux_ids: tuple[int, ...]):
        self.H = parts.hidden_size
        self.aux_ids = aux_ids
        self._batch: dict | None = None
        self._handles = []
        for col, k in enumerate(aux_ids):
            if k == 0:
                # The input of layer 0 is what HF reports as hidden_states[0] (embeddings, after
                # any scaling the model applies), so hook there rather than on embed_tokens.
                self._handles.append(parts.layers[0].register_forward_pre_hook(self._pre_hook(col), with_kwargs=True))
            else:
                self._handles.append(parts.layers[k - 1].register_forward_hook(self._hook(col)))
        self._handles.append(parts.norm.register_forward_hook(self._hook("final")))

    def _pre_hook(self, col):
        def hook(module, args, kwargs):
            self._store(col, args[0] if args else kwargs["hidden_states"])

        return hook

    def _hook(self, col):
        def hook(module, args, output):
            # Decoder layers return a tensor in transformers 5, a tuple in older or remote code.
            self._store(col, output[0] if isinstance(output, (tuple, list)) else output)

        return hook

    def _store(self, col, hidden: torch.Tensor) -> None:
        b = self._batch
        if b is None:
            return
        flat = hidden.reshape(-1, self.H)  # (B*S, H), padded positions included
        dev = flat.device
        if dev not in b["index"]:
            b["index"][dev] = b["index_cpu"].to(dev, non_blocking=True)
        rows = flat.index_select(0, b["index"][dev])  # (Tb, H): the real tokens only
        if col == "final":
            b["final"].copy_(rows, non_blocking=True)
        else:
            b["aux"][:, col * self.H : (col + 1) * self.H].copy_(rows, non_blocking=True)
        b["seen"].add(col)

    def begin(self, index_cpu: torch.Tensor, aux: torch.Tensor, final: torch.Tensor) -> None:
        self._batch = dict(index_cpu=index_cpu, index={}, aux=aux, final=final, seen=set())

    def end(self) -> None:
        seen = self._batch["seen"]
        self._batch = None
        missing = (set(range(len(self.aux_ids))) | {"final"}) - seen
        if missing:
            raise RuntimeError(
                f"the forward pass did not run the hooked module(s) for {sorted(map(str, missing))}; the model skips layers this extraction relies on"
            )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def plan_batches(token_counts: list[int], batch_tokens: int) -> list[tuple[int, int]]:
    """Split samples (sorted longest first) into [start, end) batches of at most `batch_tokens`
    padded tokens (batch size x its first, longest, sample)."""
    batches, start = [], 0
    while start < len(token_counts):
        longest = token_counts[start]
        end = start + 1
        while end < len(token_counts) and (end - start + 1) * longest <= batch_tokens:
            end += 1
        batches.append((start, end))
        start = end
    return batches


def pad_batch(input_ids: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-pad samples (longest first) into one batch.

    Returns ids (B, S) int64, the flat positions of the real tokens (Tb,) int64 (sample j's
    tokens sit at j*S + 0..len_j-1), and the attention mask (B, S) int64, or None when no
    sample is padded (the model then takes its plain causal path).
    """
    lens = [len(x) for x in input_ids]
    S = lens[0]
    ids = torch.zeros(len(lens), S, dtype=torch.long)
    for j, x in enumerate(input_ids):
        ids[j, : len(x)] = torch.from_numpy(x.astype(np.int64))
    index = torch.from_numpy(np.concatenate([j * S + np.arange(n) for j, n in enumerate(lens)]))
    mask = None if lens[-1] == S else (torch.arange(S)[None, :] < torch.tensor(lens)[:, None]).long()
    return ids, index, mask


class ShardExtractor:
    """The shard machinery every source of states shares: settings, aux ids, the shard's layout,
    its host buffers, manifest and atomic commit. A subclass fills the states (`_fill`): from a
    Hugging Face forward pass here (`Extractor`), or from a serving engine
    (`hidden_states/engine_extract.EngineExtractor`)."""

    def __init__(self, settings: ExtractSettings, num_layers: int, hidden_size: int, vocab_size: int, pin_buffers: bool = False):
        self.settings = settings
        self.num_layers, self.hidden_size, self.vocab_size = num_layers, hidden_size, vocab_size
        self.aux_ids = validate_aux_layer_ids(settings.aux_layer_ids, num_layers)
        if settings.batch_tokens < 1 or settings.num_shards < 1 or settings.queue_depth < 1:
            raise ValueError(
                f"batch_tokens ({settings.batch_tokens}), num_shards ({settings.num_shards}) and "
                f"queue_depth ({settings.queue_depth}) must all be at least 1"
            )
        self._pin = pin_buffers
        self._pool: BufferPool | None = None
        self._pool_rows = 0
        # One thread: shards commit in the order they were extracted.
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-commit")

    model_dtype = "bfloat16"
    """The dtype the states were computed in, for the manifest."""
    source = "transformers"
    """What computed the states, for the manifest."""

    @property
    def bytes_per_token(self) -> int:
        return hidden_state_bytes_per_token(len(self.aux_ids), self.hidden_size)

    def layout(self, token_counts: list[int]) -> ShardLayout:
        return ShardLayout(
            num_samples=len(token_counts),
            num_tokens=sum(token_counts),
            num_aux=len(self.aux_ids),
            hidden_size=self.hidden_size,
            aux_layer_ids=self.aux_ids,
        )

    def _buffers(self, rows: int) -> BufferPool:
        if self._pool is None or self._pool_rows < rows:
            self._pool = BufferPool(self.settings.queue_depth + 1, rows, len(self.aux_ids), self.hidden_size, pin=self._pin)
            self._pool_rows = rows
        return self._pool

    def manifest_for(self, shard_index: int, samples: ShardSamples, target_fingerprint: str) -> ShardManifest:
        return ShardManifest(
            shard=shard_index,
            num_shards=self.settings.num_shards,
            sample_ids=list(samples.sample_ids),
            token_counts=samples.token_counts,
            aux_layer_ids=list(self.aux_ids),
            hidden_size=self.hidden_size,
            target_fingerprint=target_fingerprint,
            corpus_fingerprint=samples.fingerprint(),
            bytes_per_token=self.bytes_per_token,
            extra={
                "num_tokens": samples.num_tokens,
                "num_layers": self.num_layers,
                "batch_tokens": self.settings.batch_tokens,
                "model_dtype": self.model_dtype,
                "source": self.source,
                "file_bytes": self.layout(samples.token_counts).file_bytes(),
            },
        )

    def run(
        self,
        samples: ShardSamples,
        out_dir: Path,
        shard_index: int,
        target_fingerprint: str,
        on_batch: Callable[[int, int, int], None] | None = None,
        wait: bool = True,
        reserved: bool = False,
    ) -> ShardResult | Future:
        """Extract `samples` into shard `shard_index` of `out_dir` (replacing it atomically).

        With `wait=False` it returns once the last states are queued, with a Future of the
        result: the tail of the writes, the checks, the fsync and the rename then run in the
        background while the caller starts the next shard, so the source never waits on a commit.
        `reserved`: the caller holds a reservation of the shard's bytes (`extract_all` reserves
        the whole stage's); else the shard reserves its own.
        """
        started = time.perf_counter()
        counts = samples.token_counts
        layout = self.layout(counts)
        # Held until the shard is committed or abandoned: another writer into the same folder
        # sees what this one has still to write (the file is sparse until its rows land).
        reservation = (
            None if reserved else reserve_space(out_dir, layout.file_bytes(), f"shard {shard_index}", ShardWriter.staging_dir(out_dir, shard_index))
        )
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        batches = plan_batches(counts, self.settings.batch_tokens)
        flat_ids = np.concatenate(samples.input_ids) if counts else np.zeros(0, np.int32)
        flat_mask = np.concatenate(samples.loss_mask) if counts else np.zeros(0, np.uint8)
        log.info(
            "shard %d: %d samples, %d tokens in %d batches -> %s (%.2f GB)",
            shard_index,
            len(counts),
            layout.num_tokens,
            len(batches),
            out_dir / shard_name(shard_index),
            layout.file_bytes() / 1e9,
        )
        try:
            writer = ShardWriter(out_dir, shard_index, layout, offsets, flat_ids, flat_mask)
        except BaseException:
            _release(reservation)
            raise
        try:
            finite = self._fill(samples, batches, offsets, writer, shard_index, on_batch)
        except BaseException:
            writer.abort()
            _release(reservation)
            raise
        manifest = self.manifest_for(shard_index, samples, target_fingerprint)

        def finish() -> ShardResult:
            try:
                self._check_finite(finite, batches, samples, shard_index)
                shard_dir = writer.commit(manifest)
            except BaseException:
                writer.abort()
                raise
            finally:
                _release(reservation)
            seconds = time.perf_counter() - started
            rate = layout.num_tokens / seconds if seconds > 0 else 0.0
            log.info("shard %d: committed in %.1f s (%.0f tokens/s)", shard_index, seconds, rate)
            return ShardResult(shard_dir, manifest, True, seconds, rate, "built")

        future = self._committer.submit(finish)
        return future.result() if wait else future

    def _fill(self, samples: ShardSamples, batches, offsets, writer: ShardWriter, shard_index: int, on_batch) -> list[torch.Tensor]:
        """Hand every sample's rows to `writer`; returns "all finite" flags (read off this thread)."""
        raise NotImplementedError

    @staticmethod
    def _check_finite(finite, batches, samples: ShardSamples, shard_index: int) -> None:
        if not finite:
            return
        ok = torch.stack([f.cpu() for f in finite])
        if bool(ok.all()):
            return
        a, b = batches[int((~ok).nonzero()[0])]
        raise ValueError(
            f"shard {shard_index}: non-finite hidden states (inf/NaN in bf16) in the batch of samples "
            f"{samples.sample_ids[a:b]}; the target's forward pass overflows on them. Load the target "
            "in a wider dtype (float32) or drop these samples; nothing was written."
        )

    def close(self) -> None:
        """Wait for the shards still committing in the background."""
        self._committer.shutdown(wait=True)

    def __enter__(self) -> "ShardExtractor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Extractor(ShardExtractor):
    """Hugging Face forward passes with hooks and host buffers for one target."""

    def __init__(self, model: nn.Module, settings: ExtractSettings):
        self.parts = target_parts(model)
        super().__init__(
            settings, self.parts.num_layers, self.parts.hidden_size, self.parts.vocab_size, pin_buffers=self.parts.output_device.type == "cuda"
        )
        self.model_dtype = str(next(self.parts.base.parameters()).dtype).removeprefix("torch.")

    @torch.inference_mode()
    def _fill(self, samples, batches, offsets, writer: ShardWriter, shard_index, on_batch) -> list[torch.Tensor]:
        """Run every batch through the base model, handing the captured rows to `writer`.

        Returns one device-side "all finite" flag per batch (read later, off this thread).
        """
        counts = samples.token_counts
        H, n_aux = self.parts.hidden_size, len(self.aux_ids)
        in_dev, out_dev = self.parts.input_device, self.parts.output_device
        pool = self._buffers(max([self.settings.batch_tokens, *counts]))

        def host(t: torch.Tensor) -> torch.Tensor:
            # Pinned inputs make the host-to-device copy truly asynchronous; from pageable
            # memory it would wait for the GPU to drain, exposing every kernel launch.
            return t.pin_memory() if in_dev.type == "cuda" else t

        capture = _Capture(self.parts, self.aux_ids)
        bar = _progress(self.settings.progress, int(offsets[-1]), f"shard {shard_index}")
        finite: list[torch.Tensor] = []
        try:
            for bi, (a, b) in enumerate(batches):
                rows, row0 = int(offsets[b] - offsets[a]), int(offsets[a])
                ids, index, mask = pad_batch(samples.input_ids[a:b])
                if mask is not None:
                    mask = host(mask).to(in_dev, non_blocking=True)
                bufs = pool.acquire()  # blocks while the writer is `queue_depth` batches behind
                if out_dev.type == "cpu":
                    aux, final = bufs.aux[:rows], bufs.final[:rows]  # captured straight into the host buffer
                else:
                    aux = torch.empty(rows, n_aux * H, dtype=torch.bfloat16, device=out_dev)  # (Tb, n_aux*H)
                    final = torch.empty(rows, H, dtype=torch.bfloat16, device=out_dev)  # (Tb, H)
                capture.begin(host(index), aux, final)
                self.parts.base(input_ids=host(ids).to(in_dev, non_blocking=True), attention_mask=mask, use_cache=False)
                capture.end()
                finite.append(torch.isfinite(aux).all() & torch.isfinite(final).all())
                ready = None
                if out_dev.type == "cuda":
                    with torch.cuda.device(out_dev):
                        bufs.aux[:rows].copy_(aux, non_blocking=True)
                        bufs.final[:rows].copy_(final, non_blocking=True)
                        ready = torch.cuda.Event()
                        ready.record()
                writer.put(row0, rows, bufs, pool, ready)
                bar.update(rows)
                if on_batch is not None:
                    on_batch(shard_index, bi, len(batches))
        finally:
            capture.remove()
            bar.close()
        return finite


def _progress(enabled: bool, total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=not enabled)


def resolve_target_fingerprint(tokenizer=None, target_fingerprint: str | None = None) -> str:
    """The fingerprint the corpus's `target` column must equal: given, or the tokenizer's."""
    if target_fingerprint is not None:
        return target_fingerprint
    if tokenizer is not None:
        return tokenizer_fingerprint(tokenizer)
    raise ValueError(
        "pass tokenizer= (its vocabulary fingerprint is compared with the corpus's `target` "
        "column) or target_fingerprint= (the value the corpus stage wrote for this target)"
    )


def _release(reservation) -> None:
    if reservation is not None:
        reservation.release()


def _extractor(model: "nn.Module | ShardExtractor", settings: ExtractSettings) -> tuple[ShardExtractor, bool]:
    """(the extractor for `model`, whether the caller owns it): a Hugging Face model gets an
    `Extractor` of its own; a given extractor (an engine's, say) is used as it is, and its
    settings must be these."""
    if isinstance(model, ShardExtractor):
        if model.settings != settings:
            raise ValueError(f"the extractor was made with {model.settings}, not {settings}: give one set of settings")
        return model, False
    return Extractor(model, settings), True


def extract_shard(
    model: "nn.Module | ShardExtractor",
    corpus_dir: str,
    out_dir: str | Path,
    shard_index: int,
    settings: ExtractSettings,
    *,
    tokenizer=None,
    target_fingerprint: str | None = None,
    on_batch: Callable[[int, int, int], None] | None = None,
) -> ShardResult:
    """(Re)build shard `shard_index` of `out_dir` from the corpus; other shards are not touched.

    `model` is a Hugging Face model or a `ShardExtractor` (which then serves several calls).
    `on_batch(shard_index, batch_index, num_batches)` is called after each batch is handed
    to the writer (for progress reporting).
    """
    extractor, owned = _extractor(model, settings)
    try:
        fingerprint = resolve_target_fingerprint(tokenizer, target_fingerprint)
        samples = load_shard_samples(corpus_dir, shard_index, settings.num_shards, extractor.vocab_size, fingerprint)
        return extractor.run(samples, Path(out_dir), shard_index, fingerprint, on_batch)
    finally:
        if owned:
            extractor.close()


def shard_status(
    out_dir: str | Path,
    shard_index: int,
    expected: dict[str, int],
    settings: ExtractSettings,
    aux_ids: tuple[int, ...],
    hidden_size: int,
    target_fingerprint: str,
) -> str:
    """ "complete" when the shard exists, passes its checks and matches the corpus and settings,
    else why not ("missing", "corrupt: ...", "stale: ..."): anything but "complete" is rebuilt.

    The checks are `reader.shard_problem`'s: manifest, file size, header, shapes against the
    manifest's counts, offsets, and the checksum when the file changed after its manifest.
    """
    from eagle_assets.formats import SHARD_MANIFEST_FILE
    from eagle_assets.hidden_states.reader import shard_problem

    shard_dir = Path(out_dir) / shard_name(shard_index)
    if not (shard_dir / SHARD_MANIFEST_FILE).is_file():
        return "missing"
    problem = shard_problem(shard_dir)
    if problem is not None:
        return f"corrupt: {problem}"
    manifest = read_manifest(shard_dir)
    for what, have, want in (
        ("num_shards", manifest.num_shards, settings.num_shards),
        ("aux_layer_ids", list(manifest.aux_layer_ids), list(aux_ids)),
        ("hidden_size", manifest.hidden_size, hidden_size),
        ("target_fingerprint", manifest.target_fingerprint, target_fingerprint),
    ):
        if have != want:
            return f"stale: {what} is {have}, settings say {want}"
    if dict(zip(manifest.sample_ids, manifest.token_counts)) != expected:
        return f"stale: the corpus now has {len(expected)} samples for this shard, the shard {len(manifest.sample_ids)} (or their lengths changed)"
    return "complete"


def remove_shards_beyond(out_dir: Path, num_shards: int) -> list[Path]:
    """Delete the shard folders numbered `num_shards` and up. An extraction into more shards left
    them; beside the new ones the reader would refuse the mix, and no shard of the new layout
    would ever replace them."""
    removed = []
    for p in sorted(out_dir.iterdir()) if out_dir.is_dir() else []:
        index = shard_index(p.name)
        if index is not None and index >= num_shards:
            log.info("%s: left by an extraction into more than %d shards; removed", p.name, num_shards)
            shutil.rmtree(p)
            removed.append(p)
    return removed


def bytes_to_extract(
    out_dir: str | Path, corpus_dir: str, settings: ExtractSettings, num_layers: int, hidden_size: int, target_fingerprint: str
) -> int:
    """Bytes `extract_all` would write into `out_dir` now: the shards that are not complete. For a
    check before the source starts (an extraction server of a large target loads for minutes)."""
    aux_ids = validate_aux_layer_ids(settings.aux_layer_ids, num_layers)
    expected = corpus_token_counts(corpus_dir, settings.num_shards)
    total = 0
    for i in range(settings.num_shards):
        if shard_status(out_dir, i, expected[i], settings, aux_ids, hidden_size, target_fingerprint) != "complete":
            counts = list(expected[i].values())
            layout = ShardLayout(
                num_samples=len(counts), num_tokens=sum(counts), num_aux=len(aux_ids), hidden_size=hidden_size, aux_layer_ids=aux_ids
            )
            total += layout.file_bytes()
    return total


def extract_all(
    model: "nn.Module | ShardExtractor",
    corpus_dir: str,
    out_dir: str | Path,
    settings: ExtractSettings,
    *,
    tokenizer=None,
    target_fingerprint: str | None = None,
    shards: list[int] | None = None,
    on_batch: Callable[[int, int, int], None] | None = None,
) -> list[ShardResult]:
    """Extract every shard (or `shards`), skipping complete ones that match corpus and settings.

    Resumable: after a crash, rerunning rebuilds only the shards without a manifest (their
    leftover temporary folders are removed). Free disk space for all shards to build is
    checked first. Each shard commits in the background while the next one computes.
    """
    out_dir = Path(out_dir)
    extractor, owned = _extractor(model, settings)
    fingerprint = resolve_target_fingerprint(tokenizer, target_fingerprint)
    expected = corpus_token_counts(corpus_dir, settings.num_shards)
    indices = list(range(settings.num_shards)) if shards is None else list(shards)
    if shards is None:
        remove_shards_beyond(out_dir, settings.num_shards)
    todo, results = [], []
    for i in indices:
        status = shard_status(out_dir, i, expected[i], settings, extractor.aux_ids, extractor.hidden_size, fingerprint)
        if status == "complete":
            manifest = read_manifest(out_dir / shard_name(i))
            results.append(ShardResult(out_dir / shard_name(i), manifest, False, 0.0, 0.0, "complete"))
        else:
            log.info("shard %d: %s; extracting", i, status)
            remove_stale(out_dir, i)
            todo.append((i, status))
    needed = sum(extractor.layout(list(expected[i].values())).file_bytes() for i, _ in todo)
    # The whole stage's bytes, reserved before its first shard and held until its last commits:
    # what these shards have still to write counts against any other writer's check meanwhile.
    staging = [f for i, _ in todo for f in (ShardWriter.staging_dir(out_dir, i), out_dir / shard_name(i))]
    reservation = reserve_space(out_dir, needed, f"{len(todo)} shard(s) of {out_dir.name}", staging) if todo else None
    log.info("%d of %d shards to extract (%.2f GB), %d complete", len(todo), len(indices), needed / 1e9, len(results))
    pending: list[tuple[str, Future]] = []
    try:
        for i, status in todo:
            for _, done in pending:  # a failed commit stops the run before more work is done
                if done.done() and done.exception() is not None:
                    raise done.exception()
            samples = load_shard_samples(corpus_dir, i, settings.num_shards, extractor.vocab_size, fingerprint)
            pending.append((status, extractor.run(samples, out_dir, i, fingerprint, on_batch, wait=False, reserved=True)))
        for status, future in pending:
            r = future.result()
            results.append(ShardResult(r.shard_dir, r.manifest, True, r.seconds, r.tokens_per_s, status))
    finally:
        _release(reservation)
        if owned:
            extractor.close()
        else:  # the caller keeps its extractor, but no commit of ours may outlive this call
            for _, future in pending:
                future.exception()
    return sorted(results, key=lambda r: r.manifest.shard)
