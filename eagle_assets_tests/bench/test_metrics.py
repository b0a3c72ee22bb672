"""Spec-decode counters: Prometheus parsing, deltas, definitions, SGLang meta_info.

The same parsing on the real server's /metrics output is tested in test_served.py, beside the
server fixture.
"""

from __future__ import annotations

import math

import pytest

from eagle_assets.bench.metrics import (
    SpecCounters,
    SpecStats,
    parse_prometheus,
    spec_counters_from_text,
    spec_stats_between,
    spec_stats_from_sglang,
)

# Two engine cores and a second served name, as a data-parallel vLLM would export them.
TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 6.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 100.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7960504886555016e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 18.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="other"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 14.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 10.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="other",position="0"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="other",position="1"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="other",position="2"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 8.0
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 12.0 1796050496000
weird_label{path="a \\"quoted\\", comma"} 1
"""


def test_parse_reads_names_labels_values_and_escapes():
    samples = {(s.name, s.labels): s.value for s in parse_prometheus(TEXT)}
    assert samples[("vllm:time_to_first_token_seconds_bucket", (("engine", "0"), ("le", "+Inf"), ("model_name", "m")))] == 8.0
    assert samples[("http_requests_total", (("handler", "/v1/chat/completions"), ("method", "POST"), ("status", "2xx")))] == 12.0
    assert samples[("weird_label", (("path", 'a "quoted", comma'),))] == 1.0


def test_parse_names_the_bad_line():
    with pytest.raises(ValueError, match="line 2"):
        parse_prometheus('# ok\nvllm:spec_decode_num_drafts_total{engine="0"}\n')


def test_counters_sum_engines_and_filter_by_model():
    one_model = spec_counters_from_text(TEXT, model="m")
    assert one_model == SpecCounters(present=True, drafts=16, draft_tokens=48, accepted=24, accepted_per_pos=(13, 7, 4))
    every_model = spec_counters_from_text(TEXT)
    assert (every_model.drafts, every_model.draft_tokens, every_model.accepted) == (116, 348, 24)


def test_server_without_speculation_has_no_stats():
    text = '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
    c = spec_counters_from_text(text)
    assert not c.present
    assert spec_stats_between(c, c) is None


def test_delta_and_the_metric_definitions():
    before = SpecCounters(True, drafts=4, draft_tokens=12, accepted=5, accepted_per_pos=(3, 1, 1))
    after = SpecCounters(True, drafts=24, draft_tokens=72, accepted=35, accepted_per_pos=(18, 10, 7))
    s = spec_stats_between(before, after)
    assert s == SpecStats(drafts=20, draft_tokens=60, accepted=30, accepted_per_pos=(15, 9, 6))
    assert s.al == 1 + 30 / 20  # AL = 1 + accepted / drafts
    assert s.draft_acceptance_rate == 30 / 60  # accepted / drafted tokens
    assert s.per_position_acceptance == [15 / 20, 9 / 20, 6 / 20]  # p_k = accepted at k / drafts
    assert s.num_speculative_tokens == 3
    assert SpecStats.from_dict(s.to_dict()) == s


def test_delta_refuses_a_restarted_server():
    before = SpecCounters(True, drafts=50, draft_tokens=150, accepted=60, accepted_per_pos=(30, 20, 10))
    after = SpecCounters(True, drafts=5, draft_tokens=15, accepted=6, accepted_per_pos=(3, 2, 1))
    with pytest.raises(ValueError, match="restarted"):
        spec_stats_between(before, after)
    with pytest.raises(ValueError, match="restarted"):
        spec_stats_between(SpecCounters(False), after)


def test_no_drafts_gives_nan_not_a_division_error():
    s = SpecStats(drafts=0, draft_tokens=0, accepted=0, accepted_per_pos=(0, 0))
    assert math.isnan(s.al) and math.isnan(s.draft_acceptance_rate)
    assert all(math.isnan(p) for p in s.per_position_acceptance)


def test_sglang_meta_info_aggregates_like_the_engine_counts():
    # Two requests as SGLang 0.5.23 reports them with 3 draft tokens per step (num_draft_tokens 4).
    # Request 1: 10 verify steps accepting 0,1,2,3,3,3,2,1,0,3 drafts -> 18 accepted, 1 + 28 tokens.
    # Request 2: 5 steps accepting 3,3,3,3,3 -> 15 accepted.
    metas = [
        {
            "completion_tokens": 29,
            "spec_verify_ct": 10,
            "spec_num_correct_drafts": 18,
            "spec_num_proposed_drafts": 30,
            "spec_accept_length": 2.9,
            "spec_correct_drafts_histogram": [2, 2, 2, 4],
        },
        {
            "completion_tokens": 21,
            "spec_verify_ct": 5,
            "spec_num_correct_drafts": 15,
            "spec_num_proposed_drafts": 15,
            "spec_accept_length": 4.2,
            "spec_correct_drafts_histogram": [0, 0, 0, 5],
        },
        {"completion_tokens": 3},  # a request that finished in prefill carries no spec keys
    ]
    s = spec_stats_from_sglang(metas)
    assert (s.drafts, s.draft_tokens, s.accepted) == (15, 45, 33)
    assert s.al == 1 + 33 / 15
    # p_k counts steps with at least k accepted: k=1: 2+2+4+5, k=2: 2+4+5, k=3: 4+5.
    assert s.accepted_per_pos == (13, 11, 9)
    assert sum(s.accepted_per_pos) == s.accepted
    assert s.engine_reported_al == (29 + 21) / 15  # SGLang's own: completion tokens / verify count
    assert spec_stats_from_sglang([{"completion_tokens": 3}]) is None


def test_sglang_without_counts_falls_back_to_the_reported_ratio():
    s = spec_stats_from_sglang([{"completion_tokens": 25, "spec_verify_ct": 10, "spec_accept_length": 2.5}])
    assert (s.drafts, s.accepted) == (10, 15)
    assert s.al == 2.5
    with pytest.raises(ValueError, match="response 0"):
        spec_stats_from_sglang([{"spec_verify_ct": 3}])
