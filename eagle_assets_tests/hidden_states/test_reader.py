"""Reading shards: per-sample slices, incomplete shards ignored, mixed extractions refused."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch

from eagle_assets.formats import SHARD_MANIFEST_FILE, shard_name
from eagle_assets.hidden_states.extract import extract_all
from eagle_assets.hidden_states.reader import ShardReader, open_shards

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
