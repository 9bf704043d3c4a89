"""The trivial replica classes the benchmarks start: they do nothing, so start-up is overhead."""


class Noop:
    pass


class DrainingNoop(Noop):
    """The race's class (bench/ray_race.py): a ``drain`` that returns at once, so that a stop
    makes the same round trip on every side (our controller calls ``drain``, Ray Serve calls its
    own graceful shutdown, raw Ray calls ``drain`` before ``ray.kill``) and none is timed without
    one. Kept apart from `Noop`, whose stops bench/bench.py measures without a drain."""

    def drain(self) -> None:
        # Sync on purpose: an async method would make raw Ray's actor an asyncio actor, a
        # different kind of worker than the races before this one timed.
        return None
