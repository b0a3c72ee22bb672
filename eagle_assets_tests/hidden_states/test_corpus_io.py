"""Finding and reading the corpus: manifest listing, plain folders, clear errors."""

from __future__ import annotations

import json

import pytest

from eagle_assets.formats import CORPUS_MANIFEST, shard_of
from eagle_assets.hidden_states.corpus_io import corpus_files, iter_corpus_rows, load_shard_samples

from .conftest import write_corpus


def test_manifest_listing_and_plain_folder_give_the_same_rows(chat_rows, tmp_path):
    listed = write_corpus(tmp_path / "listed", chat_rows, num_files=3)
    (listed / ".part-00009.parquet.tmp").write_bytes(b"partial")  # a crashed writer's leftover
    plain = write_corpus(tmp_path / "plain", chat_rows, num_files=3, manifest=False)
    (plain / "_part-00009.parquet").write_bytes(b"partial")
    for folder in (listed, plain):
        assert len(corpus_files(str(folder))[1]) == 3
        rows = list(iter_corpus_rows(str(folder), ["sample_id", "input_ids", "loss_mask"]))
        assert sorted(r["sample_id"] for r in rows) == sorted(r["sample_id"] for r in chat_rows)
        by_id = {r["sample_id"]: r for r in chat_rows}
        for r in rows:
            assert r["input_ids"].dtype.name == "int32" and r["input_ids"].tolist() == by_id[r["sample_id"]]["input_ids"]
            assert r["loss_mask"].tolist() == by_id[r["sample_id"]]["loss_mask"]


def test_reads_what_the_corpus_store_writes_through_fsspec(chat_rows):
    from eagle_assets.corpus.store import CorpusStore

    url = "memory://hidden-states-test/corpus"
    with CorpusStore(url, shard_size=3) as store:  # three Parquet parts, listed by "file"
        for row in chat_rows:
            store.append(row)
    assert len(corpus_files(url)[1]) == 3
    got = load_shard_samples(url, 0, 1, vocab_size=49152, target_fingerprint=chat_rows[0]["target"])
    assert sorted(got.sample_ids) == sorted(r["sample_id"] for r in chat_rows)
    assert got.num_tokens == sum(r["num_tokens"] for r in chat_rows)


def test_shard_samples_are_this_shards_longest_first(corpus_dir, chat_rows):
    got = load_shard_samples(str(corpus_dir), 1, 3)
    mine = [r for r in chat_rows if shard_of(r["sample_id"], 3) == 1]
    assert sorted(got.sample_ids) == sorted(r["sample_id"] for r in mine)
    assert got.token_counts == sorted(got.token_counts, reverse=True)
    assert got.num_tokens == sum(r["num_tokens"] for r in mine)


def test_manifest_naming_a_missing_file_is_an_error(chat_rows, tmp_path):
    folder = write_corpus(tmp_path / "c", chat_rows, num_files=2)
    (folder / CORPUS_MANIFEST).write_text(json.dumps({"shards": ["part-00000.parquet", "part-00007.parquet"]}))
    with pytest.raises(FileNotFoundError, match="part-00007.parquet"):
        list(iter_corpus_rows(str(folder), ["sample_id"]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(iter_corpus_rows(str(tmp_path / "nowhere"), ["sample_id"]))


def test_bad_rows_are_named(chat_rows, tmp_path):
    row = chat_rows[0]
    cases = [
        (dict(row, loss_mask=row["loss_mask"][:-1]), "loss_mask 45"),
        (dict(row, num_tokens=row["num_tokens"] + 1), "num_tokens says 47"),
        (dict(row, input_ids=[0] * 45 + [50000]), "token id 50000 is outside the target vocabulary"),
    ]
    for i, (bad, message) in enumerate(cases):
        folder = write_corpus(tmp_path / str(i), [bad], num_files=1)
        with pytest.raises(ValueError, match=f"sample {row['sample_id']}: .*{message}"):
            load_shard_samples(str(folder), 0, 1, vocab_size=49152)
    folder = write_corpus(tmp_path / "dup", [row, row], num_files=2)
    with pytest.raises(ValueError, match=f"holds sample {row['sample_id']} twice"):
        load_shard_samples(str(folder), 0, 1)
