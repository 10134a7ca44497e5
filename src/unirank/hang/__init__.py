"""The hang detector: every rank's collective progress, one place that sees a hang, one report.

* :mod:`.progress` (pure): torch's flight recorder dump -> this rank's compact progress
  record; Python stacks from :func:`sys._current_frames` as data; the user's frame of a stack;
* :mod:`.detect` (pure): every rank's record -> the hang (the wavefront, ranks gone on past
  it, the earliest mismatch) or None; who is blamed, and whom ``--on-hang evict`` leaves out;
* :mod:`.render` (pure): the report's text (golden files in tests/fixtures/hang);
* :mod:`.schedule` (pure): when to report, full or short, and when ``--hang-timeout`` fires;
* :mod:`.timings` (pure): every wait of the detector (the stacks' answers, a late look, the
  ending's linger, a silent rank 0), as intervals and seconds;
* :mod:`.watcher`: the thin thread each rank runs (``unirank-hang-watch``) that publishes its
  record (:mod:`.recorder`, :mod:`.exchange`), answers stack requests (its DataLoader
  workers' too: :mod:`.children`), and on rank 0 runs :mod:`.detector`; :mod:`.ending` says
  how ``--hang-timeout`` ends the job (with :data:`unirank.exitcodes.HANG_TIMEOUT`, the
  blamed rank first);
  :mod:`.failure` makes the report when a collective fails.

Reads no environment variable (the settings come as :class:`unirank.contract.HangSettings`).
The files it writes in the attempt's folder are named by :class:`unirank.runfolder.AttemptFolder`.
"""

from __future__ import annotations
