"""The extraction's guards: non-finite states, aux ids, stale shards, commit checks, the decoder stack.

Each test drives a guard to its refusal (or its rebuild) and checks the exact message and
that nothing half-made is left: no shard folder, no hidden `.shard-*` temporary folder.
The targets are tiny plain-PyTorch decoders (`extract_child.ToyDecoder`), so these run in
a fraction of a second each.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from eagle_assets.formats import SHARD_STATES_FILE, ShardManifest, shard_name, shard_of
from eagle_assets.hidden_states.corpus_io import corpus_token_counts, load_shard_samples
from eagle_assets.hidden_states.extract import (
    ExtractSettings,
    extract_all,
    extract_shard,
    shard_status,
    target_parts,
    validate_aux_layer_ids,
)
from eagle_assets.hidden_states.reader import ShardReader, open_shards, read_manifest
from eagle_assets.hidden_states.writer import BufferPool, ShardLayout, ShardWriter

from .conftest import write_corpus
from .extract_child import SETTINGS, ToyDecoder, toy_decoder
from .test_extract import tree_digest

pytestmark = pytest.mark.usefixtures("one_thread")  # see eagle_assets_tests/conftest.py

H = 32  # ToyDecoder's hidden size


def one_shard(**kw) -> ExtractSettings:
    return replace(SETTINGS, num_shards=1, **kw)


def leftovers(out) -> list[str]:
    """Hidden temporary folders (`.shard-*`) under `out`."""
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".shard-")) if out.is_dir() else []


# --- 1. non-finite states are refused, naming the samples, and nothing is written ---------------


class _Poison(nn.Module):
    """A decoder layer that outputs `value` on the rows marked by the embedding (every feature
    above 50), and its input unchanged elsewhere."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x):
        marked = (x > 50).all(-1, keepdim=True)
        return torch.where(marked, torch.full_like(x, self.value), x)


class _Repair(nn.Module):
    """A decoder layer that turns inf/NaN back into finite values (so the states after it are finite)."""

    def forward(self, x):
        return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def poisoned_decoder(value: float, where: str, marked_token: int | None) -> ToyDecoder:
    """A 2-layer decoder whose states are non-finite only on `marked_token`'s rows, and there
    only in the stored aux state of layer 1 (`where="aux"`: layer 2 repairs them, so the
    final state is finite) or only in the final state (`where="final"`: layer 2 poisons,
    and id 2 is not stored)."""
    model = toy_decoder()
    layers = [_Poison(value), _Repair()] if where == "aux" else [nn.Identity(), _Poison(value)]
    model.layers = nn.ModuleList(layers)
    if marked_token is not None:
        with torch.no_grad():
            model.embed_tokens.weight[marked_token] = 100.0
    return model


AUX_FOR = {"aux": (0, 1, 2), "final": (0, 1)}


def unique_token(rows, row) -> int:
    """A token id that occurs in `row` and in no other row."""
    others = {t for r in rows if r is not row for t in r["input_ids"]}
    return next(t for t in row["input_ids"] if t not in others)


@pytest.mark.parametrize("where", ["aux", "final"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_states_name_the_sample_and_write_nothing(value, where, chat_rows, fingerprint, tmp_path):
    rows = chat_rows[:4]
    bad = rows[2]
    model = poisoned_decoder(value, where, unique_token(rows, bad))
    corpus = write_corpus(tmp_path / "corpus", rows, num_files=1)
    out = tmp_path / "hs"
    # One sample per forward pass: the refusal names exactly the poisoned one.
    with pytest.raises(ValueError) as err:
        extract_all(model, str(corpus), out, one_shard(aux_layer_ids=AUX_FOR[where]), target_fingerprint=fingerprint)
    assert str(err.value) == (
        f"shard 0: non-finite hidden states (inf/NaN in bf16) in the batch of samples ['{bad['sample_id']}']; "
        "the target's forward pass overflows on them. Load the target in a wider dtype (float32) "
        "or drop these samples; nothing was written."
    )
    assert open_shards(out) == []
    assert list(out.iterdir()) == []  # neither the shard nor its `.shard-00000.tmp-*` folder

    # Without the marked token the same decoder is finite everywhere and the shard commits.
    clean = poisoned_decoder(value, where, None)
    extract_all(clean, str(corpus), out, one_shard(aux_layer_ids=AUX_FOR[where]), target_fingerprint=fingerprint)
    assert [len(s) for s in open_shards(out)] == [len(rows)]


def test_non_finite_batch_names_all_its_samples(chat_rows, fingerprint, tmp_path):
    rows = chat_rows[:4]
    corpus = write_corpus(tmp_path / "corpus", rows, num_files=1)
    model = poisoned_decoder(float("nan"), "aux", unique_token(rows, rows[1]))
    in_order = load_shard_samples(str(corpus), 0, 1).sample_ids  # longest first: the batch's order
    with pytest.raises(ValueError, match=re.escape(f"in the batch of samples {in_order}; ")):
        extract_all(model, str(corpus), tmp_path / "hs", one_shard(batch_tokens=4096), target_fingerprint=fingerprint)
    assert list((tmp_path / "hs").iterdir()) == []


def test_non_finite_rebuild_keeps_the_old_shard_byte_for_byte(chat_rows, fingerprint, tmp_path):
    rows = chat_rows[:4]
    corpus = write_corpus(tmp_path / "corpus", rows, num_files=1)
    out = tmp_path / "hs"
    extract_all(poisoned_decoder(float("inf"), "aux", None), str(corpus), out, one_shard(), target_fingerprint=fingerprint)
    before = tree_digest(out)
    poisoned = poisoned_decoder(float("inf"), "aux", unique_token(rows, rows[0]))
    with pytest.raises(ValueError, match=f"non-finite hidden states .* samples \\['{rows[0]['sample_id']}'\\]"):
        extract_shard(poisoned, str(corpus), out, 0, one_shard(), target_fingerprint=fingerprint)
    assert tree_digest(out) == before
    assert sorted(p.name for p in out.iterdir()) == [shard_name(0)]


# --- 2. aux layer ids: empty and repeated refused, any order stored ascending -------------------


def test_empty_or_repeated_aux_ids_are_refused_before_anything_is_written(corpus_dir, fingerprint, tmp_path):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "aux_layer_ids is empty; EAGLE-3 needs at least one aux state (id k = HF hidden_states[k]: "
            "0 = embeddings, 4 = the last layer's output before the final norm;"
        ),
    ):
        validate_aux_layer_ids((), 4)
    for ids in ((2, 2), (0, 3, 0)):
        with pytest.raises(ValueError, match=re.escape(f"aux_layer_ids={list(ids)} repeats an id; each state is saved once")):
            validate_aux_layer_ids(ids, 4)
    # The edges of the range are valid; the result is a tuple of ints, ascending.
    assert validate_aux_layer_ids([np.int64(4), 0], 4) == (0, 4)

    out = tmp_path / "hs"
    for ids, message in (((), "aux_layer_ids is empty"), ((1, 1), r"aux_layer_ids=\[1, 1\] repeats an id")):
        with pytest.raises(ValueError, match=message):
            extract_all(toy_decoder(), str(corpus_dir), out, replace(SETTINGS, aux_layer_ids=ids), target_fingerprint=fingerprint)
    assert not out.exists()


def test_unsorted_aux_ids_are_stored_ascending_with_embeddings_first(corpus_dir, fingerprint, tmp_path):
    torch.manual_seed(0)
    model = ToyDecoder(layers=4).to(torch.bfloat16).eval()
    out = tmp_path / "hs"
    results = extract_all(model, str(corpus_dir), out, replace(SETTINGS, aux_layer_ids=(4, 0, 2)), target_fingerprint=fingerprint)
    assert [r.manifest.aux_layer_ids for r in results] == [[0, 2, 4]] * 3
    for shard in open_shards(out):
        assert shard.aux_layer_ids == [0, 2, 4]
        path = shard.shard_dir / SHARD_STATES_FILE
        (n,) = struct.unpack("<Q", path.read_bytes()[:8])
        assert json.loads(path.read_bytes()[8 : 8 + n])["__metadata__"]["aux_layer_ids"] == "0,2,4"
        for i in range(len(shard)):
            s = shard[i]
            with torch.inference_mode():
                x = [model.embed_tokens(s["input_ids"][None].long())]  # hidden_states[0]: embeddings
                for layer in model.layers:
                    x.append(layer(x[-1]))
                final = model.norm(x[-1])
            assert torch.equal(s["aux"][:, 0:H], x[0][0])  # column block 0: id 0
            assert torch.equal(s["aux"][:, H : 2 * H], x[2][0])  # column block 1: id 2
            assert torch.equal(s["aux"][:, 2 * H :], x[4][0])  # column block 2: id 4
            assert torch.equal(s["final"], final[0])

    # The order given changes nothing: byte for byte the shards of the ascending ids.
    ascending = tmp_path / "hs-ascending"
    extract_all(model, str(corpus_dir), ascending, replace(SETTINGS, aux_layer_ids=(0, 2, 4)), target_fingerprint=fingerprint)
    assert tree_digest(out) == tree_digest(ascending)
    # ...and extract_all finds them current under either order.
    again = extract_all(model, str(corpus_dir), out, replace(SETTINGS, aux_layer_ids=(2, 4, 0)), target_fingerprint=fingerprint)
    assert [r.built for r in again] == [False] * 3


# --- 3. shard_status: a changed target fingerprint or shard count makes shards stale ------------


def test_shard_status_names_each_mismatch(chat_rows, fingerprint, tmp_path):
    corpus = write_corpus(tmp_path / "corpus", chat_rows[:3], num_files=1)
    out = tmp_path / "hs"
    extract_all(toy_decoder(), str(corpus), out, one_shard(), target_fingerprint=fingerprint)
    expected = corpus_token_counts(str(corpus), 1)[0]
    aux = SETTINGS.aux_layer_ids

    def status(settings=one_shard(), aux_ids=aux, hidden=H, fp=fingerprint, index=0):
        return shard_status(out, index, expected, settings, aux_ids, hidden, fp)

    assert status() == "complete"
    assert status(fp="another-target") == f"stale: target_fingerprint is {fingerprint}, settings say another-target"
    # Same samples, same everything else: only the shard count differs.
    assert status(settings=replace(SETTINGS, num_shards=2)) == "stale: num_shards is 1, settings say 2"
    assert status(hidden=64) == "stale: hidden_size is 32, settings say 64"
    assert status(aux_ids=(0, 1)) == "stale: aux_layer_ids is [0, 1, 2], settings say [0, 1]"
    assert status(index=1) == "missing"


def test_a_changed_target_fingerprint_rebuilds_every_shard(chat_rows, fingerprint, tmp_path):
    out = tmp_path / "hs"
    corpus = write_corpus(tmp_path / "corpus", chat_rows)
    extract_all(toy_decoder(), str(corpus), out, SETTINGS, target_fingerprint=fingerprint)
    old = {s.manifest.shard: s.sample_ids for s in open_shards(out)}

    # The same samples, made for (and extracted with) another target's tokenizer fingerprint.
    other = "other-target-fingerprint"
    recorpus = write_corpus(tmp_path / "corpus-other", [dict(r, target=other) for r in chat_rows])
    results = extract_all(toy_decoder(), str(recorpus), out, SETTINGS, target_fingerprint=other)
    assert [(r.built, r.reason) for r in results] == [(True, f"stale: target_fingerprint is {fingerprint}, settings say {other}")] * 3
    assert {s.manifest.shard: s.sample_ids for s in open_shards(out)} == old  # only the fingerprint changed
    assert [read_manifest(out / shard_name(i)).target_fingerprint for i in range(3)] == [other] * 3
    assert leftovers(out) == []
    again = extract_all(toy_decoder(), str(recorpus), out, SETTINGS, target_fingerprint=other)
    assert [r.built for r in again] == [False] * 3


def test_a_changed_shard_count_rebuilds_shards_whose_samples_did_not_move(chat_rows, fingerprint, tmp_path):
    # Samples in shard 0 of both 1 and 2 shards: shard 0 holds the same samples either way,
    # so only the recorded shard count tells that it belongs to another split.
    rows = [r for r in chat_rows if shard_of(r["sample_id"], 2) == 0]
    assert len(rows) >= 2
    corpus = write_corpus(tmp_path / "corpus", rows, num_files=1)
    out = tmp_path / "hs"
    extract_all(toy_decoder(), str(corpus), out, one_shard(), target_fingerprint=fingerprint)
    old_ids = open_shards(out)[0].sample_ids

    two = replace(SETTINGS, num_shards=2)
    results = extract_all(toy_decoder(), str(corpus), out, two, target_fingerprint=fingerprint)
    assert [(r.manifest.shard, r.built, r.reason) for r in results] == [
        (0, True, "stale: num_shards is 1, settings say 2"),
        (1, True, "missing"),
    ]
    shards = open_shards(out)
    assert [(s.manifest.shard, s.manifest.num_shards) for s in shards] == [(0, 2), (1, 2)]
    assert shards[0].sample_ids == old_ids and len(shards[1]) == 0
    assert leftovers(out) == []
    again = extract_all(toy_decoder(), str(corpus), out, two, target_fingerprint=fingerprint)
    assert [r.built for r in again] == [False, False]


def test_a_lowered_shard_count_removes_the_shards_beyond_it(chat_rows, fingerprint, tmp_path):
    # Shards numbered past the new count belong to the old split: left in place, the reader
    # would refuse the mix and no shard of the new split would ever replace them.
    corpus = write_corpus(tmp_path / "corpus", chat_rows, num_files=1)
    out = tmp_path / "hs"
    extract_all(toy_decoder(), str(corpus), out, replace(SETTINGS, num_shards=3), target_fingerprint=fingerprint)
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000", "shard-00001", "shard-00002"]

    extract_all(toy_decoder(), str(corpus), out, replace(SETTINGS, num_shards=2), target_fingerprint=fingerprint)
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000", "shard-00001"]
    shards = open_shards(out)
    assert [(s.manifest.shard, s.manifest.num_shards) for s in shards] == [(0, 2), (1, 2)]
    assert sorted(i for s in shards for i in s.sample_ids) == sorted(r["sample_id"] for r in chat_rows)


# --- 4. ShardWriter.commit: unwritten rows and a wrong file refused, nothing committed ----------

N_AUX, T = 3, 6
LAYOUT = ShardLayout(num_samples=2, num_tokens=T, num_aux=N_AUX, hidden_size=H, aux_layer_ids=(0, 1, 2))
MANIFEST = ShardManifest(
    shard=0,
    num_shards=1,
    sample_ids=["a", "b"],
    token_counts=[4, 2],
    aux_layer_ids=[0, 1, 2],
    hidden_size=H,
    target_fingerprint="t",
    corpus_fingerprint="c",
)


def new_writer(out) -> ShardWriter:
    offsets = np.array([0, 4, T], dtype=np.int64)
    return ShardWriter(out, 0, LAYOUT, offsets, np.arange(T, dtype=np.int32), np.ones(T, np.uint8))


def put_rows(writer: ShardWriter, pool: BufferPool, row0: int, rows: int) -> None:
    bufs = pool.acquire()
    bufs.aux[:rows] = torch.arange(row0, row0 + rows, dtype=torch.bfloat16)[:, None]
    bufs.final[:rows] = -torch.arange(row0, row0 + rows, dtype=torch.bfloat16)[:, None]
    writer.put(row0, rows, bufs, pool)


def test_commit_of_fully_written_rows_is_readable(tmp_path):
    """The control for the refusals below: the same writer, every row written, commits."""
    pool = BufferPool(2, T, N_AUX, H, pin=False)
    with new_writer(tmp_path) as w:
        put_rows(w, pool, 4, 2)  # any order
        put_rows(w, pool, 0, 4)
        assert w.commit(MANIFEST) == tmp_path / shard_name(0)
    (shard,) = open_shards(tmp_path)
    assert shard[0]["aux"][:, 0].tolist() == [0, 1, 2, 3] and shard[1]["final"][:, 0].tolist() == [-4, -5]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "ranges, message",
    [
        ([], "shard 0: 0 of 6 token rows written"),
        ([(0, 4)], "shard 0: 4 of 6 token rows written"),
        ([(0, 2), (4, 2)], "shard 0: token rows 2:4 were never written (or twice)"),
        ([(0, 4), (0, 4), (4, 2)], "shard 0: token rows 4:0 were never written (or twice)"),
    ],
    ids=["none", "tail-missing", "gap", "twice"],
)
def test_commit_refuses_rows_never_written_and_commits_nothing(ranges, message, tmp_path):
    pool = BufferPool(2, T, N_AUX, H, pin=False)
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        with new_writer(tmp_path) as w:
            for row0, rows in ranges:
                put_rows(w, pool, row0, rows)
            w.commit(MANIFEST)
    assert open_shards(tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # the temporary folder went with the failed writer


def _grow_file(w: ShardWriter) -> str:
    path = w.tmp_dir / SHARD_STATES_FILE
    os.truncate(path, LAYOUT.file_bytes() + 8)
    return f"{path} is {LAYOUT.file_bytes() + 8} bytes, its layout says {LAYOUT.file_bytes()}"


def _reshape_aux(w: ShardWriter) -> str:
    # Same bytes, same header length: only aux's recorded shape differs from the layout's.
    header = LAYOUT.header()
    forged = header.replace(b'"shape":[6,96]', b'"shape":[96,6]')
    assert forged != header and len(forged) == len(header)
    path = w.tmp_dir / SHARD_STATES_FILE
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, forged, 0)
    finally:
        os.close(fd)
    return f"{path}: tensor aux has shape [96, 6], expected [6, 96]"


@pytest.mark.parametrize("damage", [_grow_file, _reshape_aux], ids=["size", "shape"])
def test_commit_refuses_a_file_that_does_not_match_its_layout(damage, tmp_path):
    pool = BufferPool(2, T, N_AUX, H, pin=False)
    with pytest.raises(RuntimeError) as err:
        with new_writer(tmp_path) as w:
            put_rows(w, pool, 0, T)
            message = damage(w)
            w.commit(MANIFEST)
    assert str(err.value) == message
    assert open_shards(tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # no shard and no `.shard-00000.tmp-*` folder


# --- 5. target_parts: the stack with the most layers, or a clear error -------------------------


class _VisionTower(nn.Module):
    """More layers than the language model and a norm, but a patch projection, no embed_tokens."""

    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Linear(16, H)
        self.layers = nn.ModuleList(nn.Linear(H, H) for _ in range(5))
        self.norm = nn.LayerNorm(H)


class _Multimodal(nn.Module):
    """Two small stacks with embeddings around the language model, so that neither the first
    nor the last candidate is the right one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.vision = _VisionTower()
        self.speech = ToyDecoder(vocab=100, layers=1)
        self.language_model = toy_decoder_with(layers=3)
        self.adapter = ToyDecoder(vocab=100, layers=2)


def toy_decoder_with(layers: int) -> ToyDecoder:
    torch.manual_seed(0)
    return ToyDecoder(layers=layers).to(torch.bfloat16).eval()


def test_target_parts_picks_the_stack_with_the_most_layers(corpus_dir, fingerprint, tmp_path):
    model = _Multimodal().to(torch.bfloat16).eval()
    parts = target_parts(model)
    lm = model.language_model
    assert parts.base is lm and parts.layers is lm.layers and parts.norm is lm.norm
    assert (parts.num_layers, parts.vocab_size, parts.hidden_size) == (3, 49152, H)

    # Id 3 exists only in the language model; the wrapper's shards are the language model's.
    settings = replace(SETTINGS, aux_layer_ids=(0, 2, 3))
    extract_all(model, str(corpus_dir), tmp_path / "wrapped", settings, target_fingerprint=fingerprint)
    extract_all(toy_decoder_with(layers=3), str(corpus_dir), tmp_path / "plain", settings, target_fingerprint=fingerprint)
    assert tree_digest(tmp_path / "wrapped") == tree_digest(tmp_path / "plain")
    assert ShardReader(tmp_path / "wrapped" / shard_name(0)).manifest.extra["num_layers"] == 3


@pytest.mark.parametrize("model", [nn.Linear(2, 2), _VisionTower()], ids=["no-stack", "no-embedding"])
def test_target_parts_without_a_decoder_stack_says_so(model, corpus_dir, fingerprint, tmp_path):
    message = (
        f"cannot find the decoder stack of {type(model).__name__}: no submodule has `layers`, "
        "`norm` and `embed_tokens`. Pass the base model (the one whose output is the normed "
        "last hidden state) or extend `target_parts` for this architecture."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        target_parts(model)
    with pytest.raises(ValueError, match="cannot find the decoder stack"):
        extract_all(model, str(corpus_dir), tmp_path / "hs", SETTINGS, target_fingerprint=fingerprint)
    assert not (tmp_path / "hs").exists()
