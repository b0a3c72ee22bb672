"""The host's CPU kind, the caps that take a lesser kind's kernels, the dtype a launched CPU
server computes in on each kind, and the kernel choices the engine plugin logs."""

from __future__ import annotations

import json
import subprocess

import pytest

from eagle_assets.engines import logs
from eagle_assets.engines.cpu_isa import KINDS, HostCpu, cap_environment, caps_for, host_cpu, kind_of
from eagle_assets.engines.vllm_launch import ENGINE_SITE, engine_environment, served_dtype
from eagle_assets.paths import engine_venv
from eagle_assets.settings_env import SettingError

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_the_kind_is_the_best_the_flags_make():
    assert kind_of(AVX512 | {"avx512_bf16", "amx_tile", "amx_bf16"}) == "amx"
    assert kind_of(AVX512 | {"avx512_bf16"}) == "avx512_bf16"
    assert kind_of(AVX512 | {"amx_tile", "amx_bf16"}) == "avx512"  # AMX without AVX-512 BF16 is no kind here
    assert kind_of(AVX512) == "avx512"
    assert kind_of({"avx2", "fma", "avx512f"}) == "avx2"  # AVX-512 foundation alone is not torch's AVX-512
    assert kind_of({"sse4_2"}) == "baseline"
    assert caps_for("amx") == KINDS and caps_for("avx2") == ("avx2",) and caps_for("baseline") == ()


def test_a_cap_sets_every_librarys_variable_and_a_higher_one_is_refused(monkeypatch):
    assert cap_environment(None) == {}
    assert cap_environment("avx2") == {"EAGLE_ASSETS_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cap_environment("avx512_bf16")["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    native = host_cpu().native
    try:
        monkeypatch.setenv("EAGLE_ASSETS_CPU_ISA", "avx2")
        host_cpu.cache_clear()
        assert host_cpu().kind == "avx2" and host_cpu().native == native and "capped from" in host_cpu().describe()
        monkeypatch.setenv("EAGLE_ASSETS_CPU_ISA", "sse9")
        host_cpu.cache_clear()
        with pytest.raises(SettingError, match="EAGLE_ASSETS_CPU_ISA='sse9' is not one of amx, avx512_bf16, avx512, avx2"):
            host_cpu()
        if native != "amx":
            monkeypatch.setenv("EAGLE_ASSETS_CPU_ISA", "amx")
            host_cpu.cache_clear()
            with pytest.raises(SettingError, match=f"processor is {native} .* a cap can only take a lesser kind's kernels"):
                host_cpu()
    finally:
        host_cpu.cache_clear()


def test_the_served_dtype_is_fp32_but_for_mla_on_amx(tmp_path, monkeypatch, smollm2_path):
    mla = tmp_path / "mla"
    mla.mkdir()
    (mla / "config.json").write_text(json.dumps({"text_config": {"kv_lora_rank": 512, "num_hidden_layers": 2}}))
    amx, epyc = HostCpu("Intel Xeon", "amx"), HostCpu("AMD EPYC", "avx512_bf16")
    capped = HostCpu("Intel Xeon", "amx", cap="avx512_bf16")
    assert served_dtype(mla, "cpu", amx) == "bfloat16"
    assert served_dtype(mla, "cpu", epyc) == served_dtype(mla, "cpu", capped) == "float32"
    assert served_dtype(smollm2_path, "cpu", amx) == "float32" and served_dtype(smollm2_path, "cuda", epyc) == "bfloat16"
    monkeypatch.setenv("EAGLE_ASSETS_SERVE_DTYPE", "bfloat16")
    assert served_dtype(smollm2_path, "cpu", epyc) == "bfloat16"
    monkeypatch.setenv("EAGLE_ASSETS_SERVE_DTYPE", "float32")
    with pytest.raises(SettingError, match="AMX_MLA backend, which runs bfloat16 only; set EAGLE_ASSETS_CPU_ISA=avx512_bf16"):
        served_dtype(mla, "cpu", amx)


def test_the_engine_processes_see_the_cap_and_log_their_kernels(tmp_path, monkeypatch):
    """sitecustomize.py lowers torch.cpu's feature checks in the engine's own interpreter, and the
    plugin's kernel library follows them; the pipeline reads the lines the plugin logs."""
    python = engine_venv("vllm") / "bin" / "python"
    probe = (
        "import torch.cpu as c, eagle_assets_vllm_fixes as f; "
        "print(c._is_amx_tile_supported(), c._is_avx512_bf16_supported(), c._is_avx512_supported(), f.kernel_library())"
    )
    want = {"avx512_bf16": "False True True _C", "avx512": "False False True _C_AVX512", "avx2": "False False False _C_AVX2"}
    for cap in caps_for(host_cpu().native)[1:]:
        monkeypatch.setenv("EAGLE_ASSETS_CPU_ISA", cap)
        host_cpu.cache_clear()
        env = engine_environment(engine_venv("vllm"))
        host_cpu.cache_clear()
        assert env["PYTHONPATH"] == str(ENGINE_SITE) and env["ATEN_CPU_CAPABILITY"] == cap_environment(cap)["ATEN_CPU_CAPABILITY"]
        done = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert done.stdout.split("\n")[-2] == want[cap], done.stderr[-2000:]

    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) INFO 12-05 03:27:25 [eagle_assets_vllm_fixes.py:80] eagle_assets kernels: library _C_AVX2\n"
        "(Worker pid=2) INFO 12-05 03:27:26 [eagle_assets_vllm_fixes.py:86] eagle_assets kernels: backend CPU_MLA\n"
        "(Worker pid=2) INFO 12-05 03:27:26 [eagle_assets_vllm_fixes.py:86] eagle_assets kernels: library _C_AVX2\n"
        "(Worker pid=2) INFO 12-05 03:27:27 [eagle_assets_vllm_fixes.py:91] eagle_assets kernels: attention path vec16 (float32, block size 16)\n"
    )
    assert logs.engine_kernels(log) == ["library _C_AVX2", "backend CPU_MLA", "attention path vec16 (float32, block size 16)"]
    assert logs.engine_kernels(tmp_path / "missing.log") == []
    site = (ENGINE_SITE / "eagle_assets_vllm_fixes.py").read_text()
    assert f'KERNELS_MARK = "{logs.KERNELS_MARK}"' in site  # the engine writes what the pipeline reads
