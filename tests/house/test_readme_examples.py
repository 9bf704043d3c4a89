"""The README's walkthroughs run as written, against a real daemon with real workers: the
rollout example (a bad release, its failure and automatic rollback) command by command against
its transcript, and the autoscaling example under its load script. Apart from the other
examples' tests so that the suite's workers run them side by side."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import trio

from ..daemons import LIMIT_S, Daemon, running
from ..documents import blocks, page
from ..http_client import request
from ..pristine import EXAMPLES, EXAMPLES_ROOT

ROOT = Path(__file__).parent.parent.parent


def readme_transcript() -> list[tuple[str, list[str]]]:
    """Each ``$ controller ...`` command of the README's rollout example, with the lines the
    README shows it print."""
    section = page("rollouts.md")
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:].split("  #")[0].strip(), []))
            else:
                steps[-1][1].append(line)
    return steps


def normal(line: str) -> str:
    """`line` less what differs from run to run: ages (``6s``), and column widths (which
    follow the ages)."""
    return re.sub(r"(?<= )\d+[smhd](?= )", "AGE", " ".join(line.split()))


def shows(shown: list[str], printed: str) -> bool:
    """Whether `printed` is what `shown` shows, ``...`` standing for any lines (or none)."""
    pattern = "".join(
        r"(?:.*\n)*?" if line == "..." else re.escape(normal(line)) + r"\n" for line in shown
    )
    text = "".join(normal(line) + "\n" for line in printed.splitlines())
    return re.fullmatch(pattern, text) is not None


async def as_the_readme_runs_it(
    daemon: Daemon, argv: list[str]
) -> subprocess.CompletedProcess[bytes]:
    """`controller argv` against `daemon`, from the repository's root (the README's paths are
    the repository's)."""
    return await trio.run_process(
        [*daemon.cli_argv(), *argv],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=EXAMPLES_ROOT,
    )


async def test_the_readmes_rollout_example_runs_as_it_says_broken_release_and_all(
    state_dir: Path,
) -> None:
    steps = readme_transcript()
    commands = [command for command, _ in steps if command.startswith("controller ")]
    assert "controller apply -f examples/broken.toml --wait" in commands
    with trio.fail_after(LIMIT_S * 4):
        async with running(
            state_dir,
            *("--config", str(EXAMPLES / "backends.toml"), "--pythonpath", str(EXAMPLES)),
        ) as daemon:
            for name in ("echo", "greeter"):
                assert (await daemon.cli("wait", name)).returncode == 0
            for command, shown in steps:
                if not command.startswith("controller "):
                    continue  # curl: the ingress's timing, not the CLI's
                argv = shlex.split(command)[1:]
                if argv[:2] == ["rollout", "history"]:
                    # As the README shows it: once the rollback under way (if any) is over.
                    assert (await daemon.cli("rollout", "status", argv[2])).returncode == 0
                result = await as_the_readme_runs_it(daemon, argv)
                out = (result.stdout + result.stderr).decode().replace(f"{EXAMPLES_ROOT}/", "")
                fails = any(line.startswith("failed: ") for line in shown)
                assert result.returncode == (1 if fails else 0), (command, out)
                if "--wait" in argv:
                    # Its progress lines are one run's: the first line and the end are checked.
                    shown = [shown[0], "...", *shown[len(shown) - shown[::-1].index("...") :]]
                if shows(shown, out):
                    continue
                # The wait may see the failed rollout in the moment before its rollback is
                # written (DEPLOY_FAILED, not yet superseded): the same failure, told so.
                assert fails, (command, shown, out)
                told = re.search(r"the rollout failed: (.*); the rollback is", shown[-2])
                assert told is not None
                assert "DEPLOY_FAILED: " in out
                assert f"(the rollout failed: {told[1]})" in out
                assert out.rstrip().endswith("failed: echo"), out


async def test_the_autoscaling_example_scales_up_under_its_load_script(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir,
            *("--config", str(EXAMPLES / "autoscaling.toml"), "--pythonpath", str(EXAMPLES)),
        ) as daemon:
            assert (await daemon.cli("wait", "auto")).returncode == 0
            await daemon.logged(b"ingress serving routes on")
            # Four clients of 0.2 s requests for 13 s, two per replica wanted: two replicas.
            load = await trio.run_process(
                [
                    sys.executable,
                    str(EXAMPLES / "load.py"),
                    *("--url", f"{daemon.ingress_url}/auto", "--clients", "4", "--seconds", "3"),
                ],
                capture_stdout=True,
                capture_stderr=True,
            )
            seconds = [line for line in load.stdout.decode().splitlines() if "answering=" in line]
            assert len(seconds) == 13, load.stdout
            answering = [int(re.findall(r"answering=(\d+)", line)[0]) for line in seconds]
            assert max(answering) >= 2, seconds
            # Failed answers are counted too (a newcomer found them left out): none here.
            failed = [int(re.findall(r"failed=(\d+)", line)[0]) for line in seconds]
            assert sum(failed) == 0, seconds
            status = (await daemon.status())["auto"]
            assert status["autoscaler"]["last_change"]["reason"] == "ScaleUp", status


def port_of(url: str) -> int:
    return int(url.rpartition(":")[2])


def drive_it_list() -> list[tuple[list[str], str]]:
    """The README's "drive it" block: each command's words and its comment."""
    (block,) = [b for b in blocks("sh") if b.path.name == "README.md" and "curl" in b.code]
    steps = []
    for line in block.code.splitlines():
        command, _, comment = line.partition("  #")
        steps.append((shlex.split(command), comment.strip()))
    return steps


async def test_the_readmes_drive_it_list_runs_as_written(state_dir: Path) -> None:
    """Each line of the README's list, in order, against the main job (on free ports here):
    the curls' answers are what their comments say, and every command succeeds."""
    steps = drive_it_list()
    assert [words[0] for words, _ in steps].count("curl") == 2
    assert steps[-1][0][-1] == "shutdown"
    with trio.fail_after(LIMIT_S * 4):
        async with running(
            state_dir,
            *("--config", str(EXAMPLES / "backends.toml"), "--pythonpath", str(EXAMPLES)),
        ) as daemon:
            for name in ("hello", "echo", "greeter"):
                assert (await daemon.cli("wait", name)).returncode == 0
            for words, comment in steps[:-1]:  # the shutdown is `running`'s, checked there
                if words[0] == "curl":
                    path = words[1].removeprefix("127.0.0.1:8000")
                    answer = await request(port_of(daemon.ingress_url), path)
                    assert answer.status == 200, (words, answer.status)
                    if comment == "hello, you":
                        assert answer.body == b"hello, you\n"
                    else:
                        assert answer.json()["replica"].startswith("echo#"), answer.body
                    continue
                assert words[:3] == ["python3", "-m", "controller"], words
                argv = words[3:]
                if "--follow" in argv:
                    # It follows until stopped, as a reader stops it: what it printed first.
                    with trio.move_on_after(3):
                        await trio.run_process([*daemon.cli_argv(), *argv], capture_stdout=True)
                    continue
                result = await as_the_readme_runs_it(daemon, argv)
                said = (result.stdout + result.stderr).decode()
                assert result.returncode == 0, (argv, said)
            status = await daemon.status()
            assert len(status["echo"]["replicas"]) == 3  # `scale echo 3`
