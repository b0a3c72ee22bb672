"""`eagle-assets corpus`: the corpus stage's parts by hand, against a server of the target.

    eagle-assets corpus read [URL] [--format auto] [--skip-bad]
    eagle-assets corpus magpie --server URL --model NAME --tokenizer DIR --out FILE [--num-prompts 64]
    eagle-assets corpus generate --prompts FILE --out DIR --server URL --model NAME --tokenizer DIR [--max-tokens 2048]

Every argument is checked before anything slow: a bad one exits 2 naming it (the command line's
usage error), a failure exits 1 with one line saying why, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

corpus_app = typer.Typer(
    no_args_is_help=True, help="Prompts and corpora by hand: read a prompt file, let the target write prompts, generate a corpus."
)


def _number(kind: type, low: float, what: str, inclusive: bool = True, high: float | None = None) -> Callable[[str], Any]:
    """An option's parser: a `kind` at least `low` (above it when not `inclusive`), at most `high`;
    anything else is a usage error naming the value."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not {what}") from None
        if math.isnan(value) or (value < low if inclusive else value <= low) or (high is not None and value > high):
            raise typer.BadParameter(f"{text!r} is not {what}")
        return value

    return parse


_COUNT = _number(int, 1, "a whole number of at least 1")
_SECONDS = _number(float, 0, "a positive number of seconds", inclusive=False, high=math.inf)


def _echo_err(line: str) -> None:
    typer.echo(line, err=True)


@corpus_app.command("read")
def read(
    url: Optional[str] = typer.Argument(None, help="A prompt file: path, fsspec URL or pkg://PACKAGE/PATH; default: the packaged ShareGPT."),
    fmt: str = typer.Option("auto", "--format", help="auto (detected), sharegpt, openai, alpaca, eagle or text."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Drop and count rows that are not prompts (default: the first fails)."),
) -> None:
    """Read a prompt file in any format and print what it holds and drops, as JSON."""
    from eagle_assets.corpus.prompt_formats import FORMATS, SHAREGPT_URL, PromptFileError, read_summary

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: give one of {', '.join(FORMATS)}", param_hint="'--format'")
    url = url or SHAREGPT_URL
    try:
        summary = read_summary(url, fmt, skip_bad=skip_bad or url == SHAREGPT_URL)
    except PromptFileError as exc:
        _echo_err(str(exc))
        raise typer.Exit(1) from None
    typer.echo(json.dumps(summary, indent=1))


@corpus_app.command("magpie")
def magpie(
    server: str = typer.Option(..., help="The target's OpenAI-compatible server, e.g. http://localhost:8000."),
    model: str = typer.Option(..., help="The server's --served-model-name."),
    tokenizer: str = typer.Option(..., help="The target's HF folder (tokenizer + chat template)."),
    out: str = typer.Option(..., help="The prompt file to write (JSONL; any fsspec URL)."),
    num_prompts: int = typer.Option(64, parser=_COUNT, help="Prompts to keep, after dropping duplicates, empty and over-long ones."),
    seed: int = typer.Option(0, help="Base seed of the requests: a rerun asks the same."),
    multi_turn_fraction: float = typer.Option(
        0.0, parser=_number(float, 0, "a share between 0 and 1", high=1.0), help="Share of prompts with a follow-up user turn."
    ),
    concurrency: int = typer.Option(16, parser=_COUNT, help="Requests in flight at once."),
) -> None:
    """Let the target write prompts (Magpie): it samples the user turn from its chat template cut after the user header."""
    from eagle_assets.corpus.client import ClientSettings, InferenceError
    from eagle_assets.corpus.prompts import MagpieSettings, synthesize_prompts, write_prompts
    from eagle_assets.corpus.target import check_tokenizer_folder, load_tokenizer

    try:
        settings = ClientSettings(server, model, concurrency=concurrency)
        check_tokenizer_folder(tokenizer, "--tokenizer")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        prompts, stats = synthesize_prompts(
            settings,
            load_tokenizer(tokenizer),
            MagpieSettings(num_prompts=num_prompts, seed=seed, multi_turn_fraction=multi_turn_fraction),
            progress=_echo_err,
            log=_echo_err,
        )
        write_prompts(prompts, out)
    except (InferenceError, ValueError, OSError) as exc:
        _echo_err(f"magpie failed: {exc}")
        raise typer.Exit(1) from None
    typer.echo(json.dumps(stats.as_dict(), indent=1))


@corpus_app.command("generate")
def generate(
    prompts: str = typer.Option(..., help="A prompt file (JSONL, Parquet or any format `corpus read` reads; any fsspec URL)."),
    out: str = typer.Option(..., help="The corpus folder (any fsspec URL); resumed if present."),
    server: str = typer.Option(..., help="The target's OpenAI-compatible server, e.g. http://localhost:8000."),
    model: str = typer.Option(..., help="The server's --served-model-name."),
    tokenizer: str = typer.Option(..., help="The target's HF folder (tokenizer + chat template)."),
    max_tokens: int = typer.Option(2048, parser=_COUNT, help="Longest answer per turn; longer ones are cut and flagged truncated."),
    temperature: float = typer.Option(0.0, parser=_number(float, 0, "a temperature of at least 0", high=math.inf), help="0 is greedy."),
    seed: Optional[int] = typer.Option(None, help="For sampled runs: each request's seed derives from it."),
    concurrency: int = typer.Option(16, parser=_COUNT, help="Requests in flight at once."),
    shard_size: int = typer.Option(256, parser=_COUNT, help="Samples per Parquet shard."),
    retries: int = typer.Option(4, parser=_number(int, 0, "a whole number of at least 0"), help="Retries of a retryable failure."),
    backoff: float = typer.Option(1.0, parser=_SECONDS, help="First retry delay in seconds; doubles per retry."),
    timeout: float = typer.Option(
        600.0, parser=_SECONDS, help="The most seconds one request may take; shorter answers get a deadline fitted to --max-tokens."
    ),
    limit: Optional[int] = typer.Option(None, parser=_COUNT, help="Use only the first N prompts."),
    max_failed_share: Optional[float] = typer.Option(
        None,
        parser=_number(float, 0, "a share between 0 and 1", high=1.0),
        help="Fail (exit 1) when more than this share of the samples tried fail (default: 5%).",
    ),
) -> None:
    """Generate a corpus: the target's own answers to a prompt file, from its server, resumable
    (a rerun asks only for the samples not yet stored)."""
    from eagle_assets.corpus.client import ClientSettings, InferenceError
    from eagle_assets.corpus.generate import DEFAULT_MAX_FAILED_SHARE, GenerationAborted, GenerationFailed, SamplingParams, generate_corpus
    from eagle_assets.corpus.prompts import load_prompt_file
    from eagle_assets.corpus.store import CorpusStore, CorpusStoreError
    from eagle_assets.corpus.target import check_tokenizer_folder, load_tokenizer, target_fingerprint

    try:
        client = ClientSettings(server, model, concurrency=concurrency, max_retries=retries, backoff_s=backoff, timeout_s=timeout)
        sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        check_tokenizer_folder(tokenizer, "--tokenizer")
        _check_out(out)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    def fail(exc: BaseException) -> None:
        _echo_err(f"corpus generation failed: {exc}")
        raise typer.Exit(1) from None

    try:
        target = target_fingerprint(tokenizer)
        prompt_set = load_prompt_file(prompts, limit=limit)
        loaded = load_tokenizer(tokenizer)
        with CorpusStore(out, shard_size=shard_size) as store:
            stats = generate_corpus(
                prompt_set,
                store,
                client,
                loaded,
                target=target,
                sampling=sampling,
                progress=lambda s: _echo_err(s.summary()),
                max_failed_share=DEFAULT_MAX_FAILED_SHARE if max_failed_share is None else max_failed_share,
                log=_echo_err,
            )
    except (GenerationAborted, GenerationFailed) as exc:
        typer.echo(json.dumps(exc.stats.as_metadata(), indent=1))
        fail(exc)
    except KeyboardInterrupt:
        _echo_err(f"interrupted: the finished samples are stored in {out}; rerun the same command to resume")
        raise typer.Exit(130) from None
    # The server down before anything was asked, a prompt file or a corpus folder that cannot be
    # read or written (a full disk among them): each message names what and where.
    except (InferenceError, ValueError, OSError, CorpusStoreError) as exc:
        fail(exc)
    typer.echo(json.dumps(stats.as_metadata(), indent=1))


def _check_out(out: str) -> None:
    """Refuse a local --out that cannot become a folder: a file, or a path under one (a device)."""
    if "://" in out or "::" in out:
        return  # a URL: its filesystem says, when the store opens it
    path = Path(out).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder: give the corpus folder (made if missing, resumed if present)")
    parent = next(p for p in path.parents if p.exists())
    if not parent.is_dir():
        raise ValueError(f"--out {out} lies under {parent}, which is not a folder: give a corpus folder on a disk")
