"""How an interleaved sweep splits each level into rounds and orders the configurations in them
(the sweep itself, against real servers, is in test_served.py)."""

from __future__ import annotations

import pytest

from eagle_assets.bench.interleaved import ServedTarget, round_order, round_prompts, run_interleaved
from eagle_assets.bench.served import SweepSettings


def test_rounds_take_every_nth_prompt_and_keep_the_level_in_flight():
    assert round_prompts(10, 1, 3) == [range(0, 10, 3), range(1, 10, 3), range(2, 10, 3)]
    # MT-Bench's 80 come 10 per category: each of 5 rounds holds 2 of every category.
    plan = round_prompts(80, 1, 5)
    assert [list(r)[:3] for r in plan] == [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8, 13], [4, 9, 14]]
    for r in plan:
        assert len(r) == 16 and sorted(i // 10 for i in r) == sorted(list(range(8)) * 2)
    assert sorted(i for r in plan for i in r) == list(range(80))  # every prompt once
    # 8 in flight: 80 prompts hold 5 rounds of 16, 20 prompts only 2 of at least 8.
    assert round_prompts(80, 8, 5) == plan
    assert round_prompts(20, 8, 5) == [range(0, 20, 2), range(1, 20, 2)]
    assert round_prompts(9, 8, 5) == [range(0, 9)]
    with pytest.raises(ValueError, match="cannot keep 8 requests in flight"):
        round_prompts(4, 8, 2)


def test_the_order_rotates_so_each_configuration_takes_each_place_in_turn():
    orders = [round_order(3, r) for r in range(4)]
    assert orders == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    for place in range(3):  # over 3 rounds, every configuration is served first, second and last once
        assert sorted(o[place] for o in orders[:3]) == [0, 1, 2]


def test_bad_plans_are_refused_before_any_request():
    settings = SweepSettings(output_len=8, concurrencies=(1, 4), progress=False)
    # Nothing listens on these URLs: every refusal must come before a request is sent.
    a, b = ServedTarget("baseline", "http://127.0.0.1:9", "m"), ServedTarget("eagle3", "http://127.0.0.1:9", "m")
    with pytest.raises(ValueError, match="rounds=0"):
        run_interleaved([a, b], ["p"] * 4, settings, 0)
    with pytest.raises(ValueError, match="repeat"):
        run_interleaved([a, a], ["p"] * 4, settings, 2)
    with pytest.raises(ValueError, match="cannot keep 4 requests in flight"):
        run_interleaved([a, b], ["p"] * 3, settings, 2)
