"""The corpus on disk: Parquet shards with exactly `formats.CORPUS_COLUMNS`, and a manifest.

Layout under the store URL (any fsspec URL: a local folder, `s3://...`, `memory://...`):

    manifest.json        formats.CORPUS_MANIFEST: the shards, their row counts, sample ids and SHA-256
    part-00000.parquet   complete shards, written under a temporary name then renamed
    failures.jsonl       formats.CORPUS_FAILURES: samples that failed and are not done yet

Rows are buffered and a shard is written every `shard_size` rows, then the manifest, each
atomically (temporary name, then rename) and, on local disks, durably (the data fsynced before
the rename, the folder after it). A process killed at any moment therefore loses at most the
unflushed buffer: it never leaves a partial shard, and since a shard renamed into place just
before a kill is adopted into the manifest when the store is next opened for writing, no
sample id is ever written twice. One writer per store at a time.

Nothing the manifest says is taken on trust: opening the store reads every listed shard's
Parquet footer and `sample_id` column (page checksums verified; the wide columns are not
read), so a sample counts as done only if a readable shard holds it; a shard modified after
the manifest was last written (on a local disk) is also hashed and compared with the SHA-256
recorded when it was written (the store writes a shard before the manifest that lists it, so
an untouched shard never is). Opened for writing, the store repairs what it finds (`repairs`
lists it, and each is logged): a shard listed but gone is dropped from the manifest, an
unreadable or changed one (truncated, garbage) is renamed aside to
`part-NNNNN.parquet.corrupt-<hex>` and dropped, an entry whose ids differ from its file's is
rewritten from the file; the samples dropped are generated again by the next corpus run.
Opened read-only, it refuses such a store with the file named and that fix. A torn line in
`failures.jsonl` (bookkeeping only: a failed sample is not done either way) is skipped.

    with CorpusStore("data/corpus", shard_size=256) as store:   # resumes what is there
        done = store.done_ids()
        store.append(row)                                       # a dict with CORPUS_COLUMNS
    table = CorpusStore("data/corpus", mode="r").read_table()
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from eagle_assets.checked_reads import parse_json_object
from eagle_assets.durable import fsync_dir, no_room
from eagle_assets.formats import CORPUS_COLUMNS, CORPUS_FAILURES, CORPUS_MANIFEST, stable_id

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "eagle_assets.corpus/1"
SHARD_RE = re.compile(r"^part-(\d{5,})\.parquet$")
TMP_PREFIX = ".tmp-"
REPAIR_FIX = (
    "open the store for writing (rerun the corpus stage, or CorpusStore(url)): it repairs the manifest from the "
    "shards themselves, setting damaged ones aside, and the corpus stage generates their samples again"
)
CORRUPT_SUFFIX = ".corrupt-"
"""An unreadable shard is renamed to `part-NNNNN.parquet.corrupt-<hex>`: kept for inspection,
never read (it matches neither SHARD_RE nor `*.parquet`)."""

CORPUS_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("prompt_id", pa.string()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("num_tokens", pa.int32()),
        ("num_turns", pa.int32()),
        ("finish_reason", pa.string()),
        ("truncated", pa.bool_()),
        ("reasoning_captured", pa.bool_()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("latency_s", pa.float64()),
        ("sampling", pa.string()),
        ("target", pa.string()),
    ]
)
assert tuple(CORPUS_SCHEMA.names) == CORPUS_COLUMNS, "store schema out of step with formats.CORPUS_COLUMNS"


def _is_shard_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("file"), str)
        and SHARD_RE.match(entry["file"]) is not None
        and isinstance(entry.get("num_rows"), int)
        and isinstance(entry.get("sample_ids"), list)
        and all(isinstance(x, str) for x in entry["sample_ids"])
    )


class CorpusStoreError(RuntimeError):
    """The store's files are not what the store wrote, or a row breaks the format."""


def shard_file(index: int) -> str:
    return f"part-{index:05d}.parquet"


class CorpusStore:
    """Buffered, crash-safe corpus writer and reader over fsspec."""

    def __init__(
        self,
        url: str,
        *,
        shard_size: int = 256,
        mode: str = "a",
        storage_options: Mapping[str, Any] | None = None,
    ):
        if mode not in ("a", "r"):
            raise ValueError(f"mode must be 'a' (append, resuming) or 'r' (read only), got {mode!r}")
        if shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, got {shard_size}")
        self.url = url
        self.mode = mode
        self.shard_size = shard_size
        self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self._buffer: list[dict] = []
        self._buffered_ids: set[str] = set()
        self._failed: OSError | None = None
        """A write that found the disk full: raised once, after which nothing more is written."""
        self.repairs: list[str] = []
        """What opening the store for writing found wrong and repaired, one line each."""
        self._failures_dirty = False
        self._manifest = self._read_manifest()
        self._done: set[str] = set()
        self._verify_shards()
        self._failures: dict[str, dict] = self._read_failures()
        if mode == "a":
            self._recover()

    # ---- paths and atomic writes ------------------------------------------------------
    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def _atomic_write(self, name: str, data: bytes) -> None:
        tmp = self._path(f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{name}")
        try:
            self._write_then_rename(tmp, name, data)
        except OSError as exc:
            # Nothing half-written stays: the temporary file goes, the final name keeps what it held.
            try:
                self.fs.rm(tmp)
            except (OSError, FileNotFoundError):
                pass
            full = no_room(exc, self._path(name), f"{name} ({len(data)} bytes) of the corpus", self._kept())
            if full is None:
                raise
            self._failed = full
            raise full from None

    def _kept(self) -> str:
        """What a failed write leaves, for its message."""
        waiting = f"; the {len(self._buffer)} samples not yet in a shard are generated again by a rerun" if self._buffer else ""
        return f"the {self.num_rows} samples in complete shards are kept{waiting}"

    def _write_then_rename(self, tmp: str, name: str, data: bytes) -> None:
        if not self.fs.exists(self.root):
            self.fs.makedirs(self.root, exist_ok=True)
            if self._local:
                fsync_dir(posixpath.dirname(self.root.rstrip("/")) or "/")  # keep the new folder's own entry
        if self._local:
            # fsync before the rename: after a power loss the rename could otherwise survive
            # while the data did not (a complete-looking shard of zeros); fsync the folder after
            # it, so that the rename itself survives.
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(name))
            fsync_dir(self.root)
            return
        # Other fsspec filesystems offer no fsync. On object stores (s3, gcs, azure) there is
        # nothing to flush: an object appears whole, and durably, once its upload completes on
        # close, and `mv` is a copy of the complete object, so the final name never shows a
        # half-written file; memory:// keeps nothing across a crash anyway.
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, self._path(name))

    @property
    def _local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    # ---- manifest, failures, recovery -------------------------------------------------
    def _read_manifest(self) -> dict:
        path = self._path(CORPUS_MANIFEST)
        if not self.fs.exists(path):
            return {"format": MANIFEST_FORMAT, "columns": list(CORPUS_COLUMNS), "num_rows": 0, "shards": [], "meta": {}}
        where = f"{self.url}/{CORPUS_MANIFEST}"
        fix = (
            "the store writes it atomically, so something else changed it. Restore it, or move it aside: "
            "the store then lists the part-*.parquet files again when opened for writing"
        )
        with self.fs.open(path, "rb") as f:
            data = f.read()
        try:
            manifest = parse_json_object(data, where, "the corpus manifest", fix)
        except ValueError as exc:
            raise CorpusStoreError(str(exc)) from None
        if manifest.get("format") != MANIFEST_FORMAT or tuple(manifest.get("columns", ())) != CORPUS_COLUMNS:
            raise CorpusStoreError(
                f"{where} has format {manifest.get('format')!r} with columns "
                f"{manifest.get('columns')}; this version writes {MANIFEST_FORMAT} with {list(CORPUS_COLUMNS)}. "
                "Regenerate the corpus into a new folder."
            )
        shards, meta = manifest.get("shards"), manifest.get("meta", {})
        if not (isinstance(shards, list) and all(map(_is_shard_entry, shards)) and isinstance(meta, dict)):
            raise CorpusStoreError(
                f"{where}: its shard list is not a list of {{file, num_rows, sample_ids}} entries, or its meta not an object: {fix}"
            )
        manifest["meta"] = meta
        return manifest

    def _read_ids(self, name: str) -> list[str]:
        """The sample ids in shard `name`, read through its footer with page checksums verified;
        a CorpusStoreError naming the file when it cannot be read as one of ours."""
        try:
            with self.fs.open(self._path(name), "rb") as f:
                pf = pq.ParquetFile(f, page_checksum_verification=True)
                if tuple(pf.schema_arrow.names) != CORPUS_COLUMNS:
                    raise CorpusStoreError(f"{self.url}/{name} has columns {pf.schema_arrow.names}, not formats.CORPUS_COLUMNS")
                return pf.read(columns=["sample_id"]).column("sample_id").to_pylist()
        except (pa.ArrowException, OSError) as exc:  # ArrowInvalid: no footer (truncated), garbage, a bad page
            raise CorpusStoreError(f"{self.url}/{name} is not a readable Parquet file ({exc})") from None

    def _verify_shards(self) -> None:
        """Fill `_done` from the listed shards' own ids; repair (mode "a") or refuse (mode "r")
        a listed shard that is gone, unreadable, or holds other ids than its entry lists."""
        kept, changed = [], False
        for entry in self._manifest["shards"]:
            name = entry["file"]
            if not self.fs.exists(self._path(name)):
                problem, ids = "is listed in the manifest but does not exist", None
            else:
                try:
                    ids = self._read_ids(name)
                    if self._changed_since_manifest(name):
                        self._check_whole(name, entry.get("sha256"))
                    problem = None
                except CorpusStoreError as exc:
                    problem, ids = str(exc).removeprefix(f"{self.url}/{name} "), None
                if ids is not None and (ids != entry["sample_ids"] or len(ids) != entry["num_rows"]):
                    problem = (
                        f"holds {len(ids)} samples, where {self.url}/{CORPUS_MANIFEST} lists {entry['num_rows']} "
                        f"({len(set(entry['sample_ids']) - set(ids))} of them not in the file)"
                    )
            if problem is None:
                kept.append(entry)
            elif self.mode == "r":
                raise CorpusStoreError(f"{self.url}/{name} {problem}: {REPAIR_FIX}")
            else:
                changed = True
                if ids is not None:  # a readable file: its ids are the truth, the entry is rewritten
                    entry = {"file": name, "num_rows": len(ids), "sample_ids": ids, "sha256": self._sha256(name)}
                    kept.append(entry)
                    self._repaired(f"{self.url}/{name} {problem}: its entry was rewritten from the file")
                elif self.fs.exists(self._path(name)):
                    aside = f"{name}{CORRUPT_SUFFIX}{uuid.uuid4().hex[:8]}"
                    self.fs.mv(self._path(name), self._path(aside))
                    self._repaired(f"{self.url}/{name} {problem}: moved aside to {aside}; its samples will be generated again")
                else:
                    self._repaired(f"{self.url}/{name} {problem}: dropped from the manifest; its samples will be generated again")
            if ids is not None:
                clash = self._done.intersection(ids)
                if clash or len(set(ids)) != len(ids):
                    raise CorpusStoreError(
                        f"{self.url}/{name} repeats sample ids stored in another shard or in itself (e.g. "
                        f"{sorted(clash)[:3]}); two writers may have shared this folder. Move {name} aside and rerun."
                    )
                self._done.update(ids)
        if changed:
            self._manifest["shards"] = kept
            self._write_manifest()

    def _changed_since_manifest(self, name: str) -> bool:
        """Whether shard `name` was modified after the manifest was last written. The store
        writes each shard before the manifest that lists it, so an untouched shard never is.
        Local disks only: other filesystems' modification times are not comparable this way."""
        if not self._local:
            return False
        return os.stat(self._path(name)).st_mtime_ns > os.stat(self._path(CORPUS_MANIFEST)).st_mtime_ns

    def _sha256(self, name: str) -> str:
        with self.fs.open(self._path(name), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    def _check_whole(self, name: str, sha256: str | None) -> None:
        """Check all of shard `name`, not just its ids: against the SHA-256 recorded when it was
        written, or (an entry from before that was recorded) by reading every page."""
        if sha256 is None:
            self._read_table(name)
        elif (digest := self._sha256(name)) != sha256:
            raise CorpusStoreError(
                f"{self.url}/{name} was modified after it was written: its SHA-256 is {digest[:16]}..., the manifest recorded {sha256[:16]}..."
            )

    def _repaired(self, what: str) -> None:
        log.warning("corpus store: %s", what)
        self.repairs.append(what)

    def _read_failures(self) -> dict[str, dict]:
        path = self._path(CORPUS_FAILURES)
        if not self.fs.exists(path):
            return {}
        out = {}
        with self.fs.open(path, "rb") as f:
            lines = f.read().split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                out[record["sample_id"]] = record
            except (ValueError, TypeError, KeyError):
                # A torn or foreign line: the record is lost, not the sample (a failed sample is
                # not done, so it is tried again); the next write of the file leaves the line out.
                log.warning("corpus store: %s/%s line %d is not a failure record; skipped", self.url, CORPUS_FAILURES, number)
                self._failures_dirty = self.mode == "a"
        return out

    def _write_manifest(self) -> None:
        self._manifest["num_rows"] = sum(s["num_rows"] for s in self._manifest["shards"])
        self._atomic_write(CORPUS_MANIFEST, json.dumps(self._manifest, indent=1).encode())

    def _write_failures(self) -> None:
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self._failures.values())
        self._atomic_write(CORPUS_FAILURES, lines.encode("utf-8"))
        self._failures_dirty = False

    def _recover(self) -> None:
        """Drop temporary files of a killed writer; adopt shards renamed in but not yet listed."""
        if not self.fs.exists(self.root):
            return
        listed = {s["file"] for s in self._manifest["shards"]}
        adopted = False
        for path in sorted(self.fs.ls(self.root, detail=False)):
            name = posixpath.basename(path.rstrip("/"))
            if name.startswith(TMP_PREFIX):
                self.fs.rm(path)
            elif SHARD_RE.match(name) and name not in listed:
                try:
                    ids = self._read_ids(name)
                except CorpusStoreError as exc:  # renamed in whole, so damaged since: not adopted
                    aside = f"{name}{CORRUPT_SUFFIX}{uuid.uuid4().hex[:8]}"
                    self.fs.mv(path, self._path(aside))
                    self._repaired(f"{exc}; not in the manifest either: moved aside to {aside}")
                    continue
                clash = self._done.intersection(ids)
                if clash or len(set(ids)) != len(ids):
                    raise CorpusStoreError(
                        f"{self.url}/{name} is not in the manifest and repeats sample ids already stored "
                        f"(e.g. {sorted(clash)[:3]}); two writers may have shared this folder. "
                        f"Move {name} aside and rerun."
                    )
                entry = {"file": name, "num_rows": len(ids), "sample_ids": ids, "sha256": self._sha256(name)}
                self._manifest["shards"].append(entry)
                self._done.update(ids)
                adopted = True
        if adopted:
            self._manifest["shards"].sort(key=lambda s: s["file"])
            self._write_manifest()
        if any(sid in self._done for sid in self._failures):
            self._failures = {k: v for k, v in self._failures.items() if k not in self._done}
            self._failures_dirty = True
        if self._failures_dirty:
            self._write_failures()

    # ---- writing ----------------------------------------------------------------------
    def append(self, row: Mapping[str, Any]) -> None:
        """Buffer one row (a dict with exactly CORPUS_COLUMNS); writes a shard when the buffer is full."""
        if self.mode != "a":
            raise CorpusStoreError(f"{self.url} was opened read-only (mode='r')")
        if self._failed is not None:  # the disk was full: the store writes no more
            raise self._failed
        keys = set(row)
        if keys != set(CORPUS_COLUMNS):
            raise CorpusStoreError(
                f"row {row.get('sample_id')!r} has columns missing {sorted(set(CORPUS_COLUMNS) - keys)} "
                f"and unexpected {sorted(keys - set(CORPUS_COLUMNS))}; rows carry exactly formats.CORPUS_COLUMNS"
            )
        sid = row["sample_id"]
        if sid in self._done or sid in self._buffered_ids:
            raise CorpusStoreError(f"sample {sid} is already in {self.url}; a sample id is written once")
        self._buffer.append(dict(row))
        self._buffered_ids.add(sid)
        if sid in self._failures:
            del self._failures[sid]
            self._failures_dirty = True
        if len(self._buffer) >= self.shard_size:
            self.flush()

    def record_failure(self, record: Mapping[str, Any]) -> None:
        """Note a sample that failed (a dict with at least `sample_id` and `error`); kept until it succeeds."""
        if "sample_id" not in record or "error" not in record:
            raise ValueError("a failure record needs `sample_id` and `error`")
        previous = self._failures.get(record["sample_id"], {})
        self._failures[record["sample_id"]] = {**dict(record), "runs_failed": previous.get("runs_failed", 0) + 1}
        self._failures_dirty = True

    def update_meta(self, **meta: Any) -> None:
        """Merge facts about the corpus (target, sampling, ...) into the manifest's `meta`."""
        self._manifest["meta"].update(meta)
        self._write_manifest()

    def flush(self) -> None:
        """Write the buffered rows as one shard, then the manifest (and failures, if changed).
        After a write found the disk full (raised once, `DiskFull`), nothing more is written: a
        second attempt would fail the same way, and the shards written before stay whole."""
        if self._failed is not None:
            return
        if self._buffer:
            index = 1 + max((int(SHARD_RE.match(s["file"]).group(1)) for s in self._manifest["shards"]), default=-1)
            name = shard_file(index)
            table = pa.Table.from_pylist(self._buffer, schema=CORPUS_SCHEMA)
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
            data = sink.getvalue()
            self._atomic_write(name, data)
            ids = [r["sample_id"] for r in self._buffer]
            entry = {"file": name, "num_rows": len(ids), "sample_ids": ids, "sha256": hashlib.sha256(data).hexdigest()}
            self._manifest["shards"].append(entry)
            self._write_manifest()
            self._done.update(ids)
            self._buffer.clear()
            self._buffered_ids.clear()
        if self._failures_dirty:
            self._write_failures()

    def close(self) -> None:
        if self.mode == "a":
            self.flush()

    def __enter__(self) -> "CorpusStore":
        return self

    def __exit__(self, *exc: object) -> None:
        # Buffered rows are complete samples: keep them even when the run is failing.
        self.close()

    # ---- reading ----------------------------------------------------------------------
    def done_ids(self) -> set[str]:
        """Sample ids stored in shards or waiting in the buffer."""
        return self._done | self._buffered_ids

    def failures(self) -> list[dict]:
        """Failed samples that have not succeeded since."""
        return list(self._failures.values())

    @property
    def manifest(self) -> dict:
        return json.loads(json.dumps(self._manifest))

    @property
    def meta(self) -> dict:
        return dict(self._manifest["meta"])

    @property
    def num_rows(self) -> int:
        """Rows in complete shards (the buffer excluded)."""
        return sum(s["num_rows"] for s in self._manifest["shards"])

    def shard_files(self) -> list[str]:
        return [s["file"] for s in self._manifest["shards"]]

    def read_shard(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """One shard's rows, page checksums verified; a CorpusStoreError naming the file and the
        fix when it cannot be read."""
        try:
            return self._read_table(name, columns)
        except CorpusStoreError as exc:
            raise CorpusStoreError(f"{exc}: {REPAIR_FIX}") from None

    def _read_table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        try:
            with self.fs.open(self._path(name), "rb") as f:
                return pq.read_table(f, columns=columns, page_checksum_verification=True)
        except (pa.ArrowException, OSError) as exc:
            raise CorpusStoreError(f"{self.url}/{name} is not a readable Parquet file ({exc})") from None

    def read_table(self, columns: list[str] | None = None) -> pa.Table:
        """Every stored row (complete shards only), in shard order."""
        tables = [self.read_shard(name, columns) for name in self.shard_files()]
        if not tables:
            schema = CORPUS_SCHEMA if columns is None else pa.schema([CORPUS_SCHEMA.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)

    def iter_rows(self, columns: list[str] | None = None) -> Iterator[dict]:
        """Stored rows one at a time, reading one shard at a time."""
        for name in self.shard_files():
            yield from self.read_shard(name, columns).to_pylist()

    def fingerprint(self) -> str:
        """Stable hash of the stored sample ids: what the next stage records as its input."""
        return stable_id(sorted(self._done))
