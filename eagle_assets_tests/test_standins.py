"""The seed-architecture stand-ins: hub layouts that transformers loads and vLLM serves, alike.

Real parts throughout: the stand-ins built once per session (`standin_paths`, conftest.py),
transformers' own loaders, and one real vLLM CPU server for the Kimi-K2.5 layout.
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import torch
from safetensors.torch import load_file

from eagle_assets.checked_reads import read_safetensors_header
from eagle_assets.targets import get_preset
from eagle_assets.targets.standins import (
    BUILD_RECORD,
    DEEPSEEK_STANDIN,
    HUB_TEXT_FIELDS,
    KIMI_STANDIN,
    TEXT_SHAPE,
    chat_prompt_ids,
    distinct_share,
    greedy_answers,
    held_out_prompts,
    new_language_model,
    top2_margins,
)

EOS = TEXT_SHAPE["eos_token_id"]

# Greedy answers to held-out prompts (benchmarks/results/standin_quality_cpu2_2026-12-04.md, 16
# prompts of 64 tokens): SmolLM2 writes a distinct-token share of 0.62, the stand-in 0.44 and its
# random initial weights 0.17 (8 prompts of 48 tokens: 0.57 and 0.23). The floor sits between
# the stand-in and random weights, with room on both sides.
DISTINCT_SHARE_FLOOR = 0.35
# Top-2 logit gaps under 1e-3 are near-ties that fp32 rounding between engines can flip; the
# stand-in has almost none along its answers.
NEAR_TIE_SHARE_CEILING = 0.02


@pytest.fixture(scope="module")
def deepseek(standin_paths):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(standin_paths[DEEPSEEK_STANDIN], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def kimi(standin_paths):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(standin_paths[KIMI_STANDIN], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompt_ids(standin_paths) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(standin_paths[DEEPSEEK_STANDIN])
    return [chat_prompt_ids(tokenizer, p) for p in held_out_prompts(8)]


def test_both_layouts_load_and_give_identical_logits(deepseek, kimi, prompt_ids, one_thread):
    assert type(deepseek).__name__ == "DeepseekV3ForCausalLM"
    assert type(kimi).__name__ == "Kimi_K25ForConditionalGeneration"
    ids = torch.tensor([prompt_ids[0]])
    with torch.inference_mode():
        a, b = deepseek(ids).logits, kimi(input_ids=ids).logits
    assert a.dtype == b.dtype == torch.float32 and a.shape == (1, ids.shape[1], TEXT_SHAPE["vocab_size"])
    assert torch.equal(a, b)


def test_weights_are_in_the_hubs_layouts(standin_paths):
    deepseek = read_safetensors_header(standin_paths[DEEPSEEK_STANDIN] / "model.safetensors")
    deepseek.pop("__metadata__", None)
    layers = TEXT_SHAPE["num_hidden_layers"]
    assert "model.layers.0.mlp.gate_proj.weight" in deepseek  # first_k_dense_replace = 1: dense
    for layer in range(1, layers):
        prefix = f"model.layers.{layer}.mlp."
        for e in range(TEXT_SHAPE["n_routed_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"{prefix}experts.{e}.{proj}.weight" in deepseek
        assert {f"{prefix}gate.weight", f"{prefix}gate.e_score_correction_bias", f"{prefix}shared_experts.up_proj.weight"} <= set(deepseek)
        assert f"{prefix}experts.gate_up_proj" not in deepseek  # transformers' fused in-memory name
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(deepseek)
    assert {info["dtype"] for name, info in deepseek.items() if "e_score_correction_bias" not in name} == {"BF16"}

    kimi = read_safetensors_header(standin_paths[KIMI_STANDIN] / "model.safetensors")
    kimi.pop("__metadata__", None)
    language = {name for name in kimi if name.startswith("language_model.")}
    assert language == {f"language_model.{name}" for name in deepseek}
    others = set(kimi) - language
    assert others and all(n.startswith(("vision_tower.", "mm_projector.")) for n in others), sorted(others)
    assert any(n.startswith("vision_tower.patch_embed.") for n in others)
    assert not any(".blocks." in n for n in language)  # transformers' save_pretrained renames layers so

    # The same language model in both: the tensors are equal.
    a = load_file(standin_paths[DEEPSEEK_STANDIN] / "model.safetensors")
    b = load_file(standin_paths[KIMI_STANDIN] / "model.safetensors")
    assert all(torch.equal(t, b[f"language_model.{n}"]) for n, t in a.items())
    assert a["model.layers.1.mlp.gate.e_score_correction_bias"].abs().max() > 0  # routing bias in use


def test_configs_are_in_the_hubs_form(standin_paths):
    text = json.loads((standin_paths[DEEPSEEK_STANDIN] / "config.json").read_text())
    assert text["architectures"] == ["DeepseekV3ForCausalLM"] and text["model_type"] == "deepseek_v3"
    assert {k: text[k] for k in HUB_TEXT_FIELDS} == HUB_TEXT_FIELDS
    assert (text["topk_method"], text["scoring_func"], text["rope_scaling"]["type"]) == ("noaux_tc", "sigmoid", "yarn")
    assert not {"rope_parameters", "qk_head_dim", "head_dim", "dtype"} & set(text)
    assert (text["kv_lora_rank"], text["qk_rope_head_dim"], text["qk_nope_head_dim"], text["v_head_dim"]) == (512, 64, 128, 128)

    kimi = json.loads((standin_paths[KIMI_STANDIN] / "config.json").read_text())
    assert kimi["architectures"] == ["KimiK25ForConditionalGeneration"] and kimi["model_type"] == "kimi_k25"
    assert kimi["text_config"] == {**text, "model_type": "kimi_k2"}
    assert (standin_paths[KIMI_STANDIN] / "preprocessor_config.json").is_file()
    assert all(
        0 <= kimi[k] < TEXT_SHAPE["vocab_size"]
        for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "media_placeholder_token_id")
    )


def test_folders_resolve_to_the_stand_in_presets(standin_paths):
    from eagle_assets.targets.embedded import resolve_target

    for name, folder in standin_paths.items():
        preset, resolved = resolve_target(folder, log=lambda m: None)
        assert (preset.name, resolved) == (name, folder)
        assert resolve_target(name, log=lambda m: None) == (get_preset(name), folder)
    assert get_preset(KIMI_STANDIN).trust_remote_code and not get_preset(DEEPSEEK_STANDIN).trust_remote_code


def test_kimi_tokenizer_is_the_hubs_remote_code_and_the_deepseek_layout_shares_its_vocabulary(standin_paths):
    from transformers import AutoTokenizer

    from eagle_assets.corpus.target import load_tokenizer
    from eagle_assets.targets.standins import NUM_RANKS, TOKENIZER_REVISION

    folder = standin_paths[KIMI_STANDIN]
    assert (folder / "tiktoken.model").is_file() and not (folder / "tokenizer.json").exists()
    assert json.loads((folder / BUILD_RECORD).read_text())["tokenizer_revision"] == TOKENIZER_REVISION == "old"
    tokenizer = load_tokenizer(folder, trust_remote_code=True)
    assert type(tokenizer).__name__ == "TikTokenTokenizer" and len(tokenizer) == TEXT_SHAPE["vocab_size"] == NUM_RANKS + 256
    deepseek = AutoTokenizer.from_pretrained(standin_paths[DEEPSEEK_STANDIN])
    prompt = held_out_prompts(1)[0]
    assert chat_prompt_ids(tokenizer, prompt) == chat_prompt_ids(deepseek, prompt)
    assert chat_prompt_ids(tokenizer, prompt)[-1] == tokenizer.convert_tokens_to_ids("<think>") == NUM_RANKS + 22
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == EOS  # a turn's end is where generation stops


def test_greedy_answers_are_varied_and_peaked(deepseek, prompt_ids, one_thread):
    answers = greedy_answers(deepseek, prompt_ids, 48, batch_size=len(prompt_ids), pad_id=EOS)
    gaps = top2_margins(deepseek, prompt_ids, answers)
    assert distinct_share(answers) > DISTINCT_SHARE_FLOOR, answers
    assert (gaps < 1e-3).float().mean() < NEAR_TIE_SHARE_CEILING

    # The same architecture untrained (random weights, stored the same way) repeats itself, and
    # its decisions are an order of magnitude less clear (median top-2 gap ~0.14 against ~1.7).
    untrained = new_language_model(seed=0).to(torch.bfloat16).float().eval()
    untrained_answers = greedy_answers(untrained, prompt_ids, 48, batch_size=len(prompt_ids), pad_id=EOS)
    untrained_gaps = top2_margins(untrained, prompt_ids, untrained_answers)
    print(
        f"distinct-token share {distinct_share(answers):.3f} (untrained {distinct_share(untrained_answers):.3f}); "
        f"median top-2 gap {gaps.median():.3f} (untrained {untrained_gaps.median():.3f})"
    )
    assert distinct_share(untrained_answers) < DISTINCT_SHARE_FLOOR
    assert untrained_gaps.median() * 4 < gaps.median()


def test_pull_is_a_no_op_and_refuses_a_mixed_pair(standin_paths, tmp_path):
    from typer.testing import CliRunner

    from eagle_assets.cli import app
    from eagle_assets.targets.embedded import _record_checksums, _standins_verified

    stamps = {n: (f / "model.safetensors").stat().st_mtime_ns for n, f in standin_paths.items()}
    out = CliRunner().invoke(app, ["target", "pull", KIMI_STANDIN])
    assert out.exit_code == 0 and out.output.strip().endswith(str(standin_paths[KIMI_STANDIN]))
    assert {n: (f / "model.safetensors").stat().st_mtime_ns for n, f in standin_paths.items()} == stamps

    copies = {n: shutil.copytree(f, tmp_path / n) for n, f in standin_paths.items()}
    assert _standins_verified(copies)
    # A Kimi folder from another build (as a crash between the two renames would leave):
    record = json.loads((copies[KIMI_STANDIN] / BUILD_RECORD).read_text())
    record["language_model_sha256"] = "0" * 64
    (copies[KIMI_STANDIN] / BUILD_RECORD).write_text(json.dumps(record))
    _record_checksums(copies[KIMI_STANDIN])
    assert not _standins_verified(copies)

    # A pair from one build of an older recipe (what a build writes has changed since) is stale.
    for name, folder in copies.items():
        record = json.loads((standin_paths[name] / BUILD_RECORD).read_text())
        (folder / BUILD_RECORD).write_text(json.dumps({**record, "layout": record["layout"] - 1}))
        _record_checksums(folder)
    assert not _standins_verified(copies)


@pytest.mark.engine
def test_vllm_serves_the_kimi_stand_in_as_transformers_does(standin_paths, kimi, engine_python, one_thread):
    """One real server for the Kimi layout (trust_remote_code from its preset): its greedy ids for
    a held-out prompt equal transformers' fp32 greedy ids, all 32 of them. The stand-in's logits
    are peaked along its answers (no top-2 gap under 1e-3 in test_greedy_answers_are_varied_and_peaked's
    measure, median gap of several logits), far above the ~1e-6 relative difference the two fp32
    implementations show, so any difference is a fault, not rounding. Where the host serves MLA
    in bf16 (an AMX host's AMX_MLA backend), the two may part only where transformers' top-2
    margin is within bf16's rounding (`greedy_check.NEAR_TIE_MARGIN`), and agree before it."""
    from eagle_assets.bench.greedy_check import NEAR_TIE_MARGIN
    from eagle_assets.corpus.target import load_tokenizer
    from eagle_assets.engines.logs import engine_kernels
    from eagle_assets.engines.serving import launch_vllm
    from eagle_assets.engines.vllm_launch import served_dtype
    from eagle_assets_tests.cpu_caps import NATIVE, mla_backend

    folder = standin_paths[KIMI_STANDIN]
    tokenizer = load_tokenizer(folder, trust_remote_code=True)
    prompt = held_out_prompts(1)[0]
    prompt_ids = chat_prompt_ids(tokenizer, prompt)
    expected = greedy_answers(kimi, [prompt_ids], 32, batch_size=1, pad_id=EOS)[0]

    with launch_vllm(folder, log=lambda m: None) as server:
        assert server.preset.name == KIMI_STANDIN and "--trust-remote-code" in server.preset.engine_args()
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 32,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        request = urllib.request.Request(f"{server.base_url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as resp:
            answer = json.loads(resp.read())
        assert f"backend {mla_backend(NATIVE)}" in engine_kernels(server.log_path)

    assert answer["prompt_token_ids"] == prompt_ids
    served = answer["choices"][0]["token_ids"]
    assert answer["choices"][0]["message"]["content"].strip()

    def without_eos(ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == EOS else ids

    assert len(expected) >= 16
    served, expected = without_eos(served), without_eos(expected)
    dtype = served_dtype(folder, "cpu")
    if dtype == "float32":
        assert served == expected
        return
    parted = next((i for i, (a, b) in enumerate(zip(served, expected)) if a != b), None)
    if parted is not None:
        with torch.no_grad():
            margin = float(top2_margins(kimi, [prompt_ids], [expected])[parted])
        assert margin <= NEAR_TIE_MARGIN[dtype], (parted, margin)


def test_extraction_loads_the_kimi_layout_spread_by_device_map_within_max_memory(standin_paths, deepseek, prompt_ids, one_thread):
    """The hidden_state_shards asset's Hugging Face load of a Kimi-K2.5 folder: its wrapper class,
    remote code, accelerate's device_map="auto" under a per-device memory cap, and grouped experts;
    the states it gives are the DeepSeek-V3 layout's, for the same language model."""
    from eagle_assets.hidden_states.extract import load_target, target_parts

    model, tokenizer = load_target(
        standin_paths[KIMI_STANDIN], device="auto", dtype=torch.float32, max_memory_per_device="4GiB", trust_remote_code=True
    )
    assert type(model).__name__ == "Kimi_K25ForConditionalGeneration" and type(tokenizer).__name__ == "TikTokenTokenizer"
    assert {p.device.type for p in model.parameters()} == {"cpu"}  # no GPU here: accelerate's map is the host
    assert model.config.get_text_config()._experts_implementation == "grouped_mm"
    parts = target_parts(model)
    assert (parts.num_layers, parts.hidden_size) == (TEXT_SHAPE["num_hidden_layers"], TEXT_SHAPE["hidden_size"])
    ids = torch.tensor([prompt_ids[0]])
    with torch.no_grad():
        got = parts.base(input_ids=ids, output_hidden_states=True).hidden_states
        want = deepseek.model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(got) == len(want) and all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(got, want))

    # The cap reaches accelerate: one below the model's size is refused, saying what to change.
    with pytest.raises(ValueError, match="does not fit on the host at max_memory_per_device=20MiB.*source: engine"):
        load_target(standin_paths[KIMI_STANDIN], device="auto", dtype=torch.float32, max_memory_per_device="20MiB", trust_remote_code=True)


def test_preflight_refuses_a_kimi_config_without_the_field_vllms_eagle3_proposer_reads(standin_paths, tmp_path):
    from eagle_assets.engines.preflight import PreflightReport, check_drafter
    from eagle_assets_tests.drafters import write_random_drafter

    target = json.loads((standin_paths[KIMI_STANDIN] / "config.json").read_text())
    drafter = write_random_drafter(tmp_path / "drafter", target["text_config"], aux_layer_ids=(2, 4, 5))

    def codes(cfg: dict, engine: str | None) -> set[str]:
        report = PreflightReport()
        check_drafter(cfg, drafter, report, engine)
        return {f.code for f in report.findings}

    assert "kimi_media_placeholder" not in codes(target, "vllm")
    stripped = {k: v for k, v in target.items() if k != "media_placeholder_token_id"}
    assert "kimi_media_placeholder" in codes(stripped, "vllm") and "kimi_media_placeholder" in codes(stripped, None)
    assert "kimi_media_placeholder" not in codes(stripped, "sglang")
