"""A warm start from a parent whose config does not say how it counts its layer ids.

The stand-in parent is the SmolLM2 drafter shipped with the project (trained at layers 2, 15,
27) with its config rewritten as older SGLang and SpecForge wrote it: ids one lower ([1, 14,
26]) and no numbering marker, as AQ-MedAI's Kimi-K2.5 drafter is published. Read as written
(vLLM's numbering) it drafts from layers one off; the trainer measures its held-out acceptance
at both readings on the real target's states (SmolLM2 through Hugging Face, at the layers of
both) and must take the numbering it was trained at.
"""

from __future__ import annotations

import json
import shutil

import pytest

from eagle_assets.drafter.warm_start import parent_layer_ids, parent_readings
from eagle_assets.formats import NUMBERING_KEY
from eagle_assets.run_presets import SMOLLM2_PARENT_DRAFTER

UNION = (1, 2, 14, 15, 26, 27)


@pytest.fixture(scope="module")
def sglang_parent(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parent") / "sglang-numbered"
    shutil.copytree(SMOLLM2_PARENT_DRAFTER, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config.pop(NUMBERING_KEY) == "vllm" and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 14, 26]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def union_shards(smollm2_path, corpus_dir, smol_tokenizer, tmp_path_factory):
    """SmolLM2's states of the test corpus at both readings' layers, as hidden_state_shards keeps
    them for a warm start from an unmarked parent."""
    import torch

    from eagle_assets.hidden_states.extract import ExtractSettings, extract_all, load_target

    out = tmp_path_factory.mktemp("union-shards")
    model, _ = load_target(smollm2_path, dtype=torch.float32)
    extract_all(model, str(corpus_dir), out, ExtractSettings(aux_layer_ids=UNION, num_shards=1, progress=False), tokenizer=smol_tokenizer)
    return out


def test_an_unmarked_parent_is_read_both_ways_and_kept_at_both_readings_layers(sglang_parent):
    assert parent_readings(sglang_parent, 30) == {"vllm": (1, 14, 26), "sglang": (2, 15, 27)}
    assert parent_layer_ids(sglang_parent, 30) == UNION
    assert parent_layer_ids(sglang_parent, 30, "sglang") == (2, 15, 27)
    assert parent_readings(SMOLLM2_PARENT_DRAFTER, 30) == {"vllm": (2, 15, 27)}  # marked: one reading
    assert parent_layer_ids(SMOLLM2_PARENT_DRAFTER, 30) == (2, 15, 27)


def test_the_trainer_measures_both_readings_and_takes_the_one_the_parent_was_trained_at(
    sglang_parent, union_shards, smollm2_path, tmp_path, one_thread
):
    from eagle_assets.drafter.export import drafter_folder_config
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.train import PARENT_NUMBERING_FILE, train
    from eagle_assets.hidden_states.vocab import load_parent_mapping, save_vocab_mapping

    mapping = save_vocab_mapping(load_parent_mapping(sglang_parent, vocab_size=49152), tmp_path / "vocab.safetensors")
    cfg = TrainConfig(
        shard_dirs=(str(union_shards),),
        vocab_mapping=str(mapping),
        target=str(smollm2_path),
        out_dir=str(tmp_path / "out"),
        warm_start=str(sglang_parent),
        ttt_steps=3,
        max_steps=1,
        lr=1e-9,
        warmup_steps=1,
        val_fraction=0.75,
        min_finetune_samples=1,  # the test corpus is small: fine-tune all the same, gated on the held-out samples
        micro_batch_tokens=8192,
        export_engines=("vllm",),
    )
    summary = train(cfg)
    chosen = summary["parent_numbering"]
    print(f"parent's held-out AL by reading: {chosen['val_al']}")
    assert chosen["reading"] == "sglang" and chosen["how"] == "measured on the held-out samples"
    assert chosen["val_al"]["sglang"] > chosen["val_al"]["vllm"] + 0.05
    assert chosen["aux_layer_ids"] == [2, 15, 27] and summary["aux_layer_ids"] == [2, 15, 27]
    assert json.loads((tmp_path / "out" / PARENT_NUMBERING_FILE).read_text()) == chosen
    # The parent measured at the chosen reading is the no-regression gate's parent.
    assert summary["parent_val_al"] == pytest.approx(chosen["val_al"]["sglang"], abs=1e-3)
    # The child's export is in our numbering, marked: no guessing next time.
    exported = drafter_folder_config(summary["exports"]["vllm"])
    assert exported.aux_layer_ids == (2, 15, 27)
    assert json.loads((tmp_path / "out" / "drafter-vllm" / "config.json").read_text())[NUMBERING_KEY] == "vllm"

    # A numbering given is taken as it is, unmeasured.
    given = train(cfg.replace(out_dir=str(tmp_path / "given"), parent_numbering="vllm", export_engines=()))
    assert given["parent_numbering"]["reading"] == "vllm" and given["aux_layer_ids"] == [1, 14, 26] and "val_al" not in given["parent_numbering"]
