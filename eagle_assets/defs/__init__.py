"""Dagster wiring only: assets with their checks, jobs, resources. Pure code lives elsewhere."""

from __future__ import annotations

import dagster as dg

from eagle_assets.defs.benchmark import benchmark_report
from eagle_assets.defs.corpus import prompts, synthetic_corpus
from eagle_assets.defs.drafter import drafter_checkpoint
from eagle_assets.defs.hidden_states import hidden_state_shards, vocab_mapping
from eagle_assets.defs.jobs import JOBS
from eagle_assets.defs.resources import default_resources

ASSETS = [prompts, synthetic_corpus, vocab_mapping, hidden_state_shards, drafter_checkpoint, benchmark_report]


def build_definitions() -> dg.Definitions:
    return dg.Definitions(assets=ASSETS, jobs=JOBS, resources=default_resources())
