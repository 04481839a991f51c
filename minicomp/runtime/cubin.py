"""What a CUBIN says each kernel needs, and whether a launch of it fits the GPU.

A launch fails with LAUNCH_OUT_OF_RESOURCES (inside a CUDA Graph capture, as a confusing capture
error) when its block wants more registers than an SM has, more threads than the kernel's
__launch_bounds__ or the hardware allow, or more shared memory than a block may declare. All of it
can be read from the compiled image without a GPU, so CI checks every kernel the tests generate and
the compiler can check its own before loading them.

A CUBIN is an ELF file. ptxas records, per kernel (from the CUDA toolkit's ELF attributes, as
cuobjdump --dump-resource-usage reads them):
  .nv.info            EIATTR_REGCOUNT (symbol, registers a thread), EIATTR_FRAME_SIZE (symbol, stack bytes)
  .nv.info.<kernel>   EIATTR_MAX_THREADS (x, y, z from __launch_bounds__), EIATTR_MAXREG_COUNT
  .nv.shared.<kernel> static shared memory (its size; on sm_90 it includes the 1 KiB the system
                      reserves per block, so the 48 KiB check is conservative there by 1 KiB)
Records are (format u8, attribute u8, u16 value or size), size bytes following for format 4.
Registers are allocated per warp in units of 256 (sm_80, sm_90), 65536 an SM and a block.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import MinicompError

MAX_THREADS = 1024              # threads a block may have
REGS_PER_BLOCK = 65536          # the register file of an SM (sm_80, sm_90), all a block may use
REG_UNIT = 256                  # registers are handed to warps in units this size
STATIC_SHARED_MAX = 48 * 1024   # __shared__ arrays a block may declare (more needs dynamic opt-in)

_SVAL = 4                       # a record with a payload of `size` bytes
_REGCOUNT, _FRAME_SIZE, _MAX_THREADS, _MAXREG = 0x2F, 0x11, 0x05, 0x1B


class LaunchResourceError(MinicompError):
    """A kernel's block would not launch on the GPU."""


@dataclass(frozen=True)
class Resources:
    name: str
    registers: int              # a thread
    shared_bytes: int           # static __shared__, a block
    stack_bytes: int            # local memory a thread (spills, arrays indexed at run time)
    max_threads: int | None     # what __launch_bounds__ allows; None without it
    max_registers: int | None   # the register cap ptxas compiled under (255 without launch bounds)


def block_registers(registers: int, threads: int) -> int:
    """Registers a block of `threads` takes: whole warps, each rounded up to the allocation unit."""
    per_warp = -(-registers * 32 // REG_UNIT) * REG_UNIT
    return per_warp * -(-threads // 32)


def _sections(image: bytes) -> dict:
    """name -> (type, offset, size, info) of every section of an ELF64 little-endian image."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF image (a CUBIN); PTX carries no resource counts")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", image, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * entsize) for i in range(count)]
    names_off = heads[names_at][4]

    def name(at):
        end = image.index(b"\0", names_off + at)
        return image[names_off + at:end].decode()
    return {name(h[0]): (h[1], h[4], h[5], h[7]) for h in heads}


def _records(image: bytes, offset: int, size: int):
    """(attribute, payload bytes or u16 value) of an .nv.info section."""
    p, end = offset, offset + size
    while p + 4 <= end:
        fmt, attr, value = struct.unpack_from("<BBH", image, p)
        if fmt == _SVAL:
            yield attr, image[p + 4:p + 4 + value]
            p += 4 + value
        else:
            yield attr, value
            p += 4


def _symbols(image: bytes, sections: dict) -> list:
    """Symbol names by index (.symtab entries are 24 bytes; names in .strtab)."""
    _, off, size, _ = sections[".symtab"]
    _, str_off, _, _ = sections[".strtab"]
    out = []
    for i in range(size // 24):
        at, = struct.unpack_from("<I", image, off + 24 * i)
        out.append(image[str_off + at:image.index(b"\0", str_off + at)].decode())
    return out


def resources(image: bytes) -> dict:
    """{kernel name: Resources} of every kernel (every .text.<name> section) in a CUBIN."""
    sections = _sections(image)
    symbols = _symbols(image, sections)
    regs, frame = {}, {}
    if ".nv.info" in sections:
        _, off, size, _ = sections[".nv.info"]
        for attr, payload in _records(image, off, size):
            if attr in (_REGCOUNT, _FRAME_SIZE) and isinstance(payload, bytes) and len(payload) == 8:
                sym, value = struct.unpack("<II", payload)
                (regs if attr == _REGCOUNT else frame)[symbols[sym]] = value
    out = {}
    for sec in sections:
        if not sec.startswith(".text."):
            continue
        name = sec[len(".text."):]
        max_threads = max_regs = None
        if f".nv.info.{name}" in sections:
            _, off, size, _ = sections[f".nv.info.{name}"]
            for attr, payload in _records(image, off, size):
                if attr == _MAX_THREADS and isinstance(payload, bytes) and len(payload) == 12:
                    x, y, z = struct.unpack("<III", payload)
                    max_threads = x * y * z
                elif attr == _MAXREG and isinstance(payload, int):
                    max_regs = payload
        if name not in regs:
            raise ValueError(f"CUBIN: no register count for kernel {name} (an ELF layout this parser does not know)")
        shared = sections.get(f".nv.shared.{name}", (0, 0, 0, 0))[2]
        out[name] = Resources(name, regs[name], shared, frame.get(name, 0), max_threads, max_regs)
    return out


def problems(r: Resources, threads: int, dynamic_shared: int = 0) -> list:
    """Why a block of `threads` of kernel `r` would not launch (empty when it fits)."""
    why = []
    if threads > MAX_THREADS:
        why.append(f"{threads} threads a block, the GPU's limit is {MAX_THREADS}")
    if r.max_threads is not None and threads > r.max_threads:
        why.append(f"{threads} threads a block, its __launch_bounds__ allows {r.max_threads}")
    need = block_registers(r.registers, threads)
    if need > REGS_PER_BLOCK:
        why.append(f"{r.registers} registers a thread x {threads} threads = {need} registers a block "
                   f"(warp-rounded), the SM has {REGS_PER_BLOCK}")
    if r.shared_bytes > STATIC_SHARED_MAX:
        why.append(f"{r.shared_bytes} bytes of static shared memory, a block may declare {STATIC_SHARED_MAX}")
    if dynamic_shared:
        why.append(f"{dynamic_shared} bytes of dynamic shared memory: the generator plans none")
    return why


def check(image: bytes, launches, arch: str = "") -> dict:
    """Raise LaunchResourceError naming every kernel whose launch would not fit; else {name: Resources}.
    `launches`: objects with .name, .block (threads) and .shared_bytes (dynamic), such as
    codegen.cuda.Launch; a kernel missing from the image is an error too."""
    found = resources(image)
    bad = []
    for la in launches:
        r = found.get(la.name)
        if r is None:
            bad.append(f"  {la.name}: not in the image")
            continue
        bad += [f"  {la.name}: {why}" for why in problems(r, la.block, la.shared_bytes)]
    if bad:
        where = f" for {arch}" if arch else ""
        raise LaunchResourceError(f"kernels that would not launch{where} (LAUNCH_OUT_OF_RESOURCES):\n" + "\n".join(bad))
    return found
