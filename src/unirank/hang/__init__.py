"""The hang detector: every rank's collective progress, one place that sees a hang, one report.

* :mod:`.progress` (pure): torch's flight recorder dump -> this rank's compact progress
  record; Python stacks from :func:`sys._current_frames` as data; the user's frame of a stack;
* :mod:`.detect` (pure): every rank's record -> the hang (the wavefront, ranks gone on past
  it, the earliest mismatch) or None; who is blamed;
* :mod:`.render` (pure): the report's text (golden files in tests/fixtures/hang);
* :mod:`.schedule` (pure): when to report, full or short, and when ``--hang-timeout`` fires;
* :mod:`.watcher`: the thin thread each rank runs (``unirank-hang-watch``) that publishes its
  record (:mod:`.recorder`, :mod:`.exchange`), answers stack requests (its DataLoader
  workers' too: :mod:`.children`), and on rank 0 runs :mod:`.detector`; :mod:`.ending` says
  how ``--hang-timeout`` ends the job (with :data:`unirank.exitcodes.HANG_TIMEOUT`, the
  blamed rank first);
  :mod:`.failure` makes the report when a collective fails.

Reads no environment variable (the settings come as :class:`unirank.contract.HangSettings`).
"""

from __future__ import annotations

__all__ = ["HANG_FOLDER", "HANG_VERDICT", "ON_HANG_ASKED", "WAITING_MARK"]

#: the folder, in the attempt's folder (next to the ranks' ``<local rank>/error.json``), where
#: rank 0 writes every report with every rank's stacks, as text and JSON (kept after the run)
HANG_FOLDER = "hang"

#: the file, in the attempt's folder, that the detector keeps while some rank has waited in a
#: collective for one interval or more that another has not entered: the supervisor asks for the
#: report at a stop signal only then, so that a plain Ctrl-C is forwarded at once
WAITING_MARK = "ranks-waiting"

#: the file, in the attempt's folder, where the detector's rank (rank 0) writes the verdict of a
#: hang that ends the job (``--hang-timeout``), and every rank again as it ends (the verdict
#: travels in the :class:`~unirank.hang.ending.Ending`, so every node has it):
#: ``{"never_entered": [ranks], "call": "all_reduce #12"}``, what the supervisor's
#: ``--on-hang evict`` reads (:func:`unirank.hang.detect.verdict`)
HANG_VERDICT = "hang-verdict.json"

#: the file, in the attempt's folder, where the program's ranks write the ``on_hang=`` keyword
#: of :func:`unirank.init`/``Parallel`` (one word, ``exit``, ``restart`` or ``evict``): what the
#: supervisor does at that attempt's hang timeout (:func:`unirank.contract.on_hang_now`)
ON_HANG_ASKED = "on-hang"
