"""On-disk cache of compiled artifacts (CPU object code, CUBIN), shared by the backends.

Where: $MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp. Keys are
hashes of everything that determines the bytes (source text, target, options, tool versions).
Writes go to a temporary file renamed into place, so a reader never sees half an entry; a
corrupt entry is the caller's to detect (it fails to load) and simply gets recompiled.
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
            return f.read()
    except OSError:
        return None


def put(kind: str, k: str, data: bytes) -> None:
    d = os.path.join(cache_dir(), kind)
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(d, k))
    except OSError:
        pass  # a read-only or full disk costs a recompile next time, nothing else


def drop(kind: str, k: str) -> None:
    try:
        os.remove(os.path.join(cache_dir(), kind, k))
    except OSError:
        pass
