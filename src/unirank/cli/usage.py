"""One-line usage errors, the same for every subcommand (argparse's ``error``, replaced by
:func:`one_line_errors` in :func:`unirank.cli.main.build_parser`).

``unirank run: error: unknown option --nprocs (did you mean --nproc-per-node?) HINT: options go
before SCRIPT; unirank run --help lists them``, exit status 2
(:data:`unirank.exitcodes.USAGE`): no usage block, the nearest known option by
:func:`difflib.get_close_matches`. Reads no environment variable.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from typing import NoReturn

from unirank.exitcodes import USAGE

__all__ = ["nearest_option", "one_line_errors"]


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's long options; an underscore alias (torchrun's ``--nproc_per_node``) only
    where it has no dashed twin."""
    names = {o for o in parser._option_string_actions if o.startswith("--")}
    return sorted(o for o in names if "_" not in o or o.replace("_", "-") not in names)


def nearest_option(parser: argparse.ArgumentParser, given: str) -> str | None:
    """The known long option nearest to ``given`` (``--nprocs`` -> ``--nproc-per-node``), or
    None when none is close (:func:`difflib.get_close_matches`)."""
    name = given.split("=", 1)[0]
    close = difflib.get_close_matches(name, _long_options(parser), n=5, cutoff=0.5)
    # the longest shared start first (--nprocs: --nproc-per-node, not --nnodes), then likeness;
    # a loose likeness (0.5 to 0.6) only with a shared start of 4 letters past the dashes
    best = max(close, key=lambda option: _shared_start(name, option), default=None)
    if best is None or (_shared_start(name, best) < 6 and
                        difflib.SequenceMatcher(None, name, best).ratio() < 0.6):
        return None
    return best


def _shared_start(one: str, other: str) -> int:
    count = 0
    for a, b in zip(one, other):
        if a != b:
            break
        count += 1
    return count


def _takes_script(parser: argparse.ArgumentParser) -> bool:
    positionals = parser._positionals._group_actions
    return any("SCRIPT" in str(action.metavar or "") for action in positionals)


def one_line_errors(parser: argparse.ArgumentParser,
                    hint_for: Callable[[str], str | None] | None = None) -> None:
    """Make ``parser``'s errors one line on stderr, ``PROG: error: WHAT HINT: DO``, exit 2: an
    unknown option is named with the nearest known one; ``hint_for`` may give a message its
    own hint (None: the default one)."""
    prog = parser.prog

    def error(message: str) -> NoReturn:
        where = "options go before SCRIPT; " if _takes_script(parser) else ""
        hint = (hint_for(message) if hint_for else None) or f"{where}{prog} --help lists them"
        if message.startswith("unrecognized arguments:"):
            unknown = (message.split(":", 1)[1].split() or [""])[0]
            if unknown.startswith("-"):
                near = nearest_option(parser, unknown)
                guess = f" (did you mean {near}?)" if near else ""
                message = f"unknown option {unknown.split('=', 1)[0]}{guess}"
            else:
                message = f"unexpected argument {unknown!r}"
        print(f"{prog}: error: {message} HINT: {hint}", file=sys.stderr)
        sys.exit(USAGE)

    parser.error = error  # type: ignore[method-assign]
