"""Scheduled retraining on the real graph, with a real daemon ticking.

The session is the one `eagle-assets ui --preset smollm2-tiny --config run.yaml` holds, its
automation on as by default (evaluated every 5 s here: EAGLE_ASSETS_AUTOMATION_INTERVAL_S), with a watched prompt folder (EAGLE_ASSETS_PROMPTS_URL), over a copy
of the graph the shared fixture built (`materialized_graph`), so the runs here change nothing that
other tests read. Its code location loads a copy of the project's package, so that a test can
edit the code it runs without touching the checkout.

* A prompt file of two prompts lies in the folder when the session starts. The `new_prompt_files`
  sensor turns it into a run of `prompts` and `synthetic_corpus`; the automation then rebuilds,
  tick by tick, what the corpus's new content makes stale: the vocabulary and the shards (only
  the shards the new samples fall in are extracted), the drafter, the benchmark. Each asset is
  rebuilt once, every check passes, and everything ends fresh.
* Docstrings and comments edited in the modules of every stage, and one setting changed in the
  run file, then "Reload definitions": the automation's next request is that setting's asset
  alone (the edits make nothing stale). Its setting names a parent drafter that does not exist,
  so its run fails; Dagster retries it once (the automation's `dagster/max_retries`), the retry
  fails too, and the asset is not requested again until something changes (docs/design.md).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.defs.session import FINISHED, IN_FLIGHT, DagsterSession, run_error
from eagle_assets.paths import PROJECT_ROOT, cache_dir, engine_venv, runs_dir
from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets_tests.graph_runs import ASSETS, copy_graph, every_check, failed_checks, run_outcome

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROMPTS = ["Name two rivers of Europe and the sea each one ends in.", "Write two sentences thanking a neighbour for watering the garden."]
RETRAIN_S = 1500
"""The whole chain below the corpus on two shared cores: vLLM started three times, training."""
WAIT_S = 300
AUTOMATION_SENSOR = "eagle3_automation"
TICKS_QUERY = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { ticks(limit: 50) { tickId status timestamp endTimestamp requestedAssetKeys { path } runIds } } }
  }
}
"""
DESCRIPTIONS_QUERY = "{ assetNodes { assetKey { path } description opVersion } }"


@dataclass
class Retraining:
    session: DagsterSession
    code: Path
    """The package copy the code location loads."""
    run_file: Path
    data: Path
    before: set[str]
    """The runs the copied instance held before the session started."""
    graph_data: Path
    """The shared graph's own data folder (never written here)."""

    def new_runs(self) -> list[dg.DagsterRun]:
        """The runs of this session, oldest first."""
        return [r for r in reversed(self.session.instance.get_runs()) if r.run_id not in self.before]


def _code_copy(dest: Path) -> tuple[Path, Path]:
    """The package copied under `dest` (its shipped data linked) and a workspace file whose code
    location (named as the project's) loads it; returns (package folder, workspace file)."""
    root = dest / "code"
    shutil.copytree(PROJECT_ROOT / "eagle_assets", root / "eagle_assets", ignore=shutil.ignore_patterns("__pycache__", "data"))
    (root / "eagle_assets" / "data").symlink_to(PROJECT_ROOT / "eagle_assets" / "data")
    workspace = dest / "workspace.yaml"
    workspace.write_text(
        f"load_from:\n  - python_module:\n      module_name: eagle_assets.definitions\n      working_directory: {root}\n"
        "      location_name: eagle_assets\n"
    )
    return root / "eagle_assets", workspace


def _ticks(session: DagsterSession) -> list[dict]:
    """The automation sensor's ticks, oldest first."""
    selector = {"repositoryLocationName": session.location, "repositoryName": session.repository, "sensorName": AUTOMATION_SENSOR}
    out = session.graphql(TICKS_QUERY, {"selector": selector})["sensorOrError"]
    assert out["__typename"] == "Sensor", out
    return sorted(out["sensorState"]["ticks"], key=lambda t: t["timestamp"])


def _requested(tick: dict) -> list[str]:
    return sorted("/".join(k["path"]) for k in tick["requestedAssetKeys"])


def _wait_for(what: str, probe, timeout_s: float, session: DagsterSession):
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s; the session's log ends:\n{session.log_tail(40)}")
        time.sleep(3)


def _corpus_rows(data: Path) -> int:
    from eagle_assets.corpus.store import CorpusStore

    return CorpusStore(str(data / EMBEDDED_TARGET / "corpus"), mode="r").num_rows


@pytest.fixture(scope="module")
def retraining(materialized_graph, tmp_path_factory):
    """The session over the copy, once the prompt file's retraining has settled: the last
    asset rebuilt and no run queued or going. A failed run fails the fixture, naming its error."""
    from eagle_assets.defs.sensors import AUTOMATION_ENV, AUTOMATION_INTERVAL_ENV, MIN_AUTOMATION_INTERVAL_S
    from eagle_assets.defs.settings import PRESET_ENV, RUN_FILE_ENV

    root = tmp_path_factory.mktemp("retraining")
    home, data = copy_graph(materialized_graph, root)
    code, workspace = _code_copy(root)
    incoming = root / "incoming"
    incoming.mkdir()
    (incoming / "week1.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    run_file = root / "run.yaml"
    run_file.write_text("preset: smollm2-tiny\n")
    env = {
        "EAGLE_ASSETS_DATA": str(data),
        PRESET_ENV: "smollm2-tiny",
        RUN_FILE_ENV: str(run_file),
        "EAGLE_ASSETS_PROMPTS_URL": str(incoming),
        AUTOMATION_ENV: "1",
        AUTOMATION_INTERVAL_ENV: str(MIN_AUTOMATION_INTERVAL_S),  # each step requested within seconds, not half a minute
        # The package copy would look for these beside itself: the checkout's own.
        "EAGLE_ASSETS_CACHE": str(cache_dir()),
        "EAGLE_ASSETS_VLLM_VENV": str(engine_venv("vllm")),
        "EAGLE_ASSETS_RUNS": str(runs_dir()),
    }
    with dg.DagsterInstance.from_config(str(home)) as copied:
        before = {r.run_id for r in copied.get_runs()}
    command = "eagle-assets ui --preset smollm2-tiny --config run.yaml (test)"
    with DagsterSession(home, data, env=env, workspace=workspace, log=lambda m: None, command=command) as session:
        state = Retraining(session, code, run_file, data, before, materialized_graph[1])

        def settled():
            runs = state.new_runs()
            for run in runs:
                if run.status in FINISHED and run.status != dg.DagsterRunStatus.SUCCESS:
                    pytest.fail(
                        f"run {run.run_id} of {sorted(k.to_user_string() for k in run.asset_selection or ())} {run_error(session.instance, run)}"
                    )
            latest = session.instance.get_latest_materialization_event(dg.AssetKey("benchmark_report"))
            rebuilt = latest is not None and latest.run_id in {r.run_id for r in runs}
            return rebuilt and not any(r.status in IN_FLIGHT for r in runs)

        _wait_for("the prompt file's retraining down to benchmark_report", settled, RETRAIN_S, session)
        yield state


def test_a_new_prompt_file_rebuilds_the_corpus_and_everything_below_it_once(retraining):
    from eagle_assets.defs.sensors import AUTOMATION_RUN_TAGS, RETRAIN_TAG

    instance = retraining.session.instance
    runs = retraining.new_runs()
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    first, *automation = runs
    # The sensor's run: the prompt file's prompts, and the corpus answering them.
    assert first.tags[RETRAIN_TAG].startswith("prompts-week1.jsonl-")
    assert {k.to_user_string() for k in first.asset_selection} == {"prompts", "synthetic_corpus"}
    # Then the automation's, each retried once on failure, down the graph.
    assert automation and all(AUTOMATION_RUN_TAGS.items() <= r.tags.items() for r in automation), [r.tags for r in automation]
    outcomes = {r.run_id: run_outcome(instance, r.run_id) for r in runs}
    built = [a for materialised, _ in outcomes.values() for a in materialised]
    assert sorted(built) == sorted(ASSETS)  # each asset once
    order = {a: i for i, r in enumerate(runs) for a in outcomes[r.run_id][0]}
    from eagle_assets.defs.runner import DEPENDS

    assert all(order[parent] <= order[a] for a in ASSETS for parent in DEPENDS[a]), order  # in its parents' run or after it
    checks = {k: e for _, c in outcomes.values() for k, e in c.items()}
    assert set(checks) == every_check()
    assert not failed_checks(checks), {k: (e.passed, e.severity, e.metadata) for k, e in failed_checks(checks).items()}

    # The corpus kept its samples and answered the new prompts; only the shards those fell in were extracted.
    assert _corpus_rows(retraining.data) == _corpus_rows(retraining.graph_data) + len(PROMPTS)
    shards = instance.get_latest_materialization_event(dg.AssetKey("hidden_state_shards")).asset_materialization.metadata
    extracted, kept = shards["shards_extracted"].value, shards["shards_kept"].value
    assert 1 <= extracted <= len(PROMPTS) and extracted + kept == shards["shards"].value, (extracted, kept)
    stale = retraining.session.stale()
    assert stale == {a: ("FRESH", []) for a in ASSETS}, stale


EDITS = {
    # module: (text, the same with its docstring or comment changed)
    "defs/hidden_states.py": (
        "    in NUM_SHARDS shards (bf16 safetensors + JSON manifest), each written atomically; a rerun",
        "    in NUM_SHARDS shards (bf16 safetensors with a JSON manifest), each written atomically; a rerun",
    ),
    "hidden_states/extract.py": ('"""The target\'s forward pass over the corpus,', '"""The target\'s forward pass, over the corpus,'),
    "corpus/store.py": ("\n\nfrom __future__", "\n# (a comment added to the corpus store)\n\nfrom __future__"),
    "drafter/train.py": ("\n\nfrom __future__", "\n# (a comment added to the trainer)\n\nfrom __future__"),
    "bench/benchmark.py": ("\n\nfrom __future__", "\n# (a comment added to the benchmark)\n\nfrom __future__"),
}


def test_docstring_edits_rebuild_nothing_and_a_failed_automation_run_is_retried_once_then_left(retraining):
    session, instance = retraining.session, retraining.session.instance
    versions = {"/".join(n["assetKey"]["path"]): n["opVersion"] for n in session.graphql(DESCRIPTIONS_QUERY)["assetNodes"]}
    for module, (old, new) in EDITS.items():
        path = retraining.code / module
        text = path.read_text()
        assert text.count(old) == 1, (module, old)
        path.write_text(text.replace(old, new))
    missing = retraining.run_file.parent / "no-such-drafter"
    retraining.run_file.write_text(f"preset: smollm2-tiny\nvocab_mapping: {{parent_drafter: {missing}}}\n")
    known = {r.run_id for r in retraining.new_runs()}
    reloaded = session.graphql('mutation { reloadRepositoryLocation(repositoryLocationName: "eagle_assets") { __typename } }')
    assert reloaded["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", reloaded

    def edited():
        nodes = {"/".join(n["assetKey"]["path"]): n for n in session.graphql(DESCRIPTIONS_QUERY)["assetNodes"]}
        return nodes if "bf16 safetensors with a JSON manifest" in (nodes["hidden_state_shards"]["description"] or "") else None

    nodes = _wait_for("the edited code in the UI", edited, WAIT_S, session)  # the location loads the package copy
    reloaded_at = time.time()
    # The edits change no code version; the run file's setting changes vocab_mapping's alone.
    assert {a: n["opVersion"] for a, n in nodes.items() if a != "vocab_mapping"} == {a: v for a, v in versions.items() if a != "vocab_mapping"}
    assert nodes["vocab_mapping"]["opVersion"] != versions["vocab_mapping"]

    def first_request():
        asked = [t for t in _ticks(session) if t["timestamp"] > reloaded_at and t["status"] == "SUCCESS" and t["requestedAssetKeys"]]
        return asked[0] if asked else None

    tick = _wait_for("the automation's request after the reload", first_request, WAIT_S, session)
    assert _requested(tick) == ["vocab_mapping"]

    def failed_and_retried():
        runs = [r for r in retraining.new_runs() if r.run_id not in known]
        done = [r for r in runs if r.status in FINISHED]
        return runs if len(done) == 2 and len(runs) == 2 else None

    first, retry = _wait_for("the failed run and its one retry", failed_and_retried, WAIT_S, session)
    assert retry.tags.get("dagster/parent_run_id") == first.run_id and retry.tags.get("dagster/retry_number") == "1", retry.tags
    for run in (first, retry):
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert {k.to_user_string() for k in run.asset_selection} == {"vocab_mapping"}
        assert f"drafter {missing}: no config.json there" in run_error(instance, run)
    ended = instance.get_run_record_by_id(retry.run_id).end_time

    # Not requested again until something changes: the next tick that starts after the retry failed asks for nothing.
    later = _wait_for(
        "an automation tick after the retry", lambda: [t for t in _ticks(session) if t["timestamp"] > ended and t["endTimestamp"]], WAIT_S, session
    )
    assert [_requested(t) for t in later] == [[]] * len(later)
    assert [r.run_id for r in retraining.new_runs() if r.run_id not in known] == [first.run_id, retry.run_id]
    stale = session.stale()
    assert stale["vocab_mapping"] == ("STALE", ["has a new code version"]), stale
    assert {a: s for a, (s, _) in stale.items() if a != "vocab_mapping"} == {a: "FRESH" for a in ASSETS - {"vocab_mapping"}}
