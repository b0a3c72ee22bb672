"""The `prompts` and `synthetic_corpus` stages as plain Python (no dagster import).

    prompts.py       prompt sets: user files, Magpie synthesis by the target, MT-Bench for
                     evaluation only
    prompt_formats.py  prompt files in ShareGPT, OpenAI chat, Alpaca or text format (JSON Lines,
                     JSON arrays streamed, Parquet; any fsspec URL or pkg://), and ShareGPT's
                     packaged conversations as a seeded sample
    client.py        async OpenAI-compatible client: bounded concurrency, retries with backoff
    conversation.py  the target's chat template: reasoning re-wrapped, token ids, loss mask,
                     round-trip verification
    store.py         Parquet shards + manifest, atomic and resumable
    generate.py      the corpus generator (the target's own answers, turn by turn)
    checks.py        checks on a stored corpus, each returning (passed, metadata)
    target.py        the target's tokenizer and fingerprint

A whole run, without Dagster:

    from eagle_assets.corpus.client import ClientSettings
    from eagle_assets.corpus.generate import SamplingParams, generate_corpus
    from eagle_assets.corpus.prompts import load_prompt_file
    from eagle_assets.corpus.store import CorpusStore
    from eagle_assets.corpus.target import load_tokenizer, target_fingerprint

    with CorpusStore("data/corpus") as store:
        stats = generate_corpus(load_prompt_file("prompts.jsonl"), store,
                                ClientSettings("http://localhost:8000", "smollm2-135m-instruct"),
                                load_tokenizer(model_dir), target=target_fingerprint(model_dir),
                                sampling=SamplingParams(max_tokens=1024))
"""
