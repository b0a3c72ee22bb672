"""Jobs: the graph in three runs, because one job may not mix partitioned and unpartitioned assets.

1. `corpus_job`: prompts -> synthetic_corpus -> vocab_mapping
2. `hidden_states_job`: hidden_state_shards, one run per partition (shard)
3. `drafter_job`: drafter_checkpoint -> benchmark_report
"""

from __future__ import annotations

import dagster as dg

CORPUS_STAGE = ["prompts", "synthetic_corpus", "vocab_mapping"]
HIDDEN_STAGE = ["hidden_state_shards"]
DRAFTER_STAGE = ["drafter_checkpoint", "benchmark_report"]
STAGES = [CORPUS_STAGE, HIDDEN_STAGE, DRAFTER_STAGE]

corpus_job = dg.define_asset_job("corpus_job", selection=CORPUS_STAGE, description="Prompts, the target's answers and the draft vocabulary.")
hidden_states_job = dg.define_asset_job("hidden_states_job", selection=HIDDEN_STAGE, description="The target's hidden states, one run per shard.")
drafter_job = dg.define_asset_job("drafter_job", selection=DRAFTER_STAGE, description="Train, export, smoke-load and benchmark the drafter.")
JOBS = [corpus_job, hidden_states_job, drafter_job]
