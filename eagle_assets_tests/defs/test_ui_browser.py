"""The web UI over the graph the session fixture materialised for real, in a real browser.

`materialized_graph` (conftest.py) is the whole graph on the embedded SmolLM2, "smollm2-tiny":
where `make browser` installed Debian's Chromium, a session as `eagle-assets ui --preset
smollm2-tiny` holds one and Chromium's click on "Materialize all" built it; the instance then
holds that one run, every asset and every check of it (read from the instance, not the page).

The UI then starts as `eagle-assets ui --preset smollm2-tiny --config run.yaml` starts it: a
session (defs/session.py: `dagster dev` under its supervisor) over a copy of that graph's
DAGSTER_HOME and data folder, whose code location takes the run file's settings. The
first-visit modal is dismissed through GraphQL (`setNuxSeen`); headless Chromium loads
/asset-groups and saves the screenshot to test-artifacts/ui/asset-groups.png (skipped without
`chromium`: `make browser`). GraphQL then confirms what the page draws: every asset
materialised and fresh under the same settings (the UI's runs and `eagle-assets run`'s are the
same runs), every check executed, the report's plots as images; and after the run file changes
one asset's setting and the definitions reload, that asset alone is stale, with its cause, and
its "Materialize" button rebuilds it and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.paths import PROJECT_ROOT
from eagle_assets_tests.browser import CHROMIUM_FLAGS, chromium, click_button, ui_page
from eagle_assets_tests.graph_runs import ASSETS, copy_graph, every_check, failed_checks, run_outcome

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "ui"
STARTUP_TIMEOUT_S = 240  # ~12 s on an idle machine; the suite shares two cores with vLLM
# Headless Chromium takes its screenshot at load, before the UI's JavaScript has drawn anything,
# unless virtual time runs on first.
SCREENSHOT_FLAGS = [*CHROMIUM_FLAGS, "--virtual-time-budget=25000"]

ASSET_QUERY = """
query {
  assetNodes {
    assetKey { path }
    opVersion
    dataVersion
    staleStatus
    staleCauses { reason }
    assetMaterializations(limit: 1) {
      runId
      tags { key value }
      metadataEntries { label __typename ... on MarkdownMetadataEntry { mdStr } ... on PathMetadataEntry { path } }
    }
    assetChecksOrError {
      ... on AssetChecks {
        checks { name blocking executionForLatestMaterialization { status evaluation { success severity } } }
      }
    }
  }
}
"""


def _chromium() -> str:
    found = chromium()
    if found is None:
        pytest.skip("no chromium on this machine: `make browser` (Debian's chromium) runs the browser tests")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(url: str, query: str, timeout: float = 30) -> dict:
    body = json.dumps({"query": query}).encode()
    req = urllib.request.Request(f"{url}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.loads(resp.read())
    if out.get("errors"):
        raise AssertionError(f"GraphQL errors: {out['errors']}")
    return out["data"]


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@pytest.fixture(scope="module")
def dagster_ui(materialized_graph, tmp_path_factory):
    """A session over a copy of the materialised graph (a test here rebuilds an asset), as
    `eagle-assets ui --preset smollm2-tiny --config run.yaml` holds one; yields (session, run file)."""
    from eagle_assets.defs.session import DagsterSession
    from eagle_assets.defs.settings import PRESET_ENV, RUN_FILE_ENV

    root = tmp_path_factory.mktemp("ui")
    home, data = copy_graph(materialized_graph, root)
    run_file = root / "run.yaml"
    run_file.write_text("preset: smollm2-tiny\n")
    env = {"EAGLE_ASSETS_DATA": str(data), PRESET_ENV: "smollm2-tiny", RUN_FILE_ENV: str(run_file), "EAGLE_ASSETS_AUTOMATION": "0"}
    with DagsterSession(home, data, env=env, log=lambda m: None, command="eagle-assets ui (test)") as session:
        # The first visit shows a modal over the whole UI until this is recorded.
        assert _graphql(session.url, "mutation { setNuxSeen }")["setNuxSeen"] is True
        yield session, run_file


def _browse(url: str, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess:
    args = [_chromium(), *SCREENSHOT_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *mode, url]
    # Its own session too, so that a hung renderer can be killed with it.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish loading {url} in 120 s: {err[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_asset_graph_page_renders_every_asset_and_is_saved_as_a_screenshot(dagster_ui, tmp_path):
    session, _ = dagster_ui
    page = f"{session.url}/asset-groups"
    dom = _browse(page, tmp_path, "--dump-dom")
    missing = {a for a in ASSETS if a not in dom.stdout}
    assert not missing, f"/asset-groups drew no node for {sorted(missing)}; the session's log:\n{session.log_tail()}"
    assert "Welcome to Dagster" not in dom.stdout  # the first-visit modal is gone

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "asset-groups.png"
    shot.unlink(missing_ok=True)
    result = _browse(page, tmp_path, f"--screenshot={shot}")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]

    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == (1600, 1000)
        colours = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the screenshot is (nearly) blank"


def test_graphql_shows_every_asset_fresh_with_its_checks_and_the_plots_as_images(dagster_ui):
    session, _ = dagster_ui
    nodes = {"/".join(n["assetKey"]["path"]): n for n in _graphql(session.url, ASSET_QUERY)["assetNodes"]}
    assert set(nodes) == ASSETS
    for name, node in nodes.items():
        assert node["assetMaterializations"], f"{name} was never materialised"
        tags = {t["key"]: t["value"] for t in node["assetMaterializations"][0]["tags"]}
        assert re.fullmatch(r"[0-9a-f]{16,64}", tags["dagster/data_version"]), (name, tags)  # our content hash
        assert tags["dagster/data_version_is_user_provided"] == "true", name
        # The run of `eagle-assets run --preset smollm2-tiny` and this UI's settings are the same:
        # same code versions, nothing stale (a docstring edit in this checkout changes none).
        assert node["opVersion"] == tags["dagster/code_version"], name
        assert node["staleStatus"] == "FRESH", (name, node["staleCauses"])
        for check in node["assetChecksOrError"]["checks"]:
            execution = check["executionForLatestMaterialization"]
            assert execution is not None and execution["evaluation"] is not None, f"{name}.{check['name']} did not run"
            if check["blocking"]:
                assert execution["status"] == "SUCCEEDED", f"{name}.{check['name']}: {execution}"
            else:
                # Warnings (the benchmark's speedup on two CPU cores) are reported, not hidden.
                assert execution["status"] in ("SUCCEEDED", "FAILED"), f"{name}.{check['name']}: {execution}"
                assert execution["evaluation"]["success"] or execution["evaluation"]["severity"] == "WARN"
    entries = nodes["benchmark_report"]["assetMaterializations"][0]["metadataEntries"]
    plots = [e for e in entries if e["label"].startswith("plot_")]
    assert plots and all(e["__typename"] == "MarkdownMetadataEntry" and "](data:image/png;base64," in e["mdStr"] for e in plots), plots


def test_materialize_all_clicked_in_chromium_built_every_asset_and_passed_every_check(materialized_graph):
    """The shared graph is Chromium's click where `make browser` installed it (conftest.py)."""
    from eagle_assets.defs.sensors import AUTOMATION_RUN_TAGS

    instance, _, _ = materialized_graph
    runs = instance.get_runs()
    clicked = [r for r in runs if r.tags.get("dagster/from_ui") == "true"]
    if not clicked:
        _chromium()  # skips where there is no browser: the graph was then built by `eagle-assets run`'s path
        pytest.fail(f"chromium is here, yet no run of the graph's instance came from the UI: {[r.tags for r in runs]}")
    [run] = clicked
    assert run.status == dg.DagsterRunStatus.SUCCESS
    # The session's automation was on, as `eagle-assets ui` starts it: it built nothing of its own.
    assert not [r.run_id for r in runs if AUTOMATION_RUN_TAGS.items() <= r.tags.items()]
    materialised, checks = run_outcome(instance, run.run_id)
    assert materialised == ASSETS
    assert {a: instance.get_latest_materialization_event(dg.AssetKey(a)).run_id for a in ASSETS} == dict.fromkeys(ASSETS, run.run_id)
    assert set(checks) == every_check()  # the click runs every check with its asset, the drafter's own included
    assert not failed_checks(checks), {k: (e.passed, e.severity, e.metadata) for k, e in failed_checks(checks).items()}


def test_a_changed_setting_makes_that_asset_alone_stale_and_its_materialize_button_rebuilds_it_alone(dagster_ui):
    session, run_file = dagster_ui
    run_file.write_text("preset: smollm2-tiny\nvocab_mapping: {draft_vocab_size: 4000}\n")
    reloaded = _graphql(session.url, 'mutation { reloadRepositoryLocation(repositoryLocationName: "eagle_assets") { __typename } }')
    assert reloaded["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", reloaded
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:  # the code server restarts with the new settings
        stale = session.stale()
        if stale["vocab_mapping"][0] == "STALE" or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert stale["vocab_mapping"] == ("STALE", ["has a new code version"]), stale
    assert {a: s for a, (s, _) in stale.items() if a != "vocab_mapping"} == {a: "FRESH" for a in ASSETS - {"vocab_mapping"}}

    # A person opens the stale asset's page and clicks its "Materialize" button.
    _chromium()
    instance = session.instance
    before = {a: instance.get_latest_materialization_event(dg.AssetKey(a)).run_id for a in ASSETS}
    known = {r.run_id for r in instance.get_runs()}
    with ui_page() as page:
        page.goto(f"{session.url}/assets/vocab_mapping")
        click_button(page, "Materialize")
    [run] = [r for r in instance.get_runs() if r.run_id not in known]
    assert run.tags.get("dagster/from_ui") == "true"
    session.wait(run.run_id)
    materialised, checks = run_outcome(instance, run.run_id)
    assert materialised == {"vocab_mapping"} and set(checks) == {"vocab_mapping:consistent"} and checks["vocab_mapping:consistent"].passed
    assert {a: instance.get_latest_materialization_event(dg.AssetKey(a)).run_id for a in ASSETS} == {**before, "vocab_mapping": run.run_id}
    record = instance.get_latest_materialization_event(dg.AssetKey("vocab_mapping")).asset_materialization
    assert str(record.metadata["draft_vocab_size"].value) == "4000"
    stale = session.stale()
    assert stale["vocab_mapping"] == ("FRESH", []), stale
    # Its new content makes its child stale (the UI names vocab_mapping's new data version as the
    # root cause), which this run, of the UI's alone, did not rebuild.
    assert stale["drafter_checkpoint"] == ("STALE", ["has a new data version"]), stale
    assert {a: s for a, (s, _) in stale.items() if a != "drafter_checkpoint"} == {a: "FRESH" for a in ASSETS - {"drafter_checkpoint"}}
