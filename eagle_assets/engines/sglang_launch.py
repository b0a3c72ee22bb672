"""SGLang: layer-id numbering, the launch command for GPU hosts, and its own argument validation.

SGLang cannot serve on a CPU machine (its CPU kernels are not on PyPI). What runs here is its
own parser and validation (`prepare_server_args`, then `resolve_once` where the release has
it), in an SGLang environment named by `EAGLE_ASSETS_SGLANG_VENV`; without one, preflight says
so plainly and only our own checks run.

Layer-id numbering for SGLang exports lives with the drafter config
(`DrafterConfig.sglang_layer_ids`, docs/eagle3-semantics.md §5).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from eagle_assets.settings_env import env_path

SGLANG_SCRIPT = r"""
import json, sys, time
t0 = time.monotonic()
out = {"ok": True, "findings": [], "engine": {}}
try:
    import sglang
    from sglang.srt.server_args import prepare_server_args
    out["engine"]["sglang_version"] = getattr(sglang, "__version__", "?")
    args = prepare_server_args(sys.argv[1:])
    resolve = getattr(args, "resolve_once", None)
    if callable(resolve):
        resolve()
    out["engine"]["speculative_algorithm"] = str(getattr(args, "speculative_algorithm", None))
except SystemExit as exc:
    out["ok"] = False
    out["findings"].append({"level": "error", "code": "sglang_args", "message": f"SGLang's parser refused the arguments (exit {exc.code})"})
except Exception as exc:
    out["ok"] = False
    out["findings"].append({"level": "error", "code": "sglang_refused", "message": f"SGLang refused: {type(exc).__name__}: {exc}"})
out["seconds"] = time.monotonic() - t0
print("\n" + json.dumps(out))
"""


def launch_command(python: Path, model: Path, port: int, drafter: Path | None, steps: int, tp: int = 1, extra: list[str] | None = None) -> list[str]:
    """`python -m sglang.launch_server` with EAGLE-3 chain drafting (topk 1), for GPU hosts."""
    cmd = [str(python), "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port), "--tp", str(tp)]
    if drafter:
        cmd += [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(drafter),
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(steps + 1),
        ]
    return cmd + list(extra or [])


def sglang_venv() -> Path | None:
    return env_path("EAGLE_ASSETS_SGLANG_VENV", None)


def preflight_argv(target: Path, drafter: Path | None, steps: int, engine_args: dict | None = None) -> list[str]:
    """The `sglang.launch_server` arguments preflight validates: the launch's own, with the
    target's tensor-parallel size and trust in its remote code (`engine_args`, the EngineArgs
    keywords `preflight.engine_args_for` gives), so SGLang validates the server it would run."""
    engine_args = engine_args or {}
    extra = ["--trust-remote-code"] if engine_args.get("trust_remote_code") else []
    if engine_args.get("max_model_len"):
        extra += ["--context-length", str(engine_args["max_model_len"])]
    tp = int(engine_args.get("tensor_parallel_size") or 1)
    return launch_command(Path("python"), target, 30000, drafter, steps, tp=tp, extra=extra)[3:]


def run_sglang_preflight(target: Path, drafter: Path | None, steps: int, engine_args: dict | None = None, timeout_s: float = 120) -> dict:
    venv = sglang_venv()
    if venv is None or not (venv / "bin" / "python").is_file():
        return {
            "ok": True,
            "findings": [
                {
                    "level": "warning",
                    "code": "no_sglang_env",
                    "message": "no SGLang environment is configured (set EAGLE_ASSETS_SGLANG_VENV to a venv with "
                    "sglang installed): SGLang's own validation did not run, only our checks did.",
                }
            ],
            "engine": {},
        }
    argv = preflight_argv(target, drafter, steps, engine_args)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", SGLANG_SCRIPT, *argv], capture_output=True, text=True, timeout=timeout_s)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return {"ok": False, "findings": [{"level": "error", "code": "sglang_crashed", "message": tail}], "engine": {}}
