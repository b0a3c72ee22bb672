"""How the corpus's prompts change from Magpie to ShareGPT: the two prompt sets side by side.

    python3 benchmarks/prompt_sources.py --sharegpt 2000 [--magpie data/smollm2-135m-instruct/prompts/prompts.jsonl]

For each set: prompts, user turns per prompt, user-turn length in SmolLM2's tokens (mean, p50,
p90; every user turn, and the first alone), the share of distinct first words among the
prompts (how varied their openings are), and two spreads over kinds of request:

  opens like   the share of first turns that open with one of the Magpie task-opening families
               (prompts.py `TASK_OPENINGS`, grouped as its comment lists them: writing, role-play,
               reasoning, maths, coding, extraction, science, humanities), case-insensitive:
               how much of the set asks the way Magpie's openings steer it to
  mentions     the share whose first turn matches a family's keywords anywhere (a simple regex
               per family, `KEYWORDS`): the kind of request whatever its wording, since real
               requests seldom open with Magpie's phrases

ShareGPT's side is a seeded sample of the packaged conversations (every human turn), read and
fitted to the context (`--context`, `--answer-tokens`: SmolLM2's 2,048 with 256-token answers)
as the `prompts` asset reads them for the corpus. Magpie's side needs prompts the target wrote (a vLLM server, or
a GPU): give a prompts file (`--magpie`, e.g. the `prompts` asset's prompts.jsonl); without one
the script says so and prints ShareGPT's side alone. No server, no GPU.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from eagle_assets.corpus.prompt_formats import ContextFit, sharegpt_prompts  # noqa: E402
from eagle_assets.corpus.prompt_record import Prompt  # noqa: E402
from eagle_assets.corpus.prompts import TASK_OPENINGS, load_prompt_file

# TASK_OPENINGS, grouped in the order its comment names the families (first opening of each).
_FAMILY_STARTS = {
    "writing": "Write a short story about",
    "role-play": "Imagine you are",
    "reasoning": "Solve this riddle:",
    "maths": "Calculate",
    "coding": "Write a Python function that",
    "extraction": "Summarize the following text:",
    "science": "Explain how",
    "humanities": "Discuss the impact of",
}


def opening_families() -> dict[str, tuple[str, ...]]:
    """TASK_OPENINGS split into its families: each family runs from its first opening to the next's."""
    starts = [TASK_OPENINGS.index(o) for o in _FAMILY_STARTS.values()] + [len(TASK_OPENINGS)]
    return {name: TASK_OPENINGS[a:b] for name, a, b in zip(_FAMILY_STARTS, starts, starts[1:])}


KEYWORDS = {
    "writing": r"\b(write|essay|story|poem|email|blog|article|letter|speech|rewrite|draft)\b",
    "role-play": r"\b(act as|pretend|imagine you|you are an?|role ?play)\b",
    "reasoning": r"\b(riddle|puzzle|logic|likely|reason(ing)?|why would)\b",
    "maths": r"\b(calculate|solve|equation|sum|probability|integral|math|prove)\b|\d\s*[-+*/^=]\s*\d",
    "coding": r"\b(code|python|javascript|function|sql|bug|error|api|class|script|java|c\+\+|html|css|react)\b|```",
    "extraction": r"\b(summari[sz]e|extract|classify|following (text|paragraph|article)|key points)\b",
    "science": r"\b(explain|difference between|why does|process of|physics|chemistry|biology|science)\b",
    "humanities": r"\b(history|impact of|causes of|compare|advice|pros and cons|culture|philosophy|suggest)\b",
}


def first_word(text: str) -> str:
    words = re.findall(r"[\w']+", text.lower())
    return words[0] if words else ""


def describe(prompts: Sequence[Prompt], tokenizer) -> dict[str, object]:
    """The figures of one prompt set (see the module docstring)."""
    turns = [t for p in prompts for t in p.turns]
    lengths = np.array([len(ids) for ids in tokenizer(turns, add_special_tokens=False)["input_ids"]])
    first = np.array([len(ids) for ids in tokenizer([p.turns[0] for p in prompts], add_special_tokens=False)["input_ids"]])
    per = np.array([len(p.turns) for p in prompts])
    heads = [p.turns[0].lstrip().lower() for p in prompts]
    out: dict[str, object] = {
        "prompts": len(prompts),
        "user turns": len(turns),
        "turns per prompt (mean / max)": f"{per.mean():.2f} / {per.max()}",
        "multi-turn prompts": f"{(per > 1).mean():.1%}",
        "tokens per user turn (mean / p50 / p90)": _dist(lengths),
        "tokens of the first turn (mean / p50 / p90)": _dist(first),
        "distinct first words": f"{len({first_word(p.turns[0]) for p in prompts}) / len(prompts):.1%}",
    }
    for family, openings in opening_families().items():
        out[f"opens like {family}"] = f"{np.mean([h.startswith(tuple(o.lower() for o in openings)) for h in heads]):.1%}"
    out["opens like none of them"] = f"{np.mean([not h.startswith(tuple(o.lower() for o in TASK_OPENINGS)) for h in heads]):.1%}"
    for family, pattern in KEYWORDS.items():
        out[f"mentions {family}"] = f"{np.mean([bool(re.search(pattern, h)) for h in heads]):.1%}"
    out["mentions none of them"] = f"{np.mean([not any(re.search(p, h) for p in KEYWORDS.values()) for h in heads]):.1%}"
    return out


def _dist(a: np.ndarray) -> str:
    return f"{a.mean():.0f} / {np.percentile(a, 50):.0f} / {np.percentile(a, 90):.0f}"


def table(columns: dict[str, dict[str, object]]) -> str:
    names = list(columns)
    rows = list(next(iter(columns.values())))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {r} | " + " | ".join(str(columns[n][r]) for n in names) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sharegpt", type=int, default=2000, help="ShareGPT conversations to sample (all human turns of each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--magpie", help="a prompts file of Magpie prompts (e.g. the prompts asset's prompts.jsonl)")
    ap.add_argument("--context", type=int, default=2048, help="fit ShareGPT's conversations to this context, as the asset does (0: as they are)")
    ap.add_argument("--answer-tokens", type=int, default=256, help="room kept for each answer when fitting")
    ap.add_argument("--tokenizer", help="a target's folder, for its tokenizer (default the embedded SmolLM2's)")
    a = ap.parse_args(argv)
    from eagle_assets.corpus.target import load_tokenizer
    from eagle_assets.targets.embedded import pull

    tokenizer = load_tokenizer(a.tokenizer or pull(log=lambda m: None))
    columns = {}
    if a.magpie:
        magpie = load_prompt_file(a.magpie)
        columns[f"Magpie ({Path(a.magpie).name})"] = describe(magpie, tokenizer)
    else:
        print(
            "no Magpie prompts file given (--magpie): Magpie's prompts need the target served (a vLLM server or a GPU); "
            "printing ShareGPT's side only\n"
        )
    fit = ContextFit(tokenizer, a.context, a.answer_tokens) if a.context else None
    sample, stats = sharegpt_prompts(a.sharegpt, a.seed, fit=fit)
    fitted = f", fitted to {a.context:,} tokens" if fit else ""
    columns[f"ShareGPT (sample of {a.sharegpt:,}, seed {a.seed}{fitted})"] = describe(sample, tokenizer)
    print(table(columns))
    print(
        f"\nShareGPT file: {stats.records:,} complete records, {stats.prompts:,} conversations that open with a human turn; "
        f"dropped: {', '.join(f'{k} {v:,}' for k, v in sorted(stats.dropped.items()))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
