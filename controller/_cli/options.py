"""The options every command takes (where the daemon is, and its token), before the command's
name or after it: ``controller --state-dir X status`` and ``controller status --state-dir X``.

argparse gives each subcommand a namespace of its own and copies it over the top level's, so
a subcommand's copy of an option defaults to ``SUPPRESS``: left out after the name, it leaves
the value given before the name (or the top level's default) as it was."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._daemon.statedir import STATE_DIR_ENV, TOKEN_ENV, default_state_dir

#: The help of a ``--timeout`` that bounds a ``--wait``.
WAIT_TIMEOUT_HELP = (
    "with --wait: how long to wait, in seconds (default %(default)g); past it the command "
    "exits 1 and the change goes on"
)
#: The help of a backend's name, the positional argument of most commands.
NAME_HELP = "the backend's name"

#: The commands that run no client of a daemon: they take where the state dir is, no more.
_NO_CLIENT = frozenset({"run"})


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options, with their defaults, on the top-level parser; and on every subcommand's
    (at any depth), without defaults there."""
    _add(parser, defaults=True, client=True)
    _spread(parser)


def _spread(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        done: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) in done:  # an alias of a command already given them
                continue
            done.add(id(sub))
            _add(sub, defaults=False, client=name not in _NO_CLIENT)
            _spread(sub)


def _add(parser: argparse.ArgumentParser, *, defaults: bool, client: bool) -> None:
    group = parser.add_argument_group("where the daemon is (before the command's name or after it)")
    group.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir() if defaults else argparse.SUPPRESS,
        help=f"the daemon's files: token, address, store, workers (default ${STATE_DIR_ENV} or "
        "~/.local/state/trio-controller)",
    )
    if not client:
        return
    group.add_argument(
        "--url",
        default=None if defaults else argparse.SUPPRESS,
        help="the daemon's API, http://HOST:PORT (default: the one in the state dir)",
    )
    group.add_argument(
        "--token",
        default=None if defaults else argparse.SUPPRESS,
        help=f"the API token (default ${TOKEN_ENV}, else the state dir's)",
    )
