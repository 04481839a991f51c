"""runtime/nvrtc.py's version decisions, with fakes where a machine would be needed: CUBIN or PTX
from the GPU's architecture, NVRTC's version and the driver's (a clear error where neither would
load), and the headers of the CUDA that NVRTC is, not the first include folder found."""
from __future__ import annotations

import os

import pytest

from minicomp.runtime import nvrtc
from minicomp.runtime.nvrtc import NvrtcError, choose_target, pick_include

HAVE_12_4 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90]
HAVE_13_0 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]


@pytest.mark.parametrize("arch, have, nv, driver, want", [
    ("sm_90", HAVE_13_0, (13, 0), (13, 0), ("sm_90", "cubin")),
    ("sm_90", HAVE_13_0, (13, 0), None, ("sm_90", "cubin")),         # no driver asked: not checked
    ("sm_90", HAVE_13_0, (13, 5), (13, 0), ("sm_90", "cubin")),      # older minor: the CUBIN still loads
    ("sm_90", HAVE_12_4, (12, 4), (13, 1), ("sm_90", "cubin")),      # newer driver: anything loads
    ("sm_100", HAVE_12_4, (12, 4), (12, 8), ("compute_90", "ptx")),  # GPU newer than NVRTC: PTX, JIT'd
    ("sm_100", HAVE_12_4, (12, 4), (12, 4), ("compute_90", "ptx")),
])
def test_target(arch, have, nv, driver, want):
    assert choose_target(arch, have, nv, driver) == want


@pytest.mark.parametrize("arch, have, nv, driver, match", [
    ("sm_90", HAVE_13_0, (13, 0), (12, 8), "driver supports CUDA 12.8, older than this NVRTC's major"),
    ("sm_100", HAVE_12_4, (12, 4), (12, 2), "PTX it would make instead needs a driver of CUDA 12.4 or newer"),
    ("sm_70", HAVE_13_0, (13, 0), (13, 0), "older than anything NVRTC 13.0 targets"),
])
def test_target_refuses_what_would_not_load(arch, have, nv, driver, match):
    with pytest.raises(NvrtcError, match=match):
        choose_target(arch, have, nv, driver)


def test_target_reads_nvrtc_and_takes_the_drivers_version(monkeypatch):
    class Fake:
        @staticmethod
        def nvrtcVersion():
            return 0, 12, 4

        @staticmethod
        def nvrtcGetSupportedArchs():
            return 0, HAVE_12_4
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: Fake)
    assert nvrtc.target("sm_100", 12080) == ("compute_90", "ptx")  # cuDriverGetVersion's 12080 is 12.8
    with pytest.raises(NvrtcError, match="CUDA 12.2"):
        nvrtc.target("sm_100", 12020)
    with pytest.raises(NvrtcError, match="CUDA 11.8"):
        nvrtc.compile("__global__ void k() {}", "sm_90", driver=11080)  # refused before compiling


def _headers(root, name, version):
    d = os.path.join(root, name, "include")
    os.makedirs(d)
    open(os.path.join(d, "cuda_fp16.h"), "w").close()
    if version is not None:
        with open(os.path.join(d, "cuda_runtime_api.h"), "w") as f:
            f.write(f"#pragma once\n#define CUDART_VERSION  {version}\n")
    return d


def test_headers_match_nvrtcs_version(tmp_path):
    cu13 = _headers(tmp_path, "cu13", 13050)        # listed first, as the nvidia wheels sort
    cu12 = _headers(tmp_path, "cuda_runtime", 12080)
    home = _headers(tmp_path, "home", 13000)
    unknown = _headers(tmp_path, "odd", None)
    found = [cu13, cu12, home, unknown]
    assert pick_include(found, "12.8") == cu12, "not the first folder found"
    assert pick_include(found, "13.5") == cu13
    assert pick_include(found, "13.2") == home, "the newest of the same major not above NVRTC"
    assert pick_include(found, (12, 4)) == cu12, "the same major when none is older"
    with pytest.raises(NvrtcError, match=r"no CUDA 11 headers were found \(found .*cu13/include \(13.5\)"):
        pick_include(found, "11.8")
    with pytest.raises(NvrtcError, match="cuda_fp16.h not found"):
        pick_include([], "13.0")


def test_this_machines_headers_are_nvrtcs():
    pytest.importorskip("cuda.bindings")
    (folder,) = nvrtc.include_dirs()
    assert nvrtc.header_version(folder)[0] == nvrtc._pair(nvrtc.version())[0]
