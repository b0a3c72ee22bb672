"""A server that takes connections and stalls: every client ends within a stated bound, naming the
server, with what was finished kept.

Each row runs a real command in its own process against `stall_stub.StallingServer`, a real
HTTP server that answers its first requests and then takes each further one and writes nothing.
Deadlines are set short by the commands' own options, so a row takes seconds. The bound is
measured from the first stalled request to the process's exit: one request deadline, plus the
slack a shared 2-core machine needs to notice it and exit. What each row must keep is checked on
disk, and the corpus row is resumed against a healthy server, asking only for what was missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from eagle_assets.corpus.store import CorpusStore
from eagle_assets_tests.stall_stub import StallingServer

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 2.0
SLACK_S = 6.0
"""Beyond the deadline: the client's own polling, the process's exit, a busy machine."""
STACK_FRAME = re.compile(r'Traceback|File "[^"]+", line \d+')
PROMPTS = [f"Question {i}: what is {i} + {i}?" for i in range(6)]


@dataclass(frozen=True)
class Stall:
    id: str
    answered: int | Callable[[Path], int]
    """Requests the stalling server answers before it stalls (or a function of the row's folder, once prepared)."""
    command: Callable[[Path, dict], tuple[list[str], dict[str, str]]]
    """(argv after the interpreter, environment) from the row's folder and {"url", "healthy", "target"}."""
    names: tuple[str, ...]
    """What the failure message names; `{url}` is the stalling server."""
    kept: Callable[[Path], None]
    """Checks what the row's folder must hold after the failure."""
    prepare: Callable[[Path, Path], None] = lambda folder, target: None
    """Writes the row's inputs into its folder (given the target's folder)."""
    code: int = 1


def write_prompts(folder: Path, target: Path) -> None:
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))


def corpus_generator(folder: Path, urls: dict) -> tuple[list[str], dict[str, str]]:
    prompts = folder / "prompts.jsonl"
    argv = [
        "-m",
        "eagle_assets.cli",
        "corpus",
        "generate",
        "--prompts",
        str(prompts),
        "--out",
        str(folder / "corpus"),
        "--server",
        urls["url"],
        "--model",
        "m",
        "--tokenizer",
        str(urls["target"]),
        "--max-tokens",
        "8",
        "--concurrency",
        "2",
        "--shard-size",
        "1",
        "--timeout",
        str(DEADLINE_S),
    ]
    return argv, {}


def corpus_kept(folder: Path) -> None:
    store = CorpusStore(str(folder / "corpus"), mode="r")
    assert store.num_rows == 3, store.num_rows  # the three answers before the stall, each in its own shard
    assert not store.failures(), store.failures()  # the abandoned ones are not failures: a rerun asks again


def write_drafter(folder: Path, target: Path) -> None:
    from eagle_assets_tests.drafters import write_random_drafter

    write_random_drafter(folder / "drafter", json.loads((target / "config.json").read_text()))


def bench(folder: Path, urls: dict) -> tuple[list[str], dict[str, str]]:
    drafter = folder / "drafter"
    argv = [
        "-m",
        "eagle_assets.cli",
        "bench",
        "--drafter",
        str(drafter),
        "--target",
        str(urls["target"]),
        "--out",
        str(folder / "report"),
        "--num-prompts",
        "2",
        "--concurrency",
        "1",
        "--concurrency",
        "2",
        "--output-len",
        "4",
        "--offline-reference",
        "hf",
        "--stall-timeout",
        str(DEADLINE_S),
    ]
    return argv, {"EAGLE_ASSETS_SERVER_URL": urls["healthy"], "EAGLE_ASSETS_SPECULATIVE_URL": urls["url"]}


def bench_kept(folder: Path) -> None:
    measurements = folder / "report" / "measurements"
    kept = sorted(p.name for p in measurements.iterdir())
    assert "offline.json" in kept and any(name.startswith("sweep--baseline") for name in kept), kept
    # The drafter's server stalled at concurrency 2: its level at 1, measured before, is kept.
    eagle3 = [name for name in kept if name.startswith("sweep--eagle3-")]
    assert [re.sub(r"-[0-9a-f]+--", "--", name) for name in eagle3] == ["sweep--eagle3--c1.json"], kept
    level = json.loads((measurements / eagle3[0]).read_text())["level"]
    assert (level["concurrency"], level["output_tokens"]) == (1, 2 * 4), level


def write_corpus(folder: Path, target: Path) -> None:
    from eagle_assets.formats import shard_of

    store = CorpusStore(str(folder / "corpus"), shard_size=100)
    ids = [f"sample-{i}" for i in range(8)]
    for i, sid in enumerate(ids):
        tokens = list(range(10 + i, 20 + 2 * i))
        store.append(
            {
                "sample_id": sid,
                "prompt_id": sid,
                "source": "file",
                "messages": "[]",
                "input_ids": tokens,
                "loss_mask": [1] * len(tokens),
                "num_tokens": len(tokens),
                "num_turns": 1,
                "finish_reason": "stop",
                "truncated": False,
                "reasoning_captured": False,
                "prompt_tokens": 0,
                "completion_tokens": len(tokens),
                "latency_s": 0.0,
                "sampling": "{}",
                "target": "stall-test",
            }
        )
    store.close()
    (folder / "first_shard_samples").write_text(str(sum(shard_of(sid, 2) == 0 for sid in ids)))


def first_shard_samples(folder: Path) -> int:
    return int((folder / "first_shard_samples").read_text())


def extraction(folder: Path, urls: dict) -> tuple[list[str], dict[str, str]]:
    return ["-m", "eagle_assets_tests.stall_child", str(folder / "corpus"), str(folder / "shards"), urls["url"], str(DEADLINE_S)], {}


def extraction_kept(folder: Path) -> None:
    from eagle_assets.hidden_states.reader import read_manifest

    shards = folder / "shards"
    assert sorted(p.name for p in shards.iterdir()) == ["shard-00000"], sorted(p.name for p in shards.iterdir())  # no half shard
    assert len(read_manifest(shards / "shard-00000").sample_ids) == first_shard_samples(folder)


ROWS = [
    Stall(
        "corpus_generator",
        3,
        corpus_generator,
        ("corpus generation failed", "the server at {url} finished no request in 2 s"),
        corpus_kept,
        write_prompts,
    ),
    Stall("bench", 4, bench, ("the benchmark stopped while serving 'eagle3", "{url}", "streamed nothing for 2 s"), bench_kept, write_drafter),
    Stall(
        "extraction",
        first_shard_samples,
        extraction,
        ("the extraction server at {url} did not answer a request of", "deadline of 2 s"),
        extraction_kept,
        write_corpus,
    ),
]


def run_row(row: Stall, folder: Path, target: Path) -> dict:
    """The row's command against a fresh stalling server (and a healthy one): exit code, output, bound."""
    folder.mkdir(parents=True)
    spool = folder / "spool"
    spool.mkdir()
    row.prepare(folder, target)
    answered = row.answered(folder) if callable(row.answered) else row.answered
    healthy, stalling = StallingServer(answer=None), StallingServer(answer=answered, spool=spool)
    argv, env_extra = row.command(folder, {"url": stalling.url, "healthy": healthy.url, "target": target})
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_ASSETS_") or k in ("EAGLE_ASSETS_CACHE", "EAGLE_ASSETS_VLLM_VENV")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="300", EAGLE_ASSETS_RUNS=str(folder / "runs"), **env_extra)
    try:
        proc = subprocess.run([sys.executable, *argv], env=env, cwd=folder, capture_output=True, text=True, timeout=300)
        ended = time.monotonic()
    finally:
        stalling.close()
        healthy.close()
    return {
        "code": proc.returncode,
        "text": proc.stdout + proc.stderr,
        "url": stalling.url,
        "after_stall": None if stalling.stalled_at is None else ended - stalling.stalled_at,
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory, smollm2_path) -> dict[str, dict]:
    """Every row run once, two at a time (most of a row is an interpreter starting up)."""
    root = tmp_path_factory.mktemp("stalls")
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = pool.map(lambda row: run_row(row, root / row.id, smollm2_path), ROWS)
        return {"root": root, **dict(zip([r.id for r in ROWS], done))}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_stalled_server_ends_the_command_within_a_deadline_naming_it(row, results):
    result = results[row.id]
    text = re.sub(r"\s+", " ", result["text"])
    assert result["code"] == row.code, text[-3000:]
    assert not STACK_FRAME.search(text), text[-3000:]
    for name in row.names:
        assert name.format(url=result["url"]) in text, (name, text[-3000:])
    assert result["after_stall"] is not None and result["after_stall"] < DEADLINE_S + SLACK_S, result["after_stall"]
    row.kept(results["root"] / row.id)


def test_a_rerun_after_a_stall_asks_only_for_what_was_not_kept(results, smollm2_path):
    folder = results["root"] / "corpus_generator"
    healthy = StallingServer(answer=None)
    try:
        argv, _ = corpus_generator(folder, {"url": healthy.url, "target": smollm2_path})
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, *argv], env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    finally:
        healthy.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert healthy.posts == 3  # the three abandoned samples, nothing kept asked again
    assert CorpusStore(str(folder / "corpus"), mode="r").num_rows == len(PROMPTS)


def test_a_dagster_run_against_a_stalled_server_says_so_then_fails_naming_it(tmp_path, smollm2_path, monkeypatch):
    # `prompts` and `synthetic_corpus` in a real Dagster run (in process), against a server of the
    # user's that answers three chats and then stalls: the run's log says nothing is finishing,
    # the corpus step fails within one request deadline naming the server, the three answers stay.
    import dagster as dg

    from eagle_assets.defs.corpus import prompts, synthetic_corpus
    from eagle_assets.resources.inference_server import InferenceServerResource
    from eagle_assets.resources.storage import StorageResource

    data = tmp_path / "data"
    data.mkdir()
    write_prompts(data, smollm2_path)
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(data))
    stalling = StallingServer(answer=3)
    config = {
        "ops": {
            "prompts": {"config": {"source": "file", "file_url": str(data / "prompts.jsonl")}},
            "synthetic_corpus": {"config": {"request_timeout_s": DEADLINE_S, "concurrency": 2, "shard_size": 1, "max_tokens": 8}},
        }
    }
    resources = {"inference_server": InferenceServerResource(url=stalling.url), "storage": StorageResource(root=str(data))}
    try:
        with dg.instance_for_test() as instance:
            result = dg.materialize([prompts, synthetic_corpus], resources=resources, run_config=config, instance=instance, raise_on_error=False)
            ended = time.monotonic()
            logs = [e.user_message for e in instance.all_logs(result.run_id)]
    finally:
        stalling.close()
    assert not result.success
    assert any(f"no request to {stalling.url} has finished in" in m for m in logs), logs[-20:]
    failure = next(e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure)
    assert f"the server at {stalling.url} finished no request in 2 s" in failure and "3 samples are stored" in failure, failure
    assert ended - stalling.stalled_at < DEADLINE_S + SLACK_S
    assert CorpusStore(str(next(data.rglob("manifest.json")).parent), mode="r").num_rows == 3


def test_magpie_against_a_stalled_server_stops_within_a_deadline_naming_it(smollm2_path):
    # The `prompts` asset's default source: the target writes the prompts. Two candidates are
    # answered, then every request stalls: the synthesis stops within one deadline, naming the server.
    from eagle_assets.corpus.client import ClientSettings, ServerStalled
    from eagle_assets.corpus.prompts import MagpieSettings, synthesize_prompts
    from eagle_assets.corpus.target import load_tokenizer

    stalling = StallingServer(answer=2)
    said: list[str] = []
    try:
        with pytest.raises(ServerStalled) as stalled:
            synthesize_prompts(
                ClientSettings(stalling.url, "m", concurrency=4, timeout_s=DEADLINE_S),
                load_tokenizer(smollm2_path),
                MagpieSettings(num_prompts=8),
                log=said.append,
            )
        ended = time.monotonic()
    finally:
        stalling.close()
    assert f"the server at {stalling.url} finished no request in 2 s" in str(stalled.value)
    assert ended - stalling.stalled_at < DEADLINE_S + SLACK_S
    assert any(f"no request to {stalling.url} has finished" in line for line in said), said
