"""The benchmark's prompt sets: MT-Bench by default, or a user's own prompts in any format,
the same for the served sweep and the offline reference, named in the report."""

from __future__ import annotations

import json

import pytest

from eagle_assets.bench.breakdown import WITHIN_ANSWER, offline_slices
from eagle_assets.bench.reference_decoder import Result
from eagle_assets.bench.report import build_report, load_report, summary_text, to_markdown, write_report
from eagle_assets.bench.served import context_fit, mt_bench_categories, mt_bench_prompts, mt_bench_set, user_prompt_set
from eagle_assets.bench.settings import BenchmarkSettings
from eagle_assets.corpus.prompt_record import MT_BENCH_PATH, PromptFileError
from eagle_assets_tests.bench.test_report import OFFLINE, RUNS

TRAFFIC = [
    {
        "conversations": [
            {"from": "system", "value": "You are terse."},
            {"from": "human", "value": "Reverse a list in Python?"},
            {"from": "gpt", "value": "xs[::-1]"},
            {"from": "human", "value": "And in place?"},
        ]
    },
    {"conversations": [{"from": "human", "value": "Plan a day in Lisbon."}]},
    {"conversations": [{"from": "human", "value": "Reverse a list in Python?"}]},  # same first turn, no system: another prompt
    {
        "conversations": [
            {"from": "human", "value": "Plan a day in Lisbon."},
            {"from": "gpt", "value": "..."},
            {"from": "human", "value": "And a second day?"},
        ]
    },  # the same first turn as row 2: sent once
]


def test_a_users_file_gives_the_first_user_turn_of_each_distinct_prompt_in_file_order(tmp_path):
    path = tmp_path / "traffic.json"
    path.write_text(json.dumps(TRAFFIC))
    chosen = user_prompt_set(str(path), 3)
    assert list(chosen.messages) == [
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Reverse a list in Python?"}],
        [{"role": "user", "content": "Plan a day in Lisbon."}],
        [{"role": "user", "content": "Reverse a list in Python?"}],
    ]
    assert chosen.categories is None and chosen.name == f"{path}: the first user turn of its first 3 prompts"
    assert list(user_prompt_set(str(path), 2).messages) == list(chosen.messages[:2])
    with pytest.raises(ValueError, match=rf"num_prompts=4: {path} has 3 distinct prompts; give at most 3"):
        user_prompt_set(str(path), 4)
    # Evaluation: MT-Bench itself is a fine benchmark file, in any format.
    mt = user_prompt_set(str(MT_BENCH_PATH), 80)
    assert [m[0]["content"] for m in mt.messages] == [m[0]["content"] for m in mt_bench_prompts()]
    # A bad row fails naming its line.
    path.write_text(json.dumps([TRAFFIC[1], {"conversations": [{"from": "human", "value": ""}]}]))
    with pytest.raises(PromptFileError, match=r"traffic\.json row 2 \(line 1\): turn 0 \(the first human turn\) is empty"):
        user_prompt_set(str(path), 1)


def test_prompts_that_do_not_fit_the_context_are_left_out_and_said_so(tmp_path, smollm2_path):
    long = "word " * 3000
    (tmp_path / "t.txt").write_text(f"short one\n{long}\nshort two\n")
    fits = context_fit(smollm2_path, 2048, 64 + 3)
    chosen = user_prompt_set(str(tmp_path / "t.txt"), 2, fits=fits)
    assert [m[0]["content"] for m in chosen.messages] == ["short one", "short two"]
    assert chosen.notes == (f"prompts: 1 of {tmp_path / 't.txt'}'s first prompts left out, too long for the target's context",)
    with pytest.raises(ValueError, match="has 2 distinct prompts; 1 left out: their first turn and the answer do not fit"):
        user_prompt_set(str(tmp_path / "t.txt"), 3, fits=fits)


def test_settings_refuse_more_prompts_than_the_set_holds_and_mt_bench_stays_the_default():
    two = user_prompt_set(str(MT_BENCH_PATH), 2)
    with pytest.raises(ValueError, match="num_prompts=3: the prompt set has 2; give at most 2"):
        BenchmarkSettings(num_prompts=3, concurrencies=(1,), prompt_set=two)
    BenchmarkSettings(num_prompts=2, concurrencies=(1,), prompt_set=two)
    with pytest.raises(ValueError, match="num_prompts=81: MT-Bench has 80 first turns"):
        BenchmarkSettings(num_prompts=81, concurrencies=(1,))
    default = mt_bench_set(8)
    assert list(default.messages) == mt_bench_prompts(8) and list(default.categories) == mt_bench_categories(8)
    assert default.name == "MT-Bench first turns (8 of 80, spread over its categories)"


def test_prompts_without_categories_get_no_category_slices_and_the_report_names_the_set(tmp_path):
    results = [Result(tokens=[1] * 8, accepted_per_step=[2, 1, 0], k=3, answer_end=4), Result(tokens=[1] * 8, accepted_per_step=[3, 1], k=3)]
    slices = offline_slices(results, None, 3)
    assert [s.source for s in slices] == [WITHIN_ANSWER, "after the end of the answer"]  # no `category ...` slice
    name = "traffic.json: the first user turn of its first 8 prompts"
    report = build_report("smollm2", "d", RUNS, offline=OFFLINE, offline_slices=slices, prompt_set=name)
    assert "- prompts: traffic.json: the first user turn of its first 8 prompts" in to_markdown(report)
    assert "prompts: traffic.json: the first user turn of its first 8 prompts" in summary_text(report)
    paths = write_report(report, tmp_path)
    assert load_report(paths.json).prompt_set == report.prompt_set
