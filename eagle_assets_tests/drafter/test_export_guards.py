"""The export's and the loader's refusals: each guards a drafter that would load and draft
wrongly without an error, so each refuses loudly and leaves an earlier export as it was."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from safetensors.torch import save_file

from eagle_assets.drafter import export
from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.export import export_vllm, load_drafter
from eagle_assets_tests.drafter.test_export import mapped_drafter, tensors_of
from eagle_assets_tests.drafter.test_model import random_drafter

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def test_a_full_vocabulary_drafter_with_a_permuted_d2t_is_refused(tmp_path):
    # vLLM ignores d2t when the draft vocabulary is the whole one: a permutation would read the
    # lm_head's rows in the wrong order.
    cfg = tiny_config(draft_vocab_size=256)
    model = random_drafter(cfg)
    permuted = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    t2d = torch.ones(256, dtype=torch.bool)
    model.set_vocab_mapping(permuted - torch.arange(256), t2d)
    with pytest.raises(ValueError, match="non-identity d2t"):
        export_vllm(model, cfg, tmp_path / "full")
    assert list(tmp_path.iterdir()) == []


def test_the_loader_refuses_a_numbering_other_than_the_callers(tmp_path):
    cfg = tiny_config()
    folder = export_vllm(mapped_drafter(cfg), cfg, tmp_path / "drafter-vllm")
    with pytest.raises(ValueError, match=r"says its ids are 'vllm'-numbered, caller says 'sglang'"):
        load_drafter(folder, layer_id_numbering="sglang")


def test_the_loader_names_a_tensor_whose_shape_the_config_does_not_imply(tmp_path):
    cfg = tiny_config()
    folder = export_vllm(mapped_drafter(cfg), cfg, tmp_path / "drafter-vllm")
    tensors = tensors_of(folder)
    save_file({**tensors, "lm_head.weight": tensors["lm_head.weight"][:, :32].contiguous()}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lm_head.weight has shape \(64, 32\), config.json implies \(64, 64\)"):
        load_drafter(folder)


def test_a_missing_t2d_is_rebuilt_from_d2t_exactly(tmp_path):
    cfg = tiny_config()
    model = mapped_drafter(cfg)
    folder = export_vllm(model, cfg, tmp_path / "drafter-vllm")
    tensors = tensors_of(folder)
    del tensors["t2d"]
    save_file(tensors, str(folder / "model.safetensors"))
    loaded, _ = load_drafter(folder)
    assert torch.equal(loaded.t2d, model.t2d) and int(loaded.t2d.sum()) == cfg.draft_vocab_size


def test_a_write_that_fails_leaves_the_earlier_export_byte_for_byte_and_no_staging(tmp_path):
    cfg = tiny_config()
    folder = export_vllm(mapped_drafter(cfg), cfg, tmp_path / "drafter-vllm")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    # The write is stood in for: a full disk cannot be made for real in a test. It fails after the
    # staging folder exists, where a real full disk would.
    def fail_after_staging(*args, **kwargs):
        raise OSError("No space left on device")

    with mock.patch.object(export, "save_file", side_effect=fail_after_staging), pytest.raises(OSError, match="No space"):
        export_vllm(random_drafter(cfg, seed=9), cfg, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter-vllm"]
    assert json.loads((folder / "config.json").read_text())["layer_id_numbering"] == "vllm"
