"""A vLLM general plugin for the servers eagle_assets launches: old remote tokenizers load.

Kimi-K2.5's tokenizer is remote code, and released revisions of its `tokenization_kimi.py`
import `bytes_to_unicode` from `transformers.models.gpt2.tokenization_gpt2`, which transformers 5
removed (it lives in `transformers.convert_slow_tokenizer`). vLLM loads the tokenizer in its API
server and engine processes, where that import fails. `register` puts the name back where the
old code looks for it, before any tokenizer loads (vLLM loads general plugins when it reads the
engine's arguments); the pipeline's side does the same (`eagle_assets/corpus/target.py`,
MOVED_NAMES, which this table mirrors: this folder sees nothing of the pipeline).

Runs inside the engine's own environment: transformers only.
"""

# (the module old code imports from, the name, the module that has it now)
MOVED_NAMES = (("transformers.models.gpt2.tokenization_gpt2", "bytes_to_unicode", "transformers.convert_slow_tokenizer"),)


def register() -> None:
    """Supply each moved name where it is missing (on every platform: the tokenizer is not the device's)."""
    import importlib

    for old, name, new in MOVED_NAMES:
        try:
            module = importlib.import_module(old)
        except ImportError:
            continue
        if not hasattr(module, name):
            setattr(module, name, getattr(importlib.import_module(new), name))
