"""Where the assets keep their outputs: one root folder, one layout.

    <root>/<target>/prompts/              prompt set (Parquet)
    <root>/<target>/corpus/               synthetic corpus shards + manifest
    <root>/<target>/vocab_mapping.safetensors
    <root>/<target>/hidden_states/        shard-00000/ ... (one per partition)
    <root>/<target>/drafter/              training checkpoints, drafter-vllm/ and drafter-sglang/ exports
    <root>/<target>/report/               benchmark report (Markdown, JSON, PNG)

The root is a folder, not a URL: the engine, the trainer and the shard readers open these files
directly. A bucket serves when mounted as a folder on every node.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from eagle_assets.paths import data_dir
from eagle_assets.settings_env import MOUNT_FIX


class StorageResource(dg.ConfigurableResource):
    """The root under which every asset of a target writes."""

    root: str = ""
    """A folder (local, or mounted on every node); empty means ./data in the project (EAGLE_ASSETS_DATA)."""

    def base(self, target: str) -> Path:
        if "://" in self.root:  # pathlib would make s3://bucket/x the local folder s3:/bucket/x
            raise ValueError(f"storage root {self.root!r} is a URL, not a folder: {MOUNT_FIX}")
        root = Path(self.root) if self.root else data_dir()
        return root / target.replace("/", "_")

    def prompts(self, target: str) -> Path:
        return self.base(target) / "prompts"

    def corpus(self, target: str) -> Path:
        return self.base(target) / "corpus"

    def vocab_mapping(self, target: str) -> Path:
        return self.base(target) / "vocab_mapping.safetensors"

    def hidden_states(self, target: str) -> Path:
        return self.base(target) / "hidden_states"

    def drafter(self, target: str) -> Path:
        return self.base(target) / "drafter"

    def report(self, target: str) -> Path:
        return self.base(target) / "report"
