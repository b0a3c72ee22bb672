"""Where the trainer's hidden states come from: shards on disk, or computed online.

The trainer pulls every batch from one object, its training data (`open_training_data`):

- "shards": `data.ShardDataset` over `hidden_state_shards`: the states were extracted once and
  every epoch reads them back;
- "target": `TargetStates`, the target loaded in the trainer beside the drafter (frozen, eval,
  no grad): each micro-batch's aux states and normed final state come from a forward pass of
  that micro-batch, taken just before the drafter trains on it;
- "server": `ServerStates`, an extraction server (`eagle-assets serve --extract`, vLLM's
  `extract_hidden_states`) asked for the states of the samples a few steps ahead; they are
  trained on as they arrive and never written as a shard.

All three number the corpus's samples alike (as the shards store them: shard by
`formats.shard_of`, longest first within a shard) and round the states to bf16 as the shards
do, so one seed trains on the same samples in the same order and on the same values from any
of them, and a checkpoint written with one source resumes with another.

What each offers the trainer: the sample index (`samples`, `lengths`, `split`), the shapes
(`aux_layer_ids`, `hidden_size`), `collate(positions, dtype)` for one micro-batch (validation
uses it), and `stream(steps, dtype, device)`, the micro-batches of each planned step in order,
prepared ahead where that overlaps the step before:

- shards: read and collated two steps ahead in a thread;
- target on a GPU: the forward of the next steps runs in a thread on a CUDA stream of its own,
  beside the drafter's step on the default stream; on a CPU it runs in the step itself (two
  pools of threads on the same cores would only contend);
- server: requests for `lookahead_steps` steps are in flight while the step trains, at most
  `extraction_concurrency` at once, so the states held and the server's spool stay bounded.

An online source that fails (the server died, or stopped answering its health probe) raises
`HiddenStateSourceError` naming it; the trainer then checkpoints what it trained and stops.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import torch

from eagle_assets.drafter.data import Prefetcher, SampleRef, SamplerState, ShardDataset, split_positions
from eagle_assets.drafter.run_config import TrainConfig

Steps = Iterator[tuple[SamplerState, list[list[int]], int]]
"""Planned steps: (data position after the step, this rank's micro-batches as sample positions, global tokens)."""


class HiddenStateSourceError(RuntimeError):
    """An online source could not give the states of a planned step (its server is gone)."""


def open_training_data(cfg: TrainConfig, device: torch.device, log=print):
    """The training data `cfg.hidden_states` names, on `device` where it computes."""
    if cfg.hidden_states == "shards":
        return ShardDataset(cfg.shard_dirs, cfg.max_seq_len, aux_layer_ids=cfg.aux_layer_ids)
    if cfg.hidden_states == "target":
        return TargetStates.load(cfg, device, log)
    return ServerStates.connect(cfg, log)


# ----------------------------------------------------------------------------- the corpus


class CorpusSamples:
    """The corpus's samples, numbered as `hidden_state_shards` in `num_shards` shards stores them,
    cut to `max_seq_len` tokens; samples of fewer than 2 tokens are left out, as the shard reader
    leaves them out (nothing to predict)."""

    def __init__(self, corpus_dir: str, num_shards: int, max_seq_len: int | None, vocab_size: int | None, target_fingerprint: str | None):
        from eagle_assets.hidden_states.corpus_io import load_all_shard_samples

        self.corpus_dir = corpus_dir
        self.samples: list[SampleRef] = []
        self.input_ids: list[np.ndarray] = []
        self.loss_mask: list[np.ndarray] = []
        for s, shard in enumerate(load_all_shard_samples(corpus_dir, num_shards, vocab_size, target_fingerprint)):
            for row, (sid, ids, mask) in enumerate(zip(shard.sample_ids, shard.input_ids, shard.loss_mask)):
                if len(ids) < 2:
                    continue
                n = min(len(ids), max_seq_len) if max_seq_len else len(ids)
                self.samples.append(SampleRef(s, row, sid, n))
                self.input_ids.append(ids[:n])
                self.loss_mask.append(mask[:n])
        if not self.samples:
            raise ValueError(f"corpus {corpus_dir} holds no sample of two tokens or more: materialise synthetic_corpus first")


def online_aux_layer_ids(aux_layer_ids: Sequence[int] | None, warm_start: str | None, num_layers: int) -> tuple[int, ...]:
    """The aux ids an online source computes: the run's, else a warm start's parent's (its weights
    read those), else the engines' default (2, L//2, L-3)."""
    if aux_layer_ids:
        return tuple(aux_layer_ids)
    if warm_start:
        from eagle_assets.drafter.export import drafter_folder_config

        return tuple(drafter_folder_config(warm_start, target_num_layers=num_layers).aux_layer_ids)
    from eagle_assets.targets import default_aux_layer_ids

    return default_aux_layer_ids(num_layers)


def _target_config(target: str) -> dict:
    config = json.loads((Path(target) / "config.json").read_text())
    return config.get("text_config") or config


def _pad(seqs: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int]]:
    """Right-pad samples in their order: ids (B, T) int64, the flat positions of the real tokens
    (Tb,) (sample j's at j*T + 0..n_j-1), the attention mask (B, T) int64 or None when no sample
    is padded (the model's plain causal path, as the extraction takes it), and the lengths."""
    lens = [len(x) for x in seqs]
    T = max(lens)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    for j, x in enumerate(seqs):
        ids[j, : len(x)] = torch.from_numpy(np.asarray(x, dtype=np.int64))
    index = torch.from_numpy(np.concatenate([j * T + np.arange(n) for j, n in enumerate(lens)]))
    mask = None if min(lens) == T else (torch.arange(T)[None, :] < torch.tensor(lens)[:, None]).long()
    return ids, index, mask, lens


class OnlineStates:
    """The sample index and batching every online source shares; a subclass computes the
    states of a micro-batch (`_rows`): bf16 rows of its real tokens, in order."""

    source = ""
    device = torch.device("cpu")
    """Where `collate` builds its batches."""

    def __init__(self, corpus: CorpusSamples, aux_layer_ids: Sequence[int], hidden_size: int):
        self.corpus = corpus
        self.samples = corpus.samples
        self.aux_layer_ids: tuple[int, ...] = tuple(int(i) for i in aux_layer_ids)
        self.stored_aux_layer_ids = self.aux_layer_ids  # what the source computes: exactly what is trained on
        self.hidden_size = int(hidden_size)

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def __len__(self) -> int:
        return len(self.samples)

    def lengths(self, positions: Sequence[int]) -> list[int]:
        return [self.samples[p].num_tokens for p in positions]

    def split(self, val_fraction: float) -> tuple[list[int], list[int]]:
        return split_positions(self.samples, val_fraction)

    @property
    def origin(self) -> str:
        return f"online from {self.source} ({self.where}) over the corpus {self.corpus.corpus_dir}"

    where = ""
    """What computes the states: the target's folder and device, or the server's URL."""

    def _rows(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux (Tb, n_aux*H), final (Tb, H)) bf16 for the real tokens of `positions`, in order."""
        raise NotImplementedError

    def collate(self, positions: Sequence[int], dtype: torch.dtype = torch.float32, rows=None) -> dict[str, torch.Tensor]:
        """A padded micro-batch in `ShardDataset.collate`'s layout, on `self.device`."""
        ids, index, _, lens = _pad([self.corpus.input_ids[p] for p in positions])
        aux_rows, final_rows = rows if rows is not None else self._rows(positions)
        b, t, dev = len(lens), ids.shape[1], self.device
        aux = torch.zeros(b * t, self.num_aux * self.hidden_size, dtype=dtype, device=dev)
        final = torch.zeros(b * t, self.hidden_size, dtype=dtype, device=dev)
        at = index.to(dev)
        aux[at] = aux_rows.to(dev, dtype)
        final[at] = final_rows.to(dev, dtype)
        mask = torch.zeros(b, t, dtype=torch.float32)
        for j, p in enumerate(positions):
            mask[j, : lens[j]] = torch.from_numpy(self.corpus.loss_mask[p].astype(np.float32))
        return {
            "aux": aux.view(b, t, -1),  # (B, T, n_aux*H)
            "final": final.view(b, t, -1),  # (B, T, H)
            "input_ids": ids.to(dev),  # (B, T)
            "loss_mask": mask.to(dev),  # (B, T)
            "lengths": torch.tensor(lens, dtype=torch.long, device=dev),  # (B,)
            "positions": torch.tensor(list(positions), dtype=torch.long, device=dev),  # (B,)
        }

    def close(self) -> None:
        pass


class _Serial:
    """An iterator run in the consumer's own thread, with the `close()` the trainer calls."""

    def __init__(self, items):
        self._items = iter(items)

    def __iter__(self):
        return self._items

    def __next__(self):
        return next(self._items)

    def close(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()


# ----------------------------------------------------------------------------- (a) the target in the trainer


class TargetStates(OnlineStates):
    """The target's states computed in the trainer: a Hugging Face forward pass of each
    micro-batch with hooks on the aux layers and the final norm (`extract._Capture`, the hooks
    the shards are extracted with), under no grad, the target frozen. fp32 on a CPU, bf16 on a
    GPU, as `hidden_state_shards` extracts with Hugging Face."""

    source = "target"
    state_dtype = torch.bfloat16
    """The dtype the states are kept in: bf16, rounded as the shards store them."""

    def __init__(self, model, corpus: CorpusSamples, aux_layer_ids: Sequence[int], overlap: bool = True):
        from eagle_assets.hidden_states.extract import _Capture, target_parts, validate_aux_layer_ids

        self.model = model.requires_grad_(False).eval()
        self.parts = target_parts(model)
        aux = validate_aux_layer_ids(aux_layer_ids, self.parts.num_layers)
        super().__init__(corpus, aux, self.parts.hidden_size)
        self.device = self.parts.output_device
        self.overlap = overlap and self.device.type == "cuda"
        self._capture = _Capture(self.parts, self.aux_layer_ids)
        self._lock = threading.Lock()  # one forward at a time: the hooks write into one capture

    @classmethod
    def load(cls, cfg: TrainConfig, device: torch.device, log=print) -> "TargetStates":
        from eagle_assets.corpus.target import target_fingerprint
        from eagle_assets.hidden_states.extract import load_target

        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        model, _ = load_target(cfg.target, device=str(device), dtype=dtype)
        text = _target_config(cfg.target)
        corpus = CorpusSamples(cfg.corpus_dir, cfg.num_shards, cfg.max_seq_len, text.get("vocab_size"), target_fingerprint(cfg.target))
        source = cls(model, corpus, online_aux_layer_ids(cfg.aux_layer_ids, cfg.warm_start, int(text["num_hidden_layers"])))
        source.where = f"{cfg.target} on {device}"
        log(
            f"hidden states online: the target {cfg.target} in {str(dtype).removeprefix('torch.')} on {device}, frozen"
            + (", its forward on a CUDA stream of its own beside the drafter's step" if source.overlap else "")
        )
        return source

    @torch.no_grad()
    def _rows(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, index, mask, lens = _pad([self.corpus.input_ids[p] for p in positions])
        rows, H = sum(lens), self.hidden_size
        in_dev = self.parts.input_device
        aux = torch.empty(rows, self.num_aux * H, dtype=self.state_dtype, device=self.device)  # (Tb, n_aux*H)
        final = torch.empty(rows, H, dtype=self.state_dtype, device=self.device)  # (Tb, H)
        with self._lock:
            self._capture.begin(index, aux, final)  # copied into bf16 buffers: the shards' rounding
            try:
                self.parts.base(input_ids=ids.to(in_dev), attention_mask=None if mask is None else mask.to(in_dev), use_cache=False)
            except BaseException:
                self._capture._batch = None
                raise
            self._capture.end()
        return aux, final

    def stream(self, steps: Steps, dtype: torch.dtype, device: torch.device):
        def collated():
            for state, mine, tokens in steps:
                yield state, [self.collate(b, dtype) for b in mine], tokens

        if not self.overlap:
            return _Serial(collated())
        side = torch.cuda.Stream(self.device)
        consumer = torch.cuda.current_stream(self.device)  # the trainer's stream (this thread's)

        def on_side_stream():
            for state, mine, tokens in steps:
                with torch.cuda.stream(side):
                    batches = [self.collate(b, dtype) for b in mine]
                    for b in batches:
                        for t in b.values():
                            t.record_stream(consumer)  # freed only once the step that reads it has run
                side.synchronize()
                yield state, batches, tokens

        return Prefetcher(on_side_stream(), depth=1)

    def close(self) -> None:
        self._capture.remove()


# ----------------------------------------------------------------------------- (b) an extraction server


class ServerStates(OnlineStates):
    """The states of an extraction server, asked for `lookahead_steps` steps ahead.

    Each sample is one request (`engine_extract.EngineStateClient`: its token ids as a prompt, the
    states read from the spool file the engine writes and removed); the normed final state is
    derived from r_L with the target's own final norm (`engine_extract.FinalNorm`), and both are
    rounded to bf16, exactly as `EngineExtractor` writes them into shards. While a step waits on
    its states, the server's /health is probed every `liveness_s`: a server that died or stopped
    answering is named within seconds (`HiddenStateSourceError`)."""

    source = "server"

    def __init__(
        self,
        client,
        corpus: CorpusSamples,
        aux_layer_ids: Sequence[int],
        num_layers: int,
        hidden_size: int,
        final_norm,
        lookahead_steps: int = 4,
        liveness_s: float = 2.0,
        probe_timeout_s: float = 3.0,
    ):
        from eagle_assets.hidden_states.extract import validate_aux_layer_ids

        super().__init__(corpus, validate_aux_layer_ids(aux_layer_ids, num_layers), hidden_size)
        needed = sorted(set(self.aux_layer_ids) | {num_layers})
        if list(client.layer_ids) != needed:
            raise ValueError(f"the extraction client asks for layer ids {list(client.layer_ids)}, aux ids {list(self.aux_layer_ids)} need {needed}")
        self.client = client
        self.final_norm = final_norm
        self.lookahead_steps = max(1, int(lookahead_steps))
        self.liveness_s, self.probe_timeout_s = liveness_s, probe_timeout_s
        self._aux_cols = [client.column(k) for k in self.aux_layer_ids]
        self._last_col = client.column(num_layers)
        self.where = f"{client.base_url}, model {client.model}"
        self._pool = ThreadPoolExecutor(max_workers=client.concurrency, thread_name_prefix="online-states")
        self._outstanding: set[Future] = set()
        self._guard = threading.Lock()

    @classmethod
    def connect(cls, cfg: TrainConfig, log=print) -> "ServerStates":
        from eagle_assets.corpus.target import target_fingerprint
        from eagle_assets.engines.serving import api_key_from_env, connect
        from eagle_assets.hidden_states.engine_extract import EngineStateClient, final_norm_of

        text = _target_config(cfg.target)
        layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
        aux = online_aux_layer_ids(cfg.aux_layer_ids, cfg.warm_start, layers)
        key = api_key_from_env(cfg.extraction_api_key_env)
        try:
            server = connect(cfg.extraction_url, cfg.extraction_model, key)
        except (ConnectionError, ValueError) as exc:
            raise HiddenStateSourceError(f"hidden_states=server: {exc}") from None
        client = EngineStateClient(server.base_url, server.model, sorted(set(aux) | {layers}), api_key=key, concurrency=cfg.extraction_concurrency)
        corpus = CorpusSamples(cfg.corpus_dir, cfg.num_shards, cfg.max_seq_len, text.get("vocab_size"), target_fingerprint(cfg.target))
        log(
            f"hidden states online: the extraction server at {server.base_url} ({server.model}), {cfg.lookahead_steps} steps ahead, "
            f"{cfg.extraction_concurrency} requests in flight at most"
        )
        return cls(client, corpus, aux, layers, hidden, final_norm_of(cfg.target), cfg.lookahead_steps)

    # -- one sample
    def _fetch(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sample's bf16 (aux (T, n_aux*H), final (T, H)), as `EngineExtractor._fill` computes them."""
        ids = self.corpus.input_ids[position]
        states = self.client.one(ids)  # (T, n_ids, H)
        n, H = len(ids), self.hidden_size
        if states.shape[0] != n or states.shape[2] != H:
            from eagle_assets.hidden_states.engine_extract import EngineStateError

            raise EngineStateError(f"states of shape {tuple(states.shape)} for a sample of {n} tokens, width {H}")
        aux = states[:, self._aux_cols, :].reshape(n, self.num_aux * H).to(torch.bfloat16)
        final = self.final_norm(states[:, self._last_col, :]).to(torch.bfloat16)
        return aux, final

    def _submit(self, position: int) -> Future:
        with self._guard:
            future = self._pool.submit(self._fetch, position)
            self._outstanding.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future) -> None:
        with self._guard:
            self._outstanding.discard(future)

    def _gather(self, futures: list[Future]) -> tuple[torch.Tensor, torch.Tensor]:
        """The futures' states concatenated, once all are in; a failed request, or a server that
        stops answering /health while they wait, is a `HiddenStateSourceError` naming it."""
        from eagle_assets.engines.process import health_problem

        url = self.client.base_url
        while True:
            done, pending = wait(futures, timeout=self.liveness_s, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    raise HiddenStateSourceError(
                        f"the extraction server at {url} failed ({f.exception()}); the run stops here, its steps so far "
                        "checkpointed: restart the server (or point extraction_url at a live one) and rerun to resume"
                    ) from f.exception()
            if not pending:
                break
            problem = health_problem(f"{url}/health", self.probe_timeout_s, self.client.headers)
            if problem:
                raise HiddenStateSourceError(
                    f"the extraction server at {url} stopped answering ({problem}) with {len(pending)} request(s) waiting; "
                    "the run stops here, its steps so far checkpointed: restart the server and rerun to resume"
                )
        rows = [f.result() for f in futures]
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])

    def _rows(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gather([self._submit(p) for p in positions])

    def stream(self, steps: Steps, dtype: torch.dtype, device: torch.device):
        def collated():
            window: deque = deque()
            it = iter(steps)

            def ask_ahead(steps_asked: int) -> None:
                while len(window) < steps_asked:
                    item = next(it, None)
                    if item is None:
                        return
                    state, mine, tokens = item
                    window.append((state, mine, tokens, [[self._submit(p) for p in b] for b in mine]))

            ask_ahead(self.lookahead_steps + 1)
            while window:
                state, mine, tokens, futures = window.popleft()
                ask_ahead(self.lookahead_steps)  # with this one: the step about to train and `lookahead_steps` after it
                batches = [self.collate(b, dtype, rows=self._gather(fs)) for b, fs in zip(mine, futures)]
                if device.type == "cuda":
                    batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]
                yield state, batches, tokens

        return Prefetcher(collated(), depth=1)

    def close(self) -> None:
        """Cancel the requests not yet sent and wait for those in flight: each reads and removes
        its spool file, so the server's spool is left as it was found (unless the server died)."""
        with self._guard:
            outstanding = list(self._outstanding)
        for f in outstanding:  # outside the guard: a cancelled future runs its callback (`_forget`) here
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
