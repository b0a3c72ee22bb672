"""A killed extraction leaves no visible partial shard, and a rerun completes it identically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name
from eagle_assets.hidden_states.extract import extract_all
from eagle_assets.hidden_states.reader import open_shards
from eagle_assets.paths import PROJECT_ROOT

from .extract_child import SETTINGS, toy_decoder
from .test_extract import tree_digest


def test_sigkill_mid_shard_leaves_no_partial_shard_and_rerun_completes(corpus_dir, fingerprint, tmp_path):
    out = tmp_path / "hs"
    child = subprocess.Popen(
        [sys.executable, "-m", "eagle_assets_tests.hidden_states.extract_child", str(corpus_dir), str(out), fingerprint],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in child.stdout:  # "shard batch num_batches"
            shard, batch, _ = map(int, line.split())
            if (shard, batch) == (1, 1):  # shard 0 done, shard 1 half written
                break
        else:
            raise AssertionError(f"the child exited early with code {child.wait()}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL

    leftovers = [p for p in out.iterdir() if p.name.startswith(f".{shard_name(1)}.")]
    assert len(leftovers) == 1 and (leftovers[0] / SHARD_STATES_FILE).is_file()  # it was mid-write
    assert not (leftovers[0] / SHARD_MANIFEST_FILE).exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [shard_name(0)]
    assert [s.manifest.shard for s in open_shards(out)] == [0]
    kept = (out / shard_name(0) / SHARD_STATES_FILE).stat()

    model = toy_decoder()  # the child's weights: same seed
    results = extract_all(model, str(corpus_dir), out, SETTINGS, target_fingerprint=fingerprint)
    assert [r.built for r in results] == [False, True, True]
    assert sorted(p.name for p in out.iterdir()) == [shard_name(i) for i in range(3)]  # leftovers gone
    now = (out / shard_name(0) / SHARD_STATES_FILE).stat()
    assert (now.st_ino, now.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)

    clean = tmp_path / "clean"
    extract_all(model, str(corpus_dir), clean, SETTINGS, target_fingerprint=fingerprint)
    assert tree_digest(out) == tree_digest(clean)
