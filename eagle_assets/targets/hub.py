"""Targets whose weights come from the Hugging Face hub: a preset that is not embedded (its
`hf_repo`) or a plain hub id, downloaded with `huggingface_hub.snapshot_download`.

    eagle-assets target pull llama-3.1-8b-instruct     # -> <targets>/llama-3.1-8b-instruct
    eagle-assets target pull org/model                 # -> <targets>/org--model

Only what a target needs is fetched (`ALLOW_PATTERNS`): config, generation config, tokenizer
files, chat template, safetensors weights and their index, and the *.py of trust_remote_code
models. The files land in the Hugging Face cache first (HF_HOME, shared with every other tool,
and what HF_HUB_OFFLINE=1 reads from), then are hard-linked (copied across filesystems) into a
staging folder that is renamed into place once complete, with a record of the revision and the
file sizes: a folder without its record is never taken for a pulled target.

huggingface_hub reads HF_ENDPOINT, HF_TOKEN, HF_HOME and HF_HUB_OFFLINE itself; its failures
(offline, unreachable, gated) become one RuntimeError that names the variable and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from eagle_assets.checked_reads import read_json_object
from eagle_assets.durable import replace_durably
from eagle_assets.locks import exclusive
from eagle_assets.paths import targets_dir
from eagle_assets.targets import TargetPreset, read_target_config

HUB_RECORD = "eagle_assets.hub.json"
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.jinja", "*.model", "*.tiktoken", "merges.txt", "vocab.txt"]
# Transformers and the engines read a model from its top folder; subfolders hold other formats
# (original/ with .pth and its own params.json, onnx/, gguf/) or pictures for the model card.
# consolidated*.safetensors is Mistral's own format, a second copy of the weights.
IGNORE_PATTERNS = ["*/*", "consolidated*.safetensors"]


def is_hub_id(spec: str) -> bool:
    """Whether `spec` reads as a hub model id ORG/NAME (not a path: one slash, no leading . / ~)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        return False
    try:
        validate_repo_id(spec)
    except HFValidationError:
        return False
    return True


def hub_folder(repo_id: str) -> Path:
    """Where a hub id's target lands: one folder, named as the hub cache names repos (org--name)."""
    return targets_dir() / repo_id.replace("/", "--")


def is_pulled(folder: Path) -> bool:
    """True when `folder` holds a finished hub pull: its record, and every file it lists at its size."""
    record = folder / HUB_RECORD
    if not record.is_file():
        return False
    try:
        files = read_json_object(record, "the hub pull record", "pull again with --force").get("files")
    except ValueError:
        return False
    if not isinstance(files, dict) or not files:
        return False
    return all((folder / f).is_file() and (folder / f).stat().st_size == size for f, size in files.items())


def pull_from_hub(repo_id: str, folder: Path, preset: TargetPreset | None = None, force: bool = False, log=print) -> Path:
    """Download `repo_id` into `folder` (one run at a time per folder; idempotent). `preset`, when
    given, must match the downloaded config's shape. Returns the folder."""
    name = preset.name if preset else repo_id
    with exclusive(folder.parent / f".{folder.name}.lock", name, log=log):
        if not force and is_pulled(folder):
            log(f"{name}: present at {folder} (pull with --force for the hub's latest revision)")
            return folder
        snapshot = _snapshot(repo_id, log)
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-") as tmp:
            staging = Path(tmp) / "model"
            files = _materialise(snapshot, staging, log)
            _check(repo_id, staging, files, preset)
            record = {"repo_id": repo_id, "revision": snapshot.name, "files": {f: (staging / f).stat().st_size for f in files}}
            (staging / HUB_RECORD).write_text(json.dumps(record, indent=2))
            if folder.exists():
                shutil.rmtree(folder)
            replace_durably(staging, folder)  # flushed, then renamed: a crash leaves no folder, never half of one
    log(f"{name}: ready at {folder} ({repo_id} at revision {snapshot.name[:12]})")
    return folder


def _snapshot(repo_id: str, log) -> Path:
    """The repo's files in the hub cache (downloaded where missing, with huggingface_hub's progress bars)."""
    from huggingface_hub import constants, snapshot_download

    where = "the Hugging Face cache (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else constants.ENDPOINT
    log(f"{repo_id}: fetching config, tokenizer and safetensors weights from {where} into {constants.HF_HUB_CACHE}")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    except Exception as exc:  # the hub client's errors are many types (its own, httpx's, OSError): each is said plainly
        raise RuntimeError(_hub_failure(repo_id, exc)) from exc


def _chain(exc: BaseException) -> list[BaseException]:
    found = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def _hub_failure(repo_id: str, exc: Exception) -> str:
    """What went wrong fetching `repo_id`, and the fix."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, IncompleteSnapshotError, OfflineModeIsEnabled, RepositoryNotFoundError

    chain = _chain(exc)
    copy_instead = "or copy the model folder to this host and give its path as the target (--target PATH)"
    if constants.HF_HUB_OFFLINE or any(isinstance(e, OfflineModeIsEnabled) for e in chain):
        if any(isinstance(e, IncompleteSnapshotError) for e in chain):
            return (
                f"{repo_id} is only partly in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 "
                f"forbids fetching the rest: unset HF_HUB_OFFLINE on a host that reaches the hub, {copy_instead}"
            )
        return (
            f"{repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1 forbids "
            f"downloading it: unset HF_HUB_OFFLINE on a host that reaches the hub ({constants.ENDPOINT}), {copy_instead}"
        )
    status = next((e.response.status_code for e in chain if isinstance(e, HfHubHTTPError) and e.response is not None), None)
    if any(isinstance(e, GatedRepoError) for e in chain) or status in (401, 403):
        token = "HF_TOKEN is set, but its account" if os.environ.get("HF_TOKEN") else "set HF_TOKEN to a token of an account that"
        return (
            f"{repo_id} on {constants.ENDPOINT} refused access (gated or private, HTTP {status}): {token} "
            f"has accepted the model's license at {constants.ENDPOINT}/{repo_id}, {copy_instead}"
        )
    if any(isinstance(e, RepositoryNotFoundError) for e in chain):
        return f"{constants.ENDPOINT} has no model {repo_id} (or it is private): check the id, or set HF_TOKEN for a private one, {copy_instead}"
    if status is not None:
        return f"{constants.ENDPOINT} answered HTTP {status} for {repo_id} ({exc}): try again later, {copy_instead}"
    cause = chain[-1]
    return (
        f"could not reach the Hugging Face hub at {constants.ENDPOINT} to download {repo_id} "
        f"({type(cause).__name__}: {cause}): check the network or HF_ENDPOINT (a mirror), "
        f"{copy_instead}"
    )


def _materialise(snapshot: Path, staging: Path, log) -> list[str]:
    """Link the snapshot's wanted files into `staging`; returns their names.

    The snapshot may hold more than was asked for (other tools share the cache, and an offline
    snapshot is returned whole), so the same patterns filter it again. A hard link costs no
    space or time; the cache's files are content-addressed and never written in place. Where
    the cache is on another filesystem, the files are copied."""
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(p.name for p in snapshot.iterdir() if p.is_file())
    wanted = list(filter_repo_objects(names, allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    staging.mkdir(parents=True)
    copied = 0
    for name in wanted:
        src = (snapshot / name).resolve()  # the cache's snapshot entries are links to its blobs
        try:
            os.link(src, staging / name)
        except OSError:
            if not copied:
                log(f"copying the files from the Hugging Face cache into {staging.parent.parent} (another filesystem: no hard links)")
            shutil.copyfile(src, staging / name)
            copied += 1
    return wanted


def _check(repo_id: str, folder: Path, files: list[str], preset: TargetPreset | None) -> None:
    """The pulled folder is a target: a config with the shape keys, safetensors weights (every
    shard its index names), and the preset's shape when pulled by a preset's name."""
    fix = "check the id, or copy the model folder to this host and give its path as the target"
    if "config.json" not in files:
        raise RuntimeError(f"{repo_id} has no config.json, so it is not a Hugging Face model: {fix}")
    cfg = read_target_config(folder / "config.json")
    weights = [f for f in files if f.endswith(".safetensors")]
    if not weights:
        raise RuntimeError(
            f"{repo_id} has no *.safetensors weights (only those are read here, not .bin, .pth or .gguf): "
            "convert it to safetensors, save it to a folder and give that folder as the target"
        )
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = set((read_json_object(index, "the weights index", "pull again with --force").get("weight_map") or {}).values())
        missing = sorted(shards - set(files))
        if missing:
            raise RuntimeError(f"{repo_id}: its weights index names shards the download lacks ({', '.join(missing[:3])}): pull again with --force")
    if preset is not None:
        text = cfg.get("text_config") or cfg
        got = (text.get("num_hidden_layers"), text.get("hidden_size"), text.get("vocab_size"))
        want = (preset.num_layers, preset.hidden_size, preset.vocab_size)
        if got != want:
            raise RuntimeError(
                f"{repo_id} has (layers, hidden, vocab) {got}, but the preset {preset.name} says {want}: "
                f"pull it by its hub id ({repo_id}) to use it as it is"
            )


def drafter_folder(spec: str | Path) -> Path:
    """A drafter given as a folder, or as a hub id pulled before (`eagle-assets target pull
    ORG/NAME` puts it where `hub_folder` says): its folder. A hub id not pulled yet is refused
    with the command that pulls it; the pipeline never downloads during a run."""
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return path.resolve()
    if is_hub_id(str(spec)):
        folder = hub_folder(str(spec))
        if is_pulled(folder):
            return folder
        raise ValueError(f"drafter {spec} is a hub id not pulled to this machine: `eagle-assets target pull {spec}` downloads it ({folder})")
    raise ValueError(f"drafter {spec}: no config.json there; give a drafter folder, or a hub id ORG/NAME pulled with `eagle-assets target pull`")
