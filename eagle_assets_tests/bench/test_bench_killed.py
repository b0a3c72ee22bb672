"""`eagle-assets bench` with its real vLLM server killed (SIGKILL to the engine's process group)
in the middle of a sweep: it stops within seconds with a message naming the configuration, the
server and its log, leaves no /dev/shm file, keeps what it finished, refuses to resume with other
settings, and resumes with the same ones.

Small on purpose: 4 MT-Bench turns x 24 tokens at concurrency 1 and 2, K=2, no speculation and
a random drafter served one after another. Three server starts (the killed one, then both again):
about four minutes on two cores, one server at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from eagle_assets_tests.drafters import write_random_drafter
from eagle_assets_tests.engines.server_probe import kill_group, shm_held_by, still_there, wait_gone

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "eagle-assets")


def bench_args(drafter: Path, out: Path, output_len: int = 24) -> list[str]:
    return [
        CLI,
        "bench",
        "--drafter",
        str(drafter),
        "--out",
        str(out),
        "--num-prompts",
        "4",
        "--output-len",
        str(output_len),
        "--concurrency",
        "1",
        "--concurrency",
        "2",
        "-k",
        "2",
        "--no-ngram",
        "--baseline-once",
        "--interleave",
        "0",
    ]


def test_a_benchmark_whose_server_is_killed_says_so_keeps_what_it_measured_and_resumes(smollm2_config, engine_python, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter-vllm", smollm2_config)
    out, runs = tmp_path / "report", tmp_path / "runs"
    env = {**os.environ, "EAGLE_ASSETS_RUNS": str(runs)}
    measurements = out / "measurements"
    killed: dict[str, object] = {}

    def kill_after_the_first_level():
        # Once the baseline's concurrency 1 is on disk, its server is serving concurrency 2.
        while not list(measurements.glob("sweep--baseline-*--c1.json")):
            time.sleep(0.05)
        record = json.loads(next((runs / "servers").glob("port-*.json")).read_text())
        root = psutil.Process(record["pid"])
        tree = [root, *root.children(recursive=True)]
        killed["files"], killed["tree"] = shm_held_by(tree), tree
        killed["at"] = kill_group(root)

    proc = subprocess.Popen(
        bench_args(drafter, out), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    killer = threading.Thread(target=kill_after_the_first_level, daemon=True)
    killer.start()
    try:
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:  # SIGTERM takes Ctrl-C's path: the command stops its server
            proc.terminate()
            proc.communicate(timeout=60)
    noticed = time.monotonic() - killed["at"]
    assert proc.returncode == 1, stdout[-2000:] + stderr[-3000:]
    assert noticed < 15, f"the bench stopped {noticed:.1f} s after its server was killed"
    assert "the benchmark stopped while serving 'baseline': vLLM server on port " in stderr
    assert "was killed by SIGKILL (" in stderr and "last lines of its log:" in stderr and "full log: " in stderr
    assert f"are kept in {measurements}: a rerun with the same settings resumes from them" in stderr
    assert "Traceback" not in stderr
    wait_gone(killed["tree"])
    assert still_there(killed["files"]) == [], "the killed server's shared memory was left in /dev/shm"
    (first_level,) = measurements.glob("sweep--baseline-*--c1.json")
    kept = json.loads(first_level.read_text())
    assert not list(measurements.glob("sweep--baseline-*--c2.json"))  # the level in flight is not kept
    assert len(json.loads((measurements / "offline.json").read_text())) == 4

    # Other settings in the same folder are refused, before anything is loaded or served.
    other = subprocess.run(bench_args(drafter, out, output_len=16), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert other.returncode == 1
    assert (
        f"{measurements} holds the measurements of an unfinished benchmark with other settings (settings.output_len 24 there, 16 now)"
    ) in other.stderr
    assert json.loads(first_level.read_text()) == kept  # nothing discarded

    # The same command again resumes: the offline reference and the kept level are read back.
    again = subprocess.run(bench_args(drafter, out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "resuming the benchmark begun " in again.stdout
    assert "offline reference: 4 of 4 prompts kept from an earlier run" in again.stdout
    assert "served sweep: baseline at concurrency [2] (c=1 kept from an earlier run)" in again.stdout
    report = json.loads((out / "report.json").read_text())
    baseline = next(r for r in report["runs"] if r["label"] == "baseline")
    assert [lv["concurrency"] for lv in baseline["levels"]] == [1, 2]
    assert baseline["levels"][0]["wall_s"] == kept["level"]["wall_s"]  # the kept measurement, not a new one
    assert all(lv["num_requests"] == 4 and lv["output_tokens"] == 4 * 24 for r in report["runs"] for lv in r["levels"])
    assert any(n.startswith("resumed: ") for n in report["notes"])
    assert json.loads((measurements / "state.json").read_text())["complete"] is True
    assert not list((runs / "servers").glob("port-*.json"))  # every server stopped
