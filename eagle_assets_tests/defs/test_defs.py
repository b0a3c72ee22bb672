"""The project's Definitions load, with the asset keys, checks, versions and jobs the UI shows.

The first tests load the Definitions the way `workspace.yaml` does; the slow ones read the graph
that the shared `materialized_graph` fixture built for real.
"""

from __future__ import annotations

import importlib
import re

import dagster as dg
import pytest

from eagle_assets.defs.graph import build_definitions
from eagle_assets.defs.resources import default_resources
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets.run_presets import RUN_PRESETS

EXPECTED_CHECKS = {
    "prompts": set(),
    "synthetic_corpus": {"error_rate", "reasoning_captured", "unique_ids", "token_round_trip"},
    "vocab_mapping": {"consistent"},
    "hidden_state_shards": {"matches_corpus"},
    "benchmark_reference": set(),
    "drafter_checkpoint": {"serves_in_vllm", "samples_under_speculation", "sglang_names", "not_worse_than_parent"},
    "benchmark_report": {"speedup", "parity", "parent_al", "greedy_output"},
}
EXPECTED_DEPS = {
    "prompts": set(),
    "synthetic_corpus": {"prompts"},
    "vocab_mapping": {"synthetic_corpus"},
    "hidden_state_shards": {"synthetic_corpus"},
    "benchmark_reference": {"hidden_state_shards"},  # after it in a run: its extraction server, still warm
    "drafter_checkpoint": {"vocab_mapping", "hidden_state_shards", "synthetic_corpus"},  # the corpus: read when it trains online
    "benchmark_report": {"drafter_checkpoint", "benchmark_reference"},
}


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    # The module workspace.yaml names, loaded as the code server loads it.
    return importlib.import_module("eagle_assets.definitions").defs


RESOURCE_VARIABLES = {
    "inference_server": {"EAGLE_ASSETS_TARGET", "EAGLE_ASSETS_SERVER_URL", "EAGLE_ASSETS_SPECULATIVE_URL", "EAGLE_ASSETS_EXTRACTION_URL"},
    "storage": {"EAGLE_ASSETS_DATA"},
}


def test_resource_fields_from_the_environment_are_env_vars_read_when_a_run_starts(monkeypatch, tmp_path):
    names = set().union(*RESOURCE_VARIABLES.values(), {"EAGLE_ASSETS_NPROC_PER_NODE"})
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert build_definitions(automation=False).get_repository_def().get_env_vars_by_top_level_resource() == {}
    monkeypatch.setenv("EAGLE_ASSETS_TARGET", "smollm2-135m-instruct")
    monkeypatch.setenv("EAGLE_ASSETS_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("EAGLE_ASSETS_SPECULATIVE_URL", "http://127.0.0.1:10")
    monkeypatch.setenv("EAGLE_ASSETS_EXTRACTION_URL", " http://127.0.0.1:11 ")  # blanks: bound as the checked text
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path.resolve()))
    monkeypatch.setenv("EAGLE_ASSETS_NPROC_PER_NODE", "2")
    repo = build_definitions(automation=False).get_repository_def()
    # The UI's list of the variables the resources use: each one set, but the one with blanks.
    assert repo.get_env_vars_by_top_level_resource() == {
        name: {resource} for resource, variables in RESOURCE_VARIABLES.items() for name in variables if name != "EAGLE_ASSETS_EXTRACTION_URL"
    }
    assert default_resources()["inference_server"].url == "http://127.0.0.1:9"  # values, for code that reads them here

    resources = default_resources(deferred=True)
    monkeypatch.setenv("EAGLE_ASSETS_SERVER_URL", "http://127.0.0.1:8")  # after the definitions loaded

    @dg.asset
    def seen(inference_server: InferenceServerResource, storage: StorageResource, trainer: TrainerResource):
        s = inference_server
        return s.target, s.url, s.speculative_url, s.extraction_url, storage.root, trainer.nproc_per_node

    result = dg.materialize([seen], resources=resources)
    assert result.output_for_node("seen") == (
        "smollm2-135m-instruct",
        "http://127.0.0.1:8",
        "http://127.0.0.1:10",
        "http://127.0.0.1:11",
        str(tmp_path.resolve()),
        2,
    )

    monkeypatch.setenv("EAGLE_ASSETS_SERVER_URL", "localhost:8000")  # the check still runs as the definitions load
    with pytest.raises(ValueError, match="EAGLE_ASSETS_SERVER_URL='localhost:8000' is not an http:// or https:// URL"):
        build_definitions(automation=False)


def test_asset_keys_lineage_and_checks_per_asset(defs):
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == set(EXPECTED_CHECKS)
    for key in graph.get_all_asset_keys():
        name = key.to_user_string()
        assert {p.to_user_string() for p in graph.get(key).parent_keys} == EXPECTED_DEPS[name], name
        assert {c.name for c in graph.get(key).check_keys} == EXPECTED_CHECKS[name], name
        assert graph.get(key).group_name == "eagle3"
    from eagle_assets.defs.runner import DEPENDS, GRAPH

    assert {a: set(deps) for a, deps in DEPENDS.items()} == EXPECTED_DEPS and set(GRAPH) == set(EXPECTED_DEPS)


def test_every_asset_has_a_description_and_an_explicit_code_version(defs):
    from eagle_assets.defs.code_versions import VERSIONS

    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.description and len(node.description) > 40, key  # the UI shows it to the user
        assert re.fullmatch(rf"v{VERSIONS[key.to_user_string()]}-[0-9a-f]{{8}}", node.code_version), (key, node.code_version)


def test_checks_carry_descriptions_and_blocking_where_a_bad_output_must_stop_the_graph(defs):
    graph = defs.resolve_asset_graph()
    for check_key in graph.asset_check_keys:
        node = graph.get(check_key)
        assert node.description, check_key
    blocking = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys if graph.get(k).blocking}
    assert ("synthetic_corpus", "token_round_trip") in blocking and ("drafter_checkpoint", "serves_in_vllm") in blocking
    assert not any(asset == "benchmark_report" for asset, _ in blocking)  # a slow drafter is reported, not hidden
    assert ("drafter_checkpoint", "samples_under_speculation") not in blocking  # the engine's fault, not the drafter's


def _configs() -> dict:
    """Each asset's own Config class (without a code location's defaults)."""
    from eagle_assets.defs.benchmark import BenchmarkConfig, BenchmarkReferenceConfig
    from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
    from eagle_assets.defs.drafter import DrafterAssetConfig
    from eagle_assets.defs.hidden_states import HiddenStatesConfig, VocabConfig

    return {
        "prompts": PromptsConfig,
        "synthetic_corpus": CorpusConfig,
        "vocab_mapping": VocabConfig,
        "hidden_state_shards": HiddenStatesConfig,
        "benchmark_reference": BenchmarkReferenceConfig,
        "drafter_checkpoint": DrafterAssetConfig,
        "benchmark_report": BenchmarkConfig,
    }


@pytest.mark.engine
@pytest.mark.slow
def test_real_graph_materialisations_carry_versions(materialized_graph):
    from eagle_assets.defs.code_versions import code_version
    from eagle_assets.defs.settings import LocationSettings, reference_settings, with_defaults

    instance, _, _ = materialized_graph
    settings = LocationSettings("smollm2-tiny")
    for name, config in _configs().items():
        record = instance.get_latest_data_version_record(dg.AssetKey(name), False)
        assert record is not None, name
        tags = record.asset_materialization.tags
        # The version of the session's settings: the smollm2-tiny preset's.
        values = reference_settings(settings) if name == "benchmark_reference" else None
        assert tags["dagster/code_version"] == code_version(name, with_defaults(config, name, settings, values)), name
        assert tags["dagster/data_version_is_user_provided"] == "true", name  # our content hash, not Dagster's run id
        assert re.fullmatch(r"[0-9a-f]{16,64}", tags["dagster/data_version"]), (name, tags)


def test_a_part_whose_upstream_was_never_materialised_is_refused_before_any_run(tmp_path):
    import dagster as dg
    from typer.testing import CliRunner

    from eagle_assets.cli import app
    from eagle_assets.defs.runner import missing_upstream, selected_assets

    assert selected_assets(["benchmark", "corpus"]) == ["prompts", "synthetic_corpus", "vocab_mapping", "benchmark_report"]
    assert selected_assets(["hidden_states"]) == ["hidden_state_shards", "benchmark_reference"]
    with dg.DagsterInstance.ephemeral() as empty:
        assert missing_upstream(empty, selected_assets(None)) == []  # the whole graph reads nothing outside it
        assert missing_upstream(empty, selected_assets(["drafter"])) == ["synthetic_corpus", "vocab_mapping", "hidden_state_shards"]
        assert missing_upstream(empty, selected_assets(["hidden_states", "drafter"])) == ["synthetic_corpus", "vocab_mapping"]
        assert missing_upstream(empty, selected_assets(["benchmark"])) == ["benchmark_reference", "drafter_checkpoint"]
    result = CliRunner().invoke(app, ["run", "--part", "hidden_states"], env={"DAGSTER_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "--part hidden_states reads synthetic_corpus, which this instance" in result.output and "run --part corpus first" in result.output
    result = CliRunner().invoke(app, ["run", "--part", "drafters"])
    assert result.exit_code == 1 and "unknown part 'drafters': give one of corpus, hidden_states, drafter, benchmark" in result.output


@pytest.mark.engine
@pytest.mark.slow
def test_after_the_graph_every_part_finds_its_upstream(materialized_graph):
    from eagle_assets.defs.runner import PARTS, missing_upstream, selected_assets

    instance, _, _ = materialized_graph
    for part in PARTS:
        assert missing_upstream(instance, selected_assets([part])) == [], part


def test_run_preset_notes_name_presets_that_exist():
    import re

    from eagle_assets.run_presets import RUN_PRESETS

    notes = {preset: p.note for preset, p in RUN_PRESETS.items() if p.note}
    assert "smollm2-scratch" in notes  # a drafter from nothing on 32 prompts does not pay: the run says so
    for preset, note in notes.items():
        named = re.findall(r"--preset ([\w-]+)", note)
        assert named and set(named) <= set(RUN_PRESETS), (preset, named)


@pytest.mark.parametrize("preset", sorted(RUN_PRESETS))
def test_every_run_preset_fits_its_assets_configs(defs, preset):
    from eagle_assets.defs.benchmark import BenchmarkConfig
    from eagle_assets.defs.settings import LocationSettings, reference_settings, with_defaults
    from eagle_assets.run_presets import REFERENCE_FROM, RUN_PRESETS

    configs = _configs()
    for asset, values in RUN_PRESETS[preset].sections().items():
        made = with_defaults(configs[asset], asset, LocationSettings(preset))()  # raises on a field the Config lacks
        assert {k: getattr(made, k) for k in values} == values, asset
    # The benchmark's settings refuse what cannot run, e.g. fewer prompts than a concurrency level
    # keeps in flight: caught here, not at the end of a `make run`.
    with_defaults(BenchmarkConfig, "benchmark_report", LocationSettings(preset))().settings(k=3)
    # The reference takes the benchmark's, the hidden states' and the drafter's settings it shares.
    reference = with_defaults(configs["benchmark_reference"], "benchmark_reference", values=reference_settings(LocationSettings(preset)))()
    for asset, keys in REFERENCE_FROM.items():
        for key in set(keys) & set(RUN_PRESETS[preset].sections().get(asset, {})):
            assert getattr(reference, key) == RUN_PRESETS[preset].sections()[asset][key], (asset, key)


def test_benchmark_config_reads_a_k_schedule_and_refuses_a_bad_one():
    from eagle_assets.defs.benchmark import BenchmarkConfig

    assert BenchmarkConfig(k_schedule="1-2:3,3-:0").settings(k=3).k_schedule.vllm_entries() == [[1, 2, 3], [3, 4096, 0]]
    assert BenchmarkConfig().settings(k=3).k_schedule is None
    assert BenchmarkConfig(confirm_schedule=True).settings(k=3).confirm_schedule and not BenchmarkConfig().settings(k=3).confirm_schedule
    with pytest.raises(ValueError, match="K schedule '1-2:3,4-:0': the range 4- starts at 4, not 3"):
        BenchmarkConfig(k_schedule="1-2:3,4-:0").settings(k=3)


def test_a_storage_root_that_is_a_url_works_in_a_local_mirror_not_a_folder_named_after_the_url(tmp_path, monkeypatch):
    from upath import UPath

    from eagle_assets.paths import mirror_dir
    from eagle_assets.resources.storage import StorageResource

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EAGLE_ASSETS_CACHE", str(tmp_path / "cache"))
    s3 = StorageResource(root="s3://bucket/eagle")
    corpus = s3.corpus("smollm2-135m-instruct")
    assert corpus == mirror_dir("s3://bucket/eagle") / "smollm2-135m-instruct" / "corpus"
    assert corpus.is_relative_to(tmp_path / "cache" / "storage") and not (tmp_path / "s3:").exists()
    assert s3.remote(corpus) == UPath("s3://bucket/eagle/smollm2-135m-instruct/corpus")
    mirrored = StorageResource(root="s3://bucket/eagle", mirror=str(tmp_path / "m"))
    assert mirrored.report("t") == tmp_path / "m" / "t" / "report"
    with pytest.raises(ValueError, match=r"storage root 'nope://x': fsspec cannot open it \(ValueError: Protocol not known: nope\)"):
        StorageResource(root="nope://x").corpus("t")
    local = StorageResource(root=str(tmp_path / "d"))  # a folder: its own paths, and nothing to sync
    assert local.corpus("t") == tmp_path / "d" / "t" / "corpus"
    assert local.fetch(local.corpus("t")) == [] and local.publish(local.corpus("t")) == []


def test_the_reference_step_goes_before_the_drafters_in_one_run(defs):
    """Both are ready once the shards are built; Dagster's executors take the higher
    `dagster/priority` first, so the reference finds the shards' extraction server still warm
    (the drafter's step stops warm servers before it trains)."""
    priority = {name: int(defs.get_assets_def(name).op.tags.get("dagster/priority", 0)) for name in ("benchmark_reference", "drafter_checkpoint")}
    assert priority["benchmark_reference"] > priority["drafter_checkpoint"], priority
