"""`eagle-assets run`: the graph (or its parts, or only what is stale) as runs of a Dagster session.

The command starts a session (defs/session.py: the web UI, the daemon and their code server, for
its own duration, holding the instance and the data folder) whose code location has the run's
settings as the assets' defaults (defs/settings.py), then launches the assets as one run of
Dagster's asset job through the UI's own API, and waits for it. The run is queued in the
instance's run queue and launched by the daemon, exactly as "Materialize all" in the UI is.

* The whole graph (or `--part`s): one run of their assets, in graph order. A rerun after a
  failure keeps what is finished: `prompts` made from the same inputs, every corpus sample, every
  shard that matches the corpus, the drafter's checkpoints.
* `--stale-only`: only what the UI calls stale or missing, in waves: Dagster's staleness is not
  transitive (a child turns stale once its parent is rebuilt with new content), so after each
  run the UI's status is asked again, until nothing selected is stale.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import dagster as dg

from eagle_assets.defs.session import FRESH, MISSING, SESSION_TAG, STALE, DagsterSession
from eagle_assets.defs.settings import session_environment
from eagle_assets.paths import PROJECT_ROOT, data_dir

DEFAULT_PRESET = "smollm2-default"
GRAPH = ["prompts", "synthetic_corpus", "vocab_mapping", "hidden_state_shards", "benchmark_reference", "drafter_checkpoint", "benchmark_report"]
"""Every asset, in graph order."""
DEPENDS = {
    "prompts": [],
    "synthetic_corpus": ["prompts"],
    "vocab_mapping": ["synthetic_corpus"],
    "hidden_state_shards": ["synthetic_corpus"],
    "benchmark_reference": ["hidden_state_shards"],
    "drafter_checkpoint": ["synthetic_corpus", "vocab_mapping", "hidden_state_shards"],
    "benchmark_report": ["drafter_checkpoint", "benchmark_reference"],
}
"""What each asset reads (the test of the definitions holds this to their lineage)."""
PARTS = {
    "corpus": ("prompts", "synthetic_corpus", "vocab_mapping"),
    "hidden_states": ("hidden_state_shards", "benchmark_reference"),
    "drafter": ("drafter_checkpoint",),
    "benchmark": ("benchmark_report",),
}
"""The parts of the graph `eagle-assets run --part` can run alone, by name, in graph order: where
one host serves the target, extracts its states and trains in turn, each part runs while its
own server holds the GPUs (docs/kimi-k2.5.md). The hidden-state part captures the benchmark
reference from the same extraction server (`benchmark_reference`)."""


def ensure_dagster_home() -> Path:
    """$DAGSTER_HOME (default ./.dagster_home) with the project's dagster.yaml in it."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home")))
    home.mkdir(parents=True, exist_ok=True)
    src = PROJECT_ROOT / "dagster.yaml"
    if not (home / "dagster.yaml").is_file() or (home / "dagster.yaml").read_bytes() != src.read_bytes():
        shutil.copyfile(src, home / "dagster.yaml")
    return home


PATH_VARIABLES = ("EAGLE_ASSETS_DATA", "EAGLE_ASSETS_CACHE", "EAGLE_ASSETS_RUNS", "EAGLE_ASSETS_VLLM_VENV", "EAGLE_ASSETS_SGLANG_VENV")
MAYBE_PATH_VARIABLES = ("EAGLE_ASSETS_TARGET", "EAGLE_ASSETS_PROMPTS_URL")
"""A preset name or a URL, or a path where one exists here."""


def absolute_path_variables() -> None:
    """Make relative paths in the environment absolute: the daemon and the runs inherit it but
    work in the project's folder, where a relative path would point elsewhere."""
    for name in PATH_VARIABLES + MAYBE_PATH_VARIABLES:
        value = os.environ.get(name)
        if not value or "://" in value or os.path.isabs(value) or (name in MAYBE_PATH_VARIABLES and not os.path.exists(value)):
            continue
        os.environ[name] = os.path.abspath(value)


def selected_assets(parts: Sequence[str] | None) -> list[str]:
    """The assets of `parts` (all of them for None), in graph order."""
    if not parts:
        return list(GRAPH)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part {', '.join(map(repr, unknown))}: give one of {', '.join(PARTS)}")
    wanted = {asset for part in parts for asset in PARTS[part]}
    return [a for a in GRAPH if a in wanted]


def missing_upstream(instance: dg.DagsterInstance, assets: Sequence[str]) -> list[str]:
    """The assets outside `assets` that one of them reads and `instance` has never materialised."""
    missing = []
    for asset in assets:
        for dep in DEPENDS[asset]:
            if dep not in assets and dep not in missing and instance.get_latest_materialization_event(dg.AssetKey(dep)) is None:
                missing.append(dep)
    return sorted(missing, key=GRAPH.index)


def materialize(
    preset: str,
    log: Callable[[str], None] = print,
    parts: Sequence[str] | None = None,
    stale_only: bool = False,
    run_file: str | None = None,
    target: str | None = None,
    home: Path | None = None,
) -> list[dg.DagsterRun]:
    """Materialise the assets of `parts` (all for None; only the stale and missing ones with
    `stale_only`) in a session whose code location has `preset`, `run_file`'s settings and
    `target`; returns the finished runs (none when nothing was stale). Parts whose upstream the
    instance never materialised are refused before anything starts; the first failed run raises
    session.RunFailed with its error."""
    assets = selected_assets(parts)
    absolute_path_variables()
    home = Path(home) if home else ensure_dagster_home()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        missing = missing_upstream(instance, assets)
    if missing:
        needed = [part for part, names in PARTS.items() if set(names) & set(missing)]
        raise ValueError(
            f"--part {' --part '.join(parts or ())} reads {', '.join(missing)}, which this instance ({home}) "
            f"has never materialised: run --part {' --part '.join(needed)} first (or the whole graph)"
        )
    env = session_environment(preset, run_file, target)
    # Only this command's runs write its data folder while it runs: no automation in its session.
    env["EAGLE_ASSETS_AUTOMATION"] = "0"
    tags = {"dagster/max_retries": "0", "eagle_assets/preset": preset}
    runs: list[dg.DagsterRun] = []
    with DagsterSession(home, data_dir(), env=env, log=log) as session:
        tags[SESSION_TAG] = f"{session.command} (pid {os.getpid()})"
        if not stale_only:
            runs.append(session.wait(session.launch(assets, tags)))
            return runs
        rebuilt: set[str] = set()
        while True:
            status = session.stale(assets)
            todo = [a for a in assets if status[a][0] in (STALE, MISSING)]
            if not todo:
                break
            for a in todo:
                log(f"{a}: {status[a][0].lower()}" + (f" ({'; '.join(status[a][1])})" if status[a][1] else ""))
            again = sorted(set(todo) & rebuilt)
            if again:
                raise RuntimeError(
                    f"{', '.join(again)} still stale after it was rebuilt in this run: its data version or "
                    "code version does not settle; check that the asset returns a content hash as its data version"
                )
            rebuilt.update(todo)
            runs.append(session.wait(session.launch(todo, tags)))
        if not runs:
            log("every asset is up to date" if all(status[a][0] == FRESH for a in assets) else "nothing to rebuild")
    return runs
