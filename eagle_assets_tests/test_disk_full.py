"""A full disk wherever a run writes: one clear message naming the path, nothing half-written.

The disk is a real one: a small tmpfs mounted for the module (as root; `mount -t tmpfs`), filled
with a file until only a few pages are left before each row. Each row writes as the pipeline does
(the corpus store, durable writes, prompt files, benchmark JSON, a hidden-state shard) and must
raise `durable.DiskFull` whose message names the path and says what is kept, leave no temporary
file behind, and leave what was there before readable. One more row runs the corpus generator's
command line in its own process onto the full disk.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from eagle_assets.corpus.store import CorpusStore
from eagle_assets.durable import DiskFull, write_durably

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1 << 20
"""The tmpfs: 1 MiB."""
LEFT = 16 << 10
"""Room left free before each row: four pages."""


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Path:
    mount = tmp_path_factory.mktemp("full-disk")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def folder(disk, request) -> Path:
    """A fresh folder on the tmpfs with only `LEFT` bytes free (a filler file takes the rest)."""
    for entry in disk.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    here = disk / request.node.callspec.id if hasattr(request.node, "callspec") else disk / "row"
    here.mkdir()
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - LEFT))
    return here


def leftovers(folder: Path) -> list[str]:
    """Temporary files a write left behind."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if re.search(r"(^|[.-])tmp", p.name))


def noise(n: int) -> str:
    """Text that does not compress (Parquet's zstd would shrink anything else into the room left)."""
    return np.random.default_rng(n).bytes(n).hex()


def corpus_row(i: int) -> dict:
    return {
        "sample_id": f"s{i}",
        "prompt_id": f"p{i}",
        "source": "file",
        "messages": noise(6000),
        "input_ids": [1, 2],
        "loss_mask": [0, 1],
        "num_tokens": 2,
        "num_turns": 1,
        "finish_reason": "stop",
        "truncated": False,
        "reasoning_captured": False,
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "latency_s": 0.0,
        "sampling": "{}",
        "target": "t",
    }


def corpus_store(folder: Path) -> tuple[str, str]:
    store = CorpusStore(str(folder / "corpus"), shard_size=1)
    with pytest.raises(DiskFull) as full:
        for i in range(100):
            store.append(corpus_row(i))
    kept = CorpusStore(str(folder / "corpus"), mode="r").num_rows
    assert 0 < kept < 100
    store.flush()  # after the failure: nothing more is tried, nothing raised twice
    store.close()
    assert CorpusStore(str(folder / "corpus"), mode="r").num_rows == kept
    return str(full.value), f"the {kept} samples in complete shards are kept"


def durable_write(folder: Path) -> tuple[str, str]:
    path = folder / "summary.json"
    path.write_text("before")
    with pytest.raises(DiskFull) as full:
        write_durably(path, noise(LEFT * 2).encode())
    assert path.read_text() == "before"
    return str(full.value), f"{path} keeps what it held before"


def prompt_file(folder: Path) -> tuple[str, str]:
    from eagle_assets.corpus.prompt_record import Prompt
    from eagle_assets.corpus.prompts import write_prompts

    path = folder / "prompts.jsonl"
    with pytest.raises(DiskFull) as full:
        write_prompts([Prompt.make([noise(4000 + i)]) for i in range(20)], str(path))
    assert not path.exists()
    return str(full.value), f"{path} keeps what it held before"


def benchmark_json(folder: Path) -> tuple[str, str]:
    from eagle_assets.bench.served import write_json_atomic

    path = folder / "measurements" / "sweep.json"
    with pytest.raises(DiskFull) as full:
        write_json_atomic(path, {"levels": [noise(LEFT * 2)]})
    assert not path.exists()
    return str(full.value), "keeps what it held before"


def hidden_state_shard(folder: Path) -> tuple[str, str]:
    from eagle_assets.formats import ShardManifest
    from eagle_assets.hidden_states.writer import BufferPool, ShardLayout, ShardWriter

    tokens, hidden = 64, 128  # aux and final in bf16: 64 KiB, four times the room left
    layout = ShardLayout(num_samples=1, num_tokens=tokens, num_aux=3, hidden_size=hidden, aux_layer_ids=(0, 1, 2))
    manifest = ShardManifest(
        shard=0,
        num_shards=1,
        sample_ids=["a"],
        token_counts=[tokens],
        aux_layer_ids=[0, 1, 2],
        hidden_size=hidden,
        target_fingerprint="t",
        corpus_fingerprint="c",
    )
    pool = BufferPool(1, tokens, 3, hidden, pin=False)
    with pytest.raises(DiskFull) as full:
        with ShardWriter(folder / "shards", 0, layout, np.array([0, tokens]), np.zeros(tokens, np.int32), np.ones(tokens, np.uint8)) as w:
            bufs = pool.acquire()
            bufs.aux[:tokens] = torch.randn(tokens, 3 * hidden)
            bufs.final[:tokens] = torch.randn(tokens, hidden)
            w.put(0, tokens, bufs, pool)
            w.commit(manifest)
    assert not list((folder / "shards").iterdir())  # neither the shard nor its temporary folder
    return str(full.value), "the complete shards are kept; this one is not"


@dataclass(frozen=True)
class Row:
    id: str
    write: Callable[[Path], tuple[str, str]]
    """Writes onto the nearly full disk; returns (the DiskFull's message, what it must say is kept)."""
    where: str
    """The path the message must name, under the row's folder."""


ROWS = [
    Row("corpus_store", corpus_store, "corpus/part-"),
    Row("durable_write", durable_write, "summary.json"),
    Row("prompt_file", prompt_file, "prompts.jsonl"),
    Row("benchmark_json", benchmark_json, "measurements/sweep.json"),
    Row("hidden_state_shard", hidden_state_shard, "shards/shard-00000 "),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_full_disk_is_named_with_its_path_and_leaves_nothing_half_written(row, folder):
    message, kept = row.write(folder)
    assert f"no space left on the device holding {folder}/{row.where}" in message, message
    assert kept in message, message
    assert leftovers(folder) == []


def test_the_corpus_generator_stops_on_a_full_disk_with_one_clear_line(disk, tmp_path):
    from eagle_assets.targets import EMBEDDED_TARGET
    from eagle_assets.targets.embedded import pull
    from eagle_assets_tests.stall_stub import StallingServer

    for entry in disk.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question {i}: {noise(3000 + i)}"}) + "\n" for i in range(12)))
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - 6 * LEFT))
    server = StallingServer(answer=None)
    try:
        argv = [
            "-m",
            "eagle_assets.cli",
            "corpus",
            "generate",
            "--prompts",
            str(prompts),
            "--out",
            str(disk / "corpus"),
            "--server",
            server.url,
            "--model",
            "m",
            "--tokenizer",
            str(pull(EMBEDDED_TARGET, log=lambda m: None)),
            "--concurrency",
            "1",
            "--shard-size",
            "1",
        ]
        proc = subprocess.run([sys.executable, *argv], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    finally:
        server.close()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert not re.search(r'Traceback|File "[^"]+", line \d+', text), text[-3000:]
    assert len(re.findall("no space left", text)) == 1, text[-3000:]  # once, not chained
    assert f"no space left on the device holding {disk}/corpus/" in text, text[-3000:]
    kept = CorpusStore(str(disk / "corpus"), mode="r").num_rows
    assert 0 < kept < 12 and f"the {kept} samples in complete shards are kept" in text, (kept, text[-3000:])
    assert leftovers(disk / "corpus") == []
