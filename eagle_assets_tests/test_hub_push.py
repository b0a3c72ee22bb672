"""`eagle-assets push`: a drafter trained on the tiny target (test_train.py's) published to a hub
of the test's own, a local HTTP server answering the hub's API as huggingface_hub calls it and
recording every request; no hub is reachable here.

What is pushed is asserted through huggingface_hub's own types (`CommitOperationAdd`,
`ModelCard`); the checks a push reads are recorded by real Dagster runs in a temporary instance.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, ModelCard

from eagle_assets.defs.common import hash_tree
from eagle_assets.defs.hub import BLOCKING_CHECKS, DRAFTER_KEY, push_checked_drafter, recorded_checks
from eagle_assets.drafter.model_card import target_hub_id
from eagle_assets.hub_push import SGLANG_REVISION, Drafter, branch_operations, check_repo_id, commit_operations, find_drafter, push_drafter, refusals
from eagle_assets.targets.hub import HUB_RECORD
from eagle_assets_tests.drafter.test_train import write_tiny_run
from eagle_assets_tests.http_stub import JsonHandler, StubServer

TARGET_ID = "tiny-org/tiny-llama"
REPO = "my-org/tiny-llama-eagle3"
FILES = ["README.md", "config.json", "model.safetensors"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread) -> Path:
    """The trainer's folder of a drafter exported for vLLM and SGLang, its target pulled from
    the hub (as far as its pull record says): the cards name the target's hub id."""
    from eagle_assets.drafter.train import train

    root = tmp_path_factory.mktemp("trained")
    cfg = write_tiny_run(root, num_samples=8, num_shards=1, max_steps=2, export_engines=("vllm", "sglang"), aux_layer_ids=(1,))
    (Path(cfg.target) / HUB_RECORD).write_text(json.dumps({"repo_id": TARGET_ID, "revision": "0" * 40, "files": {}}))
    train(cfg)
    return Path(cfg.out_dir)


def test_the_cards_name_the_targets_hub_id(trained, tmp_path):
    for engine in ("vllm", "sglang"):
        card = ModelCard.load(trained / f"drafter-{engine}" / "README.md")
        assert card.data.base_model == TARGET_ID and card.data.library_name == engine
        assert card.data.tags == ["eagle3", "speculative-decoding", "draft-model"]
        assert f"# EAGLE-3 drafter for {TARGET_ID}" in card.text and "The target is local" not in card.text
    # a preset's folder names its hub repo; a stand-in or a folder of your own has none
    for name, expected in {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct", "tiny-kimi-k2.5": None, "my-model": None}.items():
        (tmp_path / name).mkdir()
        assert target_hub_id(tmp_path / name) == expected, name
    (tmp_path / "my-model" / "config.json").write_text(json.dumps({"_name_or_path": "org/base"}))
    assert target_hub_id(tmp_path / "my-model") == "org/base"


def test_the_commits_hold_exactly_the_exports(trained, tmp_path):
    drafter = find_drafter(trained)
    assert (drafter.vllm, drafter.sglang, drafter.summary["steps"]) == (trained / "drafter-vllm", trained / "drafter-sglang", 2)
    ops = commit_operations(drafter.vllm)
    assert all(isinstance(op, CommitOperationAdd) for op in ops)
    assert [(op.path_in_repo, op.path_or_fileobj) for op in ops] == [(name, str(drafter.vllm / name)) for name in FILES]
    branch = branch_operations(drafter.vllm, drafter.sglang)
    assert [(type(op), op.path_in_repo) for op in branch] == [(CommitOperationAdd, name) for name in FILES]
    assert [op.path_or_fileobj for op in branch] == [str(drafter.sglang / name) for name in FILES]
    # a file main has and the SGLang export lacks is deleted on the branch
    (drafter.vllm / "notes.txt").write_text("only here")
    try:
        assert [(type(op), op.path_in_repo) for op in branch_operations(drafter.vllm, drafter.sglang)][-1] == (CommitOperationDelete, "notes.txt")
    finally:
        (drafter.vllm / "notes.txt").unlink()
    # the trainer's vLLM export names the same drafter; an export copied elsewhere goes alone
    assert find_drafter(trained / "drafter-vllm") == drafter
    alone = tmp_path / "alone"
    shutil.copytree(drafter.vllm, alone)
    assert find_drafter(alone) == Drafter(tmp_path, alone, None, None)


@pytest.mark.parametrize("repo_id", ["tiny-llama-eagle3", "a/b/c", "/name", "org/", "org/bad name", "org/-x-"])
def test_a_repository_id_of_another_form_is_refused_saying_the_form(repo_id):
    with pytest.raises(ValueError, match=r"is not a hub model id .* give ORG/NAME"):
        check_repo_id(repo_id)


def test_the_blocking_checks_read_are_the_drafters_blocking_checks():
    from eagle_assets.defs.drafter import DRAFTER_CHECKS
    from eagle_assets.drafter.model_card import CARD_FILE
    from eagle_assets.hub_push import CARD_FILE as PUSHED_CARD

    assert BLOCKING_CHECKS == tuple(spec.name for checks in DRAFTER_CHECKS for spec in checks.check_specs if spec.blocking)
    assert PUSHED_CARD == CARD_FILE


def test_refusals(trained, tmp_path):
    drafter = find_drafter(trained)
    passed = dict.fromkeys(BLOCKING_CHECKS, True)
    assert refusals(drafter, passed) == []
    assert refusals(drafter, passed | {"serves_in_vllm": False}) == [
        "blocking check(s) serves_in_vllm failed on this drafter: fix the cause and run `eagle-assets check`"
    ]
    [unchecked] = refusals(drafter, passed | {"sglang_names": None})
    assert unchecked.startswith("no result of the blocking check(s) sglang_names is recorded for these files") and "--unchecked" in unchecked
    assert refusals(drafter, passed | {"sglang_names": None}, allow_unchecked=True) == []
    worse = drafter.__class__(drafter.root, drafter.vllm, drafter.sglang, {"parent_comparison": {"verdict": "worse", "sentence": "AL 2.0 < 2.5"}})
    assert refusals(worse, passed) == ["the fine-tune is clearly worse than its parent (not_worse_than_parent): AL 2.0 < 2.5"]
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in FILES[1:]:
        (bare / name).write_bytes((drafter.vllm / name).read_bytes())
    assert refusals(find_drafter(bare), passed) == [
        f"{bare} has no model card (README.md): the trainer writes one beside each export; train or export again"
    ]


def record_checks(instance: dg.DagsterInstance, vllm_export: Path, outcomes: dict[str, bool]) -> None:
    """A real run of drafter_checkpoint with the data version the asset gives `vllm_export`, and
    its blocking checks passing or failing as `outcomes` says."""

    @dg.asset(key=DRAFTER_KEY)
    def drafter_checkpoint():
        return dg.MaterializeResult(data_version=dg.DataVersion(hash_tree(vllm_export)))

    def check(name: str, passed: bool):
        @dg.asset_check(asset=DRAFTER_KEY, name=name, blocking=True)
        def _check():
            return dg.AssetCheckResult(passed=passed)

        return _check

    result = dg.materialize([drafter_checkpoint, *(check(n, p) for n, p in outcomes.items())], instance=instance, raise_on_error=False)
    assert result.success or not all(outcomes.values())


def test_the_checks_are_read_for_these_exact_files(trained, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_never_sent")
    vllm = trained / "drafter-vllm"
    with dg.DagsterInstance.ephemeral() as instance:
        assert recorded_checks(instance, vllm) == dict.fromkeys(BLOCKING_CHECKS)
        record_checks(instance, vllm, dict.fromkeys(BLOCKING_CHECKS, True) | {"sglang_names": False})
        assert recorded_checks(instance, vllm) == dict.fromkeys(BLOCKING_CHECKS, True) | {"sglang_names": False}
        with pytest.raises(ValueError, match=r"refusing to push .*\n  - blocking check\(s\) sglang_names failed"):
            push_checked_drafter(instance, trained, REPO)
        # checks passing later on other files (a drafter trained since) say nothing about these
        other = tmp_path / "other"
        other.mkdir()
        (other / "config.json").write_text("{}")
        record_checks(instance, other, dict.fromkeys(BLOCKING_CHECKS, True))
        assert recorded_checks(instance, vllm)["sglang_names"] is False
        assert recorded_checks(instance, other) == dict.fromkeys(BLOCKING_CHECKS, True)


class HubHandler(JsonHandler):
    """The hub's API as huggingface_hub's create_repo, create_commit (README validation,
    preupload, commit) and create_branch call it; every request is recorded."""

    requests: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        base = "http://127.0.0.1:%d" % self.server.server_address[1]
        entry = {"path": path, "auth": self.headers.get("Authorization")}
        answer = (404, {"error": f"no route {path}"})
        if path == "/api/repos/create":
            entry["json"] = json.loads(body)
            answer = (200, {"url": f"{base}/{entry['json']['organization']}/{entry['json']['name']}"})
        elif path == "/api/validate-yaml":
            entry["json"] = json.loads(body)
            answer = (200, {})
        elif parts[:2] == ["api", "models"] and parts[4] == "preupload":
            files = json.loads(body)["files"]
            answer = (200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
        elif parts[:2] == ["api", "models"] and parts[4] == "commit":
            entry["lines"] = [json.loads(line) for line in body.splitlines() if line.strip()]
            answer = (200, {"commitUrl": f"{base}/{parts[2]}/{parts[3]}/commit/{parts[5]}", "commitOid": "f" * 40})
        elif parts[:2] == ["api", "models"] and parts[4] == "branch":
            answer = (200, {})
        self.requests.append(entry)  # before answering: the client goes on once answered
        self.send_json(*answer)


@pytest.fixture
def hub():
    HubHandler.requests = []
    server = StubServer(HubHandler)
    yield server, HubHandler.requests
    server.close()


def committed(requests: list, revision: str) -> dict[str, bytes]:
    """{path: bytes} of the commit made to `revision` (the hub's ndjson: a header, then a line a file)."""
    [commit] = [r for r in requests if r["path"] == f"/api/models/{REPO}/commit/{revision}"]
    assert commit["lines"][0]["key"] == "header"
    return {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in commit["lines"][1:] if line["key"] == "file"}


def assert_pushed(requests: list, trained: Path, token: str) -> None:
    assert [r["path"] for r in requests] == [
        "/api/repos/create",
        "/api/validate-yaml",
        f"/api/models/{REPO}/preupload/main",
        f"/api/models/{REPO}/commit/main",
        f"/api/models/{REPO}/branch/{SGLANG_REVISION}",
        "/api/validate-yaml",
        f"/api/models/{REPO}/preupload/{SGLANG_REVISION}",
        f"/api/models/{REPO}/commit/{SGLANG_REVISION}",
    ]
    assert {r["auth"] for r in requests} == {f"Bearer {token}"}
    assert requests[0]["json"]["organization"] == "my-org" and requests[0]["json"]["name"] == "tiny-llama-eagle3"
    for revision, engine in (("main", "vllm"), (SGLANG_REVISION, "sglang")):
        assert committed(requests, revision) == {name: (trained / f"drafter-{engine}" / name).read_bytes() for name in FILES}
    assert requests[1]["json"]["content"] == (trained / "drafter-vllm" / "README.md").read_text()


def test_push_to_a_local_hub(trained, hub):
    server, requests = hub
    commits = push_drafter(find_drafter(trained), REPO, token="hf_test_token", endpoint=server.url, log=lambda m: None)
    assert commits == {"vllm": f"{server.url}/{REPO}/commit/main", "sglang": f"{server.url}/{REPO}/commit/{SGLANG_REVISION}"}
    assert_pushed(requests, trained, "hf_test_token")


class RefusingHub(JsonHandler):
    """A hub that takes the token for one without write access."""

    def do_POST(self):
        self.send_json(401, {"error": "Invalid credentials in Authorization header"})

    do_GET = do_POST


def test_the_hubs_refusal_of_the_token_is_said_plainly(trained):
    server = StubServer(RefusingHub)
    try:
        with pytest.raises(
            RuntimeError, match=rf"the hub refused the token for {REPO} \(HTTP 401\): give HF_TOKEN a token with write access to my-org"
        ):
            push_drafter(find_drafter(trained), REPO, token="hf_read_only", endpoint=server.url, log=lambda m: None)
    finally:
        server.close()


def push_command(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
        "HF_HOME": str(tmp_path / "hf"),
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    return subprocess.run([sys.executable, "-m", "eagle_assets.cli", "push", *args], env=base | env, capture_output=True, text=True, timeout=120)


def test_the_command_pushes_a_checked_drafter_and_says_what_is_missing(trained, hub, tmp_path):
    server, requests = hub
    done = push_command(tmp_path, str(trained), REPO)
    assert done.returncode == 1 and "no Hugging Face token: set HF_TOKEN" in done.stderr and "hf auth login" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and requests == []
    done = push_command(tmp_path, str(trained), "tiny-llama-eagle3", HF_TOKEN="hf_cli_token", HF_ENDPOINT=server.url)
    assert done.returncode == 1 and "repository id 'tiny-llama-eagle3' is not a hub model id" in done.stderr and "give ORG/NAME" in done.stderr
    assert "Traceback" not in done.stderr and requests == []

    from eagle_assets.defs.runner import ensure_dagster_home

    os.environ["DAGSTER_HOME"], before = str(tmp_path / "home"), os.environ.get("DAGSTER_HOME")
    try:
        ensure_dagster_home()
        with dg.DagsterInstance.get() as instance:
            record_checks(instance, trained / "drafter-vllm", dict.fromkeys(BLOCKING_CHECKS, True))
    finally:
        os.environ.pop("DAGSTER_HOME") if before is None else os.environ.update(DAGSTER_HOME=before)
    done = push_command(tmp_path, str(trained), REPO, HF_TOKEN="hf_cli_token", HF_ENDPOINT=server.url)
    assert done.returncode == 0, done.stderr
    assert_pushed(requests, trained, "hf_cli_token")
    assert f'"model": "{REPO}", "num_speculative_tokens": 3' in done.stdout
    assert f"--speculative-draft-model-path {REPO} --speculative-draft-model-revision sglang" in done.stdout


@pytest.mark.engine
@pytest.mark.slow
def test_the_graphs_drafter_goes_to_the_hub_on_its_recorded_checks(materialized_graph, hub, monkeypatch):
    """The drafter of the session's graph run (the embedded SmolLM2, smollm2-tiny): its card names
    the target's hub id, its blocking checks are the run's own records, its benchmark's figures
    joined the training's TensorBoard run, and it is pushed to the local hub."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from eagle_assets.drafter.trackers import benchmark_scalars, read_record
    from eagle_assets.targets import EMBEDDED_TARGET

    instance, data, _ = materialized_graph
    server, requests = hub
    drafter = find_drafter(data / EMBEDDED_TARGET / "drafter")
    assert ModelCard.load(drafter.vllm / "README.md").data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert recorded_checks(instance, drafter.vllm) == dict.fromkeys(BLOCKING_CHECKS, True)

    record = read_record(drafter.root)
    assert record == {"kind": "tensorboard", "log_dir": str(drafter.root / "tensorboard")}
    [report] = instance.fetch_materializations(dg.AssetKey("benchmark_report"), limit=1).records
    assert report.asset_materialization.metadata["tracker"].value == record
    figures = benchmark_scalars(json.loads((data / EMBEDDED_TARGET / "report" / "report.json").read_text()))
    events = EventAccumulator(record["log_dir"], size_guidance={"scalars": 0})
    events.Reload()
    assert figures and {k: events.Scalars(k)[-1].step for k in figures} == dict.fromkeys(figures, drafter.summary["steps"])
    assert {k: events.Scalars(k)[-1].value for k in figures} == pytest.approx(figures, rel=1e-6)

    monkeypatch.setenv("HF_TOKEN", "hf_graph_token")
    commits = push_checked_drafter(instance, drafter.root, REPO, endpoint=server.url, log=lambda m: None)
    assert set(commits) == {"vllm"} | ({"sglang"} if drafter.sglang else set())
    assert committed(requests, "main") == {name: (drafter.vllm / name).read_bytes() for name in FILES}
