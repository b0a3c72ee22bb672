"""A benchmark's measurements, kept on disk as they finish, so that a rerun resumes.

Every finished measurement is one JSON file in `<out>/measurements/`, written through a
temporary name and renamed, so a crash never leaves half a file:

    state.json                          what they measure (the fingerprint), choices made, complete or not
    offline.json                        the offline reference decoder's results, prompt by prompt
    extra--greedy_streams.json          the target's plain greedy streams, the greedy check (`save_extra`)
    sweep--baseline-1a2b3c--c1.json     one concurrency level of a configuration served on its own
    sweep--eagle3-4d5e6f--c4--r2.json   one round of a level, where the configurations were interleaved
    confirm--...                        the same for the K schedule served to confirm it

A rerun with the same fingerprint (the settings as asked, the target, the drafters' files, and
the caller's notes on how its servers run) keeps them and measures only what is missing. One
with another fingerprint starts afresh (`on_other="replace"`: the Dagster asset, whose config
changed) or is refused with the settings that differ (`on_other="refuse"`: `eagle-assets bench`,
whose `--overwrite` starts afresh). A finished benchmark's measurements (its report written)
are never resumed: a rerun then asks for new ones.

    store = Measurements.open(out_dir, fingerprint, on_other="refuse")
    level = store.level("sweep", "baseline", 4) or measure()
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from eagle_assets.bench.metrics import SpecStats
from eagle_assets.bench.served import LevelResult, RequestResult, write_json_atomic

MEASUREMENTS = "measurements"
STATE = "state.json"
OFFLINE = "offline.json"


class OtherMeasurements(ValueError):
    """The folder holds the unfinished measurements of a benchmark with other settings."""


def files_digest(folder: Path) -> str:
    """sha256 over the names and contents of the files in `folder` (recursively): a drafter
    retrained into the same folder is another drafter."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def _slug(label: str) -> str:
    """A file-name form of a configuration's label ("eagle3 k=1-2:4,3-:0"), with a short hash of
    the label itself so that two labels never share a name."""
    safe = "".join(c if c.isalnum() or c in "=.-" else "_" for c in label).strip("_")
    return f"{safe}-{hashlib.sha1(label.encode()).hexdigest()[:6]}"


def _differences(old: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {json.dumps(a)[:80]} there, {json.dumps(b)[:80]} now")
    return out


def _ours(folder: Path) -> list[Path]:
    """The files of a measurements folder this module writes (a file of anyone else's stays)."""
    if not folder.is_dir():
        return []
    names = (STATE, OFFLINE, "sweep--*.json", "confirm--*.json", "extra--*.json", ".*.json.tmp-*")
    return sorted({p for pattern in names for p in folder.glob(pattern) if p.is_file()})


def _read_json(path: Path) -> object | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


class Measurements:
    """The measurements folder of one benchmark; see the module docstring."""

    def __init__(self, folder: Path, state: dict, log: Callable[[str], None]):
        self.folder = folder
        self.state = state
        self.log = log
        self.kept = 0
        """Measurements read back from an earlier run of the same benchmark so far."""

    # -- opening

    @classmethod
    def open(
        cls, out_dir: str | Path, fingerprint: Mapping, *, fresh: bool = False, on_other: str = "replace", log: Callable[[str], None] = print
    ) -> "Measurements":
        """The measurements in `out_dir`, resumed or begun afresh (see the module docstring);
        `fresh` discards any there."""
        if on_other not in ("replace", "refuse"):
            raise ValueError(f"on_other={on_other!r}: give 'replace' or 'refuse'")
        folder = Path(out_dir) / MEASUREMENTS
        fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from disk
        state = _read_json(folder / STATE) if folder.is_dir() else None
        if isinstance(state, dict) and not fresh and not state.get("complete") and state.get("fingerprint") == fingerprint:
            store = cls(folder, state, log)
            found = len(store.files())
            log(f"resuming the benchmark begun {state.get('started', '?')}: {found} finished measurement file(s) kept in {folder}")
            return store
        if isinstance(state, dict) and not fresh and not state.get("complete") and on_other == "refuse":
            differ = _differences(state.get("fingerprint") or {}, fingerprint)
            raise OtherMeasurements(
                f"{folder} holds the measurements of an unfinished benchmark with other settings ({'; '.join(differ[:4])}): "
                "rerun with its settings to resume it, give another --out, or --overwrite to discard them"
            )
        if _ours(folder):
            why = (
                "as asked"
                if fresh
                else "of a finished benchmark"
                if isinstance(state, dict) and state.get("complete")
                else "of other settings"
                if isinstance(state, dict)
                else "unreadable"
            )
            log(f"discarding the measurements in {folder} ({why}): measuring afresh")
            for path in _ours(folder):
                path.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        store = cls(folder, {"fingerprint": fingerprint, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "complete": False, "choices": {}}, log)
        store._write_state()
        return store

    def _write_state(self) -> None:
        write_json_atomic(self.folder / STATE, self.state)

    def files(self) -> list[Path]:
        """The measurement files, state excluded."""
        return [p for p in _ours(self.folder) if p.name != STATE and not p.name.startswith(".")]

    def choice(self, name: str) -> object | None:
        """A decision kept from the run that began these measurements (how they were served)."""
        return self.state["choices"].get(name)

    def set_choice(self, name: str, value: object) -> None:
        self.state["choices"][name] = value
        self._write_state()

    def finish(self) -> None:
        """Mark them complete (the report is written): a rerun measures anew."""
        self.state["complete"] = True
        self.state["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        self._write_state()

    # -- offline reference

    def offline(self) -> list[dict]:
        """The offline reference's results kept so far, in prompt order (dicts of `Result`'s fields)."""
        rows = _read_json(self.folder / OFFLINE)
        rows = rows if isinstance(rows, list) else []
        self.kept += bool(rows)
        return rows

    def save_offline(self, rows: Sequence[Mapping]) -> None:
        write_json_atomic(self.folder / OFFLINE, list(rows))

    # -- other results, by name

    def extra(self, name: str) -> object | None:
        """A result kept under `name` (`save_extra`), or None."""
        found = _read_json(self.folder / f"extra--{name}.json")
        self.kept += found is not None
        return found

    def save_extra(self, name: str, value: object) -> None:
        write_json_atomic(self.folder / f"extra--{name}.json", value)

    # -- served levels and rounds

    def _path(self, phase: str, label: str, concurrency: int, round_index: int | None = None) -> Path:
        name = f"{phase}--{_slug(label)}--c{concurrency}" + (f"--r{round_index + 1}" if round_index is not None else "")
        return self.folder / f"{name}.json"

    def _read(self, path: Path, **expected) -> dict | None:
        body = _read_json(path)
        if not isinstance(body, dict) or any(body.get(k) != v for k, v in expected.items()):
            return None
        return body

    def has(self, phase: str, label: str, concurrency: int, round_index: int | None = None) -> bool:
        """Whether that level (or round) was kept; its file is read only by `level` or `round`."""
        return self._path(phase, label, concurrency, round_index).is_file()

    def level(self, phase: str, label: str, concurrency: int) -> tuple[LevelResult, dict] | None:
        """A level kept from an earlier run, and its run's description (model, URL, config, ...)."""
        body = self._read(self._path(phase, label, concurrency), label=label, concurrency=concurrency)
        if body is None:
            return None
        self.kept += 1
        return LevelResult.from_dict(body["level"]), body["run"]

    def save_level(self, phase: str, label: str, level: LevelResult, run: Mapping) -> None:
        body = {
            "label": label,
            "concurrency": level.concurrency,
            "level": level.to_dict(),
            "run": dict(run),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        write_json_atomic(self._path(phase, label, level.concurrency), body)

    def round(self, phase: str, label: str, concurrency: int, round_index: int, prompts: Sequence[int]) -> dict | None:
        """A round kept from an earlier run: its requests, wall time, speculation statistics
        (None without speculation) and its run's description; None when not kept."""
        body = self._read(
            self._path(phase, label, concurrency, round_index), label=label, concurrency=concurrency, round=round_index, prompts=list(prompts)
        )
        if body is None:
            return None
        self.kept += 1
        return {
            "requests": [RequestResult.from_dict(r) for r in body["requests"]],
            "wall_s": body["wall_s"],
            "spec": SpecStats.from_dict(body["spec"]) if body.get("spec") else None,
            "run": body["run"],
        }

    def save_round(
        self,
        phase: str,
        label: str,
        concurrency: int,
        round_index: int,
        prompts: Sequence[int],
        requests: Sequence[RequestResult],
        wall_s: float,
        spec: SpecStats | None,
        run: Mapping,
    ) -> None:
        body = {
            "label": label,
            "concurrency": concurrency,
            "round": round_index,
            "prompts": list(prompts),
            "requests": [r.to_dict() for r in requests],
            "wall_s": wall_s,
            "spec": spec.to_dict() if spec else None,
            "run": dict(run),
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        write_json_atomic(self._path(phase, label, concurrency, round_index), body)
