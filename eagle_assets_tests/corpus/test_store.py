"""CorpusStore: shards, manifest, crash recovery, failures, any fsspec URL."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.corpus.store import CorpusStore, CorpusStoreError
from eagle_assets.formats import CORPUS_COLUMNS, CORPUS_FAILURES, CORPUS_MANIFEST


def row(i: int) -> dict:
    return {
        "sample_id": f"s{i:03d}",
        "prompt_id": f"p{i:03d}",
        "source": "file",
        "messages": json.dumps([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]),
        "input_ids": [1, 2, 3, i],
        "loss_mask": [0, 0, 1, 1],
        "num_tokens": 4,
        "num_turns": 1,
        "finish_reason": "stop",
        "truncated": False,
        "reasoning_captured": False,
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "latency_s": 0.5,
        "sampling": "{}",
        "target": "t",
    }


def test_rows_are_flushed_in_shards_and_read_back(tmp_path):
    with CorpusStore(str(tmp_path), shard_size=3) as store:
        for i in range(7):
            store.append(row(i))
        assert store.num_rows == 6  # two full shards written, one row buffered
        assert store.done_ids() == {f"s{i:03d}" for i in range(7)}
    reader = CorpusStore(str(tmp_path), mode="r")
    assert reader.shard_files() == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [s["num_rows"] for s in reader.manifest["shards"]] == [3, 3, 1]
    assert reader.manifest["num_rows"] == 7
    assert list(reader.iter_rows()) == [row(i) for i in range(7)]
    table = reader.read_table()
    assert tuple(table.column_names) == CORPUS_COLUMNS
    assert table.schema.field("input_ids").type.value_type == pa.int32()
    assert table.schema.field("loss_mask").type.value_type == pa.uint8()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CORPUS_MANIFEST, "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


def test_bad_rows_and_duplicate_ids_are_refused(tmp_path):
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        store.append(row(0))
        with pytest.raises(CorpusStoreError, match="sample s000 is already in"):
            store.append(row(0))
        store.append(row(1))  # flushed
        with pytest.raises(CorpusStoreError, match="sample s001 is already in"):
            store.append(row(1))
        with pytest.raises(CorpusStoreError, match=r"missing \['truncated'\]"):
            store.append({k: v for k, v in row(2).items() if k != "truncated"})
    with pytest.raises(CorpusStoreError, match="read-only"):
        CorpusStore(str(tmp_path), mode="r").append(row(3))


def test_a_shard_renamed_in_before_the_manifest_is_adopted_and_temp_files_dropped(tmp_path):
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        for i in range(2):
            store.append(row(i))
        before = (tmp_path / CORPUS_MANIFEST).read_text()
        for i in range(2, 4):
            store.append(row(i))
    # The state a kill leaves between the shard's rename and the manifest's: the old manifest,
    # the new shard in place, and a half-written temporary file of the next shard.
    (tmp_path / CORPUS_MANIFEST).write_text(before)
    (tmp_path / ".tmp-0badbeef-part-00002.parquet").write_bytes(b"PAR1 half a shard")
    assert CorpusStore(str(tmp_path), mode="r").num_rows == 2  # readers trust the manifest only

    store = CorpusStore(str(tmp_path), shard_size=2)
    assert store.num_rows == 4
    assert store.done_ids() == {"s000", "s001", "s002", "s003"}
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    store.append(row(4))
    store.close()
    ids = CorpusStore(str(tmp_path), mode="r").read_table(["sample_id"]).column("sample_id").to_pylist()
    assert ids == ["s000", "s001", "s002", "s003", "s004"]


def test_an_orphan_shard_repeating_stored_ids_is_reported(tmp_path):
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        store.append(row(0))
        store.append(row(1))
    pq.write_table(CorpusStore(str(tmp_path), mode="r").read_table(), tmp_path / "part-00007.parquet")
    with pytest.raises(CorpusStoreError, match="part-00007.parquet is not in the manifest and repeats sample ids"):
        CorpusStore(str(tmp_path))


def test_failures_are_kept_until_the_sample_succeeds(tmp_path):
    with CorpusStore(str(tmp_path), shard_size=10) as store:
        store.append(row(0))
        store.record_failure({"sample_id": "s001", "error": "HTTP 500"})
        store.record_failure({"sample_id": "s002", "error": "timeout"})
    lines = (tmp_path / CORPUS_FAILURES).read_text().splitlines()
    assert [json.loads(x)["sample_id"] for x in lines] == ["s001", "s002"]

    with CorpusStore(str(tmp_path), shard_size=10) as store:
        assert {f["sample_id"] for f in store.failures()} == {"s001", "s002"}
        store.append(row(1))
        store.record_failure({"sample_id": "s002", "error": "timeout again"})
    failures = CorpusStore(str(tmp_path), mode="r").failures()
    assert failures == [{"sample_id": "s002", "error": "timeout again", "runs_failed": 2}]


def test_any_fsspec_url_works():
    url = f"memory://corpus-{uuid.uuid4().hex[:8]}"
    with CorpusStore(url, shard_size=2) as store:
        for i in range(3):
            store.append(row(i))
        store.update_meta(target="t")
    reader = CorpusStore(url, mode="r")
    assert reader.num_rows == 3 and reader.meta == {"target": "t"}
    assert [r["sample_id"] for r in reader.iter_rows(["sample_id"])] == ["s000", "s001", "s002"]


def test_a_foreign_manifest_is_refused(tmp_path):
    (tmp_path / CORPUS_MANIFEST).write_text(json.dumps({"shards": [{"path": "x.parquet"}]}))
    with pytest.raises(CorpusStoreError, match="Regenerate the corpus into a new folder"):
        CorpusStore(str(tmp_path))


def test_a_shard_changed_after_it_was_written_is_set_aside(tmp_path):
    """Same ids, other content: the footer and ids read fine, so only the SHA-256 recorded when the
    shard was written (compared because the file is newer than the manifest) tells."""
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        for i in range(4):
            store.append(row(i))
    shard = tmp_path / "part-00001.parquet"
    table = pq.read_table(shard)
    changed = table.set_column(table.schema.get_field_index("messages"), "messages", pa.array(["[]", "[]"]))
    pq.write_table(changed, shard)
    with pytest.raises(CorpusStoreError, match=r"part-00001\.parquet was modified after it was written"):
        CorpusStore(str(tmp_path), mode="r")
    store = CorpusStore(str(tmp_path), shard_size=2)
    assert store.done_ids() == {"s000", "s001"} and len(store.repairs) == 1
    assert [p.name.split(".corrupt-")[0] for p in tmp_path.glob("*.corrupt-*")] == ["part-00001.parquet"]
    store.append(row(2))
    store.append(row(3))
    store.close()
    assert list(CorpusStore(str(tmp_path), mode="r").iter_rows()) == [row(i) for i in range(4)]


def test_random_sigkills_resume_to_the_uninterrupted_corpus(tmp_path):
    """A writer killed at random points, again and again, then let finish: the same rows as one
    uninterrupted run, each once, and no failure left for a sample that succeeded."""
    import random
    import signal
    import subprocess
    import sys

    from eagle_assets.paths import PROJECT_ROOT

    n, shard_size = 40, 3
    url = str(tmp_path / "killed")
    rng = random.Random(1)
    kills = 0
    for _ in range(6):
        child = subprocess.Popen(
            [sys.executable, "-m", "eagle_assets_tests.corpus.store_child", url, str(n), str(shard_size)],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        stop_after = rng.randint(1, 7)  # rows appended by this run before the kill
        try:
            for count, line in enumerate(child.stdout, 1):
                if line.strip() == "done" or count >= stop_after:
                    break
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            child.kill()
            child.wait()
    assert kills >= 5
    final = subprocess.run(
        [sys.executable, "-m", "eagle_assets_tests.corpus.store_child", url, str(n), str(shard_size)],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
    )
    assert final.returncode == 0 and final.stdout.splitlines()[-1] == "done", final.stderr[-2000:]

    reader = CorpusStore(url, mode="r")
    ids = reader.read_table(["sample_id"]).column("sample_id").to_pylist()
    assert sorted(ids) == [row(i)["sample_id"] for i in range(n)]  # every row, none twice
    assert sorted(reader.iter_rows(), key=lambda r: r["sample_id"]) == [row(i) for i in range(n)]
    assert reader.failures() == []
    assert not [p for p in (tmp_path / "killed").iterdir() if p.name.startswith(".tmp-") or ".corrupt-" in p.name]
