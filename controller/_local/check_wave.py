"""A wave of health checks over the monitor connections of many workers (``LocalRuntime``'s
``check_health_replicas``): every request is written before any answer is awaited, and the wave's
one task parks until answers come, then reports all that came meanwhile together. So a check
costs the controller a short write, and a share of one wake-up and one report, instead of a task
and an event of its own (a wave of 100 checks answered in one burst is one report)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

import trio

from .._ports.arrivals import Arrivals
from .._ports.runtime import CheckReport, Runtime, check_each
from .commands import died, refused
from .link import ENDED, Answer, MonitorLink


async def check_wave(
    asked: Sequence[tuple[str, MonitorLink]], epoch: int, runtime_dir: Path, report: CheckReport
) -> None:
    """Check each (tag, link) of `asked` as the leader of `epoch`; `report` them as they answer;
    return once all have. Cancelled (the wave's deadline), it forgets those left."""
    answers: Arrivals[tuple[str, MonitorLink, Answer]] = Arrivals()

    def answered(tag: str, link: MonitorLink, answer: Answer) -> None:
        answers.put((tag, link, answer))

    async def take_all() -> None:
        left = len(asked)
        while left:
            got = await answers.take()
            left -= len(got)
            results: list[tuple[str, Exception | None]] = []
            for tag, link, answer in got:
                if answer is None:
                    results.append((tag, None))
                elif answer is ENDED:
                    results.append((tag, await died(runtime_dir, tag, link.why)))
                else:
                    results.append((tag, refused(tag, epoch, "check_health", answer)))
            report(results)

    asking: list[tuple[MonitorLink, int]] = []
    try:
        for tag, link in asked:
            ident = link.ask(epoch, partial(answered, tag, link))
            if ident is not None:
                asking.append((link, ident))
        blocked = [link for link, _ in asking if link.blocked]
        if not blocked:
            await take_all()
            return
        # A worker that has read nothing for long: its requests go out as it makes room.
        async with trio.open_nursery() as nursery:
            for link in blocked:
                nursery.start_soon(link.write)
            await take_all()
    finally:
        for link, ident in asking:
            link.forget(ident)


async def check_links(
    runtime: Runtime,
    links: Mapping[str, MonitorLink | None],
    epoch: int,
    runtime_dir: Path,
    report: CheckReport,
) -> None:
    """A wave over the links of the workers that answer checks on theirs; the others (started
    by an older version, or not held) checked one by one, as `runtime` checks one."""
    linked = [(tag, link) for tag, link in links.items() if link is not None and link.checks]
    others = [tag for tag, link in links.items() if link is None or not link.checks]
    if not others:
        await check_wave(linked, epoch, runtime_dir, report)
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(check_each, runtime, others, report)
        await check_wave(linked, epoch, runtime_dir, report)
