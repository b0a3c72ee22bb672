"""Disk budget for the hidden-state stage: predict the bytes, check the space, plan a run.

    >>> from eagle_assets.hidden_states.budget import plan, predict_bytes, check_free_space
    >>> p = plan("kimi-k2.5", samples=10_000, tokens_per_sample=1_450)
    >>> round(p.hidden_state_bytes / 1e9)      # the reference Kimi-K2.5 run measured 828 GB
    832
    >>> check_free_space("data/hidden_states", p.hidden_state_bytes)   # raises when it does not fit

The hidden-state stage reserves the bytes of every shard it will write before it writes the
first (`reserve_space`), and holds them until the last is committed: a shard's file is sparse
until its rows land, so a check of free space alone would let a second writer into the same
folder (another run of the stage, or `extract_shard` by hand) pass its check too, and the disk
fill midway. The reservations are files beside the output folder (`.hidden_states.reservations/`
for `hidden_states/`), so every writer, on this host or another mounting the same folder, sees
the others'; a check counts what they have still to write.

Sizes are decimal (1 GB = 1e9 bytes), as `df -H` and the reference run report them. Per token a shard
stores (n_aux + 1) bf16 states of width H, an int32 id and a uint8 mask
(`formats.hidden_state_bytes_per_token`); per sample an int64 offset; per shard a header of
a few hundred bytes and a manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle_assets.formats import hidden_state_bytes_per_token
from eagle_assets.targets import TargetPreset, get_preset

CORPUS_BYTES_PER_TOKEN = 9
"""Parquet corpus, before compression: int32 id + uint8 mask + ~4 bytes of message text per token."""
SHARD_OVERHEAD_BYTES = 8192
"""Upper bound of one shard's safetensors header plus the fixed part of its manifest."""
SAMPLE_OVERHEAD_BYTES = 64
"""Per sample: its int64 offset plus its id and token count in the manifest (JSON)."""


def predict_bytes(num_tokens: int, n_aux: int, hidden: int, num_samples: int = 0, num_shards: int = 0) -> int:
    """Bytes the shards take: exact per token, an upper bound for the per-sample/per-shard parts."""
    return num_tokens * hidden_state_bytes_per_token(n_aux, hidden) + num_samples * SAMPLE_OVERHEAD_BYTES + num_shards * SHARD_OVERHEAD_BYTES


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_free_space(dest: str | Path, needed_bytes: int, reserve_bytes: int = 0) -> int:
    """Raise unless `dest`'s filesystem has `needed_bytes` (+ `reserve_bytes`) free beyond what the
    reservations of shards being written into `dest` still have to write; returns free bytes.

    `dest` need not exist yet: the nearest existing parent's filesystem is checked.
    """
    where = _existing(Path(dest))
    free = shutil.disk_usage(where).free
    pending = pending_reservations(Path(dest))
    held = sum(n for _, n in pending)
    if free - held < needed_bytes + reserve_bytes:
        others = ""
        if held:
            names = ", ".join(owner for owner, _ in pending)
            others = f", of which {held:,} bytes ({_human(held)}) are reserved by what is being written there now ({names})"
        raise OSError(
            f"not enough free disk space for the hidden states at {dest}: they need "
            f"{needed_bytes:,} bytes ({_human(needed_bytes)})"
            + (f" plus {_human(reserve_bytes)} reserve" if reserve_bytes else "")
            + f", but only {free:,} bytes ({_human(free)}) are free on the filesystem of {where}{others}. "
            "Free space there, point the output at a larger disk, or use fewer samples or aux layers."
        )
    return free


def reservations_dir(dest: Path) -> Path:
    """The folder holding one file per shard being written into `dest`: beside it, hidden, so
    that the output folder holds shards only."""
    dest = Path(dest).absolute()
    return dest.parent / f".{dest.name}.reservations"


@dataclass(frozen=True)
class Reservation:
    """Bytes a writer holds on a filesystem until it releases them (on commit or failure)."""

    path: Path
    """Its file in the output folder's reservations folder (`reservations_dir`)."""
    nbytes: int

    def release(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def reserve_space(dest: str | Path, needed_bytes: int, owner: str, staging: "str | Path | Sequence[str | Path]") -> Reservation:
    """Check and record, atomically among writers into `dest`, that `needed_bytes` are free there
    beyond what other writers' reservations still have to write; raises OSError (naming them)
    otherwise. `staging` is the folder (or folders) this writer fills: what they hold counts as
    written, and the rest of `needed_bytes` as still reserved. Release it once the last shard it
    covers is committed."""
    from filelock import FileLock

    dest = Path(dest)
    ledger = reservations_dir(dest)
    ledger.mkdir(parents=True, exist_ok=True)
    with FileLock(ledger / ".lock"):
        check_free_space(dest, needed_bytes)
        entry = ledger / f"{''.join(c if c.isalnum() else '-' for c in owner)}.{socket.gethostname()}.{os.getpid()}.json"
        record = {
            "owner": owner,
            "bytes": int(needed_bytes),
            "staging": [str(Path(f).absolute()) for f in ([staging] if isinstance(staging, (str, os.PathLike)) else staging)],
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.time(),
        }
        entry.write_text(json.dumps(record))
    return Reservation(entry, int(needed_bytes))


def pending_reservations(dest: Path) -> list[tuple[str, int]]:
    """(owner, bytes still to write) of each live reservation in `dest`; the files of writers
    on this host that died are removed (a writer elsewhere is taken to live until it releases)."""
    ledger = reservations_dir(Path(dest))
    if not ledger.is_dir():
        return []
    pending = []
    for entry in sorted(ledger.glob("*.json")):
        try:
            record = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue  # released (or being written) meanwhile
        if record.get("host") == socket.gethostname() and not _alive(int(record.get("pid", 0))):
            entry.unlink(missing_ok=True)
            continue
        staging = record.get("staging") or []
        left = int(record["bytes"]) - sum(_allocated_bytes(Path(f)) for f in ([staging] if isinstance(staging, str) else staging))
        if left > 0:
            pending.append((str(record.get("owner")), left))
    return pending


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _allocated_bytes(folder: Path) -> int:
    """Bytes the filesystem has allocated to the files under `folder` (a sparse file counts
    what was written, not its length); 0 once it is gone."""
    total = 0
    for path in folder.rglob("*") if folder.is_dir() else ():
        try:
            total += path.stat().st_blocks * 512 if path.is_file() else 0
        except FileNotFoundError:
            pass
    return total


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError


@dataclass(frozen=True)
class Plan:
    """Sizes of one pipeline run for a target: the arithmetic behind `eagle-assets plan`."""

    target: str
    samples: int
    tokens_per_sample: int
    num_tokens: int
    """samples x tokens_per_sample."""
    num_aux: int
    hidden_size: int
    bytes_per_token: int
    """(n_aux + 1) * H * 2 + 5."""
    corpus_bytes: int
    """Estimate of the Parquet corpus before compression (`CORPUS_BYTES_PER_TOKEN`)."""
    hidden_state_bytes: int
    """The shards on disk (`predict_bytes`)."""

    def extraction_hours(self, tokens_per_s: float) -> float:
        """Hours the forward passes take at a measured extraction rate."""
        return self.num_tokens / tokens_per_s / 3600

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        return [
            f"target {self.target}: {self.samples:,} samples x {self.tokens_per_sample:,} tokens = {self.num_tokens:,} tokens",
            f"corpus (Parquet, uncompressed): {_human(self.corpus_bytes)}",
            f"hidden states: {self.num_aux} aux + final x H={self.hidden_size} bf16 = "
            f"{self.bytes_per_token:,} B/token -> {_human(self.hidden_state_bytes)}",
        ]


def plan(
    preset: str | TargetPreset,
    samples: int,
    tokens_per_sample: int,
    num_aux: int | None = None,
    num_shards: int | None = None,
) -> Plan:
    """Corpus and hidden-state sizes for `samples` of `tokens_per_sample` tokens on `preset`.

    `num_aux` defaults to the preset's aux ids (3); `num_shards` to one shard per 100 samples.
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    n_aux = len(p.default_aux_layer_ids) if num_aux is None else num_aux
    if n_aux < 1:
        raise ValueError(f"num_aux={n_aux}: an EAGLE-3 drafter reads at least one of the target's layers (3 by default)")
    tokens = samples * tokens_per_sample
    shards = num_shards if num_shards is not None else max(1, samples // 100)
    return Plan(
        target=p.name,
        samples=samples,
        tokens_per_sample=tokens_per_sample,
        num_tokens=tokens,
        num_aux=n_aux,
        hidden_size=p.hidden_size,
        bytes_per_token=hidden_state_bytes_per_token(n_aux, p.hidden_size),
        corpus_bytes=tokens * CORPUS_BYTES_PER_TOKEN,
        hidden_state_bytes=predict_bytes(tokens, n_aux, p.hidden_size, samples, shards),
    )
