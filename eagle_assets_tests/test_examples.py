"""The run files in examples/: each passes the check `eagle-assets run --config` applies before
anything starts (defs/run_file.py), and its settings fit each asset's Config on top of its run
preset's, as the code location takes them when it loads (defs/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_assets.defs.benchmark import BenchmarkConfig
from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
from eagle_assets.defs.drafter import DrafterAssetConfig
from eagle_assets.defs.hidden_states import HiddenStatesConfig, VocabConfig
from eagle_assets.defs.run_file import read_run_file
from eagle_assets.defs.settings import LocationSettings, with_defaults
from eagle_assets.run_presets import default_preset
from eagle_assets.targets import PRESETS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONFIGS = {
    "prompts": PromptsConfig,
    "synthetic_corpus": CorpusConfig,
    "vocab_mapping": VocabConfig,
    "hidden_state_shards": HiddenStatesConfig,
    "drafter_checkpoint": DrafterAssetConfig,
    "benchmark_report": BenchmarkConfig,
}
FAMILIES = {
    "smollm2-135m-instruct.yaml": "smollm2-135m-instruct",
    "llama-3.1-8b-instruct.yaml": "llama-3.1-8b-instruct",
    "qwen3-8b-reasoning.yaml": None,  # no preset: a folder read from its config.json
    "deepseek-v3.yaml": "deepseek-v3",
    "kimi-k2.5.yaml": "kimi-k2.5",
    "standin-kimi-k2.5.yaml": "tiny-kimi-k2.5",
    "standin-deepseek-v3.yaml": "tiny-deepseek-v3",
}


def test_every_family_has_its_run_file_and_the_index_lists_each():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(FAMILIES)
    index = (EXAMPLES / "README.md").read_text()
    assert all(f"]({name})" in index for name in FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_run_file_passes_the_check_run_applies(name):
    run = read_run_file(EXAMPLES / name)
    preset = FAMILIES[name]
    if preset is None:
        assert run.target.startswith("/") and Path(run.target).name not in PRESETS
    else:
        assert run.target == preset
    assert run.preset == default_preset(run.target), "each file names the preset `run --target` would pick"
    settings = LocationSettings(run.preset, run.asset_settings(), run.target, str(EXAMPLES / name))
    for asset, config in CONFIGS.items():
        made = with_defaults(config, asset, settings)  # the defaults must fit the Config's types and checks
        for key, value in run.asset_settings().get(asset, {}).items():
            assert made.model_fields[key].default == value, (asset, key)


def test_a_misspelt_setting_in_a_copy_is_refused_naming_it(tmp_path):
    text = (EXAMPLES / "llama-3.1-8b-instruct.yaml").read_text().replace("tracker_project:", "tracker_projet:")
    (tmp_path / "run.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"drafter_checkpoint\.tracker_projet: no such setting; known: .*tracker_project"):
        read_run_file(tmp_path / "run.yaml")
