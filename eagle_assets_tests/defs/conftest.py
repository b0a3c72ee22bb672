"""Real Dagster instances for the defs tests, made once and copied: creating a SQLite instance
costs seconds (schema set-up), copying one a fraction of that."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets_tests.defs.toy_graph import make_assets, persistent_instance


def _open(src: Path, dest: Path) -> dg.DagsterInstance:
    shutil.copytree(src, dest)
    # The copied dagster.yaml still names the source folder: point it at the copy.
    yaml = dest / "dagster.yaml"
    yaml.write_text(yaml.read_text().replace(str(src), str(dest)))
    return dg.DagsterInstance.from_config(str(dest))


@pytest.fixture(scope="session")
def _blank_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("blank") / "home"
    persistent_instance(home).dispose()
    return home


@pytest.fixture(scope="session")
def _built_toy(tmp_path_factory, _blank_home) -> Path:
    """The toy graph materialised once: `home/` (the instance) and `data/` (its files)."""
    base = tmp_path_factory.mktemp("built")
    with _open(_blank_home, base / "home") as instance:
        assets = make_assets(base / "data")
        dg.materialize(assets, selection=["a", "b"], instance=instance)
        for partition in ("0", "1"):
            dg.materialize(assets, selection=["c"], partition_key=partition, instance=instance)
        dg.materialize(assets, selection=["d"], instance=instance)
    return base


@pytest.fixture
def instance(tmp_path, _blank_home):
    """An empty on-disk instance of this test's own."""
    with _open(_blank_home, tmp_path / "home") as inst:
        yield inst


@pytest.fixture
def built(tmp_path, _built_toy):
    """(data folder, instance) of this test's own copy of the fully built toy graph."""
    shutil.copytree(_built_toy / "data", tmp_path / "data")
    with _open(_built_toy / "home", tmp_path / "home") as inst:
        yield tmp_path / "data", inst
