"""A job's state kept between attempts: snapshots of every rank's state held in the node's
memory by ``unirank run`` and, every few steps and at a stop, on disk (docs/state.md).

- :mod:`.rules`: pure: a tier's step folders, which steps are complete, which step a world
  restores and from which tier, which steps a tier keeps;
- :mod:`.memory`: the node's snapshot memory, an owned folder in ``/dev/shm`` that
  ``unirank run`` makes for the run and removes at its end (a later run sweeps it when the run
  was killed);
- :mod:`unirank.runtime.snapshots`: the program's calls (``ur.save_state``,
  ``ur.load_state``, DCP's storage), which import torch.
"""
