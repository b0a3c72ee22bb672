"""The engine images' command: serve the target behind an API key, with its preset's arguments.

    python docker/engine_serve.py vllm            # Dockerfile.engine-vllm's command
    python docker/engine_serve.py sglang          # Dockerfile.engine-sglang's command
    python docker/engine_serve.py vllm --dry-run  # print the command and the names in its environment

It runs under the pipeline's interpreter in the image (it imports eagle_assets), then replaces
itself with the engine's server (os.execve). Settings, from the environment:

    EAGLE_ASSETS_ENGINE_API_KEY        the key every request must carry, or
    EAGLE_ASSETS_ENGINE_API_KEY_FILE   a file holding it (a Docker or Kubernetes secret); required
    EAGLE_ASSETS_TARGET_PATH           the target's folder (default /models/target); its preset is
                                       matched from its config.json (eagle_assets/targets)
    EAGLE_ASSETS_TP                    tensor-parallel size (default: the preset's)
    EAGLE_ASSETS_ENGINE_HOST           interface inside the container (default 0.0.0.0, the
                                       container's own: where it is published decides who reaches
                                       it, 127.0.0.1 in docker-compose.yaml unless EAGLE_ASSETS_BIND)
    EAGLE_ASSETS_ENGINE_PORT           default 8000 (vLLM), 30000 (SGLang)
    EAGLE_ASSETS_ENGINE_ARGS           more engine arguments (a drafter, say), split as a shell would

The key reaches the engine in its environment only, never on a command line where `ps` shows it
to every user of the host: vLLM reads VLLM_API_KEY; SGLang takes its key as an argument, which a
stub adds to sys.argv inside the engine's own process (its /proc/PID/cmdline keeps the command it
was started with). The engine's environment is the allow-list of `engine_environment`.
`--trust-remote-code` is passed only where the target's preset asks for it, or where
EAGLE_ASSETS_ENGINE_ARGS says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from eagle_assets.engines.sglang_launch import launch_command
from eagle_assets.engines.vllm_launch import VllmLaunch, engine_environment
from eagle_assets.settings_env import SettingError, env_int, env_path, env_secret, env_str
from eagle_assets.targets.embedded import resolve_target

ENGINE_PYTHON = Path("/opt/engine/bin/python")
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
SGLANG_STUB = (
    "import os, runpy, sys; "
    "sys.argv[1:] = [*sys.argv[1:], '--api-key', os.environ.pop('EAGLE_ASSETS_ENGINE_API_KEY')]; "
    "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)"
)


def engine_launch(engine: str, python: Path = ENGINE_PYTHON) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the engine's server; a SettingError naming what is missing or wrong."""
    if engine not in DEFAULT_PORTS:
        raise SettingError(f"engine {engine!r}: give vllm or sglang")
    key = env_secret("EAGLE_ASSETS_ENGINE_API_KEY")
    if not key:
        raise SettingError(
            "the engine serves only behind an API key: set EAGLE_ASSETS_ENGINE_API_KEY, or "
            "EAGLE_ASSETS_ENGINE_API_KEY_FILE to a file holding it (clients send it as a bearer token)"
        )
    extra = shlex.split(env_str("EAGLE_ASSETS_ENGINE_ARGS", "") or "")
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in extra):
        raise SettingError(
            "EAGLE_ASSETS_ENGINE_ARGS has --api-key, which `ps` shows to every user of the host: "
            "give the key in EAGLE_ASSETS_ENGINE_API_KEY or EAGLE_ASSETS_ENGINE_API_KEY_FILE instead"
        )
    folder = env_path("EAGLE_ASSETS_TARGET_PATH", "/models/target")
    preset, folder = resolve_target(folder, log=lambda message: print(message, file=sys.stderr))
    tp = env_int("EAGLE_ASSETS_TP", preset.tensor_parallel_size, min=1)
    host = env_str("EAGLE_ASSETS_ENGINE_HOST", "0.0.0.0")
    port = env_int("EAGLE_ASSETS_ENGINE_PORT", DEFAULT_PORTS[engine], min=1, max=65535)
    if engine == "vllm":
        launch = VllmLaunch(
            model=folder,
            served_model_name=preset.name,
            preset=dataclasses.replace(preset, tensor_parallel_size=tp),
            port=port,
            host=host,
            device="cuda",
            extra_args=tuple(extra),
        )
        return launch.command(python), engine_environment(python.parent.parent, device="cuda", api_key=key)
    args = launch_command(python, folder, port, None, 0, tp=tp)[3:] + ["--host", host]
    if preset.trust_remote_code:
        args.append("--trust-remote-code")
    env = engine_environment(python.parent.parent, device="cuda")
    env["EAGLE_ASSETS_ENGINE_API_KEY"] = key  # taken out of the environment by SGLANG_STUB
    return [str(python), "-c", SGLANG_STUB, *args, *extra], env


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in DEFAULT_PORTS:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        command, env = engine_launch(argv[0])
    except (SettingError, ValueError, KeyError) as exc:
        print(f"engine_serve: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 1
    if "--dry-run" in argv[1:]:
        key = env.get("VLLM_API_KEY") or env.get("EAGLE_ASSETS_ENGINE_API_KEY")
        print(json.dumps({"argv": command, "env": sorted(env), "api_key_sha256": hashlib.sha256(key.encode()).hexdigest()}))
        return 0
    os.execve(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
