"""The forward pass and the shards it writes: exact states, padding, rebuilds, size, bad input."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from eagle_assets.formats import SHARD_STATES_FILE, hidden_state_bytes_per_token, shard_name
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all, extract_shard, load_target
from eagle_assets.hidden_states.reader import ShardReader, open_shards

from .conftest import write_corpus

AUX = (0, 2, 4)  # embeddings, a middle layer, and L (the last layer's output before the norm)
H = 64


def settings(**kw) -> ExtractSettings:
    return ExtractSettings(**{"aux_layer_ids": AUX, "num_shards": 3, "batch_tokens": 256, "progress": False, **kw})


def hf_states(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        return model(input_ids[None].long(), output_hidden_states=True).hidden_states


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def one_per_batch(tmp_path_factory, tiny_model, corpus_dir, fingerprint):
    """Shards built with one sample per forward pass (batch_tokens=1)."""
    out = tmp_path_factory.mktemp("hs-single")
    extract_all(tiny_model, str(corpus_dir), out, settings(batch_tokens=1), target_fingerprint=fingerprint)
    return out


def test_states_equal_a_direct_transformers_forward(one_per_batch, tiny_model, chat_rows):
    by_id = {r["sample_id"]: r for r in chat_rows}
    shards = open_shards(one_per_batch)
    assert sum(len(s) for s in shards) == len(chat_rows)
    for shard in shards:
        for i, sid in enumerate(shard.sample_ids):
            s = shard[i]
            assert s["input_ids"].tolist() == by_id[sid]["input_ids"]
            assert s["loss_mask"].tolist() == by_id[sid]["loss_mask"]
            hs = hf_states(tiny_model, s["input_ids"])
            assert torch.equal(s["aux"][:, 0:H], hs[0][0])  # id 0: embeddings
            assert torch.equal(s["aux"][:, H : 2 * H], hs[2][0])  # id 2: after two layers
            # HF's entry L is normed; our id L is the un-normed residual stream whose norm it is.
            assert torch.equal(s["final"], hs[4][0])
            assert not torch.equal(s["aux"][:, 2 * H :], hs[4][0])
            with torch.inference_mode():
                assert torch.equal(tiny_model.model.norm(s["aux"][:, 2 * H :]), s["final"])


def test_mixed_length_batch_equals_one_sample_at_a_time(one_per_batch, tiny_model, corpus_dir, fingerprint, tmp_path):
    batched = tmp_path / "hs"
    # Every shard in one forward pass: lengths 33..82 padded to the longest.
    results = extract_all(tiny_model, str(corpus_dir), batched, settings(batch_tokens=4096), target_fingerprint=fingerprint)
    assert all(r.built for r in results)
    padded = 0
    for single, multi in zip(open_shards(one_per_batch), open_shards(batched)):
        assert single.sample_ids == multi.sample_ids
        lengths = {len(single[i]["input_ids"]) for i in range(len(single))}
        padded += len(lengths) > 1
        for i in range(len(single)):
            a, b = single[i], multi[i]
            assert torch.equal(a["input_ids"], b["input_ids"])
            # bf16 tolerance, scaled to each state: the residual stream is small (|x| ~ 0.1),
            # the final state is normed to unit RMS.
            torch.testing.assert_close(b["aux"], a["aux"], rtol=1.6e-2, atol=1e-3)
            torch.testing.assert_close(b["final"], a["final"], rtol=1.6e-2, atol=1.6e-2)
    assert padded >= 2  # the comparison did exercise padding


def test_bytes_per_token_are_exact(one_per_batch):
    for shard in open_shards(one_per_batch):
        size = (shard.shard_dir / SHARD_STATES_FILE).stat().st_size
        header = 8 + int.from_bytes((shard.shard_dir / SHARD_STATES_FILE).read_bytes()[:8], "little")
        per_token = hidden_state_bytes_per_token(len(AUX), H)
        assert size == shard.num_tokens * per_token + 8 * (len(shard) + 1) + header
        assert shard.manifest.bytes_per_token == per_token
        assert shard.manifest.extra["file_bytes"] == size


def test_one_deleted_shard_rebuilds_identically_and_alone(tiny_model, corpus_dir, fingerprint, tmp_path):
    out = tmp_path / "hs"
    extract_all(tiny_model, str(corpus_dir), out, settings(), target_fingerprint=fingerprint)
    before = tree_digest(out)
    others = {i: (out / shard_name(i) / SHARD_STATES_FILE).stat() for i in (0, 2)}
    shutil.rmtree(out / shard_name(1))
    assert [r.manifest.shard for r in open_shards(out)] == [0, 2]

    extract_shard(tiny_model, str(corpus_dir), out, 1, settings(), target_fingerprint=fingerprint)
    assert tree_digest(out) == before  # byte for byte, manifest included
    for i, st in others.items():
        now = (out / shard_name(i) / SHARD_STATES_FILE).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)

    # extract_all finds everything complete and current: nothing is rebuilt.
    results = extract_all(tiny_model, str(corpus_dir), out, settings(), target_fingerprint=fingerprint)
    assert [r.built for r in results] == [False, False, False]


def test_changed_settings_or_corpus_rebuild_the_stale_shards(tiny_model, corpus_dir, chat_rows, fingerprint, tmp_path):
    out = tmp_path / "hs"
    extract_all(tiny_model, str(corpus_dir), out, settings(), target_fingerprint=fingerprint)
    results = extract_all(tiny_model, str(corpus_dir), out, settings(aux_layer_ids=(1, 2, 3)), target_fingerprint=fingerprint)
    assert all(r.built and "aux_layer_ids" in r.reason for r in results)
    assert ShardReader(out / shard_name(0)).aux_layer_ids == [1, 2, 3]

    smaller = write_corpus(tmp_path / "corpus", chat_rows[:-1])
    results = extract_all(tiny_model, str(smaller), out, settings(aux_layer_ids=(1, 2, 3)), target_fingerprint=fingerprint)
    from eagle_assets.formats import shard_of

    dropped = shard_of(chat_rows[-1]["sample_id"], 3)
    assert [r.built for r in results] == [i == dropped for i in range(3)]
    assert sum(len(s) for s in open_shards(out)) == len(chat_rows) - 1


def test_aux_ids_out_of_range_name_the_setting_and_range(tiny_model, corpus_dir, fingerprint, tmp_path):
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[2, 5\].*\[5\].*0\.\.4"):
        extract_all(tiny_model, str(corpus_dir), tmp_path, settings(aux_layer_ids=(2, 5)), target_fingerprint=fingerprint)
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[-1, 2\]"):
        extract_all(tiny_model, str(corpus_dir), tmp_path, settings(aux_layer_ids=(-1, 2)), target_fingerprint=fingerprint)
    assert not any(tmp_path.iterdir())


def test_sample_without_assistant_tokens_is_named(tiny_model, chat_rows, fingerprint, tmp_path):
    bad = dict(chat_rows[3], loss_mask=[0] * len(chat_rows[3]["input_ids"]))
    corpus = write_corpus(tmp_path / "corpus", [bad] + chat_rows[:3], num_files=1)
    with pytest.raises(ValueError, match=f"sample {bad['sample_id']}.*no assistant token"):
        extract_all(tiny_model, str(corpus), tmp_path / "hs", settings(num_shards=1), target_fingerprint=fingerprint)
    assert open_shards(tmp_path / "hs") == []


def test_tokenizer_that_differs_from_the_corpus_names_both(tiny_model, smol_tokenizer, chat_rows, fingerprint, tmp_path):
    from transformers import PreTrainedTokenizerFast

    # A real, different tokenizer: SmolLM2's vocabulary with one added token.
    other = PreTrainedTokenizerFast(tokenizer_object=smol_tokenizer.backend_tokenizer.__class__.from_str(smol_tokenizer.backend_tokenizer.to_str()))
    other.add_tokens(["<extra_token_for_test>"])
    from eagle_assets.hidden_states.corpus_io import tokenizer_fingerprint

    other_fp = tokenizer_fingerprint(other)
    assert other_fp != fingerprint
    corpus = write_corpus(tmp_path / "corpus", chat_rows[:2], num_files=1)
    with pytest.raises(ValueError, match=f"{fingerprint}.*{other_fp}"):
        extract_all(tiny_model, str(corpus), tmp_path / "hs", settings(num_shards=1), tokenizer=other)
    # The matching tokenizer passes.
    extract_all(tiny_model, str(corpus), tmp_path / "hs", settings(num_shards=1), tokenizer=smol_tokenizer)
    assert len(open_shards(tmp_path / "hs")[0]) == 2


def test_smollm2_states_give_the_targets_exact_logits(smollm2_path, chat_rows, tmp_path):
    """The real target: stored ids are the chat template's, and lm_head(final) is the target's logits."""
    model, tokenizer = load_target(smollm2_path)  # bf16 on CPU
    rows = sorted(chat_rows, key=lambda r: r["num_tokens"])[:1]  # the shortest: bf16 is slow on small CPUs
    corpus = write_corpus(tmp_path / "corpus", rows, num_files=1)
    aux = (2, 15, 27)
    s = ExtractSettings(aux_layer_ids=aux, num_shards=1, batch_tokens=1, progress=False)
    extract_all(model, str(corpus), tmp_path / "hs", s, tokenizer=tokenizer)
    (shard,) = open_shards(tmp_path / "hs")
    assert shard.manifest.hidden_size == 576 and shard.aux_layer_ids == list(aux)
    for row in rows:
        got = shard[shard.index_of(row["sample_id"])]
        assert got["input_ids"].tolist() == row["input_ids"]
        with torch.inference_mode():
            out = model(got["input_ids"][None].long(), output_hidden_states=True)
            logits = model.lm_head(got["final"])  # (T, V)
        assert torch.equal(logits, out.logits[0])
        assert torch.equal(logits.argmax(-1), out.logits[0].argmax(-1))
        for j, k in enumerate(aux):
            assert torch.equal(got["aux"][:, j * 576 : (j + 1) * 576], out.hidden_states[k][0])
