"""K by batch size: the schedule's syntax, its checks, vLLM's config, and the K chosen per load."""

from __future__ import annotations

import pytest

from eagle_assets.engines.k_schedule import OPEN_END, KSchedule, schedule_from_speedups
from eagle_assets.engines.vllm_launch import speculative_config


def test_schedule_reads_writes_and_gives_vllm_its_entries():
    schedule = KSchedule.parse("1:4, 2-4:3,5-:0")
    assert schedule.ranges == ((1, 1, 4), (2, 4, 3), (5, OPEN_END, 0))
    assert schedule.text() == "1:4,2-4:3,5-:0" and KSchedule.parse(schedule.text()) == schedule
    assert schedule.describe() == "K 4 at batch size 1, 3 at batch sizes 2-4, 0 from 5 up"
    assert [schedule.k_at(b) for b in (1, 2, 4, 5, 64)] == [4, 3, 3, 0, 0]
    assert schedule.max_k == 4
    config = speculative_config("/d", 3, schedule)
    # num_speculative_tokens caps every K of the schedule in vLLM, so it is the largest.
    assert config == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 4, 3], [5, OPEN_END, 0]],
    }
    assert KSchedule.of_config(config) == schedule and KSchedule.of_config(speculative_config("/d", 3)) is None
    assert KSchedule.parse("1-8:2").k_at(9) == 2  # past a closed last range its K carries on, as in vLLM


@pytest.mark.parametrize(
    "text, names",
    [
        ("2-3:3", "the range 2-3 starts at 2, not 1"),
        ("1-2:3,2-:0", "the range 2- starts at 2, not 3"),
        ("1-2:3,4-:0", "the range 4- starts at 4, not 3"),
        ("1-2:3,3-:0,5-:1", "the range 5- follows an open range"),
        ("1-2:-1,3-:0", "K -1 for batch sizes 1-2 is negative"),
        ("1-2:0,3-:0", "K is 0 at every batch size: serve without a drafter instead"),
        ("1-2=3", "cannot read '1-2=3'"),
        ("1-2:three", "cannot read '1-2:three'"),
        ("", "cannot read ''"),
    ],
)
def test_a_bad_schedule_names_the_problem_and_the_syntax(text, names):
    with pytest.raises(ValueError) as err:
        KSchedule.parse(text)
    assert names in str(err.value) and "e.g. 1-2:3,3-:0" in str(err.value)


def test_the_fastest_k_per_level_becomes_the_schedule():
    # Level 1 covers batch size 1, level 4 sizes 2-4, level 8 sizes 5 and up.
    by_k = {3: {1: 1.50, 4: 1.25, 8: 0.90}, 2: {1: 1.60, 4: 1.10, 8: 0.95}}
    assert schedule_from_speedups(by_k).text() == "1:2,2-4:3,5-:0"
    # Neighbouring levels with the same K merge; a tie goes to the smaller K.
    assert schedule_from_speedups({3: {1: 1.5, 4: 1.2, 8: 1.1}, 4: {1: 1.5, 4: 1.1, 8: 1.0}}).text() == "1-:3"
    assert schedule_from_speedups({3: {4: 1.2, 8: 0.99}}).text() == "1-4:3,5-:0"
    # 1.0x is no gain: a level where no K beat no speculation gets K 0, and none at all gives no schedule.
    assert schedule_from_speedups({3: {1: 1.0, 8: 1.2}}).text() == "1:0,2-:3"
    assert schedule_from_speedups({3: {1: 0.98, 8: 0.9}, 2: {1: 1.0}}) is None
    assert schedule_from_speedups({}) is None
