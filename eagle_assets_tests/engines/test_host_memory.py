"""What a CPU server takes of the host's memory, and when several fit at once."""

from __future__ import annotations

import json

from eagle_assets.engines.host_memory import ENGINE_OVERHEAD_BYTES, HEADROOM_BYTES, config_footprint_bytes, server_footprint_bytes, why_not_at_once


def test_server_footprint_counts_the_weights_as_float32_the_cache_and_the_engine(tmp_path):
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    for folder, size in ((target, 3_000_000), (drafter, 500_000)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
        (folder / "model.safetensors").write_bytes(b"\0" * size)
    plain = server_footprint_bytes(target, None, kv_cache_gib=2)
    assert plain == 2 * 3_000_000 + (2 << 30) + ENGINE_OVERHEAD_BYTES  # bf16 on disk, float32 served
    assert server_footprint_bytes(target, drafter, kv_cache_gib=2) == plain + 2 * 500_000
    # From a speculative config: its drafter counts, n-gram and no speculation name none.
    assert config_footprint_bytes(target, {"method": "eagle3", "model": str(drafter)}, 2) == plain + 2 * 500_000
    assert config_footprint_bytes(target, {"method": "ngram"}, 2) == config_footprint_bytes(target, None, 2) == plain


def test_servers_fit_at_once_while_their_sum_and_the_headroom_do():
    gib = 1 << 30
    assert why_not_at_once([3 * gib, 3 * gib], 6 * gib + HEADROOM_BYTES, "cpu") is None
    assert why_not_at_once([3 * gib, 3 * gib], 6 * gib + HEADROOM_BYTES - 1, "cpu").startswith("2 more servers at once")
    assert why_not_at_once([3 * gib, 3 * gib], 6 * gib, "cpu") == ("2 more servers at once need ~7.0 GiB with headroom, and 6.0 GiB is available")
    assert why_not_at_once([], 0, "cpu") is None  # nothing to start
    assert why_not_at_once([3 * gib], None, "cpu") is None  # the host does not say: the start will
    assert why_not_at_once([gib], 64 * gib, "cuda") == "on cuda each vLLM takes most of the accelerator's memory"
