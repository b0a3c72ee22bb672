"""Hidden states from the serving engine: vLLM's `extract_hidden_states`, in our shard format.

The engine already runs the target the way it serves it: tensor and expert parallel, in its
own kernels and quantisation, at whatever size the cluster holds. An extraction server (vLLM
launched with `engines/vllm_launch.extraction_config(ids)` and `hidden_states_transfer(dir)`)
captures, for every prompt token, the residual stream after each of `ids` decoder layers (our
numbering: id k = Hugging Face `hidden_states[k]`, un-normed) and writes each finished request's
states to `dir/<request id>.safetensors`. `EngineStateClient` sends a sample's token ids as the
prompt of a one-token completion, waits on the file's lock, reads the states and removes the
file. `EngineExtractor` writes them into the same shards, with the same manifest, as the
Hugging Face `Extractor`; one server serves every shard, and a shard's rebuild reloads nothing.

The final normed state is not a residual stream the engine captures. It is derived exactly:
the engine captures id L (the last layer's output before the final norm, r_L) beside the aux
ids, and `FinalNorm` applies the target's own final RMSNorm to it, `w * r_L / sqrt(mean(r_L^2)
+ eps)` in fp32, with the weight read from the checkpoint (one tensor, not the model) and
`rms_norm_eps` from its config, as the engines and Hugging Face compute it for these families.

    client = EngineStateClient(server.base_url, server.model, storage, layer_ids=(2, 15, 27, 30))
    with EngineExtractor(client, settings, num_layers=30, hidden_size=576, vocab_size=49152,
                         final_norm=final_norm_of(target_folder)) as extractor:
        extract_all(extractor, corpus_dir, out_dir, settings, tokenizer=tokenizer)

Both sides must see the spool folder at the same path: the same host, or a shared volume.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
from safetensors.torch import load_file

from eagle_assets.checked_reads import read_json_object
from eagle_assets.drafter.target_head import read_named_tensor
from eagle_assets.hidden_states.corpus_io import ShardSamples
from eagle_assets.hidden_states.extract import ExtractSettings, ShardExtractor, _progress
from eagle_assets.hidden_states.writer import ShardWriter
from eagle_assets.http_client import auth_headers, client, retry_after_s, retry_delay_s, retryable_status

log = logging.getLogger(__name__)

# Model families whose final norm is a plain RMSNorm, w * x / rms(x): the derivation of the normed
# final state from r_L holds for them. Another family is refused rather than derived wrongly.
RMS_NORM_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "kimi_k25",
)

# Where the final norm's weight lives, by checkpoint layout (plain causal LM; Kimi-K2.5's wrapper).
FINAL_NORM_NAMES = ("model.norm.weight", "language_model.model.norm.weight", "model.language_model.norm.weight")


@dataclass(frozen=True)
class FinalNorm:
    """The target's final RMSNorm, applied in fp32: r_L (T, H) -> the normed final state (T, H)."""

    weight: torch.Tensor
    """(H,) fp32."""
    eps: float

    def __call__(self, r_last: torch.Tensor) -> torch.Tensor:
        x = r_last.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def final_norm_of(target_folder: str | Path) -> FinalNorm:
    """The final norm of a Hugging Face target folder, read without loading the model."""
    folder = Path(target_folder)
    config = read_json_object(folder / "config.json", "the target's config", "copy the model's config.json again")
    text = config.get("text_config") or config
    model_type = text.get("model_type") or config.get("model_type")
    if model_type not in RMS_NORM_MODEL_TYPES and config.get("model_type") not in RMS_NORM_MODEL_TYPES:
        raise ValueError(
            f"{folder}: model type {model_type!r} is not one whose final norm is a plain RMSNorm "
            f"({', '.join(RMS_NORM_MODEL_TYPES)}), so the normed final state cannot be derived from the engine's "
            "captured states: extract this target with Hugging Face (hidden_state_shards source: hf)"
        )
    eps = text.get("rms_norm_eps")
    if eps is None:
        raise ValueError(f"{folder}/config.json has no rms_norm_eps: copy the model's config.json again")
    try:
        weight = read_named_tensor(folder, FINAL_NORM_NAMES)
    except KeyError as exc:
        raise ValueError(f"{exc.args[0]}: no final norm weight, so the normed final state cannot be derived") from None
    return FinalNorm(weight.float(), float(eps))


class EngineStateError(RuntimeError):
    """The extraction server failed a request, or wrote something other than what was asked."""


class EngineStateClient:
    """Asks an extraction server for the captured states of token sequences, over HTTP.

    `layer_ids` are the ids the server captures (its `eagle_aux_hidden_state_layer_ids`), in
    ascending order: column j of a file's `hidden_states` (T, n_ids, H) holds id `layer_ids[j]`.
    Up to `concurrency` requests are in flight, so the engine batches them.

    Deadlines: a request's answer comes whole, once its prefill ends, so a stalled server and a
    long prefill look alike until one ends. Each request gets a deadline that fits its length,
    `deadline_base_s` plus `deadline_per_token_s` per token, at most `timeout_s`, for the answer
    and the states' file together; past it, `EngineStateError` names the server (a retry would
    stall as long). A refused or dropped connection, HTTP 5xx, 408 or 429 is tried again, up to
    `attempts` in all, after a backoff of at least what a `Retry-After` header asks.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        layer_ids: Sequence[int],
        api_key: str | None = None,
        concurrency: int = 16,
        timeout_s: float = 1800.0,
        deadline_base_s: float = 120.0,
        deadline_per_token_s: float = 0.05,
        attempts: int = 3,
        retry_after_max_s: float = 300.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.layer_ids = tuple(sorted({int(k) for k in layer_ids}))
        self.concurrency = max(1, int(concurrency))
        self.timeout_s, self.deadline_base_s, self.deadline_per_token_s = timeout_s, deadline_base_s, deadline_per_token_s
        self.attempts, self.retry_after_max_s = max(1, int(attempts)), retry_after_max_s
        self.headers = auth_headers(api_key)
        # A long prefill of a large model can take minutes; connecting should not.
        self._http = client(api_key, timeout_s)

    def close(self) -> None:
        self._http.close()

    def column(self, layer_id: int) -> int:
        return self.layer_ids.index(layer_id)

    def deadline_s(self, num_tokens: int) -> float:
        """Seconds the states of a sequence of `num_tokens` tokens may take (class docstring)."""
        return min(self.timeout_s, self.deadline_base_s + num_tokens * self.deadline_per_token_s)

    def one(self, token_ids: np.ndarray) -> torch.Tensor:
        """The captured states of one sequence: (T, n_ids, H), in the engine's dtype."""
        ids = [int(t) for t in token_ids]
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        deadline = self.deadline_s(len(ids))
        ends = time.monotonic() + deadline
        resp = self._post(body, deadline)
        path = (resp.json().get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise EngineStateError(
                f"the server at {self.base_url} returned no hidden_states_path: it does not extract hidden states. Launch it "
                "with the extraction configs (engines/vllm_launch.extraction_config and hidden_states_transfer)"
            )
        states, got_ids = take_spooled(Path(path), ends - time.monotonic(), self.base_url)
        if got_ids != ids:
            raise EngineStateError(f"{path}: the engine wrote the states of another sequence than the one sent")
        if states.shape[1] != len(self.layer_ids):
            raise EngineStateError(
                f"{path}: {states.shape[1]} states per token, but the client expects the {len(self.layer_ids)} of "
                f"layer ids {list(self.layer_ids)}: the server captures other layers"
            )
        return states

    def _post(self, body: dict, deadline: float) -> httpx.Response:
        """The request's 200 answer, retried on what a retry may cure (class docstring)."""
        url, tokens = f"{self.base_url}/v1/completions", len(body["prompt"])
        for attempt in range(1, self.attempts + 1):
            wait = None
            try:
                resp = self._http.post(url, json=body, timeout=httpx.Timeout(deadline, connect=30.0))
            except httpx.TimeoutException as exc:
                if isinstance(exc, httpx.ConnectTimeout):
                    problem = f"did not take the connection ({type(exc).__name__})"
                else:  # no answer within the deadline: it takes requests but does no work
                    raise EngineStateError(
                        f"the extraction server at {self.base_url} did not answer a request of {tokens} tokens within its "
                        f"deadline of {deadline:.0f} s ({self.deadline_base_s:g} s and {self.deadline_per_token_s:g} s a token): "
                        "it takes requests but makes no progress. See its log, restart it and rerun"
                    ) from None
            except httpx.HTTPError as exc:  # refused or dropped: it may be restarting
                problem = f"did not answer ({type(exc).__name__}: {exc})"
            else:
                if resp.status_code == 200:
                    return resp
                if not retryable_status(resp.status_code):
                    raise EngineStateError(f"the extraction server at {self.base_url} answered {resp.status_code}: {resp.text[:500]}")
                problem = f"answered {resp.status_code}: {resp.text[:200]}"
                wait = retry_after_s(resp.headers.get("Retry-After"))
            if attempt == self.attempts:
                raise EngineStateError(f"the extraction server at {self.base_url} {problem}, {attempt} times; is it still running?")
            log.warning("extraction request of %d tokens: the server at %s %s; retrying", tokens, self.base_url, problem)
            time.sleep(retry_delay_s(attempt, retry_after=wait, retry_after_max_s=self.retry_after_max_s))
        raise AssertionError("unreachable")

    def states(self, sequences: Sequence[np.ndarray]) -> Iterator[tuple[int, torch.Tensor]]:
        """(index, states) of each sequence, as they finish (any order)."""
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="engine-states") as pool:
            futures = {pool.submit(self.one, ids): i for i, ids in enumerate(sequences)}
            try:
                for future in as_completed(futures):
                    yield futures[future], future.result()
            finally:
                for future in futures:
                    future.cancel()


def take_spooled(path: Path, wait_s: float = 600.0, server: str = "the engine") -> tuple[torch.Tensor, list[int]]:
    """Read one file the connector wrote, once its writer has released the lock (waiting at most
    `wait_s`); then remove it."""
    lock = Path(str(path) + ".lock")
    if not path.exists() and not lock.exists():
        raise EngineStateError(
            f"the engine reports its states at {path}, which this host cannot see: the pipeline and the engine "
            "must share the spool folder at the same path (the same host, or a shared volume)"
        )
    try:
        if lock.exists():
            with open(lock) as held:
                _shared_lock(held, wait_s, f"{server} still holds {lock}, the lock of the states it reported at {path}")
        data = load_file(str(path))
    except (OSError, ValueError) as exc:
        raise EngineStateError(f"cannot read the engine's states at {path} ({exc}); see the engine's log") from exc
    finally:
        for p in (path, lock):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
    return data["hidden_states"], [int(t) for t in data["token_ids"].tolist()]


def _shared_lock(f, wait_s: float, what: str) -> None:
    """A shared flock on `f` once its writer releases its exclusive one, polled: a writer that
    never lets go fails the request after `wait_s` instead of holding it forever."""
    ends = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= ends:
                raise EngineStateError(f"{what}, past the request's deadline: see the engine's log") from None
            time.sleep(0.01)


class EngineExtractor(ShardExtractor):
    """Shards filled from an extraction server (`EngineStateClient`) instead of a local model.

    The client must capture the aux ids and id `num_layers` (r_L, from which `final_norm`
    derives the normed final state).
    """

    source = "vllm extract_hidden_states"

    def __init__(
        self,
        client: EngineStateClient,
        settings: ExtractSettings,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        final_norm: FinalNorm,
        model_dtype: str = "engine",
    ):
        super().__init__(settings, num_layers, hidden_size, vocab_size)
        needed = sorted(set(self.aux_ids) | {num_layers})
        if list(client.layer_ids) != needed:
            raise ValueError(
                f"the extraction server captures layer ids {list(client.layer_ids)}, but aux ids {list(self.aux_ids)} "
                f"need {needed} (the aux ids and {num_layers}, the last layer's output, for the normed final state)"
            )
        self.client = client
        self.final_norm = final_norm
        self.model_dtype = model_dtype
        self._aux_cols = [client.column(k) for k in self.aux_ids]
        self._last_col = client.column(num_layers)

    def layer_ids(self) -> list[int]:
        return list(self.client.layer_ids)

    def _fill(self, samples: ShardSamples, batches, offsets, writer: ShardWriter, shard_index, on_batch) -> list[torch.Tensor]:
        counts = samples.token_counts
        H = self.hidden_size
        pool = self._buffers(max(counts, default=1))
        bar = _progress(self.settings.progress, int(offsets[-1]), f"shard {shard_index} (engine)")
        finite: list[torch.Tensor] = [torch.tensor(True)] * len(counts)  # per sample, in the shard's order
        done = 0
        try:
            for i, states in self.client.states(samples.input_ids):
                rows, row0 = counts[i], int(offsets[i])
                if states.shape[0] != rows or states.shape[2] != H:
                    raise EngineStateError(f"shard {shard_index}: states of shape {tuple(states.shape)} for a sample of {rows} tokens, width {H}")
                aux = states[:, self._aux_cols, :].reshape(rows, len(self._aux_cols) * H)  # (T_i, n_aux*H)
                final = self.final_norm(states[:, self._last_col, :])  # (T_i, H), fp32
                bufs = pool.acquire()
                bufs.aux[:rows].copy_(aux)
                bufs.final[:rows].copy_(final)
                finite[i] = torch.isfinite(bufs.aux[:rows]).all() & torch.isfinite(bufs.final[:rows]).all()
                writer.put(row0, rows, bufs, pool)
                bar.update(rows)
                done += 1
                if on_batch is not None:
                    on_batch(shard_index, done - 1, len(counts))
        finally:
            bar.close()
        return finite

    def _check_finite(self, finite, batches, samples: ShardSamples, shard_index: int) -> None:
        # One flag per sample here (the engine answers per sample), not per batch.
        super()._check_finite(finite, [(i, i + 1) for i in range(len(finite))], samples, shard_index)
