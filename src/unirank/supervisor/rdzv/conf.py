"""``--rdzv-conf K=V,...``: THE parser of torchrun's rendezvous settings (pure; no torch), used by
``unirank run`` (static and dynamic rendezvous) and by ``unirank sbatch`` at submission, so that a
typo is refused in one line before the job waits in the queue.

Known keys (torchrun's names; seconds may have a fraction):

* ``join_timeout`` (600 s): how long a node waits for the first round to reach MIN nodes; under
  a static rendezvous the workers' init timeout (as torchrun's);
* ``last_call_timeout`` (3 s): how long a round that has MIN nodes waits for more, where more
  may still arrive (the first round below MAX, a round a new node asked for);
* ``close_timeout`` (30 s): how long a round after a change waits for a node of the round
  before that has not rejoined (its node is then left out);
* ``keep_alive_interval`` (1 s) and ``keep_alive_max_attempt`` (3): a node beats every
  interval; one silent for interval x attempts (a hung machine, a cut network) is lost. A node
  whose processes die is lost at once: the kernel closes its connection. A node that has not
  heard from the rendezvous's server for :func:`fence_after` (half a beat less than
  :func:`lost_after`) stops its workers and looks for the job elsewhere: the side of a split
  that holds no quorum is fenced before the other side declares it lost.

torchrun's other keys are accepted, as torchrun accepts them, and have no effect here (the run
notes them): ``timeout`` (torch's legacy rendezvous timeout, which torchrun always sets and its
c10d rendezvous ignores; under unirank's static rendezvous it is the join timeout where
``join_timeout`` is not given, as torch's static backend takes it), ``read_timeout``,
``is_host`` and ``store_type`` (settings of the TCP store torch's c10d rendezvous keeps, which
unirank's rendezvous has no use for).

Any other key is refused with the list of known ones; a bad value names the key. One pair of
quotes around the whole text (shell quoting passed on in a list of arguments) is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from unirank.errors import ConfigError

__all__ = ["CLOSE_TIMEOUT", "DRAIN_TIMEOUT", "KEYS", "TORCHRUN_ONLY", "RdzvConf", "fence_after",
           "lost_after", "parse_rdzv_conf", "reconnect_within", "resume_grace", "successor_hold"]


def lost_after(interval: float, attempts: int) -> float:
    """Seconds of silence after which the server declares a node lost."""
    return interval * attempts


def fence_after(interval: float, attempts: int) -> float:
    """Seconds of silence from its server after which a node stops its workers and leaves the
    server (always less than :func:`lost_after`: the losing side of a split is fenced before
    the winning side declares it lost)."""
    return lost_after(interval, attempts) - interval / 2


def successor_hold(interval: float, attempts: int) -> float:
    """Seconds a successor's server waits before its first round where the server before it
    is not proven dead: by then that server, cut off but alive, has declared this side's
    nodes lost and stopped its own workers (a beat interval for the skew between the two
    sides' last beats)."""
    return lost_after(interval, attempts) - fence_after(interval, attempts) + interval


def reconnect_within(interval: float, attempts: int) -> float:
    """Seconds a node gives the server it goes to (a successor, or where a server sent it) to
    answer: that server may first have to find out that the one before it is lost (twice the
    silence of a loss), plus a margin for its start."""
    return 2 * lost_after(interval, attempts) + 2.0


def resume_grace(interval: float, attempts: int) -> float:
    """Seconds a successor counts the last round's nodes alive before they reach it: each
    node's own search (:func:`reconnect_within`), plus a margin for its first message."""
    return reconnect_within(interval, attempts) + 3.0


@dataclass(frozen=True)
class RdzvConf:
    """The rendezvous settings, unirank's defaults where ``--rdzv-conf`` gives none."""

    join_timeout: float = 600.0
    last_call_timeout: float = 3.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 1.0
    keep_alive_max_attempt: int = 3
    #: the keys ``--rdzv-conf`` gave (of :data:`KEYS`)
    given: frozenset[str] = frozenset()
    #: torchrun's keys of no effect here that ``--rdzv-conf`` gave (of :data:`TORCHRUN_ONLY`)
    inert: frozenset[str] = frozenset()
    #: torchrun's legacy ``timeout``, where given
    legacy_timeout: float | None = None

    @property
    def lost_after(self) -> float:
        """Seconds of silence after which a node is lost."""
        return lost_after(self.keep_alive_interval, self.keep_alive_max_attempt)


#: seconds a helper gets to leave once its stdin closed (:meth:`.client.RendezvousHelper.close`)
CLOSE_TIMEOUT = 5.0
#: seconds the helper of the node serving the rendezvous keeps serving once its run succeeded,
#: until every other node left: their workers end with the same last step, and its server
#: gone first would read to them as a lost server (a takeover, a restart). torchrun's agents
#: wait at an exit barrier for the same reason.
DRAIN_TIMEOUT = CLOSE_TIMEOUT - 1.0

#: the keys ``--rdzv-conf`` takes, in the order the help lists them
KEYS = tuple(f.name for f in fields(RdzvConf)
             if f.name not in ("given", "inert", "legacy_timeout"))
#: torchrun's keys that unirank's rendezvous accepts and does not use (the two timeouts are
#: checked as numbers all the same)
TORCHRUN_ONLY = ("timeout", "read_timeout", "is_host", "store_type")


def parse_rdzv_conf(text: str | None, *, option: str = "--rdzv-conf") -> RdzvConf:
    """``K=V,...`` as an :class:`RdzvConf`; an unknown key, a missing ``=`` or a value that is
    not a number above 0 (a whole number for ``keep_alive_max_attempt``) is a one-line
    :class:`ConfigError`."""
    values: dict[str, float | int] = {}
    inert: dict[str, str] = {}
    for item in _unquoted(text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        known = key in KEYS or key in TORCHRUN_ONLY
        if not known or not sep:
            raise ConfigError(
                "has no value" if known else "is not a rendezvous setting unirank knows",
                variable=option, value=item.strip(),
                hint=f"give K=V,... with K one of {', '.join(KEYS)}")
        if key in KEYS:
            values[key] = _number(key, value, option)
        else:
            inert[key] = value
    legacy = (float(_number("timeout", inert["timeout"], option))
              if "timeout" in inert else None)
    if "read_timeout" in inert:
        _number("read_timeout", inert["read_timeout"], option)
    return replace(RdzvConf(), **values, given=frozenset(values),  # type: ignore[arg-type]
                   inert=frozenset(inert), legacy_timeout=legacy)


def _unquoted(text: str) -> str:
    """``text`` without one pair of quotes around it all: shell quoting carried into a list of
    arguments (torch's own launcher test gives ``--rdzv-conf='join_timeout=5,...'`` so;
    torchrun then reads the key ``'join_timeout`` and ignores it)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _number(key: str, value: str, option: str) -> float | int:
    whole = key in ("keep_alive_max_attempt", "read_timeout")
    try:
        number: float | int = int(value) if whole else float(value)
    except ValueError:
        number = 0
    if not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"is not a {'whole number' if whole else 'number of seconds'} "
                          "above 0", variable=f"{option} {key}", value=value,
                          hint=f"e.g. {key}={3 if whole else 5}")
    return number
