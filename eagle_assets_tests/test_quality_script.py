"""benchmarks/quality_drafter.py runs without Dagster: its copy of the asset defaults must stay true."""

import json
from pathlib import Path

import pytest

from eagle_assets.defs.benchmark import BenchmarkConfig
from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
from eagle_assets.defs.drafter import DrafterAssetConfig
from eagle_assets_tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "quality_drafter.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT)


@pytest.mark.parametrize(
    "asset, config",
    [
        ("prompts", PromptsConfig),
        ("synthetic_corpus", CorpusConfig),
        ("drafter_checkpoint", DrafterAssetConfig),
        ("benchmark_report", BenchmarkConfig),
    ],
)
def test_script_defaults_are_the_asset_config_defaults(script, asset, config):
    fields = config.model_fields
    for name, value in script.ASSET_DEFAULTS[asset].items():
        assert name in fields, f"{asset}.{name} is not a field of {config.__name__}"
        assert fields[name].default == value, f"{asset}.{name}: script has {value!r}, {config.__name__} {fields[name].default!r}"


def test_script_needs_no_dagster():
    code = [line for line in SCRIPT.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
    assert not [line for line in code if "dagster" in line or "eagle_assets.defs" in line or "eagle_assets.resources" in line]


def test_large_files_come_back_in_parts_that_join_to_the_original(script, tmp_path):
    src = tmp_path / "export"
    src.mkdir()
    weights = bytes(range(256)) * 40  # 10,240 bytes: three parts of 4,000
    (src / "model.safetensors").write_bytes(weights)
    (src / "config.json").write_text("{}")
    script.copy_in_parts(src, tmp_path / "out", part_bytes=4000)
    parts = sorted((tmp_path / "out").glob("model.safetensors.part-*"))
    assert [p.name[-3:] for p in parts] == ["000", "001", "002"] and not (tmp_path / "out" / "model.safetensors").exists()
    assert b"".join(p.read_bytes() for p in parts) == weights  # `cat NAME.part-* > NAME`
    assert (tmp_path / "out" / "config.json").read_text() == "{}"  # small files as they are


def test_held_out_prompts_are_the_validation_splits_single_turn_prompts(script, tmp_path):
    from eagle_assets.corpus.store import CorpusStore
    from eagle_assets.drafter.data import is_validation
    from eagle_assets_tests.corpus.test_store import row

    rows = []
    for i in range(40):
        r = row(i)
        turns = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        if i % 4 == 0:  # a two-turn conversation, with a system message
            turns = [{"role": "system", "content": "be brief"}, *turns, {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]
        rows.append({**r, "messages": json.dumps(turns)})
    with CorpusStore(str(tmp_path / "corpus"), shard_size=7) as store:
        for r in rows:
            store.append(r)
    held = script.held_out_prompts(tmp_path, 100, val_fraction=0.5)
    expected = [[{"role": "user", "content": f"q{i}"}] for i, r in enumerate(rows) if i % 4 and is_validation(r["sample_id"], 0.5)]
    assert 3 <= len(expected) < 30  # the split holds some, not all
    assert held == sorted(expected, key=json.dumps)  # no answers, no multi-turn, no training prompt
    assert script.held_out_prompts(tmp_path, 2, val_fraction=0.5) == held[:2]


def test_the_corpus_prompts_come_from_the_presets_source_unless_chosen(script):
    from argparse import Namespace

    def counts(preset, **kw):
        a = Namespace(**{"prompt_source": None, "num_prompts": None, "mix": None, **kw})
        return script.prompt_counts(a, script.settings_of(preset, "prompts"))

    # The preset's mix: ShareGPT's share asks for more than its ~9,500 conversations (all are taken).
    assert counts("smollm2-quality") == {"sharegpt": 16000, "magpie": 16000}
    assert counts("smollm2-quality", prompt_source="magpie") == {"magpie": 32000}
    assert counts("smollm2-quality", prompt_source="sharegpt", num_prompts=500) == {"sharegpt": 500}
    assert counts("smollm2-quality", prompt_source="mix", mix=script._shares("sharegpt=1,magpie=1"), num_prompts=10) == {"sharegpt": 5, "magpie": 5}
    assert counts("smollm2-default") == {"magpie": 32} and counts("smollm2-tiny") == {"magpie": 16}  # CI's presets stay on Magpie


def test_sharegpt_prompts_are_read_as_the_asset_reads_them_and_fitted_to_the_generators_length(script, smollm2_path):
    import asyncio
    from argparse import Namespace

    from eagle_assets.corpus.prompt_formats import ContextFit, sharegpt_prompts
    from eagle_assets.corpus.target import load_tokenizer

    tokenizer = load_tokenizer(smollm2_path)
    a = Namespace(prompt_source="sharegpt", num_prompts=30, mix=None, max_len=1024, no_topics=False)
    figures: dict = {}
    # ShareGPT needs no generator: the client and template Magpie would use stay unused.
    items = asyncio.run(script._prompts(a, script.settings_of("smollm2-quality", "prompts"), None, None, tokenizer, figures))
    expected, _ = sharegpt_prompts(30, 0, "all", ContextFit(tokenizer, 1024, 256))
    assert [(p.prompt_id, p.source) for p in items] == [(p.prompt_id, "sharegpt") for p in expected] and len(items) == 30
    assert figures["sharegpt"]["records"] == 17671 and figures["sharegpt"]["fit_context_tokens"] == 1024


def test_a_shard_fraction_trains_on_that_share_of_every_corpuss_complete_shards(script, tmp_path):
    from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name

    corpora = [tmp_path / "sharegpt", tmp_path / "magpie"]
    for corpus in corpora:
        for i in range(8):
            shard = corpus / "hidden_states" / shard_name(i)
            shard.mkdir(parents=True)
            (shard / SHARD_STATES_FILE).write_bytes(b"")
            if i != 0 or corpus.name == "sharegpt":  # magpie's first shard is an unfinished write
                (shard / SHARD_MANIFEST_FILE).write_text("{}")
    assert script.training_shards(corpora, 1.0) == tuple(str(c / "hidden_states") for c in corpora)
    quarter = [Path(s) for s in script.training_shards(corpora, 0.25)]
    assert [(s.parent.parent.name, s.name) for s in quarter] == [
        ("sharegpt", shard_name(0)),
        ("sharegpt", shard_name(1)),
        ("magpie", shard_name(1)),
        ("magpie", shard_name(2)),
    ]
    assert len(script.training_shards(corpora, 0.01)) == 2  # never less than one shard of each
    for bad in ("0", "1.5", "-0.2"):
        with pytest.raises(SystemExit):
            script.main(["--data", str(tmp_path), "--shard-fraction", bad])
