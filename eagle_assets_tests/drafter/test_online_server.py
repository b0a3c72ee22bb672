"""Online training from an extraction server (hidden_states="server") against shard training, on
SmolLM2 through the session's real vLLM extraction server, in fp32 on CPU; and the server dying
mid-run: named within seconds, the steps trained checkpointed, the rerun resumed.

Exactness: the shards here are written by `EngineExtractor` from the same server, and both sides
send one request at a time (concurrency 1). The engine computes each sequence alone, the same
way both times, and the online source rounds its states to bf16 exactly as the extractor writes
them, so training must match bit for bit. (With requests in flight together the engine batches
them, and another batch composition moves fp32 rounding as padding does for the target in the
trainer: test_online.py states that tolerance.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle_assets.corpus.target import target_fingerprint
from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.drafter.sources import HiddenStateSourceError, ServerStates, open_training_data
from eagle_assets.engines.process import free_port
from eagle_assets.formats import stable_id
from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, final_norm_of
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all
from eagle_assets.hidden_states.vocab import build_vocab_mapping, count_assistant_tokens, save_vocab_mapping
from eagle_assets_tests.conftest import SMOLLM2_EXTRACTED_IDS
from eagle_assets_tests.drafter.test_train import read_metrics
from eagle_assets_tests.hidden_states.conftest import conversations, corpus_row, tokenise, write_corpus

AUX, LAYERS, HIDDEN, VOCAB = (2, 15, 27), 30, 576, 49152
NUM_SHARDS = 2
STEPS = 12
COMPARED = ("loss", "step_loss", "acc", "grad_norm", "lr", "tokens_seen", "epoch")

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(smollm2_extraction_server):
    assert SMOLLM2_EXTRACTED_IDS == (*AUX, LAYERS)
    return smollm2_extraction_server


@pytest.fixture(scope="module")
def world(tmp_path_factory, smollm2_path, server, one_thread):
    """SmolLM2's corpus of eight conversations, a 256-token draft vocabulary, and shards the
    extraction server wrote (one request at a time)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("online-server")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    fingerprint = target_fingerprint(smollm2_path)
    rows = []
    for msgs in conversations():
        ids, mask = tokenise(tokenizer, msgs)
        rows.append(corpus_row(stable_id(msgs, "online-server"), msgs, ids, mask, fingerprint))
    corpus = write_corpus(root / "corpus", rows)
    save_vocab_mapping(build_vocab_mapping(count_assistant_tokens(str(corpus), VOCAB), VOCAB, 256), root / "vocab_mapping.safetensors")
    engine, _ = server
    settings = ExtractSettings(aux_layer_ids=AUX, num_shards=NUM_SHARDS, progress=False)
    client = EngineStateClient(engine.base_url, engine.model, (*AUX, LAYERS), concurrency=1)
    with closing(client), EngineExtractor(client, settings, LAYERS, HIDDEN, VOCAB, final_norm_of(smollm2_path)) as extractor:
        extract_all(extractor, str(corpus), root / "shards", settings, target_fingerprint=fingerprint)
    return root


def config(root: Path, name: str, smollm2_path: Path, **changes) -> TrainConfig:
    settings = dict(
        shard_dirs=(str(root / "shards"),),
        vocab_mapping=str(root / "vocab_mapping.safetensors"),
        target=str(smollm2_path),
        out_dir=str(root / name),
        corpus_dir=str(root / "corpus"),
        num_shards=NUM_SHARDS,
        aux_layer_ids=AUX,
        drafter_intermediate_size=256,
        ttt_steps=2,
        micro_batch_tokens=None,
        micro_batch_samples=1,
        max_steps=STEPS,
        lr=1e-3,
        warmup_steps=2,
        val_fraction=0.0,
        val_interval=0,
        checkpoint_every=0,
        log_every=1,
        export_engines=(),
        precision="fp32",
        extraction_concurrency=1,
        lookahead_steps=3,
    )
    settings.update(changes)
    return TrainConfig(**settings)


def rows(out_dir: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out_dir) if "loss" in r}


def weights(cfg: TrainConfig, step: int) -> dict[str, torch.Tensor]:
    last = ckpt.latest_checkpoint(cfg.checkpoint_dir)
    assert last is not None and last.name == ckpt.checkpoint_name(step), last
    return load_file(str(last / ckpt.MODEL_FILE))


@pytest.fixture(scope="module")
def runs(world, smollm2_path, server, one_thread):
    """(shard run, online run): the same settings, states from shards and from the server."""
    from eagle_assets.drafter.train import train

    engine, _ = server
    shards = config(world, "from-shards", smollm2_path, checkpoint_every=STEPS)
    online = config(world, "from-server", smollm2_path, checkpoint_every=STEPS, hidden_states="server", shard_dirs=(), extraction_url=engine.base_url)
    return [(cfg, train(cfg)) for cfg in (shards, online)]


def test_training_from_the_server_equals_shard_training(runs, server):
    (shards, _), (online, summary) = runs
    assert summary["hidden_states"] == "server" and server[0].base_url in summary["hidden_states_origin"]
    ref, got = rows(shards.out_dir), rows(online.out_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    for s in got:
        assert {k: got[s][k] for k in COMPARED} == {k: ref[s][k] for k in COMPARED}, s
    a, b = weights(shards, STEPS), weights(online, STEPS)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not list(server[1].iterdir()), "every spool file was read and removed"


class CountingStates(ServerStates):
    """The server source, counting its requests in flight and the samples it has asked for and
    not yet handed over."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight = self.most_in_flight = self.most_asked = 0
        self.counter = threading.Lock()

    def _fetch(self, position):
        with self.counter:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.most_asked = max(self.most_asked, len(self._outstanding))
        try:
            return super()._fetch(position)
        finally:
            with self.counter:
                self.in_flight -= 1


def test_the_spool_stays_bounded_and_is_left_clean(world, smollm2_path, server):
    """With steps asked for ahead, at most `extraction_concurrency` requests are in flight (each
    holds at most one file in the spool) and at most `lookahead_steps` + 1 steps are asked for;
    closing the source mid-stream leaves the spool empty."""
    from eagle_assets.drafter.data import SamplerState

    engine, spool = server
    cfg = config(
        world,
        "bounded",
        smollm2_path,
        hidden_states="server",
        shard_dirs=(),
        extraction_url=engine.base_url,
        extraction_concurrency=2,
        lookahead_steps=3,
    )
    source = CountingStates.connect(cfg)
    plan = ((SamplerState(0, i + 1), [[i % len(source)], [(i + 1) % len(source)]], 0) for i in range(12))
    stream = source.stream(plan, torch.float32, torch.device("cpu"))
    steps = iter(stream)
    got = [next(steps) for _ in range(3)]
    time.sleep(1.0)  # the look-ahead fills while no step is taken
    stream.close()
    source.close()
    assert [s for s, _, _ in got] == [SamplerState(0, 1), SamplerState(0, 2), SamplerState(0, 3)]
    assert source.most_in_flight == 2, source.most_in_flight
    assert 2 < source.most_asked <= (3 + 1) * 2, source.most_asked
    assert not list(spool.iterdir())


def _proxy(port: int, target_url: str) -> subprocess.Popen:
    host, target_port = target_url.removeprefix("http://").rsplit(":", 1)
    proc = subprocess.Popen([sys.executable, "-m", "eagle_assets_tests.tcp_proxy", str(port), host, target_port], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _remove_orphans(spool: Path, before: set[str]) -> None:
    """A dead server's requests in flight leave their files in its spool (nobody reads them): the
    shared server's spool is emptied of what this test left, once the engine has stopped writing."""
    deadline, last, quiet = time.monotonic() + 30, None, 0
    while time.monotonic() < deadline and quiet < 10:
        now = {p.name for p in spool.iterdir() if p.name not in before}
        quiet = quiet + 1 if now == last else 0
        last = now
        time.sleep(0.05)
    for p in spool.iterdir():
        if p.name not in before:
            p.unlink(missing_ok=True)


def test_a_server_dying_mid_run_is_named_within_seconds_and_nothing_trained_is_lost(world, smollm2_path, server, runs, one_thread):
    """The server (a proxy in front of the real one) is killed mid-run: the run stops within
    seconds naming it, with a checkpoint of every step it finished; the rerun, given a live
    server, resumes there and ends where the uninterrupted run ended."""
    from eagle_assets.drafter.train import train

    engine, spool = server
    before = {p.name for p in spool.iterdir()}
    port = free_port()
    proxy = _proxy(port, engine.base_url)
    url = f"http://127.0.0.1:{port}"
    cfg = config(world, "server-died", smollm2_path, hidden_states="server", shard_dirs=(), extraction_url=url)
    killed_at: list[float] = []

    def kill_after_step_five():
        metrics = Path(cfg.out_dir) / "metrics.jsonl"
        while proxy.poll() is None:
            if metrics.is_file() and metrics.read_text().count("\n") >= 5:  # five whole rows logged
                proxy.send_signal(signal.SIGKILL)
                killed_at.append(time.monotonic())
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_after_step_five, daemon=True)
    killer.start()
    try:
        with pytest.raises(HiddenStateSourceError) as err:
            train(cfg)
        noticed = time.monotonic() - killed_at[0]
    finally:
        proxy.kill()
        proxy.wait()
        killer.join()
        _remove_orphans(spool, before)
    assert url in str(err.value) and "extraction server" in str(err.value)
    assert noticed < 10, f"noticed {noticed:.1f} s after the server died"
    trained = max(rows(cfg.out_dir))
    assert 5 <= trained < STEPS
    assert weights(cfg, trained)  # every finished step is in the checkpoint

    (_, _), (online, _) = runs
    resumed = train(cfg.replace(extraction_url=engine.base_url))  # the server is back (here: the real one)
    assert resumed["resumed_from_step"] == trained and resumed["steps"] == STEPS
    ref, got = rows(online.out_dir), rows(cfg.out_dir)
    for s in range(1, STEPS + 1):
        assert {k: got[s][k] for k in COMPARED} == {k: ref[s][k] for k in COMPARED}, s


def test_a_hung_server_is_named_within_seconds(world, smollm2_path, server):
    """A server that stops answering (frozen, not dead: its connections stay open) fails its
    health probe: the source names it within seconds instead of waiting out the request timeout."""
    engine, spool = server
    before = {p.name for p in spool.iterdir()}
    port = free_port()
    proxy = _proxy(port, engine.base_url)
    cfg = config(world, "hung", smollm2_path, hidden_states="server", shard_dirs=(), extraction_url=f"http://127.0.0.1:{port}")
    source = open_training_data(cfg, torch.device("cpu"))
    try:
        os.kill(proxy.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(HiddenStateSourceError, match="stopped answering") as err:
            source.collate([0])
        assert time.monotonic() - started < 10
        assert f"127.0.0.1:{port}" in str(err.value)
    finally:
        proxy.kill()  # its connections drop: the request waiting on it fails, and the source closes
        proxy.wait()
        source.close()
        _remove_orphans(spool, before)
