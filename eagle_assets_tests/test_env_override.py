"""benchmarks/env_override.py: the variable a benchmark sets for its servers is put back afterwards."""

import os
from pathlib import Path

import pytest

from eagle_assets_tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "env_override.py"
NAME = "EAGLE_ASSETS_TEST_VARIABLE"


@pytest.fixture(scope="module")
def environment_variable():
    return load_script(SCRIPT).environment_variable


@pytest.mark.parametrize("before", [None, "users"])
@pytest.mark.parametrize("inside", [None, "benchmarks"])
def test_the_value_holds_inside_and_the_old_one_returns_even_on_error(monkeypatch, environment_variable, before, inside):
    monkeypatch.delenv(NAME, raising=False)
    if before is not None:
        monkeypatch.setenv(NAME, before)
    with pytest.raises(RuntimeError):
        with environment_variable(NAME, inside):
            assert os.environ.get(NAME) == inside
            raise RuntimeError("a server failed to start")
    assert os.environ.get(NAME) == before
