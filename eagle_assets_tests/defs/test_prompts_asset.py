"""The `prompts` asset's ShareGPT, file and mix sources, as real Dagster materialisations (no
server: only Magpie needs one, and these sources leave it out)."""

from __future__ import annotations

import json

import dagster as dg

from eagle_assets.corpus.prompt_record import load_mt_bench
from eagle_assets.corpus.prompts import load_prompt_file
from eagle_assets.defs.corpus import PROMPTS_FILE, prompts
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.targets import EMBEDDED_TARGET


def materialize(tmp_path, config: dict, raise_on_error: bool = True):
    result = dg.materialize(
        [prompts],
        resources={"inference_server": InferenceServerResource(), "storage": StorageResource(root=str(tmp_path / "data"))},
        run_config={"ops": {"prompts": {"config": config}}},
        raise_on_error=raise_on_error,
    )
    written = tmp_path / "data" / EMBEDDED_TARGET / "prompts" / PROMPTS_FILE
    return result, written


def meta(result) -> dict:
    return {k: v.value for k, v in result.asset_materializations_for_node("prompts")[0].metadata.items()}


def test_sharegpt_source_samples_the_packaged_conversations_and_counts_what_it_dropped(tmp_path, smollm2_path):
    result, written = materialize(tmp_path, {"source": "sharegpt", "num_prompts": 40, "seed": 5})
    m = meta(result)
    items = load_prompt_file(str(written))
    assert len(items) == 40 and m["num_prompts"] == 40 and m["sources"] == {"sharegpt": 40}
    assert all(p.source == "sharegpt" for p in items)  # the source survives the round trip through the file
    assert m["user_turns"] == sum(len(p.turns) for p in items) and m["multi_turn"] == sum(len(p.turns) > 1 for p in items) > 0
    # The reader's counts, whole file: every complete record and what was dropped, per reason.
    assert (m["sharegpt_records"], m["sharegpt_prompts"]) == (17671, 11168)
    assert (
        m["sharegpt_dropped_cut_record"],
        m["sharegpt_dropped_no_human_turn"],
        m["sharegpt_dropped_not_opening_with_human"],
        m["sharegpt_dropped_empty_first_turn"],
    ) == (1, 274, 6222, 7)
    assert m["fit_context_tokens"] == 2048 and m["fit_answer_tokens"] == 256
    # The same seed gives the same prompts; first turns only, when asked.
    again, written_again = materialize(tmp_path / "again", {"source": "sharegpt", "num_prompts": 40, "seed": 5, "user_turns": "first"})
    firsts = load_prompt_file(str(written_again))
    assert all(len(p.turns) == 1 for p in firsts) and meta(again)["multi_turn"] == 0


def test_a_mix_of_sharegpt_and_a_users_file_splits_num_prompts_by_share(tmp_path, smollm2_path):
    rows = [{"instruction": f"Write a haiku about the number {i}.", "output": "ignored"} for i in range(10)]
    (tmp_path / "data").mkdir(exist_ok=True)  # a run reads prompt files under its data folder (prompt_roots)
    (tmp_path / "data" / "mine.json").write_text(json.dumps(rows))
    config = {"source": "mix", "num_prompts": 8, "mix": {"sharegpt": 3, "file": 1}, "file_url": str(tmp_path / "data" / "mine.json")}
    result, written = materialize(tmp_path, config)
    items = load_prompt_file(str(written))
    assert meta(result)["sources"] == {"file": 2, "sharegpt": 6} and len(items) == 8
    assert meta(result)["file_format"] == "alpaca" and meta(result)["file_records"] == 10
    assert sum(p.turns[0].startswith("Write a haiku") for p in items) == 2


def failure(result) -> str:
    assert not result.success
    error = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").event_specific_data.error
    return error.to_string()  # with its cause: the asset's own error


def test_mt_bench_in_a_training_file_and_an_unknown_source_fail_the_materialisation(tmp_path, smollm2_path):
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "train.txt").write_text("a fine prompt\n" + load_mt_bench()[3].turns[0] + "\n")
    result, written = materialize(tmp_path, {"source": "file", "file_url": str(tmp_path / "data" / "train.txt")}, raise_on_error=False)
    assert "1 prompt(s) are MT-Bench questions" in failure(result) and not written.exists()
    result, _ = materialize(tmp_path / "bad", {"source": "mix", "mix": {"sharegpt": 1, "wikipedia": 1}}, raise_on_error=False)
    assert "prompts.mix names ['wikipedia']: give shares of magpie, file, sharegpt" in failure(result)
