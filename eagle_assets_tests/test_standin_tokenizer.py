"""The Kimi-K2.5 stand-in's tokenizer is built the way the hub's is, and loads the way robust projects load it.

Real parts: tokenizer folders written by `standin_tokenizer` from SmolLM2's vocabulary (a second
each, no model), transformers' own loaders, tiktoken, and the corpus's `ChatTemplate`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.target import MOVED_NAMES, load_tokenizer, target_fingerprint
from eagle_assets.targets import standin_tokenizer as st
from eagle_assets.targets.standins import NUM_RANKS


@pytest.fixture(scope="module")
def ranks(smollm2_path) -> list[bytes]:
    return st.teacher_ranks(smollm2_path / "tokenizer.json")


def _folder(tmp_path: Path, ranks: list[bytes], revision: str, name: str = "kimi") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    st.write_kimi_tokenizer(ranks, folder, revision)
    (folder / "standin_build.json").write_text(json.dumps({"tokenizer_revision": revision}))
    return folder


def test_the_layout_is_the_hubs(tmp_path, ranks):
    assert len(ranks) == NUM_RANKS
    folder = _folder(tmp_path, ranks, "old")
    assert sorted(p.name for p in folder.iterdir()) == [
        "chat_template.jinja",
        "standin_build.json",
        "tiktoken.model",
        "tokenization_kimi.py",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["auto_map"] == {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    code = (folder / "tokenization_kimi.py").read_text()
    for line in (
        "import tiktoken",
        "from tiktoken.load import load_tiktoken_bpe",
        "from transformers.tokenization_utils import PreTrainedTokenizer",
        "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode",
    ):
        assert line in code
    tok = load_tokenizer(folder, trust_remote_code=True)
    assert type(tok).__name__ == "TikTokenTokenizer" and len(tok) == NUM_RANKS + 256
    # The reserved special tokens come after the ranks, at the hub's offsets.
    specials = {
        "[BOS]": 0,
        "[EOS]": 1,
        "<|im_end|>": 2,
        "<|im_user|>": 3,
        "<|im_assistant|>": 4,
        "<|im_middle|>": 17,
        "<think>": 22,
        "</think>": 23,
        "[PAD]": 255,
    }
    for content, offset in specials.items():
        assert tok.encode(content, add_special_tokens=False) == [NUM_RANKS + offset], content
        assert tok.convert_ids_to_tokens(NUM_RANKS + offset) == content
    assert tok.get_vocab()["<think>"] == NUM_RANKS + 22  # what vLLM's kimi_k2 reasoning parser looks up
    text = "Héllo wörld, 12345 + 6 = 12351.\n  你好 <think>x</think>"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_the_loader_takes_the_folders_class_not_a_backend_transformers_builds(tmp_path, ranks):
    """No tokenizer.json ships with it (as on the hub). Without the remote code, transformers 5
    builds a backend of its own from tiktoken.model for the model type: not the folder's class
    (on the hub's K2.5, reports say, with its thinking tokens wrong). The loader takes the class
    the folder names, and refuses to run remote code it was not allowed to."""
    from transformers import AutoTokenizer

    folder = _folder(tmp_path, ranks, "new")
    (folder / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": {"model_type": "kimi_k2"}}))
    assert type(AutoTokenizer.from_pretrained(folder)).__name__ != "TikTokenTokenizer"
    assert type(load_tokenizer(folder, trust_remote_code=True)).__name__ == "TikTokenTokenizer"
    with pytest.raises(ValueError, match="remote code.*trust_remote_code"):
        load_tokenizer(folder)


def test_the_old_revision_loads_and_another_missing_name_is_refused_at_once(tmp_path, ranks):
    """transformers 5 removed `bytes_to_unicode` from the GPT-2 module: the old revision's import
    fails by itself (in a fresh interpreter), loads through `load_tokenizer`, and a revision that
    imports a name transformers has nowhere is refused naming the revision and the fix."""
    import subprocess
    import sys

    old = _folder(tmp_path, ranks, "old")
    probe = f"import sys; sys.path.insert(0, {str(old)!r}); import tokenization_kimi"
    failed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert failed.returncode != 0 and "cannot import name 'bytes_to_unicode'" in failed.stderr
    assert MOVED_NAMES[0][1] == "bytes_to_unicode"
    new = load_tokenizer(_folder(tmp_path, ranks, "new", "kimi-new"), trust_remote_code=True)
    assert load_tokenizer(old, trust_remote_code=True).encode("<think> hi") == new.encode("<think> hi")

    broken = _folder(tmp_path, ranks, "old", "kimi-broken")
    code = (broken / "tokenization_kimi.py").read_text().replace("import bytes_to_unicode", "import bytes_to_unicode, tokenizer_of_1999")
    (broken / "tokenization_kimi.py").write_text(code)
    (broken / "eagle_assets.hub.json").write_text(json.dumps({"repo_id": "moonshotai/Kimi-K2.5", "revision": "0123abcd" * 5, "files": {}}))
    with pytest.raises(ValueError, match=r"revision 0123abcd.*tokenizer_of_1999.*Fix: pull a revision"):
        load_tokenizer(broken, trust_remote_code=True)
    # The tokenizer's code is part of what the corpus is made of: another revision, another fingerprint.
    (broken / "config.json").write_text("{}")
    (old / "config.json").write_text("{}")
    assert target_fingerprint(broken).split("-")[-1] != target_fingerprint(old).split("-")[-1]


def test_the_deepseek_layout_has_the_same_vocabulary_as_a_fast_tokenizer(tmp_path, ranks):
    from transformers import AutoTokenizer

    kimi = _folder(tmp_path, ranks, "new")
    fast_dir = tmp_path / "fast"
    st.write_fast_tokenizer(kimi, fast_dir)
    fast, slow = AutoTokenizer.from_pretrained(fast_dir), load_tokenizer(kimi, trust_remote_code=True)
    text = "The quick brown fox, 1999!\n\tTabs  and  spaces. <|im_end|><think>r</think>"
    assert fast.encode(text, add_special_tokens=False) == slow.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}]
    assert fast.apply_chat_template(messages, tokenize=False) == slow.apply_chat_template(messages, tokenize=False)


def test_the_chat_template_renders_thinking_as_the_hubs_and_the_corpus_keeps_what_the_target_wrote(tmp_path, ranks):
    """History turns are `<think></think>` and their answer, the generation prompt opens `<think>`
    (or closes it at once with thinking off). Applied to a conversation the template keeps no
    reasoning, so the corpus writes the last turn as the target wrote it after the generation
    prompt: one `<think>`, its reasoning, one `</think>`, the answer, `<|im_end|>`."""
    tok = load_tokenizer(_folder(tmp_path, ranks, "old"), trust_remote_code=True)
    user = {"role": "user", "content": "What is 2 + 2?"}
    asked = tok.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
    assert asked.startswith(f"<|im_system|>system<|im_middle|>{st.DEFAULT_SYSTEM_PROMPT}<|im_end|><|im_user|>user<|im_middle|>")
    assert asked.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    off = tok.apply_chat_template([user], tokenize=False, add_generation_prompt=True, thinking=False)
    assert off.endswith("<|im_middle|><think></think>")
    answer = {"role": "assistant", "content": "4.", "reasoning_content": "Two and two."}
    assert tok.apply_chat_template([user, answer], tokenize=False).endswith("<|im_middle|><think></think>4.<|im_end|>")

    template = ChatTemplate(tok)
    assert not template.handles_reasoning and template.thinking_end == "</think>" and template.end_of_turn == "<|im_end|>"
    conversation = [
        user,
        answer,
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "Three and three."},
    ]
    example = template.tokenize(conversation)
    think, end = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    assert example.text.endswith("<|im_middle|><think>Three and three.</think>6.<|im_end|>")
    assert "<think></think>4.<|im_end|>" in example.text  # the first turn, as history
    assert example.input_ids.count(think) == 2 and example.input_ids.count(end) == 2 and "<think><think>" not in example.text
    trained = [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    assert tok.decode(trained) == "Three and three.</think>6.<|im_end|>"  # the last turn as the target wrote it
    row = {"sample_id": "s", "messages": json.dumps(conversation), "input_ids": example.input_ids, "loss_mask": example.loss_mask}
    assert template.find_mismatch(row) is None
    # The history the target is sent for the second turn: no reasoning wrapped into the content.
    assert template.training_messages(conversation[:3])[1] == {"role": "assistant", "content": "4."}


def test_a_hub_kimi_folder_copied_whole_still_loads(tmp_path, ranks):
    """The loader reads the folder, not a cache: a copy elsewhere (a model store) loads the same."""
    folder = _folder(tmp_path, ranks, "old")
    copy = Path(shutil.copytree(folder, tmp_path / "elsewhere" / "Kimi-K2.5"))
    assert load_tokenizer(copy, trust_remote_code=True).encode("<|im_end|>", add_special_tokens=False) == [NUM_RANKS + 2]


def test_the_engine_plugin_lets_the_old_revision_load_in_the_engines_environment(tmp_path, ranks, engine_python):
    """vLLM loads the tokenizer in its own processes and environment (transformers 5 there too):
    the plugin every launched server loads supplies the moved name before the import."""
    import subprocess

    from eagle_assets.engines.vllm_launch import ENGINE_SITE

    old = _folder(tmp_path, ranks, "old")
    load = (
        f"import sys; sys.path.insert(0, {str(ENGINE_SITE)!r}); sys.path.insert(0, {str(old)!r})\n"
        "{register}import tokenization_kimi; print('loaded')"
    )
    without = subprocess.run([str(engine_python), "-c", load.format(register="")], capture_output=True, text=True)
    assert without.returncode != 0 and "bytes_to_unicode" in without.stderr
    plugin = "import eagle_assets_tokenizer_compat; eagle_assets_tokenizer_compat.register()\n"
    done = subprocess.run([str(engine_python), "-c", load.format(register=plugin)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr[-500:]
