"""docs/kimi-k2.5.md's dress rehearsal: the page's commands, run as it writes them, on the stand-in.

The session fixture `kimi_rehearsal` (conftest.py, benchmarks/kimi_rehearsal.py) reads the
page's marked blocks and runs its four phases in one bash session on `tiny-kimi-k2.5` with the
"standin-tiny" preset: the servers started the way the page says (`eagle-assets serve ...
--detach`, and the extraction server the hidden-state part launches), a watcher failing the
rehearsal if two servers of the target ever run at once. The full form, at "standin-default",
is `python benchmarks/kimi_rehearsal.py` (benchmarks/results/kimi_rehearsal_*).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import load_tokenizer
from eagle_assets.paths import PROJECT_ROOT
from eagle_assets.targets.standins import KIMI_STANDIN
from eagle_assets_tests.scripts import load_script

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REHEARSAL = load_script(PROJECT_ROOT / "benchmarks" / "kimi_rehearsal.py")


def _kind(load: dict) -> str:
    spec = load["speculative"] or {}
    return "extraction" if spec.get("method") == "extract_hidden_states" else spec.get("method", "alone")


def test_the_page_runs_as_written_with_one_target_server_at_a_time(kimi_rehearsal):
    assert list(kimi_rehearsal.phases) == list(REHEARSAL.PHASES)
    assert kimi_rehearsal.most_at_once == 1
    # The production server for the corpus, then the three loads the plan counts.
    assert [_kind(load) for load in kimi_rehearsal.loads] == ["alone", "extraction", "alone", "eagle3"]
    # The first benchmark run measured the baseline and said what was left; the second finished.
    assert "benchmark measured in part: not measured yet: eagle3" in kimi_rehearsal.output
    print("phases (s): " + ", ".join(f"{p} {s:.0f}" for p, s in kimi_rehearsal.phases.items()))


def test_the_report_shows_served_acceptance_equal_to_offline_and_greedy_output_unchanged(kimi_rehearsal):
    report = kimi_rehearsal.report(KIMI_STANDIN)
    assert [run["label"] for run in report["runs"]] == ["baseline", "eagle3"]
    assert report["served"]["al"] == pytest.approx(report["offline"]["al"], abs=1e-9), report["parity"]["sentence"]
    assert report["served"]["per_position_acceptance"] == pytest.approx(report["offline"]["per_position_acceptance"], abs=1e-9)
    assert report["greedy_check"]["verdict"] == "equal", report["greedy_check"]["sentence"]
    assert any(n.startswith("the extraction server's greedy answers equal the plain server's on 2 of 2") for n in report["notes"]), report["notes"]


def test_every_think_token_in_the_corpus_is_the_special_id_and_reasoning_round_trips(kimi_rehearsal, standin_paths):
    """The corpus written from the production server's answers (kimi_k2 reasoning parser): every
    `<think>`/`</think>` in a sample's text is the one special token, each sample's last turn
    carries its reasoning as the target wrote it, and the stored ids are what the chat template
    makes of the stored conversation."""
    tokenizer = load_tokenizer(standin_paths[KIMI_STANDIN], trust_remote_code=True)
    think, end = tokenizer.convert_tokens_to_ids("<think>"), tokenizer.convert_tokens_to_ids("</think>")
    template = ChatTemplate(tokenizer)
    rows = list(
        CorpusStore(str(kimi_rehearsal.data / KIMI_STANDIN / "corpus"), mode="r").iter_rows(["sample_id", "messages", "input_ids", "loss_mask"])
    )
    assert len(rows) >= 8
    for row in rows:
        ids, messages = list(row["input_ids"]), json.loads(row["messages"])
        text = tokenizer.decode(ids)
        assert text.count("<think>") == ids.count(think) and text.count("</think>") == ids.count(end), row["sample_id"]
        assert messages[-1]["reasoning_content"] and "<think>" not in messages[-1]["reasoning_content"]
        turns = sum(m["role"] == "assistant" for m in messages)
        # The template opens one thinking block per assistant turn (the target never writes `<think>` itself);
        # each turn closes it, and the stand-in at times writes a second `</think>` into its answer.
        assert ids.count(think) == turns and ids.count(end) >= turns
        trained = tokenizer.decode([t for t, m in zip(ids, row["loss_mask"]) if m])
        assert trained == f"{messages[-1]['reasoning_content']}</think>{messages[-1]['content']}<|im_end|>"
        assert template.find_mismatch(row) is None


def test_the_guard_fails_a_rehearsal_that_runs_two_target_servers(tmp_path):
    """The watcher sees two processes that look like servers of the target, at once."""
    model = tmp_path / "model"
    model.mkdir()
    fake = [sys.executable, "-c", "import time; time.sleep(30)", REHEARSAL.API_SERVER_MODULE, "--model", str(model)]
    seen = []
    procs = []
    try:
        with REHEARSAL.ServerWatch(model, on_violation=seen.append, interval_s=0.1) as watch:
            procs.append(subprocess.Popen(fake))
            time.sleep(0.6)
            assert watch.most_at_once == 1 and not seen
            procs.append(subprocess.Popen(fake))
            time.sleep(0.6)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert watch.most_at_once == 2 and len(watch.loads) == 2 and seen and "2 servers of" in seen[0]


def test_the_page_marks_every_block_the_rehearsal_runs():
    blocks = REHEARSAL.page_blocks()
    assert set(blocks) == {"variables", "parent", *REHEARSAL.PHASES}
    assert all(line in blocks["variables"] for line in ("T=", "NAME=", "PRESET=", "GPUS=", "K=", "PORT=", "export EAGLE_ASSETS_DATA="))
    script = REHEARSAL.script(blocks, REHEARSAL.overrides(Path("/stand-in"), KIMI_STANDIN, "standin-tiny", 8123, Path("/tmp/d")))
    for phase in REHEARSAL.PHASES:  # run as written: each block's lines, in the page's order
        assert blocks[phase] in script
    assert script.index(blocks["phase 1"]) < script.index(blocks["phase 2"]) < script.index(blocks["phase 3"]) < script.index(blocks["phase 4"])
