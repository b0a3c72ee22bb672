"""Resumable training checkpoints: atomic folders of safetensors + JSON, never pickles.

One checkpoint is one folder `out_dir/checkpoints/step-00000120/`:

    model.safetensors      trainable drafter weights and its d2t/t2d buffers (the frozen target
                           embedding is not saved: it is read from the target again)
    optimizer.safetensors  per-parameter optimiser tensors, keys `state/<param fqn>/<name>`
    trainer_state.json     step, data position, scheduler, optimiser param groups, the run
                           config, and the RNG states (python, numpy, torch, cuda) of every rank

The folder is written under a hidden temporary name (`.tmp-step-...`) by rank 0, flushed to
disk, and renamed into place: a folder named `step-*` is always complete, so a crash at any
moment leaves the previous checkpoint usable, and `latest_checkpoint` never sees half a write.

`trainer_state.json` also records the size and SHA-256 of both safetensors files, and nothing
is trusted unchecked (`checkpoint_problem`: the state parses, both files are whole safetensors
files of the recorded size and checksum). A checkpoint that fails is skipped by
`latest_checkpoint`, which falls back to the newest one that passes (logging a warning naming
the file and why): training resumes a little earlier, on the same trajectory, rather than not
at all or from damaged weights. `load_checkpoint` on a damaged folder raises a ValueError that
names the file and the fix. Hashing costs about what loading costs (the files are read whole
either way): a few seconds per GB, on save, resume and the end-of-run summary.

    path = save_checkpoint(root, step, model_state, optimizer_state, trainer_state, keep_last=2)
    ckpt = load_checkpoint(latest_checkpoint(root))
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagle_assets.checked_reads import parse_json_object, read_safetensors_header
from eagle_assets.durable import file_sha256, fsync_dir, fsync_file

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
CHECKPOINT_FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass
class Checkpoint:
    """A checkpoint read back from disk."""

    path: Path
    step: int
    model_state: dict[str, torch.Tensor]
    """Drafter tensors by name (as `Eagle3Drafter.state_dict()` names them)."""
    optimizer_state: dict
    """`{"state": {fqn: {name: tensor}}, "param_groups": [...]}`, FQN-keyed as
    `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict` gives it."""
    trainer_state: dict
    """Everything else, JSON: data position, scheduler, rng states, config, metrics."""


# ----------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict:
    """This process's RNG states as JSON-able data (python, numpy, torch CPU, every CUDA device)."""
    py_version, py_state, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "numpy": {
            "kind": np_kind,
            "keys": np_keys.tolist(),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": _b64(torch.get_rng_state()),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of `capture_rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npd = state["numpy"]
    np.random.set_state((npd["kind"], np.asarray(npd["keys"], dtype=np.uint32), npd["pos"], npd["has_gauss"], npd["gauss"]))
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        saved = [_unb64(s) for s in state["cuda"]]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)
        else:  # a different GPU count: restore what lines up, the rest keep their seeds
            for i, s in enumerate(saved[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().contiguous().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def gather_json(obj, group=None) -> list | None:
    """All ranks' JSON-able `obj` on rank 0 (None elsewhere), sent as bytes in a tensor.

    A hand-rolled gather rather than `gather_object`, so nothing is ever unpickled.
    Every rank must call it. Without an initialised process group it returns `[obj]`.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    world = dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    chunks = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded, group=group)
    if dist.get_rank(group) != 0:
        return None
    return [json.loads(bytes(c[: int(n.item())].cpu().numpy()).decode()) for c, n in zip(chunks, sizes)]


# ----------------------------------------------------------------------------- save / load


def _flatten_optimizer(optimizer_state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Split a FQN-keyed optimiser state into tensors (safetensors) and the rest (JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for fqn, per_param in optimizer_state["state"].items():
        for name, value in per_param.items():
            if "/" in fqn or "/" in name:
                raise ValueError(f"optimiser state key {fqn!r}/{name!r} contains '/', which the file layout reserves")
            if isinstance(value, torch.Tensor):
                tensors[f"state/{fqn}/{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(fqn, {})[name] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in optimizer_state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[str, dict] = {}
    for key, value in tensors.items():
        _, fqn, name = key.split("/", 2)
        state.setdefault(fqn, {})[name] = value
    for fqn, extra in meta.get("scalars", {}).items():
        state.setdefault(fqn, {}).update(extra)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:  # AdamW compares betas as a tuple in some code paths
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict,
    trainer_state: dict,
    keep_last: int = 2,
) -> Path:
    """Write `root/step-XXXXXXXX` atomically and prune older checkpoints beyond `keep_last`.

    Called by rank 0 only, with full (unsharded) CPU state dicts.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        # safetensors refuses tensors that share storage (tied weights): give each its own.
        model_tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model_state.items()}
        save_file(model_tensors, str(tmp / MODEL_FILE), metadata={"format": "pt", "step": str(step)})
        opt_tensors, opt_meta = _flatten_optimizer(optimizer_state)
        save_file(opt_tensors, str(tmp / OPTIMIZER_FILE), metadata={"format": "pt", "step": str(step)})
        files = {f: {"bytes": (tmp / f).stat().st_size, "sha256": file_sha256(tmp / f)} for f in (MODEL_FILE, OPTIMIZER_FILE)}
        state = {"format": CHECKPOINT_FORMAT, "step": step, "optimizer": opt_meta, "files": files, **trainer_state}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        for f in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE):
            fsync_file(tmp / f)
        fsync_dir(tmp)
        if final.exists():  # the same step saved again (e.g. a rerun with resume=false)
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(root, keep_last, newest=step)
    return final


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


CHECKPOINT_FIX = "delete that checkpoint folder: a resume then starts from the newest checkpoint that passes these checks (or afresh when none does)"


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with checkpoint folder `path`, naming the file; None when it can be trusted.

    Checks: `trainer_state.json` is a JSON object of this format and the folder's step; both
    safetensors files are whole (header, every tensor's extent, nothing missing or appended)
    and have the size and SHA-256 recorded at save (checkpoints from before that was recorded
    get the other checks)."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        return f"{path} is not a complete checkpoint (no {STATE_FILE})"
    try:
        state = parse_json_object(state_file.read_bytes(), state_file, "the trainer state", CHECKPOINT_FIX)
    except ValueError as exc:
        return str(exc).removesuffix(f": {CHECKPOINT_FIX}")
    m = _STEP_DIR.match(path.name)
    if state.get("format") != CHECKPOINT_FORMAT:
        return f"{state_file}: checkpoint format {state.get('format')!r} is not {CHECKPOINT_FORMAT}"
    if m and state.get("step") != int(m.group(1)):
        return f"{state_file}: step {state.get('step')!r}, in the folder of step {int(m.group(1))}"
    optimizer = state.get("optimizer")
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("param_groups"), list)):
        return f"{state_file}: no optimizer param_groups"
    recorded = state.get("files", {})
    if not isinstance(recorded, dict):
        return f"{state_file}: its `files` record is not an object"
    for name in (MODEL_FILE, OPTIMIZER_FILE):
        file = path / name
        if not file.is_file():
            return f"{file} does not exist"
        try:
            read_safetensors_header(file, fix=CHECKPOINT_FIX)
        except ValueError as exc:
            return str(exc).removesuffix(f": {CHECKPOINT_FIX}")
        want = recorded.get(name)
        if want is None:
            continue
        if not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("sha256"), str)):
            return f"{state_file}: its record of {name} is not {{bytes, sha256}}"
        size = file.stat().st_size
        if size != want["bytes"]:
            return f"{file} is {size} bytes, {STATE_FILE} recorded {want['bytes']} at save"
        digest = file_sha256(file)
        if digest != want["sha256"]:
            return f"{file}: its SHA-256 is {digest[:16]}..., {STATE_FILE} recorded {want['sha256'][:16]}... at save"
    return None


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint under `root` that passes `checkpoint_problem`; newer ones that fail
    are skipped with a warning naming the file and why. None when there is none."""
    for _, path in reversed(list_checkpoints(root)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning("checkpoint %s skipped, an older one is used if one passes: %s", path.name, problem)
    return None


def prune_checkpoints(root: str | os.PathLike, keep_last: int, newest: int | None = None) -> None:
    """Delete all but the newest `keep_last` complete checkpoints, and, given the step just
    saved (`newest`), every checkpoint after it: those were left by a run this one did not
    resume from (one that failed its checks, or a run restarted with resume=false), and a
    later resume must not mistake them for this run's."""
    root = Path(root)
    found = list_checkpoints(root)
    if newest is not None:
        for step, path in found:
            if step > newest:
                log.warning("checkpoint %s removed: it is newer than step %d, which this run just saved", path, newest)
                shutil.rmtree(path, ignore_errors=True)
        found = [(step, path) for step, path in found if step <= newest]
    for _, path in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_temp(root: str | os.PathLike) -> None:
    """Remove `.tmp-*` folders a killed run left behind (call before training starts)."""
    root = Path(root)
    if root.is_dir():
        for p in root.glob(".tmp-step-*"):
            shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint folder written by `save_checkpoint`, after `checkpoint_problem`'s checks:
    a damaged one is a ValueError naming the file and the fix (FileNotFoundError when the
    folder is incomplete)."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE}); delete it or pick another")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"{problem}: {CHECKPOINT_FIX}")
    state = json.loads((path / STATE_FILE).read_bytes())
    state.pop("files", None)
    model_state = load_file(str(path / MODEL_FILE))
    optimizer_state = _unflatten_optimizer(load_file(str(path / OPTIMIZER_FILE)), state.pop("optimizer"))
    return Checkpoint(
        path=path,
        step=int(state["step"]),
        model_state=model_state,
        optimizer_state=optimizer_state,
        trainer_state=state,
    )
