"""Training batches from hidden-state shard folders: split, length-aware batching, resumable order.

The shards (layout in `eagle_assets/formats.py`) are opened through the memory-mapped reader
of `eagle_assets.hidden_states.reader`; only the samples of the current micro-batch are ever
copied into memory.

- Split: a sample is held out for validation when a stable hash of its `sample_id` falls
  under `val_fraction`, so the split is the same on every machine, run and shard layout, and
  a sample never moves between train and validation when the corpus grows.
- Batching: each epoch shuffles the training samples with a generator seeded by
  (seed, epoch), sorts them by length inside windows (similar lengths pad little), packs them
  greedily into micro-batches under a padded-token budget, and shuffles the micro-batches.
  Consecutive groups of `batches_per_step` micro-batches form one optimiser step; micro-batch
  j of a step goes to rank j % world_size, accumulation slot j // world_size. The global
  batch is therefore the same for 1 process x 4 accumulation steps as for 4 processes x 1.
- Resume: the order is a pure function of (seed, epoch), so `SamplerState(epoch, step)` is
  the whole data position; it is saved in every checkpoint.

    ds = ShardDataset(["data/shards"], max_seq_len=2048)
    train_ids, val_ids = ds.split(0.02)
    plan = BatchPlanner(ds.lengths(train_ids), train_ids, BatchingSpec(batches_per_step=8), seed=0)
    for step_batches in plan.epoch(0):           # list of 8 micro-batches (sample positions)
        batch = ds.collate(step_batches[rank])   # dict of tensors for ttt_loss
"""

from __future__ import annotations

import hashlib
import queue
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE

# ----------------------------------------------------------------------------- split


def validation_score(sample_id: str) -> float:
    """A number in [0, 1) fixed by `sample_id` alone; salted so it is independent of `shard_of`."""
    digest = hashlib.sha256(f"validation-split:{sample_id}".encode()).hexdigest()
    return int(digest[:12], 16) / float(16**12)


def is_validation(sample_id: str, val_fraction: float) -> bool:
    return validation_score(sample_id) < val_fraction


# ----------------------------------------------------------------------------- shards


def discover_shards(shard_dirs: Sequence[str | Path]) -> list[Path]:
    """Complete shard folders under the given paths (a path may be a shard or hold `shard-*`).

    A folder without its manifest is an unfinished write and is skipped with the others'
    names in the error only if nothing complete is found.
    """
    found: list[Path] = []
    problems: list[str] = []
    for raw in shard_dirs:
        path = Path(raw)
        if not path.exists():
            problems.append(f"{path} does not exist")
            continue
        if (path / SHARD_MANIFEST_FILE).is_file() and (path / SHARD_STATES_FILE).is_file():
            found.append(path)
            continue
        children = sorted(p for p in path.iterdir() if p.is_dir() and p.name.startswith("shard-"))
        complete = [p for p in children if (p / SHARD_MANIFEST_FILE).is_file() and (p / SHARD_STATES_FILE).is_file()]
        if not complete:
            problems.append(
                f"{path} holds no complete hidden-state shard (a shard folder needs "
                f"{SHARD_STATES_FILE} and {SHARD_MANIFEST_FILE}; found {len(children)} shard-* folders "
                "without them). Materialise the hidden_state_shards asset first."
            )
        found.extend(complete)
    if problems:
        raise FileNotFoundError("missing hidden-state shards:\n  - " + "\n  - ".join(problems))
    return found


def _open_reader(folder: Path):
    from eagle_assets.hidden_states.reader import ShardReader

    return ShardReader(folder)


@dataclass(frozen=True)
class SampleRef:
    """Where one sample lives."""

    shard: int
    """Index into `ShardDataset.shards`."""
    row: int
    """Sample index inside that shard."""
    sample_id: str
    num_tokens: int
    """Tokens used for training (after cutting to max_seq_len)."""


def split_positions(samples: Sequence[SampleRef], val_fraction: float) -> tuple[list[int], list[int]]:
    """(train positions, validation positions) of `samples` by the stable hash of each sample_id."""
    train, val = [], []
    for pos, ref in enumerate(samples):
        (val if is_validation(ref.sample_id, val_fraction) else train).append(pos)
    if not train:
        raise ValueError(
            f"no training samples: all {len(samples)} samples fell in the validation split "
            f"(val_fraction={val_fraction}); lower val_fraction or add data"
        )
    return train, val


class ShardDataset:
    """All samples of a set of shard folders, addressed by a flat position."""

    def __init__(self, shard_dirs: Sequence[str | Path], max_seq_len: int | None = None, aux_layer_ids: Sequence[int] | None = None):
        """`aux_layer_ids`: serve only these of the shards' aux layers (None = all), in ascending order."""
        self.folders = discover_shards(shard_dirs)
        self.shards = [_open_reader(f) for f in self.folders]
        self.max_seq_len = max_seq_len
        first = self.shards[0].manifest
        self.stored_aux_layer_ids: tuple[int, ...] = tuple(first.aux_layer_ids)
        self.aux_layer_ids: tuple[int, ...] = self.stored_aux_layer_ids
        self.hidden_size: int = first.hidden_size
        self.target_fingerprint: str = first.target_fingerprint
        for folder, reader in zip(self.folders, self.shards):
            m = reader.manifest
            if (tuple(m.aux_layer_ids), m.hidden_size, m.target_fingerprint) != (
                self.stored_aux_layer_ids,
                self.hidden_size,
                self.target_fingerprint,
            ):
                raise ValueError(
                    f"shard {folder} does not match {self.folders[0]}: aux ids {m.aux_layer_ids} vs "
                    f"{list(self.stored_aux_layer_ids)}, hidden {m.hidden_size} vs {self.hidden_size}, target "
                    f"{m.target_fingerprint} vs {self.target_fingerprint}. Train on shards of one "
                    "hidden_state_shards materialisation."
                )
        self._aux_columns: torch.Tensor | None = None  # None: every stored column, as stored
        if aux_layer_ids is not None and tuple(aux_layer_ids) != self.stored_aux_layer_ids:
            self.aux_layer_ids = self._select_aux(tuple(int(i) for i in aux_layer_ids))
        self.samples: list[SampleRef] = []
        seen: dict[str, Path] = {}
        for s, (folder, reader) in enumerate(zip(self.folders, self.shards)):
            m = reader.manifest
            for row, (sid, n) in enumerate(zip(m.sample_ids, m.token_counts)):
                if sid in seen:
                    raise ValueError(f"sample {sid} is in both {seen[sid]} and {folder}; a sample belongs to one shard. Pass each shard folder once.")
                seen[sid] = folder
                if n < 2:  # nothing to predict: the drafter needs a next token
                    continue
                self.samples.append(SampleRef(s, row, sid, min(n, max_seq_len) if max_seq_len else n))

    def _select_aux(self, wanted: tuple[int, ...]) -> tuple[int, ...]:
        stored = self.stored_aux_layer_ids
        missing = [i for i in wanted if i not in stored]
        if missing or list(wanted) != sorted(set(wanted)):
            raise ValueError(
                f"aux_layer_ids {list(wanted)} cannot be read from shards holding aux layers {list(stored)} "
                f"({self.folders[0].parent}): "
                + (
                    f"layers {missing} were not extracted; extract hidden states at them (hidden_state_shards' "
                    "aux_layer_ids) or choose among the stored ones"
                    if missing
                    else f"give them distinct and ascending, e.g. {sorted(set(wanted))}"
                )
            )
        h = self.hidden_size
        # Stored columns are ascending id blocks of width H; the engines concatenate the chosen
        # ids in ascending order too, so keeping the blocks in stored order keeps fc's layout.
        self._aux_columns = torch.cat([torch.arange(stored.index(i) * h, (stored.index(i) + 1) * h) for i in wanted])
        return wanted

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def __len__(self) -> int:
        return len(self.samples)

    def lengths(self, positions: Sequence[int]) -> list[int]:
        return [self.samples[p].num_tokens for p in positions]

    def split(self, val_fraction: float) -> tuple[list[int], list[int]]:
        """(train positions, validation positions) by the stable hash of each sample_id."""
        return split_positions(self.samples, val_fraction)

    source = "shards"
    """Where the states come from (`sources.py` has the online ones)."""

    @property
    def origin(self) -> str:
        return f"{len(self.folders)} shards"

    def stream(self, steps: Iterator[tuple["SamplerState", list[list[int]], int]], dtype: torch.dtype, device: torch.device) -> "Prefetcher":
        """Collated micro-batches of each planned step, `(position after it, this rank's micro-batches,
        global tokens)`, two steps ahead in a thread (pinned for a GPU): reading and collation
        overlap the step before."""

        def collated():
            for state, mine, tokens in steps:
                batches = [self.collate(b, dtype) for b in mine]
                if device.type == "cuda":
                    batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]
                yield state, batches, tokens

        return Prefetcher(collated(), depth=2)

    def close(self) -> None:
        """Nothing to release: the memory maps go with the readers."""

    def sample(self, pos: int) -> dict[str, torch.Tensor]:
        """One sample's tensors, cut to max_seq_len: input_ids, loss_mask, aux, final."""
        ref = self.samples[pos]
        item = self.shards[ref.shard][ref.row]
        n = ref.num_tokens
        out = {k: item[k][:n] for k in ("input_ids", "loss_mask", "aux", "final")}
        if self._aux_columns is not None:
            out["aux"] = out["aux"][:, self._aux_columns]
        return out

    def collate(self, positions: Sequence[int], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """A padded micro-batch in the layout `ttt_loss` takes.

        aux (B, T, n_aux*H) and final (B, T, H) in `dtype`, input_ids (B, T) int64,
        loss_mask (B, T) float, lengths (B,) int64, positions (B,) int64 (the samples' positions
        here, by which the trainer keeps what it computes once per sample). Padding is zeros
        with loss_mask 0.
        """
        items = [self.sample(p) for p in positions]
        lengths = [int(it["input_ids"].shape[0]) for it in items]
        b, t = len(items), max(lengths)
        width_aux = self.num_aux * self.hidden_size
        batch = {
            "aux": torch.zeros(b, t, width_aux, dtype=dtype),  # (B, T, n_aux*H)
            "final": torch.zeros(b, t, self.hidden_size, dtype=dtype),  # (B, T, H)
            "input_ids": torch.zeros(b, t, dtype=torch.long),  # (B, T)
            "loss_mask": torch.zeros(b, t, dtype=torch.float32),  # (B, T)
            "lengths": torch.tensor(lengths, dtype=torch.long),  # (B,)
            "positions": torch.tensor(list(positions), dtype=torch.long),  # (B,)
        }
        for i, (it, n) in enumerate(zip(items, lengths)):
            batch["aux"][i, :n] = it["aux"].to(dtype)
            batch["final"][i, :n] = it["final"].to(dtype)
            batch["input_ids"][i, :n] = it["input_ids"].long()
            batch["loss_mask"][i, :n] = it["loss_mask"].float()
        return batch


# ----------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class BatchingSpec:
    """How samples are grouped into micro-batches and optimiser steps."""

    micro_batch_tokens: int | None = 4096
    """Padded-token budget of a micro-batch (samples x longest); a longer sample goes alone."""
    micro_batch_samples: int | None = None
    """Most samples in a micro-batch."""
    batches_per_step: int = 1
    """Micro-batches per optimiser step: world_size x grad_accum."""
    length_window: int = 512
    """Samples sorted by length together (after shuffling); 1 = no length grouping."""


@dataclass
class SamplerState:
    """The data position: the next step to take is step `step` of epoch `epoch`."""

    epoch: int = 0
    step: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SamplerState":
        return cls(epoch=int(d["epoch"]), step=int(d["step"]))


def pack_micro_batches(positions: Sequence[int], lengths: Sequence[int], spec: BatchingSpec) -> list[list[int]]:
    """Greedy packing of (already ordered) samples under the token and sample budgets."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for pos, n in zip(positions, lengths):
        new_longest = max(longest, n)
        fits_tokens = spec.micro_batch_tokens is None or (len(current) + 1) * new_longest <= spec.micro_batch_tokens
        fits_count = spec.micro_batch_samples is None or len(current) + 1 <= spec.micro_batch_samples
        if current and not (fits_tokens and fits_count):
            batches.append(current)
            current, new_longest = [], n
        current.append(pos)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


class BatchPlanner:
    """The deterministic list of optimiser steps of each epoch."""

    def __init__(self, lengths: Sequence[int], positions: Sequence[int], spec: BatchingSpec, seed: int):
        if len(lengths) != len(positions):
            raise ValueError("lengths and positions differ in size")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.positions = np.asarray(positions, dtype=np.int64)
        self.spec = spec
        self.seed = seed
        self._cache: dict[int, list[list[list[int]]]] = {}

    def epoch(self, epoch: int) -> list[list[list[int]]]:
        """Steps of `epoch`: each a list of `batches_per_step` micro-batches of sample positions.

        Micro-batches that do not fill a last step are dropped (they are different ones every
        epoch), so every process runs the same number of micro-steps.
        """
        if epoch in self._cache:
            return self._cache[epoch]
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.positions))
        window = max(1, self.spec.length_window)
        chunks = []
        for start in range(0, len(order), window):
            chunk = order[start : start + window]
            # longest first and stable, so equal lengths keep their shuffled order
            chunks.append(chunk[np.argsort(-self.lengths[chunk], kind="stable")])
        order = np.concatenate(chunks)
        micro = pack_micro_batches(self.positions[order].tolist(), self.lengths[order].tolist(), self.spec)
        micro = [micro[i] for i in rng.permutation(len(micro))]
        per_step = self.spec.batches_per_step
        steps = [micro[i : i + per_step] for i in range(0, len(micro) - per_step + 1, per_step)]
        if not steps:
            raise ValueError(
                f"the training split ({len(self.positions)} samples) makes {len(micro)} micro-batches, "
                f"fewer than one optimiser step needs ({per_step} = world_size x grad_accum). Add data, "
                "lower grad_accum or the number of processes, or make micro-batches smaller."
            )
        self._cache = {epoch: steps}  # keep one epoch: plans are cheap to rebuild
        return steps

    def steps_per_epoch(self, epoch: int) -> int:
        return len(self.epoch(epoch))

    def total_steps(self, epochs: int, max_steps: int | None) -> int:
        total = 0
        for e in range(epochs):
            total += self.steps_per_epoch(e)
            if max_steps is not None and total >= max_steps:
                return max_steps
        return total if max_steps is None else min(total, max_steps)

    def iterate(self, state: SamplerState, epochs: int) -> Iterator[tuple[SamplerState, list[list[int]]]]:
        """Yield (position of this step, its micro-batches) from `state` on, for `epochs` epochs.

        `state` is advanced in place after each yield is consumed, so saving it at any point
        gives the position of the next step.
        """
        while state.epoch < epochs:
            steps = self.epoch(state.epoch)
            while state.step < len(steps):
                here = SamplerState(state.epoch, state.step)
                batches = steps[state.step]
                state.step += 1
                yield here, batches
            state.epoch += 1
            state.step = 0


def rank_micro_batches(step_batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    """This rank's micro-batches of one step, in accumulation order."""
    return step_batches[rank::world_size]


def validation_batches(
    lengths: Sequence[int], positions: Sequence[int], spec: BatchingSpec, world_size: int, max_batches: int | None
) -> list[list[tuple[list[int], bool]]]:
    """Validation micro-batches per rank, as (positions, counts) pairs; every rank gets as many.

    Sorted by length (least padding, fixed order). A rank short of batches repeats its first
    one with counts=False, so sharded models still run the same collectives on every rank.
    """
    if not positions:
        return [[] for _ in range(world_size)]
    order = np.argsort(-np.asarray(lengths), kind="stable")
    pos = np.asarray(positions)[order].tolist()
    lens = np.asarray(lengths)[order].tolist()
    batches = pack_micro_batches(pos, lens, BatchingSpec(spec.micro_batch_tokens, spec.micro_batch_samples, 1, 1))
    if max_batches is not None:
        batches = batches[:max_batches]
    per_rank = [[(b, True) for b in batches[r::world_size]] for r in range(world_size)]
    most = max(len(b) for b in per_rank)
    for r in range(world_size):
        filler = batches[0]
        per_rank[r] += [(filler, False)] * (most - len(per_rank[r]))
    return per_rank


def describe(ds: ShardDataset, train: Sequence[int], val: Sequence[int]) -> str:
    """One line about the data, for the log."""
    ntok = sum(ds.lengths(train))
    return (
        f"{ds.origin}, {len(train)} train / {len(val)} validation samples, {ntok} train tokens, "
        f"aux ids {list(ds.aux_layer_ids)}, hidden {ds.hidden_size}"
    )


class Prefetcher:
    """Runs an iterator in a background thread, `depth` items ahead (collation overlaps compute).

    The order is the iterator's own, so prefetching never changes what a step sees. Errors in
    the thread are raised in the consumer; `close()` stops the thread early.
    """

    _DONE = object()

    def __init__(self, iterable, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iter(iterable),), daemon=True)
        self._thread.start()

    def _run(self, it) -> None:
        try:
            for item in it:
                while not self._stop.is_set():
                    try:
                        self._queue.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as err:  # handed to the consumer, raised there
            self._queue.put((None, err))
            return
        self._queue.put((self._DONE, None))

    def __iter__(self):
        while True:
            item, err = self._queue.get()
            if err is not None:
                raise err
            if item is self._DONE:
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
