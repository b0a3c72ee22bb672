"""TTT loss: merged attention vs an explicit dense mask, the loss vs a naive unroll, and vs serving."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.target_head import draft_head, outside_head, read_target_head
from eagle_assets.drafter.ttt import replay_drafting, ttt_attention, ttt_loss
from eagle_assets.paths import PROJECT_ROOT
from eagle_assets_tests.drafter.test_model import random_drafter
from eagle_assets_tests.scripts import load_script

BENCHMARKS = PROJECT_ROOT / "benchmarks"
pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def dense_attention(q, k_steps, v_steps, scale):
    """Reference: all steps' keys side by side, with the (T, T * (i+1)) mask SpecForge describes."""
    B, nh, T, D = q.shape
    n = len(k_steps)
    group = nh // k_steps[0].shape[1]
    keys = torch.cat([k.repeat_interleave(group, 1) for k in k_steps], dim=2).double()  # (B, nh, n*T, D)
    values = torch.cat([v.repeat_interleave(group, 1) for v in v_steps], dim=2).double()
    mask = torch.zeros(T, n * T, dtype=torch.bool)
    for t in range(T):
        mask[t, : t + 1] = True  # step-0 keys at indices <= t
        for j in range(1, n):
            mask[t, j * T + t] = True  # index t's own key of step j
    scores = (q.double() @ keys.transpose(-1, -2)) * scale
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return p @ values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_attention_equals_dense_mask(dtype):
    torch.manual_seed(0)
    B, nh, nkv, T, D = 2, 4, 2, 9, 8
    for extra in (0, 1, 3):
        leaves = [torch.randn(B, nh, T, D, dtype=dtype)] + [torch.randn(B, nkv, T, D, dtype=dtype) for _ in range(2 * (extra + 1))]
        for x in leaves:
            x.requires_grad_(True)
        q, ks, vs = leaves[0], leaves[1 : extra + 2], leaves[extra + 2 :]
        grad_out = torch.randn(B, nh, T, D, dtype=torch.float64)
        want = dense_attention(q, ks, vs, 0.3)
        want_grads = torch.autograd.grad((want * grad_out).sum(), leaves)
        for backend in ("flash", "math"):
            got = ttt_attention(q, ks[0], vs[0], ks[1:], vs[1:], 0.3, backend=backend)
            grads = torch.autograd.grad((got.double() * grad_out).sum(), leaves)
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
            torch.testing.assert_close(got.double(), want, **tol)
            for g, w in zip(grads, want_grads):
                torch.testing.assert_close(g.double(), w.double(), **tol)


def naive_ttt(model, batch, head, steps, weights, outside=None, unreached_weight=1.0):
    """The TTT loss written from its definition: dense masks, full logits, loops over (b, t, i).
    A row of step i weighs unreached_weight more unless steps 0..i-1 at t all trained and drafted right."""
    aux, final, ids, loss_mask, lengths = (batch[k] for k in ("aux", "final", "input_ids", "loss_mask", "lengths"))
    B, T = ids.shape
    h = model.project_hidden_states(aux)
    ks, vs, logits = [[] for _ in model.layers], [[] for _ in model.layers], []
    for i in range(steps):
        tok = torch.zeros(B, T, dtype=torch.long)
        for t in range(T):
            if t + 1 + i < T:
                tok[:, t] = ids[:, t + 1 + i]
        pos = torch.arange(T).expand(B, T) + i
        cos, sin = model.rotary(pos)
        for j, layer in enumerate(model.layers):  # each layer attends over its own keys of all steps
            q, k, v = layer.attention_inputs(model.embed_input_ids(tok), h, cos, sin)
            ks[j].append(k)
            vs[j].append(v)
            out = dense_attention(q, ks[j], vs[j], layer.self_attn.scale).to(q.dtype)
            h = layer.finish(out.transpose(1, 2).reshape(B, T, -1), h)
        logits.append(model.compute_logits(model.norm(h)))
    loss = torch.zeros(())
    step_sum, step_n, step_ok = torch.zeros(steps), torch.zeros(steps), torch.zeros(steps)
    for b in range(B):
        for t in range(T):
            reached = True
            for i in range(steps):
                j, pred = t + 1 + i, t + 2 + i  # target position, predicted token position
                if pred >= int(lengths[b]) or not loss_mask[b, pred]:
                    reached = False
                    continue
                if outside is not None and (final[b, j] @ outside.T).max() > (final[b, j] @ head.T).max():
                    reached = False
                    continue  # the target's argmax is not drafted
                p = torch.softmax(final[b, j] @ head.T, dim=-1)
                ce = -(p * torch.log_softmax(logits[i][b, t], dim=-1)).sum()
                loss = loss + weights[i] * (1.0 if reached else unreached_weight) * ce
                right = bool(logits[i][b, t].argmax() == p.argmax())
                reached = reached and right
                step_sum[i] += ce.detach()
                step_n[i] += 1
                step_ok[i] += float(right)
    return loss, step_sum, step_n, step_ok


def make_batch(cfg, B=2, T=10, seed=0, lengths=(10, 7)):
    g = torch.Generator().manual_seed(seed)
    loss_mask = (torch.rand(B, T, generator=g) > 0.25).float()
    return dict(
        aux=torch.randn(B, T, cfg.fc_in_features, generator=g),
        final=torch.randn(B, T, cfg.target_hidden_size, generator=g),
        input_ids=torch.randint(0, cfg.vocab_size, (B, T), generator=g),
        loss_mask=loss_mask,
        lengths=torch.tensor(lengths),
    )


@pytest.mark.parametrize("layers", [1, 2])
def test_ttt_loss_equals_naive_unroll(layers):
    cfg = tiny_config(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        target_hidden_size=24,
        vocab_size=80,
        draft_vocab_size=40,
        num_hidden_layers=layers,
    )
    model = random_drafter(cfg)
    batch = make_batch(cfg)
    head = torch.randn(40, 24) * 0.5
    steps, weights = 3, [1.0, 0.8, 0.64]
    out = ttt_loss(model, batch, head, steps, loss_chunk_rows=7, with_correct_rows=True)  # chunks that straddle steps
    got_grads = torch.autograd.grad(out.loss_sum, [p for p in model.parameters() if p.requires_grad])
    loss, step_sum, step_n, step_ok = naive_ttt(model, batch, head, steps, weights)
    want_grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    torch.testing.assert_close(out.loss_sum, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.step_loss_sum, step_sum, rtol=1e-5, atol=1e-5)
    assert out.step_tokens.tolist() == step_n.tolist()
    assert out.step_correct.tolist() == step_ok.tolist()
    assert out.correct_rows.shape == (steps, *batch["input_ids"].shape)
    assert out.correct_rows.sum(dim=(1, 2)).tolist() == step_ok.tolist()
    assert out.num_tokens == step_n[0]
    assert ttt_loss(model, batch, head, steps).correct_rows is None  # training steps skip the scatter
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.acceptance, torch.cumprod(step_ok / step_n, 0))


@pytest.mark.parametrize("unreached_weight", [0.0, 0.25])
def test_unreached_rows_weigh_less_as_the_naive_unroll_says(unreached_weight):
    """Step i's row t trains at full weight only when steps 0..i-1 at t drafted the target's
    token (the chain serving verifies); the statistics still count every row. Three draft ids
    make a random drafter right often enough for chains to both survive and break."""
    from eagle_assets.drafter.ttt import ttt_loss_dense

    cfg = tiny_config(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        target_hidden_size=24,
        vocab_size=80,
        draft_vocab_size=3,
    )
    model = random_drafter(cfg)
    batch = make_batch(cfg, T=16, lengths=(16, 12))
    torch.manual_seed(0)
    head = torch.randn(3, 24) * 0.5
    steps, weights = 3, [1.0, 0.8, 0.64]
    params = [p for p in model.parameters() if p.requires_grad]
    out = ttt_loss(model, batch, head, steps, loss_chunk_rows=5, with_correct_rows=True, unreached_weight=unreached_weight)
    every = ttt_loss(model, batch, head, steps, loss_chunk_rows=5, with_correct_rows=True)
    loss, step_sum, step_n, step_ok = naive_ttt(model, batch, head, steps, weights, unreached_weight=unreached_weight)
    torch.testing.assert_close(out.loss_sum, loss, rtol=1e-5, atol=1e-5)
    for g, w in zip(torch.autograd.grad(out.loss_sum, params), torch.autograd.grad(loss, params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    dense = ttt_loss_dense(model, batch, head, steps, unreached_weight=unreached_weight)
    torch.testing.assert_close(dense.loss_sum, loss, rtol=1e-5, atol=1e-5)
    # The chains both broke and survived, so the weighting changed the loss.
    rows = every.correct_rows
    assert 0 < int((rows[0] & rows[1]).sum()) < int(rows[0].sum())
    assert out.loss_sum < every.loss_sum
    assert out.step_correct.tolist() == every.step_correct.tolist() == step_ok.tolist()
    assert out.step_tokens.tolist() == step_n.tolist()
    torch.testing.assert_close(out.step_loss_sum, step_sum, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"unreached_weight=1\.5 must be in \[0, 1\]"):
        ttt_loss(model, batch, head, steps, unreached_weight=1.5)


def test_outside_head_masks_undraftable_targets():
    cfg = tiny_config(vocab_size=80, draft_vocab_size=40)
    model = random_drafter(cfg)
    batch = make_batch(cfg, lengths=(10, 10))
    lm_head = torch.randn(80, 64)
    d2t = torch.arange(40)  # draft ids = even target ids
    t2d = torch.zeros(80, dtype=torch.bool)
    t2d[::2] = True
    head, outside = draft_head(lm_head, d2t), outside_head(lm_head, t2d)
    torch.testing.assert_close(head, lm_head[::2])
    torch.testing.assert_close(outside, lm_head[1::2])
    out = ttt_loss(model, batch, head, 2, outside_head=outside)
    loss, step_sum, step_n, _ = naive_ttt(model, batch, head, 2, [1.0, 0.8], outside=outside)
    plain = ttt_loss(model, batch, head, 2)
    assert out.step_tokens.tolist() == step_n.tolist()
    assert out.step_tokens[0] < plain.step_tokens[0]  # some target argmaxes are odd ids: dropped
    torch.testing.assert_close(out.loss_sum, loss, rtol=1e-5, atol=1e-5)


def test_target_temperature_sharpens_the_target_and_keeps_the_mask():
    """Logits are linear in the head, so temperature t is the same loss as the head divided by t;
    the positions that train and the target's argmax stay those of temperature 1."""
    from eagle_assets.drafter.ttt import ttt_loss_dense

    cfg = tiny_config(vocab_size=80, draft_vocab_size=40)
    model = random_drafter(cfg)
    batch = make_batch(cfg)
    head, outside = torch.randn(40, 64), torch.randn(40, 64)
    plain = ttt_loss(model, batch, head, 3, outside_head=outside)
    sharp = ttt_loss(model, batch, head, 3, outside_head=outside, target_temperature=0.5)
    scaled = ttt_loss(model, batch, head / 0.5, 3, outside_head=outside / 0.5)
    dense = ttt_loss_dense(model, batch, head, 3, outside_head=outside, target_temperature=0.5)
    torch.testing.assert_close(sharp.loss_sum, scaled.loss_sum, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sharp.loss_sum, dense.loss_sum, rtol=1e-5, atol=1e-5)
    assert sharp.step_tokens.tolist() == plain.step_tokens.tolist()
    assert sharp.step_correct.tolist() == plain.step_correct.tolist()
    assert not torch.allclose(sharp.loss_sum, plain.loss_sum)
    with pytest.raises(ValueError, match="target_temperature=0"):
        ttt_loss(model, batch, head, 3, target_temperature=0)


def test_padding_does_not_change_a_sequence_loss():
    cfg = tiny_config()
    model = random_drafter(cfg)
    batch = make_batch(cfg, lengths=(10, 6))
    head = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size)
    both = ttt_loss(model, batch, head, 3)
    short = {k: (v[1:2, :6] if k != "lengths" else torch.tensor([6])) for k, v in batch.items()}
    alone = ttt_loss(model, short, head, 3)
    long_ = {k: (v[0:1] if k != "lengths" else torch.tensor([10])) for k, v in batch.items()}
    first = ttt_loss(model, long_, head, 3)
    torch.testing.assert_close(both.step_loss_sum, alone.step_loss_sum + first.step_loss_sum, rtol=1e-5, atol=1e-5)
    assert both.step_tokens.tolist() == (alone.step_tokens + first.step_tokens).tolist()


def test_replayed_drafting_walks_rounds_as_the_engine_does():
    """Prompt tokens 0..3, answer 4..11; K = 3. The first round follows the answer's first token
    (the target's, from prefill): row 3. It accepts 2 drafts, the target adds one: next row 6,
    which accepts none: row 7 accepts all 3: row 11 has nothing left to predict."""
    K, T = 3, 12
    correct = torch.zeros(K, 1, T, dtype=torch.bool)
    correct[:2, 0, 3] = True  # row 3: drafts 1 and 2 right, 3 wrong
    correct[1:, 0, 6] = True  # row 6: draft 1 wrong (later ones do not count)
    correct[:, 0, 7] = True  # row 7: all three right
    correct[:, 0, 4] = True  # row 4 is never a round's start: skipped over by row 3's round
    loss_mask = torch.tensor([[0.0] * 4 + [1.0] * 8])
    assert replay_drafting(correct, loss_mask).tolist() == [3, 2, 2, 1]
    # A shorter sequence (right padding): row 7 would predict x_9, past a length of 9.
    assert replay_drafting(correct, loss_mask, torch.tensor([9])).tolist() == [2, 1, 1, 0]
    # A user turn (tokens 8, 9) between two answers: no round starts where x_{t+1} or x_{t+2}
    # is the user's; the second answer's rounds start after its first token (row 9: none right).
    loss_mask[0, 8:10] = 0.0
    assert replay_drafting(correct, loss_mask).tolist() == [2, 1, 1, 0]


@pytest.mark.parametrize("layers", [1, 2])
def test_ttt_steps_are_serving_draft_steps(layers):
    """Step i at index t = serving's draft step i+1 at p = t (teacher-forced), through the KV caches."""
    cfg = tiny_config(num_hidden_layers=layers)
    model = random_drafter(cfg)
    B, T, steps = 1, 9, 3
    batch = make_batch(cfg, B=B, T=T, lengths=(T,))
    batch["loss_mask"] = torch.ones(B, T)
    head = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size)
    out = ttt_loss(model, batch, head, steps)
    ids, final = batch["input_ids"][0], batch["final"][0]
    want = torch.zeros(steps)
    with torch.no_grad():
        g = model.project_hidden_states(batch["aux"])
        for t in range(T):
            cache = model.new_kv_cache(1, T + steps)
            # first pass: slots s <= t pair g_s with x_{s+1} (the last slot's token may be past the end)
            toks = torch.tensor([[int(ids[s + 1]) if s + 1 < T else 0 for s in range(t + 1)]])
            h_pre, h_post = model(g[:, : t + 1], toks, torch.arange(t + 1)[None], kv_cache=cache)
            hidden, post = h_pre[:, -1:], h_post[:, -1]
            for i in range(steps):
                if t + 2 + i < T:
                    p = torch.softmax(final[t + 1 + i] @ head.T, -1)
                    want[i] += -(p * torch.log_softmax(model.compute_logits(post)[0], -1)).sum()
                if i + 1 < steps and t + 2 + i < T:
                    tok = torch.tensor([[int(ids[t + 2 + i])]])  # ground truth x_{t+2+i}
                    hidden, post = model(hidden, tok, torch.tensor([[t + 1 + i]]), kv_cache=cache)
                    post = post[:, -1]
    torch.testing.assert_close(out.step_loss_sum, want, rtol=1e-4, atol=1e-4)


def test_bf16_autocast_tracks_fp32():
    cfg = tiny_config()
    model = random_drafter(cfg)
    batch = make_batch(cfg)
    head = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size) * 0.3
    ref = ttt_loss(model, batch, head, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = ttt_loss(model, {**batch, "aux": batch["aux"].bfloat16(), "final": batch["final"].bfloat16()}, head.bfloat16(), 3)
    low.loss.backward()
    assert model.fc.weight.grad is not None and model.fc.weight.grad.dtype == torch.float32
    assert math.isclose(low.loss.item(), ref.loss.item(), rel_tol=0.05)


def test_bad_batch_is_named():
    cfg = tiny_config()
    model = Eagle3Drafter(cfg)
    batch = make_batch(cfg)
    with pytest.raises(ValueError, match="batch\\['aux'\\] has shape"):
        ttt_loss(model, {**batch, "aux": batch["aux"][..., :-1]}, torch.zeros(64, 64), 2)
    with pytest.raises(ValueError, match="draft_head"):
        ttt_loss(model, batch, torch.zeros(256, 64), 2)


@pytest.mark.gpu
def test_cuda_flash_merge_equals_math():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    B, nh, nkv, T, D = 1, 8, 2, 300, 64
    leaves = [torch.randn(B, nh, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)]
    leaves += [torch.randn(B, nkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(6)]
    q, ks, vs = leaves[0], leaves[1:4], leaves[4:]
    grad_out = torch.randn(B, nh, T, D, device="cuda", dtype=torch.bfloat16)
    results = []
    for backend in ("flash", "math"):
        out = ttt_attention(q, ks[0], vs[0], ks[1:], vs[1:], D**-0.5, backend=backend)
        results.append((out, torch.autograd.grad((out * grad_out).sum(), leaves)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2e-2, atol=2e-2)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("unreached_weight", [1.0, 0.0])
def test_cuda_fused_loss_equals_the_dense_one(unreached_weight):
    """On CUDA the per-chunk loss kernel is compiled; chunks end at step boundaries below weight 1."""
    from eagle_assets.drafter.ttt import ttt_loss_dense

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = tiny_config(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        target_hidden_size=24,
        vocab_size=80,
        draft_vocab_size=3,
    )
    model = random_drafter(cfg).cuda()
    batch = {k: v.cuda() for k, v in make_batch(cfg, T=16, lengths=(16, 12)).items()}
    torch.manual_seed(0)
    head = torch.randn(3, 24, device="cuda") * 0.5
    params = [p for p in model.parameters() if p.requires_grad]
    fused = ttt_loss(model, batch, head, 3, loss_chunk_rows=5, unreached_weight=unreached_weight)
    dense = ttt_loss_dense(model, batch, head, 3, unreached_weight=unreached_weight)
    torch.testing.assert_close(fused.loss_sum, dense.loss_sum, rtol=1e-4, atol=1e-4)
    for g, w in zip(torch.autograd.grad(fused.loss_sum, params), torch.autograd.grad(dense.loss_sum, params)):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)
    assert fused.step_correct.tolist() == dense.step_correct.tolist()


def test_read_target_head_tied_and_sharded(tmp_path, smollm2_path):
    embedding, lm_head = read_target_head(smollm2_path)  # tied: the head is the embedding
    assert embedding.shape == (49152, 576) and lm_head is embedding
    # An untied, sharded target: two files and an index, as large checkpoints ship.
    emb, head = torch.randn(50, 8), torch.randn(50, 8)
    save_file({"model.embed_tokens.weight": emb, "model.layers.0.x": torch.zeros(1)}, str(tmp_path / "a.safetensors"))
    save_file({"lm_head.weight": head}, str(tmp_path / "b.safetensors"))
    index = {"weight_map": {"model.embed_tokens.weight": "a.safetensors", "model.layers.0.x": "a.safetensors", "lm_head.weight": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 50, "tie_word_embeddings": False}))
    got_emb, got_head = read_target_head(tmp_path)
    assert torch.equal(got_emb, emb) and torch.equal(got_head, head)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 49}))
    with pytest.raises(ValueError, match="vocab_size=49"):
        read_target_head(tmp_path)


def test_dense_formulation_and_benchmark_smoke(capsys):
    """The dense baseline equals the fused path, and the GPU benchmark script runs in its CPU smoke size."""
    from eagle_assets.drafter.ttt import ttt_loss_dense

    for layers in (1, 2):
        cfg = tiny_config(vocab_size=80, draft_vocab_size=40, num_hidden_layers=layers)
        model = random_drafter(cfg)
        batch = make_batch(cfg)
        head, outside = torch.randn(40, 64), torch.randn(40, 64)
        fused = ttt_loss(model, batch, head, 3, outside_head=outside)
        dense = ttt_loss_dense(model, batch, head, 3, outside_head=outside)
        torch.testing.assert_close(fused.loss_sum, dense.loss_sum, rtol=1e-5, atol=1e-5)
        assert fused.step_correct.tolist() == dense.step_correct.tolist()
    load_script(BENCHMARKS / "ttt_loss.py").main(["--smoke", "--layers", "2"])
    out = capsys.readouterr().out
    assert "layers 2" in out and "speedup" in out  # and the fused and dense losses agreed (else SystemExit)


def test_no_grad_evaluation_gives_the_same_numbers():
    cfg = tiny_config()
    model = random_drafter(cfg)
    batch = make_batch(cfg)
    head = torch.randn(cfg.draft_vocab_size, cfg.target_hidden_size)
    train = ttt_loss(model, batch, head, 3)
    with torch.no_grad():
        evaluation = ttt_loss(model, batch, head, 3)
    assert not evaluation.loss_sum.requires_grad
    torch.testing.assert_close(evaluation.loss_sum, train.loss_sum.detach())
    assert evaluation.step_correct.tolist() == train.step_correct.tolist()
