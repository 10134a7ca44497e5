"""The job's rendezvous secret: where it comes from, and the tags that prove a message knows
it (pure but for reading the secret's file; no torch).

Where a secret is set, every message that could steer the job carries an HMAC-SHA256 tag over
its fields: a node's hello (its job, identity and a fresh nonce; the server's answer tags the
same nonce back, so the node knows the server is the job's too) and a successor's probe and
its answer. A connection whose hello is refused is closed; what a node sends after an accepted
hello travels on that connection. Without a secret (torchrun-style commands typed on each host
keep working unchanged) a node joins as before, and the server takes control messages only
from the job's own nodes (:mod:`.server`). The secret is never on a command line nor in a job
script: it comes from a variable or a file readable by its owner only, travels to the node's
rendezvous helper on its stdin (:class:`~.spec.RdzvSpec`, never printed), and a successor holds
it as every node does. torch's own TCPStore, which the workers' process group uses, has no
authentication: the secret guards the rendezvous only.

Environment variables read: ``UNIRANK_RDZV_SECRET``, ``UNIRANK_RDZV_SECRET_FILE``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping

from unirank.contract import RDZV_SECRET_FILE_VAR, RDZV_SECRET_VAR
from unirank.errors import ConfigError

__all__ = ["secret_of", "tag"]

#: the longest secret taken (a file of more is not a secret file)
MAX_SECRET = 4096


def secret_of(environ: Mapping[str, str]) -> str:
    """The job's secret: ``UNIRANK_RDZV_SECRET``, else the content of the file
    ``UNIRANK_RDZV_SECRET_FILE`` names (not readable by others, not writable by its group: 600,
    or 640/440 for a group such as a pod's fsGroup; not empty); "" where neither is set.
    A bad file, or both set, is a one-line :class:`ConfigError`."""
    value = environ.get(RDZV_SECRET_VAR, "")
    path = environ.get(RDZV_SECRET_FILE_VAR, "")
    if value and path:
        raise ConfigError(f"and {RDZV_SECRET_VAR} are both set", variable=RDZV_SECRET_FILE_VAR,
                          value=path, hint="set one of them, the same on every node of the job")
    if value:
        return value.strip()
    if not path:
        return ""
    return _read(path)


def _read(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)  # a link is followed (Kubernetes mounts Secrets so)
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror})", variable=RDZV_SECRET_FILE_VAR,
                          value=path, hint="name a file that every node can read, holding the "
                                           "job's secret") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("is not a regular file", variable=RDZV_SECRET_FILE_VAR,
                              value=path, hint="name a file holding the job's secret")
        if info.st_mode & 0o027:  # others may not touch it, its group not write it
            raise ConfigError(f"can be read by other users (mode {info.st_mode & 0o777:o})",
                              variable=RDZV_SECRET_FILE_VAR, value=path,
                              hint=f"chmod 600 {path}")
        text = handle.read(MAX_SECRET + 1).decode(errors="replace").strip()
    if not text or len(text) > MAX_SECRET:
        raise ConfigError(f"holds {'no' if not text else 'too long a'} secret",
                          variable=RDZV_SECRET_FILE_VAR, value=path,
                          hint=f"write one line of at most {MAX_SECRET} characters, e.g. "
                               "python3 -c 'import secrets; print(secrets.token_hex(32))'")
    return text


def tag(secret: str, *fields: object) -> str:
    """The HMAC-SHA256 of ``fields`` (each as text, one per line) under ``secret``."""
    text = "\n".join(str(field) for field in fields).encode()
    return hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()
