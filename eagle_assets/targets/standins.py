"""Seed-architecture stand-ins: tiny DeepSeek-V3 and Kimi-K2.5 models, built here, no download.

The pipeline's real targets (Kimi-K2.5, DeepSeek-V3) are 1T / 671B-parameter MoE models with
MLA attention. These stand-ins have their architecture and their checkpoints' layouts at a size
a 2-core CPU builds in about three minutes, so that every stage (Hugging Face loads, vLLM
serving, hidden-state extraction, drafter training) runs on the code paths the real targets take:

  * `tiny-deepseek-v3`: `DeepseekV3ForCausalLM`, the hub's per-expert weight names and its
    config.json (yarn rope, `noaux_tc` sigmoid routing with `e_score_correction_bias`).
  * `tiny-kimi-k2.5`: `KimiK25ForConditionalGeneration`, the same language model under
    `language_model.`, a tiny vision tower and projector, and a tokenizer built the way the
    hub's is (`standin_tokenizer.py`): remote code reading tiktoken BPE ranks, 256 special
    tokens after them (`<think>`, `</think>` among them), Kimi's chat template.

Both share ONE language model (the same tensors), so the two layouts give identical logits, and
one vocabulary (SmolLM2's, as tiktoken ranks; the DeepSeek layout gets it as a fast
tokenizer.json). Its weights are not random: random weights repeat themselves and leave
near-ties everywhere, which makes greedy comparisons between engines meaningless. It is
distilled, seeded, from the embedded SmolLM2: SmolLM2's greedy answers to prompts built from the
corpus openings and topics (never MT-Bench), written in Kimi's chat layout as a thinking answer
(`<think>` its first sentence `</think>` the rest, `reasoning_split`), then cross-entropy on them.

    eagle-assets target pull tiny-kimi-k2.5     # or tiny-deepseek-v3

builds both (`build(teacher, out)`) into the cache with a checksum record (`targets/embedded.py: pull`); `benchmarks/standin_quality.py` measures how peaked they are.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle_assets.durable import file_sha256

DEEPSEEK_STANDIN = "tiny-deepseek-v3"
KIMI_STANDIN = "tiny-kimi-k2.5"
STANDINS = (DEEPSEEK_STANDIN, KIMI_STANDIN)
BUILD_RECORD = "standin_build.json"
"""Written into both folders: the build settings, LAYOUT_VERSION and the language model's weight
hash, so a pull can tell that the two folders came from one build of the current recipe."""
LAYOUT_VERSION = 3
"""Raised whenever what a build writes changes (2: Kimi-K2.5's media_placeholder_token_id; 3: the
hub's tokenizer layout, thinking answers), so that stand-ins built before are built again. Each
version's stand-ins live in a folder of their own (`targets/embedded.py: standin_folder`), so that
checkouts of two versions sharing one cache do not rebuild each other's."""
TOKENIZER_REVISION = "old"
"""The revision of `tokenization_kimi.py` the Kimi stand-in ships (`standin_tokenizer.REVISIONS`):
the old import of `bytes_to_unicode`, which transformers 5 removed, so that every run on it
takes the path a pinned older revision of the hub's takes."""
NUM_RANKS = 49156
"""tiktoken ranks made from SmolLM2's vocabulary (its 49,135 regular tokens and the 21 single
bytes it lacks); the build checks it."""

# DeepSeek-V3's yarn rope as its hub config.json writes it. The model is trained under it: yarn
# changes the rotary frequencies and the attention scale, so training without it would give a
# model whose served function is not the trained one.
HUB_ROPE_SCALING = {
    "type": "yarn",
    "factor": 40,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
ROPE_THETA = 10000.0
MAX_POSITION_EMBEDDINGS = 163840

# The text model's shape. MLA keeps the real head dims (kv_lora_rank 512, rope 64, nope 128,
# v 128): vLLM's CPU MLA backend refuses other head sizes. 8 layers make the engines' default
# aux ids (2, L//2, L-3) = (2, 4, 5) distinct; 8 experts in 4 groups, top-2 groups, 2 experts
# per token exercise the grouped `noaux_tc` routing; layer 0 is dense (first_k_dense_replace).
TEXT_SHAPE = dict(
    vocab_size=NUM_RANKS + 256,  # the ranks and the 256 special tokens after them
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    moe_intermediate_size=128,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    bos_token_id=NUM_RANKS,  # [BOS]
    eos_token_id=NUM_RANKS + 2,  # <|im_end|>: every turn ends with it, so generation stops there
    pad_token_id=NUM_RANKS + 255,  # [PAD]
    tie_word_embeddings=False,
)

# Initial weights' std. At transformers' 0.02 this model learned slowly (the low-rank, normed MLA
# projections start nearly flat): 16 answers were still at loss 2.6 after 120 full-batch steps;
# at 0.05 it learned them (loss < 0.1) in 40, as a Llama of the same width does at 0.02.
INIT_STD = 0.05

# Fields the hub's DeepSeek-V3 config.json has and transformers' save_pretrained does not write
# (vLLM's loader needs topk_method/scoring_func to place `e_score_correction_bias`).
HUB_TEXT_FIELDS = {
    "rope_theta": ROPE_THETA,
    "rope_scaling": HUB_ROPE_SCALING,
    "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
    "moe_layer_freq": 1,
    "torch_dtype": "bfloat16",
    "num_nextn_predict_layers": 0,
}
# Written by transformers, absent from the hub's file (its rope lives in rope_scaling instead).
NON_HUB_TEXT_FIELDS = ("rope_parameters", "qk_head_dim", "head_dim", "dtype", "transformers_version")

# A tiny vision tower in transformers' Kimi_K25VisionConfig schema (the one vLLM 0.32 reads).
VISION_CONFIG = {
    "model_type": "kimi_k25_vision",
    "patch_size": 14,
    "pos_emb_height": 8,
    "pos_emb_width": 8,
    "pos_emb_time": 4,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "merge_kernel_size": [2, 2],
}
# Media token ids: the media special tokens at the hub's offsets (<|media_begin|>, <|media_pad|>,
# <|media_end|>, <|media_content|>), which a text prompt never carries.
MEDIA_TOKEN_IDS = {
    "vision_start_token_id": NUM_RANKS + 18,
    "image_token_id": NUM_RANKS + 21,
    "vision_end_token_id": NUM_RANKS + 20,
    "video_token_id": NUM_RANKS + 19,
}
# vLLM's Kimi-K2.5 image processor refuses to start without this file.
PREPROCESSOR_CONFIG = {
    "media_proc_cfg": {
        "in_patch_limit": 16384,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 512,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "sample_fps": 2.0,
        "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": 4,
        "timestamp_mode": "hh:mm:ss.fff",
        "config_type": "media_proc_config_v1",
    }
}


def text_config():
    """The stand-in's `DeepseekV3Config`, with the hub's yarn rope as transformers spells it."""
    from transformers import DeepseekV3Config

    rope = {k: v for k, v in HUB_ROPE_SCALING.items() if k != "type"}
    rope.update(rope_type="yarn", rope_theta=ROPE_THETA)
    return DeepseekV3Config(**TEXT_SHAPE, rope_parameters=rope, max_position_embeddings=MAX_POSITION_EMBEDDINGS, initializer_range=INIT_STD)


def hub_text_config(saved: dict) -> dict:
    """transformers' config.json for the text model rewritten in the hub's form."""
    cfg = {k: v for k, v in saved.items() if k not in NON_HUB_TEXT_FIELDS}
    cfg.update(HUB_TEXT_FIELDS)
    return cfg


def kimi_config(text: dict) -> dict:
    """The Kimi-K2.5 config.json around a hub-form DeepSeek-V3 text config."""
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {**text, "model_type": "kimi_k2"},
        "vision_config": VISION_CONFIG,
        "projection_hidden_size": VISION_CONFIG["hidden_size"],
        "projection_layer_norm_eps": 1e-5,
        **MEDIA_TOKEN_IDS,
        # The hub's config.json names the image token so as well (transformers reads
        # image_token_id); vLLM's EAGLE-3 proposer reads this name of a Kimi-K2.5 target.
        "media_placeholder_token_id": MEDIA_TOKEN_IDS["image_token_id"],
        "bos_token_id": text["bos_token_id"],
        "eos_token_id": text["eos_token_id"],
        "pad_token_id": text["pad_token_id"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


# ---------------------------------------------------------------------------------------------
# Distillation data: the teacher's greedy answers.


def _topics() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training topics, held-out topics): every fifth topic is kept out of training."""
    from eagle_assets.corpus.prompts import load_topics

    topics = load_topics()
    return tuple(t for i, t in enumerate(topics) if i % 5), topics[::5]


def distillation_prompts(count: int, seed: int) -> list[str]:
    """`count` training prompts: each corpus opening in turn, with a seeded training topic."""
    from eagle_assets.corpus.prompts import TOPIC_OPENINGS

    train, _ = _topics()
    rng = random.Random(seed)
    return [TOPIC_OPENINGS[i % len(TOPIC_OPENINGS)].format(topic=rng.choice(train)) for i in range(count)]


def held_out_prompts(count: int = 16) -> list[str]:
    """Prompts no build trains on: held-out topics under the corpus openings (not MT-Bench)."""
    from eagle_assets.corpus.prompts import TOPIC_OPENINGS

    _, held_out = _topics()
    return [TOPIC_OPENINGS[(3 * i + 1) % len(TOPIC_OPENINGS)].format(topic=held_out[i % len(held_out)]) for i in range(count)]


def chat_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The chat template's ids for one user turn, ending with the assistant header."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def reasoning_split(answer: str) -> tuple[str, str]:
    """A teacher answer as (reasoning, answer) for a thinking turn: its first sentence (to the
    first '.', '!' or '?' before a space, or the first line break) as the reasoning and the rest
    as the answer; an answer of one sentence is split after half of its words."""
    found = re.search(r"[.!?](?=\s)|\n", answer)
    if found and answer[found.end() :].strip():
        return answer[: found.end()].strip(), answer[found.end() :].strip()
    words = answer.split(" ")
    half = max(1, len(words) // 2)
    return " ".join(words[:half]).strip(), " ".join(words[half:]).strip()


def thinking_sample(tokenizer, prompt: str, answer: str, finished: bool) -> tuple[list[int], int]:
    """(ids, answer start) of one distillation sample in the stand-in's chat layout: the
    generation prompt (ending in `<think>`), the reasoning, `</think>`, the answer and, where the
    teacher finished its answer, `<|im_end|>`: what the stand-in then writes itself."""
    from eagle_assets.targets.standin_tokenizer import THINK_END

    prompt_ids = chat_prompt_ids(tokenizer, prompt)
    reasoning, rest = reasoning_split(answer)
    text = reasoning + THINK_END + rest + ("<|im_end|>" if finished else "")
    return prompt_ids + list(tokenizer.encode(text, add_special_tokens=False)), len(prompt_ids)


@torch.inference_mode()
def greedy_answers(model, prompts_ids: Sequence[list[int]], max_new_tokens: int, batch_size: int, pad_id: int) -> list[list[int]]:
    """Greedy answers (ids, ending with eos when one was written) by batched HF generation,
    left-padded. Batches are formed in length order so that little padding is computed."""
    eos = model.config.eos_token_id
    order = sorted(range(len(prompts_ids)), key=lambda i: len(prompts_ids[i]))
    answers: list[list[int]] = [[] for _ in prompts_ids]
    for start in range(0, len(order), batch_size):
        batch = [prompts_ids[i] for i in order[start : start + batch_size]]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=eos,
        )
        for row, i in zip(out[:, width:].tolist(), order[start : start + batch_size]):
            answers[i] = row[: row.index(eos) + 1] if eos in row else row
    return answers


# ---------------------------------------------------------------------------------------------
# Training.


@dataclass(frozen=True)
class BuildSettings:
    """What a build does; the defaults finish in about four minutes on 2 cores.

    120 steps sufficed for SmolLM2's own chat layout (loss 0.49 at seed 0), but for the thinking
    answers in Kimi's layout they ended at 1.3 to 2.0 over three seeds, answering in loops; 240
    end near 0.3 at seeds 0 and 1. 96 answers of 96 tokens in 60 steps ended at loss 5.3
    answering "\\n" to every prompt."""

    seed: int = 0
    num_prompts: int = 48
    """Teacher answers to distil (one per prompt)."""
    answer_tokens: int = 64
    """Longest teacher answer; longer ones are cut (and so teach no end of answer)."""
    teacher_batch: int = 48
    steps: int = 240
    batch_size: int = 16
    """Samples per optimizer step."""
    lr: float = 3e-3
    warmup_steps: int = 6
    weight_decay: float = 0.0
    teacher_init: bool = False
    """Start the embeddings and lm_head from a projection of the teacher's embedding matrix
    (off: from INIT_STD's random weights the same steps learned the answers further)."""


def new_language_model(seed: int, teacher_embeddings: torch.Tensor | None = None):
    """A seeded `DeepseekV3ForCausalLM` of TEXT_SHAPE (fp32), optionally with embeddings and
    lm_head rows taken from the teacher's (vocab, H_teacher) matrix projected onto its top
    principal directions: tokens the distillation data never shows then still sit near the
    tokens they resemble instead of at random."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(text_config()).float()
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                # A nonzero routing bias, as trained checkpoints have, so that an engine that
                # ignored it would route differently (zeros would hide that).
                gate.e_score_correction_bias.uniform_(-0.05, 0.05)
        if teacher_embeddings is not None:
            e = teacher_embeddings.float()
            e = e - e.mean(0)
            _, _, v = torch.linalg.svd(e[torch.randperm(e.shape[0])[:8192]], full_matrices=False)
            projected = e @ v[:hidden].T  # (vocab, hidden)
            projected *= model.config.initializer_range / projected.std()
            model.model.embed_tokens.weight.copy_(projected)
            model.lm_head.weight.copy_(projected)
    return model


def _batches(samples: list[tuple[list[int], int]], batch_size: int, steps: int, seed: int, pad_id: int):
    """`steps` padded batches (ids (B, T), attention mask (B, T), loss mask (B, T-1)), drawn as
    seeded epochs; the loss mask marks the positions that predict an answer token."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            epoch = list(range(len(samples)))
            rng.shuffle(epoch)
            order += epoch
        picked, order = order[:batch_size], order[batch_size:]
        width = max(len(samples[i][0]) for i in picked)
        ids = torch.full((len(picked), width), pad_id)
        attn = torch.zeros(len(picked), width, dtype=torch.long)
        loss_mask = torch.zeros(len(picked), width - 1, dtype=torch.bool)
        for row, i in enumerate(picked):
            seq, answer_start = samples[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            attn[row, : len(seq)] = 1
            loss_mask[row, answer_start - 1 : len(seq) - 1] = True
        yield ids, attn, loss_mask


def distil(
    model, samples: list[tuple[list[int], int]], settings: BuildSettings, autocast: bool, pad_id: int, log: Callable[[str], None] = print
) -> list[float]:
    """Cross-entropy training on the answer tokens of `samples` ((prompt + answer ids, answer
    start) each). Returns the loss of every step.

    The softmax runs over the words the samples hold (a few thousand), not all 49152, and only
    on the rows that predict an answer token: over the whole vocabulary the logits, softmax and
    lm_head gradient were half of a step on 2 cores. Words the samples never show keep their
    small initial lm_head rows, so their logits stay near zero, far below a trained model's top
    logit."""
    vocab = torch.unique(torch.tensor([t for seq, _ in samples for t in seq]))  # sorted ids
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:  # linear warm-up, cosine down to a tenth
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        done = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses = []
    for step, (ids, attn, loss_mask) in enumerate(_batches(samples, settings.batch_size, settings.steps, settings.seed, pad_id)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h = model.model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)
            rows = h[:, :-1][loss_mask]  # (N, H): states that predict an answer token
            logits = rows @ model.lm_head.weight[vocab].T  # (N, len(vocab))
            loss = F.cross_entropy(logits, torch.searchsorted(vocab, ids[:, 1:][loss_mask]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 60 == 0 or step == settings.steps - 1:
            log(f"  step {step + 1}/{settings.steps}: loss {loss.item():.3f}")
    model.eval()
    return losses


# ---------------------------------------------------------------------------------------------
# Measuring: how peaked and how varied the greedy answers are.


def distinct_share(answers: Sequence[Sequence[int]]) -> float:
    """Mean over answers of distinct tokens / tokens: near 1 for varied text, near 0 for an
    answer that repeats one token (answers without tokens are skipped)."""
    shares = [len(set(a)) / len(a) for a in answers if len(a)]
    return sum(shares) / len(shares)


@torch.inference_mode()
def top2_margins(model, prompts_ids: Sequence[list[int]], answers: Sequence[list[int]]) -> torch.Tensor:
    """The gap between the two largest logits at every answer position (fp32 logits of the
    model as given): a near-zero gap is a near-tie that two engines may break differently."""
    gaps = []
    for prompt, answer in zip(prompts_ids, answers):
        if not answer:
            continue
        logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : len(prompt) + len(answer) - 1]
        top = logits.float().topk(2, dim=-1).values  # (len(answer), 2)
        gaps.append(top[:, 0] - top[:, 1])
    return torch.cat(gaps)


# ---------------------------------------------------------------------------------------------
# Writing the two layouts.


def write_deepseek(model, tokenizer_dir: Path, out: Path) -> None:
    """The hub's DeepSeek-V3 folder: bf16 weights in per-expert names (transformers'
    save_pretrained writes them so), hub config.json, the stand-ins' vocabulary as a fast
    tokenizer.json with the chat template (`tokenizer_dir`: the Kimi tokenizer's files)."""
    from eagle_assets.targets.standin_tokenizer import write_fast_tokenizer

    biases = {n: b.float().clone() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    model = model.to(torch.bfloat16)
    for name, bias in biases.items():  # fp32 in the hub's checkpoint, as transformers keeps it
        model.get_submodule(name.rsplit(".", 1)[0]).e_score_correction_bias = bias
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = TEXT_SHAPE["pad_token_id"]
    model.save_pretrained(out, safe_serialization=True)
    saved = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(hub_text_config(saved), indent=2))
    write_fast_tokenizer(tokenizer_dir, out)


def vision_tensors(seed: int) -> dict[str, torch.Tensor]:
    """A seeded tiny vision tower and projector in the hub's Kimi-K2.5 names (bf16).

    transformers' `Kimi_K25ForConditionalGeneration` writes them with save_pretrained in its
    reverse-converted names, two of which are not the hub's: `model.mm_projector.` (hub:
    `mm_projector.`) and `vision_tower.encoder.patch_embed` (hub: `vision_tower.patch_embed`)."""
    from safetensors.torch import load_file
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    # The projector's output width is the text model's; the text model itself is dropped, so a
    # one-layer one with a small vocabulary stands in for it here.
    text = {
        **TEXT_SHAPE,
        "num_hidden_layers": 1,
        "vocab_size": 64,
        "model_type": "deepseek_v3",
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }
    torch.manual_seed(seed)
    cfg = Kimi_K25Config(
        text_config=text, vision_config=VISION_CONFIG, projection_hidden_size=VISION_CONFIG["hidden_size"], tie_word_embeddings=False
    )
    model = Kimi_K25ForConditionalGeneration(cfg).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        saved = load_file(Path(tmp) / "model.safetensors")
    renames = (("model.mm_projector.", "mm_projector."), ("vision_tower.encoder.patch_embed", "vision_tower.patch_embed"))
    tensors = {}
    for name, tensor in saved.items():
        if name.startswith("language_model."):
            continue
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old) :]
        tensors[name] = tensor.contiguous()
    return tensors


def write_kimi(deepseek_dir: Path, tokenizer_dir: Path, out: Path, seed: int) -> None:
    """The hub's Kimi-K2.5 folder around the DeepSeek folder's language model: its tensors under
    `language_model.`, a tiny vision tower, the Kimi config, preprocessor config, and the
    tokenizer as the hub ships it (`tokenizer_dir`: `standin_tokenizer.write_kimi_tokenizer`'s files)."""
    from safetensors.torch import load_file, save_file

    tensors = {f"language_model.{k}": v for k, v in load_file(deepseek_dir / "model.safetensors").items()}
    tensors.update(vision_tensors(seed))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    text = json.loads((deepseek_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(kimi_config(text), indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    shutil.copyfile(deepseek_dir / "generation_config.json", out / "generation_config.json")
    for f in sorted(tokenizer_dir.iterdir()):
        shutil.copyfile(f, out / f.name)


# ---------------------------------------------------------------------------------------------
# The build.


def build(
    teacher_dir: str | Path, out_root: str | Path, settings: BuildSettings = BuildSettings(), log: Callable[[str], None] = print
) -> dict[str, Path]:
    """Distil the shared language model from the teacher and write both stand-ins under
    `out_root` (one folder per name in STANDINS, replaced if present). Returns name -> folder."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle_assets.corpus.target import load_tokenizer
    from eagle_assets.engines.cpu_isa import host_cpu
    from eagle_assets.targets.standin_tokenizer import teacher_ranks, write_kimi_tokenizer

    teacher_dir, out_root = Path(teacher_dir), Path(out_root)
    started = time.perf_counter()
    # bf16 where the processor has bf16 instructions (several times fp32's rate there, emulated and
    # slower elsewhere): decided by the processor's kind, recorded, never by a timing.
    fast_bf16 = host_cpu().kind in ("amx", "avx512_bf16")
    ranks = teacher_ranks(teacher_dir / "tokenizer.json")
    if len(ranks) != NUM_RANKS:
        raise RuntimeError(f"{teacher_dir}'s vocabulary makes {len(ranks)} tiktoken ranks, the stand-ins' shape says {NUM_RANKS}")
    tokenizer_dir = out_root / "tokenizer"
    if tokenizer_dir.exists():
        shutil.rmtree(tokenizer_dir)
    tokenizer_dir.mkdir(parents=True)
    write_kimi_tokenizer(ranks, tokenizer_dir, TOKENIZER_REVISION)
    student_tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=True)  # the loader every stage uses
    teacher_tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    teacher_pad, teacher_eos = teacher_tokenizer.pad_token_id, teacher_tokenizer.eos_token_id
    prompts = distillation_prompts(settings.num_prompts, settings.seed)
    prompts_ids = [chat_prompt_ids(teacher_tokenizer, p) for p in prompts]
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.bfloat16 if fast_bf16 else torch.float32).eval()
    log(f"standins: {len(prompts_ids)} greedy answers from {teacher_dir.name} ({settings.answer_tokens} tokens at most)")
    answers = greedy_answers(teacher, prompts_ids, settings.answer_tokens, settings.teacher_batch, teacher_pad)
    del teacher
    samples = [
        thinking_sample(student_tokenizer, prompt, teacher_tokenizer.decode(a, skip_special_tokens=True), a[-1] == teacher_eos)
        for prompt, a in zip(prompts, answers)
        if a
    ]
    log(f"standins: {sum(map(len, answers))} answer tokens in {time.perf_counter() - started:.0f} s; training")

    teacher_embeddings = None
    if settings.teacher_init:  # the teacher's rows where its tokens are ranks here; the special tokens' zero
        teacher_rows = load_file(teacher_dir / "model.safetensors")["model.embed_tokens.weight"]
        first_regular = NUM_RANKS - (teacher_rows.shape[0] - 17)  # SmolLM2: 17 special tokens first
        teacher_embeddings = torch.zeros(TEXT_SHAPE["vocab_size"], teacher_rows.shape[1], dtype=teacher_rows.dtype)
        teacher_embeddings[first_regular:NUM_RANKS] = teacher_rows[17:]
    model = new_language_model(settings.seed, teacher_embeddings)
    pad_id = TEXT_SHAPE["pad_token_id"]
    losses = distil(model, samples, settings, autocast=fast_bf16, pad_id=pad_id, log=log)

    deepseek_dir, kimi_dir = out_root / DEEPSEEK_STANDIN, out_root / KIMI_STANDIN
    for folder in (deepseek_dir, kimi_dir):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    write_deepseek(model, tokenizer_dir, deepseek_dir)
    write_kimi(deepseek_dir, tokenizer_dir, kimi_dir, settings.seed)
    shutil.rmtree(tokenizer_dir)
    weights = file_sha256(deepseek_dir / "model.safetensors")
    record = {
        "language_model_sha256": weights,
        "layout": LAYOUT_VERSION,
        "tokenizer_revision": TOKENIZER_REVISION,
        "settings": asdict(settings),
        "teacher": teacher_dir.name,
        "answer_tokens": sum(map(len, answers)),
        "first_loss": round(losses[0], 4),
        "last_loss": round(losses[-1], 4),
        "bf16_autocast": fast_bf16,
        "cpu": host_cpu().describe(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    for folder in (deepseek_dir, kimi_dir):
        (folder / BUILD_RECORD).write_text(json.dumps(record, indent=2))
    log(f"standins: built in {record['seconds']:.0f} s (loss {record['first_loss']:.2f} -> {record['last_loss']:.2f})")
    return {DEEPSEEK_STANDIN: deepseek_dir, KIMI_STANDIN: kimi_dir}
