"""The corpus generator: the target's own answers to a prompt set, resumable, into a CorpusStore.

For each prompt the user turns are sent one at a time to the target's inference server, each
answer fed back before the next turn. The answer's reasoning (split off by the server's
reasoning parser) is kept and re-wrapped in the target's thinking tokens through its own
chat template (conversation.py), giving the token ids and loss mask the trainer reads.

`sample_id = stable_id(prompt messages, sampling params, target fingerprint)`: a rerun
skips every id already in the store, so a killed run resumes where its last shard ended.
A sample that still fails after the client's retries is recorded in failures.jsonl and the
run goes on. A server that stops answering stops the run at once (`GenerationAborted`), as does
one that takes requests but finishes none within a request's deadline (the client's
`ServerStalled`; the requests still waiting are abandoned, not recorded as failed) and a long
streak of failures; and a run whose failed share ends above `max_failed_share` (default
5%) fails (`GenerationFailed`), saying how many failed and the commonest errors, instead of
passing for a corpus. Either way every finished sample is stored, and a rerun retries the rest.

    eagle-assets corpus generate --prompts prompts.jsonl --out data/corpus \\
        --server http://localhost:8000 --model smollm2-135m-instruct \\
        --tokenizer .cache/targets/smollm2-135m-instruct --max-tokens 512
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm.auto import tqdm

from eagle_assets.corpus.client import ClientSettings, InferenceClient, InferenceError, RetriesExhausted, ServerStalled
from eagle_assets.corpus.conversation import ChatTemplate, ConversationError, ThinkingFormat
from eagle_assets.corpus.prompt_record import Prompt, ensure_training_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.formats import stable_id


@dataclass(frozen=True)
class SamplingParams:
    """How the target answers; part of every sample id."""

    temperature: float = 0.0
    """0 is greedy: the drafter learns the target's most likely continuation."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    top_k: int | None = None
    """None leaves the server's default (all tokens)."""
    max_tokens: int = 2048
    """Longest answer per turn; longer ones are cut and flagged `truncated`."""
    seed: int | None = None
    """For sampled runs: each request gets a seed derived from (seed, sample_id, turn)."""
    ignore_eos: bool = False
    """Keep generating past end-of-turn (benchmarks only: it makes every answer max_tokens long)."""

    def __post_init__(self) -> None:
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature {self.temperature} < 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p {self.top_p} outside (0, 1]")
        if self.max_tokens < 1:
            problems.append(f"max_tokens {self.max_tokens} < 1")
        if problems:
            raise ValueError("invalid sampling parameters: " + "; ".join(problems))

    def as_dict(self) -> dict:
        return asdict(self)

    def request_params(self, sample_id: str, turn: int) -> dict[str, Any]:
        """Body fields of one chat request."""
        params: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p}
        if self.top_k is not None:
            params["top_k"] = self.top_k
        if self.seed is not None:
            params["seed"] = int(stable_id("sample-seed", self.seed, sample_id, turn)[:8], 16)
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params


def sample_id_for(prompt: Prompt, sampling: SamplingParams, target: str) -> str:
    """The stable id of one sample: (prompt messages, sampling parameters, target fingerprint)."""
    return stable_id(prompt.to_messages(), sampling.as_dict(), target)


@dataclass
class CorpusStats:
    """What a generation run did; `as_metadata()` is what Dagster shows."""

    prompts: int = 0
    """Distinct samples asked for (prompts after dropping duplicate ids)."""
    already_done: int = 0
    """Skipped: in the store from an earlier run."""
    succeeded: int = 0
    failed: int = 0
    truncated: int = 0
    reasoning_captured: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    train_tokens: int = 0
    """Tokens of the stored rows (template included)."""
    elapsed_s: float = 0.0
    aborted: bool = False
    errors: list[str] = field(default_factory=list)
    """The first few failure messages."""

    @property
    def attempted(self) -> int:
        return self.succeeded + self.failed

    @property
    def error_rate(self) -> float:
        return self.failed / self.attempted if self.attempted else 0.0

    @property
    def reasoning_capture_rate(self) -> float:
        return self.reasoning_captured / self.succeeded if self.succeeded else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        return (
            f"{self.succeeded + self.already_done}/{self.prompts} samples done ({self.already_done} from earlier runs), "
            f"{self.failed} failed, {self.truncated} truncated, {self.completion_tokens} output tokens "
            f"at {self.output_tokens_per_s:.1f} tok/s"
        )

    def as_metadata(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "errors"}
        out.update(
            attempted=self.attempted,
            error_rate=round(self.error_rate, 6),
            reasoning_capture_rate=round(self.reasoning_capture_rate, 6),
            output_tokens_per_s=round(self.output_tokens_per_s, 3),
            first_errors=self.errors[:5],
        )
        return out


class GenerationAborted(RuntimeError):
    """The server stopped answering, or too many samples in a row failed after retries."""

    def __init__(self, message: str, stats: CorpusStats):
        super().__init__(message)
        self.stats = stats


class GenerationFailed(RuntimeError):
    """The run ended with more of its samples failed than `max_failed_share` allows."""

    def __init__(self, message: str, stats: CorpusStats):
        super().__init__(message)
        self.stats = stats


DEFAULT_MAX_FAILED_SHARE = 0.05


def commonest_errors(errors: Iterable[tuple[str, str]], n: int = 3) -> str:
    """ "RetriesExhausted x8 (e.g. ...); RequestRejected x1 (e.g. ...)": the `n` commonest kinds of
    (kind, message) errors, most frequent first, each with its first message."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for kind, message in errors:
        counts[kind] += 1
        first.setdefault(kind, message)
    return (
        "; ".join(f"{kind} x{k}" + (f" (e.g. {first[kind][:300]})" if first[kind] != kind else "") for kind, k in counts.most_common(n))
        or "none recorded"
    )


def failed_share_problem(failed: int, attempted: int, max_share: float | None, what: str, errors: Iterable[tuple[str, str]]) -> str | None:
    """None when `failed` of `attempted` is within `max_share` (None: no limit); else a message
    that says how many failed, against which limit, and the commonest (kind, message) errors."""
    if max_share is None or attempted == 0 or failed <= max_share * attempted:
        return None
    return (
        f"{failed} of {attempted} {what} failed ({failed / attempted:.0%}, above the {max_share:.0%} allowed); "
        f"commonest errors: {commonest_errors(errors)}"
    )


async def _answer(client: InferenceClient, template: ChatTemplate, prompt: Prompt, sid: str, sampling: SamplingParams, target: str) -> dict:
    """Run every turn of one prompt and build its corpus row."""
    messages: list[dict] = [{"role": "system", "content": prompt.system}] if prompt.system is not None else []
    finish, truncated, captured = None, False, True
    prompt_tokens = completion_tokens = 0
    latency = 0.0
    for turn, user in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user})
        # History goes back as the training conversation renders it (reasoning re-wrapped or
        # passed through), so the target is conditioned on exactly the text it is trained on.
        out = await client.chat(template.training_messages(messages), sampling.request_params(sid, turn))
        answer = {"role": "assistant", "content": out.content}
        if out.reasoning_content is not None:
            answer["reasoning_content"] = out.reasoning_content
        captured = captured and bool(out.reasoning_content)
        messages.append(answer)
        finish = out.finish_reason
        truncated = truncated or out.finish_reason == "length"
        prompt_tokens += out.prompt_tokens
        completion_tokens += out.completion_tokens
        latency += out.latency_s
    example = template.tokenize(messages)
    return {
        "sample_id": sid,
        "prompt_id": prompt.prompt_id,
        "source": prompt.source,
        "messages": json.dumps(messages, ensure_ascii=False),
        "input_ids": example.input_ids,
        "loss_mask": example.loss_mask,
        "num_tokens": len(example.input_ids),
        "num_turns": len(prompt.turns),
        "finish_reason": finish or "",
        "truncated": truncated,
        "reasoning_captured": captured,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "latency_s": latency,
        "sampling": json.dumps(sampling.as_dict(), sort_keys=True),
        "target": target,
    }


async def generate_corpus_async(
    prompts: Iterable[Prompt],
    client: InferenceClient,
    store: CorpusStore,
    template: ChatTemplate,
    *,
    target: str,
    sampling: SamplingParams = SamplingParams(),
    progress: Callable[[CorpusStats], None] | None = None,
    progress_every: int = 50,
    show_progress_bar: bool = True,
    max_consecutive_failures: int | None = 64,
    max_failed_share: float | None = DEFAULT_MAX_FAILED_SHARE,
) -> CorpusStats:
    """Answer every prompt not yet in `store`; see the module docstring. Flushes before returning
    or raising."""
    prompts = list(prompts)
    ensure_training_prompts(prompts)
    previous = store.meta.get("target")
    if previous is not None and previous != target:
        raise ValueError(
            f"the corpus at {store.url} was generated for target {previous}, this run is for {target}; write this target's corpus to a new folder"
        )
    samplings = store.meta.get("sampling", [])
    if sampling.as_dict() not in samplings:
        samplings = [*samplings, sampling.as_dict()]
    store.update_meta(target=target, sampling=samplings, thinking=asdict(template.thinking), template_handles_reasoning=template.handles_reasoning)

    stats = CorpusStats()
    done = store.done_ids()
    todo: list[tuple[Prompt, str]] = []
    seen: set[str] = set()
    for p in prompts:
        sid = sample_id_for(p, sampling, target)
        if sid in seen:
            continue
        seen.add(sid)
        if sid in done:
            stats.already_done += 1
        else:
            todo.append((p, sid))
    stats.prompts = len(seen)

    start = time.perf_counter()
    streak = 0
    last_error = ""
    gone: list[str] = []  # why the server was found gone, once it was
    stalled: list[str] = []  # why the server was found to take requests and finish none
    failures: list[tuple[str, str]] = []  # every failure's type and message, for the commonest
    bar = tqdm(total=len(todo), desc="corpus", unit="sample", disable=not show_progress_bar, file=sys.stderr)
    pending = iter(todo)

    def report() -> None:
        stats.elapsed_s = time.perf_counter() - start
        if progress:
            progress(stats)

    stop = asyncio.Event()  # set when the run stops early: the requests still waiting are abandoned

    async def worker() -> None:
        nonlocal streak, last_error
        # Workers share one iterator: each (prompt, id) is taken exactly once.
        for prompt, sid in pending:
            if stats.aborted:
                return
            try:
                row = await _answer(client, template, prompt, sid, sampling, target)
            except ServerStalled as exc:  # not this sample's fault: it stays to be done, by a rerun
                stalled.append(str(exc))
                stats.aborted = True
                stop.set()
                return
            except (InferenceError, ConversationError) as exc:
                stats.failed += 1
                last_error = f"{prompt.origin or prompt.prompt_id}: {exc}"
                if len(stats.errors) < 20:
                    stats.errors.append(last_error)
                failures.append((type(exc).__name__, str(exc)))
                store.record_failure(
                    {
                        "sample_id": sid,
                        "prompt_id": prompt.prompt_id,
                        "origin": prompt.origin,
                        "error_type": type(exc).__name__,
                        "error": str(exc),
                        "time": time.time(),
                    }
                )
                streak = streak + 1 if isinstance(exc, RetriesExhausted) else streak
                if max_consecutive_failures is not None and streak >= max_consecutive_failures:
                    stats.aborted = True
                if isinstance(exc, RetriesExhausted) and not stats.aborted:
                    # Retries spent: is the server still there? A dead one fails every sample left.
                    try:
                        await client.check_server()
                    except InferenceError as unreachable:
                        gone.append(str(unreachable))
                        stats.aborted = True
                if stats.aborted:
                    stop.set()
            else:
                streak = 0
                store.append(row)
                stats.succeeded += 1
                stats.truncated += row["truncated"]
                stats.reasoning_captured += row["reasoning_captured"]
                stats.prompt_tokens += row["prompt_tokens"]
                stats.completion_tokens += row["completion_tokens"]
                stats.train_tokens += row["num_tokens"]
            bar.update(1)
            bar.set_postfix(failed=stats.failed, refresh=False)
            if stats.attempted % progress_every == 0:
                report()

    workers = [asyncio.create_task(worker()) for _ in range(client.settings.concurrency)]
    everything = asyncio.gather(*workers)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([everything, stopped], return_when=asyncio.FIRST_COMPLETED)
        if everything.done():
            everything.result()  # a worker's own error (a full disk, say) is the run's
    finally:
        # Stopped early, or failed: the other workers' requests are abandoned at once, not waited for.
        for task in (*workers, stopped):
            task.cancel()
        await asyncio.gather(everything, stopped, return_exceptions=True)
        bar.close()
        store.flush()
        report()
    stored = f"{stats.succeeded + stats.already_done} samples are stored"
    if stats.aborted:
        why = (
            stalled[0]
            if stalled
            else f"the server stopped answering after a sample failed ({last_error}): {gone[0]}"
            if gone
            else f"{max_consecutive_failures} samples in a row failed after retries against {client.settings.base_url} (last: {last_error})"
        )
        raise GenerationAborted(f"stopped: {why}. {stored}; restart the server and rerun to resume.", stats)
    problem = failed_share_problem(stats.failed, stats.attempted, max_failed_share, "samples", failures)
    if problem:
        raise GenerationFailed(
            f"{problem}. {stored} and the failed ones are listed in {store.url}/failures.jsonl; fix the cause "
            "and rerun to retry them (max_failed_share sets the share allowed).",
            stats,
        )
    return stats


def generate_corpus(
    prompts: Iterable[Prompt],
    store: CorpusStore,
    server: ClientSettings,
    tokenizer: Any,
    *,
    target: str,
    sampling: SamplingParams = SamplingParams(),
    thinking: ThinkingFormat | None = None,
    progress: Callable[[CorpusStats], None] | None = None,
    progress_every: int = 50,
    show_progress_bar: bool = True,
    max_consecutive_failures: int | None = 64,
    max_failed_share: float | None = DEFAULT_MAX_FAILED_SHARE,
    log: Callable[[str], None] | None = None,
) -> CorpusStats:
    """Synchronous entry point: checks the server answers with the model, then generates;
    `log` hears when requests wait with none finished (the client's `quiet_s`).

    Raises `ServerUnreachable` (naming the URL) before touching the store when the server is
    down; `GenerationAborted` (after storing every finished sample) when it goes away;
    `GenerationFailed` when more than `max_failed_share` of the samples failed.
    """
    template = ChatTemplate(tokenizer, thinking)

    async def run() -> CorpusStats:
        async with InferenceClient(server, log=log) as client:
            await client.check_server()
            return await generate_corpus_async(
                prompts,
                client,
                store,
                template,
                target=target,
                sampling=sampling,
                progress=progress,
                progress_every=progress_every,
                show_progress_bar=show_progress_bar,
                max_consecutive_failures=max_consecutive_failures,
                max_failed_share=max_failed_share,
            )

    return asyncio.run(run())
