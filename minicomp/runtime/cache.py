"""On-disk cache of compiled artifacts (CPU object code, CUBIN), shared by the backends.

Where: $MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp. Keys are
hashes of everything that determines the bytes (source text, target, options, tool versions).
Writes go to a temporary file renamed into place, so a reader never sees half an entry. Each entry
starts with the sha256 of its bytes: a truncated or corrupted file (loaded blindly, machine code
would crash the process) fails the check, is dropped, and the caller recompiles.
"""
from __future__ import annotations

import hashlib
import os
import tempfile


def cache_dir() -> str:
    d = os.environ.get("MINICOMP_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "minicomp")
    return d


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def get(kind: str, k: str) -> bytes | None:
    path = os.path.join(cache_dir(), kind, k)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    digest, data = blob[:32], blob[32:]
    if len(blob) < 32 or hashlib.sha256(data).digest() != digest:
        drop(kind, k)
        return None
    return data


def put(kind: str, k: str, data: bytes) -> None:
    d = os.path.join(cache_dir(), kind)
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(data).digest() + data)
        os.replace(tmp, os.path.join(d, k))
    except OSError:
        pass  # a read-only or full disk costs a recompile next time, nothing else


def drop(kind: str, k: str) -> None:
    try:
        os.remove(os.path.join(cache_dir(), kind, k))
    except OSError:
        pass
