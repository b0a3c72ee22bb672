"""`eagle-assets target pull ORG/NAME`: a hub target through the real CLI and huggingface_hub's
own snapshot_download, from a Hugging Face cache built in tmp (no hub is reachable here).

Each pull runs as its own process, as a user runs it: huggingface_hub reads HF_HOME,
HF_HUB_OFFLINE and HF_ENDPOINT once, when it is imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from eagle_assets.targets import read_target_config
from eagle_assets.targets.hub import HUB_RECORD, is_pulled
from eagle_assets_tests.http_stub import JsonHandler, StubServer

REPO = "tiny-org/tiny-deepseek-v3"
REVISION = "0123456789abcdef0123456789abcdef01234567"
WANTED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors")
# What a hub repo also holds and a target must not take: other weight formats, the original/
# checkpoint, the model card.
UNWANTED = ("pytorch_model.bin", "model.gguf", "original/params.json", "original/consolidated.00.pth", "README.md")


def hub_cache(hf_home: Path, model: Path) -> Path:
    """A Hugging Face cache holding REPO at REVISION as huggingface_hub lays it out: blobs named
    by content, a snapshot of links to them, refs/main naming the revision."""
    repo = hf_home / "hub" / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    for i, name in enumerate(WANTED + UNWANTED):
        blob = repo / "blobs" / f"{i:040x}"
        if name in WANTED:
            shutil.copyfile(model / name, blob)
        else:
            blob.write_bytes(b"not for a target")
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(os.path.relpath(blob, (snapshot / name).parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return base | {"HF_HOME": str(tmp_path / "hf"), "EAGLE_ASSETS_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"} | extra


PULL = [sys.executable, "-m", "eagle_assets.cli", "target", "pull", REPO]


def pull(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(PULL, env=env(tmp_path, **extra), capture_output=True, text=True, timeout=120)


@pytest.fixture
def populated(tmp_path, standin_paths):
    hub_cache(tmp_path / "hf", standin_paths["tiny-deepseek-v3"])
    return tmp_path


def test_offline_without_the_model_in_the_cache_says_how_to_fix_it(tmp_path):
    done = pull(tmp_path, HF_HUB_OFFLINE="1")
    assert done.returncode == 1, done.stderr
    assert f"{REPO} is not in the Hugging Face cache" in done.stderr and "HF_HUB_OFFLINE=1" in done.stderr
    assert "unset HF_HUB_OFFLINE on a host that reaches the hub" in done.stderr and "--target PATH" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "cache" / "targets" / "tiny-org--tiny-deepseek-v3").exists()


def test_an_unreachable_hub_fails_fast_naming_the_endpoint(tmp_path):
    start = time.monotonic()
    done = pull(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - start < 15  # interpreter start included; the refusal itself is immediate
    assert "could not reach the Hugging Face hub at http://127.0.0.1:9" in done.stderr and "HF_ENDPOINT" in done.stderr
    assert "Traceback" not in done.stderr


class GatedHub(JsonHandler):
    """A hub that refuses every request as it refuses a gated repo to a client without a token."""

    def do_GET(self):
        data = b'{"error": "Access to model tiny-org/tiny-deepseek-v3 is restricted. You must have access to it and be authenticated."}'
        self.send_response(401)
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_gated_repo_names_hf_token(tmp_path):
    hub = StubServer(GatedHub)
    try:
        done = pull(tmp_path, HF_ENDPOINT=hub.url)
    finally:
        hub.close()
    assert done.returncode == 1, done.stderr
    assert f"{REPO} on {hub.url} refused access (gated or private, HTTP 401)" in done.stderr
    assert "set HF_TOKEN to a token of an account that has accepted the model's license" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_pull_from_the_cache_lands_the_target_files_and_leaves_the_rest(populated, monkeypatch):
    done = pull(populated, HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    folder = populated / "cache" / "targets" / "tiny-org--tiny-deepseek-v3"
    assert done.stdout.strip().splitlines()[-1] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(WANTED + (HUB_RECORD,))
    blobs = populated / "hf" / "hub" / "models--tiny-org--tiny-deepseek-v3" / "blobs"
    assert (folder / "model.safetensors").read_bytes() == (blobs / f"{WANTED.index('model.safetensors'):040x}").read_bytes()
    assert read_target_config(folder / "config.json")["architectures"] == ["DeepseekV3ForCausalLM"]
    assert is_pulled(folder)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tiny-org--tiny-deepseek-v3-")]  # no staging left

    again = pull(populated, HF_HUB_OFFLINE="1")
    assert again.returncode == 0 and "present at" in again.stdout

    # The pulled hub id is a target by that id from now on, its preset matched by shape.
    from eagle_assets.targets.embedded import resolve_target

    monkeypatch.setenv("EAGLE_ASSETS_CACHE", str(populated / "cache"))
    preset, resolved = resolve_target(REPO, log=lambda m: None)
    assert (preset.name, resolved) == ("tiny-deepseek-v3", folder)


def test_a_missing_file_of_a_pulled_folder_makes_it_pull_again(populated):
    assert pull(populated, HF_HUB_OFFLINE="1").returncode == 0
    folder = populated / "cache" / "targets" / "tiny-org--tiny-deepseek-v3"
    (folder / "tokenizer.json").unlink()
    assert not is_pulled(folder)
    done = pull(populated, HF_HUB_OFFLINE="1")
    assert done.returncode == 0 and "ready at" in done.stdout and (folder / "tokenizer.json").is_file()


def test_two_concurrent_pulls_both_succeed_and_the_work_is_done_once(populated):
    """Both start while a lock holder (this test) keeps them waiting, so they really overlap;
    released, one pulls and the other then finds the target present."""
    lock_file = populated / "cache" / "targets" / ".tiny-org--tiny-deepseek-v3.lock"
    lock_file.parent.mkdir(parents=True)
    logs = [populated / f"pull{i}.log" for i in range(2)]
    with FileLock(lock_file):
        procs = [subprocess.Popen(PULL, env=env(populated, HF_HUB_OFFLINE="1"), stdout=open(log, "w"), stderr=subprocess.STDOUT) for log in logs]
        deadline = time.monotonic() + 60
        while not all("waiting for another run" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [log.read_text() for log in logs]
            time.sleep(0.1)
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [log.read_text() for log in logs]
    outputs = [log.read_text() for log in logs]
    assert all(str(lock_file) in out for out in outputs)
    assert sorted("ready at" in out for out in outputs) == [False, True]
    assert sorted("present at" in out for out in outputs) == [False, True]
    assert is_pulled(populated / "cache" / "targets" / "tiny-org--tiny-deepseek-v3")
