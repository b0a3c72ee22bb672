"""The model card written beside each export: a README.md the hub reads (YAML front matter with
`base_model`) saying what the drafter is for, what it was trained on and what it measured.

    write_model_card(export_dir, summary, cfg, engine="vllm")

`summary` is the trainer's summary.json (validation AL and per-position acceptance, samples,
tokens, epochs, warm-start parent); `cfg` the TrainConfig it ran with.

`base_model` is the target's Hugging Face hub id where one is known (`target_hub_id`): the hub
links the drafter to its target by it, and refuses a card whose base_model is not a hub model.
A target known only as a local folder gets no base_model, and the card says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from eagle_assets.durable import write_durably

CARD_FILE = "README.md"


def target_hub_id(target: str | Path) -> str | None:
    """The target folder's hub id, where one is known: the repo a `target pull` downloaded it
    from (its pull record), the `hf_repo` of the preset whose folder it is (the embedded
    SmolLM2), or its config's `_name_or_path` when that is a hub id; None for a folder known
    only here (the stand-ins, a model of your own)."""
    from eagle_assets.targets import PRESETS
    from eagle_assets.targets.hub import HUB_RECORD, is_hub_id

    folder = Path(target)
    candidates = []
    try:
        candidates.append(json.loads((folder / HUB_RECORD).read_text()).get("repo_id"))
    except (OSError, ValueError, AttributeError):
        pass
    if folder.name in PRESETS:
        candidates.append(PRESETS[folder.name].hf_repo)
    try:
        candidates.append(json.loads((folder / "config.json").read_text()).get("_name_or_path"))
    except (OSError, ValueError, AttributeError):
        pass
    return next((c for c in candidates if isinstance(c, str) and is_hub_id(c)), None)


def model_card(summary: Mapping[str, Any], cfg: Any, engine: str) -> str:
    """The card's text (see the module doc)."""
    hub_id = target_hub_id(cfg.target)
    base = hub_id or Path(cfg.target).name
    accept = summary.get("val_accept") or []
    al = summary.get("val_al")
    measured = (
        f"validation acceptance length {al:.3f} at K={summary.get('ttt_steps')} (per position "
        f"{' / '.join(f'{p:.2f}' for p in accept)}), replayed along {summary.get('val_samples')} held-out "
        "answers of the same corpus"
        if al is not None
        else "no validation samples: no acceptance measured"
    )
    parent = getattr(cfg, "warm_start", None)
    lines = [
        "---",
        *([f"base_model: {json.dumps(hub_id)}"] if hub_id else []),
        "library_name: " + ("vllm" if engine == "vllm" else "sglang"),
        "tags: [eagle3, speculative-decoding, draft-model]",
        "---",
        "",
        f"# EAGLE-3 drafter for {base}",
        "",
        f"Served by {'vLLM' if engine == 'vllm' else 'SGLang'} as the speculative model of {base}; "
        "its config.json names the target layers it reads (`eagle_aux_hidden_state_layer_ids`).",
        "",
        *(
            []
            if hub_id
            else [
                f"The target is local: `{base}` is a model folder with no Hugging Face hub id known here, "
                "so this card names no base_model. Serve the drafter with that same model.",
                "",
            ]
        ),
        f"- Trained: {summary.get('epochs')} epochs, {summary.get('steps')} steps, "
        f"{summary.get('tokens_seen'):,} tokens seen, {summary.get('precision_note') or summary.get('precision')}, {summary.get('world_size')} process(es), "
        f"{summary.get('seconds', 0):.0f} s; " + (f"warm-started from {parent}" if parent else "from freshly initialised weights") + ".",
        f"- Data: the target's own answers, {summary.get('train_samples')} training samples "
        f"({summary.get('train_tokens'):,} tokens) from {', '.join(cfg.shard_dirs)}.",
        f"- Measured: {measured}."
        + (f" The parent measured {summary['parent_val_al']:.3f} on the same samples." if summary.get("parent_val_al") is not None else ""),
        f"- Aux layer ids (Hugging Face hidden_states numbering): {summary.get('aux_layer_ids')}.",
        f"- Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by eagle_assets.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(export_dir: str | Path, summary: Mapping[str, Any], cfg: Any, engine: str) -> Path:
    path = Path(export_dir) / CARD_FILE
    write_durably(path, model_card(summary, cfg, engine).encode())
    return path
