"""The web UI over the graph the session fixture materialised for real, in a real browser.

The UI starts as `eagle-assets ui --preset smollm2-tiny --config run.yaml` starts it: a session
(defs/session.py: `dagster dev` under its supervisor) over the DAGSTER_HOME and data folder of
`materialized_graph` (the whole graph on the embedded SmolLM2, "smollm2-tiny", built by
`eagle-assets run`'s path), whose code location takes the run file's settings. The first-visit
modal is dismissed through GraphQL (`setNuxSeen`); Debian's headless Chromium loads
/asset-groups and saves the screenshot to test-artifacts/ui/asset-groups.png (skipped without
`chromium`: `make browser`). GraphQL then confirms what the page draws: every asset
materialised and fresh under the same settings (the UI's runs and `eagle-assets run`'s are the
same runs), every check executed, the report's plots as images; and after the run file changes
one asset's setting and the definitions reload, that asset alone is stale, with its cause.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagle_assets.paths import PROJECT_ROOT

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ASSETS = {"prompts", "synthetic_corpus", "vocab_mapping", "hidden_state_shards", "drafter_checkpoint", "benchmark_report"}
ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "ui"
STARTUP_TIMEOUT_S = 240  # ~12 s on an idle machine; the suite shares two cores with vLLM
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1600,1000",
    # Headless Chromium takes its screenshot at load, before the UI's JavaScript has drawn
    # anything, unless virtual time runs on first.
    "--virtual-time-budget=25000",
]  # fmt: skip

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
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no chromium on this machine: `apt-get install -y chromium` (Debian) runs the browser test")
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
    """A session over the materialised graph, as `eagle-assets ui --preset smollm2-tiny --config
    run.yaml` holds one; yields (session, run file)."""
    from eagle_assets.defs.session import DagsterSession
    from eagle_assets.defs.settings import PRESET_ENV, RUN_FILE_ENV

    _, data, home = materialized_graph
    run_file = tmp_path_factory.mktemp("ui") / "run.yaml"
    run_file.write_text("preset: smollm2-tiny\n")
    env = {"EAGLE_ASSETS_DATA": str(data), PRESET_ENV: "smollm2-tiny", RUN_FILE_ENV: str(run_file), "EAGLE_ASSETS_AUTOMATION": "0"}
    with DagsterSession(home, data, env=env, log=lambda m: None, command="eagle-assets ui (test)") as session:
        # The first visit shows a modal over the whole UI until this is recorded.
        assert _graphql(session.url, "mutation { setNuxSeen }")["setNuxSeen"] is True
        yield session, run_file


def _browse(url: str, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess:
    args = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *mode, url]
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


def test_a_changed_setting_in_the_run_file_makes_that_asset_alone_stale_with_its_cause(dagster_ui):
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
