"""Bad inputs, each refused with a message that names it: command-line arguments, environment
variables and files, run for real through the command lines a user types.

Every row runs `eagle-assets ...` (`python -m eagle_assets.cli ...`, the code at ROOT) in a subprocess, on files written for real, and must exit 1 (a refusal) or 2 (a usage error, the
command-line parser's own), print no traceback, and name what was wrong. Nothing here starts a
server or loads a model: a command that would go on to serve is given an input that is refused
first, and every `run` row also points EAGLE_ASSETS_VLLM_VENV at an empty folder, so that a row
whose input is not refused fails at the first launch instead of serving.

    python eagle_assets_tests/test_bad_inputs.py [ROOT]   # the table against the code at ROOT: clear / partial / traceback / accepted
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = ("-m", "eagle_assets.cli")
PLAN = (*CLI, "plan", "--samples", "10", "--tokens-per-sample", "100")
BENCH = (*CLI, "bench", "--drafter", "{drafter}", "--target", "/nonexistent/model", "--out", "{tmp}/bench-report")
# The benchmark on the real target and your prompts: a prompt file that is not refused goes on to find no engine.
BENCH_PROMPTS = (*CLI, "bench", "--drafter", "{drafter}", "--target", "{target}", "--out", "{tmp}/bench-report", "--prompts")
# Your two servers, on a port nothing listens on: a row that is not refused fails to connect.
YOUR_SERVERS = {"EAGLE_ASSETS_SERVER_URL": "http://127.0.0.1:9", "EAGLE_ASSETS_SPECULATIVE_URL": "http://127.0.0.1:9"}
# The corpus generator with good inputs, against a port nothing listens on: each row spoils one.
GEN_ARGS = {"--prompts": "{prompts_ok}", "--out": "{tmp}/corpus", "--server": "http://127.0.0.1:9", "--model": "m", "--tokenizer": "{target}"}


def gen(**spoiled: str) -> tuple[str, ...]:
    """`eagle-assets corpus generate` with GEN_ARGS, the options given replacing or adding to them (`max_tokens="0"`)."""
    options = {**GEN_ARGS, **{"--" + k.replace("_", "-"): v for k, v in spoiled.items()}}
    return (*CLI, "corpus", "generate", *(x for item in options.items() for x in item))


NO_ENGINE = {"EAGLE_ASSETS_VLLM_VENV": "{no_engine}"}
MAGPIE = ("--server", "http://127.0.0.1:9", "--model", "m", "--out", "{tmp}/magpie.jsonl")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    """After the interpreter; `{name}` is replaced by the path of the input file `name`."""
    names: tuple[str, ...]
    """What the message must name (each, in the output)."""
    code: int = 1
    env: dict[str, str] = field(default_factory=dict)
    within_s: float | None = None
    """Refused within this many seconds (before anything slow), where the row says so."""


def run_env(**variables: str) -> dict[str, str]:
    return {**NO_ENGINE, **variables}


CASES = [
    # ---- environment variables -------------------------------------------------------------
    Case("num_shards_abc", (*CLI, "run"), ("EAGLE_ASSETS_NUM_SHARDS", "'abc'"), env=run_env(EAGLE_ASSETS_NUM_SHARDS="abc")),
    Case("num_shards_0", (*CLI, "run"), ("EAGLE_ASSETS_NUM_SHARDS", ">= 1"), env=run_env(EAGLE_ASSETS_NUM_SHARDS="0")),
    Case("num_shards_negative", (*CLI, "run"), ("EAGLE_ASSETS_NUM_SHARDS", "-3"), env=run_env(EAGLE_ASSETS_NUM_SHARDS="-3")),
    Case("num_shards_float", (*CLI, "run"), ("EAGLE_ASSETS_NUM_SHARDS", "'2.5'"), env=run_env(EAGLE_ASSETS_NUM_SHARDS="2.5")),
    Case("automation_maybe", (*CLI, "run"), ("EAGLE_ASSETS_AUTOMATION", "'maybe'"), env=run_env(EAGLE_ASSETS_AUTOMATION="maybe")),
    Case("preset_unknown", (*CLI, "run"), ("EAGLE_ASSETS_PRESET", "'nope'"), env=run_env(EAGLE_ASSETS_PRESET="nope")),
    Case("nproc_0", (*CLI, "run"), ("EAGLE_ASSETS_NPROC_PER_NODE", ">= 1"), env=run_env(EAGLE_ASSETS_NPROC_PER_NODE="0")),
    Case("serve_compiled", (*CLI, "run"), ("EAGLE_ASSETS_SERVE_COMPILED", "'sometimes'"), env=run_env(EAGLE_ASSETS_SERVE_COMPILED="sometimes")),
    Case("target_missing", (*CLI, "run"), ("EAGLE_ASSETS_TARGET", "/nonexistent/model"), env=run_env(EAGLE_ASSETS_TARGET="/nonexistent/model")),
    Case("run_target_missing", (*CLI, "run", "--target", "/nonexistent/model"), ("--target '/nonexistent/model'", "target pull"), env=run_env()),
    Case("run_file_misspelt", (*CLI, "run", "--config", "{run_misspelt}"), ("drafter_checkpoint.epoch: no such setting", "epochs"), env=run_env()),
    Case("run_file_bad_value", (*CLI, "run", "--config", "{run_bad_value}"), ("benchmark_report.num_prompts", "valid integer"), env=run_env()),
    Case(
        "server_url_no_scheme", (*CLI, "run"), ("EAGLE_ASSETS_SERVER_URL", "'localhost:8000'"), env=run_env(EAGLE_ASSETS_SERVER_URL="localhost:8000")
    ),
    Case("data_is_a_device", (*CLI, "run"), ("EAGLE_ASSETS_DATA", "/dev/null"), env=run_env(EAGLE_ASSETS_DATA="/dev/null")),
    Case("data_under_a_file", (*CLI, "run"), ("EAGLE_ASSETS_DATA", "a file"), env=run_env(EAGLE_ASSETS_DATA="{a_file}/data")),
    Case(
        "data_unknown_protocol",
        (*CLI, "run"),
        ("EAGLE_ASSETS_DATA='nope://x'", "Protocol not known: nope"),
        env=run_env(EAGLE_ASSETS_DATA="nope://x"),
    ),
    Case(
        "cache_is_a_url",
        (*CLI, "preflight"),
        ("EAGLE_ASSETS_CACHE='s3://bucket/cache' is a URL", "mounted"),
        env={"EAGLE_ASSETS_CACHE": "s3://bucket/cache"},
    ),
    Case("cache_is_a_device", (*CLI, "preflight"), ("EAGLE_ASSETS_CACHE", "/dev/null"), env={"EAGLE_ASSETS_CACHE": "/dev/null"}),
    Case("cache_is_a_file", (*CLI, "target", "pull"), ("EAGLE_ASSETS_CACHE", "a file"), env={"EAGLE_ASSETS_CACHE": "{a_file}"}),
    Case("runs_is_a_device", (*CLI, "serve", "--stop", "--port", "8000"), ("EAGLE_ASSETS_RUNS", "/dev/null"), env={"EAGLE_ASSETS_RUNS": "/dev/null"}),
    Case(
        "vllm_venv_under_a_device",
        (*CLI, "preflight"),
        ("EAGLE_ASSETS_VLLM_VENV", "/dev/null/venv"),
        env={"EAGLE_ASSETS_VLLM_VENV": "/dev/null/venv"},
    ),
    Case(
        "sglang_venv_is_a_file",
        (*CLI, "preflight", "--engine", "sglang"),
        ("EAGLE_ASSETS_SGLANG_VENV", "a file"),
        env={"EAGLE_ASSETS_SGLANG_VENV": "{a_file}"},
    ),
    Case(
        "server_key_file_missing",
        BENCH,
        ("EAGLE_ASSETS_SERVER_API_KEY_FILE", "/nonexistent/key"),
        env={**YOUR_SERVERS, "EAGLE_ASSETS_SERVER_API_KEY_FILE": "/nonexistent/key"},
        within_s=5,
    ),
    Case(
        "server_key_file_empty",
        BENCH,
        ("EAGLE_ASSETS_SERVER_API_KEY_FILE", "is empty"),
        env={**YOUR_SERVERS, "EAGLE_ASSETS_SERVER_API_KEY_FILE": "{empty_file}"},
        within_s=5,
    ),
    # ---- command-line arguments ----------------------------------------------------------
    Case("plan_rate_inf", (*PLAN, "--generation-tok-s", "inf"), ("--generation-tok-s", "inf")),
    Case("plan_rate_nan", (*PLAN, "--generation-tok-s", "nan"), ("--generation-tok-s", "nan")),
    Case("plan_rate_0", (*PLAN, "--generation-tok-s", "0"), ("--generation-tok-s", "0.0")),
    Case("plan_rate_negative", (*PLAN, "--extraction-tok-s", "-5"), ("--extraction-tok-s", "-5.0")),
    Case("plan_train_rate_inf", (*PLAN, "--train-tok-s-per-gpu", "inf"), ("--train-tok-s-per-gpu", "inf")),
    Case("plan_samples_0", (*CLI, "plan", "--samples", "0", "--tokens-per-sample", "100"), ("--samples",), code=2),
    Case("plan_samples_text", (*CLI, "plan", "--samples", "many", "--tokens-per-sample", "100"), ("--samples", "valid integer"), code=2),
    Case("plan_tokens_negative", (*CLI, "plan", "--samples", "10", "--tokens-per-sample", "-1"), ("--tokens-per-sample",), code=2),
    Case("plan_epochs_0", (*PLAN, "--epochs", "0"), ("--epochs",), code=2),
    Case("plan_val_fraction_1", (*PLAN, "--val-fraction", "1"), ("--val-fraction", "1.0")),
    Case("plan_val_fraction_nan", (*PLAN, "--val-fraction", "nan"), ("--val-fraction", "nan")),
    Case("plan_gpus_0", (*PLAN, "--gpus", "0"), ("--gpus",), code=2),
    Case("plan_num_aux_0", (*PLAN, "--num-aux", "0"), ("--num-aux",), code=2),
    Case("plan_preset_unknown", (*CLI, "plan", "--preset", "nope", "--samples", "10", "--tokens-per-sample", "100"), ("'nope'",)),
    Case("preflight_k_0", (*CLI, "preflight", "--drafter", "{drafter}", "-k", "0"), ("-k",), code=2),
    Case("preflight_drafter_missing", (*CLI, "preflight", "--drafter", "/nonexistent/drafter"), ("/nonexistent/drafter",)),
    Case("preflight_engine_unknown", (*CLI, "preflight", "--engine", "tensorrt"), ("'tensorrt'",)),
    Case("preflight_target_unknown", (*CLI, "preflight", "--target", "nope"), ("'nope'",)),
    Case("run_preset_unknown", (*CLI, "run", "--preset", "nope"), ("'nope'",), env=run_env()),
    Case("serve_schedule_without_drafter", (*CLI, "serve", "--k-schedule", "1-2:3"), ("--k-schedule", "--drafter")),
    Case("serve_k_0", (*CLI, "serve", "--drafter", "{drafter}", "-k", "0"), ("-k 0",)),
    Case("serve_port_70000", (*CLI, "serve", "--port", "70000"), ("--port", "65535"), code=2),
    Case("bench_drafter_missing", (*CLI, "bench", "--drafter", "/nonexistent/drafter"), ("/nonexistent/drafter", "config.json")),
    # bench's own arguments come before the target (here one that is not there) is looked at
    Case("bench_concurrency_0", (*BENCH, "--concurrency", "0"), ("--concurrency (0,): give one or more levels >= 1",), within_s=5),
    Case("bench_too_few_prompts", (*BENCH, "--num-prompts", "2", "--concurrency", "4"), ("--num-prompts 2 cannot keep 4 requests",), within_s=5),
    Case("bench_output_len_1", (*BENCH, "--output-len", "1"), ("--output-len 1",), within_s=5),
    Case("bench_k_repeated", (*BENCH, "-k", "3", "--also-k", "3"), ("repeat a K",), within_s=5),
    Case("bench_offline_reference", (*BENCH, "--offline-reference", "gpu"), ("--offline-reference 'gpu'",), within_s=5),
    Case("bench_stall_timeout_0", (*BENCH, "--stall-timeout", "0"), ("--stall-timeout 0.0",), within_s=5),
    Case(
        "bench_server_without_drafter_server",
        BENCH,
        ("EAGLE_ASSETS_SERVER_URL=http://127.0.0.1:9 is the target alone", "EAGLE_ASSETS_SPECULATIVE_URL"),
        env={"EAGLE_ASSETS_SERVER_URL": "http://127.0.0.1:9"},
        within_s=5,
    ),
    Case(
        "bench_servers_and_also_k",
        (*BENCH, "--also-k", "2"),
        ("--also-k serve(s) configurations launched here",),
        env={"EAGLE_ASSETS_SERVER_URL": "http://127.0.0.1:9", "EAGLE_ASSETS_SPECULATIVE_URL": "http://127.0.0.1:9"},
    ),
    Case("setup_device_unknown", (*CLI, "setup", "engine", "--device", "tpu"), ("'tpu'",)),
    Case("bench_api_key_argument", (*BENCH, "--api-key", "s3cret"), ("--api-key", "EAGLE_ASSETS_SERVER_API_KEY_FILE"), code=2, env=YOUR_SERVERS),
    # ---- files ---------------------------------------------------------------------------
    Case("drafter_dtype_float128", (*CLI, "preflight", "--drafter", "{drafter_float128}"), ("{drafter_float128}/config.json", "float128")),
    Case("drafter_tensor_dtype_bf17", (*CLI, "preflight", "--drafter", "{drafter_bf17}"), ("{drafter_bf17}/model.safetensors", "BF17")),
    Case("drafter_config_not_json", (*CLI, "preflight", "--drafter", "{drafter_not_json}"), ("{drafter_not_json}/config.json", "not valid JSON")),
    Case(
        "drafter_weights_truncated", (*CLI, "preflight", "--drafter", "{drafter_truncated}"), ("{drafter_truncated}/model.safetensors", "truncated")
    ),
    Case("prompt_not_text", (*BENCH_PROMPTS, "{prompt_number}"), ("{prompt_number} line 2", "`prompt` must be text"), env=NO_ENGINE),
    Case("prompt_lone_surrogate", (*BENCH_PROMPTS, "{prompt_surrogate}"), ("{prompt_surrogate} line 3", "lone surrogate"), env=NO_ENGINE),
    Case("prompt_not_utf8", (*BENCH_PROMPTS, "{prompt_latin1}"), ("{prompt_latin1} line 1", "not UTF-8"), env=NO_ENGINE),
    Case("prompt_not_json", (*BENCH_PROMPTS, "{prompt_not_json}"), ("{prompt_not_json} line 2", "not valid JSON"), env=NO_ENGINE),
    Case("prompt_empty", (*BENCH_PROMPTS, "{prompt_empty}"), ("{prompt_empty} line 1", "is empty"), env=NO_ENGINE),
    Case("prompt_no_known_key", (*BENCH_PROMPTS, "{prompt_no_key}"), ("{prompt_no_key} line 1", "cannot tell the file's format"), env=NO_ENGINE),
    Case("prompt_file_missing", (*BENCH_PROMPTS, "/nonexistent/prompts.jsonl"), ("/nonexistent/prompts.jsonl",), env=NO_ENGINE),
    Case("prompt_file_type", (*BENCH_PROMPTS, "{prompt_csv}"), ("{prompt_csv}", "unknown prompt file type"), env=NO_ENGINE),
    # ---- the corpus commands ------------------------------------------------------------------
    Case("read_bad_row", (*CLI, "corpus", "read", "{prompt_number}"), ("{prompt_number} line 2", "`prompt` must be text")),
    Case("read_format_unknown", (*CLI, "corpus", "read", "{prompts_ok}", "--format", "csv"), ("--format", "'csv'", "sharegpt"), code=2),
    Case("magpie_tokenizer_missing", (*CLI, "corpus", "magpie", *MAGPIE, "--tokenizer", "/nonexistent"), ("--tokenizer '/nonexistent'",), code=2),
    Case(
        "magpie_num_prompts_0", (*CLI, "corpus", "magpie", *MAGPIE, "--tokenizer", "{target}", "--num-prompts", "0"), ("--num-prompts", "'0'"), code=2
    ),
    Case("magpie_server_unreachable", (*CLI, "corpus", "magpie", *MAGPIE, "--tokenizer", "{target}"), ("magpie failed", "http://127.0.0.1:9")),
    Case("gen_tokenizer_missing", gen(tokenizer="/nonexistent"), ("--tokenizer '/nonexistent' does not exist",), code=2, within_s=5),
    Case("gen_tokenizer_a_file", gen(tokenizer="{a_file}"), ("is a file, not a folder",), code=2),
    Case("gen_tokenizer_no_tokenizer", gen(tokenizer="{no_engine}"), ("holds no tokenizer",), code=2),
    Case("gen_server_no_scheme", gen(server="localhost:9"), ("'localhost:9' must start with http://",), code=2),
    Case("gen_concurrency_0", gen(concurrency="0"), ("--concurrency", "'0' is not a whole number of at least 1"), code=2),
    Case("gen_max_tokens_0", gen(max_tokens="0"), ("--max-tokens", "'0'"), code=2),
    Case("gen_max_tokens_text", gen(max_tokens="many"), ("--max-tokens", "'many'"), code=2),
    Case("gen_temperature_negative", gen(temperature="-1"), ("--temperature", "'-1'"), code=2),
    Case("gen_timeout_0", gen(timeout="0"), ("--timeout", "'0'"), code=2),
    Case("gen_timeout_nan", gen(timeout="nan"), ("--timeout", "'nan'"), code=2),
    Case("gen_shard_size_0", gen(shard_size="0"), ("--shard-size", "'0'"), code=2),
    Case("gen_retries_negative", gen(retries="-2"), ("--retries", "'-2'"), code=2),
    Case("gen_limit_0", gen(limit="0"), ("--limit", "'0'"), code=2),
    Case("gen_failed_share_2", gen(max_failed_share="2"), ("--max-failed-share", "'2'"), code=2),
    Case("gen_out_a_file", gen(out="{a_file}"), ("--out {a_file} is a file",), code=2),
    Case("gen_out_under_a_device", gen(out="/dev/null/corpus"), ("--out /dev/null/corpus lies under /dev/null",), code=2),
    Case("gen_prompts_missing", gen(prompts="/nonexistent/p.jsonl"), ("corpus generation failed", "/nonexistent/p.jsonl"), within_s=5),
    Case("gen_prompts_bad_row", gen(prompts="{prompt_number}"), ("{prompt_number} line 2", "`prompt` must be text")),
    Case("gen_prompts_mt_bench", gen(prompts="{mt_bench}"), ("is MT-Bench, the evaluation set",)),
    Case("gen_server_unreachable", gen(), ("cannot reach the inference server at http://127.0.0.1:9",)),
]


def write_inputs(folder: Path, target_config: dict, target: Path) -> dict[str, str]:
    """Every input file of the table, written for real; {name: path}. `target` is the target's
    folder (its tokenizer serves the generator's rows)."""
    from eagle_assets.corpus.prompt_record import MT_BENCH_PATH
    from eagle_assets_tests.drafters import write_random_drafter

    folder.mkdir(parents=True, exist_ok=True)
    files = {"tmp": folder, "no_engine": folder / "no-engine", "a_file": folder / "a-file.txt", "empty_file": folder / "empty.txt"}
    files["no_engine"].mkdir(exist_ok=True)
    files["a_file"].write_text("not a folder\n")
    files["empty_file"].write_text("")
    drafter = write_random_drafter(folder / "drafter", target_config)
    files["drafter"] = drafter

    def spoiled(name: str) -> Path:
        copy = folder / name
        shutil.copytree(drafter, copy)
        return copy

    files["drafter_float128"] = spoiled("drafter-float128")
    config = json.loads((drafter / "config.json").read_text())
    (files["drafter_float128"] / "config.json").write_text(json.dumps({**config, "torch_dtype": "float128"}))
    files["drafter_bf17"] = spoiled("drafter-bf17")
    weights = (drafter / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", weights[:8])[0]
    header = weights[8 : 8 + length].replace(b'"BF16"', b'"BF17"', 1)
    (files["drafter_bf17"] / "model.safetensors").write_bytes(weights[:8] + header + weights[8 + length :])
    files["drafter_not_json"] = spoiled("drafter-not-json")
    (files["drafter_not_json"] / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"],')
    files["drafter_truncated"] = spoiled("drafter-truncated")
    (files["drafter_truncated"] / "model.safetensors").write_bytes(weights[: len(weights) // 2])

    prompts = {
        "prompt_number": '{"prompt": "fine"}\n{"prompt": 123}\n',
        "prompt_surrogate": '{"prompt": "fine"}\n\n{"prompt": "half a pair: \\ud800"}\n',  # the JSON escape, as written by a tool
        "prompt_not_json": '{"prompt": "fine"}\n{"prompt": \n',
        "prompt_empty": '{"prompt": "   "}\n',
        "prompt_no_key": '{"text": "no known key"}\n',
    }
    for name, text in prompts.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text(text)
    files["prompt_latin1"] = folder / "prompt_latin1.jsonl"
    files["prompt_latin1"].write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    files["run_misspelt"] = folder / "run_misspelt.yaml"
    files["run_misspelt"].write_text("preset: smollm2-tiny\ndrafter_checkpoint: {epoch: 3}\n")
    files["run_bad_value"] = folder / "run_bad_value.yaml"
    files["run_bad_value"].write_text("benchmark_report: {num_prompts: eight}\n")
    files["prompt_csv"] = folder / "prompts.csv"
    files["prompt_csv"].write_text("prompt\nhi\n")
    files["prompts_ok"] = folder / "prompts_ok.jsonl"
    files["prompts_ok"].write_text('{"prompt": "What is 2+2?"}\n')
    files["mt_bench"], files["target"] = MT_BENCH_PATH, target
    return {name: str(path) for name, path in files.items()}


def run_case(case: Case, files: dict[str, str], root: Path = ROOT) -> subprocess.CompletedProcess:
    """The case's command under the code at `root`, in a private Dagster home and data folder."""
    tmp = Path(files["tmp"])
    keep = ("EAGLE_ASSETS_CACHE", "EAGLE_ASSETS_VLLM_VENV")  # the shared target cache and engine, as the suite uses
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_ASSETS_", "DAGSTER_")) or k in keep}
    env.update(
        PYTHONPATH=str(root),
        COLUMNS="300",
        DAGSTER_HOME=str(tmp / "dagster_home"),
        EAGLE_ASSETS_DATA=str(tmp / "data"),
        EAGLE_ASSETS_RUNS=str(tmp / "runs"),
    )
    env.update({k: v.format(**files) for k, v in case.env.items()})
    argv = [a.format(**files) for a in case.argv]
    started = time.monotonic()
    result = subprocess.run([sys.executable, *argv], env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
    result.seconds = time.monotonic() - started
    return result


def output_of(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr, without colours and the frames of rich's panels, blanks collapsed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + "\n" + result.stderr)
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


STACK_FRAME = re.compile(r'Traceback|File "[^"]+", line \d+')
"""A traceback, Python's or one that Dagster logs without the word."""


def verdict(case: Case, result: subprocess.CompletedProcess, files: dict[str, str]) -> str:
    """clear (the expected exit code, every name in the message), partial, traceback or accepted
    (exit 0, or a run that went ahead until it found no engine to launch)."""
    text = output_of(result)
    if result.returncode == 0 or f"no vLLM environment at {files['no_engine']}" in text:
        return "accepted"
    if STACK_FRAME.search(text):
        return "traceback"
    named = all(n.format(**files) in text for n in case.names)
    return "clear" if named and result.returncode == case.code else "partial"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, smollm2_config, smollm2_path) -> dict[str, str]:
    return write_inputs(tmp_path_factory.mktemp("bad_inputs"), smollm2_config, smollm2_path)


@pytest.fixture(scope="module")
def results(inputs) -> dict[str, subprocess.CompletedProcess]:
    """Every row run once, three at a time (each is mostly an interpreter starting up)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip([c.id for c in CASES], pool.map(lambda case: run_case(case, inputs), CASES)))


def test_the_table_is_large_and_its_ids_unique():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_bad_input_is_refused_with_a_message_naming_it(case, inputs, results):
    result = results[case.id]
    text = output_of(result)
    assert not STACK_FRAME.search(text), text[-3000:]
    assert result.returncode == case.code, (result.returncode, text[-3000:])
    for name in case.names:
        assert name.format(**inputs) in text, (name, text[-3000:])
    if case.within_s is not None:
        assert result.seconds < case.within_s, f"refused after {result.seconds:.1f} s"


def message_of(result) -> str:
    """A failed in-process Dagster run's step errors."""
    return str(result.all_events[-1]) + "".join(e.event_specific_data.error.message for e in result.all_events if e.is_step_failure)


def test_a_run_may_read_prompt_files_only_under_the_allowed_roots(tmp_path, monkeypatch, smollm2_path):
    # A real Dagster run of `prompts` with a file outside the data folder: refused before it is read,
    # naming the setting that allows it; listed in EAGLE_ASSETS_PROMPT_ROOTS, the same file loads.
    import dagster as dg

    from eagle_assets.defs.corpus import prompts
    from eagle_assets.resources.inference_server import InferenceServerResource
    from eagle_assets.resources.storage import StorageResource

    outside = tmp_path / "elsewhere" / "prompts.jsonl"
    outside.parent.mkdir()
    outside.write_text('{"prompt": "What is 2+2?"}\n')
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("EAGLE_ASSETS_PROMPTS_URL", raising=False)
    monkeypatch.delenv("EAGLE_ASSETS_PROMPT_ROOTS", raising=False)
    resources = {"inference_server": InferenceServerResource(), "storage": StorageResource(root=str(tmp_path / "data"))}
    config = {"ops": {"prompts": {"config": {"source": "file", "file_url": str(outside)}}}}
    with dg.instance_for_test() as instance:
        refused = dg.materialize([prompts], resources=resources, run_config=config, instance=instance, raise_on_error=False)
        assert not refused.success
        message = message_of(refused)
        assert f"prompts.file_url '{outside}' lies outside the folders a run may read" in message
        assert "EAGLE_ASSETS_PROMPT_ROOTS" in message
        # Issue 46's way out first: a chained URL whose first part climbs out of the data folder.
        for sneaky in (f"{tmp_path / 'data'}/../../../../etc/passwd::", str(tmp_path / "data" / ".." / "elsewhere" / "prompts.jsonl"), "/etc/passwd"):
            config["ops"]["prompts"]["config"].update(file_url=sneaky, file_format="text")
            refused = dg.materialize([prompts], resources=resources, run_config=config, instance=instance, raise_on_error=False)
            assert not refused.success
            assert "lies outside" in message_of(refused) or "empty part" in message_of(refused), message_of(refused)
        assert not list((tmp_path / "data").rglob("prompts.jsonl"))
        config["ops"]["prompts"]["config"]["file_format"] = "auto"
        link = tmp_path / "data" / "link.jsonl"  # a symbolic link inside the data folder to a file outside it
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside)
        config["ops"]["prompts"]["config"]["file_url"] = str(link)
        assert not dg.materialize([prompts], resources=resources, run_config=config, instance=instance, raise_on_error=False).success

        monkeypatch.setenv("EAGLE_ASSETS_PROMPT_ROOTS", f"s3://bucket/prompts, {outside.parent}")
        config["ops"]["prompts"]["config"]["file_url"] = str(outside)
        allowed = dg.materialize([prompts], resources=resources, run_config=config, instance=instance)
        assert allowed.success
        assert allowed.asset_materializations_for_node("prompts")[0].metadata["num_prompts"].value == 1


def main(argv: list[str]) -> int:
    """Run the table against the code at ROOT (argv[0], default this checkout) and print it."""
    import tempfile

    from eagle_assets.targets import EMBEDDED_TARGET
    from eagle_assets.targets.embedded import resolve_target

    root = Path(argv[0]).resolve() if argv else ROOT
    _, target = resolve_target(EMBEDDED_TARGET, log=lambda m: None)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = write_inputs(Path(tmp), json.loads((target / "config.json").read_text()), target)
        for case in CASES:
            result = run_case(case, files, root)
            seen = verdict(case, result, files)
            counts[seen] = counts.get(seen, 0) + 1
            print(f"{seen:9} {result.returncode:3}  {case.id:32} {output_of(result).strip()[-150:]}", flush=True)
    print(f"{len(CASES)} inputs: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("clear", "partial", "traceback", "accepted")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
