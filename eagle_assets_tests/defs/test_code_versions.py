"""Code versions move only with what an asset computes (defs/code_versions.py).

The first test is the gate every branch meets: the code each asset's computation runs, normalised,
equals the checked-in lock; when it fails, its message says what to do (bump or not, then
`make relock`). The others edit a copy of the package as a developer would and ask the same
check and the real definitions' code versions what follows.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.defs.code_versions import ENTRIES, PACKAGE, VERSIONS, code_version, fingerprints, lock_problems, problems_message, read_lock
from eagle_assets.defs.settings import LocationSettings, location_settings, with_defaults


def test_the_code_of_every_asset_matches_the_lock():
    problems = lock_problems()
    assert not problems, problems_message(problems)


@pytest.fixture
def package(tmp_path) -> Path:
    """A copy of the package's source, to edit."""
    root = tmp_path / "eagle_assets"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "data", "*.lock.json"))
    return root


def _edit(root: Path, module: str, old: str, new: str) -> None:
    path = root / module
    text = path.read_text()
    assert text.count(old) >= 1, f"{old!r} is no longer in {module}: update this test"
    path.write_text(text.replace(old, new, 1))


def _flagged(root: Path) -> list[str]:
    return sorted(line.split(" ")[0] for line in lock_problems(root, lock={"assets": fingerprints(PACKAGE)}))


def test_docstrings_comments_and_modules_no_asset_runs_leave_every_asset_as_it_is(package):
    _edit(package, "corpus/store.py", '"""', '"""A docstring reflowed, a sentence added. ')
    _edit(package, "drafter/ttt.py", "\nimport ", "\n# a comment about the loss\nimport ")
    _edit(package, "defs/corpus.py", '    """How the target answers the prompts."""', '    """How the target answers the prompts, said again."""')
    for module in ("cli.py", "planner.py"):  # the command line and the plan: no asset runs them
        (package / module).write_text((package / module).read_text() + "\n\ndef only_a_benchmark_calls_this():\n    return 1\n")
    assert _flagged(package) == []


def test_a_change_to_the_ttt_loss_flags_the_drafter_and_the_report_and_nothing_else(package):
    # The step weights of the loss: what the drafter learns, and what the report's replay unrolls.
    _edit(package, "drafter/ttt.py", "DEFAULT_STEP_DECAY = 0.8", "DEFAULT_STEP_DECAY = 0.9")
    flagged = lock_problems(package, lock={"assets": fingerprints(PACKAGE)})
    assert sorted(line.split(" ")[0] for line in flagged) == ["benchmark_report", "drafter_checkpoint"]
    assert all("drafter/ttt.py" in line for line in flagged)
    message = problems_message(flagged)
    assert "raise its number in VERSIONS" in message and "make relock" in message


def test_a_new_corpus_default_gives_the_corpus_a_new_code_version_and_no_other_asset(package):
    # In the code: the lock flags synthetic_corpus alone (prompts uses nothing of CorpusConfig).
    _edit(package, "defs/corpus.py", "    max_tokens: int = 256\n", "    max_tokens: int = 512\n")
    assert _flagged(package) == ["synthetic_corpus"]
    # And as a setting of the code location (a preset or run file): its Dagster code version moves.
    from eagle_assets.defs.corpus import CorpusConfig

    here = location_settings()
    changed = LocationSettings(here.preset, {**here.changes, "synthetic_corpus": {**here.changes.get("synthetic_corpus", {}), "max_tokens": 7}})
    before = code_version("synthetic_corpus", with_defaults(CorpusConfig, "synthetic_corpus", here))
    after = code_version("synthetic_corpus", with_defaults(CorpusConfig, "synthetic_corpus", changed))
    assert before != after and before.split("-")[0] == after.split("-")[0] == f"v{VERSIONS['synthetic_corpus']}"


def test_the_real_definitions_carry_these_versions_and_entries():
    from eagle_assets.defs.graph import build_definitions

    graph = build_definitions(automation=False).resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == set(VERSIONS) == set(ENTRIES) == set(read_lock()["assets"])
    import importlib

    for name, entry in ENTRIES.items():
        module = importlib.import_module("eagle_assets." + entry.module[: -len(".py")].replace("/", "."))
        asset = getattr(module, entry.function)
        assert isinstance(asset, dg.AssetsDefinition) and asset.key == dg.AssetKey(name)
        settings = asset.op.config_schema.config_type
        assert graph.get(dg.AssetKey(name)).code_version.startswith(f"v{VERSIONS[name]}-"), name
        assert settings is not None, name


def test_settings_that_do_not_fit_an_asset_are_refused_with_the_fields_it_has():
    from eagle_assets.defs.corpus import CorpusConfig

    with pytest.raises(ValueError, match=r"run.yaml: synthetic_corpus has no setting max_tokenz; known: temperature, max_tokens"):
        with_defaults(
            CorpusConfig, "synthetic_corpus", LocationSettings("smollm2-tiny", {"synthetic_corpus": {"max_tokenz": 3}}, run_file="run.yaml")
        )
    with pytest.raises(ValueError, match=r"settings of synthetic_corpus from run.yaml do not fit its Config"):
        with_defaults(
            CorpusConfig, "synthetic_corpus", LocationSettings("smollm2-tiny", {"synthetic_corpus": {"max_tokens": "many"}}, run_file="run.yaml")
        )
    made = with_defaults(CorpusConfig, "synthetic_corpus", LocationSettings("smollm2-tiny"))
    assert made().max_tokens == 64 and made.model_fields["max_tokens"].description == CorpusConfig.model_fields["max_tokens"].description
