"""Reading hidden-state shards: memory-mapped, one sample at a time.

    >>> from eagle_assets.hidden_states.reader import open_shards
    >>> shards = open_shards("data/hidden_states")          # complete shards only
    >>> s = shards[0][5]                                     # the 6th sample of the first shard
    >>> s["aux"].shape, s["final"].shape                     # (T_i, n_aux*H), (T_i, H) bf16
    >>> s["input_ids"].dtype, s["loss_mask"].dtype           # torch.int32, torch.uint8

`safe_open` maps the file; indexing reads only that sample's rows (never the whole shard).
A `ShardReader` can be handed to DataLoader workers: the file is (re)opened lazily in each
process.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, ShardManifest

_SHARD_DIR = re.compile(r"^shard-(\d{5,})$")


def shard_index(name: str) -> int | None:
    """The index in a shard folder's name (`shard-00003` -> 3); None for any other name."""
    match = _SHARD_DIR.match(name)
    return int(match.group(1)) if match else None


def read_manifest(shard_dir: str | Path) -> ShardManifest | None:
    """The shard's manifest, or None when the shard is absent or incomplete."""
    path = Path(shard_dir) / SHARD_MANIFEST_FILE
    if not path.is_file():
        return None
    return ShardManifest.from_json(path.read_text())


class ShardReader:
    """One complete shard folder, read lazily through a memory map."""

    def __init__(self, shard_dir: str | Path):
        self.shard_dir = Path(shard_dir)
        manifest = read_manifest(self.shard_dir)
        if manifest is None:
            raise FileNotFoundError(
                f"{self.shard_dir} is not a complete hidden-state shard (no {SHARD_MANIFEST_FILE}); "
                "rebuild it with extract_shard"
            )
        self.manifest = manifest
        self._file = None
        self._offsets = self._open().get_tensor("offsets")  # (n+1,) int64, small
        if len(self._offsets) != len(manifest.sample_ids) + 1:
            raise ValueError(
                f"{self.shard_dir}: offsets hold {len(self._offsets) - 1} samples, the manifest "
                f"{len(manifest.sample_ids)}; the shard is corrupt: delete it and rebuild it"
            )
        self._index = {sid: i for i, sid in enumerate(manifest.sample_ids)}

    def _open(self):
        if self._file is None:
            self._file = safe_open(self.shard_dir / SHARD_STATES_FILE, framework="pt")
        return self._file

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"] = None  # a memory map does not cross processes; reopen there
        return state

    @property
    def sample_ids(self) -> list[str]:
        return self.manifest.sample_ids

    @property
    def aux_layer_ids(self) -> list[int]:
        return self.manifest.aux_layer_ids

    @property
    def hidden_size(self) -> int:
        return self.manifest.hidden_size

    @property
    def num_tokens(self) -> int:
        return int(self._offsets[-1])

    def __len__(self) -> int:
        return len(self.manifest.sample_ids)

    def index_of(self, sample_id: str) -> int:
        return self._index[sample_id]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i: input_ids (T_i,) int32, loss_mask (T_i,) uint8, aux (T_i, n_aux*H) bf16, final (T_i, H) bf16."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample index {i} out of range for {self.shard_dir} with {n} samples")
        i %= n
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        f = self._open()
        return {name: f.get_slice(name)[a:b] for name in ("input_ids", "loss_mask", "aux", "final")}

    def __repr__(self) -> str:
        return f"ShardReader({str(self.shard_dir)!r}, samples={len(self)}, tokens={self.num_tokens})"


def open_shards(root: str | Path) -> list[ShardReader]:
    """Readers for the complete shards under `root`, by shard index; incomplete ones are ignored.

    Raises when complete shards disagree on aux ids, hidden size or shard count (they come
    from different extractions and cannot be trained on together).
    """
    readers = []
    for p in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        if _SHARD_DIR.match(p.name) and read_manifest(p) is not None:
            readers.append(ShardReader(p))
    if readers:
        first = readers[0].manifest
        for r in readers[1:]:
            m = r.manifest
            if (m.aux_layer_ids, m.hidden_size, m.num_shards) != (first.aux_layer_ids, first.hidden_size, first.num_shards):
                raise ValueError(
                    f"{r.shard_dir} has aux ids {m.aux_layer_ids}, hidden {m.hidden_size}, {m.num_shards} shards "
                    f"but {readers[0].shard_dir} has {first.aux_layer_ids}, {first.hidden_size}, {first.num_shards}: "
                    "they come from different extractions; rebuild the stale shards"
                )
    return readers


def stored_aux_layer_ids(root: str | Path) -> tuple[int, ...]:
    """The aux layer ids the complete shards under `root` hold."""
    readers = open_shards(root)
    if not readers:
        raise FileNotFoundError(f"{root} holds no complete hidden-state shard: materialise hidden_state_shards first")
    return tuple(readers[0].manifest.aux_layer_ids)
