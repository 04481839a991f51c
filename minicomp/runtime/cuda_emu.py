"""cuda_emu: the CUDA C of the `cuda` backend, compiled by the host g++ against cuda_emu.h and run on
the CPU, so the exact kernels a GPU would run are tested without one.

One shared library per graph (all its kernels in one translation unit), cached on disk like CUBINs;
the emulation runtime (threads, barriers, shuffles) is one more library, built once and loaded
globally so kernel libraries link against it. Launches take pointers to argument values, as
cuLaunchKernel does.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading

from .. import options
from ..errors import MinicompError
from . import cache
from .nvrtc import numbered

VERSION = "minicomp-cuda-emu-2"
FLAGS = ["-x", "c++", "-O1", "-std=c++20", "-pthread", "-fPIC", "-shared", "-fno-strict-aliasing"]
HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_emu.h")
_LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_lock = threading.Lock()
_state: dict = {}


class EmuCompileError(MinicompError):
    pass


def _cxx_version() -> str:
    with _lock:
        if "version" not in _state:
            out = subprocess.run([options.cxx(), "--version"], capture_output=True, text=True, check=True)
            _state["version"] = out.stdout.splitlines()[0]
        return _state["version"]


FIRST = '#include "cuda_emu.h"\n'  # every kernel library's first line: its header precompiled once a process
_pch_lock = threading.Lock()
_pch: dict = {}                      # key of cuda_emu.h -> the folder of its precompiled form, or None


def _process_dir() -> str:
    """A folder of this process's own (removed at exit): dlopen needs plain files, g++ its headers."""
    d = os.path.join(tempfile.gettempdir(), f"minicomp-emu-{os.getpid()}")
    if not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
        atexit.register(shutil.rmtree, d, True)
    return d


def _precompiled(emu_header: str) -> str | None:
    """A folder holding cuda_emu.h and its precompiled form. Every kernel library starts with it, and
    parsing it (the C++ standard headers under it) was 0.24 s of a library's 0.30 s compile; from the
    precompiled form a compile takes 0.13-0.17 s. Built on the first compile of a process (0.5 s).
    None where the compiler cannot build it: each compile then parses the header itself, as g++ also
    does with a precompiled form it cannot use."""
    k = cache.key(VERSION, "pch", _cxx_version(), " ".join(FLAGS), emu_header)
    with _pch_lock:
        if k not in _pch:
            d = os.path.join(_process_dir(), "pch-" + k[:16])
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "cuda_emu.h"), "w") as f:
                f.write(emu_header)
            flags = ["-x", "c++-header"] + [f for f in FLAGS if f not in ("-x", "c++", "-shared")]
            proc = subprocess.run([options.cxx(), *flags, "-o", os.path.join(d, "cuda_emu.h.gch"),
                                   os.path.join(d, "cuda_emu.h")], capture_output=True)
            _pch[k] = d if proc.returncode == 0 else None
        return _pch[k]


def _shared_library(source: str, headers: dict, mode: int = ctypes.RTLD_LOCAL) -> ctypes.CDLL:
    """Compile (or fetch from the cache) `source` with `headers` beside it, and load it."""
    with open(HEADER) as f:
        emu_header = f.read()
    k = cache.key(VERSION, _cxx_version(), " ".join(FLAGS), emu_header,
                  *[f"{n}\0{t}" for n, t in sorted(headers.items())], source)
    data = cache.get("cuda_emu", k)  # checksummed; a corrupt entry comes back as None
    if data is None:
        pch = _precompiled(emu_header) if source.startswith(FIRST) else None
        with tempfile.TemporaryDirectory(prefix="minicomp-emu-") as d:
            for name, body in {**headers, "cuda_emu.h": emu_header}.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(body)
            out = os.path.join(d, "module.so")
            search = ["-I", pch] if pch else []  # found first, beside its precompiled form
            proc = subprocess.run([options.cxx(), *FLAGS, *search, "-I", d, "-o", out, "-"], input=source, text=True,
                                  capture_output=True)
            if proc.returncode != 0:
                raise EmuCompileError(f"cuda_emu: {options.cxx()} could not compile the kernels:\n{proc.stderr}\n"
                                      f"source:\n{numbered(source)}")
            with open(out, "rb") as f:
                data = f.read()
        cache.put("cuda_emu", k, data)
    return _dlopen(k, data, mode)


def _dlopen(k: str, data: bytes, mode: int) -> ctypes.CDLL:
    """dlopen needs a plain file: the verified bytes go to a per-process file, loaded from there."""
    path = os.path.join(_process_dir(), k + ".so")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=_process_dir())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return ctypes.CDLL(path, mode=mode)


def _runtime() -> ctypes.CDLL:
    """The emulation runtime, loaded with RTLD_GLOBAL: kernel libraries resolve mc_emu_* from it."""
    with _lock:
        lib = _state.get("runtime")
    if lib is None:
        lib = _shared_library('#define MC_EMU_RUNTIME\n#include "cuda_emu.h"\n', {}, ctypes.RTLD_GLOBAL)
        lib.mc_emu_error.restype = ctypes.c_char_p
        with _lock:
            _state["runtime"] = lib
    return lib


class EmuModule:
    """The kernels of one CUDA source; `function(name)` launches through cuda_emu's runtime.
    `headers`: name -> text of files the source includes (the prelude)."""

    def __init__(self, source: str, names: list, headers: dict):
        _runtime()
        thunks = "".join(f"static void mc_emu_run_{n}(void** a) {{ mc_emu_call({n}, a); }}\n"
                         f'extern "C" int mc_emu_launch_{n}(const unsigned* cfg, void** a) '
                         f"{{ return mc_emu_launch(cfg, mc_emu_run_{n}, a); }}\n" for n in names)
        self.lib = _shared_library(FIRST + source + "\n" + thunks, headers)

    def function(self, name: str):
        return _LAUNCH_T(("mc_emu_launch_" + name, self.lib))


class EmuLaunch:
    """A program step: launch one kernel with the env slots of its buffers as arguments, then
    `sizes` (a kernel over symbolic sizes: their values, `long long` arguments after the buffers)."""

    def __init__(self, module: EmuModule, name: str, grid: int, block: int, shared_bytes: int, slots: list,
                 sizes=()):
        self.module, self.name, self.slots, self.sizes = module, name, slots, tuple(sizes)
        self.fn = module.function(name)
        self.cfg = (ctypes.c_uint * 7)(grid, 1, 1, block, 1, 1, shared_bytes)
        self.values = (ctypes.c_void_p * max(len(slots), 1))()
        self.size_values = (ctypes.c_longlong * max(len(self.sizes), 1))(*self.sizes)
        base, sizes_at = ctypes.addressof(self.values), ctypes.addressof(self.size_values)
        word, ll = ctypes.sizeof(ctypes.c_void_p), ctypes.sizeof(ctypes.c_longlong)
        self.args = (ctypes.c_void_p * max(len(slots) + len(self.sizes), 1))(
            *[base + i * word for i in range(len(slots))], *[sizes_at + i * ll for i in range(len(self.sizes))])

    def private(self) -> "EmuLaunch":
        """This launch with argument arrays of its own, for a call running beside this one (the
        runtime takes one launch at a time; the arrays are filled before it is taken)."""
        return EmuLaunch(self.module, self.name, self.cfg[0], self.cfg[3], self.cfg[6], self.slots, self.sizes)

    def emit(self, k: int, v, ns: dict) -> list:
        """The generated call's lines for this launch (runtime/program.py): fill the arguments, launch."""
        ns[f"L{k}"], ns[f"V{k}"] = self, self.values
        return [f"V{k}[{i}] = {v(s)}.data_ptr()" for i, s in enumerate(self.slots)] + [f"L{k}.launch()"]

    def launch(self) -> None:
        rc = self.fn(ctypes.addressof(self.cfg), ctypes.addressof(self.args))
        if rc == 3:
            raise RuntimeError(f"cuda_emu: kernel {self.name}: {_runtime().mc_emu_error().decode()}")
        if rc != 0:
            raise RuntimeError(f"cuda_emu: launch of {self.name} refused (code {rc})")
