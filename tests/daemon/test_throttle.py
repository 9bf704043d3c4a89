"""Wrong tokens slowed per client address and logged in summary: the pure table, the throttle on
MockClock (exact virtual times), and the API in process with the right token beside them."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller._api.app import Api
from controller._api.failures import FailureTable
from controller._api.throttle import LOG_LINES, Throttle
from controller.testing import FakeRuntime

from ..asgi import call
from ..daemons import LIMIT_S, running

TOKEN = "t" * 40
ADDRESS = ("127.0.0.1", 40000)


def test_failures_are_free_then_held_longer_and_longer_up_to_a_ceiling() -> None:
    table = FailureTable()
    delays = [table.failed("a", now=0.0).delay_s for _ in range(12)]
    for _ in range(12):
        table.released("a")
    assert delays == [0, 0, 0, 0, 0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert table.delay_s(10**9) == 2.0  # no overflow however long it goes on
    # Another address owes nothing for the first one's failures.
    assert table.failed("b", now=0.0).delay_s == 0


def test_answers_held_at_once_are_bounded_and_the_rest_refused() -> None:
    table = FailureTable(free=0, max_held=3)
    verdicts = [table.failed("a", now=0.0) for _ in range(5)]
    assert [v.refused for v in verdicts] == [False, False, False, True, True]
    assert verdicts[4].retry_after_s == 2  # the delay it would have had: 1.6 s
    table.released("a")
    assert not table.failed("a", now=0.0).refused  # a held answer went out: room for one


def test_an_address_is_forgotten_after_a_quiet_spell_and_the_table_is_bounded() -> None:
    table = FailureTable(forget_s=600.0, max_addresses=100)
    for _ in range(7):
        table.failed("a", now=0.0)
        table.released("a")
    assert table.failed("a", now=599.0).delay_s == 0.4  # the 8th in a row
    table.released("a")
    assert table.failed("a", now=1199.0).delay_s == 0  # quiet for 600 s: a fresh start
    table.released("a")
    # Dropped, its count is said (however late the line comes, its span is true).
    assert table.due(1199.0) == [
        "8 failed logins from a in the last 1199 s (answers held up to 0.4 s)"
    ]
    for n in range(1000):
        table.failed(f"10.0.{n // 256}.{n % 256}", now=1200.0 + n)
    assert len(table) == 100  # the oldest were dropped, however many addresses come
    # Each had one failure only (logged at once): dropping them logs nothing more.
    assert table.due(3000.0) == []


def test_one_line_per_interval_after_the_first() -> None:
    table = FailureTable(summary_s=60.0)
    verdicts = [table.failed("a", now=float(n)) for n in range(50)]
    assert [v.first for v in verdicts] == [True] + [False] * 49
    assert table.next_due() == 60.0
    assert table.due(59.0) == []
    assert table.due(60.0) == [
        "50 failed logins from a in the last 60 s (answers held up to 0.4 s, 42 refused with 429)"
    ]
    # Nothing more within the next interval: it ends without a line, and the next failure is
    # logged at once again.
    assert table.due(120.0) == []
    assert table.next_due() is None
    assert table.failed("a", now=130.0).first


async def test_a_held_answer_takes_its_delay_and_a_burst_is_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    throttle = Throttle(FailureTable(free=2, max_held=2))
    scope = {"client": ADDRESS, "method": "GET", "path": "/api/v1/backends"}
    for _ in range(2):
        await throttle.failed(scope, "the token is wrong")
    assert trio.current_time() == 0  # the free ones
    await throttle.failed(scope, "the token is wrong")
    assert trio.current_time() == pytest.approx(0.1)
    ended: list[float] = []
    refused: list[int] = []

    async def one() -> None:
        try:
            await throttle.failed(scope, "the token is wrong")
            ended.append(trio.current_time())
        except Exception as exc:
            refused.append(exc.status)  # type: ignore[attr-defined]

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
    # Two held (0.2 and 0.4 s: the 4th and 5th in a row), three refused at once.
    assert ended == [pytest.approx(0.3), pytest.approx(0.5)]
    assert refused == [429, 429, 429]


async def test_the_summary_comes_when_its_interval_ends_and_what_is_left_at_the_stop(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="controller")
    throttle = Throttle()
    scope = {"client": ADDRESS, "method": "POST", "path": "/login"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(throttle.run)
        for _ in range(3):
            await throttle.failed(scope, "the console's login with a wrong token")
        await trio.sleep(100)  # quiet: the interval ends with no failure to bring its line
        for _ in range(2):
            await throttle.failed(scope, "the console's login with a wrong token")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # the daemon stops: what is left is said
    assert [r.getMessage() for r in caplog.records] == [
        "failed login from 127.0.0.1: the console's login with a wrong token (POST /login); "
        "more from it are summed up every 60 s",
        "3 failed logins from 127.0.0.1 in the last 60 s",
        "2 failed logins from 127.0.0.1 in the last 40 s",
    ]


async def test_thousands_of_addresses_write_a_bounded_number_of_lines(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by an attack: 20,000 loopback addresses, 5 wrong tokens each, wrote 2 lines an
    # address (35,748 lines in 100 s), which would rotate the daemon's real history away.
    caplog.set_level(logging.INFO, logger="controller")
    throttle = Throttle()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(throttle.run)
        for n in range(2000):
            scope = {"client": (f"127.0.{n // 250}.{n % 250}", 1), "method": "GET", "path": "/"}
            for _ in range(3):
                await throttle.failed(scope, "the token is wrong")
        await trio.sleep(61)  # the interval ends: its lines are counted, not written
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) <= 2 * LOG_LINES + 2
    assert lines[LOG_LINES].endswith(f"left out (at most {LOG_LINES} an interval are written)")
    assert sum(int(line.split()[0]) for line in lines if "left out" in line) >= 3900


async def test_the_right_token_is_never_held_up_by_wrong_ones_from_its_address(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = controller.MemoryStore()
    runtime = FakeRuntime(auto_ready=True)
    async with controller.open_controller(runtime=runtime, store=store) as ctl:
        app = Api(
            ctl, token=TOKEN, epoch="e", render_metrics=lambda: b"", request_shutdown=lambda: None
        )
        answers: list[tuple[int, float]] = []

        async def wrong() -> None:
            status, headers, _ = await call(
                app, "GET", "/api/v1/backends", token="guess" * 8, client=ADDRESS
            )
            answers.append((status, trio.current_time()))
            if status == 429:
                assert headers["retry-after"] in ("1", "2")

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(wrong)
            await trio.testing.wait_all_tasks_blocked()
            # While wrong ones are held, the right one from the same address goes at once.
            started = trio.current_time()
            status, _, _ = await call(app, "GET", "/api/v1/backends", token=TOKEN, client=ADDRESS)
            assert (status, trio.current_time()) == (200, started)
        statuses = sorted(status for status, _ in answers)
        # 5 free, 3 held (0.1, 0.2, 0.4 s) while 8 answers were out at once, 42 refused.
        assert statuses == [401] * 8 + [429] * 42
        assert max(at for _, at in answers) == pytest.approx(0.4)


async def test_a_daemon_slows_fifty_wrong_tokens_and_sums_them_up(state_dir: Path) -> None:
    """On a real daemon, from 127.0.0.1 as every local client: ten wrong tokens in a row take
    the documented delays (5 free, then 0.1, 0.2, 0.4, 0.8, 1.6 s); forty at once are each held
    2 s or refused (429); the right token works throughout; the log has two lines, not fifty."""
    wrong = "guess-" * 8
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--no-ingress") as daemon:
            began = trio.current_time()
            for _ in range(10):
                assert (await daemon.http("GET", "/api/v1/backends", token=wrong))[0] == 401
            assert trio.current_time() - began >= 0.1 + 0.2 + 0.4 + 0.8 + 1.6
            answers: list[tuple[int, str | None, float]] = []

            async def guess() -> None:
                sent = trio.current_time()
                code, _, headers = await daemon.http_with_headers(
                    "GET", "/api/v1/backends", token=wrong
                )
                answers.append((code, headers.get("retry-after"), trio.current_time() - sent))

            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(guess)
            held = [took for code, _, took in answers if code == 401]
            refused = [after for code, after, _ in answers if code == 429]
            assert len(held) + len(refused) == 40, answers
            assert all(took >= 2.0 for took in held), held
            assert 1 <= len(held) <= 8, answers
            assert refused, answers
            assert set(refused) == {"2"}, answers
            sent = trio.current_time()
            assert (await daemon.http("GET", "/api/v1/backends"))[0] == 200
            assert trio.current_time() - sent < 1.0
    said = [line for line in daemon.log.decode().splitlines() if "from 127.0.0.1" in line]
    assert len(said) == 2, said
    assert "failed login from 127.0.0.1: the token is wrong (GET /api/v1/backends)" in said[0]
    assert re.search(
        r"50 failed logins from 127\.0\.0\.1 in the last \d+ s \(answers held up to 2 s, "
        r"\d+ refused with 429\)",
        said[1],
    ), said
