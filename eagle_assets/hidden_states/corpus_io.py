"""Reading the corpus (Parquet shards + manifest.json) for the hidden-state stage.

The corpus stage writes Parquet files with the columns of `formats.CORPUS_COLUMNS`; this
module finds them (local path or any fsspec URL), yields rows, and gathers the validated
samples of one hidden-state shard:

    >>> from eagle_assets.hidden_states.corpus_io import iter_corpus_rows, load_shard_samples
    >>> for row in iter_corpus_rows("data/corpus", ["sample_id", "num_tokens"]):
    ...     print(row["sample_id"], row["num_tokens"])
    >>> samples = load_shard_samples("data/corpus", shard_index=3, num_shards=16)

Which files make the corpus: when `manifest.json` lists them (under "shards" or "files", as
names or as objects with a "path"/"file"/"name" key) exactly those, otherwise every
`*.parquet` below the folder whose name does not start with "." or "_" (temporary files).

`tokenizer_fingerprint(tokenizer)` is the hash the extraction compares with the corpus's
`target` column, so that hidden states are never computed with a tokenizer other than the
one that produced the token ids.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eagle_assets.checked_reads import parse_json_object
from eagle_assets.formats import CORPUS_MANIFEST, shard_of, stable_id

CORPUS_FIX = "rerun the corpus stage: opening the corpus store for writing sets an unreadable shard aside and the stage generates its samples again"
"""What to do about a corpus file that cannot be read."""
MANIFEST_FIX = (
    "restore it, or move it aside: the corpus is then every part-*.parquet in the folder, and the corpus "
    "store lists them again when next opened for writing"
)

LIST_COLUMNS = {"input_ids": np.int32, "loss_mask": np.uint8}
"""List columns, yielded as numpy arrays of these dtypes (everything else as Python values)."""


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash of a tokenizer's vocabulary (token -> id, added tokens included).

    Two tokenizers with the same fingerprint map every string to the same ids, which is what
    the hidden states depend on; the chat template is not part of it (the corpus already holds
    the templated ids).
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return stable_id("tokenizer-vocab", vocab)


def corpus_files(corpus_dir: str) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The filesystem and the Parquet files that make up the corpus at `corpus_dir`."""
    fs, root = fsspec.core.url_to_fs(str(corpus_dir))
    if fs.isfile(root):
        return fs, [root]
    if not fs.isdir(root):
        raise FileNotFoundError(
            f"corpus folder {corpus_dir} does not exist; materialise the synthetic_corpus asset first or point corpus_dir at its output"
        )
    manifest_path = posixpath.join(root, CORPUS_MANIFEST)
    listed = None
    if fs.isfile(manifest_path):
        with fs.open(manifest_path, "rb") as f:
            manifest = parse_json_object(f.read(), manifest_path, "the corpus manifest", MANIFEST_FIX)
        listed = manifest.get("shards", manifest.get("files"))
        if listed is not None and not isinstance(listed, list):
            raise ValueError(f"{manifest_path}: its shards are a JSON {type(listed).__name__}, not a list: {MANIFEST_FIX}")
    if listed is not None:
        files = [posixpath.join(root, _entry_path(e, manifest_path)) for e in listed]
        missing = [f for f in files if not fs.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"{manifest_path} lists {len(missing)} file(s) that do not exist, first {missing[0]}; "
                "the corpus folder is incomplete: rerun the corpus stage to restore it"
            )
        return fs, files
    files = sorted(
        p
        for p in fs.glob(posixpath.join(root, "**", "*.parquet"))
        if not any(part.startswith((".", "_")) for part in posixpath.relpath(p, root).split("/"))
    )
    if not files:
        raise FileNotFoundError(f"no Parquet files in corpus folder {corpus_dir}; materialise the corpus first")
    return fs, files


def _entry_path(entry, manifest_path: str) -> str:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict):
        for key in ("path", "file", "name"):
            if isinstance(entry.get(key), str):
                return entry[key]
    raise ValueError(f'{manifest_path}: cannot read shard entry {entry!r}; expected a file name or an object with a "path", "file" or "name" key')


def iter_corpus_rows(
    corpus_dir: str,
    columns: Iterable[str],
    where: Callable[[str], bool] | None = None,
    batch_rows: int = 1024,
) -> Iterator[dict]:
    """Yield the corpus rows as dicts holding `columns`, in file order.

    `where(sample_id)` keeps only matching rows; it is applied before the list columns are
    converted, so selecting one shard of a large corpus stays cheap. List columns
    (`LIST_COLUMNS`) come as numpy arrays, the others as Python values.
    """
    columns = list(columns)
    read = list(dict.fromkeys(columns + (["sample_id"] if where is not None else [])))
    fs, files = corpus_files(corpus_dir)
    for path in files:
        with fs.open(path, "rb") as f:
            pf = _parquet_file(f, path)
            absent = [c for c in read if c not in pf.schema_arrow.names]
            if absent:
                raise ValueError(
                    f"corpus file {path} has no column(s) {absent}; the hidden-state stage needs "
                    f"{read}. The file was not written by this version of the corpus stage: rebuild it."
                )
            batches = pf.iter_batches(batch_size=batch_rows, columns=read)
            while (batch := _next_batch(batches, path)) is not None:
                if where is not None:
                    keep = [where(s) for s in batch.column("sample_id").to_pylist()]
                    if not any(keep):
                        continue
                    batch = batch.filter(pa.array(keep))
                yield from _rows(batch, columns)


def _parquet_file(f, path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(f, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid: no footer (truncated), garbage
        raise ValueError(f"corpus file {path} is not a readable Parquet file ({exc}): {CORPUS_FIX}") from None


def _next_batch(batches: Iterator[pa.RecordBatch], path: str) -> pa.RecordBatch | None:
    """The next batch, or None at the end; a page that does not decode (or fails its checksum)
    is a ValueError naming the file. Only the read is guarded, not the caller's use of the rows."""
    try:
        return next(batches, None)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"corpus file {path} has a damaged page ({exc}): {CORPUS_FIX}") from None


def _rows(batch: pa.RecordBatch, columns: list[str]) -> Iterator[dict]:
    cols = {}
    for name in columns:
        arr = batch.column(name)
        if name in LIST_COLUMNS:
            # One conversion for the whole batch, then cheap slices by the list offsets.
            arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
            flat = arr.flatten().to_numpy(zero_copy_only=False).astype(LIST_COLUMNS[name], copy=False)
            offs = arr.offsets.to_numpy()
            base = offs[0]
            cols[name] = [flat[a - base : b - base] for a, b in zip(offs[:-1], offs[1:])]
        else:
            cols[name] = arr.to_pylist()
    for i in range(batch.num_rows):
        yield {name: cols[name][i] for name in columns}


@dataclass(frozen=True)
class ShardSamples:
    """The corpus samples of one hidden-state shard, in the order the shard stores them."""

    sample_ids: list[str]
    """Sample ids, longest first (ties by id): the order of batching and of the shard's rows."""
    input_ids: list[np.ndarray]
    """Per sample (T_i,) int32 token ids, exactly as in the corpus."""
    loss_mask: list[np.ndarray]
    """Per sample (T_i,) uint8, 1 on assistant tokens."""

    @property
    def token_counts(self) -> list[int]:
        return [len(x) for x in self.input_ids]

    @property
    def num_tokens(self) -> int:
        return sum(self.token_counts)

    def fingerprint(self) -> str:
        """Hash of exactly what the shard is computed from: ids, tokens and masks in order."""
        h = hashlib.sha256()
        for sid, ids, mask in zip(self.sample_ids, self.input_ids, self.loss_mask):
            h.update(sid.encode())
            h.update(np.ascontiguousarray(ids, dtype="<i4").tobytes())
            h.update(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
        return h.hexdigest()[:20]


def load_shard_samples(
    corpus_dir: str,
    shard_index: int,
    num_shards: int,
    vocab_size: int | None = None,
    target_fingerprint: str | None = None,
) -> ShardSamples:
    """Read and validate the samples that `formats.shard_of` assigns to `shard_index`.

    Checks, each failing with an error that names the sample: ids and mask of equal length
    (and equal to `num_tokens`), at least one assistant token, token ids within
    `[0, vocab_size)`, no duplicate sample ids, and (when given) the corpus `target`
    fingerprint equal to `target_fingerprint`.
    """
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} is out of range for num_shards={num_shards} (valid: 0..{num_shards - 1})")
    columns = ["sample_id", "input_ids", "loss_mask", "num_tokens", "target"]
    rows = []
    seen: set[str] = set()
    for row in iter_corpus_rows(corpus_dir, columns, where=lambda s: shard_of(s, num_shards) == shard_index):
        _validate_row(row, corpus_dir, vocab_size, target_fingerprint)
        if row["sample_id"] in seen:
            raise ValueError(
                f"corpus {corpus_dir} holds sample {row['sample_id']} twice; the corpus stage "
                "must write each sample once: deduplicate the corpus before extracting"
            )
        seen.add(row["sample_id"])
        rows.append(row)
    rows.sort(key=lambda r: (-len(r["input_ids"]), r["sample_id"]))
    return ShardSamples(
        sample_ids=[r["sample_id"] for r in rows],
        input_ids=[r["input_ids"] for r in rows],
        loss_mask=[r["loss_mask"] for r in rows],
    )


def load_all_shard_samples(
    corpus_dir: str,
    num_shards: int,
    vocab_size: int | None = None,
    target_fingerprint: str | None = None,
) -> list[ShardSamples]:
    """`load_shard_samples` of every shard, in shard order, from one pass over the corpus (the
    same checks, the same order within a shard): what online training numbers its samples by."""
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards} must be at least 1")
    columns = ["sample_id", "input_ids", "loss_mask", "num_tokens", "target"]
    groups: list[list[dict]] = [[] for _ in range(num_shards)]
    seen: set[str] = set()
    for row in iter_corpus_rows(corpus_dir, columns):
        _validate_row(row, corpus_dir, vocab_size, target_fingerprint)
        if row["sample_id"] in seen:
            raise ValueError(
                f"corpus {corpus_dir} holds sample {row['sample_id']} twice; the corpus stage "
                "must write each sample once: deduplicate the corpus before training on it"
            )
        seen.add(row["sample_id"])
        groups[shard_of(row["sample_id"], num_shards)].append(row)
    out = []
    for rows in groups:
        rows.sort(key=lambda r: (-len(r["input_ids"]), r["sample_id"]))
        out.append(ShardSamples([r["sample_id"] for r in rows], [r["input_ids"] for r in rows], [r["loss_mask"] for r in rows]))
    return out


def _validate_row(row: dict, corpus_dir: str, vocab_size: int | None, target_fingerprint: str | None) -> None:
    sid, ids, mask = row["sample_id"], row["input_ids"], row["loss_mask"]
    where = f"corpus {corpus_dir}, sample {sid}"
    if target_fingerprint is not None and row["target"] != target_fingerprint:
        raise ValueError(
            f"{where}: the corpus was made for target fingerprint {row['target']!r}, but the target "
            f"being extracted has fingerprint {target_fingerprint!r} (its tokenizer differs), so the "
            "token ids would mean different text: load the target the corpus was made with, or "
            "rebuild the corpus for this target."
        )
    if len(ids) != len(mask):
        raise ValueError(f"{where}: input_ids has {len(ids)} tokens but loss_mask {len(mask)}; rebuild this sample")
    if row.get("num_tokens") is not None and row["num_tokens"] != len(ids):
        raise ValueError(f"{where}: num_tokens says {row['num_tokens']} but input_ids has {len(ids)}; rebuild this sample")
    if len(ids) == 0:
        raise ValueError(f"{where}: the sample has no tokens; drop it from the corpus")
    if not mask.any():
        raise ValueError(
            f"{where}: loss_mask has no assistant token (all zeros), so the drafter cannot learn "
            "from it; drop the sample or fix the corpus stage's loss mask"
        )
    if vocab_size is not None and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids.max() if ids.max() >= vocab_size else ids.min())
        raise ValueError(f"{where}: token id {bad} is outside the target vocabulary [0, {vocab_size}); the corpus was tokenised for another target")


def corpus_token_counts(corpus_dir: str, num_shards: int) -> dict[int, dict[str, int]]:
    """{shard index: {sample id: num_tokens}} from the cheap columns only (no token ids read)."""
    out: dict[int, dict[str, int]] = {i: {} for i in range(num_shards)}
    for row in iter_corpus_rows(corpus_dir, ["sample_id", "num_tokens"]):
        out[shard_of(row["sample_id"], num_shards)][row["sample_id"]] = int(row["num_tokens"])
    return out
