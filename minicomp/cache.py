"""The compile cache from the command line.

    python -m minicomp.cache            where it is, how many entries, how big
    python -m minicomp.cache --clear    remove every entry
"""
from __future__ import annotations

import argparse
import sys

from .runtime import cache


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicomp.cache", description=__doc__.split("\n\n")[0])
    p.add_argument("--clear", action="store_true", help="remove every entry")
    args = p.parse_args(argv)
    if args.clear:
        print(f"cleared {cache.clear():,} bytes from {cache.cache_dir()}")
        return 0
    found = cache.entries()
    kinds: dict = {}
    for _, size, path in found:
        kind = path[len(cache.cache_dir()):].strip("/").split("/")[0]
        n, b = kinds.get(kind, (0, 0))
        kinds[kind] = (n + 1, b + size)
    print(f"{cache.cache_dir()}: {len(found)} entries, {sum(s for _, s, _ in found):,} bytes "
          f"(limit {cache.max_bytes():,}: MINICOMP_CACHE_MAX_MB)")
    for kind, (n, b) in sorted(kinds.items()):
        print(f"  {kind}: {n} entries, {b:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
