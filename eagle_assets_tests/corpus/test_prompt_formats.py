"""Prompt files in ShareGPT, OpenAI chat, Alpaca and text formats, and the packaged ShareGPT file."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.corpus.prompt_formats import (
    SHAREGPT_URL,
    ContextFit,
    ReadStats,
    combine,
    iter_prompts,
    mix_counts,
    sample_prompts,
    sharegpt_prompts,
)
from eagle_assets.corpus.prompt_record import MT_BENCH_PATH, EvaluationDataError, Prompt, PromptFileError, load_mt_bench
from eagle_assets.corpus.prompts import load_prompt_file
from eagle_assets_tests.corpus.conftest import write_jsonl

# One conversation and one single question, as each format writes them.
SYSTEM, Q1, A1, Q2, Q3 = "Answer briefly.", "What is a monad?", "A monoid in...", "Give an example in Python.", "Name a prime."
SHAREGPT = [
    {
        "id": "a_0",
        "conversations": [
            {"from": "system", "value": SYSTEM},
            {"from": "human", "value": Q1},
            {"from": "gpt", "value": A1},
            {"from": "human", "value": Q2},
            {"from": "gpt", "value": "an answer"},
        ],
    },
    {"id": "b_0", "conversations": [{"from": "human", "value": Q3}, {"from": "gpt", "value": "7"}]},
]
OPENAI = [
    {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": Q1},
            {"role": "assistant", "content": A1},
            {"role": "user", "content": Q2},
        ]
    },
    {"messages": [{"role": "user", "content": Q3}]},
]
EXPECTED = [((Q1, Q2), SYSTEM), ((Q3,), None)]


def read(path, **kw) -> list[tuple[tuple[str, ...], str | None]]:
    return [(p.turns, p.system) for p in load_prompt_file(str(path), **kw)]


def test_sharegpt_and_openai_files_give_the_same_prompts_in_every_container(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SHAREGPT, indent=2))
    write_jsonl(tmp_path / "s.jsonl", SHAREGPT)
    (tmp_path / "o.json").write_text(json.dumps(OPENAI))
    write_jsonl(tmp_path / "o.jsonl", OPENAI)
    with gzip.open(tmp_path / "s.json.gz", "wt") as f:
        json.dump(SHAREGPT, f)
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))  # JSON Lines named .json
    pq.write_table(pa.Table.from_pylist(SHAREGPT), tmp_path / "s.parquet")
    for name in ("s.json", "s.jsonl", "o.json", "o.jsonl", "s.json.gz", "lines.json", "s.parquet"):
        assert read(tmp_path / name) == EXPECTED, name
    stats = ReadStats()
    load_prompt_file(str(tmp_path / "s.json"), stats=stats)
    assert (stats.format, stats.container, stats.records, stats.prompts) == ("sharegpt", "json_array", 2, 2)
    # Every human turn is kept, the answers are the target's to write; the ids are the content's.
    assert load_prompt_file(str(tmp_path / "s.json"))[0].prompt_id == Prompt.make([Q1, Q2], system=SYSTEM).prompt_id


def test_alpaca_text_and_role_aliases(tmp_path):
    alpaca = [
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
        {"instruction": "  Name a prime.  ", "input": "", "output": "7"},
    ]
    (tmp_path / "a.json").write_text(json.dumps(alpaca))
    assert read(tmp_path / "a.json") == [(("Translate to French.\n\nGood morning",), None), (("Name a prime.",), None)]
    (tmp_path / "t.txt").write_text("First prompt\n\n  Second prompt  \nFirst prompt\n")
    assert read(tmp_path / "t.txt") == [(("First prompt",), None), (("Second prompt",), None)]  # blank skipped, duplicate dropped
    (tmp_path / "strings.json").write_text(json.dumps(["one", "two"]))  # an array of strings: text prompts
    assert read(tmp_path / "strings.json") == [(("one",), None), (("two",), None)]
    aliases = [
        {
            "conversations": [
                {"from": "user", "value": "hi"},
                {"from": "chatgpt", "value": "x"},
                {"from": "human", "value": "more"},
                {"from": "bard", "value": "y"},
            ]
        }
    ]
    write_jsonl(tmp_path / "aliases.jsonl", aliases)
    assert read(tmp_path / "aliases.jsonl") == [(("hi", "more"), None)]


def test_the_format_is_detected_per_file_and_can_be_forced(tmp_path):
    (tmp_path / "p.prompts").write_text("one\ntwo\n")
    with pytest.raises(PromptFileError, match="unknown prompt file type"):
        load_prompt_file(str(tmp_path / "p.prompts"))
    assert read(tmp_path / "p.prompts", format="text") == [(("one",), None), (("two",), None)]
    # A row with `conversations` and `instruction` both: detected as ShareGPT, forced as Alpaca.
    both = [{"conversations": [{"from": "human", "value": "sharegpt's"}], "instruction": "alpaca's"}]
    write_jsonl(tmp_path / "both.jsonl", both)
    assert read(tmp_path / "both.jsonl") == [(("sharegpt's",), None)]
    assert read(tmp_path / "both.jsonl", format="alpaca") == [(("alpaca's",), None)]
    # Forced as text, a JSON Lines file is its lines.
    assert read(tmp_path / "both.jsonl", format="text") == [((json.dumps(both[0]),), None)]
    with pytest.raises(PromptFileError, match="format 'csv': choose one of auto, sharegpt, openai, alpaca, eagle, text"):
        load_prompt_file(str(tmp_path / "both.jsonl"), format="csv")
    write_jsonl(tmp_path / "unknown.jsonl", [{"text": "x"}])
    with pytest.raises(PromptFileError, match=r"unknown\.jsonl line 1: cannot tell the file's format from its first row \(\['text'\]\)"):
        load_prompt_file(str(tmp_path / "unknown.jsonl"))


def _record_lines(text: str) -> list[int]:
    """The line (from 1) each record of an indent=2 JSON array starts on."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line == "  {"]


def test_a_bad_row_names_its_line(tmp_path):
    records = [
        SHAREGPT[1],
        SHAREGPT[0],
        {"id": "c_1", "conversations": [{"from": "gpt", "value": "...continued"}, {"from": "human", "value": "and then?"}]},
    ]
    text = json.dumps(records, indent=2)
    (tmp_path / "s.json").write_text(text)
    line = _record_lines(text)[2]
    with pytest.raises(PromptFileError, match=rf"s\.json row 3 \(line {line}\): the conversation opens with an answer"):
        load_prompt_file(str(tmp_path / "s.json"))
    cases = {
        "role": ([SHAREGPT[1], {"conversations": [{"from": "tool", "value": "x"}]}], r"line 2: turn 0 is from 'tool'"),
        "empty": (
            [{"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": " "}]}],
            r"line 1: turn 2 \(human\) is empty",
        ),
        "mixed": ([SHAREGPT[1], {"instruction": "x"}], r"line 2: the row has no `conversations`: the file is read as sharegpt"),
        "alpaca": ([{"instruction": "x"}, {"instruction": ""}], r"line 2: `instruction` is empty"),
        "unicode": ([{"prompt": "fine"}, {"prompt": "cut emoji \ud83d"}], r"line 2: `prompt` holds a lone surrogate"),
    }
    for name, (rows, message) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(PromptFileError, match=f"{name}\\.jsonl {message}"):
            load_prompt_file(str(path))
    (tmp_path / "badbytes.txt").write_bytes(b"fine\nLatin-1 caf\xe9\n")
    with pytest.raises(PromptFileError, match=r"badbytes\.txt line 2: the prompt is not UTF-8 text"):
        load_prompt_file(str(tmp_path / "badbytes.txt"))
    # A JSON array cut inside its third record: strict reading names where, and keeps nothing.
    (tmp_path / "cut.json").write_text(text[: text.index("...continued")])
    with pytest.raises(PromptFileError, match=rf"cut\.json row 3 \(line {line}\): the file ends inside record 3 .*the file is cut short"):
        load_prompt_file(str(tmp_path / "cut.json"))


def test_skipping_bad_rows_counts_each_reason_and_keeps_the_turns_before_a_blank_one(tmp_path):
    def conv(*turns):
        return {"conversations": [{"from": f, "value": v} for f, v in turns]}

    records = [
        conv(("human", "kept whole"), ("gpt", "a"), ("human", "second")),
        conv(("gpt", "continued"), ("human", "q")),  # not_opening_with_human
        conv(("gpt", "answer only")),  # no_human_turn
        {"id": "x", "conversations": []},  # no_human_turn
        conv(("human", "  "), ("gpt", "a")),  # empty_first_turn
        conv(("human", "kept up to the blank"), ("gpt", "a"), ("human", ""), ("gpt", "b"), ("human", "lost")),
        conv(("human", "bad \udc80 text")),  # bad_unicode
        conv(("system", "s"), ("human", "q"), ("system", "late")),  # invalid
        conv(("human", "kept whole")),  # not a duplicate of the first: fewer turns
    ]
    text = json.dumps(records)
    (tmp_path / "s.json").write_text(text + "\n")
    (tmp_path / "cut.json").write_text(text[:-1] + ', {"conversations": [{"from": "human", "value": "cut her')
    for name, cut in (("s.json", 0), ("cut.json", 1)):
        stats = ReadStats()
        prompts = load_prompt_file(str(tmp_path / name), skip_bad_rows=True, stats=stats)
        assert [p.turns for p in prompts] == [("kept whole", "second"), ("kept up to the blank",), ("kept whole",)]
        assert stats.records == 9 and stats.prompts == 3
        assert stats.dropped == {
            "not_opening_with_human": 1,
            "no_human_turn": 2,
            "empty_first_turn": 1,
            "bad_unicode": 1,
            "invalid": 1,
            **({"cut_record": 1} if cut else {}),
        }
        assert stats.shortened == {"empty_turn": 1}


@pytest.mark.parametrize("kind", ["sharegpt", "openai", "alpaca", "text", "eagle", "parquet"])
def test_mt_bench_is_refused_as_training_data_in_every_format(tmp_path, kind):
    question = load_mt_bench()[12].turns[0]
    rows = {
        "sharegpt": [{"conversations": [{"from": "human", "value": q}]} for q in ("a fine prompt", question)],
        "openai": [{"messages": [{"role": "user", "content": q}]} for q in ("a fine prompt", question)],
        "alpaca": [{"instruction": q, "output": ""} for q in ("a fine prompt", question)],
        "eagle": [{"turns": [q]} for q in ("a fine prompt", question)],
        "parquet": [{"prompt": q} for q in ("a fine prompt", question)],
    }
    if kind == "text":
        path = tmp_path / "train.txt"
        path.write_text(f"a fine prompt\n{question}\n")
    elif kind == "parquet":
        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist(rows[kind]), path)
    else:
        path = tmp_path / "train.json"
        path.write_text(json.dumps(rows[kind]))
    with pytest.raises(EvaluationDataError, match=r"1 prompt\(s\) are MT-Bench questions \(.*train\.\w+ (row|line) 2"):
        load_prompt_file(str(path))
    assert len(load_prompt_file(str(path), purpose="evaluation")) == 2
    # By name, in any format and place: a package's data file too.
    with pytest.raises(EvaluationDataError, match="is MT-Bench, the evaluation set"):
        load_prompt_file("pkg://eagle_assets/data/mt_bench_questions.jsonl")
    # And ShareGPT's sample drops it (counted) rather than training on it.
    stats = ReadStats()
    sampled = sample_prompts(iter_prompts(str(path), format="text" if kind == "text" else "auto"), None, 0, stats=stats)
    assert [p.turns[0] for p in sampled] == ["a fine prompt"] and stats.dropped == {"mt_bench": 1}


def test_package_urls_resolve_through_importlib_resources():
    assert len(load_prompt_file("pkg://eagle_assets/data/mt_bench_questions.jsonl", purpose="evaluation")) == 80
    assert [p.turns for p in load_prompt_file("pkg://eagle_assets/data/mt_bench_questions.jsonl", purpose="evaluation")] == [
        p.turns for p in load_mt_bench()
    ]
    with pytest.raises(PromptFileError, match=r"pkg://eagle_assets/data/nope\.json: package 'eagle_assets' has no file 'data/nope\.json'"):
        load_prompt_file("pkg://eagle_assets/data/nope.json")
    with pytest.raises(PromptFileError, match=r"pkg://no_such_package/x\.json: no installed package 'no_such_package'"):
        load_prompt_file("pkg://no_such_package/x.json")
    with pytest.raises(PromptFileError, match="a package URL is pkg://PACKAGE/PATH"):
        load_prompt_file("pkg://eagle_assets")
    assert str(MT_BENCH_PATH).endswith("eagle_assets/data/mt_bench_questions.jsonl")


def test_the_packaged_sharegpt_file_streams_to_every_complete_record_with_exact_drop_counts():
    # The packaged file is cut at 125 MB, inside its 17,672nd record: json.load fails on it.
    tracemalloc.start()
    stats = ReadStats()
    n = sum(1 for _ in iter_prompts(SHAREGPT_URL, skip_bad=True, stats=stats))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 * 2**20  # one record and a 1 MiB chunk at a time, never the 120 MiB file
    assert (stats.format, stats.records, stats.prompts, n) == ("sharegpt", 17671, 11168, 11168)
    # 11,144 open with `human`, 2 with `user`, 29 with a system message and then a human turn:
    # 11,175, of which 7 open with a blank turn.
    assert stats.dropped == {"cut_record": 1, "no_human_turn": 274, "not_opening_with_human": 6222, "empty_first_turn": 7}
    assert stats.shortened == {"empty_turn": 13}
    assert stats.problems[0].startswith(f"{SHAREGPT_URL} row 5 (line 134): the conversation opens with an answer")


def test_sharegpt_samples_are_reproducible_nested_and_distinct():
    every, stats = sharegpt_prompts(None)
    assert len(every) == 10642 and stats.dropped["duplicate"] == 526 and sum(len(p.turns) for p in every) == 35834
    assert all(p.source == "sharegpt" for p in every) and len({p.prompt_id for p in every}) == len(every)
    first, stats = sharegpt_prompts(None, user_turns="first")
    assert len(first) == 10345 and stats.dropped["duplicate"] == 823 and all(len(p.turns) == 1 for p in first)
    a, b, small, other = sharegpt_prompts(200, 7)[0], sharegpt_prompts(200, 7)[0], sharegpt_prompts(50, 7)[0], sharegpt_prompts(200, 8)[0]
    ids = [p.prompt_id for p in a]
    assert len(a) == 200 and ids == [p.prompt_id for p in b]  # the same seed, the same prompts in the same order
    assert {p.prompt_id for p in small} <= set(ids)  # a smaller sample is part of a larger one
    assert len(set(ids) & {p.prompt_id for p in other}) < 20  # another seed, another sample (200 of 10,642)


def test_conversations_keep_the_turns_that_fit_the_context(tokenizer):
    def tokens(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    turns = ["Explain entropy in one line.", "Now in two lines, with an example please.", "x " * 300]
    fit = ContextFit(tokenizer, 10_000, 100)
    need = [tokens(t) + fit.overhead + 100 for t in turns]  # each turn with its answer
    prompt = Prompt.make(turns)
    assert ContextFit(tokenizer, sum(need), 100)(prompt) is prompt  # exactly fits: kept whole
    cut = ContextFit(tokenizer, sum(need) - 1, 100)
    assert cut(prompt).turns == tuple(turns[:2]) and cut.shortened == 1
    short = ContextFit(tokenizer, need[0] - 1, 100)
    assert short(prompt) is None and short.dropped == 1
    with_system = Prompt.make(turns[:1], system="Be brief.")
    assert ContextFit(tokenizer, need[0] + tokens("Be brief.") + fit.overhead, 100)(with_system) is with_system
    assert ContextFit(tokenizer, need[0] + tokens("Be brief.") + fit.overhead - 1, 100)(with_system) is None
    with pytest.raises(ValueError, match="leaves no room"):
        ContextFit(tokenizer, 100, 100)


def test_a_mix_splits_the_prompts_by_share_and_shuffles_them_reproducibly():
    assert mix_counts({"sharegpt": 0.75, "magpie": 0.25}, 16000) == {"sharegpt": 12000, "magpie": 4000}
    assert mix_counts({"sharegpt": 3, "magpie": 1}, 10) == {"sharegpt": 8, "magpie": 2}  # 7.5 / 2.5: a tie goes to the source named first
    assert mix_counts({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    with pytest.raises(ValueError, match="give each source a positive share"):
        mix_counts({"sharegpt": 1, "magpie": 0}, 10)
    one = [Prompt.make([f"s{i}"], source="sharegpt") for i in range(5)]
    two = [Prompt.make([f"m{i}"], source="magpie") for i in range(3)] + [Prompt.make(["s0"], source="magpie")]
    mixed = combine({"sharegpt": one, "magpie": two}, seed=1)
    assert sorted(p.turns[0] for p in mixed) == sorted([f"s{i}" for i in range(5)] + [f"m{i}" for i in range(3)])
    assert next(p for p in mixed if p.turns[0] == "s0").source == "sharegpt"  # the duplicate kept once, from the first source
    assert [p.prompt_id for p in mixed] == [p.prompt_id for p in combine({"sharegpt": one, "magpie": two}, seed=1)]
    assert [p.prompt_id for p in mixed] != [p.prompt_id for p in one + two[:3]]  # shuffled
