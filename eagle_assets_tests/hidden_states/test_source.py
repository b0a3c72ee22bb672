"""Where the states come from, and that choosing it runs no remote code it does not need."""

from __future__ import annotations

import json

from eagle_assets.defs.hidden_states import HiddenStatesConfig, hidden_states_source
from eagle_assets.hidden_states.source import choose_source
from eagle_assets.targets import get_preset, preset_from_hf_config

# A configuration module that leaves a file behind when it runs (transformers runs it from its
# modules cache, so the file's place is written into it), as remote code the pipeline's process
# must not run where the states come from the engine.
REMOTE_CONFIG = """
from pathlib import Path
from transformers import PretrainedConfig
Path(MARKER).write_text("the remote configuration code ran")


class StandinConfig(PretrainedConfig):
    model_type = "standin_remote"
"""


def _remote_target(tmp_path):
    folder = tmp_path / "remote-target"
    folder.mkdir()
    config = {
        "model_type": "standin_remote",
        "auto_map": {"AutoConfig": "configuration_standin.StandinConfig"},
        "architectures": ["StandinForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "vocab_size": 64,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_standin.py").write_text(REMOTE_CONFIG.replace("MARKER", repr(str(folder / "RAN"))))
    return folder, preset_from_hf_config(folder.name, config)


def test_states_from_the_engine_run_none_of_the_targets_remote_configuration_code(tmp_path):
    folder, preset = _remote_target(tmp_path)
    ran = folder / "RAN"
    assert hidden_states_source(HiddenStatesConfig(source="engine"), preset, folder) == "engine"
    kimi = get_preset("kimi-k2.5")  # tensor parallel: the engine, whatever transformers would say
    assert hidden_states_source(HiddenStatesConfig(), kimi, folder) == "engine"
    assert not ran.exists()
    # Only where the choice turns on it is transformers asked (and then the code does run: the
    # marker works).
    from dataclasses import replace

    trusting = replace(preset, trust_remote_code=True)
    hidden_states_source(HiddenStatesConfig(), trusting, folder)
    assert ran.is_file()


def test_choose_source_calls_the_question_only_when_it_decides():
    asked = []

    def loadable() -> bool:
        asked.append(True)
        return False

    assert choose_source("hf", get_preset("smollm2-135m-instruct"), loadable) == "hf"
    assert choose_source("auto", get_preset("kimi-k2.5"), loadable) == "engine"
    assert not asked
    assert choose_source("auto", get_preset("smollm2-135m-instruct"), loadable) == "engine" and asked == [True]
