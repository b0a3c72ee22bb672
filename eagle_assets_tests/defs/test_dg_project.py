"""The project as a `dg` project ([tool.dg] in pyproject.toml): `dg check defs` and `dg list defs`
run in the project folder load the code location workspace.yaml names, and a definition that
cannot load fails the check with its own message.

Each test runs the real `dg` of this interpreter's environment, in the project folder, in an
environment without the project's settings and without DAGSTER_HOME (as a fresh shell has it):
dg then keeps its instance in a temporary folder there, configured by the project's dagster.yaml.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from eagle_assets.defs import ASSETS
from eagle_assets.paths import PROJECT_ROOT

BIN = Path(sys.executable).parent


def dg(*args: str, **settings: str) -> subprocess.CompletedProcess:
    """`dg ARGS` in the project folder with only `settings` of the project's own variables set."""
    exe = shutil.which("dg", path=str(BIN))
    assert exe, f"no dg in {BIN}: pip install -e '.[test]' (dagster-dg-cli)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_ASSETS_", "DAGSTER_"))}
    # The interpreter's environment is the active one (dg warns when the project's differs), and
    # the project folder comes first on the path, so the definitions under test are this copy's.
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=sys.prefix, PYTHONPATH=str(PROJECT_ROOT), NO_COLOR="1", **settings)
    return subprocess.run([exe, *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_dg_check_defs_passes_in_the_project_folder():
    result = dg("check", "defs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_dg_check_defs_fails_with_the_settings_message_when_the_definitions_cannot_load():
    result = dg("check", "defs", EAGLE_ASSETS_SERVER_URL="localhost:8000")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "EAGLE_ASSETS_SERVER_URL='localhost:8000' is not an http:// or https:// URL" in result.stdout + result.stderr


def test_dg_list_defs_shows_the_assets_sensors_and_resources():
    result = dg("list", "defs", "--json")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert sorted(a["asset_key"] for a in listed["assets"]) == sorted(a.key.to_user_string() for a in ASSETS)
    assert listed["jobs"] == []  # every run is one of Dagster's own asset job (defs/jobs.py)
    assert {s["name"] for s in listed["sensors"]} == {"eagle3_automation", "new_prompt_files"}
    assert {r["name"] for r in listed["resources"]} == {"inference_server", "storage", "trainer"}
