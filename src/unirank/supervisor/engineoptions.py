"""How the engine runs a plan, everything but the layout: :class:`EngineOptions` (made by the
command line, :mod:`unirank.cli.runconfig`, and by ``Parallel``; read by :mod:`.attempts` and
:mod:`.launching`). Reads no environment variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unirank.contract import DEFAULT_GRACE_PERIOD, HangSettings
from unirank.signals import FORWARDED
from unirank.supervisor.output import OutputOptions

__all__ = ["EngineOptions"]


@dataclass(frozen=True)
class EngineOptions:
    """How the engine runs a plan (everything but the layout)."""

    grace_period: float = DEFAULT_GRACE_PERIOD
    output: OutputOptions = field(default_factory=OutputOptions)
    signals: tuple[int, ...] = tuple(int(s) for s in FORWARDED)
    #: the workers' TORCHELASTIC_SIGNALS_TO_HANDLE (None: ``signals`` by name)
    signals_to_handle: str | None = None
    prog: str = "unirank run"
    #: ``--timeline``: print the start-up timeline (node 0); ``--timeline-json``: write it
    timeline: bool = False
    timeline_json: str | None = None
    #: ``--numa-binding``: the mode each worker binds itself by (None: no binding)
    numa_binding: str | None = None
    #: ``--state-budget``: the workers' UNIRANK_STATE_BUDGET (None: as the environment says)
    state_budget: str | None = None
    #: the hang detector's settings for every worker (None: the workers read the variables)
    hang: HangSettings | None = None
    #: ``--on-hang``: exit, restart or evict once ``--hang-timeout`` ended the workers (the
    #: program's ``on_hang=`` keyword wins: :func:`unirank.contract.on_hang_now`)
    on_hang: str = "restart"
    #: TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT: seconds a worker may stay in D state (0: no
    #: check; :mod:`.dstate`)
    dstate_timeout: float = 0.0
    #: an elastic job (a range of the dynamic rendezvous): its workers get UNIRANK_ELASTIC
    elastic: bool = False
    #: an elastic job's fewest nodes (``--nnodes MIN:MAX``): ``--on-slow evict`` never goes
    #: below it (:func:`unirank.contract.on_slow_now`)
    min_nodes: int = 1
