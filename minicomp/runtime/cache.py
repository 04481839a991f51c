"""On-disk cache of compiled artifacts (CPU object code, CUBIN), shared by the backends.

Where: $MINICOMP_CACHE_DIR, else $XDG_CACHE_HOME/minicomp, else ~/.cache/minicomp. Keys are
hashes of everything that determines the bytes (source text, target, options, tool versions), and
every key includes this format's VERSION. Writes go to a temporary file renamed into place, so a
reader never sees half an entry (two processes writing one key at once both write whole files; the
last rename wins). Each entry starts with the sha256 of its bytes: a truncated or corrupted file
(loaded blindly, machine code would crash the process) fails the check, is dropped, and the caller
recompiles. A folder that cannot be written costs recompiles and one warning. The folder is kept
under $MINICOMP_CACHE_MAX_MB (default 1024): a write that takes it over drops the entries least
recently used (a read refreshes an entry's time) until it is back under 80% of that.
`python -m minicomp.cache --clear` empties it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile

from .. import options

VERSION = "minicomp-cache-2"
_warned: list = []
log = logging.getLogger("minicomp")


cache_dir = options.cache_dir   # read at each use: tests and users point it elsewhere in a running process
max_bytes = options.cache_max_bytes


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (VERSION,) + parts:
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
    try:
        os.utime(path)  # used: the last to be evicted
    except OSError:
        pass
    return data


def has(kind: str, k: str) -> bool:
    """Whether an entry is there (not whether it is whole: get checks that)."""
    return os.path.exists(os.path.join(cache_dir(), kind, k))


def put(kind: str, k: str, data: bytes) -> None:
    d = os.path.join(cache_dir(), kind)
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(data).digest() + data)
        os.replace(tmp, os.path.join(d, k))
    except OSError as e:  # a read-only or full disk costs a recompile next time, nothing else
        if not _warned:
            _warned.append(True)
            log.warning("cannot write the compile cache in %s (%s): compiled code will not be reused "
                        "across processes", cache_dir(), e.strerror or e)
        return
    _account(len(data) + 32)


# What this process believes the folder holds, so a write does not walk the whole folder (16k files
# took 0.4 s a write): a full scan on the first write, every RESCAN_PUTS writes (other processes
# write too) and when the estimate passes the limit.
RESCAN_PUTS = 256
_estimate: dict = {"dir": None, "bytes": 0, "puts": 0}


def _account(nbytes: int) -> None:
    limit = max_bytes()
    d = cache_dir()
    if _estimate["dir"] != d or _estimate["puts"] >= RESCAN_PUTS or _estimate["bytes"] + nbytes > limit:
        found = entries()
        total = sum(size for _, size, _ in found)
        _estimate.update(dir=d, bytes=total - evict(limit, found), puts=0)
    else:
        _estimate["bytes"] += nbytes
        _estimate["puts"] += 1


def drop(kind: str, k: str) -> None:
    try:
        os.remove(os.path.join(cache_dir(), kind, k))
    except OSError:
        pass


def entries() -> list:
    """(last used, bytes, path) of every entry, oldest first."""
    out = []
    for root, _, files in os.walk(cache_dir()):
        for f in files:
            path = os.path.join(root, f)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size, path))
    return sorted(out)


def evict(limit: int, found: list | None = None) -> int:
    """Drop the least recently used entries while the folder holds more than `limit` bytes (down to
    80% of it); returns the bytes dropped. `found`: entries(), when the caller just listed them."""
    found = entries() if found is None else found
    total = sum(size for _, size, _ in found)
    if total <= limit:
        return 0
    dropped = 0
    for _, size, path in found:
        if total - dropped <= 0.8 * limit:
            break
        try:
            os.remove(path)
            dropped += size
        except OSError:
            pass
    return dropped


def clear() -> int:
    """Remove every entry; returns the bytes freed."""
    return evict(-1) if entries() else 0
