"""Disk arithmetic: the Kimi-K2.5 plan matches the seeds, the space check names what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eagle_assets.formats import hidden_state_bytes_per_token
from eagle_assets.hidden_states.budget import check_free_space, plan, predict_bytes, reservations_dir
from eagle_assets.hidden_states.reader import open_shards
from eagle_assets.hidden_states.writer import ShardLayout


def test_kimi_plan_lands_on_the_seeds_828_gb():
    p = plan("kimi-k2.5", samples=10_000, tokens_per_sample=1_450)
    assert (p.num_aux, p.hidden_size, p.bytes_per_token) == (3, 7168, 57_349)
    assert p.hidden_state_bytes == pytest.approx(828e9, rel=0.05)
    assert p.extraction_hours(3_165) == pytest.approx(1.27, abs=0.01)  # the seeds' extraction rate
    assert any("GB" in line for line in p.lines())


def test_prediction_bounds_real_shards_tightly(corpus_dir, fingerprint, tmp_path):
    from eagle_assets.hidden_states.extract import extract_all
    from eagle_assets_tests.hidden_states.extract_child import SETTINGS, toy_decoder

    extract_all(toy_decoder(), str(corpus_dir), tmp_path, SETTINGS, target_fingerprint=fingerprint)
    shards = open_shards(tmp_path)
    tokens, samples = sum(s.num_tokens for s in shards), sum(len(s) for s in shards)
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    predicted = predict_bytes(tokens, 3, 32, samples, len(shards))
    assert on_disk <= predicted <= on_disk * 1.5  # tiny shards: overheads dominate
    assert predict_bytes(10**6, 3, 32) == 10**6 * hidden_state_bytes_per_token(3, 32)
    big = ShardLayout(num_samples=100, num_tokens=145_000, num_aux=3, hidden_size=7168, aux_layer_ids=(2, 30, 58))
    assert big.file_bytes() <= predict_bytes(145_000, 3, 7168, 100, 1) <= big.file_bytes() * 1.001


def test_check_free_space_names_needed_free_and_destination(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    # A destination that does not exist yet is checked on its nearest existing parent.
    assert check_free_space(tmp_path / "not" / "yet" / "made", 1) == pytest.approx(free, abs=1e9)
    with pytest.raises(OSError, match=rf"hidden states at {tmp_path}/out: they need {free * 2:,} bytes .* only [\d,]+ bytes"):
        check_free_space(tmp_path / "out", free * 2)


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of a given size under tmp_path (unmounted after); skips where mounting is not allowed."""
    import subprocess

    mounted = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True)


def _shard_bytes(corpus_dir, fingerprint) -> list[int]:
    from eagle_assets.hidden_states.corpus_io import load_shard_samples
    from eagle_assets.hidden_states.extract import Extractor
    from eagle_assets_tests.hidden_states.reserve_child import SETTINGS, model

    extractor = Extractor(model(), SETTINGS)
    try:
        return [
            extractor.layout(load_shard_samples(str(corpus_dir), i, 2, extractor.vocab_size, fingerprint).token_counts).file_bytes() for i in (0, 1)
        ]
    finally:
        extractor.close()


def test_the_stage_is_refused_before_its_first_shard_where_the_disk_holds_one(corpus_dir, fingerprint, small_disk):
    """The whole stage's bytes are reserved before its first shard: on a filesystem that holds
    either shard alone and not both, nothing is written, not even the first shard."""
    from eagle_assets.hidden_states.extract import extract_all
    from eagle_assets_tests.hidden_states.reserve_child import SETTINGS, model

    need = _shard_bytes(corpus_dir, fingerprint)
    disk = small_disk(need[0] + need[1] - min(need) // 4)
    out = disk / "hidden_states"
    with pytest.raises(OSError, match=rf"they need {need[0] + need[1]:,} bytes"):
        extract_all(model(), str(corpus_dir), out, SETTINGS, target_fingerprint=fingerprint)
    assert not out.exists() or not any(out.iterdir())  # no shard, no staging folder
    assert not list(reservations_dir(out).glob("*.json"))


def test_a_second_writer_sees_the_stages_reservation_against_a_disk_that_holds_one(corpus_dir, fingerprint, tmp_path, small_disk):
    """A hidden-state run and another writer into the same folder (a second run, say), side by
    side, on a filesystem with room for either alone and not for both. A shard's file is sparse
    until its rows land, so free space alone would pass both and the disk would fill midway; with
    the stage's reservation the second is refused at once, naming the first, writing nothing, and
    the first finishes."""
    import subprocess
    import sys

    from eagle_assets.paths import PROJECT_ROOT

    need = _shard_bytes(corpus_dir, fingerprint)
    disk = small_disk(need[0] + need[1] - min(need) // 4)  # either fits alone, both do not
    assert min(need) < shutil.disk_usage(disk).free < need[0] + need[1]
    out = disk / "hidden_states"

    def writer(shard: int, go: Path) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "eagle_assets_tests.hidden_states.reserve_child", str(corpus_dir), str(out), fingerprint, str(shard), str(go)]
        return subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    go = tmp_path / "go"
    first = writer(0, go)
    try:
        assert first.stdout.readline().strip() == "writing"  # its shard is reserved and half written
        go_second = tmp_path / "go-second"
        go_second.touch()
        second = writer(1, go_second)
        said = second.stdout.read().strip()
        assert second.wait() == 0
        assert (
            said.startswith("refused: not enough free disk space")
            and "reserved by what is being written there now (1 shard(s) of hidden_states)" in said
        ), said
        assert not list(out.glob(".shard-00001.*")) and not (out / "shard-00001").exists()  # nothing of it written
        go.touch()
        assert first.stdout.read().strip() == "done"
        assert first.wait() == 0
    finally:
        go.touch()
        first.kill()
    assert [s.manifest.shard for s in open_shards(out)] == [0]
    assert not list(reservations_dir(out).glob("*.json"))  # released once committed


def test_what_is_left_to_extract_is_known_before_the_source_starts(corpus_dir, fingerprint, tmp_path):
    """`bytes_to_extract` (checked before an extraction server loads) is what `extract_all` then
    writes: every shard's bytes at first, none once they are complete, one shard's after it is removed."""
    from eagle_assets.hidden_states.extract import bytes_to_extract, extract_all
    from eagle_assets_tests.hidden_states.reserve_child import HIDDEN, SETTINGS, model

    need = _shard_bytes(corpus_dir, fingerprint)
    assert bytes_to_extract(tmp_path, str(corpus_dir), SETTINGS, 2, HIDDEN, fingerprint) == sum(need)
    extract_all(model(), str(corpus_dir), tmp_path, SETTINGS, target_fingerprint=fingerprint)
    assert bytes_to_extract(tmp_path, str(corpus_dir), SETTINGS, 2, HIDDEN, fingerprint) == 0
    shutil.rmtree(tmp_path / "shard-00001")
    assert bytes_to_extract(tmp_path, str(corpus_dir), SETTINGS, 2, HIDDEN, fingerprint) == need[1]
