"""Dagster wiring only: assets with their checks, jobs, schedules, sensors, resources."""

from __future__ import annotations

import dagster as dg

from eagle_assets.defs.resources import default_resources


def build_definitions() -> dg.Definitions:
    return dg.Definitions(resources=default_resources())
