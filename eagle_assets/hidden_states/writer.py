"""Writing one hidden-state shard: a preallocated safetensors file filled by a background thread.

Token counts are known before the forward passes start, so the whole `states.safetensors`
layout (header, tensor offsets, file size) is fixed up front (`ShardLayout`). The file is
created at its final size, the small tensors (`offsets`, `input_ids`, `loss_mask`) are written
at once, and each batch's `aux` and `final` rows are streamed into their place by a writer
thread (`ShardWriter.put`) while the next forward pass runs, and the kernel is asked to start
writing them to disk at once (`start_writeback`), so that the disk streams all along and the
fsync at commit has little left to do. A bounded pool of (pinned) host buffers (`BufferPool`)
limits how far the forward passes may run ahead of the disk.

Atomicity: everything is written into a hidden temporary folder next to the shard
(`.shard-00007.tmp-<pid>`), validated, fsynced, hashed, and then renamed into place with its
`manifest.json` (which records the file's size and SHA-256) already inside. A shard folder is
therefore complete iff it exists with its manifest and passes `reader.shard_problem`; a killed process leaves only a hidden temporary folder, removed by the next run
(`remove_stale`).

    layout = ShardLayout(num_samples=n, num_tokens=T, num_aux=3, hidden_size=H)
    with ShardWriter(out_dir, shard_index, layout, offsets, input_ids, loss_mask) as w:
        bufs = pool.acquire()            # fill bufs.aux[:rows], bufs.final[:rows]
        w.put(row0, rows, bufs, pool, ready_event)
        w.commit(manifest)               # validates, fsyncs, renames into place

The tensors, their order in the file (largest element first, so that every tensor starts at
a multiple of its element size) and their shapes:
    offsets (n+1,) int64 | input_ids (T,) int32 | aux (T, n_aux*H) bf16 | final (T, H) bf16 | loss_mask (T,) uint8
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import shutil
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from eagle_assets.durable import file_sha256, fsync_dir, no_room, room_named
from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, ShardManifest, shard_name

SHARD_KEPT = "the complete shards are kept; this one is not, and a rerun builds it"
"""What a full disk leaves, for its message: a shard is whole or absent."""
TENSOR_ORDER = ("offsets", "input_ids", "aux", "final", "loss_mask")
_DTYPES = {"offsets": ("I64", 8), "aux": ("BF16", 2), "final": ("BF16", 2), "input_ids": ("I32", 4), "loss_mask": ("U8", 1)}


@dataclass(frozen=True)
class ShardLayout:
    """Byte layout of one `states.safetensors`, fixed by the shard's sizes before any state exists."""

    num_samples: int
    """n: samples in the shard."""
    num_tokens: int
    """T: tokens in the shard (sum of the samples' lengths)."""
    num_aux: int
    """Aux states saved per token."""
    hidden_size: int
    """H: width of one state."""
    aux_layer_ids: tuple[int, ...] = ()
    """Recorded in the header metadata, so the file describes itself."""

    def shapes(self) -> dict[str, list[int]]:
        T, n, H = self.num_tokens, self.num_samples, self.hidden_size
        shapes = {"offsets": [n + 1], "input_ids": [T], "aux": [T, self.num_aux * H], "final": [T, H], "loss_mask": [T]}
        return {name: shapes[name] for name in TENSOR_ORDER}

    def header(self) -> bytes:
        """The 8-byte length plus the JSON header, padded with spaces to a multiple of 8."""
        meta = {
            "format": "pt",
            "aux_layer_ids": ",".join(map(str, self.aux_layer_ids)),
            "layer_id_convention": "hf_hidden_states",
            "final_state": "normed",
        }
        header: dict = {"__metadata__": meta}
        begin = 0
        for name, shape in self.shapes().items():
            dtype, size = _DTYPES[name]
            end = begin + size * int(np.prod(shape))
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
            begin = end
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        return struct.pack("<Q", len(blob)) + blob

    def data_start(self) -> int:
        return len(self.header())

    def tensor_offset(self, name: str) -> int:
        """Absolute byte offset of tensor `name` in the file."""
        offset = self.data_start()
        for other, shape in self.shapes().items():
            if other == name:
                return offset
            offset += _DTYPES[other][1] * int(np.prod(shape))
        raise KeyError(name)

    def row_bytes(self, name: str) -> int:
        shape = self.shapes()[name]
        return _DTYPES[name][1] * int(np.prod(shape[1:]))

    def file_bytes(self) -> int:
        """Exact size of the file: header + (n+1)*8 + T * bytes_per_token."""
        return self.data_start() + sum(_DTYPES[k][1] * int(np.prod(s)) for k, s in self.shapes().items())


class BufferPool:
    """A fixed set of host buffers for batch rows; `acquire` blocks while all are being written.

    Pinned when the states come from a GPU, so that the device-to-host copies can run
    asynchronously. Sized for `max_rows` tokens; allocated once and reused across shards.
    """

    def __init__(self, count: int, max_rows: int, num_aux: int, hidden_size: int, pin: bool):
        self.max_rows = max_rows
        self._free: queue.Queue[PoolBuffers] = queue.Queue()
        for _ in range(count):
            aux = torch.empty(max_rows, num_aux * hidden_size, dtype=torch.bfloat16, pin_memory=pin)  # (R, n_aux*H)
            final = torch.empty(max_rows, hidden_size, dtype=torch.bfloat16, pin_memory=pin)  # (R, H)
            self._free.put(PoolBuffers(aux, final))

    def acquire(self) -> "PoolBuffers":
        return self._free.get()

    def release(self, bufs: "PoolBuffers") -> None:
        self._free.put(bufs)


@dataclass(frozen=True)
class PoolBuffers:
    aux: torch.Tensor
    """(max_rows, n_aux*H) bf16 host buffer."""
    final: torch.Tensor
    """(max_rows, H) bf16 host buffer."""


def temp_prefix(index: int) -> str:
    return f".{shard_name(index)}."


def remove_stale(out_dir: Path, index: int) -> list[Path]:
    """Delete what a killed writer of shard `index` left behind (hidden temporary folders)."""
    removed = []
    for p in Path(out_dir).glob(temp_prefix(index) + "*"):
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _libc_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Have the kernel start writing `offset:offset+nbytes` to disk now, without waiting for it.

    Streaming the page cache to disk as rows arrive keeps the disk busy all along and leaves
    little for the final fsync; otherwise dirty pages pile up until the fsync at commit, which
    then stalls. Linux only (a no-op elsewhere, where the final fsync does all the work); a
    hint, so its errors are ignored: the fsync at commit is what guarantees durability.
    """
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        # pwrite may write less than asked (Linux caps one call near 2 GiB).
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)


class ShardWriter:
    """Writes one shard into a hidden temporary folder; `commit` validates and renames it into place."""

    @staticmethod
    def staging_dir(out_dir: str | os.PathLike, index: int) -> Path:
        """The hidden folder this process writes shard `index` into before the rename."""
        return Path(out_dir) / f"{temp_prefix(index)}tmp-{os.getpid()}"

    def __init__(
        self,
        out_dir: str | os.PathLike,
        index: int,
        layout: ShardLayout,
        offsets: np.ndarray,
        input_ids: np.ndarray,
        loss_mask: np.ndarray,
    ):
        self.out_dir = Path(out_dir)
        self.index = index
        self.layout = layout
        self.final_dir = self.out_dir / shard_name(index)
        self.tmp_dir = self.staging_dir(self.out_dir, index)
        self._ranges: list[tuple[int, int]] = []
        self._error: BaseException | None = None
        self._closed = False
        self._committed = False

        T = layout.num_tokens
        if offsets.shape != (layout.num_samples + 1,) or offsets[-1] != T or len(input_ids) != T or len(loss_mask) != T:
            raise ValueError(
                f"shard {index}: offsets/input_ids/loss_mask do not match the layout (n={layout.num_samples}, T={T}); this is a bug in the caller"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale(self.out_dir, index)
        with room_named(self.final_dir, f"shard {index}", SHARD_KEPT):
            self.tmp_dir.mkdir()
            self._fd = os.open(self.tmp_dir / SHARD_STATES_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Full size up front: the rows land at fixed offsets in any order, and a short file
            # can never pass for a finished one.
            os.ftruncate(self._fd, layout.file_bytes())
            _pwrite_all(self._fd, layout.header(), 0)
            for name, values, dtype in (("offsets", offsets, "<i8"), ("input_ids", input_ids, "<i4"), ("loss_mask", loss_mask, "u1")):
                _pwrite_all(self._fd, np.ascontiguousarray(values, dtype=dtype), layout.tensor_offset(name))
        except BaseException as exc:
            os.close(self._fd)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            full = no_room(exc, self.final_dir, f"shard {index}'s header", SHARD_KEPT)
            if full is not None:
                raise full from None
            raise

        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"shard-{index}-writer", daemon=True)
        self._thread.start()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Not `_closed`: a commit that fails its file checks has already closed the fd.
        if not self._committed:
            self.abort()

    def put(self, row0: int, rows: int, bufs: PoolBuffers, pool: BufferPool, ready=None) -> None:
        """Queue `bufs.aux[:rows]`, `bufs.final[:rows]` for token rows `row0:row0+rows`.

        `ready` (a CUDA event or None) is waited on by the writer thread before it reads the
        buffers; the buffers go back to `pool` once written.
        """
        self._raise_if_failed()
        self._queue.put((row0, rows, bufs, pool, ready))

    def _run(self) -> None:
        L = self.layout
        aux_at, final_at = L.tensor_offset("aux"), L.tensor_offset("final")
        aux_row, final_row = L.row_bytes("aux"), L.row_bytes("final")
        while (item := self._queue.get()) is not None:
            row0, rows, bufs, pool, ready = item
            try:
                if self._error is None:
                    if ready is not None:
                        ready.synchronize()
                    for at, row, buf in ((aux_at, aux_row, bufs.aux), (final_at, final_row, bufs.final)):
                        _pwrite_all(self._fd, _as_bytes(buf[:rows]), at + row0 * row)
                        start_writeback(self._fd, at + row0 * row, rows * row)
                    self._ranges.append((row0, row0 + rows))
            except BaseException as e:  # handed to the main thread at its next put/commit
                self._error = e
            finally:
                pool.release(bufs)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            full = no_room(self._error, self.final_dir, f"shard {self.index}'s states", SHARD_KEPT)
            if full is not None:
                raise full from None
            raise RuntimeError(f"writing shard {self.index} to {self.tmp_dir} failed: {self._error}") from self._error

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def commit(self, manifest: ShardManifest) -> Path:
        """Validate, fsync and rename the shard into place; returns the shard folder.

        Records the file's size and SHA-256 in `manifest` (`states_bytes`, `states_sha256`)
        before writing it: the reader checks the size on every open and the checksum when asked
        or when the file changed after its manifest (`reader.shard_problem`)."""
        self._stop()
        self._raise_if_failed()
        T = self.layout.num_tokens
        covered = sorted(self._ranges)
        expected_start = 0
        for a, b in covered:
            if a != expected_start:
                raise RuntimeError(f"shard {self.index}: token rows {expected_start}:{a} were never written (or twice)")
            expected_start = b
        if expected_start != T:
            raise RuntimeError(f"shard {self.index}: {expected_start} of {T} token rows written")
        with room_named(self.final_dir, f"shard {self.index}", SHARD_KEPT):  # a full disk may show only at fsync
            os.fsync(self._fd)
            os.close(self._fd)
            self._closed = True
        self._validate_file()
        manifest.states_bytes, manifest.states_sha256 = self.layout.file_bytes(), file_sha256(self.tmp_dir / SHARD_STATES_FILE)
        manifest_tmp = self.tmp_dir / (SHARD_MANIFEST_FILE + ".tmp")
        with room_named(self.final_dir, f"shard {self.index}'s manifest", SHARD_KEPT), open(manifest_tmp, "w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(manifest_tmp, self.tmp_dir / SHARD_MANIFEST_FILE)
        fsync_dir(self.tmp_dir)  # the manifest's name, before the folder's rename publishes it
        self._move_into_place()
        self._committed = True
        return self.final_dir

    def _validate_file(self) -> None:
        path = self.tmp_dir / SHARD_STATES_FILE
        size = path.stat().st_size
        if size != self.layout.file_bytes():
            raise RuntimeError(f"{path} is {size} bytes, its layout says {self.layout.file_bytes()}")
        with safe_open(path, framework="pt") as f:
            for name, shape in self.layout.shapes().items():
                got = f.get_slice(name).get_shape()
                if list(got) != shape:
                    raise RuntimeError(f"{path}: tensor {name} has shape {got}, expected {shape}")

    def _move_into_place(self) -> None:
        old = None
        if self.final_dir.exists():
            # A rebuild: move the old folder aside first (a directory rename cannot replace a
            # non-empty one); between the two renames the shard is absent, never partial.
            old = self.out_dir / f"{temp_prefix(self.index)}old-{os.getpid()}"
            os.rename(self.final_dir, old)
        os.rename(self.tmp_dir, self.final_dir)
        fsync_dir(self.out_dir)  # makes the rename itself durable
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Stop the writer and delete the temporary folder; nothing visible changes."""
        self._stop()
        if not self._closed:
            os.close(self._fd)
            self._closed = True
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
