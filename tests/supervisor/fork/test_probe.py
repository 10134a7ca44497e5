"""A forked worker observes what a fresh interpreter does, but for the differences that
docs/run.md lists ("What a forked worker cannot make identical"), and no other.

tests/fixtures/probe/probe.py records, at the start of a script, everything a script can
observe: its random streams, environment (``os.environ`` and ``/proc/self/environ``),
``sys.argv``, ``sys.orig_argv``, ``/proc/self/cmdline`` and ``comm``, ``__file__``,
``sys.path[0]``, thread counts (torch's two pools, OpenBLAS), every signal's disposition and the
kernel's signal masks, open descriptors, ``sys.flags``, cwd, umask, resource limits, affinity,
session, parent, the garbage collector, stdio, the imported modules. It runs under real
``unirank run -n 2`` twice: forked from the fork server, and with ``--no-preload``, whose
workers are fresh interpreters with the same environment contract, supervisor and descriptors
(the truest reference: under torchrun the environment, the descriptors and ``-u`` on the
command line differ for reasons that are not the fork). Rank by rank the records must be equal,
with these normalisations:

* values that differ from one run to the next (MASTER_PORT, TORCHELASTIC_RUN_ID, the error
  file's and the attempt's run folder) are compared by presence, UNIRANK_NO_PRELOAD (the
  reference's switch) left out;
* random values (the streams, ``multiprocessing``'s key, ``hash``) by shape: whether the ranks
  drew different values;
* descriptors above 2 by kind (their numbers are the supervisor's, which has the server's
  socket open besides), addresses in reprs dropped;
* the kernel's signal masks without signals 32 and 33, which the C library keeps for itself
  (glibc installs their handlers when a thread is first cancelled or ``set*id`` is called in a
  process with threads: they vary between two runs of the same kind).

The keys that still differ must be exactly the list in docs/run.md: a new difference fails.

Environment variables read: the caller's environment without launcher variables (and without
UNIRANK_NO_PRELOAD, set per run).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from _procs import Runner

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "tests" / "fixtures" / "probe" / "probe.py"
TIMEOUT = 180.0
#: values that differ between two runs, compared by presence
RUN_VALUES = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
              "UNIRANK_ATTEMPT_DIR", "UNIRANK_STATE_MEMORY")
SWITCH = "UNIRANK_NO_PRELOAD"
#: values drawn at random per process, compared by shape across ranks
RANDOM = ("torch_seed", "torch_rand", "random", "numpy_legacy", "authkey", "hash")
_HEADING = "### What a forked worker cannot make identical"
#: the bits of signals 32 and 33 in /proc/PID/status's masks
_LIBC_SIGNALS = 0b11 << 31


def _records(runner: Runner, preload: bool) -> list[dict[str, Any]]:
    result = runner.run(["-n", "2", "probe.py", "--lr", "0.1"],
                        env={} if preload else {SWITCH: "1"}, drop=(SWITCH,), timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "starting workers as their own interpreters" not in result.stderr
    found = [json.loads(m) for m in re.findall(r"^PROBE (.*)$", result.stdout, re.M)]
    assert len(found) == 2, result.stdout
    return sorted(found, key=lambda record: int(record["environ"]["RANK"]))


def _normalised(record: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """``record`` as compared (see the module docstring); ``ranks``: every rank's record."""
    out = {k: v for k, v in record.items() if k not in RANDOM}
    for key in RANDOM:
        out[key] = len({json.dumps(r[key]) for r in ranks}) == len(ranks)
    out["environ"] = {k: (True if k in RUN_VALUES else v) for k, v in record["environ"].items()
                      if k != SWITCH}
    out["proc_environ"] = record["proc_environ"] == record["environ"]
    fds = record["fds"]
    # the worker's fault file lies in the run's own folder, which each run names anew; past the
    # standard streams, the kinds of what is open (how many of rank 0's store and gloo
    # connections are open at the probe's moment is a matter of timing, whatever started it)
    out["fds"] = ([fds.get(str(n)) for n in range(3)],
                  sorted({re.sub(r"^/.*/(attempt_\d+/\d+/)", r"<run>/\1", v)
                          for k, v in fds.items() if int(k) > 2}))
    out["signal_masks"] = {k: (int(v, 16) & ~_LIBC_SIGNALS if k.startswith("Sig") else v)
                           for k, v in record["signal_masks"].items()}
    out["interpreter"] = [re.sub(r" at 0x[0-9a-f]+", "", str(v)) for v in record["interpreter"]]
    return out


def documented_differences() -> set[str]:
    """The probe's keys listed in docs/run.md's section (each item starts with its key)."""
    text = (ROOT / "docs" / "run.md").read_text(encoding="utf-8")
    section = text.split(_HEADING, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\* `([a-z_]+)`", section, re.M))


def test_a_forked_worker_differs_from_a_fresh_one_only_as_documented(runner: Runner) -> None:
    runner.script("probe.py", PROBE.read_text())
    forked, fresh = _records(runner, True), _records(runner, False)
    differing: set[str] = set()
    for mine, theirs in zip(forked, fresh):
        mine_n, theirs_n = _normalised(mine, forked), _normalised(theirs, fresh)
        assert mine_n.keys() == theirs_n.keys()
        differing |= {key for key in mine_n if mine_n[key] != theirs_n[key]}
    documented = documented_differences()
    assert documented, f"docs/run.md has no list under {_HEADING!r}"
    assert differing == documented, (
        f"undocumented: {sorted(differing - documented)}; "
        f"documented but identical: {sorted(documented - differing)}")
    # what neither may lose: each worker's streams are its own, its command line and environment
    # block a fresh interpreter's
    for records in (forked, fresh):
        assert all(_normalised(r, records)[key] for r in records for key in RANDOM
                   if key != "hash")
        for record in records:
            assert record["orig_argv"] == [sys.executable, "probe.py", "--lr", "0.1"]
            assert record["cmdline"] == "\0".join(record["orig_argv"]) + "\0"
            assert record["proc_environ"] == record["environ"]
