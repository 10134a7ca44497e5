"""Fault schedules, run for real: ``python3 benchmarks/faults.py [--seed S] [--count N]
[--lanes K] [--folder DIR]`` (root: the nodes run in network namespaces).

Runs the schedules drawn from seeds S, S+1, ..., S+N-1 (tests/integration/faults/schedule.py),
each in fresh namespaces of its own (tests/integration/faults/runner.py), K at a time (default
1: one after the other; each schedule's namespaces share nothing with another's, so lanes do not
meet, but they share the cores: the recoveries' bounds hold with 2 lanes on 2 cores), and
prints each one's faults, its recovery times and the invariants it broke as it ends, then one
line: how many of the N broke one. Each run's logs are kept in DIR/seed-<S> (default: a fresh
temporary folder).
Exit code 0 when none broke an invariant, 1 otherwise, 2 on bad arguments.

Environment variables read: those a node's ``unirank run`` reads (runner.py), ``TMPDIR``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from faults.runner import Outcome, run  # noqa: E402
from faults.schedule import generate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the first schedule's seed")
    parser.add_argument("--count", type=int, default=1, help="how many schedules")
    parser.add_argument("--lanes", type=int, default=1, help="schedules run at a time")
    parser.add_argument("--folder", type=Path, help="where each run's logs stay")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count {args.count}: give at least 1")
    if args.lanes < 1:
        parser.error(f"--lanes {args.lanes}: give at least 1")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="unirank-faults-"))
    began = time.monotonic()
    printing = threading.Lock()

    def one(seed: int) -> Outcome:
        outcome = run(generate(seed), folder / f"seed-{seed}")
        with printing:
            print(outcome.report(), flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=args.lanes) as lanes:
        outcomes = list(lanes.map(one, range(args.seed, args.seed + args.count)))
    broken = [o.schedule.seed for o in outcomes if o.violations()]
    minutes = (time.monotonic() - began) / 60
    print(f"{args.count} schedules from seed {args.seed}, {args.lanes} at a time: "
          f"{len(broken)} broke an invariant{': seeds ' if broken else ''}"
          f"{', '.join(map(str, broken))} ({minutes:.1f} min; logs in {folder})")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
