"""benchmarks/quality_drafter.py runs without Dagster: its copy of the asset defaults must stay true."""

import importlib.util
from pathlib import Path

import pytest

from eagle_assets.defs.benchmark import BenchmarkConfig
from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
from eagle_assets.defs.drafter import DrafterConfig

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "quality_drafter.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("quality_drafter", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "asset, config",
    [("prompts", PromptsConfig), ("synthetic_corpus", CorpusConfig), ("drafter_checkpoint", DrafterConfig), ("benchmark_report", BenchmarkConfig)],
)
def test_script_defaults_are_the_asset_config_defaults(script, asset, config):
    fields = config.model_fields
    for name, value in script.ASSET_DEFAULTS[asset].items():
        assert name in fields, f"{asset}.{name} is not a field of {config.__name__}"
        assert fields[name].default == value, f"{asset}.{name}: script has {value!r}, {config.__name__} {fields[name].default!r}"


def test_script_needs_no_dagster():
    code = [line for line in SCRIPT.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
    assert not [line for line in code if "dagster" in line or "eagle_assets.defs" in line or "eagle_assets.resources" in line]
