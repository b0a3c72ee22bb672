"""The warm start's gate under every CPU cap this host can take (eagle_assets_tests/cpu_caps.py):
the trainer keeps the better of a fine-tune and its parent, and calls a fine-tune worse only when
it is clearly worse, whichever kernels torch and oneDNN run. Each cap runs in a process of its own
(the caps are read when torch first computes), on a tiny target in fp32."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle_assets_tests.cpu_caps import ATEN_CAPABILITY, CAPS, capped_environment


@pytest.mark.parametrize("cap", CAPS)
def test_the_gate_keeps_the_better_drafter_under_every_cpu_cap(cap, tmp_path):
    env = capped_environment(cap) | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "eagle_assets_tests.drafter.gate_child", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["aten"] == ATEN_CAPABILITY[cap]

    # A fine-tune that changed nothing measurable is kept, as trained.
    gentle = result["gentle"]
    assert (gentle["comparison"]["verdict"], gentle["exported"], gentle["parent_weights"]) == ("better", "fine-tune", False)
    assert gentle["comparison"]["difference"] == 0.0

    # One that costs a little: the parent is exported instead, and the run goes on.
    slight = result["slight"]
    assert (slight["comparison"]["verdict"], slight["exported"], slight["parent_weights"]) == ("within_noise", "parent", True)
    assert slight["comparison"]["difference"] < 0 <= slight["comparison"]["high"]
    assert slight["val_al"] == pytest.approx(slight["comparison"]["parent_al"])

    # One that wrecks the parent: clearly worse, the parent exported.
    wrecking = result["wrecking"]
    assert (wrecking["comparison"]["verdict"], wrecking["exported"], wrecking["parent_weights"]) == ("worse", "parent", True)
    assert wrecking["comparison"]["high"] < 0 and wrecking["comparison"]["samples"] >= 8
