"""Publish a trained drafter on the Hugging Face hub, where vLLM and SGLang load it by id.

    eagle-assets push data/llama-3.1-8b-instruct/drafter my-org/llama-3.1-8b-eagle3

The vLLM export goes to the repository's main revision and the SGLang export to its `sglang`
branch, each with its model card (drafter/model_card.py). Both engines load a drafter as a hub
id and a revision, neither from a subfolder (vLLM: `speculative_config={"model": ID,
"revision": REV}`; SGLang: `--speculative-draft-model-path ID --speculative-draft-model-revision
REV`), and the two exports hold the same file names (they differ in config.json's layer ids),
so each needs a revision of its own: main for vLLM, which `"model": ID` alone loads
(docs/publishing.md).

What is pushed is decided here, without the network: `commit_operations` lists the files as
huggingface_hub's own `CommitOperationAdd`s, and `refusals` says why a drafter must not go (a
blocking check failed or never ran on it, no model card). `push_drafter` then creates the
repository and one commit per revision through `HfApi` (create_repo, create_commit,
create_branch), which reads HF_TOKEN (or the token `hf auth login` saved) and HF_ENDPOINT itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

SGLANG_REVISION = "sglang"
"""The branch holding the SGLang export (main holds vLLM's)."""
SUMMARY_FILE = "summary.json"
CARD_FILE = "README.md"
"""The model card beside each export (drafter/model_card.py writes it)."""
EXPORT_FILES = ("config.json", "model.safetensors")
REPO_ID_FORM = "ORG/NAME: your user or organisation, a slash, the model's name (letters, digits, '-', '_', '.'), e.g. my-org/llama-3.1-8b-eagle3"


@dataclass(frozen=True)
class Drafter:
    """A trained drafter's folders: the one the trainer wrote (summary.json, checkpoints) and its exports."""

    root: Path
    vllm: Path
    sglang: Path | None
    summary: dict | None
    """The trainer's summary.json; None for an export standing alone."""


def _is_export(folder: Path) -> bool:
    return all((folder / name).is_file() for name in EXPORT_FILES)


def find_drafter(path: str | Path) -> Drafter:
    """The drafter at `path`: the trainer's folder (data/<target>/drafter, holding drafter-vllm/
    and drafter-sglang/, and summary.json) or a vLLM export folder: the trainer's drafter-vllm/
    names the same drafter; an export elsewhere is taken alone, with a summary.json beside it if any."""
    path = Path(path).expanduser().resolve()
    if (path / "drafter-vllm").is_dir():
        root, vllm = path, path / "drafter-vllm"
    elif _is_export(path):
        root, vllm = path.parent, path
    else:
        raise ValueError(
            f"{path} is not a drafter: give the trainer's folder (data/<target>/drafter) or a vLLM export (config.json and model.safetensors)"
        )
    if not _is_export(vllm):
        raise ValueError(f"{vllm} is not a complete export (it needs {' and '.join(EXPORT_FILES)}): train or export the drafter again")
    sglang = root / "drafter-sglang" if vllm == root / "drafter-vllm" and _is_export(root / "drafter-sglang") else None
    summary = None
    if (root / SUMMARY_FILE).is_file():
        from eagle_assets.checked_reads import read_json_object

        summary = read_json_object(root / SUMMARY_FILE, "the trainer's summary of the drafter", "train the drafter again")
    return Drafter(root, vllm, sglang, summary)


def check_repo_id(repo_id: str) -> str:
    """`repo_id` when it is a hub model id of the form ORG/NAME; a ValueError saying the form otherwise."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    problem = None
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        problem = "it needs exactly one slash between the owner and the name"
    else:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as exc:
            problem = str(exc).split("\n")[0]
    if problem:
        raise ValueError(f"repository id {repo_id!r} is not a hub model id ({problem}): give {REPO_ID_FORM}")
    return repo_id


def require_token() -> str:
    """The hub token huggingface_hub would use (HF_TOKEN, else the one `hf auth login` saved); a
    RuntimeError saying how to give one when there is none."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise RuntimeError(
            "no Hugging Face token: set HF_TOKEN to a token with write access to the repository's owner "
            "(https://huggingface.co/settings/tokens), or log in once with `hf auth login`"
        )
    return token


def read_card(export: Path):
    """The export's model card as huggingface_hub's `ModelCard` (metadata in `.data`); None when it has none."""
    from huggingface_hub import ModelCard

    path = export / CARD_FILE
    return ModelCard.load(path) if path.is_file() else None


def refusals(drafter: Drafter, checks: Mapping[str, bool | None], allow_unchecked: bool = False) -> list[str]:
    """Why `drafter` must not be pushed ([] when it may): an export without its model card, a
    blocking check that failed on it (`checks`: {name: passed, or None where none is recorded
    for these files}) or, unless `allow_unchecked`, one that never ran on it; and a fine-tune
    its summary.json records as clearly worse than its parent."""
    problems = []
    for export in (drafter.vllm, drafter.sglang):
        if export is not None and read_card(export) is None:
            problems.append(f"{export} has no model card ({CARD_FILE}): the trainer writes one beside each export; train or export again")
    failed = sorted(name for name, passed in checks.items() if passed is False)
    if failed:
        problems.append(f"blocking check(s) {', '.join(failed)} failed on this drafter: fix the cause and run `eagle-assets check`")
    missing = sorted(name for name, passed in checks.items() if passed is None)
    if missing and not allow_unchecked:
        problems.append(
            f"no result of the blocking check(s) {', '.join(missing)} is recorded for these files in the Dagster instance "
            "($DAGSTER_HOME): run `eagle-assets check` on the graph's drafter, or push with --unchecked a drafter "
            "trained outside the graph"
        )
    comparison = (drafter.summary or {}).get("parent_comparison") or {}
    if comparison.get("verdict") == "worse" and "not_worse_than_parent" not in failed:
        problems.append(f"the fine-tune is clearly worse than its parent (not_worse_than_parent): {comparison.get('sentence', '')}".rstrip(": "))
    return problems


def commit_operations(export: Path) -> list:
    """The export's files as the hub's commit operations, at the repository's root, by name."""
    from huggingface_hub import CommitOperationAdd

    files = sorted(p for p in export.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(export).parts))
    return [CommitOperationAdd(path_in_repo=p.relative_to(export).as_posix(), path_or_fileobj=str(p)) for p in files]


def branch_operations(vllm: Path, sglang: Path) -> list:
    """The SGLang export's commit on its branch, which starts as a copy of main: its files, and
    the deletion of main's files it does not have."""
    from huggingface_hub import CommitOperationDelete

    adds = commit_operations(sglang)
    ours = {op.path_in_repo for op in adds}
    return adds + [CommitOperationDelete(path_in_repo=op.path_in_repo) for op in commit_operations(vllm) if op.path_in_repo not in ours]


def _title(drafter: Drafter) -> str:
    card = read_card(drafter.vllm)
    base = getattr(card.data, "base_model", None) if card else None
    return f"EAGLE-3 drafter for {base or drafter.root.parent.name}"


def push_drafter(drafter: Drafter, repo_id: str, token: str, private: bool = False, endpoint: str | None = None, log=print) -> dict[str, str]:
    """Create `repo_id` (kept if it exists) and commit the vLLM export to main and the SGLang
    export to the `sglang` branch. Returns {engine: commit URL}. The hub's refusals (a token
    without write access, a repository of someone else's) become a RuntimeError saying so."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    title = _title(drafter)
    out = {}
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        log(f"{repo_id}: {url}")
        out["vllm"] = api.create_commit(repo_id, commit_operations(drafter.vllm), commit_message=f"{title} (vLLM export)").commit_url
        log(f"vLLM export: {out['vllm']}")
        if drafter.sglang is not None:
            api.create_branch(repo_id, branch=SGLANG_REVISION, exist_ok=True)
            ops = branch_operations(drafter.vllm, drafter.sglang)
            out["sglang"] = api.create_commit(repo_id, ops, revision=SGLANG_REVISION, commit_message=f"{title} (SGLang export)").commit_url
            log(f"SGLang export (revision {SGLANG_REVISION}): {out['sglang']}")
    except Exception as exc:  # the hub client raises many types (its own, httpx's, OSError): each is said plainly
        raise RuntimeError(_push_failure(repo_id, api.endpoint, exc)) from exc
    return out


def _push_failure(repo_id: str, endpoint: str, exc: Exception) -> str:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status in (401, 403):
            return f"the hub refused the token for {repo_id} (HTTP {status}): give HF_TOKEN a token with write access to {repo_id.split('/')[0]}"
        return f"the hub answered HTTP {status} for {repo_id}: {str(exc).splitlines()[0]}"
    if isinstance(exc, (OSError, ConnectionError)) or "connect" in type(exc).__name__.lower():
        return f"could not reach the hub at {endpoint} ({type(exc).__name__}: {exc}); check the network or HF_ENDPOINT"
    return f"pushing {repo_id} to {endpoint} failed: {type(exc).__name__}: {exc}"


def usage(repo_id: str, has_sglang: bool, k: int = 3) -> str:
    """How the engines load what was pushed."""
    lines = [f"vLLM:   --speculative-config '{json.dumps({'method': 'eagle3', 'model': repo_id, 'num_speculative_tokens': k})}'"]
    if has_sglang:
        lines.append(
            f"SGLang: --speculative-algorithm EAGLE3 --speculative-draft-model-path {repo_id} --speculative-draft-model-revision {SGLANG_REVISION}"
        )
    return "\n".join(lines)
