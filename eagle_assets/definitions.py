"""The Dagster Definitions of eagle_assets: loaded by `workspace.yaml`."""

from eagle_assets.defs.graph import build_definitions

defs = build_definitions()
