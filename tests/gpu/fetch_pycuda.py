"""Carry pycuda to a GPU machine that has no network.

    python tests/gpu/fetch_pycuda.py            # here, with network access: files into .gpu_wheels/
    python tests/gpu/fetch_pycuda.py --install  # there, offline: build pycuda from .gpu_wheels/ and install it

pycuda has no wheels: it is built from its source against the machine's CUDA headers and linked
against libcuda, so it is built where it runs. The fetch step downloads the pycuda source and the
cp312 manylinux wheels of what it needs at run time that a GPU image may lack (pytools, platformdirs,
mako and theirs); numpy, setuptools and wheel are expected on the GPU machine (its PyTorch image
has them). `--install` builds with `pip install --no-build-isolation --no-index --find-links`, with
curand off (we use none of it), every C++ file compiled in parallel, and libcuda found where the
driver put it when the toolkit has no stub. check.py calls it when `import pycuda.driver` fails.
The folder is ignored through .git/info/exclude, so it travels to the device (carry it) but is
never committed.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FOLDER = os.path.join(ROOT, ".gpu_wheels")
PYCUDA = "pycuda==2025.1.3"  # >= 2025.1.2: the first to build against CUDA 13 (cuCtxCreate's new signature)
WHEELS = ["pytools==2026.1.1", "platformdirs==4.14.9", "typing_extensions==4.16.0", "mako==1.4.3",
          "markupsafe==3.0.4", "siphash24==1.9"]
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
              for a in ("--platform", p)]]
LIBCUDA_DIRS = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                "/usr/lib/wsl/lib"]


def pip(*args: str) -> None:
    print("+ pip", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def fetch(folder: str = FOLDER) -> None:
    os.makedirs(folder, exist_ok=True)
    # the source only: --no-build-isolation keeps pip from building its build dependencies to read its metadata
    pip("download", "--no-deps", "--no-build-isolation", "--no-binary=:all:", "-d", folder, PYCUDA)
    pip("download", "--no-deps", *PLATFORM, "-d", folder, *WHEELS)
    exclude = os.path.join(ROOT, ".git", "info", "exclude")
    if os.path.isdir(os.path.dirname(exclude)):
        lines = open(exclude).read().splitlines() if os.path.exists(exclude) else []
        if "/.gpu_wheels/" not in lines:
            with open(exclude, "a") as f:
                f.write("/.gpu_wheels/\n")
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*")))
    print(f"{folder}: {len(os.listdir(folder))} files, {total / 2**20:.1f} MiB; "
          "carry it to the device (run(..., carry=['.gpu_wheels']))")


def cuda_root() -> str:
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME", "")] + (
        [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []) + ["/usr/local/cuda"]
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "include", "cuda.h")):
            return c
    raise SystemExit("fetch_pycuda: no CUDA toolkit with include/cuda.h ($CUDA_HOME, nvcc on PATH, /usr/local/cuda)")


def libcuda_dir(root: str, scratch: str) -> str:
    """A folder with libcuda.so to link against: the toolkit's stub, else the driver's libcuda.so.1
    behind a libcuda.so link made in `scratch` (the driver ships only the versioned name)."""
    for d in (os.path.join(root, "lib64", "stubs"), os.path.join(root, "targets", "x86_64-linux", "lib", "stubs")):
        if os.path.exists(os.path.join(d, "libcuda.so")):
            return d
    found = [os.path.join(d, n) for d in LIBCUDA_DIRS for n in ("libcuda.so", "libcuda.so.1")
             if os.path.exists(os.path.join(d, n))]
    if not found:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        found = [line.split("=>")[-1].strip() for line in out.splitlines() if "libcuda.so" in line]
    if not found:
        raise SystemExit("fetch_pycuda: no libcuda.so (toolkit stub or driver library) to link pycuda against")
    os.symlink(found[0], os.path.join(scratch, "libcuda.so"))
    return scratch


def install(folder: str = FOLDER) -> None:
    if not glob.glob(os.path.join(folder, "pycuda-*.tar.gz")):
        raise SystemExit(f"fetch_pycuda: no pycuda source in {folder}: run `python tests/gpu/fetch_pycuda.py` "
                         "on a machine with network access to the package index and carry the folder")
    root = cuda_root()
    with tempfile.TemporaryDirectory(prefix="pycuda-build-") as home:
        libdir = libcuda_dir(root, home)
        with open(os.path.join(home, ".aksetup-defaults.py"), "w") as f:  # pycuda's build reads this
            f.write(f"CUDA_ROOT = {root!r}\nCUDA_ENABLE_CURAND = False\nCUDADRV_LIB_DIR = {[libdir]!r}\n")
        with open(os.path.join(home, ".pydistutils.cfg"), "w") as f:  # setuptools' build_ext reads this
            f.write(f"[build_ext]\nparallel = {os.cpu_count() or 1}\n")
        env = {**os.environ, "HOME": home}
        print(f"+ pip install {PYCUDA} from {folder} (CUDA {root}, libcuda in {libdir})", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--find-links", folder, PYCUDA], check=True, env=env)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--install", action="store_true", help="build and install pycuda from the folder (offline)")
    ap.add_argument("--folder", default=FOLDER)
    a = ap.parse_args()
    install(a.folder) if a.install else fetch(a.folder)
