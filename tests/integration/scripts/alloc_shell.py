"""Each rank prints one ``WORLD {json}`` line: how ``ur.init`` or ``with ur.Parallel`` ran here.

Usage: python alloc_shell.py init|parallel. A ConfigError is printed as its one line (exit 1).
"""

from __future__ import annotations

import json
import sys

import unirank as ur


def show(local_rank: int) -> None:
    print("WORLD " + json.dumps({
        "rank": ur.get_rank(), "world": ur.get_world_size(), "local_rank": local_rank,
        "backend": ur.backend(), "node": ur.hostname(), "launcher": ur.dist_env().launcher,
    }), flush=True)


def main(entry: str) -> None:
    if entry == "init":
        ur.init(backend="gloo")
        show(ur.get_local_rank())
        ur.finalize()
    else:
        with ur.Parallel(backend="gloo") as parallel:
            parallel.run(show)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except ur.ConfigError as exc:
        print(f"alloc_shell.py: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
