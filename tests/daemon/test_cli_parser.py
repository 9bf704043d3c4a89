"""The CLI's parser: the options that say where the daemon is, before a command's name or after
it; and help for every option, with the unit of every time. No daemon needed."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller._cli.main import build_parser, main
from controller._cli.rollout import seconds
from controller._daemon.statedir import default_state_dir


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("controller",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser, the top level's and each (sub)command's, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from commands(sub, (*path, name))


# -- the options of every command --


@pytest.mark.parametrize(
    ("argv", "state_dir"),
    [
        (["status"], default_state_dir()),
        (["--state-dir", "/x", "status"], Path("/x")),
        (["status", "--state-dir", "/x"], Path("/x")),
        (["status", "a", "--state-dir", "/x", "--json"], Path("/x")),
        (["--state-dir", "/x", "status", "--state-dir", "/y"], Path("/y")),  # the later one
        (["--state-dir", "/x", "rollout", "history", "a"], Path("/x")),
        (["rollout", "history", "a", "--state-dir", "/x"], Path("/x")),
        (["run", "--state-dir", "/x"], Path("/x")),
        (["--state-dir", "/x", "run"], Path("/x")),
    ],
)
def test_the_state_dir_is_taken_before_the_command_or_after_it(
    argv: list[str], state_dir: Path
) -> None:
    assert build_parser().parse_args(argv).state_dir == state_dir


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://u", "--token", "t", "logs", "a"],
        ["logs", "a", "--url", "http://u", "--token", "t"],
        ["--url", "http://u", "logs", "--token", "t", "a"],
        ["--token", "t", "rollout", "--url", "http://u", "undo", "a"],
        ["ingress", "--url", "http://u", "--token", "t"],
        ["--url", "http://u", "--token", "t", "ingress"],
    ],
)
def test_url_and_token_are_taken_before_the_command_or_after_it(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.url, args.token) == ("http://u", "t")


def test_left_out_they_keep_their_defaults() -> None:
    args = build_parser().parse_args(["scale", "a", "3"])
    assert (args.state_dir, args.url, args.token) == (default_state_dir(), None, None)


def test_every_command_takes_them_after_its_name() -> None:
    for path, parser in commands(build_parser()):
        options = {o for action in parser._actions for o in action.option_strings}
        # The daemon itself talks to no daemon: where its state dir is, no more.
        wanted = {"--state-dir"} if "run" in path else {"--state-dir", "--url", "--token"}
        assert wanted <= options, path


def test_a_command_finds_the_state_dir_given_after_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--state-dir", str(tmp_path)])
    assert exited.value.code == 1
    assert f"no controller daemon is running for the state dir {tmp_path}" in (
        capsys.readouterr().err
    )


# -- help --

#: Options whose value is a time.
TIME_LIKE = re.compile(r"timeout|duration|renew|period|delay|interval")


def test_every_option_of_every_command_says_what_it_is() -> None:
    missing = []
    for path, parser in commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                # Its commands' one-line helps, in the listing of commands.
                missing += [
                    f"{' '.join(path)} {choice.dest}"
                    for choice in action._choices_actions
                    if not (choice.help or "").strip()
                ]
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_every_time_says_its_unit() -> None:
    times = []
    for path, parser in commands(build_parser()):
        for action in parser._actions:
            names = " ".join(action.option_strings)
            if action.type is seconds or TIME_LIKE.search(names):
                times.append(names)
                assert "seconds" in (action.help or ""), (path, names, action.help)
    assert "--timeout" in times
    assert "--lease-duration" in times


def test_every_help_formats() -> None:
    # A %(default)g on a default that is not a number, or a stray %, fails only when shown.
    for _, parser in commands(build_parser()):
        parser.format_help()
