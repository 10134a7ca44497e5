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
  whose processes die is lost at once: the kernel closes its connection.

An unknown key is refused with the list of known ones; a bad value names the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from unirank.errors import ConfigError

__all__ = ["KEYS", "RdzvConf", "parse_rdzv_conf"]


@dataclass(frozen=True)
class RdzvConf:
    """The rendezvous settings, unirank's defaults where ``--rdzv-conf`` gives none."""

    join_timeout: float = 600.0
    last_call_timeout: float = 3.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 1.0
    keep_alive_max_attempt: int = 3
    #: the keys ``--rdzv-conf`` gave
    given: frozenset[str] = frozenset()

    @property
    def lost_after(self) -> float:
        """Seconds of silence after which a node is lost."""
        return self.keep_alive_interval * self.keep_alive_max_attempt


#: the keys ``--rdzv-conf`` takes, in the order the help lists them
KEYS = tuple(f.name for f in fields(RdzvConf) if f.name != "given")


def parse_rdzv_conf(text: str | None, *, option: str = "--rdzv-conf") -> RdzvConf:
    """``K=V,...`` as an :class:`RdzvConf`; an unknown key, a missing ``=`` or a value that is
    not a number above 0 (a whole number for ``keep_alive_max_attempt``) is a one-line
    :class:`ConfigError`."""
    values: dict[str, float | int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if key not in KEYS or not sep:
            raise ConfigError(
                "is not a rendezvous setting unirank knows" if key not in KEYS
                else "has no value", variable=option, value=item.strip(),
                hint=f"give K=V,... with K one of {', '.join(KEYS)}")
        values[key] = _number(key, value, option)
    return replace(RdzvConf(), **values, given=frozenset(values))  # type: ignore[arg-type]


def _number(key: str, value: str, option: str) -> float | int:
    whole = key == "keep_alive_max_attempt"
    try:
        number: float | int = int(value) if whole else float(value)
    except ValueError:
        number = 0
    if not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"is not a {'whole number' if whole else 'number of seconds'} "
                          "above 0", variable=f"{option} {key}", value=value,
                          hint=f"e.g. {key}={3 if whole else 5}")
    return number
