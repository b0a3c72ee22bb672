"""Shared fixtures: the embedded target, the stand-ins built from it, and one real vLLM CPU server per test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_assets.paths import engine_venv
from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets.targets.embedded import pull
from eagle_assets_tests.drafters import TINY_TARGET_CONFIG


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2 folder (pulled once; a no-op when the checksum verifies)."""
    return pull(EMBEDDED_TARGET, log=lambda m: None)


@pytest.fixture(scope="session")
def smollm2_config(smollm2_path) -> dict:
    return json.loads((smollm2_path / "config.json").read_text())


@pytest.fixture(scope="session")
def standin_paths(smollm2_path) -> dict[str, Path]:
    """The seed-architecture stand-ins, {name: folder} for tiny-deepseek-v3 and tiny-kimi-k2.5:
    built once into the session's cache (about three minutes on 2 cores), a no-op when both verify."""
    from eagle_assets.targets.embedded import pull_standins

    return pull_standins(log=lambda m: None)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's interpreter. `make test` builds it; its absence is a failure, not a skip."""
    py = engine_venv("vllm") / "bin" / "python"
    if not py.is_file():
        pytest.fail(f"no vLLM environment at {py.parent.parent}: run `make setup` first")
    return py


@pytest.fixture(scope="session")
def vllm_server(smollm2_path, engine_python):
    """A real vLLM CPU server serving SmolLM2 without speculation, shared by the whole session."""
    from eagle_assets.engines.serving import launch_vllm

    with launch_vllm(EMBEDDED_TARGET, log=lambda m: None) as server:
        yield server


SMOLLM2_EXTRACTED_IDS = (2, 15, 27, 30)
"""What the shared extraction server captures: SmolLM2's default aux ids and its last layer (r_L)."""


@pytest.fixture(scope="session")
def smollm2_extraction_server(smollm2_path, engine_python, tmp_path_factory):
    """A real vLLM CPU server extracting SmolLM2's hidden states (`SMOLLM2_EXTRACTED_IDS`) into a
    spool folder, shared by the session. Yields (server, spool folder)."""
    from eagle_assets.engines.serving import launch_vllm
    from eagle_assets.engines.vllm_launch import extraction_config, hidden_states_transfer

    spool = tmp_path_factory.mktemp("spool")
    with launch_vllm(
        EMBEDDED_TARGET, speculative=extraction_config(SMOLLM2_EXTRACTED_IDS), kv_transfer=hidden_states_transfer(spool), log=lambda m: None
    ) as server:
        yield server, spool


def _materialise(tmp_path_factory, name: str, preset: str, target: str | None = None, click: bool = False):
    """The whole asset graph materialised with run `preset` on `target` (None: the embedded one)
    in a Dagster session (webserver, daemon, code server) on a private DAGSTER_HOME and data
    folder. With `click` and Chromium on this machine (`make browser`), as a person does it: the
    session started as `eagle-assets ui --preset` starts it, and Chromium clicks "Materialize all"
    on the asset graph (`_click_materialize_all`); otherwise as `eagle-assets run` does it, one run
    of the asset job launched through the UI's API. Either way the target travels in the session's
    environment, as `--target` sends it, and the result is one run of Dagster's asset job.
    Yields (instance, data_dir, dagster_home); the session has ended by then."""
    import os

    import dagster as dg

    root = tmp_path_factory.mktemp(name)
    home, data = root / "dagster_home", root / "data"
    home.mkdir()
    env = {"DAGSTER_HOME": str(home), "EAGLE_ASSETS_DATA": str(data)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from eagle_assets.defs.runner import ensure_dagster_home, materialize
        from eagle_assets_tests.browser import chromium

        ensure_dagster_home()
        if click and chromium() is not None:
            _click_materialize_all(home, data, preset, target)
        else:
            materialize(preset, log=lambda m: None, target=target, home=home)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield instance, data, home
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _click_materialize_all(home: Path, data: Path, preset: str, target: str | None) -> None:
    """The session `eagle-assets ui --preset PRESET` holds (its automation on, as by default);
    Chromium opens the asset graph and clicks "Materialize all"; the run the click launched is
    waited for in the instance (session.RunFailed names a failed step)."""
    from eagle_assets.defs.session import DagsterSession
    from eagle_assets.defs.settings import session_environment
    from eagle_assets_tests.browser import click_button, ui_page

    env = session_environment(preset, None, target)
    with DagsterSession(home, data, env=env, log=lambda m: None, command=f"eagle-assets ui --preset {preset} (test)") as session:
        session.graphql("mutation { setNuxSeen }")  # the first visit's welcome modal would cover the page
        with ui_page() as page:
            page.goto(f"{session.url}/asset-groups")
            click_button(page, "Materialize all")
        [run] = [r for r in session.instance.get_runs() if r.tags.get("dagster/from_ui") == "true"]
        session.wait(run.run_id)


@pytest.fixture(scope="session")
def materialized_graph(tmp_path_factory, smollm2_path, engine_python):
    """The whole asset graph on the embedded target, "smollm2-tiny" preset: Chromium's click on
    "Materialize all" where `make browser` installed it, else `eagle-assets run`'s path
    (`_materialise`). The run's tag `dagster/from_ui` says which."""
    yield from _materialise(tmp_path_factory, "graph", "smollm2-tiny", click=True)


@pytest.fixture(scope="session")
def kimi_rehearsal(tmp_path_factory, standin_paths, engine_python):
    """docs/kimi-k2.5.md's four phases run as the page writes them (benchmarks/kimi_rehearsal.py)
    on tiny-kimi-k2.5 with the "standin-tiny" preset: the production server for the corpus, the
    hidden-state part's own extraction server, training, then the target alone and with the
    drafter, one after the other. Fails (TwoTargetServers) if two target servers ever run at once."""
    from eagle_assets.paths import PROJECT_ROOT
    from eagle_assets.targets.standins import KIMI_STANDIN
    from eagle_assets_tests.scripts import load_script

    rehearsal = load_script(PROJECT_ROOT / "benchmarks" / "kimi_rehearsal.py")
    root = tmp_path_factory.mktemp("kimi-rehearsal")
    return rehearsal.rehearse(standin_paths[KIMI_STANDIN], KIMI_STANDIN, "standin-tiny", root, timeout_s=1800, log=lambda m: None)


@pytest.fixture(scope="session")
def standin_graph(kimi_rehearsal):
    """The whole asset graph on the Kimi-K2.5 stand-in as the rehearsal of docs/kimi-k2.5.md built it
    (`kimi_rehearsal`): states from the engine, the offline reference replayed over the capture the
    hidden-state stage made. Yields (instance, data_dir, dagster_home)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(kimi_rehearsal.dagster_home)) as instance:
        yield instance, kimi_rehearsal.data, kimi_rehearsal.dagster_home


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: tiny matrices run faster so on a shared 2-core machine, and runs
    compared for exact equality reduce in the same order (subprocesses get OMP_NUM_THREADS=1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_target(tmp_path) -> Path:
    """A target folder holding only TINY_TARGET_CONFIG as its config.json."""
    folder = tmp_path / "target"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_TARGET_CONFIG))
    return folder
