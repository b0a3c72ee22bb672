"""Prompt files, their errors, and the MT-Bench guard."""

from __future__ import annotations

import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.corpus.prompt_record import MT_BENCH_PATH, EvaluationDataError, Prompt, PromptFileError, ensure_training_prompts, load_mt_bench
from eagle_assets.corpus.prompts import TOPIC_OPENINGS, MagpieSettings, load_prompt_file, load_topics, write_prompts
from eagle_assets.formats import stable_id
from eagle_assets_tests.corpus.conftest import write_jsonl

ROWS = [
    {"prompt": "What is 2+2?"},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "an answer the target will rewrite"},
            {"role": "user", "content": "Tell me more."},
        ]
    },
    {"prompt": "What is 2+2?"},  # a duplicate: kept once
]


def test_jsonl_and_parquet_give_the_same_prompts_with_stable_ids(tmp_path):
    from_jsonl = load_prompt_file(str(write_jsonl(tmp_path / "p.jsonl", ROWS)))
    pq.write_table(
        pa.Table.from_pylist([{"prompt": r.get("prompt"), "messages": json.dumps(r["messages"]) if "messages" in r else None} for r in ROWS]),
        tmp_path / "p.parquet",
    )
    from_parquet = load_prompt_file(str(tmp_path / "p.parquet"))
    assert [(p.prompt_id, p.turns, p.system) for p in from_jsonl] == [(p.prompt_id, p.turns, p.system) for p in from_parquet]
    single, multi = from_jsonl
    assert single.turns == ("What is 2+2?",) and single.system is None and single.source == "file"
    assert multi.turns == ("Hi", "Tell me more.") and multi.system == "Be brief."  # assistant turn dropped
    assert multi.prompt_id == stable_id("prompt", "Be brief.", ["Hi", "Tell me more."])
    assert multi.origin.endswith("p.jsonl line 2")


def test_saved_prompt_sets_load_back_identically(tmp_path):
    prompts = [Prompt.make(["a question"], source="magpie"), Prompt.make(["x", "y"], system="s")]
    url = str(tmp_path / "sets" / "prompts.jsonl")
    write_prompts(prompts, url)
    back = load_prompt_file(url)
    assert [(p.prompt_id, p.turns, p.system, p.source) for p in back] == [(p.prompt_id, p.turns, p.system, p.source) for p in prompts]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "ok"}, {"text": "no known key"}], r"line 2: the row has neither `messages` .* nor `prompt`.*\['text'\]"),
        ([{"prompt": "ok"}, {"prompt": "ok2"}, {"prompt": "   "}], r"line 3: `prompt` is empty"),
        ([{"messages": [{"role": "user", "content": ""}]}], r"line 1: message 0 \(user\) is empty"),
        ([{"messages": [{"role": "tool", "content": "x"}]}], r"line 1: message 0 has role 'tool'"),
        ([{"messages": [{"role": "assistant", "content": "x"}]}], r"line 1: `messages` has no user turn"),
        # Not text: named as such, not as "empty".
        ([{"prompt": "ok"}, {"prompt": 123}], r"line 2: `prompt` must be text \(a string\), not int 123"),
        ([{"turns": ["fine", ["nested"]]}], r"line 1: `turns` item 1 must be text \(a string\), not list"),
        ([{"messages": [{"role": "user", "content": {"text": "x"}}]}], r"line 1: message 0 \(user\) must be text"),
        # A lone surrogate (json.dumps writes it as the escape \ud800): the row, not a UnicodeEncodeError.
        ([{"prompt": "ok"}, {"prompt": "ab\ud800c"}], r"line 2: `prompt` holds a lone surrogate '\\ud800' at character 2"),
        (
            [{"messages": [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}]}],
            r"line 1: message 0 \(system\) holds a lone surrogate",
        ),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(PromptFileError, match=f"{re.escape(str(path))} {message}"):
        load_prompt_file(str(path))


def test_any_unicode_text_loads_and_bad_bytes_name_their_line(tmp_path):
    texts = ["naïve café", "日本語の質問", "emoji 🦅 and astral 𝔘𝔫𝔦", "RTL עברית", "a\u0301 combining"]
    path = write_jsonl(tmp_path / "unicode.jsonl", [{"prompt": t} for t in texts])
    assert [p.turns[0] for p in load_prompt_file(str(path))] == texts
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "after a BOM"}).encode() + b"\n")
    assert [p.turns[0] for p in load_prompt_file(str(bom))] == ["after a BOM"]
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "fine"}\n\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(PromptFileError, match=r"latin1\.jsonl line 3: `prompt` is not UTF-8 text \(byte 0xe9 at character 3\)"):
        load_prompt_file(str(latin1))


def test_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(PromptFileError, match=r"cannot read prompt file .*missing\.jsonl: FileNotFoundError"):
        load_prompt_file(str(tmp_path / "missing.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "fine"}\n{"prompt": \n')
    with pytest.raises(PromptFileError, match=r"broken\.jsonl line 2: not valid JSON"):
        load_prompt_file(str(tmp_path / "broken.jsonl"))
    (tmp_path / "corrupt.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(PromptFileError, match=r"cannot read prompt file .*corrupt\.parquet"):
        load_prompt_file(str(tmp_path / "corrupt.parquet"))
    (tmp_path / "p.csv").write_text("prompt\nhi\n")
    with pytest.raises(PromptFileError, match="unknown prompt file type"):
        load_prompt_file(str(tmp_path / "p.csv"))


def test_mt_bench_is_for_evaluation_only(tmp_path):
    questions = load_mt_bench()
    assert len(questions) == 80 and all(len(q.turns) == 2 and q.source == "mt_bench" for q in questions)
    assert len(load_prompt_file(str(MT_BENCH_PATH), purpose="evaluation")) == 80

    with pytest.raises(EvaluationDataError, match="mt_bench_questions.jsonl is MT-Bench, the evaluation set"):
        load_prompt_file(str(MT_BENCH_PATH))
    # Renamed, or one question mixed into a training file (reformatted): recognised by content.
    shutil.copy(MT_BENCH_PATH, tmp_path / "my_prompts.jsonl")
    with pytest.raises(EvaluationDataError, match="80 prompt"):
        load_prompt_file(str(tmp_path / "my_prompts.jsonl"))
    sneaky = "  " + questions[5].turns[0].upper().replace(" ", "\n ") + " "
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a fine prompt"}, {"prompt": sneaky}])
    with pytest.raises(EvaluationDataError, match=r"1 prompt\(s\) are MT-Bench questions \(.*train\.jsonl line 2"):
        load_prompt_file(str(path))
    with pytest.raises(EvaluationDataError):
        ensure_training_prompts(questions[:1])
    ensure_training_prompts([Prompt.make(["a fine prompt"])])  # no error


def test_topics_file_and_topic_openings_fit_together(tmp_path):
    topics = load_topics()
    assert len(topics) >= 100 and len(set(topics)) == len(topics)
    assert all(t.strip() == t and t and "#" not in t for t in topics)
    assert all("{topic}" in o for o in TOPIC_OPENINGS)
    ensure_training_prompts([Prompt.make([o.format(topic=t)]) for o in TOPIC_OPENINGS for t in topics])
    f = tmp_path / "topics.txt"
    f.write_text("# mine\nsailing  # a comment\n\n  knots\n", encoding="utf-8")
    assert load_topics(f) == ("sailing", "knots")
    with pytest.raises(ValueError, match="has \\{topic\\} but user_topics is empty"):
        MagpieSettings(user_openings=TOPIC_OPENINGS)
    with pytest.raises(ValueError, match="empty topic"):
        MagpieSettings(user_openings=TOPIC_OPENINGS, user_topics=("sailing", ""))
