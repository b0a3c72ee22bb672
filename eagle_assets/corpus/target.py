"""The target as the corpus sees it: its tokenizer and a fingerprint of what shapes its answers.

The fingerprint goes into every sample id, so a corpus made for one target is never resumed
with another. It hashes the files that change the answers or their token ids (config,
generation config, tokenizer and its remote code, chat template) and the names and sizes of
the weight files: cheap even for a 1T-parameter target, where hashing the weights would take
hours.

    from eagle_assets.corpus.target import load_tokenizer, target_fingerprint
    tokenizer = load_tokenizer(model_dir)
    fingerprint = target_fingerprint(model_dir)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# Files whose bytes decide the answers or the ids; missing ones are simply not hashed.
_HASHED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "tiktoken.model",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def target_fingerprint(model_dir: str | Path) -> str:
    """A short stable hash of the target's config, tokenizer, template and weight file layout."""
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a model folder (no config.json); pass the target's HF folder "
            "(for the embedded target: eagle_assets.targets.embedded.pull())"
        )
    h = hashlib.sha256()
    for name in _HASHED_FILES:
        path = folder / name
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    ref = remote_tokenizer_class(folder)
    code = folder / (ref.split(".")[0] + ".py") if ref else None
    if code is not None and code.is_file():  # a tokenizer that is remote code: its revision of the code
        h.update(code.name.encode() + b"\0" + hashlib.sha256(code.read_bytes()).digest())
    for path in sorted(folder.iterdir()):
        if path.suffix in _WEIGHT_SUFFIXES:
            h.update(f"{path.name}:{path.stat().st_size}".encode())
    return f"{folder.name}-{h.hexdigest()[:16]}"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")
"""A folder holding none of these has no tokenizer transformers can load."""


def check_tokenizer_folder(model_dir: str | Path, what: str = "the target") -> Path:
    """`model_dir` when it is a local folder holding a tokenizer; else a ValueError naming it and
    what it lacks, at once (transformers would take it for a hub id and answer seconds later
    about repository names)."""
    folder = Path(model_dir).expanduser()
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{what} {str(model_dir)!r} {problem}: give the target's Hugging Face folder (config.json, tokenizer and chat template)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{what} {str(model_dir)!r} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): give the target's Hugging Face folder")
    return folder


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> Any:
    """The target's own tokenizer (with its chat template), from a local folder only; a
    ValueError naming the folder when there is none to load.

    A tokenizer that is remote code (`auto_map` in tokenizer_config.json, as Kimi-K2.5's) is
    loaded as its folder's class directly, through `get_class_from_dynamic_module`: under
    transformers 5, `AutoTokenizer` may pick a built-in backend for the model type instead, which
    reads another file or none ("Couldn't instantiate the backend tokenizer") and need not carry
    the remote class's special tokens. Names transformers 5 moved that released revisions still
    import from the old place are supplied first (`supply_moved_names`); a revision that still
    cannot load is refused at once, naming its revision and the fix."""
    folder = check_tokenizer_folder(model_dir)
    ref = remote_tokenizer_class(folder)
    if ref is None:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code, local_files_only=True)
        except (OSError, ValueError) as exc:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ValueError(f"the tokenizer in {model_dir} cannot be loaded: {first}") from None
    if not trust_remote_code:
        raise ValueError(
            f"the tokenizer of {folder} is remote code ({ref} in its tokenizer_config.json auto_map): load it with "
            "trust_remote_code (the target's preset sets it; for a folder of your own, give a preset that does)"
        )
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    supply_moved_names()
    try:
        cls = get_class_from_dynamic_module(ref, str(folder), local_files_only=True)
    except ImportError as exc:
        raise ValueError(refusal(folder, ref, exc)) from exc
    return cls.from_pretrained(str(folder), trust_remote_code=True, local_files_only=True)


def remote_tokenizer_class(folder: Path) -> str | None:
    """The class reference of a remote-code tokenizer ("module.Class", the slow one where both
    are named, as the hub's Kimi gives only that), or None for a tokenizer transformers has."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return None
    auto_map = json.loads(path.read_text()).get("auto_map") or {}
    refs = auto_map if isinstance(auto_map, (list, tuple)) else auto_map.get("AutoTokenizer")
    if not refs:
        return None
    refs = [refs] if isinstance(refs, str) else list(refs)
    return next((r for r in refs if r), None)


# Names transformers 5 moved that released remote code imports from where 4.x had them:
# (the module old code imports from, the name, the module that has it now).
MOVED_NAMES = (("transformers.models.gpt2.tokenization_gpt2", "bytes_to_unicode", "transformers.convert_slow_tokenizer"),)


def supply_moved_names() -> list[str]:
    """Put each of MOVED_NAMES back where old remote code imports it from, where it is missing
    there; returns the names supplied. Rewriting the remote file would change its hash and the
    revision it is; the engine's plugin does the same in the engine's processes."""
    import importlib

    supplied = []
    for old, name, new in MOVED_NAMES:
        module = importlib.import_module(old)
        if not hasattr(module, name):
            setattr(module, name, getattr(importlib.import_module(new), name))
            supplied.append(f"{old}.{name}")
    return supplied


def target_revision(folder: Path) -> str:
    """Which revision a target folder holds: the hub commit its pull recorded, the stand-in
    build's tokenizer revision, else that it is a local copy."""
    for record, key in (("eagle_assets.hub.json", "revision"), ("standin_build.json", "tokenizer_revision")):
        path = Path(folder) / record
        if path.is_file():
            value = json.loads(path.read_text()).get(key)
            if value:
                return str(value)
    return "a local copy (no revision recorded)"


def refusal(folder: Path, ref: str, exc: ImportError) -> str:
    """Why the remote tokenizer of `folder` cannot load here, with its revision and the fix."""
    import transformers

    module_file = Path(folder) / (ref.split(".")[0] + ".py")
    missing = getattr(exc, "name", None)
    if "requires the following packages" in str(exc):
        fix = "install the packages it names in this environment (tiktoken is pinned in the project's dependencies: `make setup`)"
    else:
        fix = (
            f"pull a revision of the target whose {module_file.name} imports from where transformers {transformers.__version__} "
            "has the name (`eagle-assets target pull ORG/NAME --force` takes the hub's latest), or add the name to "
            "eagle_assets.corpus.target.MOVED_NAMES and the engine plugin"
        )
    return (
        f"the tokenizer of {folder} ({ref}, revision {target_revision(folder)}) cannot be imported with transformers "
        f"{transformers.__version__}: {exc}{f' (missing: {missing})' if missing else ''}. Fix: {fix}."
    )
