"""Reading hidden-state shards: checked, then memory-mapped, one sample at a time.

    >>> from eagle_assets.hidden_states.reader import open_shards, shard_problem
    >>> shards = open_shards("data/hidden_states")          # complete shards only
    >>> s = shards[0][5]                                     # the 6th sample of the first shard
    >>> s["aux"].shape, s["final"].shape                     # (T_i, n_aux*H), (T_i, H) bf16
    >>> s["input_ids"].dtype, s["loss_mask"].dtype           # torch.int32, torch.uint8
    >>> shard_problem("data/hidden_states/shard-00003", checksum=True)   # None, or what is wrong

`safe_open` maps the file; indexing reads only that sample's rows (never the whole shard).
A `ShardReader` can be handed to DataLoader workers: the file is (re)opened lazily in each
process.

What is checked before a shard is trusted (`shard_problem`): the manifest parses, with every
key known and typed; `states.safetensors` is a whole safetensors file (header, each tensor's
extent, nothing missing or appended); its tensors have exactly the dtypes and shapes the
manifest's sample and token counts imply; its size is the one recorded at commit; its
`offsets` are the manifest's token counts. That costs the header and the offsets, whatever the
shard's size. The file's SHA-256 (recorded at commit) is compared only when asked
(`checksum=True`), or, by default, when the file was modified after its manifest was written
(the writer writes the manifest last, so an untouched shard never is): hashing every shard on
every resume would read the whole dataset (hundreds of GB) each time.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from eagle_assets.checked_reads import read_safetensors_layout
from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, ShardManifest

_SHARD_DIR = re.compile(r"^shard-(\d{5,})$")

SHARD_FIX = (
    "rebuild the shard: rerun the extraction (extract_all and the hidden_state_shards asset rebuild "
    "a shard that fails these checks; extract_shard rebuilds one)"
)
"""What to do about a shard that fails its checks."""

# The tensors of states.safetensors and their dtypes (formats.py, "Hidden-state shard").
_DTYPES = {"offsets": "I64", "input_ids": "I32", "aux": "BF16", "final": "BF16", "loss_mask": "U8"}


def shard_index(name: str) -> int | None:
    """The index in a shard folder's name (`shard-00003` -> 3); None for any other name."""
    match = _SHARD_DIR.match(name)
    return int(match.group(1)) if match else None


def read_manifest(shard_dir: str | Path) -> ShardManifest | None:
    """The shard's manifest, or None when the shard is absent or incomplete (no manifest yet).

    A manifest that is not JSON, or has a key missing, unknown or of the wrong type, is a
    ValueError naming the file and the fix."""
    path = Path(shard_dir) / SHARD_MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        return ShardManifest.from_json(path.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{path}: not a valid shard manifest ({exc}); {SHARD_FIX}") from None


def _expected_tensors(m: ShardManifest) -> dict[str, list[int]]:
    n, T, H = len(m.sample_ids), sum(m.token_counts), m.hidden_size
    return {"offsets": [n + 1], "input_ids": [T], "aux": [T, len(m.aux_layer_ids) * H], "final": [T, H], "loss_mask": [T]}


def shard_problem(shard_dir: str | Path, checksum: bool | None = None) -> str | None:
    """Why the shard folder cannot be trusted, naming the file; None when it can.

    `checksum`: True compares the file's SHA-256 with the manifest's, False never does, None
    (the default) does when `states.safetensors` was modified after its manifest. Manifests
    from before sizes and checksums were recorded get every other check.
    """
    shard_dir = Path(shard_dir)
    manifest_path, states = shard_dir / SHARD_MANIFEST_FILE, shard_dir / SHARD_STATES_FILE
    if not manifest_path.is_file():
        return f"{shard_dir} has no {SHARD_MANIFEST_FILE} (an unfinished write)"
    try:
        m = ShardManifest.from_json(manifest_path.read_bytes())
    except ValueError as exc:
        return f"{manifest_path}: not a valid shard manifest ({exc})"
    index = shard_index(shard_dir.name)
    n = len(m.sample_ids)
    for bad, what in (
        (len(m.token_counts) != n, f"{len(m.token_counts)} token counts for {n} samples"),
        (any(c < 1 for c in m.token_counts), "a sample of no tokens"),
        (len(set(m.sample_ids)) != n, "a sample id listed twice"),
        (not m.aux_layer_ids or m.hidden_size < 1, f"aux ids {m.aux_layer_ids} and hidden size {m.hidden_size}"),
        (not 0 <= m.shard < m.num_shards, f"shard {m.shard} of {m.num_shards}"),
        (index is not None and index != m.shard, f"shard {m.shard}, in the folder of shard {index}"),
        (m.dtype != "bfloat16", f"dtype {m.dtype!r} (shards hold bfloat16)"),
    ):
        if bad:
            return f"{manifest_path}: the manifest says {what}"
    if not states.is_file():
        return f"{states} does not exist (its manifest does)"
    try:
        header, data_start = read_safetensors_layout(states, fix=SHARD_FIX)
    except ValueError as exc:
        return str(exc).removesuffix(f": {SHARD_FIX}")
    expected = _expected_tensors(m)
    got = {name: (e.get("dtype"), e["shape"]) for name, e in header.items()}
    want = {name: (_DTYPES[name], shape) for name, shape in expected.items()}
    if got != want:
        wrong = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        detail = "; ".join(f"{k}: {got.get(k, 'absent')} where the manifest's counts need {want.get(k, 'none')}" for k in wrong)
        return f"{states} does not hold what {manifest_path} describes ({n} samples, {sum(m.token_counts)} tokens): {detail}"
    size = states.stat().st_size
    if m.states_bytes and size != m.states_bytes:
        return f"{states} is {size} bytes, its manifest recorded {m.states_bytes} at commit"
    at = data_start + header["offsets"]["data_offsets"][0]
    offsets = np.fromfile(states, dtype="<i8", count=n + 1, offset=at)
    if not np.array_equal(offsets, np.concatenate([[0], np.cumsum(m.token_counts)])):
        return f"{states}: its sample offsets are not the running sum of the token counts in {manifest_path}"
    if m.states_sha256 and (checksum or (checksum is None and states.stat().st_mtime_ns > manifest_path.stat().st_mtime_ns)):
        with open(states, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != m.states_sha256:
            return f"{states}: its SHA-256 is {digest[:16]}..., its manifest recorded {m.states_sha256[:16]}... at commit"
    return None


def verify_shards(root: str | Path, checksum: bool = True) -> dict[Path, str]:
    """{shard folder: what is wrong} for the shard folders under `root` that have a manifest,
    their checksums compared by default: the check to run after copying shards between machines."""
    root = Path(root)
    found = {}
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if _SHARD_DIR.match(p.name) and (p / SHARD_MANIFEST_FILE).is_file():
            problem = shard_problem(p, checksum=checksum)
            if problem is not None:
                found[p] = problem
    return found


class ShardReader:
    """One complete shard folder, read lazily through a memory map."""

    def __init__(self, shard_dir: str | Path, checksum: bool = False):
        """Refuses (ValueError naming the file and the fix) a shard that fails `shard_problem`;
        `checksum=True` also compares the file's SHA-256 (reads the whole file once)."""
        self.shard_dir = Path(shard_dir)
        manifest = read_manifest(self.shard_dir)
        if manifest is None:
            raise FileNotFoundError(
                f"{self.shard_dir} is not a complete hidden-state shard (no {SHARD_MANIFEST_FILE}); rebuild it with extract_shard"
            )
        problem = shard_problem(self.shard_dir, checksum=checksum)
        if problem is not None:
            raise ValueError(f"{problem}; {SHARD_FIX}")
        self.manifest = manifest
        self._file = None
        self._offsets = self._open().get_tensor("offsets")  # (n+1,) int64, small
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


def open_shards(root: str | Path, checksum: bool = False) -> list[ShardReader]:
    """Readers for the complete shards under `root`, by shard index; incomplete ones (no
    manifest yet) are ignored, a corrupt one is refused (ValueError naming it and the fix).

    Raises when complete shards disagree on aux ids, hidden size or shard count (they come
    from different extractions and cannot be trained on together).
    """
    readers = []
    for p in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        if _SHARD_DIR.match(p.name) and read_manifest(p) is not None:
            readers.append(ShardReader(p, checksum=checksum))
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
