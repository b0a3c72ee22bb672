"""The corpus on disk: Parquet shards with exactly `formats.CORPUS_COLUMNS`, and a manifest.

Layout under the store URL (any fsspec URL: a local folder, `s3://...`, `memory://...`):

    manifest.json        formats.CORPUS_MANIFEST: the shards, their row counts and sample ids
    part-00000.parquet   complete shards, written under a temporary name then renamed
    failures.jsonl       formats.CORPUS_FAILURES: samples that failed and are not done yet

Rows are buffered and a shard is written every `shard_size` rows, then the manifest, each
atomically (temporary name, then rename). A process killed at any moment therefore loses at
most the unflushed buffer: it never leaves a partial shard, and since a shard renamed into
place just before a kill is adopted into the manifest when the store is next opened for
writing, no sample id is ever written twice. One writer per store at a time.

    with CorpusStore("data/corpus", shard_size=256) as store:   # resumes what is there
        done = store.done_ids()
        store.append(row)                                       # a dict with CORPUS_COLUMNS
    table = CorpusStore("data/corpus", mode="r").read_table()
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from eagle_assets.formats import CORPUS_COLUMNS, CORPUS_FAILURES, CORPUS_MANIFEST, stable_id

MANIFEST_FORMAT = "eagle_assets.corpus/1"
SHARD_RE = re.compile(r"^part-(\d{5,})\.parquet$")
TMP_PREFIX = ".tmp-"

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
        self._manifest = self._read_manifest()
        self._done: set[str] = {sid for s in self._manifest["shards"] for sid in s["sample_ids"]}
        self._failures: dict[str, dict] = self._read_failures()
        self._failures_dirty = False
        if mode == "a":
            self._recover()

    # ---- paths and atomic writes ------------------------------------------------------
    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def _atomic_write(self, name: str, data: bytes) -> None:
        self.fs.makedirs(self.root, exist_ok=True)
        tmp = self._path(f"{TMP_PREFIX}{uuid.uuid4().hex[:8]}-{name}")
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        # A rename on local disks; object stores have no partial objects, so the final name
        # never shows a half-written file either way.
        self.fs.mv(tmp, self._path(name))

    # ---- manifest, failures, recovery -------------------------------------------------
    def _read_manifest(self) -> dict:
        path = self._path(CORPUS_MANIFEST)
        if not self.fs.exists(path):
            return {"format": MANIFEST_FORMAT, "columns": list(CORPUS_COLUMNS), "num_rows": 0, "shards": [], "meta": {}}
        try:
            with self.fs.open(path, "rb") as f:
                manifest = json.loads(f.read())
        except json.JSONDecodeError as exc:
            raise CorpusStoreError(
                f"{self.url}/{CORPUS_MANIFEST} is not valid JSON ({exc}); the store writes it atomically, "
                "so something else changed it. Restore it or start a new corpus folder."
            ) from None
        if manifest.get("format") != MANIFEST_FORMAT or tuple(manifest.get("columns", ())) != CORPUS_COLUMNS:
            raise CorpusStoreError(
                f"{self.url}/{CORPUS_MANIFEST} has format {manifest.get('format')!r} with columns "
                f"{manifest.get('columns')}; this version writes {MANIFEST_FORMAT} with {list(CORPUS_COLUMNS)}. "
                "Regenerate the corpus into a new folder."
            )
        return manifest

    def _read_failures(self) -> dict[str, dict]:
        path = self._path(CORPUS_FAILURES)
        if not self.fs.exists(path):
            return {}
        out = {}
        with self.fs.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    out[record["sample_id"]] = record
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
                with self.fs.open(path, "rb") as f:
                    ids = pq.read_table(f, columns=["sample_id"]).column("sample_id").to_pylist()
                clash = self._done.intersection(ids)
                if clash or len(set(ids)) != len(ids):
                    raise CorpusStoreError(
                        f"{self.url}/{name} is not in the manifest and repeats sample ids already stored "
                        f"(e.g. {sorted(clash)[:3]}); two writers may have shared this folder. "
                        f"Move {name} aside and rerun."
                    )
                self._manifest["shards"].append({"file": name, "num_rows": len(ids), "sample_ids": ids})
                self._done.update(ids)
                adopted = True
        if adopted:
            self._manifest["shards"].sort(key=lambda s: s["file"])
            self._write_manifest()
        if any(sid in self._done for sid in self._failures):
            self._failures = {k: v for k, v in self._failures.items() if k not in self._done}
            self._write_failures()

    # ---- writing ----------------------------------------------------------------------
    def append(self, row: Mapping[str, Any]) -> None:
        """Buffer one row (a dict with exactly CORPUS_COLUMNS); writes a shard when the buffer is full."""
        if self.mode != "a":
            raise CorpusStoreError(f"{self.url} was opened read-only (mode='r')")
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
        """Write the buffered rows as one shard, then the manifest (and failures, if changed)."""
        if self._buffer:
            index = 1 + max((int(SHARD_RE.match(s["file"]).group(1)) for s in self._manifest["shards"]), default=-1)
            name = shard_file(index)
            table = pa.Table.from_pylist(self._buffer, schema=CORPUS_SCHEMA)
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="zstd")
            self._atomic_write(name, sink.getvalue())
            ids = [r["sample_id"] for r in self._buffer]
            self._manifest["shards"].append({"file": name, "num_rows": len(ids), "sample_ids": ids})
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
        with self.fs.open(self._path(name), "rb") as f:
            return pq.read_table(f, columns=columns)

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
