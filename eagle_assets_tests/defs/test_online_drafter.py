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


def test_the_code_locations_settings_decide_where_the_drafter_trains(tmp_path, monkeypatch, smollm2_path):
    """hidden_state_shards asks what drafter_checkpoint will decide once the corpus is there: the
    default preset's four epochs train from shards (they fit: a few hundred tokens), one epoch
    online from the target, and an explicit server from the server. Online, the shards asset
    extracts nothing and says why."""
    import dagster as dg

    from eagle_assets.defs.hidden_state_settings import HiddenStatesConfig, drafter_training_source
    from eagle_assets.defs.hidden_states import hidden_state_shards
    from eagle_assets.defs.resources import default_resources
    from eagle_assets.defs.settings import location_settings
    from eagle_assets.targets import EMBEDDED_TARGET
    from eagle_assets.targets.embedded import resolve_target

    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path / "data"))
    resources = default_resources()
    _smollm2_corpus(resources["storage"], smollm2_path, "auto")
    preset, path = resolve_target(EMBEDDED_TARGET, log=lambda m: None)
    run_file = tmp_path / "run.yaml"
    monkeypatch.setenv("EAGLE_ASSETS_RUN_FILE", str(run_file))

    def source(text: str) -> str:
        run_file.write_text(text)
        location_settings.cache_clear()
        return drafter_training_source(preset, path, resources["storage"], HiddenStatesConfig())

    try:
        assert source("preset: smollm2-default\n") == "shards"
        assert source("preset: smollm2-default\ndrafter_checkpoint: {hidden_states: server}\n") == "server"
        assert source("preset: smollm2-default\ndrafter_checkpoint: {epochs: 1}\n") == "target"
        result = dg.materialize([hidden_state_shards], resources=resources)
        metadata = result.asset_materializations_for_node("hidden_state_shards")[0].metadata
        assert metadata["built"].value is False and "trains online, its states from the target" in metadata["reason"].value
        assert not (tmp_path / "data" / EMBEDDED_TARGET / "hidden_states").exists()
    finally:
        location_settings.cache_clear()


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
        "warm_start": None,  # a drafter of its own shape, not the code location's warm start
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
