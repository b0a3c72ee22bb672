"""Preflight: will this target and drafter serve? Answered in seconds, before any weights load.

    eagle-assets preflight --engine vllm --target smollm2-135m-instruct --drafter out/vllm

Two halves. Our own checks read the two config.json files and the drafter's tensor header
(shapes and names only) and compare them with the contracts in docs/design.md: hidden sizes,
vocabulary and `d2t`, aux layer ids present and in range, the config keys the engines
misread, and that the folder is this engine's export (the engines count layer ids differently);
a corrupt or truncated file is an error naming it. The engine's own validation runs inside the
engine's environment (`vllm_preflight.py`: `EngineArgs(...).create_engine_config()`, model-class
resolution, `supports_eagle3`), so a refusal that would otherwise surface after a 22-minute load shows now.
It runs only where our own checks found no error: those answer in well under a second, the
engine's validation takes 10-30 s and would only refuse (or crash on) the same files again.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.checked_reads import read_json_object, read_safetensors_header
from eagle_assets.engines.export_kind import DRAFTER_CONFIG_FIX, ENGINE_NAMES, wrong_engine_export
from eagle_assets.engines.vllm_launch import engine_environment, engine_python
from eagle_assets.paths import engine_venv
from eagle_assets.targets import PRESETS, default_aux_layer_ids, preset_from_hf_config, read_target_config

ENGINE_SCRIPTS = Path(__file__).resolve().parent
EAGLE3_KNOWN = {p.architecture for p in PRESETS.values()}
"""Target architectures the pinned vLLM serves with EAGLE-3: the presets', each served with a
drafter by the test suite (SmolLM2's Llama, the DeepSeek-V3 and Kimi-K2.5 stand-ins). Where our
own checks refuse a drafter for any other, the engine is asked (`_ask_eagle3_support`)."""
EAGLE3_ARCHITECTURES = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3Speculator"}
# What a drafter's config.json may give as `torch_dtype` / `dtype`: the names the engines load.
DRAFTER_DTYPES = ("bfloat16", "float16", "float32", "half", "float", "auto")

ROOT_CAUSES = ("no_eagle3",)
"""Findings that make every other one moot: said first."""


@dataclass
class Finding:
    level: str  # "error" | "warning" | "info"
    code: str
    message: str


@dataclass
class PreflightReport:
    findings: list[Finding] = field(default_factory=list)
    engine: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    def add(self, level: str, code: str, message: str) -> None:
        self.findings.append(Finding(level, code, message))

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    def root_cause_first(self) -> None:
        """Put the findings that end the matter (ROOT_CAUSES) before the others, in their order."""
        self.findings.sort(key=lambda f: f.code not in ROOT_CAUSES)

    def render(self) -> str:
        lines = []
        for f in self.findings:
            lines.append(f"{f.level.upper():7} [{f.code}] {f.message}")
        verdict = "OK" if self.ok else "REFUSED"
        facts = ", ".join(
            f"{k}={v}" for k, v in self.engine.items() if k in ("vllm_version", "model_class", "supports_eagle3", "engine_aux_layer_ids")
        )
        lines.append(f"preflight: {verdict} in {self.seconds:.1f} s" + (f" ({facts})" if facts else ""))
        return "\n".join(lines)


class PreflightError(RuntimeError):
    def __init__(self, report: PreflightReport):
        super().__init__("preflight refused the launch:\n" + report.render())
        self.report = report


def _drafter_tensors(folder: Path) -> dict[str, dict]:
    tensors: dict[str, dict] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(read_safetensors_header(file))
    return tensors


def check_drafter(target_cfg: dict, drafter: Path, report: PreflightReport, engine: str | None = None) -> None:
    """Our own drafter-vs-target checks (docs/design.md contracts; docs/eagle3-semantics.md §7); with an
    `engine`, also that the folder is that engine's export."""
    shape = preset_from_hf_config("target", target_cfg)  # reads llama- and gpt2-style key names
    layers, hidden, vocab = shape.num_layers, shape.hidden_size, shape.vocab_size
    cfg_path = drafter / "config.json"
    if not cfg_path.is_file():
        missing = f"no folder {drafter}" if not drafter.is_dir() else f"no drafter config at {cfg_path}"
        report.add("error", "drafter_missing", f"{missing}: pass the drafter's folder, the one holding config.json and model.safetensors")
        return
    try:
        cfg = read_json_object(cfg_path, "the drafter's config", DRAFTER_CONFIG_FIX)
    except ValueError as exc:
        report.add("error", "drafter_config_unreadable", str(exc))
        return
    for key in ("torch_dtype", "dtype"):
        if cfg.get(key) is not None and cfg[key] not in DRAFTER_DTYPES:
            report.add(
                "error",
                "drafter_dtype",
                f"{cfg_path}: `{key}` is {cfg[key]!r}, not a dtype the engines load ({', '.join(DRAFTER_DTYPES[:3])}): {DRAFTER_CONFIG_FIX}",
            )
    if (
        "KimiK25ForConditionalGeneration" in (target_cfg.get("architectures") or [])
        and "media_placeholder_token_id" not in target_cfg
        and engine in (None, "vllm")
    ):
        report.add(
            "error",
            "kimi_media_placeholder",
            "the target's config.json has no media_placeholder_token_id: vLLM's EAGLE-3 proposer reads it from a "
            "Kimi-K2.5 target and its worker fails at start without it. Copy the field from the hub's config.json "
            "(the image placeholder's id, 163605 for Kimi-K2.5; the same as image_token_id)",
        )
    wrong_engine = wrong_engine_export(cfg, cfg_path, engine) if engine in ENGINE_NAMES else None
    if wrong_engine:
        report.add("error", "drafter_numbering", wrong_engine)
    archs = cfg.get("architectures") or []
    if not set(archs) & EAGLE3_ARCHITECTURES:
        report.add("error", "drafter_architecture", f"drafter architectures {archs} name no EAGLE-3 class; vLLM expects ['LlamaForCausalLMEagle3']")
    t_hidden = cfg.get("target_hidden_size") or cfg.get("hidden_size")
    if t_hidden != hidden:
        report.add(
            "error",
            "hidden_size",
            f"drafter target_hidden_size is {t_hidden} but the target's hidden size is {hidden}: this drafter was "
            "trained for another target (fc would see the wrong width)",
        )
    if cfg.get("hidden_size") != hidden:
        report.add(
            "warning",
            "drafter_hidden",
            f"drafter hidden_size {cfg.get('hidden_size')} differs from the target's {hidden}: the engines share the "
            "target's embedding, so the drafter must carry its own embed_tokens",
        )
    eagle = cfg.get("eagle_config") or {}
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    defaults = default_aux_layer_ids(layers)
    if not ids:
        report.add(
            "warning",
            "aux_ids_missing",
            f"drafter config has no eagle_aux_hidden_state_layer_ids: the engine silently uses (2, L//2, L-3) = "
            f"{defaults} for this {layers}-layer target. Write the ids the drafter was trained on into "
            "eagle_config.eagle_aux_hidden_state_layer_ids.",
        )
        ids = list(defaults)
    bad = [i for i in ids if not 0 <= int(i) <= layers]
    if bad:
        report.add(
            "error",
            "aux_ids_range",
            f"aux layer ids {bad} are out of range for a {layers}-layer target (valid: 0..{layers}, HF hidden_states numbering)",
        )
    if cfg.get("norm_output") or eagle.get("norm_output"):
        report.add(
            "error",
            "norm_output",
            "norm_output: true makes the engines feed back the post-norm state; drafters are trained on the pre-norm state. Remove the key.",
        )
    if cfg.get("attention_bias"):
        report.add("error", "attention_bias", "attention_bias: true adds qkv and o_proj biases in vLLM that SGLang never loads. Remove the key.")
    if cfg.get("tie_word_embeddings"):
        report.add("warning", "tied", "tie_word_embeddings: true makes SGLang replace lm_head with the embedding; export false.")

    draft_vocab = cfg.get("draft_vocab_size") or cfg.get("vocab_size")
    try:
        tensors = _drafter_tensors(drafter)
    except ValueError as exc:
        report.add("error", "drafter_weights_unreadable", str(exc))
        return
    if not tensors:
        report.add("error", "weights_missing", f"no *.safetensors in {drafter}")
        return
    names = {n.replace("midlayer.", "layers.0.") for n in tensors}
    fc = tensors.get("fc.weight")
    if fc is None:
        report.add("error", "fc_missing", "drafter has no fc.weight: EAGLE-3 projects the concatenated aux states through fc")
    else:
        want = [cfg.get("hidden_size"), len(ids) * (t_hidden or hidden)]
        if fc["shape"] != want:
            report.add("error", "fc_shape", f"fc.weight has shape {fc['shape']}, expected {want} ({len(ids)} aux states x {t_hidden})")
    head = tensors.get("lm_head.weight")
    if head is not None and head["shape"][0] != draft_vocab:
        report.add("error", "lm_head_rows", f"lm_head.weight has {head['shape'][0]} rows but draft_vocab_size is {draft_vocab}")
    if draft_vocab is not None and draft_vocab > vocab:
        report.add("error", "draft_vocab", f"draft_vocab_size {draft_vocab} exceeds the target vocabulary {vocab}")
    d2t = tensors.get("d2t")
    if d2t is None and draft_vocab != vocab:
        report.add(
            "error",
            "d2t_missing",
            f"drafter has no d2t while draft_vocab_size {draft_vocab} != target vocab {vocab}: vLLM would map every draft id to itself (zeros)",
        )
    elif d2t is not None and d2t["shape"] != [draft_vocab]:
        report.add("error", "d2t_length", f"d2t has shape {d2t['shape']}, expected [{draft_vocab}] (draft_vocab_size)")
    t2d = tensors.get("t2d")
    if t2d is not None and t2d["shape"] != [vocab]:
        report.add(
            "error",
            "t2d_length",
            f"t2d has {t2d['shape'][0]} entries but the target vocabulary has {vocab}: the draft vocabulary was built for another tokenizer",
        )
    if d2t is not None and report.ok:
        from safetensors import safe_open

        for file in drafter.glob("*.safetensors"):
            with safe_open(str(file), "pt") as f:
                if "d2t" in f.keys():
                    import torch

                    mapped = f.get_tensor("d2t") + torch.arange(draft_vocab)
                    if int(mapped.max()) >= vocab or int(mapped.min()) < 0:
                        report.add(
                            "error",
                            "d2t_range",
                            f"d2t maps draft ids to target ids up to {int(mapped.max())}, outside the target vocabulary of {vocab}",
                        )
    missing = {"layers.0.self_attn.q_proj.weight", "layers.0.hidden_norm.weight", "norm.weight"} - names
    if missing:
        report.add("error", "weights_incomplete", f"drafter weights lack {sorted(missing)}")


def run_engine_preflight(
    model: Path, drafter: Path | None, k: int, engine_args: dict, venv: Path | None = None, timeout_s: float = 180, target_only: bool = False
) -> dict:
    """Runs `vllm_preflight.py` in the engine venv; returns its JSON answer. `target_only`: only
    whether the target's architecture has EAGLE-3 support there."""

    venv = venv or engine_venv("vllm")
    py = engine_python(venv)
    if not py.is_file():
        return {
            "ok": True,
            "findings": [
                {
                    "level": "warning",
                    "code": "no_engine_env",
                    "message": f"no vLLM environment at {venv}: only our own checks ran. Run `make setup` to build it.",
                }
            ],
            "engine": {},
        }
    request = {"model": str(model), "drafter": str(drafter) if drafter else None, "k": k, "engine_args": engine_args, "target_only": target_only}
    env = engine_environment(venv)
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    proc = subprocess.run(
        [str(py), str(ENGINE_SCRIPTS / "vllm_preflight.py"), json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        return {
            "ok": False,
            "findings": [{"level": "error", "code": "engine_preflight_crashed", "message": f"the engine's validation crashed:\n{tail}"}],
            "engine": {},
        }


def preflight(
    target: Path,
    drafter: Path | None = None,
    engine: str = "vllm",
    num_speculative_tokens: int = 3,
    engine_args: dict | None = None,
    venv: Path | None = None,
) -> PreflightReport:
    """Our checks plus the engine's own; `report.ok` says whether the launch may go ahead."""
    started = time.monotonic()
    report = PreflightReport()
    cfg_path = Path(target) / "config.json"
    if not cfg_path.is_file():
        report.add("error", "target_missing", f"no target config at {cfg_path}")
        report.seconds = time.monotonic() - started
        return report
    try:
        target_cfg = read_target_config(cfg_path)
    except ValueError as exc:
        report.add("error", "target_unreadable", str(exc))
    else:
        if drafter is not None:
            check_drafter(target_cfg, Path(drafter), report, engine=engine)
        if drafter is not None and engine == "sglang" and (Path(drafter) / "config.json").is_file():
            _check_sglang_layers(Path(drafter), report)
    if not report.ok:
        # What our own checks refused the engine's validation (~10-30 s) would refuse again, or
        # crash on (a corrupt file) with a traceback in place of the file's name: fix these first.
        # Only whether the engine can serve this architecture with EAGLE-3 at all is asked of it,
        # for a target not known to: that answer ends the matter, so it is said first.
        if engine == "vllm" and drafter is not None and (Path(target) / "config.json").is_file():
            _ask_eagle3_support(Path(target), num_speculative_tokens, engine_args or {}, venv, report)
        name = ENGINE_NAMES.get(engine, engine)
        report.add("info", "engine_skipped", f"{name}'s full validation did not run: fix the errors above first")
        report.seconds = time.monotonic() - started
        return report
    if engine == "vllm":
        answer = run_engine_preflight(Path(target), Path(drafter) if drafter else None, num_speculative_tokens, engine_args or {}, venv)
        for f in answer.get("findings", []):
            report.add(f["level"], f["code"], f["message"])
        report.engine = answer.get("engine", {})
        report.root_cause_first()
    elif engine == "sglang":
        from eagle_assets.engines.sglang_launch import run_sglang_preflight

        answer = run_sglang_preflight(Path(target), Path(drafter) if drafter else None, num_speculative_tokens, engine_args)
        for f in answer.get("findings", []):
            report.add(f["level"], f["code"], f["message"])
        report.engine = answer.get("engine", {})
    else:
        report.add("error", "engine", f"unknown engine {engine!r}: use vllm or sglang")
    report.seconds = time.monotonic() - started
    return report


def _ask_eagle3_support(target: Path, k: int, engine_args: dict, venv: Path | None, report: PreflightReport) -> None:
    """Where our own checks refused a drafter: ask the engine whether it serves the target's
    architecture with EAGLE-3 at all (a target-only validation, ~10-30 s), unless it is one of
    the presets' architectures, whose support the test suite serves (`EAGLE3_KNOWN`). A refusal
    goes first in the report: no drafter fixes it."""
    try:
        architecture = (read_target_config(target / "config.json").get("architectures") or [None])[0]
    except ValueError:
        return
    if architecture in EAGLE3_KNOWN:
        return
    answer = run_engine_preflight(target, None, k, {**engine_args}, venv, target_only=True)
    for f in answer.get("findings", []):
        if f.get("code") == "no_eagle3":
            report.add(f["level"], f["code"], f["message"])
    report.engine = answer.get("engine", {})
    report.root_cause_first()


def _check_sglang_layers(drafter: Path, report: PreflightReport) -> None:
    from eagle_assets.drafter.config import folder_num_layers

    layers = folder_num_layers(drafter)
    if layers > 1:
        report.add(
            "error",
            "sglang_layers",
            f"the drafter has {layers} decoder layers: SGLang's layers after the first restart the residual "
            "stream from the previous layer's MLP output (vLLM carries it), so it would draft with another "
            "function than the one trained. Serve it with vLLM, or train one layer for SGLang.",
        )


def engine_args_for(preset, device: str = "cpu") -> dict:
    """The EngineArgs keywords matching the server command we would launch."""
    args = {"max_model_len": preset.max_model_len, "tensor_parallel_size": preset.tensor_parallel_size}
    if device == "cpu":
        args["enforce_eager"] = True
        args["dtype"] = "float32"
    if preset.trust_remote_code:
        args["trust_remote_code"] = True
    return args
