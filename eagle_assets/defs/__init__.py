"""Dagster wiring only: assets with their checks, the executor, automation, resources, sessions.
Pure code lives elsewhere.

`ASSETS` and `build_definitions` (defs/graph.py) load on first use, so the modules here that run
as commands of their own (`python -m eagle_assets.defs.session`) start
without importing every asset's dependencies.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name in ("ASSETS", "build_definitions"):
        from eagle_assets.defs import graph

        return getattr(graph, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
