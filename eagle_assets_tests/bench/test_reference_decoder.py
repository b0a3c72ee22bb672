"""The reference speculative decoder: greedy equality, draft semantics, and acceptance accounting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from eagle_assets.bench import reference_decoder
from eagle_assets.bench.reference_decoder import TargetRunner, greedy_generate, speculative_generate
from eagle_assets.drafter.config import DrafterConfig
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.target_head import read_target_head

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


def drafter_for(target, aux_layer_ids, draft_vocab_size=None, seed=0) -> Eagle3Drafter:
    cfg = DrafterConfig.from_target_config(target.config.to_dict(), aux_layer_ids=aux_layer_ids, draft_vocab_size=draft_vocab_size)
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(cfg)
    drafter.reset_parameters(std=0.3)  # a random drafter with opinions (the target rejects all of them: see `Oracle`)
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
        assert res.tokens == greedy == hf[0, prompt.shape[1] :].tolist()
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


# -- Accepted drafts: an oracle proposer over the tiny target's real attention ----------------
#
# A random drafter's drafts are all rejected, which leaves the accept path untested. `Oracle`
# stands in for `reference_decoder._propose`: it still runs the real proposer (so the drafter's
# KV cache stays in step and what it drafts is recorded), but hands the decoder the target's own
# greedy continuation, with a wrong token planted at chosen output indices. Every round then
# accepts exactly the drafts before the first planted index it drafts, and the target's KV cache
# has to keep the accepted drafts for the output to stay greedy.

_real_propose = reference_decoder._propose


@dataclass
class Round:
    """One call of the proposer: the pending slots the decoder handed it and the drafts."""

    start: int
    slot_tokens: list[int]
    slot_aux: torch.Tensor
    real: list[int]
    """What the drafter itself drafted from these slots."""
    sent: list[int]
    """What the oracle handed the decoder to verify."""


@dataclass
class Oracle:
    prompt_len: int
    continuation: list[int]
    """The target's greedy output, at least max_new_tokens + k long."""
    wrong: frozenset[int] = frozenset()
    """Output indices whose draft is replaced by another token (the target rejects it)."""
    vocab_size: int = 64
    rounds: list[Round] = field(default_factory=list)

    def __call__(self, drafter, dcache, slot_aux, slot_tokens, start, k) -> list[int]:
        real = _real_propose(drafter, dcache, slot_aux, slot_tokens, start, k)
        i = start + slot_tokens.shape[1] - self.prompt_len  # output index of x_n, the round's first verified token
        want = (self.continuation[i + 1 : i + 1 + k] + [0] * k)[:k]
        sent = [(t + 1) % self.vocab_size if i + 1 + j in self.wrong else t for j, t in enumerate(want)]
        self.rounds.append(Round(start, slot_tokens[0].tolist(), slot_aux.clone(), real, sent))
        return sent


def oracle_generate(monkeypatch, target, drafter, prompt, max_new_tokens, k, wrong=(), eos_token_id=None):
    """speculative_generate with the oracle proposing: (result, oracle, the target's greedy continuation)."""
    continuation = greedy_generate(target, prompt, max_new_tokens + k + 1)
    oracle = Oracle(prompt.shape[1], continuation, frozenset(wrong), target.config.vocab_size)
    monkeypatch.setattr(reference_decoder, "_propose", oracle)
    res = speculative_generate(target, drafter, prompt, max_new_tokens, k, eos_token_id=eos_token_id)
    monkeypatch.setattr(reference_decoder, "_propose", _real_propose)
    assert res.drafts == [r.sent for r in oracle.rounds]
    return res, oracle, continuation


def assert_rounds_follow_the_semantics(oracle: Oracle, target, drafter, prompt, continuation, k) -> None:
    """Each round's pending slots continue the last round's (slot s: x_{s+1} and the aux state of
    the pass that verified x_s), and the drafter, fed them through its KV cache across accepted
    rounds, drafts what it drafts from the whole prefix at once in a fresh cache."""
    seq = torch.cat([prompt, torch.tensor([continuation])], dim=1)
    with torch.no_grad():
        runner = TargetRunner(target, drafter.config.aux_layer_ids)
        _, aux = runner.forward(seq)
        runner.close()
    assert oracle.rounds and oracle.rounds[0].start == 0 and len(oracle.rounds[0].slot_tokens) == prompt.shape[1]
    end = 0
    for r in oracle.rounds:
        T = len(r.slot_tokens)
        assert r.start == end, "the pending slots must continue the previous round's"
        assert r.slot_tokens == seq[0, r.start + 1 : r.start + T + 1].tolist()
        torch.testing.assert_close(r.slot_aux, aux[:, r.start : r.start + T], rtol=1e-4, atol=1e-4)
        p = r.start + T - 1
        with torch.no_grad():
            fresh = _real_propose(drafter, drafter.new_kv_cache(1, p + k + 1), aux[:, : p + 1], seq[:, 1 : p + 2], 0, k)
        assert r.real == fresh, f"round at slot {p}"
        end = r.start + T


@pytest.mark.parametrize(
    ("k", "max_new_tokens", "wrong", "accepted"),
    [
        # Bonus (the round's first verified token) at output index 0: drafts 1-3 all accepted; from
        # 4: 5, 6 accepted, 7 rejected; from 7: 8 rejected; from 8: 9-11; from 12: 13 accepted, 14
        # rejected; from 14: 15-17; from 18: 19-21, and the output (23 tokens) is cut to 20.
        (3, 20, {7, 8, 14}, [3, 2, 0, 3, 1, 3, 3]),
        # From 0: 1, 2 then 3 rejected; from 3: 4-8; from 9: 10 rejected; from 10: 11 rejected;
        # from 11: 12-16; from 17: 18-22, ending at exactly 24 tokens.
        (5, 24, {3, 10, 11}, [2, 5, 0, 0, 5, 5]),
        # One draft a round: 1, 3 accepted; 5 rejected; 6 accepted (index 2 was never drafted).
        (1, 8, {2, 5}, [1, 1, 0, 1]),
    ],
)
def test_accepted_drafts_stay_in_the_target_cache_and_the_output_stays_greedy(monkeypatch, k, max_new_tokens, wrong, accepted):
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 4), draft_vocab_size=48)
    prompt = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    res, oracle, continuation = oracle_generate(monkeypatch, target, drafter, prompt, max_new_tokens, k, wrong)
    assert res.tokens == greedy_generate(target, prompt, max_new_tokens) == continuation[:max_new_tokens]
    assert res.accepted_per_step == accepted
    n = len(accepted)
    assert res.num_drafts == n and res.al == 1 + sum(accepted) / n
    assert res.per_position_acceptance == [sum(a >= j for a in accepted) / n for j in range(1, k + 1)]
    assert_rounds_follow_the_semantics(oracle, target, drafter, prompt, continuation, k)


@pytest.mark.parametrize(("max_new_tokens", "accepted"), [(1, []), (2, [3]), (10, [3, 3, 3]), (11, [3, 3, 3]), (13, [3, 3, 3])])
def test_all_drafts_accepted_the_output_is_cut_at_max_new_tokens(monkeypatch, max_new_tokens, accepted):
    # Every round emits K + 1 = 4 tokens after the prefill's one: 1, 5, 9, 13, ... tokens.
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 4), draft_vocab_size=48)
    prompt = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    res, _, continuation = oracle_generate(monkeypatch, target, drafter, prompt, max_new_tokens, 3)
    assert res.tokens == continuation[:max_new_tokens] == greedy_generate(target, prompt, max_new_tokens)
    assert res.accepted_per_step == accepted and len(res.tokens) == max_new_tokens


def test_an_eos_inside_an_accepted_run_ends_the_output_with_it(monkeypatch):
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 4), draft_vocab_size=48)
    prompt = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    greedy = greedy_generate(target, prompt, 24)
    # All accepted at K=3, the second round verifies output indices 4 (its first token) and 5-7
    # (its drafts). An EOS drafted at 6 or 7, seen there first, ends the output with it (included),
    # and no round follows.
    for index, eos in ((6, greedy[6]), (7, greedy[7]), (6, [greedy[7], greedy[6]])):
        first = greedy[index]
        assert first not in greedy[:index]
        res, _, _ = oracle_generate(monkeypatch, target, drafter, prompt, 24, 3, eos_token_id=eos)
        assert res.tokens == greedy[: index + 1] == greedy_generate(target, prompt, 24, eos_token_id=eos)
        assert res.accepted_per_step == [3, 3]
    # An EOS at a round's first rejected index comes from the target (the bonus): the output ends there too.
    res, _, _ = oracle_generate(monkeypatch, target, drafter, prompt, 24, 3, wrong={6}, eos_token_id=greedy[6])
    assert res.tokens == greedy[:7] and res.accepted_per_step == [3, 1]


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
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=V,
        intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
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
    cfg = DrafterConfig(
        hidden_size=V,
        intermediate_size=V,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=256,
        vocab_size=V,
        draft_vocab_size=V,
        target_hidden_size=V,
        aux_layer_ids=(1, 2, 3),
        target_num_layers=4,
    )
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


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """(tokenizer, target, a random drafter with a spread-out draft vocabulary) on SmolLM2."""
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
    return tok, target, drafter.eval()


def _chat(tok, prompt: str) -> dict:
    return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)


def test_smollm2_speculative_equals_greedy(smollm2):
    tok, target, drafter = smollm2
    prompts = ("What is the capital of France?", "Name three colours.")
    for i, prompt in enumerate(prompts):
        enc = _chat(tok, prompt)
        n = enc["input_ids"].shape[1]
        res = speculative_generate(target, drafter, enc["input_ids"], 24, k=3, eos_token_id=tok.eos_token_id)
        assert all(len(d) == 3 for d in res.drafts)
        # The random drafter's drafts are all rejected: one token a round after the prefill's. This
        # is the reject path; the accept path on SmolLM2 is the next test's.
        assert res.accepted_per_step == [0] * (len(res.tokens) - 1)
        if i == 0:
            want = target.generate(**enc, do_sample=False, max_new_tokens=24)[0, n:].tolist()
            assert res.tokens == want, (tok.decode(res.tokens), tok.decode(want))
        else:  # greedy in one pass: every emitted token is the argmax after its prefix
            seq = torch.cat([enc["input_ids"], torch.tensor([res.tokens])], dim=1)
            with torch.no_grad():
                best = target(seq).logits[0, n - 1 : -1].argmax(-1).tolist()
            assert res.tokens == best, (tok.decode(res.tokens), tok.decode(best))
            assert len(res.tokens) == 24 or res.tokens[-1] == tok.eos_token_id


def test_smollm2_accepted_drafts_equal_greedy(smollm2, monkeypatch):
    # A real model's attention over accepted drafts: the oracle proposes SmolLM2's own greedy
    # continuation, wrong at output indices 5, 6 and 13. From 0: 1-3 accepted; from 4: 5 rejected;
    # from 5: 6 rejected; from 6: 7-9; from 10: 11, 12 then 13 rejected; from 13: 14-16; from 17:
    # 18-20; from 21: 22-24, and the 26 tokens are cut to 24. EOS is ignored, as served.
    tok, target, drafter = smollm2
    prompt = _chat(tok, "Name three colours.")["input_ids"]
    res, oracle, continuation = oracle_generate(monkeypatch, target, drafter, prompt, 24, 3, wrong={5, 6, 13})
    assert res.tokens == continuation[:24] == greedy_generate(target, prompt, 24)
    assert res.accepted_per_step == [3, 0, 0, 3, 2, 3, 3, 3]
    assert res.al == 1 + 17 / 8 and res.per_position_acceptance == [6 / 8, 6 / 8, 5 / 8]
    assert_rounds_follow_the_semantics(oracle, target, drafter, prompt, continuation, 3)


def test_bad_arguments_are_named():
    target = tiny_target()
    drafter = drafter_for(target, aux_layer_ids=(1, 2, 3))
    with pytest.raises(ValueError, match="one prompt at a time"):
        speculative_generate(target, drafter, torch.zeros(2, 3, dtype=torch.long), 4, 2)
    with pytest.raises(ValueError, match="out of range"):
        TargetRunner(target, (1, 5))
