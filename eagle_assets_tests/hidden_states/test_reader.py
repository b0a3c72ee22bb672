"""Reading shards: per-sample slices, incomplete shards ignored, mixed extractions refused, and the
checks a shard passes before it is trusted (size and SHA-256 recorded at commit)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

import pytest
import torch

from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name
from eagle_assets.hidden_states.extract import extract_all
from eagle_assets.hidden_states.reader import ShardReader, open_shards, read_manifest, shard_problem, verify_shards

from .extract_child import SETTINGS, toy_decoder


@pytest.fixture(scope="module")
def shards_dir(tmp_path_factory, corpus_dir, fingerprint):
    out = tmp_path_factory.mktemp("hs")
    extract_all(toy_decoder(), str(corpus_dir), out, SETTINGS, target_fingerprint=fingerprint)
    return out


def test_samples_come_back_by_index_and_id(shards_dir, chat_rows):
    by_id = {r["sample_id"]: r for r in chat_rows}
    for shard in open_shards(shards_dir):
        assert len(shard) == len(shard.sample_ids) > 0
        for i, sid in enumerate(shard.sample_ids):
            s = shard[i]
            T = by_id[sid]["num_tokens"]
            assert s["aux"].shape == (T, 3 * 32) and s["aux"].dtype == torch.bfloat16
            assert s["final"].shape == (T, 32) and s["final"].dtype == torch.bfloat16
            assert (s["input_ids"].dtype, s["loss_mask"].dtype) == (torch.int32, torch.uint8)
            assert s["input_ids"].tolist() == by_id[sid]["input_ids"]
            assert shard.index_of(sid) == i
        assert torch.equal(shard[-1]["final"], shard[len(shard) - 1]["final"])
        with pytest.raises(IndexError):
            shard[len(shard)]
        # A reader crosses process boundaries (DataLoader workers) and reopens its file there.
        clone = pickle.loads(pickle.dumps(shard))
        assert torch.equal(clone[0]["aux"], shard[0]["aux"])


def test_incomplete_shards_are_ignored_and_mixed_ones_refused(shards_dir, tmp_path):
    root = tmp_path / "hs"
    shutil.copytree(shards_dir, root)
    (root / shard_name(1) / SHARD_MANIFEST_FILE).unlink()
    assert [s.manifest.shard for s in open_shards(root)] == [0, 2]
    with pytest.raises(FileNotFoundError, match="not a complete hidden-state shard"):
        ShardReader(root / shard_name(1))
    m = root / shard_name(2) / SHARD_MANIFEST_FILE
    m.write_text(m.read_text().replace('"aux_layer_ids": [\n    0,', '"aux_layer_ids": [\n    3,'))
    with pytest.raises(ValueError, match="different extractions"):
        open_shards(root)


def test_each_manifest_records_its_file_and_every_check_passes(shards_dir):
    for shard in sorted(shards_dir.glob("shard-*")):
        m = read_manifest(shard)
        states = shard / SHARD_STATES_FILE
        assert m.states_bytes == states.stat().st_size
        assert m.states_sha256 == hashlib.sha256(states.read_bytes()).hexdigest()
        assert shard_problem(shard, checksum=True) is None
    assert verify_shards(shards_dir) == {}


def test_manifests_from_before_sizes_and_checksums_were_recorded_still_read(shards_dir, tmp_path):
    root = tmp_path / "hs"
    shutil.copytree(shards_dir, root)
    path = root / shard_name(0) / SHARD_MANIFEST_FILE
    old = json.loads(path.read_text())
    del old["states_bytes"], old["states_sha256"]
    path.write_text(json.dumps(old))
    assert shard_problem(root / shard_name(0), checksum=True) is None
    assert [len(s) for s in open_shards(root)] == [len(s) for s in open_shards(shards_dir)]


def test_the_checksum_is_compared_when_the_file_changed_after_its_manifest(shards_dir, tmp_path):
    root = tmp_path / "hs"
    shutil.copytree(shards_dir, root)  # copy2 keeps the times: the states older than the manifest
    shard = root / shard_name(0)
    states = shard / SHARD_STATES_FILE
    later = (shard / SHARD_MANIFEST_FILE).stat().st_mtime_ns + 10**9
    os.utime(states, ns=(later, later))  # newer, same bytes: hashed, and found intact
    assert shard_problem(shard) is None
    with open(states, "r+b") as f:  # one byte of the states changed in place
        f.seek(states.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    assert "its SHA-256 is" in shard_problem(shard)
    assert shard_problem(shard, checksum=False) is None  # structure intact: only the checksum tells
    assert list(verify_shards(root)) == [shard]
    with pytest.raises(ValueError, match=rf"{states}: its SHA-256 .* rebuild the shard"):
        ShardReader(shard, checksum=True)
