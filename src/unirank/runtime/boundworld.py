"""A group bound for good by a module imported after it started: torch's
``torch.distributed.nn.functional`` writes ``group=group.WORLD`` as its functions' default,
evaluated when the module is imported. Imported before the program's group starts (as
torchrun's workers usually do, through nothing) that default is None; imported after it
(``torch.distributed.checkpoint`` and ``torch._dynamo`` import it: DCP's first save, DDP's
constructor) it is the live default group, held by ten functions' defaults, so that
``destroy_process_group()`` no longer ends it: its gloo threads live on into the
interpreter's end, where one that drops a finished collective's tensors needs the GIL and
aborts the process ("terminate called without an active exception": 6 in 94 two-rank
torchrun runs here of a program calling ``ur.save_state`` after ``init_process_group``, 0 in
70 with :func:`release_bound_world`). Torch 2.13's behaviour; the defaults set back to None
are what the same import gives before the group starts.

Reads no environment variable.
"""

from __future__ import annotations

import sys

__all__ = ["release_bound_world"]

#: the module whose functions' defaults name the group of the moment they were defined
_BINDS = "torch.distributed.nn.functional"


def release_bound_world() -> int:
    """Set back to None every default of :data:`_BINDS`'s functions that holds a process
    group (where the module is imported); the number of functions changed."""
    module = sys.modules.get(_BINDS)
    c10d = sys.modules.get("torch._C._distributed_c10d")
    group_type = getattr(c10d, "ProcessGroup", None)
    if module is None or group_type is None:
        return 0
    changed = 0
    for function in list(vars(module).values()):
        defaults = getattr(function, "__defaults__", None)
        if not isinstance(defaults, tuple) or not any(
                isinstance(value, group_type) for value in defaults):
            continue
        function.__defaults__ = tuple(None if isinstance(value, group_type) else value
                                      for value in defaults)
        changed += 1
    return changed
