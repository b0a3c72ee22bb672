"""Corrupt files of our own, through every reader that resumes from them.

Each case builds a real artifact with the real writer (a corpus through `CorpusStore`, hidden-state
shards through `extract_all`, checkpoints and metrics through the trainer), spoils one file one
way (truncated, torn, empty, garbage bytes, bytes appended, data overwritten in place, wrong
counts, unknown or missing keys, deleted), and asserts both:

- read: the reader refuses it with an error that names the spoiled file and says what to do,
  never a raw pyarrow / safetensors / json error, and does not count it as done;
- resume: the stage that resumes from it rebuilds what the file held, and ends exactly where an
  uninterrupted run ends (the same bytes, rows or trajectory), with nothing duplicated; or, for
  a file nothing can be rebuilt from (the corpus manifest), refuses with the file and the fix.

    python -m pytest eagle_assets_tests/test_corrupt_files.py -q -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from eagle_assets.corpus.store import CorpusStore
from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.formats import CORPUS_FAILURES, CORPUS_MANIFEST, SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name
from eagle_assets.hidden_states.corpus_io import iter_corpus_rows
from eagle_assets.hidden_states.extract import extract_all
from eagle_assets.hidden_states.reader import ShardReader, open_shards
from eagle_assets_tests.drafter.test_train import write_tiny_run
from eagle_assets_tests.hidden_states.extract_child import SETTINGS, toy_decoder
from eagle_assets_tests.hidden_states.test_extract import tree_digest

FINGERPRINT = "corrupt-files-target"

# What a reader must never let through: the parsers' own errors (ArrowInvalid and JSONDecodeError
# are ValueErrors, so they are named here, not left to a ValueError check).
RAW = (
    pa.ArrowException,
    SafetensorError,
    json.JSONDecodeError,
    UnicodeDecodeError,
    KeyError,
    TypeError,
    AttributeError,
    IndexError,
    struct.error,
    MemoryError,
    OverflowError,
)
FIX = re.compile(r"rebuild|rerun|delete|move it aside|open the store for writing|restore", re.IGNORECASE)


def assert_refused(call: Callable[[], object], named: Path | str) -> str:
    """`call` raises a clear error: not a raw parser error, naming `named`, saying what to do."""
    with pytest.raises(Exception) as info:
        call()
    exc = info.value
    assert not isinstance(exc, RAW), f"a raw {type(exc).__name__}: {exc}"
    message = str(exc)
    assert str(named) in message, f"{named} is not named in: {message}"
    assert FIX.search(message), f"no fix in: {message}"
    return message


# ----------------------------------------------------------------------------- spoilers


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def drop_last_byte(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(path.stat().st_size))


def append_bytes(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 64)


def overwrite_middle(path: Path) -> None:
    """Same size, header and footer intact: 16 bytes in the middle of the data flipped in place."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        original = f.read(16)
        f.seek(-len(original), os.SEEK_CUR)
        f.write(bytes(b ^ 0x5A for b in original))


def tear(path: Path) -> None:
    """A half-written last line or object: the file cut in the middle of its last entry."""
    data = path.read_bytes().rstrip(b"\n")
    last = data.rfind(b"\n") + 1
    path.write_bytes(data[: last + (len(data) - last) // 2])


def delete(path: Path) -> None:
    path.unlink()


def edit_json(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def spoil(path: Path) -> None:
        value = json.loads(path.read_text())
        value = change(value) or value
        path.write_text(json.dumps(value, indent=2))

    return spoil


def _double_counts(m: dict) -> None:
    m["token_counts"] = m["token_counts"] * 2


def _drop_last_sample(m: dict) -> None:
    m["sample_ids"].pop()
    m["token_counts"].pop()


def _swap_counts(m: dict) -> None:
    """The same samples and tokens in all, each sample given another's length."""
    counts = m["token_counts"]
    j = next(j for j in range(1, len(counts)) if counts[j] != counts[0])
    counts[0], counts[j] = counts[j], counts[0]


def _missing_key(m: dict) -> None:
    del m["corpus_fingerprint"]


# ----------------------------------------------------------------------------- hidden-state shards


def corpus_rows(n: int = 12) -> list[dict]:
    """Corpus rows of token ids that the toy decoder can embed (vocabulary 49152), 6-40 tokens."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        length = rng.randint(6, 40)
        rows.append(
            {
                "sample_id": f"sample-{i:03d}",
                "prompt_id": f"prompt-{i:03d}",
                "source": "file",
                "messages": json.dumps([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]),
                "input_ids": [rng.randrange(1, 49152) for _ in range(length)],
                "loss_mask": [0] * 3 + [1] * (length - 3),
                "num_tokens": length,
                "num_turns": 1,
                "finish_reason": "stop",
                "truncated": False,
                "reasoning_captured": False,
                "prompt_tokens": 3,
                "completion_tokens": length - 3,
                "latency_s": 0.1,
                "sampling": "{}",
                "target": FINGERPRINT,
            }
        )
    return rows


ROWS = corpus_rows()
CORPUS_SHARD_SIZE = 5  # 12 rows: part-00000 (5), part-00001 (5), part-00002 (2)


def write_store(folder: Path) -> Path:
    with CorpusStore(str(folder), shard_size=CORPUS_SHARD_SIZE) as store:
        for row in ROWS:
            store.append(row)
        store.record_failure({"sample_id": "sample-900", "error": "HTTP 500"})
        store.record_failure({"sample_id": "sample-901", "error": "timeout"})
    return folder


@pytest.fixture(scope="module")
def pristine_corpus(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("corpus") / "corpus")


@pytest.fixture(scope="module")
def pristine_shards(tmp_path_factory, pristine_corpus) -> Path:
    out = tmp_path_factory.mktemp("hs") / "hs"
    extract_all(toy_decoder(), str(pristine_corpus), out, SETTINGS, target_fingerprint=FINGERPRINT)
    return out


@dataclass(frozen=True)
class ShardCase:
    file: str
    """The file of shard 1 that is spoiled."""
    spoil: Callable[[Path], None]
    reader_checksum: bool = False
    """The reader catches this one only when asked to compare the checksum (it hashes the file)."""


SHARD_CASES = {
    "states truncated to half": ShardCase(SHARD_STATES_FILE, truncate),
    "states missing its last byte": ShardCase(SHARD_STATES_FILE, drop_last_byte),
    "states empty": ShardCase(SHARD_STATES_FILE, empty),
    "states garbage bytes": ShardCase(SHARD_STATES_FILE, garbage),
    "states with bytes appended": ShardCase(SHARD_STATES_FILE, append_bytes),
    "states deleted": ShardCase(SHARD_STATES_FILE, delete),
    "states data overwritten in place": ShardCase(SHARD_STATES_FILE, overwrite_middle, reader_checksum=True),
    "manifest torn": ShardCase(SHARD_MANIFEST_FILE, tear),
    "manifest empty": ShardCase(SHARD_MANIFEST_FILE, empty),
    "manifest garbage bytes": ShardCase(SHARD_MANIFEST_FILE, garbage),
    "manifest a JSON list": ShardCase(SHARD_MANIFEST_FILE, edit_json(lambda m: [m])),
    "manifest unknown key": ShardCase(SHARD_MANIFEST_FILE, edit_json(lambda m: m.update(shard_version=2))),
    "manifest key missing": ShardCase(SHARD_MANIFEST_FILE, edit_json(_missing_key)),
    "manifest value of the wrong type": ShardCase(SHARD_MANIFEST_FILE, edit_json(lambda m: m.update(hidden_size="32"))),
    "manifest doubled token_counts": ShardCase(SHARD_MANIFEST_FILE, edit_json(_double_counts)),
    "manifest one sample short": ShardCase(SHARD_MANIFEST_FILE, edit_json(_drop_last_sample)),
    "manifest token counts swapped": ShardCase(SHARD_MANIFEST_FILE, edit_json(_swap_counts)),
}


def spoiled_shards(pristine: Path, tmp_path: Path, case: ShardCase) -> tuple[Path, Path]:
    out = tmp_path / "hs"
    shutil.copytree(pristine, out)  # copy2: the files keep their times, as an untouched shard's
    target = out / shard_name(1) / case.file
    case.spoil(target)
    return out, target


@pytest.mark.parametrize("name", SHARD_CASES)
def test_shard_read_refuses(name, pristine_shards, tmp_path):
    case = SHARD_CASES[name]
    out, target = spoiled_shards(pristine_shards, tmp_path, case)
    kwargs = {"checksum": True} if case.reader_checksum else {}
    assert_refused(lambda: ShardReader(out / shard_name(1), **kwargs), target)
    assert_refused(lambda: open_shards(out, **kwargs), target)
    assert [len(ShardReader(out / shard_name(i))) > 0 for i in (0, 2)] == [True, True]  # the others still read


@pytest.mark.parametrize("name", SHARD_CASES)
def test_shard_resume_rebuilds(name, pristine_shards, pristine_corpus, tmp_path):
    out, _ = spoiled_shards(pristine_shards, tmp_path, SHARD_CASES[name])
    results = extract_all(toy_decoder(), str(pristine_corpus), out, SETTINGS, target_fingerprint=FINGERPRINT)
    assert [r.built for r in results] == [False, True, False]  # shard 1 rebuilt, never counted as done
    assert results[1].reason.startswith("corrupt: ")
    assert tree_digest(out) == tree_digest(pristine_shards)  # exactly the uninterrupted result


# ----------------------------------------------------------------------------- the corpus store


@dataclass(frozen=True)
class CorpusCase:
    file: str
    spoil: Callable[[Path], None]
    lost: frozenset[str] = frozenset()
    """Sample ids that resuming no longer counts as done (the corpus stage generates them again)."""
    rebuilds: bool = True
    """False: nothing can be rebuilt from this file; resuming refuses it (the manifest)."""
    corpus_io: bool = True
    """The hidden-state stage's corpus reader meets the spoiled file too."""


PART1 = "part-00001.parquet"
PART1_IDS = frozenset(f"sample-{i:03d}" for i in range(5, 10))


def _wrong_ids(m: dict) -> None:
    entry = m["shards"][1]
    entry["sample_ids"] = [*entry["sample_ids"][:-1], "sample-999"]


def _extra_id(m: dict) -> None:
    entry = m["shards"][1]
    entry["sample_ids"].append("sample-998")
    entry["num_rows"] += 1


CORPUS_CASES = {
    "shard truncated to half": CorpusCase(PART1, truncate, PART1_IDS),
    "shard missing its last byte": CorpusCase(PART1, drop_last_byte, PART1_IDS),
    "shard empty": CorpusCase(PART1, empty, PART1_IDS),
    "shard garbage bytes": CorpusCase(PART1, garbage, PART1_IDS),
    "shard data overwritten in place": CorpusCase(PART1, overwrite_middle, PART1_IDS),
    "shard deleted": CorpusCase(PART1, delete, PART1_IDS),
    "manifest lists a wrong id": CorpusCase(CORPUS_MANIFEST, edit_json(_wrong_ids), corpus_io=False),
    "manifest lists an id the shard lacks": CorpusCase(CORPUS_MANIFEST, edit_json(_extra_id), corpus_io=False),
    "manifest torn": CorpusCase(CORPUS_MANIFEST, tear, rebuilds=False),
    "manifest empty": CorpusCase(CORPUS_MANIFEST, empty, rebuilds=False),
    "manifest garbage bytes": CorpusCase(CORPUS_MANIFEST, garbage, rebuilds=False),
}
FAILURE_CASES = {
    "failures torn last line": tear,
    "failures garbage line": lambda p: p.write_bytes(p.read_bytes() + b"\xff\xfe not json\n"),
}


def spoiled_corpus(pristine: Path, tmp_path: Path, file: str, spoil: Callable[[Path], None]) -> tuple[Path, Path]:
    folder = tmp_path / "corpus"
    shutil.copytree(pristine, folder)
    spoil(folder / file)
    return folder, folder / file


def stored_rows(folder: Path) -> list[dict]:
    return sorted(CorpusStore(str(folder), mode="r").read_table().to_pylist(), key=lambda r: r["sample_id"])


@pytest.mark.parametrize("name", CORPUS_CASES)
def test_corpus_read_refuses(name, pristine_corpus, tmp_path):
    case = CORPUS_CASES[name]
    folder, target = spoiled_corpus(pristine_corpus, tmp_path, case.file, case.spoil)
    assert_refused(lambda: CorpusStore(str(folder), mode="r"), target)
    if case.corpus_io:
        assert_refused(lambda: list(iter_corpus_rows(str(folder), ["sample_id", "input_ids"])), target)


@pytest.mark.parametrize("name", CORPUS_CASES)
def test_corpus_resume_rebuilds(name, pristine_corpus, tmp_path):
    case = CORPUS_CASES[name]
    folder, target = spoiled_corpus(pristine_corpus, tmp_path, case.file, case.spoil)
    if not case.rebuilds:
        assert_refused(lambda: CorpusStore(str(folder)), target)
        return
    with CorpusStore(str(folder), shard_size=CORPUS_SHARD_SIZE) as store:
        all_ids = {r["sample_id"] for r in ROWS}
        assert store.done_ids() == all_ids - case.lost  # the spoiled shard's samples are not done
        for row in ROWS:  # what the corpus stage does: generate every sample not done
            if row["sample_id"] not in store.done_ids():
                store.append(row)
    assert stored_rows(folder) == sorted(ROWS, key=lambda r: r["sample_id"])  # all, each once
    assert {f["sample_id"] for f in CorpusStore(str(folder), mode="r").failures()} == {"sample-900", "sample-901"}


@pytest.mark.parametrize("name", FAILURE_CASES)
def test_corpus_failures_torn(name, pristine_corpus, tmp_path):
    """failures.jsonl is bookkeeping (a failed sample is not done either way): its bad line is
    skipped, the store opens, and the next write leaves the line out."""
    folder, target = spoiled_corpus(pristine_corpus, tmp_path, CORPUS_FAILURES, FAILURE_CASES[name])
    kept = {f["sample_id"] for f in CorpusStore(str(folder), mode="r").failures()}
    assert kept <= {"sample-900", "sample-901"} and "sample-900" in kept
    with CorpusStore(str(folder), shard_size=CORPUS_SHARD_SIZE) as store:
        assert store.done_ids() == {r["sample_id"] for r in ROWS}
    assert [json.loads(line)["sample_id"] for line in target.read_text().splitlines()] == sorted(kept)


# ----------------------------------------------------------------------------- trainer: checkpoints and metrics

STEPS = 6
COMPARED = ("loss", "step_loss", "acc", "grad_norm", "lr", "tokens_seen", "epoch")


@pytest.fixture(scope="module")
def pristine_run(tmp_path_factory):
    """A finished 6-step run: checkpoints at steps 2, 4 and 6, metrics.jsonl rows 1..6."""
    from eagle_assets.drafter.train import train

    root = tmp_path_factory.mktemp("run")
    cfg = write_tiny_run(root, num_samples=12, max_steps=STEPS, checkpoint_every=2, keep_last=3, val_fraction=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `one_thread`: the resumed runs reduce in the same order
    try:
        train(cfg)
    finally:
        torch.set_num_threads(threads)
    assert [s for s, _ in ckpt.list_checkpoints(cfg.checkpoint_dir)] == [2, 4, 6]
    return cfg


@dataclass(frozen=True)
class RunCase:
    file: str
    """Relative to the run's output folder."""
    spoil: Callable[[Path], None]
    checkpoint: bool = True
    """The spoiled file belongs to the newest checkpoint (step 6)."""
    resumed_from: int = 4


STEP6 = f"checkpoints/{ckpt.checkpoint_name(6)}"


def _kill_after_step_6_row(path: Path) -> None:
    """What a kill between step 6's metrics row and its checkpoint leaves: no step-6 checkpoint,
    and the row itself half written."""
    shutil.rmtree(path.parent / STEP6)
    tear(path)


def _garbage_line_in_the_middle(path: Path) -> None:
    shutil.rmtree(path.parent / STEP6)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + [b"\x00\x01garbage\n"] + lines[2:]))


RUN_CASES = {
    "model weights truncated": RunCase(f"{STEP6}/{ckpt.MODEL_FILE}", truncate),
    "model weights empty": RunCase(f"{STEP6}/{ckpt.MODEL_FILE}", empty),
    "model weights garbage bytes": RunCase(f"{STEP6}/{ckpt.MODEL_FILE}", garbage),
    "model weights overwritten in place": RunCase(f"{STEP6}/{ckpt.MODEL_FILE}", overwrite_middle),
    "optimizer state truncated": RunCase(f"{STEP6}/{ckpt.OPTIMIZER_FILE}", truncate),
    "trainer state torn": RunCase(f"{STEP6}/{ckpt.STATE_FILE}", tear),
    "trainer state empty": RunCase(f"{STEP6}/{ckpt.STATE_FILE}", empty),
    "trainer state garbage bytes": RunCase(f"{STEP6}/{ckpt.STATE_FILE}", garbage),
    "metrics torn last line": RunCase("metrics.jsonl", _kill_after_step_6_row, checkpoint=False),
    "metrics garbage line": RunCase("metrics.jsonl", _garbage_line_in_the_middle, checkpoint=False),
}


def spoiled_run(cfg, tmp_path: Path, case: RunCase):
    out = tmp_path / "out"
    shutil.copytree(cfg.out_dir, out)
    target = out / case.file
    case.spoil(target)
    return cfg.replace(out_dir=str(out)), target


def metric_rows(out_dir) -> list[dict]:
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name", [n for n, c in RUN_CASES.items() if c.checkpoint])
def test_checkpoint_read_refuses(name, pristine_run, tmp_path):
    cfg, target = spoiled_run(pristine_run, tmp_path, RUN_CASES[name])
    assert_refused(lambda: ckpt.load_checkpoint(cfg.checkpoint_dir / ckpt.checkpoint_name(6)), target)
    assert ckpt.latest_checkpoint(cfg.checkpoint_dir) == cfg.checkpoint_dir / ckpt.checkpoint_name(4)


@pytest.mark.parametrize("name", RUN_CASES)
def test_training_resume_rebuilds(name, pristine_run, tmp_path, one_thread):
    from eagle_assets.drafter.train import train

    case = RUN_CASES[name]
    cfg, _ = spoiled_run(pristine_run, tmp_path, case)
    summary = train(cfg)
    assert summary["resumed_from_step"] == case.resumed_from and summary["steps"] == STEPS
    got, ref = metric_rows(cfg.out_dir), metric_rows(pristine_run.out_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # every row once, the bad line gone
    assert [{k: r[k] for k in COMPARED} for r in got] == [{k: r[k] for k in COMPARED} for r in ref]
    for file in (ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE):  # step 6 again, bit for bit
        a = load_file(str(pristine_run.checkpoint_dir / ckpt.checkpoint_name(6) / file))
        b = load_file(str(cfg.checkpoint_dir / ckpt.checkpoint_name(6) / file))
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), file
