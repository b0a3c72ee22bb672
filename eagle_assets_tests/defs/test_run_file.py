"""One run's settings in one checked file (`eagle-assets run --config`), the target given by
`--target`, and the drafter's defaults held in one place."""

import pytest
from typer.testing import CliRunner

from eagle_assets.cli import app
from eagle_assets.defs.drafter import PASSED_TO_TRAINER, DrafterAssetConfig
from eagle_assets.defs.run_file import ASSET_SECTIONS, check_run_file, read_run_file
from eagle_assets.drafter.run_config import TrainConfig, defaults
from eagle_assets.run_presets import RUN_PRESETS, default_preset, run_config
from eagle_assets.targets import EMBEDDED_TARGET


@pytest.fixture
def private_instance(tmp_path, monkeypatch):
    """DAGSTER_HOME and the data folder in tmp_path: a refused run must leave both empty."""
    home, data = tmp_path / "home", tmp_path / "data"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(data))
    return home, data


def _run(*args):
    return CliRunner().invoke(app, ["run", *args])


def test_a_misspelt_setting_in_a_run_file_is_refused_before_any_run_naming_it_and_the_known_ones(tmp_path, private_instance):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("preset: smollm2-tiny\ndrafter_checkpoint:\n  epoch: 3\nprompt:\n  num_prompts: 8\n")
    result = _run("--config", str(run_file))
    assert result.exit_code == 1, result.output
    assert f"{run_file}: drafter_checkpoint.epoch: no such setting; known: ttt_steps" in result.output
    assert "epochs, max_steps, lr" in result.output  # the key meant is among those listed
    assert "prompt: no such setting; known: target, preset, prompts, synthetic_corpus" in result.output
    home, data = private_instance
    assert not data.exists() and not (home / "storage").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("drafter_checkpoint:\n  epochs: many\n", "drafter_checkpoint.epochs: Input should be a valid integer"),
        ("preset: smollm2-fast\n", "unknown run preset 'smollm2-fast'; known: smollm2-default"),
        ("- epochs: 3\n", "holds a YAML list, not a mapping of settings"),
        ("drafter_checkpoint: [epochs\n", "is not YAML"),
    ],
)
def test_a_bad_run_file_is_refused_with_what_is_wrong(tmp_path, private_instance, text, message):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(text)
    result = _run("--config", str(run_file))
    assert result.exit_code == 1 and message in result.output, result.output


def test_a_missing_run_file_or_unknown_target_is_refused_before_any_run(tmp_path, private_instance):
    result = _run("--config", str(tmp_path / "nowhere.yaml"))
    assert result.exit_code == 1 and f"no run file {tmp_path / 'nowhere.yaml'}" in result.output, result.output
    result = _run("--target", str(tmp_path / "no-model"))
    assert result.exit_code == 1, result.output
    assert "not a target preset" in result.output and "a model folder with config.json or a pulled hub id ORG/NAME" in result.output
    assert "eagle-assets target pull" in result.output
    home, data = private_instance
    assert not data.exists() and not (home / "storage").exists()


def test_a_run_file_changes_only_the_settings_it_names(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("target: tiny-kimi-k2.5\npreset: standin-default\ndrafter_checkpoint: {lr: 0.001}\nbenchmark_report: {num_prompts: 4}\n")
    run = read_run_file(run_file)
    assert run.target == "tiny-kimi-k2.5" and run.preset == "standin-default"
    assert run.asset_settings() == {"drafter_checkpoint": {"lr": 0.001}, "benchmark_report": {"num_prompts": 4}}
    ops = run_config(run.preset, changes=run.asset_settings())["ops"]
    assert ops["drafter_checkpoint"]["config"] == {**RUN_PRESETS["standin-default"].drafter_checkpoint, "lr": 0.001}
    assert ops["benchmark_report"]["config"]["num_prompts"] == 4
    assert ops["prompts"]["config"] == RUN_PRESETS["standin-default"].prompts


@pytest.mark.parametrize("preset", sorted(RUN_PRESETS))
def test_every_run_preset_is_a_valid_run_file(preset):
    """The presets pass the same strict check as a user's file: a misspelt key in one fails here."""
    run = check_run_file({"preset": preset, **RUN_PRESETS[preset].sections()}, f"preset {preset}")
    assert run.asset_settings() == RUN_PRESETS[preset].sections()
    assert set(RUN_PRESETS[preset].sections()) <= set(ASSET_SECTIONS)


def test_the_drafters_defaults_are_the_trainers():
    trainer = defaults(TrainConfig)
    for name in PASSED_TO_TRAINER:
        assert DrafterAssetConfig.model_fields[name].default == trainer[name], name
    assert {"epochs", "lr", "warmup_steps", "micro_batch_tokens", "val_fraction", "val_interval", "checkpoint_every"} <= set(PASSED_TO_TRAINER)


def test_the_default_preset_follows_the_target():
    assert default_preset(EMBEDDED_TARGET) == "smollm2-default"
    assert default_preset("tiny-kimi-k2.5") == "standin-default"
    assert default_preset("/models/Llama-3.1-8B-Instruct") == "gpu-default"


def test_a_run_file_becomes_the_code_locations_settings_and_its_target(tmp_path, monkeypatch):
    """`--config`, `--preset` and `--target` reach every run of a session as the code location's
    settings (the assets' Config defaults), through the session's environment."""
    from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
    from eagle_assets.defs.settings import read_location_settings, session_environment, with_defaults

    run = tmp_path / "run.yaml"
    run.write_text("target: tiny-kimi-k2.5\npreset: standin-tiny\nsynthetic_corpus: {max_tokens: 48}\n")
    for name, value in session_environment("smollm2-tiny", str(run), None).items():
        monkeypatch.setenv(name, value)
    settings = read_location_settings()
    assert (settings.preset, settings.target) == ("standin-tiny", "tiny-kimi-k2.5")  # the file's preset over the variable's
    corpus = with_defaults(CorpusConfig, "synthetic_corpus", settings)()
    assert corpus.max_tokens == 48 and corpus.concurrency == run_config("standin-tiny")["ops"]["synthetic_corpus"]["config"]["concurrency"]
    assert with_defaults(PromptsConfig, "prompts", settings)().source == "sharegpt"
