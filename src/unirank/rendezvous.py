"""Master address and port: who hosts the rendezvous store, and on which port.

Rules (the same on every rank, with no communication):

* Address: ``MASTER_ADDR`` when set; otherwise the launcher's first node (Slurm: the first host of
  ``SLURM_STEP_NODELIST``, else of ``SLURM_JOB_NODELIST``); ``127.0.0.1`` when the whole world
  is on one node.
* Port: ``MASTER_PORT`` when set; otherwise derived from the job id and the step id::

      MASTER_PORT = 20000 + 12 * (job_id mod 1000) + (step_id mod 12)

  which lies in 20000..31999, below Linux's ephemeral range (32768..60999), so the kernel never
  hands it out to an outgoing connection. Twelve steps of one job get twelve different ports, and
  two jobs sharing a node collide only when their ids differ by a multiple of 1000 *and* their
  step ids agree modulo 12. Without a job id the port is torch's default, 29500.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

from unirank.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "PORT_BASE",
    "derive_port",
    "explicit_master",
]

DEFAULT_PORT = 29500
PORT_BASE = 20000
JOB_SLOTS = 1000
STEP_SLOTS = 12

_DIGITS = re.compile(r"\d+")


def _number(text: str) -> int:
    """The job or step id as a number: its digits, or a stable hash for ids with none."""
    digits = "".join(_DIGITS.findall(text))
    if digits:
        return int(digits)
    return zlib.crc32(text.encode())


def derive_port(job_id: str | None, step_id: str | None = None) -> int:
    """The master port for ``job_id``/``step_id`` (see the module docstring for the formula)."""
    if not job_id:
        return DEFAULT_PORT
    job = _number(job_id) % JOB_SLOTS
    step = _number(step_id) % STEP_SLOTS if step_id else 0
    return PORT_BASE + STEP_SLOTS * job + step


def parse_port(value: str, variable: str) -> int:
    """``value`` as a TCP port (1..65535), or a ConfigError naming ``variable``."""
    try:
        port = int(value.strip())
    except ValueError:
        raise ConfigError(
            "is not a port number", variable=variable, value=value,
            hint=f"set {variable} to an integer between 1 and 65535",
        ) from None
    if not 1 <= port <= 65535:
        raise ConfigError(
            "is outside 1..65535", variable=variable, value=value,
            hint=f"set {variable} to an integer between 1 and 65535",
        )
    return port


def explicit_master(environ: Mapping[str, str]) -> tuple[str | None, int | None]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` when the user (or launcher) set them.

    Reads: MASTER_ADDR, MASTER_PORT.
    """
    addr = environ.get("MASTER_ADDR")
    if addr is not None:
        addr = addr.strip()
        if not addr:
            raise ConfigError(
                "is empty", variable="MASTER_ADDR", value=environ["MASTER_ADDR"],
                hint="unset MASTER_ADDR, or set it to the host name or address of rank 0",
            )
    port_text = environ.get("MASTER_PORT")
    port = parse_port(port_text, "MASTER_PORT") if port_text is not None else None
    return addr, port
