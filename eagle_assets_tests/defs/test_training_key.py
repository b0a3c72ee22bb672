"""The drafter's checkpoints are resumed only by the training that wrote them (defs/drafter.py):
a rerun after a failure keeps them; new inputs (a retrain on a grown corpus) or new settings
start afresh, where the trainer would otherwise refuse them or finish the old training."""

import json

from eagle_assets.defs.drafter import TRAINING_KEY_FILE, clear_other_trainings
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.formats import SHARD_MANIFEST_FILE


def test_checkpoints_survive_a_rerun_of_the_same_training_and_go_when_its_inputs_or_settings_change(tmp_path):
    shards, out = tmp_path / "hidden_states", tmp_path / "drafter"
    (shards / "shard-00000").mkdir(parents=True)
    (shards / "shard-00000" / SHARD_MANIFEST_FILE).write_text(json.dumps({"sha256": "a"}))
    vocab = tmp_path / "vocab_mapping.safetensors"
    vocab.write_bytes(b"d2t")
    config = TrainConfig(shard_dirs=(str(shards),), vocab_mapping=str(vocab), target=str(tmp_path / "target"), out_dir=str(out))
    said = []

    def checkpoint() -> None:
        (config.checkpoint_dir / "step-00000060").mkdir(parents=True, exist_ok=True)

    clear_other_trainings(config, said.append)  # the first training: nothing to clear
    assert said == [] and json.loads((out / TRAINING_KEY_FILE).read_text())["key"]
    checkpoint()
    clear_other_trainings(config, said.append)  # its rerun after a failure resumes
    assert said == [] and (config.checkpoint_dir / "step-00000060").is_dir()

    (shards / "shard-00000" / SHARD_MANIFEST_FILE).write_text(json.dumps({"sha256": "b"}))  # new samples in a shard
    clear_other_trainings(config, said.append)
    assert not config.checkpoint_dir.exists() and "another training's" in said[-1]

    checkpoint()
    clear_other_trainings(config.replace(lr=config.lr / 2), said.append)  # a new setting
    assert not config.checkpoint_dir.exists() and len(said) == 2

    clear_other_trainings(config, said.append)  # back to the first settings: nothing left to clear
    checkpoint()
    clear_other_trainings(config, said.append)
    assert len(said) == 2 and config.checkpoint_dir.is_dir()
    vocab.write_bytes(b"another d2t")  # a new vocabulary
    clear_other_trainings(config, said.append)
    assert not config.checkpoint_dir.exists() and len(said) == 3
