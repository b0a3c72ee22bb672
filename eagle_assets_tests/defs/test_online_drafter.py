"""The drafter asset trained online (hidden_states: target): a real Dagster materialisation on
SmolLM2, the trainer launched under torchrun through Pipes, with no hidden-state shard anywhere;
its materialisation says which source trained it. And the choice of source ("auto")."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from eagle_assets.hidden_states.source import SHARDS_PAY_FROM_EPOCHS, choose_training_source


def test_auto_trains_from_shards_where_they_pay_and_fit_and_online_elsewhere():
    assert SHARDS_PAY_FROM_EPOCHS == 2
    assert choose_training_source("auto", epochs=4, extraction="hf") == "shards"
    assert choose_training_source("auto", epochs=1, extraction="hf") == "target"
    assert choose_training_source("auto", epochs=1, extraction="engine") == "server"
    assert choose_training_source("auto", epochs=8, extraction="engine", shards_fit=False) == "server"
    assert choose_training_source("server", epochs=8, extraction="hf") == "server"
    with pytest.raises(ValueError, match="hidden_states='disk': give one of auto, shards, target, server"):
        choose_training_source("disk", epochs=1, extraction="hf")


def _smollm2_corpus(storage, smollm2_path, tag: str):
    from transformers import AutoTokenizer

    from eagle_assets.corpus.target import target_fingerprint
    from eagle_assets.formats import stable_id
    from eagle_assets.targets import EMBEDDED_TARGET
    from eagle_assets_tests.hidden_states.conftest import conversations, corpus_row, tokenise, write_corpus

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    rows = []
    for msgs in conversations():
        ids, mask = tokenise(tokenizer, msgs)
        rows.append(corpus_row(stable_id(msgs, tag), msgs, ids, mask, target_fingerprint(smollm2_path)))
    return write_corpus(storage.corpus(EMBEDDED_TARGET), rows)


def test_a_run_resolves_auto_from_its_epochs_once_the_corpus_is_there(tmp_path, monkeypatch, smollm2_path):
    """What `eagle-assets run` decides before the hidden-state stage: the default preset's four
    epochs train from shards (they fit: a few hundred tokens), one epoch online from the target."""
    import dagster as dg

    from eagle_assets.defs.resources import default_resources
    from eagle_assets.defs.runner import drafter_source, stale_run_source
    from eagle_assets.run_presets import run_config

    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path / "data"))
    resources = default_resources()
    _smollm2_corpus(resources["storage"], smollm2_path, "auto")
    quiet = lambda m: None  # noqa: E731
    assert drafter_source(resources, run_config("smollm2-default"), quiet) == "shards"
    one_epoch = run_config("smollm2-default", changes={"drafter_checkpoint": {"epochs": 1}})
    assert drafter_source(resources, one_epoch, quiet) == "target"
    server = run_config("smollm2-default", changes={"drafter_checkpoint": {"hidden_states": "server"}})
    assert drafter_source(resources, server, quiet) == "server"
    with dg.DagsterInstance.ephemeral() as instance:  # no corpus materialised yet: "auto" cannot be known
        assert stale_run_source(resources, one_epoch["ops"], instance, quiet) is None
        assert stale_run_source(resources, server["ops"], instance, quiet) == "server"


@pytest.mark.slow
def test_the_drafter_asset_trains_from_the_target_without_shards(tmp_path, monkeypatch, smollm2_path):
    from eagle_assets.defs.drafter import drafter_checkpoint
    from eagle_assets.defs.resources import default_resources
    from eagle_assets.hidden_states.vocab import build_vocab_mapping, count_assistant_tokens, save_vocab_mapping
    from eagle_assets.targets import EMBEDDED_TARGET

    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    resources = default_resources()
    storage = resources["storage"]
    corpus = _smollm2_corpus(storage, smollm2_path, "online-asset")
    save_vocab_mapping(build_vocab_mapping(count_assistant_tokens(str(corpus), 49152), 49152, 512), storage.vocab_mapping(EMBEDDED_TARGET))

    settings = {
        "hidden_states": "target",
        "epochs": 1,
        "micro_batch_tokens": 256,
        "drafter_intermediate_size": 128,
        "ttt_steps": 2,
        "warmup_steps": 1,
        "val_fraction": 0.25,
    }
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            [drafter_checkpoint], resources=resources, instance=instance, run_config={"ops": {"drafter_checkpoint": {"config": settings}}}
        )
    assert result.success
    meta = result.asset_materializations_for_node("drafter_checkpoint")[0].metadata
    assert meta["hidden_states"].value == "target"
    assert "online from target" in meta["hidden_states_origin"].value
    assert not storage.hidden_states(EMBEDDED_TARGET).exists()  # no shard was written, none was read
    out = storage.drafter(EMBEDDED_TARGET)
    assert json.loads((out / "summary.json").read_text())["hidden_states"] == "target"
    assert json.loads((out / "run.json").read_text())["hidden_states"] == "target"
    assert (out / "drafter-vllm" / "model.safetensors").is_file()
