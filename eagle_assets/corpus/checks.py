"""Checks on a stored corpus, as pure functions returning `(passed, metadata)`.

The Dagster asset checks of `synthetic_corpus` call these; so can a script or a test:

    from eagle_assets.corpus import checks
    passed, meta = checks.check_error_rate(store, max_error_rate=0.02)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from eagle_assets.corpus.conversation import ChatTemplate, ThinkingFormat
from eagle_assets.corpus.store import CorpusStore

CheckResult = tuple[bool, dict[str, Any]]


def check_error_rate(store: CorpusStore, max_error_rate: float = 0.02) -> CheckResult:
    """Samples still failing (failures.jsonl) over all samples tried must stay under the bound."""
    failures = store.failures()
    total = store.num_rows + len(failures)
    rate = len(failures) / total if total else 0.0
    kinds = Counter(f.get("error_type", "?") for f in failures)
    passed = rate <= max_error_rate and total > 0
    commonest = "; ".join(f"{kind} x{n}" for kind, n in kinds.most_common(3))
    return (
        passed,
        {
            "summary": (
                f"{len(failures)} of {total} samples failed ({rate:.1%}, {'within' if passed else 'above'} the "
                f"{max_error_rate:.1%} allowed)" + (f": {commonest}" if commonest else "")
            ),
            "error_rate": round(rate, 6),
            "max_error_rate": max_error_rate,
            "stored": store.num_rows,
            "failed": len(failures),
            "error_types": dict(kinds),
            "first_errors": [f"{f.get('origin') or f['sample_id']}: {f['error'][:300]}" for f in failures[:3]],
        },
    )


def check_reasoning_capture(store: CorpusStore, target_reasons: bool) -> CheckResult:
    """For a reasoning target, every assistant turn of every row must carry the parser's reasoning."""
    flags = store.read_table(["sample_id", "reasoning_captured"]).to_pydict()
    captured = sum(flags["reasoning_captured"])
    rate = captured / len(flags["sample_id"]) if flags["sample_id"] else 0.0
    missing = [sid for sid, ok in zip(flags["sample_id"], flags["reasoning_captured"]) if not ok]
    meta = {
        "target_reasons": target_reasons,
        "reasoning_capture_rate": round(rate, 6),
        "rows_without_reasoning": len(missing),
        "examples": missing[:5],
    }
    if not target_reasons:
        meta["note"] = "the target has no reasoning parser: nothing to capture"
        return True, meta
    if missing:
        meta["hint"] = "start the server with the target's --reasoning-parser; if it is set, check that the prompts do not switch thinking off"
    return not missing and bool(flags["sample_id"]), meta


def check_no_duplicate_ids(store: CorpusStore) -> CheckResult:
    """No sample id appears twice across shards, and the manifest agrees with the shards."""
    ids = store.read_table(["sample_id"]).column("sample_id").to_pylist()
    dupes = [sid for sid, n in Counter(ids).items() if n > 1]
    listed = sum(len(s["sample_ids"]) for s in store.manifest["shards"])
    return not dupes and listed == len(ids), {
        "rows": len(ids),
        "manifest_ids": listed,
        "duplicate_ids": len(dupes),
        "examples": dupes[:5],
    }


def check_token_round_trip(store: CorpusStore, tokenizer: Any, thinking: ThinkingFormat | None = None, max_rows: int | None = None) -> CheckResult:
    """Every row's input_ids and loss_mask equal what the chat template makes of its messages."""
    template = ChatTemplate(tokenizer, thinking)
    checked, problems = 0, []
    for row in store.iter_rows(["sample_id", "messages", "input_ids", "loss_mask"]):
        if max_rows is not None and checked >= max_rows:
            break
        checked += 1
        problem = template.find_mismatch(row)
        if problem:
            problems.append(problem)
    return not problems and checked > 0, {
        "rows_checked": checked,
        "mismatches": len(problems),
        "first_mismatches": problems[:3],
    }
