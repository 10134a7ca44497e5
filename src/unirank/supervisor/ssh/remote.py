"""What ``unirank run --hosts`` sends over ssh (pure): the ssh command, the remote shell line,
the carried environment and its wire form.

The remote command line holds only the working directory, the interpreter, ``PYTHONPATH`` (the
interpreter needs it before it starts) and ``unirank run``'s own options: every other carried
variable travels as the first line of ssh's stdin (JSON), so that no value, secret or not,
shows in ``ps`` on either side. The stdin stays open afterwards: its end is the remote side's
signal to stop (:mod:`unirank.supervisor.ssh.stdinwatch`).

Reads no environment variable (its callers pass the mapping).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence

from unirank.contract import (
    INIT_TIMEOUT_VAR,
    NO_PRELOAD_VAR,
    RDZV_SECRET_FILE_VAR,
    RDZV_SECRET_VAR,
    STOP_SIGNALS_VAR,
)
from unirank.errors import ConfigError

__all__ = [
    "CARRIED_NAMES",
    "CARRIED_PREFIXES",
    "DEFAULT_CONNECT_TIMEOUT",
    "VERDICT_MARK",
    "carried_environ",
    "decode_environ",
    "encode_environ",
    "parse_verdict",
    "remote_line",
    "ssh_command",
    "ssh_options",
    "strip_options",
    "verdict_line",
]

#: seconds ssh waits for a host to answer (``-o ConnectTimeout``); an ``--ssh-option`` wins
DEFAULT_CONNECT_TIMEOUT = 5
#: variables carried to every host when set here, besides ``-x NAME``
CARRIED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_")
CARRIED_NAMES = ("PYTHONPATH", "OMP_NUM_THREADS", INIT_TIMEOUT_VAR, NO_PRELOAD_VAR,
                 STOP_SIGNALS_VAR, RDZV_SECRET_VAR, RDZV_SECRET_FILE_VAR)
#: the one variable set on the remote command line rather than sent over stdin
_ON_COMMAND_LINE = "PYTHONPATH"
#: the start of the last stderr line of a remote ``unirank run --from-ssh``, read (and not
#: shown) by the launcher: did a worker fail there, and did it only see a peer go away
VERDICT_MARK = b"UNIRANK-HOST-VERDICT "


def verdict_line(failed: bool, lost_peer: bool) -> str:
    """The remote side's last line: whether a worker failed on its own there (``failed``: the
    run's root cause, not a worker its teardown stopped), and whether that root cause's
    recorded error says a peer went away (``lost_peer``: :attr:`unirank.summary.WorkerExit.
    lost_peer`, read once by :func:`unirank.errorfile.read_failure`)."""
    lost = failed and lost_peer
    return VERDICT_MARK.decode() + json.dumps({"failed": failed, "lost_peer": lost}) + "\n"


def parse_verdict(line: bytes) -> tuple[bool, bool] | None:
    """``(failed, lost_peer)`` of :func:`verdict_line`'s line; None when ``line`` is not one."""
    if not line.startswith(VERDICT_MARK):
        return None
    try:
        value = json.loads(line[len(VERDICT_MARK):].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    return bool(value.get("failed")), bool(value.get("lost_peer"))


def carried_environ(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The variables every host gets: :data:`CARRIED_PREFIXES`, :data:`CARRIED_NAMES` and the
    ``-x`` ones, as mpirun's: ``NAME`` (its value here; not set here is a ConfigError) or
    ``NAME=VALUE``."""
    carried = {name: value for name, value in environ.items()
               if name.startswith(CARRIED_PREFIXES) or name in CARRIED_NAMES}
    for name in extra:
        key, sep, value = name.partition("=")
        if sep and key:
            carried[key] = value
            continue
        if name not in environ:
            raise ConfigError("names a variable that is not set here", variable="-x",
                              value=name, hint=f"export {name} before unirank run, or drop -x")
        carried[name] = environ[name]
    return carried


def encode_environ(carried: Mapping[str, str]) -> bytes:
    """The stdin's first line: the carried variables but ``PYTHONPATH``, as one JSON line."""
    sent = {k: v for k, v in sorted(carried.items()) if k != _ON_COMMAND_LINE}
    return json.dumps(sent, separators=(",", ":")).encode() + b"\n"


def decode_environ(line: bytes) -> dict[str, str]:
    """The variables of :func:`encode_environ`'s line; ConfigError when it is not one."""
    try:
        value = json.loads(line.decode())
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError("expects the environment as the first line of its stdin",
                          variable="--from-ssh", value=line[:40].decode(errors="replace"),
                          hint="--from-ssh is for unirank run --hosts only")
    return value


def ssh_options(values: Sequence[str]) -> list[str]:
    """``--ssh-option`` values as ssh arguments: ``Port=2222`` -> ``-o Port=2222``; a value
    that starts with ``-`` is split as a shell would (``-F ./config`` -> ``-F``, ``./config``)."""
    argv: list[str] = []
    for value in values:
        text = value.strip()
        if not text:
            continue
        if text.startswith("-"):
            argv += shlex.split(text)
        else:
            argv += ["-o", text]
    return argv


def ssh_command(host: str, options: Sequence[str], remote: str, *,
                connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> list[str]:
    """``ssh`` running ``remote`` on ``host``: the user's options first (ssh keeps the first
    value it gets for an option), then no tty, BatchMode (never a password prompt) and the
    ConnectTimeout."""
    return ["ssh", *options, "-T", "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={connect_timeout}", "--", host, remote]


def remote_line(cwd: str, argv: Sequence[str], carried: Mapping[str, str]) -> str:
    """The shell line run on the host: ``cd`` to the same folder, then ``exec`` the same
    interpreter (with this ``PYTHONPATH``), every value quoted."""
    env = ([f"{_ON_COMMAND_LINE}={carried[_ON_COMMAND_LINE]}"]
           if _ON_COMMAND_LINE in carried else [])
    command = ["env", *env, *argv] if env else list(argv)
    return f"cd -- {shlex.quote(cwd)} && exec {shlex.join(command)}"


def strip_options(raw: Sequence[str], dropped: Iterable[str],
                  takes_value: Iterable[str]) -> list[str]:
    """``unirank run``'s own arguments ``raw`` without the options in ``dropped`` (and their
    values): what each host's ``unirank run`` gets. Only options before the program are
    looked at; ``--opt=value`` and ``--opt value`` both go."""
    drop, valued = set(dropped), set(takes_value)
    kept: list[str] = []
    tokens = iter(enumerate(raw))
    for index, token in tokens:
        if token == "--" or not token.startswith("-") or token == "-":
            kept += raw[index:]
            break
        name, has_equals, _value = token.partition("=")
        if not token.startswith("--") and len(token) > 2 and token[:2] in valued:
            name, has_equals = token[:2], "attached"  # -xNAME
        skip_value = name in valued and not has_equals
        if name in drop:
            if skip_value:
                next(tokens, None)
            continue
        kept.append(token)
        if skip_value:
            following = next(tokens, None)
            if following is not None:
                kept.append(following[1])
    return kept
