"""Target features for EAGLE-3 training: the draft vocabulary and the hidden-state shards.

Plain Python + PyTorch (no Dagster); the `vocab_mapping` and `hidden_state_shards` assets
are thin wiring over these modules:

    vocab.py      build_vocab_mapping / load_parent_mapping / save / load (d2t, t2d)
    corpus_io.py  iter_corpus_rows, load_shard_samples, tokenizer_fingerprint
    extract.py    ExtractSettings, load_target, extract_shard, extract_all (the forward pass)
    writer.py     ShardLayout, ShardWriter: preallocated safetensors, atomic shard folders
    reader.py     ShardReader, open_shards: memory-mapped access for the trainer
    budget.py     predict_bytes, check_free_space, plan

Formats are defined in `eagle_assets.formats`.
"""
