"""The reference speculative decoder: greedy equality, draft semantics, and acceptance accounting."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eagle_assets.bench.reference_decoder import TargetRunner, greedy_generate, speculative_generate
from eagle_assets.drafter.config import DrafterConfig
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.target_head import read_target_head


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=False, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def drafter_for(target, aux_layer_ids, draft_vocab_size=None, seed=0) -> Eagle3Drafter:
    cfg = DrafterConfig.from_target_config(target.config.to_dict(), aux_layer_ids=aux_layer_ids,
                                           draft_vocab_size=draft_vocab_size)
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(cfg)
    drafter.reset_parameters(std=0.3)  # a random drafter with opinions: some drafts get accepted
    drafter.load_target_embedding(target.get_input_embeddings().weight)
    n, v = cfg.draft_vocab_size, cfg.vocab_size
    if n < v:  # a scattered draft vocabulary, so that d2t is exercised
        ids = torch.randperm(v)[:n].sort().values
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[ids] = True
        drafter.set_vocab_mapping(ids - torch.arange(n), t2d)
    return drafter.eval()


def test_tiny_target_equality_and_first_draft_semantics():
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 4), draft_vocab_size=48)  # id 4 = last layer, pre-norm
    for seed, k in ((0, 1), (1, 3), (2, 5)):
        prompt = torch.randint(3, 64, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        res = speculative_generate(target, drafter, prompt, 20, k, eos_token_id=2)
        greedy = greedy_generate(target, prompt, 20, eos_token_id=2)
        hf = target.generate(prompt, do_sample=False, max_new_tokens=20, eos_token_id=2, pad_token_id=0)
        assert res.tokens == greedy == hf[0, prompt.shape[1]:].tolist()
        assert res.num_drafts == len(res.drafts) == len(res.accepted_per_step)
        # Every drafter KV entry at positions <= p comes from (g_s, E[x_{s+1}]): the first draft of
        # each step equals a plain causal pass over the whole final sequence, read at slot p.
        seq = torch.cat([prompt, torch.tensor([res.tokens])], dim=1)
        with torch.no_grad():
            runner = TargetRunner(target, drafter.config.aux_layer_ids)
            _, aux = runner.forward(seq)
            runner.close()
            _, h_post = drafter(drafter.project_hidden_states(aux[:, :-1]), seq[:, 1:])
            first = drafter.draft_to_target(drafter.compute_logits(h_post[0]).argmax(-1))
        p = prompt.shape[1] - 1
        for drafts, accepted in zip(res.drafts, res.accepted_per_step):
            assert drafts[0] == int(first[p])
            p += accepted + 1


def test_last_layer_aux_is_the_pre_norm_state():
    target = tiny_target()
    ids = torch.randint(0, 64, (1, 6))
    runner = TargetRunner(target, (0, 4))
    _, aux = runner.forward(ids)
    runner.close()
    hs = target(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(aux[..., :32], hs[0])  # id 0: the embeddings
    torch.testing.assert_close(target.model.norm(aux[..., 32:]), hs[4])  # HF's entry L is normed; ours is not
    assert not torch.allclose(aux[..., 32:], hs[4])


def successor_target(V: int = 32, scale: float = 4.0) -> LlamaForCausalLM:
    """A target whose greedy next token is always (x + 1) mod V: identity layers, a rolled head."""
    cfg = LlamaConfig(vocab_size=V, hidden_size=V, intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(V) * scale)
        for layer in model.model.layers:  # each layer adds zero: r_k = E[x] for every k
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(torch.roll(torch.eye(V), 1, dims=0))  # row j = e_{j-1}
    return model


def mapping_drafter(target, step, V: int = 32, scale: float = 4.0) -> Eagle3Drafter:
    """A drafter that predicts `step(y)` after token y, through fc and the MLP only (attention off).

    g_p = fc(A_p) = e_{x_p + 1} = e_{x_{p+1}}; the MLP turns e_y into e_{step(y)} on the residual;
    lm_head is the identity. With step(y) = y + 1 it predicts the target exactly.
    """
    cfg = DrafterConfig(hidden_size=V, intermediate_size=V, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=256,
                        vocab_size=V, draft_vocab_size=V, target_hidden_size=V, aux_layer_ids=(1, 2, 3),
                        target_num_layers=4)
    drafter = Eagle3Drafter(cfg)
    eye = torch.eye(V)
    shift = torch.roll(eye, 1, dims=0)  # shift @ e_y = e_{y+1}
    moved = torch.zeros(V, V)
    for y in range(V):
        moved[step(y) % V, y] = 1.0
    act = torch.nn.functional.silu(torch.tensor(math.sqrt(V))).item() * math.sqrt(V)  # MLP hidden value at y
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :V] = shift / scale
        drafter.layer.self_attn.o_proj.weight.zero_()
        drafter.layer.mlp.gate_proj.weight.copy_(eye)
        drafter.layer.mlp.up_proj.weight.copy_(eye)
        drafter.layer.mlp.down_proj.weight.copy_((moved - eye) / act)
        drafter.lm_head.weight.copy_(eye)
        drafter.load_target_embedding(target.get_input_embeddings().weight)
    return drafter.eval()


def test_acceptance_accounting_with_constructed_drafters():
    target = successor_target()
    prompt = torch.tensor([[5, 6, 7]])  # the target continues 8, 9, 10, ...
    assert greedy_generate(target, prompt, 5) == [8, 9, 10, 11, 12]

    perfect = speculative_generate(target, mapping_drafter(target, lambda y: y + 1), prompt, 1 + 3 * 4, k=3)
    assert perfect.tokens == list(range(8, 21))
    assert perfect.accepted_per_step == [3, 3, 3]
    assert perfect.al == 4.0 and perfect.per_position_acceptance == [1.0, 1.0, 1.0]

    wrong = speculative_generate(target, mapping_drafter(target, lambda y: y + 2), prompt, 6, k=3)
    assert wrong.tokens == list(range(8, 14)) and wrong.al == 1.0 and wrong.per_position_acceptance == [0.0] * 3

    # Wrong only after tokens y = 3 mod 4: from bonus 8 the chain 9, 10 is accepted (then the bonus 11),
    # from bonus 11 the draft 13 is rejected (bonus 12), and so on: 2, 0, 2, 0, ...
    periodic = speculative_generate(target, mapping_drafter(target, lambda y: y + (2 if y % 4 == 3 else 1)), prompt, 17, k=2)
    assert periodic.tokens == list(range(8, 25))
    assert periodic.accepted_per_step == [2, 0] * 4
    assert periodic.al == 2.0 and periodic.per_position_acceptance == [0.5, 0.5]
    assert periodic.draft_acceptance_rate == 0.5
    # Steps draft from output index 1 (the prefill gave index 0), then 1 + 3 = 4, 5, 8, 9, ...:
    # split after index 5, the first three steps drafted at or before it.
    assert periodic.steps_split_at(5) == ([2, 0, 2], [0, 2, 0, 2, 0])
    assert periodic.steps_split_at(len(periodic.tokens)) == (periodic.accepted_per_step, [])


def test_smollm2_speculative_equals_greedy(smollm2_path):
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    target = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    cfg = DrafterConfig.from_target_config(target.config.to_dict(), draft_vocab_size=4096)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    drafter.load_target_embedding(read_target_head(smollm2_path, torch.float32)[0])
    ids = torch.arange(4096) * 12  # a spread-out draft vocabulary
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    drafter.set_vocab_mapping(ids - torch.arange(4096), t2d)
    prompts = ("What is the capital of France?", "Name three colours.")
    for i, prompt in enumerate(prompts):
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        n = enc["input_ids"].shape[1]
        res = speculative_generate(target, drafter.eval(), enc["input_ids"], 24, k=3, eos_token_id=tok.eos_token_id)
        assert res.num_drafts >= 1 and all(len(d) == 3 for d in res.drafts)
        if i == 0:
            want = target.generate(**enc, do_sample=False, max_new_tokens=24)[0, n:].tolist()
            assert res.tokens == want, (tok.decode(res.tokens), tok.decode(want))
        else:  # greedy in one pass: every emitted token is the argmax after its prefix
            seq = torch.cat([enc["input_ids"], torch.tensor([res.tokens])], dim=1)
            with torch.no_grad():
                best = target(seq).logits[0, n - 1 : -1].argmax(-1).tolist()
            assert res.tokens == best, (tok.decode(res.tokens), tok.decode(best))
            assert len(res.tokens) == 24 or res.tokens[-1] == tok.eos_token_id


def test_bad_arguments_are_named():
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 3))
    with pytest.raises(ValueError, match="one prompt at a time"):
        speculative_generate(target, drafter, torch.zeros(2, 3, dtype=torch.long), 4, 2)
    with pytest.raises(ValueError, match="out of range"):
        TargetRunner(target, (1, 5))
