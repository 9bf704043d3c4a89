"""The pure parts of canary releases: the block's rules (each fault names its field), the
replica counts for a weight, the latency histogram and its p99, the gates, the step moves and a
pass's look (every move of a canary, decided from exact inputs), the split of requests at the
ingress (weights, sticky hashes, the forcing header), and the numbers a load report carries,
checked before any is taken."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import controller
from controller import CanaryConfig, ConfigError, RequestTally
from controller._model.config.canary import canary_count
from controller._model.decisions.canary_steps import (
    CanaryLook,
    CanarySight,
    StepClock,
    look,
    step_move,
)
from controller._model.decisions.verdict import bucket_of, bucket_top, judge, tally_from_json
from controller._model.views.load_report import load_body, parse_load_body
from controller._model.views.status import LoadReport
from controller._routing.split import Split, choose_side


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"steps": []}, "BackendConfig.canary.steps"),
        ({"steps": [{"weight": 0, "pause_s": 1}]}, "BackendConfig.canary.steps[0].weight"),
        ({"steps": [{"weight": 100, "pause_s": 1}]}, "BackendConfig.canary.steps[0].weight"),
        ({"steps": [{"weight": 5, "pause_s": -1}]}, "BackendConfig.canary.steps[0].pause_s"),
        ({"steps": [{"weight": 5}]}, "BackendConfig.canary.steps[0]"),
        (
            {"steps": [{"weight": 50, "pause_s": 1}, {"weight": 20, "pause_s": 1}]},
            "BackendConfig.canary.steps[1].weight",
        ),
        ({"max_error_rate_increase": 2}, "BackendConfig.canary.max_error_rate_increase"),
        ({"max_p99_ratio": 0.5}, "BackendConfig.canary.max_p99_ratio"),
        ({"min_requests": 0}, "BackendConfig.canary.min_requests"),
        ({"sticky_header": "X User"}, "BackendConfig.canary.sticky_header"),
        ({"force_header": ""}, "BackendConfig.canary.force_header"),
        ({"weights": [5]}, "BackendConfig.canary.weights"),
        ({"sticky_header": "Content-Length"}, "BackendConfig.canary.sticky_header"),
        ({"sticky_header": "cookie"}, "BackendConfig.canary.sticky_header"),
        ({"force_header": "Transfer-Encoding"}, "BackendConfig.canary.force_header"),
        ({"sticky_header": "X-Rev", "force_header": "x-rev"}, "BackendConfig.canary.force_header"),
    ],
)
def test_each_fault_of_the_block_names_its_field(block: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        controller.BackendConfig(canary=block)
    assert caught.value.field == field


def test_an_empty_block_takes_the_default_steps_and_survives_json() -> None:
    config = controller.BackendConfig(canary={})
    assert config.canary is not None
    assert [(s.weight, s.pause_s) for s in config.canary.steps] == [
        (5, 60),
        (25, 120),
        (50, 120),
    ]
    again = controller.BackendConfig.from_dict(
        {"canary": controller._model.values.fields.fields_of(config)["canary"]}
    )
    assert again == config
    assert CanaryConfig.from_dict({"sticky_header": "X-User"}).sticky_header == "x-user"


@pytest.mark.parametrize(
    ("n", "weight", "count"), [(4, 25, 1), (4, 26, 2), (2, 5, 1), (10, 50, 5), (0, 50, 0)]
)
def test_the_canary_runs_its_share_rounded_up_and_at_least_one(
    n: int, weight: float, count: int
) -> None:
    assert canary_count(n, weight) == count


@given(seconds=st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_an_answer_time_falls_in_a_bucket_that_holds_it(seconds: float) -> None:
    k = bucket_of(seconds)
    assert seconds < bucket_top(k) or k == 80
    assert k == 0 or seconds >= bucket_top(k - 1) * (1 - 1e-9)


def test_p99_is_read_off_the_histogram_within_its_bucket() -> None:
    tally = RequestTally()
    for _ in range(990):
        tally.count(False, 0.010)
    for _ in range(10):
        tally.count(True, 0.500)
    p99 = tally.quantile(0.99)
    assert p99 is not None
    assert 0.010 <= p99 < 0.012
    assert tally.error_rate == pytest.approx(0.01)
    assert RequestTally().quantile(0.99) is None


def tally(requests: int, errors: int = 0, seconds: float = 0.01) -> RequestTally:
    t = RequestTally()
    for i in range(requests):
        t.count(i < errors, seconds)
    return t


def test_the_gates() -> None:
    config = CanaryConfig(min_requests=100)
    # Too few requests: no verdict, either way.
    assert not judge(config, tally(99, 50), tally(1000)).enough
    assert judge(config, tally(100), tally(1000)).failed is None
    # One point over the stable's rate passes; well beyond it fails.
    assert judge(config, tally(100, 1), tally(2000)).failed is None
    failed = judge(config, tally(100, 6), tally(2000)).failed
    assert failed is not None
    assert failed.startswith("error rate 6.0% > stable 0.0% + 1.0%")
    # A stable revision that fails as much is no worse than the canary.
    assert judge(config, tally(100, 20), tally(100, 20)).failed is None
    # Above the margin by less than the noise of the two rates is not a failure: an identical
    # release at 10 % errors, 11.0 % of 556 against 9.9 % of 2,423 (a trial's numbers)...
    assert judge(config, tally(556, 61), tally(2423, 241)).failed is None
    # ...while the same margin crossed by a wide gap, on as many requests, is.
    assert judge(config, tally(556, 90), tally(2423, 241)).failed is not None
    # Small samples need a clear gap: 3 of 100 against 1 % of 2,000 is noise.
    assert judge(config, tally(100, 3), tally(2000, 20)).failed is None
    # Twice as slow fails; 1.4x passes; a few ms slower passes by the slack.
    assert judge(config, tally(100, seconds=0.2), tally(100, seconds=0.1)).failed is not None
    assert judge(config, tally(100, seconds=0.14), tally(100, seconds=0.1)).failed is None
    assert judge(config, tally(100, seconds=0.004), tally(100, seconds=0.001)).failed is None


def test_the_step_moves() -> None:
    config = CanaryConfig.from_dict(
        {"steps": [{"weight": 5, "pause_s": 60}, {"weight": 50, "pause_s": 60}], "min_requests": 10}
    )
    good = judge(config, tally(10), tally(10))
    none = judge(config, tally(1), tally(10))
    bad = judge(config, tally(10, 5), tally(200))
    assert step_move(config, 0, 30, good, held=False, deadline_s=600).wake_in == 30
    assert step_move(config, 0, 60, good, held=False, deadline_s=600).move == "next"
    assert step_move(config, 1, 60, good, held=False, deadline_s=600).move == "promote"
    assert step_move(config, 0, 1, bad, held=False, deadline_s=600).move == "abort"
    assert step_move(config, 0, 1, bad, held=True, deadline_s=600).move == "abort"
    assert step_move(config, 0, 61, good, held=True, deadline_s=600).move == "wait"
    assert step_move(config, 0, 60, none, held=False, deadline_s=600).wake_in == 540
    late = step_move(config, 0, 600, none, held=False, deadline_s=600)
    assert late.move == "abort"
    assert "no verdict within progress_deadline_s=600" in late.why
    # Following another backend's canary: on at each pause without numbers of its own, the last
    # step waiting for that one's verdict; its own gates still abort it.
    follow = {"held": False, "deadline_s": 600, "following": True}
    assert step_move(config, 0, 60, none, **follow).move == "next"  # type: ignore[arg-type]
    assert step_move(config, 0, 30, none, **follow).wake_in == 30  # type: ignore[arg-type]
    last = step_move(config, 1, 6000, good, **follow)  # type: ignore[arg-type]
    assert (last.move, last.wake_in) == ("wait", float("inf"))
    assert step_move(config, 1, 1, bad, **follow).move == "abort"  # type: ignore[arg-type]


def test_a_pass_s_look_decides_every_move_of_a_canary() -> None:
    config = CanaryConfig.from_dict(
        {
            "steps": [{"weight": 25, "pause_s": 60}, {"weight": 50, "pause_s": 60}],
            "min_requests": 10,
        }
    )
    empty, good = (tally(0), tally(0)), (tally(10), tally(10))

    def seen(
        clock: StepClock,
        numbers: tuple[RequestTally, RequestTally],
        now: float,
        serving: int,
        *,
        paused: bool = False,
        lost: str | None = None,
        block: CanaryConfig | None = config,
    ) -> CanaryLook:
        return look(
            CanarySight(
                block, clock, numbers, revision=2, now=now, paused=paused, serving=serving,
                num_replicas=4, deadline_s=600, lost=lost,
            )
        )  # fmt: skip

    # The clock waits for the step's replicas (25% of 4: one), then starts and says so.
    waiting = seen(StepClock(), empty, 100, serving=0)
    assert (waiting.clock, waiting.events, waiting.wake_at) == (StepClock(), (), float("inf"))
    assert not waiting.judged  # a person's steer then says no numbers: none were judged
    started = seen(StepClock(), empty, 100, serving=1)
    assert started.clock == StepClock(0, started=100)
    assert started.events == (("CanaryStep", "revision 2: step 1 of 2: 25% of requests for 60s"),)
    assert (started.touched, started.end, started.due, started.wake_at) == (True, None, 160, 160)

    # A pause stops the clock (stored: a restart keeps it); its end restarts the deadline.
    clock = StepClock(0, started=100)
    held = seen(clock, empty, 130, serving=1, paused=True)
    assert (held.clock.held_since, held.due, held.wake_at) == (130, float("inf"), float("inf"))
    back = seen(held.clock, empty, 150, serving=1)
    assert (back.clock.held_s, back.clock.held_since, back.progressed) == (20, None, True)
    assert back.wake_at == 180  # 30 s of the pause run, 30 left

    # The pause over with the gates passing: the next step, looked at at once; its replicas
    # serve already (two of 4 for 50%), so its clock starts now, with numbers of its own.
    on = seen(clock, good, 160, serving=2)
    assert on.clock == StepClock(1, started=160)
    assert [reason for reason, _ in on.events] == ["CanaryStepPassed", "CanaryStep"]
    assert (on.entered, on.progressed, on.end, on.wake_at) == (True, True, None, 220)
    # Its replicas not serving yet: the step is entered and waits for them.
    entered = seen(clock, good, 160, serving=1)
    assert (entered.clock, entered.entered, entered.wake_at) == (StepClock(1), True, float("inf"))
    assert entered.judged  # the step that passed was

    # The last step passed: promoted; a failing gate aborts before the pause ends.
    last = seen(StepClock(1, started=100), good, 160, serving=2)
    assert (last.end, last.progressed) == ("promote", True)
    assert last.why.startswith("every step passed: ")
    bad = seen(clock, (tally(10, 5), tally(200)), 101, serving=1)
    assert (bad.end, bad.progressed) == ("abort", False)
    assert bad.why.startswith("step 1 of 2 (25%): ")

    # A replica lost while no controller ran aborts; a config without the block promotes.
    lost = seen(clock, good, 101, serving=1, lost="it was gone")
    assert (lost.end, lost.why) == ("abort", "step 1: it was gone")
    dropped = seen(clock, good, 101, serving=1, block=None)
    assert (dropped.end, dropped.why) == ("promote", "the canary block was taken out of the config")


def test_requests_split_by_weight_by_hash_and_by_force() -> None:
    rng = random.Random(7)
    split = Split("v2", "v1", 20.0, sticky_header=b"x-user", force_header=b"x-revision")
    drawn = Counter(choose_side(split, [], rng) for _ in range(10_000))
    assert 1800 < drawn["canary"] < 2200
    # A sticky value picks one side, whatever the draw; a client on the canary at 20 % stays
    # there at 50 %.
    users = [[(b"x-user", f"user-{i}".encode())] for i in range(500)]
    at_20 = [choose_side(split, u, rng) for u in users]
    assert at_20 == [choose_side(split, u, rng) for u in users]
    wider = Split("v2", "v1", 50.0, sticky_header=b"x-user")
    at_50 = [choose_side(wider, u, rng) for u in users]
    assert all(b == "canary" for a, b in zip(at_20, at_50, strict=True) if a == "canary")
    assert 60 < at_20.count("canary") < 140
    assert choose_side(split, [(b"x-revision", b"Canary")], rng) == "canary"
    assert choose_side(split, [(b"x-revision", b"stable")], rng) == "stable"
    # An aborted canary (weight 0) takes nothing, forced or not.
    aborted = Split("v2", "v1", 0.0, force_header=b"x-revision")
    assert choose_side(aborted, [(b"x-revision", b"canary")], rng) == "stable"
    cookie = Split("v2", "v1", 50.0, sticky_cookie=b"session")
    jar = [(b"cookie", b"a=1; session=abc; b=2")]
    assert len({choose_side(cookie, jar, rng) for _ in range(50)}) == 1


def test_a_load_report_carries_the_numbers_and_a_bad_one_is_refused_whole() -> None:
    report = LoadReport("ingress-1", "a", {"a#1": 2}, 0, traffic={"v2": tally(5, 1)})
    (parsed,) = parse_load_body(load_body("ingress-1", [report]))
    assert parsed.traffic["v2"] == tally(5, 1)
    body = load_body("ingress-1", [report])
    body["backends"]["a"]["traffic"]["v2"]["errors"] = 6
    with pytest.raises(ValueError, match=r"traffic\['v2'\]: requests and errors"):
        parse_load_body(body)
    body = load_body("ingress-1", [report])
    body["backends"]["a"]["traffic"]["v2"]["buckets"] = {"81": 5}
    with pytest.raises(ValueError, match="bucket numbers 0-80"):
        parse_load_body(body)
    body = load_body("ingress-1", [report])
    body["backends"]["a"]["traffic"]["v2"]["buckets"] = {"3": 4}
    with pytest.raises(ValueError, match="every request once"):
        parse_load_body(body)
    with pytest.raises(ValueError, match="requests and errors must be counts"):
        tally_from_json({"requests": True, "errors": 0, "buckets": {}})


def clients(*counts: tuple[str, int, int]) -> RequestTally:
    """A tally of clients' (name, requests, errors), summed as an ingress counts them."""
    t = RequestTally()
    for client, requests, errors in counts:
        for i in range(requests):
            t.count(i < errors, 0.01, client)
    return t


def test_no_single_client_decides_the_error_gate() -> None:
    config = CanaryConfig(min_requests=100)
    legit = [(f"10.0.0.{n}", 40, 0) for n in range(10)]
    # The fourth attack: 80 failing POSTs from one address abort an identical release...
    canary = clients(*legit[:5], ("6.6.6.6", 80, 80))
    stable = clients(*legit)
    verdict = judge(config, canary, stable)
    assert verdict.enough
    assert verdict.failed is None, verdict
    assert "without 6.6.6.6" in verdict.numbers
    # ...as they would if counted: the same numbers, named by no client.
    assert judge(config, tally(280, 80), tally(400)).failed is not None
    # 622 failing requests to the stable hide a release that fails a fifth of its requests.
    canary = clients(*((f"10.0.0.{n}", 40, 8) for n in range(10)))
    stable = clients(*legit, ("6.6.6.6", 622, 622))
    failed = judge(config, canary, stable).failed
    assert failed is not None
    assert failed.startswith("error rate"), failed
    # A release that fails many clients fails, one client or not.
    canary = clients(*((f"10.0.0.{n}", 40, 10) for n in range(10)), ("6.6.6.6", 80, 80))
    assert judge(config, canary, clients(*legit)).failed is not None
    # A tally whose one client is all its traffic is judged on it: a client behind everything
    # (a load test, a proxy) cannot be left out of its own numbers.
    assert judge(config, clients(("10.0.0.1", 200, 40)), clients(("10.0.0.1", 400, 0))).failed
    # Summed from reports where that client erred in some only, it is still the only one.
    total = RequestTally()
    for errors in (0, 20, 0, 20):
        total.add(tally_from_json(clients(("10.0.0.1", 50, errors)).to_json()))
    assert total.without_worst() == (200, 40, None)


def test_a_tally_names_its_heaviest_clients_and_reports_are_checked() -> None:
    many = clients(*((f"10.0.{n // 250}.{n % 250}", 2, n % 2) for n in range(2000)))
    # An ingress tracks a thousand clients between reports; a report names sixteen.
    assert len(many.clients) == 1024
    named = tally_from_json(many.to_json())
    assert len(named.clients) == 16
    assert all(errors == 1 for _, errors in named.clients.values())
    for bad in (
        {"x" * 65: [1, 0]},
        {"a": [2, 0]},  # more than the tally's requests
        {"a": [1, 2]},
        {f"c{n}": [0, 0] for n in range(17)},
        {"a": "1,0"},
    ):
        body = {**clients(("a", 1, 0)).to_json(), "clients": bad}
        with pytest.raises(ValueError, match="clients must map at most 16 names"):
            tally_from_json(body)


def test_sums_stop_at_what_a_double_holds_and_versions_are_checked() -> None:
    big = RequestTally(2**53 - 1, 0, {0: 2**53 - 1})
    total = RequestTally()
    total.add(big)
    total.add(big)
    assert (total.requests, total.buckets[0]) == (2**53 - 1, 2**53 - 1)
    body = load_body("ingress-1", [LoadReport("ingress-1", "a", {}, 0, traffic={"v": tally(1)})])
    body["backends"]["a"]["traffic"] = {"x" * 241: tally(1).to_json()}
    with pytest.raises(ValueError, match="keys must be replica versions"):
        parse_load_body(body)


def test_a_callee_keeps_to_the_side_its_callers_request_reached() -> None:
    from controller._routing.split import callee_side

    split = Split("v2", "v1", 5.0)
    # A canary's request keeps to the callee's canary; a rolling update's does not pour onto
    # it (drawn by the callee's weights instead: None here).
    assert [callee_side(s, split) for s in ("canary", "stable", "new", "old", None)] == [
        "canary",
        "stable",
        None,
        None,
        None,
    ]
    # A callee in a rolling update: new with new, old with old, a canary's as the new version.
    assert [callee_side(s, None) for s in ("canary", "stable", "new", "old", None)] == [
        "new",
        "old",
        "new",
        "old",
        None,
    ]
