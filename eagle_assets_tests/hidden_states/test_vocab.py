"""The draft vocabulary: top-N by assistant-token frequency, d2t/t2d convention, warm-start inheritance."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eagle_assets.formats import VOCAB_MAPPING_FILE
from eagle_assets.hidden_states.vocab import (
    build_vocab_mapping,
    count_assistant_tokens,
    load_parent_mapping,
    load_vocab_mapping,
    save_vocab_mapping,
    with_counts,
)

V = 49152


def test_top_n_with_ties_to_the_lower_id_and_the_d2t_convention():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[[7, 3, 5, 1, 9]] = torch.tensor([50, 20, 20, 20, 1])
    m = build_vocab_mapping(counts, vocab_size=10, draft_vocab_size=3)
    # 7 (50) first, then the three-way tie at 20 goes to the lower ids 1 and 3.
    assert m.target_ids.tolist() == [1, 3, 7]
    assert m.d2t.dtype == torch.int64 and m.d2t.tolist() == [1, 2, 5]  # target = draft + d2t[draft]
    assert m.t2d.dtype == torch.bool and m.t2d.nonzero().flatten().tolist() == [1, 3, 7]
    assert m.filled == 0
    assert m.coverage == pytest.approx(90 / 111)


def test_fewer_distinct_tokens_than_n_fill_by_lowest_unseen_id():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[[8, 4]] = torch.tensor([3, 5])
    m = build_vocab_mapping(counts, vocab_size=10, draft_vocab_size=4)
    assert m.target_ids.tolist() == [0, 1, 4, 8]
    assert m.filled == 2 and m.metadata()["filled"] == "2"
    assert m.coverage == 1.0


def test_counts_only_assistant_tokens_of_the_real_corpus(corpus_dir, chat_rows):
    counts = count_assistant_tokens(corpus_dir, V)
    expected = torch.zeros(V, dtype=torch.int64)
    for r in chat_rows:
        for t, keep in zip(r["input_ids"], r["loss_mask"]):
            expected[t] += keep
    assert torch.equal(counts, expected)
    assert int(counts.sum()) == sum(sum(r["loss_mask"]) for r in chat_rows)
    # ChatML: <|im_start|> (id 1) opens every turn outside the assistant span and never
    # counts; <|im_end|> (id 2) closes each assistant turn and counts once per turn.
    assert counts[1] == 0
    assert counts[2] == sum(r["num_turns"] for r in chat_rows) > 0


def test_save_load_roundtrip_with_metadata(corpus_dir, tmp_path):
    m = build_vocab_mapping(count_assistant_tokens(corpus_dir, V), V, 64)
    path = save_vocab_mapping(m, tmp_path)
    assert path.name == VOCAB_MAPPING_FILE
    back = load_vocab_mapping(path)
    assert torch.equal(back.d2t, m.d2t) and torch.equal(back.t2d, m.t2d)
    assert torch.equal(back.token_counts, m.token_counts)
    assert back.coverage == m.coverage and 0 < m.coverage < 1
    assert back.metadata() == m.metadata()
    assert [p.name for p in tmp_path.iterdir()] == [VOCAB_MAPPING_FILE]  # no temp file left


def _parent(folder, d2t, t2d=None, draft_vocab_size=None):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"d2t": d2t, "fc.weight": torch.zeros(4, 12)}
    if t2d is not None:
        tensors["t2d"] = t2d
    save_file(tensors, folder / "model.safetensors")
    config = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab_size or len(d2t)}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_parent_mapping_is_taken_as_is(tmp_path, corpus_dir):
    # A parent whose mapping is NOT what this corpus would give: it must be kept anyway.
    targets = torch.tensor([5, 6, 100, 2000, 40000])
    d2t = targets - torch.arange(5)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[targets] = True
    folder = _parent(tmp_path / "parent", d2t, t2d)
    m = load_parent_mapping(folder, vocab_size=V)
    assert torch.equal(m.d2t, d2t) and torch.equal(m.t2d, t2d)
    assert m.source == f"parent:{folder}"
    counted = with_counts(m, count_assistant_tokens(corpus_dir, V))
    assert torch.equal(counted.d2t, d2t) and 0 <= counted.coverage < 1
    # Without t2d in the checkpoint it is derived from d2t, identically.
    no_t2d = _parent(tmp_path / "no-t2d", d2t)
    assert torch.equal(load_parent_mapping(no_t2d, vocab_size=V).t2d, t2d)


def test_parent_mapping_with_wrong_lengths_is_refused(tmp_path):
    d2t = torch.tensor([0, 0, 0, 5])
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[[0, 1, 2, 8]] = True
    with pytest.raises(ValueError, match="t2d covers 100 target ids but the target vocabulary has 49152"):
        load_parent_mapping(_parent(tmp_path / "a", d2t, t2d), vocab_size=V)
    with pytest.raises(ValueError, match="d2t has 4 entries but draft_vocab_size is 8"):
        load_parent_mapping(_parent(tmp_path / "b", d2t, t2d, draft_vocab_size=8), vocab_size=100)
    wrong = t2d.clone()
    wrong[9] = True
    with pytest.raises(ValueError, match="t2d does not mark exactly"):
        load_parent_mapping(_parent(tmp_path / "c", d2t, wrong), vocab_size=100)
    (tmp_path / "d").mkdir()
    save_file({"fc.weight": torch.zeros(2, 2)}, tmp_path / "d" / "model.safetensors")
    with pytest.raises(ValueError, match="has no d2t tensor"):
        load_parent_mapping(tmp_path / "d", vocab_size=100)
