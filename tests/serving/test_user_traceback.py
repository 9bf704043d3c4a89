"""The traceback a replica's failure shows starts at the user's code: the frames of the host it
runs under (the controller's, trio's, importlib's) before the user's first are left out, in
chained and grouped exceptions too, and said to be. In process: tests/local/test_failed_starts.py
has the real workers."""

from __future__ import annotations

import pytest

from controller._ports.hosting import tracebacks

#: A host frame, as the worker's are: a function of a module of the controller's that calls the
#: user's code and catches what it raises.
_HOST: dict[str, object] = {"__name__": "controller._local.pretend_host"}
exec(
    "def call(fn):\n"
    "    try:\n"
    "        fn()\n"
    "    except BaseException as exc:\n"
    "        return exc\n"
    "    raise AssertionError('it did not raise')\n"
    "def import_app():\n"
    "    raise ModuleNotFoundError(\"No module named 'app'\", name='app')\n",
    _HOST,
)


def caught(fn: object) -> BaseException:
    exc = _HOST["call"](fn)  # type: ignore[operator]  # the function exec made
    assert isinstance(exc, BaseException)
    return exc


def users_lookup() -> None:
    _ = {}["missing"]  # type: ignore[index]  # an empty dict: the point


def users_code() -> None:
    try:
        users_lookup()
    except KeyError as exc:
        raise ValueError("bad config") from exc


def test_the_host_frames_before_the_users_are_left_out_and_said_to_be() -> None:
    whole, shown = tracebacks(caught(users_code))
    assert "<string>" not in shown
    first, rest = shown.split("\n", 1)
    assert first.startswith("(1 frame of the replica's host, before its code, left out")
    # The cause keeps its frames (all the user's); then the error, from the user's first frame.
    assert rest.startswith("Traceback (most recent call last):\n")
    assert "in users_lookup" in rest
    assert rest.rstrip().endswith("ValueError: bad config")
    assert rest.count("in users_code") == 2
    # The whole one, for the log, has every frame.
    assert 'File "<string>", line 3, in call' in whole
    assert not whole.startswith("(")


def test_groups_are_trimmed_inside_too() -> None:
    def many() -> None:
        errors = [caught(users_code), caught(users_lookup)]
        raise ExceptionGroup("two replicas' worth", errors)  # type: ignore[type-var]  # both Exceptions

    _, shown = tracebacks(caught(many))
    assert "<string>" not in shown
    assert "ExceptionGroup: two replicas' worth" in shown
    assert shown.count("in users_lookup") == 2


def test_an_error_with_no_frame_of_the_users_is_shown_alone_with_its_notes() -> None:
    exc = caught(_HOST["import_app"])
    exc.add_note("hint: --pythonpath")
    _, shown = tracebacks(exc)
    assert shown.splitlines() == [
        "(2 frames of the replica's host, before its code, left out: the replica's log has the "
        "whole traceback)",
        "ModuleNotFoundError: No module named 'app'",
        "hint: --pythonpath",
    ]


@pytest.mark.parametrize("name", ["controller.testing._trio_replica", "app.module"])
def test_the_test_kits_replicas_and_other_code_are_the_users(name: str) -> None:
    module: dict[str, object] = {"__name__": name}
    exec("def fails():\n    raise RuntimeError('in the replica')\n", module)
    _, shown = tracebacks(caught(module["fails"]))
    assert "in fails" in shown
