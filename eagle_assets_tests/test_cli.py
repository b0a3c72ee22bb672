"""The command line refuses bad input before any long work, with a message and no traceback,
and never loses an earlier result."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from eagle_assets.cli import app


@pytest.fixture
def target(tiny_target):
    return tiny_target


@pytest.fixture
def engine_env(tmp_path, monkeypatch):
    """An engine environment that exists as far as the checks before a benchmark can tell."""
    venv = tmp_path / "engine"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 3\n")
    monkeypatch.setenv("EAGLE_ASSETS_VLLM_VENV", str(venv))
    return venv


def drafter_folder(tmp_path, **config) -> str:
    folder = tmp_path / "drafter-vllm"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    # A refusal exits through typer, never through an exception's traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_bench_refuses_k_0_instead_of_serving_the_trained_k(tmp_path, target):
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "-k", "0")
    assert result.exit_code == 1
    assert "-k 0: the drafter drafts at least 1 token per step" in result.output


def test_bench_keeps_an_earlier_report_unless_told_to_replace_it(tmp_path, target, engine_env):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("an earlier benchmark")
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--out", str(out))
    assert result.exit_code == 1
    assert f"{out} already holds a report (report.md): give another --out, or --overwrite to replace it" in result.output
    assert (out / "report.md").read_text() == "an earlier benchmark"

    afile = tmp_path / "afile"
    afile.write_text("x")
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--out", str(afile))
    assert result.exit_code == 1 and f"--out {afile} is a file: give a folder for the report" in result.output
    assert afile.read_text() == "x"


def test_bench_without_an_engine_env_says_so_before_the_offline_reference(tmp_path, target, monkeypatch):
    monkeypatch.setenv("EAGLE_ASSETS_VLLM_VENV", str(tmp_path / "no-engine"))
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert f"no vLLM environment at {tmp_path / 'no-engine'}: run `make setup`" in result.output
    assert not (tmp_path / "r").exists()


def test_bench_refuses_a_drafter_of_another_target_before_loading_anything(tmp_path, target, engine_env):
    drafter = drafter_folder(
        tmp_path, architectures=["LlamaForCausalLMEagle3"], hidden_size=32, target_hidden_size=32, eagle_aux_hidden_state_layer_ids=[1, 2, 3]
    )
    result = invoke("bench", "--drafter", drafter, "--target", str(target), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert f"{drafter} does not fit the target {target}" in result.output
    assert "[hidden_size] drafter target_hidden_size is 32 but the target's hidden size is 64" in result.output
    assert not (tmp_path / "r").exists()


def test_bench_names_a_corrupt_training_summary_and_an_unknown_target(tmp_path, target):
    drafter = drafter_folder(tmp_path)
    (tmp_path / "summary.json").write_text("{not json")
    result = invoke("bench", "--drafter", drafter, "--target", str(target))
    assert result.exit_code == 1
    assert f"{tmp_path / 'summary.json'}: the trainer's summary of this drafter is not valid JSON" in result.output
    assert "remove it or move it aside, and give -k yourself" in result.output

    (tmp_path / "summary.json").unlink()
    result = invoke("bench", "--drafter", drafter, "--target", "no-such-target")
    assert result.exit_code == 1 and "target 'no-such-target' is neither a preset" in result.output


def test_serve_refuses_k_0_with_a_drafter_and_a_port_out_of_range(tmp_path):
    result = invoke("serve", "--drafter", drafter_folder(tmp_path), "-k", "0")
    assert result.exit_code == 1 and "-k 0: the drafter drafts at least 1 token per step" in result.output
    result = invoke("serve", "--port", "70000")
    assert result.exit_code == 2 and "less than or equal to 65535" in result.output


def test_bench_refuses_more_prompts_than_mt_bench_has_and_none(tmp_path, target):
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--num-prompts", "81")
    assert result.exit_code == 1 and "--num-prompts 81: MT-Bench has 80 first turns; give at most that" in result.output
    result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--num-prompts", "-3")
    assert result.exit_code == 1 and "--num-prompts -3: give at least 1 prompt" in result.output


def test_plan_refuses_no_aux_layers():
    result = invoke("plan", "--samples", "10", "--tokens-per-sample", "100", "--num-aux", "0")
    assert result.exit_code == 2  # the option's own range, a usage error
    assert "Invalid value for '--num-aux'" in result.output


def test_preflight_json_stays_json_when_the_target_is_unknown():
    result = invoke("preflight", "--target", "no-such-target", "--json")
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["ok"] is False and body["findings"][0]["code"] == "target"
    assert "target 'no-such-target' is neither a preset" in body["findings"][0]["message"]


def test_setup_refuses_an_unknown_device_without_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_ASSETS_VLLM_VENV", str(tmp_path / "engine"))
    result = invoke("setup", "engine", "--device", "tpu")
    assert result.exit_code == 1 and "unknown engine device 'tpu': the known devices are cpu, cuda" in result.output
    assert not (tmp_path / "engine").exists()


def test_bench_refuses_the_sglang_export_before_the_offline_reference(tmp_path, target, engine_env):
    (tmp_path / "drafter-sglang").mkdir()
    (tmp_path / "drafter-sglang" / "config.json").write_text(json.dumps({"layer_id_numbering": "sglang"}))
    result = invoke("bench", "--drafter", str(tmp_path / "drafter-sglang"), "--target", str(target), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert "[drafter_numbering]" in result.output and "is the SGLang export" in result.output


def test_serve_refuses_one_k_and_a_k_schedule_together(tmp_path):
    result = invoke("serve", "--drafter", drafter_folder(tmp_path), "-k", "5", "--k-schedule", "1-2:3,3-:0")
    assert result.exit_code == 1
    assert "give one K (-k 5) or a K schedule (--k-schedule 1-2:3,3-:0), not both" in result.output


def test_bench_refuses_a_bad_prompt_file_before_serving_anything(tmp_path, target, monkeypatch):
    # No engine environment: a benchmark that got past its prompts would stop there, saying so;
    # these stop at the prompt file, before any check of the engine, server or drafter.
    monkeypatch.setenv("EAGLE_ASSETS_VLLM_VENV", str(tmp_path / "no-engine"))
    bad = tmp_path / "traffic.jsonl"
    bad.write_text(
        json.dumps({"conversations": [{"from": "human", "value": "hi"}]})
        + "\n"
        + json.dumps({"conversations": [{"from": "tool", "value": "x"}]})
        + "\n"
    )
    (tmp_path / "traffic.csv").write_text("a,b\n")
    for path, message in (
        (bad, f"{bad} line 2: turn 0 is from 'tool'"),
        (tmp_path / "missing.json", f"cannot read prompt file {tmp_path / 'missing.json'}: FileNotFoundError"),
        (tmp_path / "traffic.csv", "unknown prompt file type"),
    ):
        result = invoke("bench", "--drafter", drafter_folder(tmp_path), "--target", str(target), "--out", str(tmp_path / "r"), "--prompts", str(path))
        assert result.exit_code == 1 and message in result.output, result.output
        assert "no vLLM environment" not in result.output and not (tmp_path / "r").exists()


def test_bench_takes_a_users_prompts_that_fit_and_refuses_more_than_there_are(tmp_path, smollm2_path, monkeypatch):
    monkeypatch.setenv("EAGLE_ASSETS_VLLM_VENV", str(tmp_path / "no-engine"))
    prompts = tmp_path / "traffic.txt"
    prompts.write_text("How do tides work?\n" + "word " * 3000 + "\nWhat is a B-tree?\n")
    args = ("bench", "--drafter", drafter_folder(tmp_path), "--target", str(smollm2_path), "--out", str(tmp_path / "r"), "--prompts", str(prompts))
    result = invoke(*args, "--num-prompts", "3", "--concurrency", "1")
    assert result.exit_code == 1
    assert f"num_prompts=3: {prompts} has 2 distinct prompts; 1 left out: their first turn and the answer do not fit" in result.output
    # Two fit: the prompts pass, and the benchmark goes on to its next check (the engine's environment).
    result = invoke(*args, "--num-prompts", "2", "--concurrency", "1")
    assert result.exit_code == 1 and f"no vLLM environment at {tmp_path / 'no-engine'}" in result.output


def test_corpus_read_prints_what_a_prompt_file_holds_and_drops(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 2+2?"}\n{"prompt": 123}\n{"prompt": "Name a colour."}\n')
    refused = invoke("corpus", "read", str(prompts))
    assert refused.exit_code == 1
    assert f"{prompts} line 2" in refused.output and "`prompt` must be text" in refused.output
    read = invoke("corpus", "read", str(prompts), "--skip-bad")
    assert read.exit_code == 0, read.output
    summary = json.loads(read.stdout)
    assert (summary["records"], summary["prompts_read"], summary["dropped"]) == (3, 2, {"invalid": 1}), summary


def test_show_report_prints_a_saved_reports_summary_and_refuses_another_file(tmp_path):
    not_a_report = tmp_path / "report.json"
    not_a_report.write_text('{"levels": []}')
    result = invoke("show", "report", str(tmp_path))
    assert result.exit_code == 1
    assert f"{not_a_report} is not a benchmark report" in result.output
    missing = invoke("show", "report", str(tmp_path / "nowhere"))
    assert missing.exit_code == 1 and "nowhere" in missing.output


def test_show_counters_prints_a_servers_speculation_counters_with_its_key(monkeypatch):
    from eagle_assets_tests.http_stub import JsonHandler, StubServer

    labels = 'engine="0",model_name="m"'
    text = (
        f"vllm:spec_decode_num_drafts_total{{{labels}}} 10.0\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} 30.0\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} 12.0\n"
        + "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{k}"}} {n}.0\n' for k, n in enumerate((7, 4, 1)))
    )
    keys = []

    class Metrics(JsonHandler):
        def do_GET(self):
            keys.append(self.headers.get("Authorization"))
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = StubServer(Metrics)
    monkeypatch.setenv("EAGLE_ASSETS_SERVER_API_KEY", "s3cret")
    try:
        result = invoke("show", "counters", server.url)
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "drafts 10  draft tokens 30  accepted 12",
        "AL 2.200  draft acceptance rate 40.0%  p_k [0.700, 0.400, 0.100]",
    ]
    assert keys == ["Bearer s3cret"]
    gone = invoke("show", "counters", server.url)  # closed: nothing listens there now
    assert gone.exit_code == 1 and f"could not scrape {server.url}/metrics" in gone.output


def test_dev_relock_check_and_setup_lock_refuse_or_report_without_writing(tmp_path):
    from eagle_assets.defs.code_versions import LOCK_FILE

    before = LOCK_FILE.read_bytes()
    checked = invoke("dev", "relock", "--check")
    assert LOCK_FILE.read_bytes() == before  # --check writes nothing
    assert checked.exit_code == 0 and "every asset's code matches the lock" in checked.output, checked.output
    refused = invoke("setup", "lock", "--device", "cpu", "--venv", str(tmp_path / "no-venv"))
    assert refused.exit_code == 1 and f"--venv {tmp_path / 'no-venv'} has no bin/python" in refused.output
