"""Drafter and target folders that must not be served: refused with the file named and the fix.

An export for the other engine (its layer ids count differently), and configs or weights that
are corrupt, truncated or incomplete. Real files in tmp_path, a tiny drafter and target; the
engines' own validation is left out (no engine environment), only our checks run.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.export import export_sglang, export_vllm, load_drafter
from eagle_assets.engines.preflight import PreflightReport, check_drafter, preflight
from eagle_assets.engines.vllm_launch import speculative_config, vllm_drafter_config
from eagle_assets.targets.embedded import resolve_target, verify
from eagle_assets_tests.drafters import TINY_TARGET_CONFIG

# The target tiny_config's drafter was made for: 4 layers, hidden 64, vocabulary 256.
TARGET_CONFIG = TINY_TARGET_CONFIG


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Path:
    """A training run's output folder with both exports of one drafter: drafter-vllm/, drafter-sglang/."""
    from eagle_assets.drafter.model import Eagle3Drafter

    out = tmp_path_factory.mktemp("run")
    cfg = tiny_config()
    model = Eagle3Drafter(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[: cfg.draft_vocab_size] = True
    model.set_vocab_mapping(torch.zeros(cfg.draft_vocab_size, dtype=torch.long), t2d)
    export_vllm(model, cfg, out / "drafter-vllm")
    export_sglang(model, cfg, out / "drafter-sglang")
    return out


@pytest.fixture
def target(tiny_target) -> Path:
    return tiny_target


@pytest.fixture
def copy_of(tmp_path, exports):
    """A copy of one export to spoil, in its own run folder."""

    def copy(engine: str) -> Path:
        folder = tmp_path / "copy" / f"drafter-{engine}"
        folder.mkdir(parents=True)
        for f in (exports / f"drafter-{engine}").iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        return folder

    return copy


def our_checks(target: Path, drafter: Path, engine: str, tmp_path: Path, monkeypatch) -> PreflightReport:
    """`preflight` without the engines' own validation: no vLLM venv, no SGLang venv."""
    monkeypatch.delenv("EAGLE_ASSETS_SGLANG_VENV", raising=False)
    return preflight(target, drafter, engine, venv=tmp_path / "no-engine-venv")


def errors(report: PreflightReport) -> dict[str, str]:
    return {f.code: f.message for f in report.errors()}


def files_under(folder: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@contextmanager
def nothing_written_or_deleted(*folders: Path):
    before = [files_under(f) for f in folders]
    yield
    assert [files_under(f) for f in folders] == before


# ---------------------------------------------------------------------------------------------
# an export for the other engine
# ---------------------------------------------------------------------------------------------


def test_the_sglang_export_is_refused_for_vllm_and_the_vllm_export_names_the_fix(exports, target, tmp_path, monkeypatch):
    sglang, vllm = exports / "drafter-sglang", exports / "drafter-vllm"
    with nothing_written_or_deleted(exports, target):
        report = our_checks(target, sglang, "vllm", tmp_path, monkeypatch)
        with pytest.raises(ValueError) as launch:
            speculative_config(sglang, 3)  # `eagle-assets bench` serves without preflight
        with pytest.raises(ValueError) as read_for_vllm:
            vllm_drafter_config(sglang)
    expected = f"{sglang}/config.json is the SGLang export (layer ids numbered for SGLang); vLLM would read the wrong target layers: pass {vllm}"
    assert not report.ok and errors(report)["drafter_numbering"] == expected
    assert str(launch.value) == expected and str(read_for_vllm.value) == expected


def test_the_vllm_export_is_refused_for_sglang(exports, target, tmp_path, monkeypatch):
    sglang, vllm = exports / "drafter-sglang", exports / "drafter-vllm"
    with nothing_written_or_deleted(exports, target):
        report = our_checks(target, vllm, "sglang", tmp_path, monkeypatch)
    assert errors(report)["drafter_numbering"] == (
        f"{vllm}/config.json is the vLLM export (layer ids numbered for vLLM); SGLang would read the wrong target layers: pass {sglang}"
    )


def test_each_export_passes_for_its_own_engine(exports, target, tmp_path, monkeypatch):
    vllm_report = our_checks(target, exports / "drafter-vllm", "vllm", tmp_path, monkeypatch)
    sglang_report = our_checks(target, exports / "drafter-sglang", "sglang", tmp_path, monkeypatch)
    assert vllm_report.ok and sglang_report.ok, vllm_report.render() + sglang_report.render()
    assert speculative_config(exports / "drafter-vllm", 3)["model"] == str(exports / "drafter-vllm")


def test_without_the_other_export_beside_it_the_fix_says_where_training_writes_it(copy_of, target, tmp_path, monkeypatch):
    sglang = copy_of("sglang")
    report = our_checks(target, sglang, "vllm", tmp_path, monkeypatch)
    assert errors(report)["drafter_numbering"].endswith(f"pass the drafter's vLLM export (training writes it as {sglang.parent / 'drafter-vllm'})")


def test_a_folder_without_the_marker_is_taken_as_vllm_numbered_as_before(copy_of, target, tmp_path, monkeypatch):
    folder = copy_of("vllm")
    config = json.loads((folder / "config.json").read_text())
    del config["layer_id_numbering"]
    (folder / "config.json").write_text(json.dumps(config))
    assert our_checks(target, folder, "vllm", tmp_path, monkeypatch).ok
    assert "drafter_numbering" not in errors(our_checks(target, folder, "sglang", tmp_path, monkeypatch))
    assert speculative_config(folder, 3)["method"] == "eagle3"


def test_check_drafter_without_an_engine_checks_no_numbering(exports):
    report = PreflightReport()
    check_drafter(TARGET_CONFIG, exports / "drafter-sglang", report)
    assert report.ok, report.render()


# ---------------------------------------------------------------------------------------------
# malformed drafter files
# ---------------------------------------------------------------------------------------------

SPOILED_CONFIGS = {
    "corrupt JSON": b'{"architectures": ["LlamaForCausalLMEagle3"],\n',
    "a list": b'["LlamaForCausalLMEagle3"]',
    "binary garbage": bytes(range(128, 256)),
}


@pytest.mark.parametrize("spoil", SPOILED_CONFIGS, ids=list(SPOILED_CONFIGS))
def test_a_spoiled_drafter_config_is_named_by_every_reader(spoil, copy_of, target, tmp_path, monkeypatch):
    folder = copy_of("vllm")
    path = folder / "config.json"
    path.write_bytes(SPOILED_CONFIGS[spoil])
    with nothing_written_or_deleted(folder, target):
        report = our_checks(target, folder, "vllm", tmp_path, monkeypatch)
        with pytest.raises(ValueError, match="re-export the drafter") as loading:
            load_drafter(folder)
        with pytest.raises(ValueError, match="re-export the drafter") as launching:
            speculative_config(folder, 3)
    assert errors(report)["drafter_config_unreadable"].startswith(f"{path}: the drafter's config ")
    assert str(loading.value).startswith(f"{path}: ") and str(launching.value).startswith(f"{path}: ")
    assert report.engine == {}  # the engine's validation did not run on a file it would crash on


def test_a_drafter_config_without_a_required_key_is_named_with_the_key(copy_of):
    folder = copy_of("vllm")
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"no 'hidden_size'") as loading:
        load_drafter(folder)
    assert str(loading.value).startswith(f"{folder / 'config.json'}: ")


def garbage(path: Path) -> None:
    path.write_bytes(b"\xff" * 4096)  # the first 8 bytes announce a header of 2**64 - 1 bytes


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # header intact, data cut


def header_not_json(path: Path) -> None:
    path.write_bytes((16).to_bytes(8, "little") + b"not json at all!" + b"\0" * 64)


@pytest.mark.parametrize("spoil", [garbage, truncated, header_not_json])
def test_spoiled_weights_are_named_by_preflight_and_load(spoil, copy_of, target, tmp_path, monkeypatch):
    folder = copy_of("vllm")
    path = folder / "model.safetensors"
    spoil(path)
    with nothing_written_or_deleted(folder, target):
        report = our_checks(target, folder, "vllm", tmp_path, monkeypatch)
        with pytest.raises(ValueError, match="not a safetensors file|truncated") as loading:
            load_drafter(folder)
    message = errors(report)["drafter_weights_unreadable"]
    assert message.startswith(f"{path}: ") and "re-export the drafter" in message
    assert str(loading.value).startswith(f"{path}: ")


# ---------------------------------------------------------------------------------------------
# malformed target config
# ---------------------------------------------------------------------------------------------


def test_a_corrupt_target_config_is_named(exports, target, tmp_path, monkeypatch):
    path = target / "config.json"
    path.write_text('{"num_hidden_layers": 4,\n')
    with nothing_written_or_deleted(target):
        with pytest.raises(ValueError, match="not valid JSON") as resolving:
            resolve_target(target, log=lambda m: None)
        report = our_checks(target, exports / "drafter-vllm", "vllm", tmp_path, monkeypatch)
    assert str(resolving.value).startswith(f"{path}: the target's config is not valid JSON")
    assert errors(report)["target_unreadable"].startswith(f"{path}: ")


def test_a_target_config_without_vocab_size_is_named_with_the_key(exports, target, tmp_path, monkeypatch):
    path = target / "config.json"
    path.write_text(json.dumps({k: v for k, v in TARGET_CONFIG.items() if k != "vocab_size"}))
    expected = f"{path}: no vocab_size, so not a complete Hugging Face model config: copy the model's config.json again"
    with pytest.raises(ValueError) as resolving:
        resolve_target(target, log=lambda m: None)
    assert str(resolving.value) == expected
    assert errors(our_checks(target, exports / "drafter-vllm", "vllm", tmp_path, monkeypatch))["target_unreadable"] == expected


def test_a_corrupt_checksum_record_leaves_the_embedded_target_unverified(tmp_path):
    (tmp_path / "eagle_assets.sha256.json").write_text("{")
    assert verify(tmp_path) is False  # `pull` then converts again and rewrites the record
