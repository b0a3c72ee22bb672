"""benchmarks/data_scaling_summary.py: the fit that says how much data an AL asks for."""

import math
from pathlib import Path

import pytest

from eagle_assets_tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "data_scaling_summary.py"


@pytest.fixture(scope="module")
def summary():
    return load_script(SCRIPT)


def test_the_fit_recovers_a_line_in_log2_of_the_data_and_the_doublings_it_asks(summary):
    points = [(share, 2.2 + 0.1 * math.log2(share)) for share in (0.125, 0.25, 0.5, 1.0)]
    a, b = summary.fit_log2(points)
    assert (a, b) == pytest.approx((2.2, 0.1))
    assert summary.doublings_for(2.8, a, b) == pytest.approx(6.0)  # 64x the corpus
    assert summary.doublings_for(2.8, 2.2, 0.0) == math.inf  # a flat curve: no amount of data
