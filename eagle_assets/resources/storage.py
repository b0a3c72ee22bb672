"""Where the assets keep their outputs: one root, one layout.

    <root>/<target>/prompts/              prompt set (Parquet)
    <root>/<target>/corpus/               synthetic corpus shards + manifest
    <root>/<target>/vocab_mapping.safetensors
    <root>/<target>/hidden_states/        shard-00000/ ... (one per partition)
    <root>/<target>/drafter/              training checkpoints, drafter-vllm/ and drafter-sglang/ exports
    <root>/<target>/report/               benchmark report (Markdown, JSON, PNG)

The root is a folder, or an fsspec URL (s3://bucket/eagle, gs://..., memory://...). The engine,
the trainer and the shard readers open these files directly, so with a URL root the assets work
in a local mirror folder (`mirror`, default under the cache) and sync it through the storage:

    storage.fetch(storage.corpus(t))      # before the asset reads: the published corpus, into the mirror
    storage.publish(storage.corpus(t))    # after it writes: the mirror's corpus, to the URL
    due = storage.publisher(storage.corpus(t), every_s=300)
    due()                                 # while it writes, between two writes: published when 300 s have passed

For a folder root all are no-ops and the paths are the folder's own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import dagster as dg
from upath import UPath

from eagle_assets.durable import replace_durably
from eagle_assets.paths import data_location, mirror_dir
from eagle_assets.settings_env import fsspec_problem

MARKER_SUFFIX = ".synced.json"
"""A published unit `<root>/<target>/corpus` is complete when `<root>/<target>/corpus.synced.json` exists."""


def check_storage_url(url: str) -> None:
    """Refuse a URL whose protocol fsspec does not know (or whose package is not installed),
    naming fsspec's own error."""
    if problem := fsspec_problem(url):
        raise ValueError(
            f"storage root {url!r}: fsspec cannot open it ({problem}): give a folder, or a URL of a "
            "filesystem fsspec knows with its package installed (s3fs for s3://, gcsfs for gs://)"
        )


class StorageResource(dg.ConfigurableResource):
    """The root under which every asset of a target writes."""

    root: str = ""
    """A folder, or an fsspec URL synced through a local mirror; empty means EAGLE_ASSETS_DATA's (default ./data)."""
    mirror: str = ""
    """With a URL root: the local folder the assets work in; empty means <cache>/storage/<hash of the URL>."""

    # ---- where -------------------------------------------------------------------------------

    def location(self) -> str:
        """The root as given: a folder or a URL."""
        return self.root or str(data_location())

    def is_remote(self) -> bool:
        return "://" in self.location()

    def local_root(self) -> Path:
        """The folder the assets read and write: the root itself, or a URL root's mirror."""
        location = self.location()
        if "://" not in location:
            return Path(location)
        check_storage_url(location)
        return Path(self.mirror).expanduser().resolve() if self.mirror else mirror_dir(location)

    def remote(self, path: Path) -> UPath:
        """Where a local path of the layout lives in the storage (the path itself for a folder root)."""
        if not self.is_remote():
            return UPath(path)
        return UPath(self.location()).joinpath(*Path(path).relative_to(self.local_root()).parts)

    def base(self, target: str) -> Path:
        return self.local_root() / target.replace("/", "_")

    def prompts(self, target: str) -> Path:
        return self.base(target) / "prompts"

    def corpus(self, target: str) -> Path:
        return self.base(target) / "corpus"

    def vocab_mapping(self, target: str) -> Path:
        return self.base(target) / "vocab_mapping.safetensors"

    def hidden_states(self, target: str) -> Path:
        return self.base(target) / "hidden_states"

    def drafter(self, target: str) -> Path:
        return self.base(target) / "drafter"

    def report(self, target: str) -> Path:
        return self.base(target) / "report"

    # ---- sync-through ------------------------------------------------------------------------
    #
    # A publish is made of units: a folder (or file) of the layout, and its marker next to it,
    # `<unit>.synced.json`, which lists the unit's files with their sizes and modification times.
    # Publishing removes the marker first, uploads the files, removes the objects the unit no
    # longer holds, and writes the marker last. A fetch reads only units that have a marker and
    # takes exactly the files the marker lists, checking their sizes, so a publish that stopped
    # part way (no marker) is never taken for a complete one. Objects appear whole once their
    # upload completes, so no object is ever seen half written.

    def fetch(self, *paths: Path, log=None) -> list[str]:
        """Bring the published units at or under each local `paths` into the mirror (files already
        there with the published size and time are kept). Returns the units fetched."""
        if not self.is_remote():
            return []
        fs, root = self._fs()
        fs.invalidate_cache()  # another node may have published since this process last looked
        fetched = []
        for path in paths:
            key = self._key(path)
            # The unit itself, the units under it (hidden_states/shard-*), or the unit it lies in
            # (drafter/drafter-vllm is part of drafter): then only its own files.
            markers = [m for m in (key + MARKER_SUFFIX,) if fs.exists(m)]
            if fs.isdir(key):
                markers += [m for m in fs.find(key) if m.endswith(MARKER_SUFFIX)]
            if not markers:
                above = [f"{root}/{a.as_posix()}{MARKER_SUFFIX}" for a in Path(path).relative_to(self.local_root()).parents[:-1]]
                markers = [m for m in above if fs.exists(m)][:1]
            if not markers and fs.isdir(key) and log:
                log(f"{self.remote(path)} holds files but no {MARKER_SUFFIX} marker (a publish that did not finish): not fetched")
            for marker in markers:
                unit = marker[: -len(MARKER_SUFFIX)]
                only = key[len(unit) + 1 :] if key.startswith(unit + "/") else ""
                fetched.append(self._fetch_unit(fs, unit, json.loads(fs.cat_file(marker)), only))
        if log and fetched:
            log(f"fetched from {self.location()} into {self.local_root()}: {', '.join(fetched)}")
        return fetched

    def publish(self, *paths: Path, log=None) -> list[str]:
        """Upload each local unit in `paths` (a folder or a file) to the storage, marker last.
        A path that does not exist locally is left as it is in the storage. Returns the units published."""
        if not self.is_remote():
            return []
        fs, _ = self._fs()
        published = []
        for path in paths:
            path = Path(path)
            if not path.exists():
                continue
            unit, marker = self._key(path), self._key(path) + MARKER_SUFFIX
            files = {"": path} if path.is_file() else {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}
            listed = {rel: _stamp(p) for rel, p in files.items()}
            before = json.loads(fs.cat_file(marker))["files"] if fs.exists(marker) else {}
            if fs.exists(marker):
                fs.rm_file(marker)
            for rel, local in files.items():
                if before.get(rel) != listed[rel]:  # unchanged since the last publish: already there
                    fs.put_file(str(local), _join(unit, rel))
            if path.is_dir() and fs.isdir(unit):
                stale = [k for k in fs.find(unit) if k[len(unit) + 1 :] not in listed and not k.endswith(MARKER_SUFFIX)]
                if stale:
                    fs.rm(stale)
            fs.pipe_file(marker, json.dumps({"files": listed}, indent=1).encode())
            published.append(str(self.remote(path)))
        if log and published:
            log(f"published to {self.location()}: {', '.join(published)}")
        return published

    def publisher(self, path: Path, every_s: float, log=None, clock: Callable[[], float] = time.monotonic) -> Callable[[], None]:
        """A callable that publishes `path` when `every_s` seconds have passed since it was made or
        last published, and does nothing otherwise (or when `every_s` is 0, or the root is a
        folder). Call it only where no file of the unit is being written: a publish takes the
        files as they are."""
        last = clock()

        def publish_when_due() -> None:
            nonlocal last
            if every_s <= 0 or not self.is_remote() or clock() - last < every_s:
                return
            self.publish(path, log=log)
            last = clock()

        return publish_when_due

    def _fs(self):
        root = UPath(self.location())
        return root.fs, root.path.rstrip("/")

    def _key(self, path: Path) -> str:
        return self.remote(path).path.rstrip("/")

    def _fetch_unit(self, fs, unit: str, marker: dict, only: str = "") -> str:
        """The unit's listed files (those under `only`, a path inside it, where given)."""
        local_unit = self.local_root() / Path(unit[len(self._fs()[1]) + 1 :])
        for rel, (size, mtime_ns) in marker["files"].items():
            if only and rel != only and not rel.startswith(only + "/"):
                continue
            local = local_unit / rel if rel else local_unit
            if local.is_file() and _stamp(local) == [size, mtime_ns]:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            # Into a file of this process's own, renamed into place: processes of one node that
            # fetch the same unit at once never see each other's half-written file.
            part = local.with_name(f".{local.name}.part-{os.getpid()}")
            fs.get_file(_join(unit, rel), str(part))
            if part.stat().st_size != size:
                part.unlink()
                raise RuntimeError(
                    f"{_join(unit, rel)} has changed since its publish (size {size} expected): "
                    "another node is publishing it now; rerun once that run is done"
                )
            os.utime(part, ns=(mtime_ns, mtime_ns))  # the published time: an unchanged file is not uploaded again
            replace_durably(part, local)
        return str(self.remote(local_unit / only if only else local_unit))


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _join(unit: str, rel: str) -> str:
    return f"{unit}/{rel}" if rel else unit
