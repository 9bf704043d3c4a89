"""The README's "Serving many models" and "Batching requests" as a user runs them: a daemon on
examples/, the examples applied, curl with a model's header (or 20 at once), and what status
and /metrics say of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import trio

from ..daemons import LIMIT_S, running, until
from ..http_client import request
from ..pristine import EXAMPLES


async def test_the_readmes_multiplexing_example_routes_by_model_and_shows_what_is_held(
    state_dir: Path, tmp_path: Path
) -> None:
    examples = tmp_path / "examples"  # a pristine copy: a user may be editing theirs
    shutil.copytree(EXAMPLES, examples)
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--pythonpath", str(examples)) as daemon:
            applied = await daemon.cli("apply", "-f", str(examples / "multiplexing.toml"), "--wait")
            assert applied.returncode == 0, applied.stdout.decode() + applied.stderr.decode()
            port = int(daemon.ingress_url.rpartition(":")[2])

            async def predict(model: str) -> dict[str, object]:
                answer = await request(port, "/predict?text=hi", headers=[("x-model-id", model)])
                assert answer.status == 200, answer.body
                body: dict[str, object] = answer.json()
                assert body["model"] == model
                return body

            first = await predict("m1")
            assert first["output"] == 755  # the README's transcript
            # One at a time, as curl: each ingress process has heard where m1 is by the time
            # the next request comes (the load of 0.5 s is reported as it starts).
            assert {(await predict("m1"))["replica"] for _ in range(6)} == {first["replica"]}
            others = {(await predict(m))["replica"] for m in ("m2", "m3")}
            assert first["replica"] not in others
            shown = await daemon.cli("status", "models")
            text = shown.stdout.decode()
            assert "Models (what each multiplexed replica holds):" in text, text
            held = rf"\n\s+{re.escape(str(first['replica']))}\s+1/4\s+\d+ % hits\s+m1\n"
            assert re.search(held, text), text
            assert "Requests by model: m1 7, m2 1, m3 1\n" in text
            code, metrics = await daemon.http("GET", "/metrics")
            assert code == 200
            assert 'controller_model_requests{backend="models",model="m1"} 7.0' in metrics
            hits = (
                f'controller_replica_model_lookups_total{{backend="models",'
                f'replica="{first["replica"]}",result="hit"}} 6.0'
            )
            assert hits in metrics
            assert (await daemon.cli("delete", "models", "--wait")).returncode == 0


async def test_the_readmes_batching_example_shows_its_batches_in_metrics(
    state_dir: Path, tmp_path: Path
) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLES, examples)
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--pythonpath", str(examples)) as daemon:
            applied = await daemon.cli("apply", "-f", str(examples / "batching.toml"), "--wait")
            assert applied.returncode == 0, applied.stdout.decode() + applied.stderr.decode()
            port = int(daemon.ingress_url.rpartition(":")[2])
            sizes: list[int] = []

            async def score(i: int) -> None:
                sizes.append((await request(port, f"/score?text=t{i}")).json()["batch"])

            async with trio.open_nursery() as clients:  # the README's 20 curls at once
                for i in range(20):
                    clients.start_soon(score, i)
            assert max(sizes) > 1
            pattern = (
                r'controller_replica_batched_items_total\{backend="scorer",'
                r'function="Scorer.predict",replica="scorer#[0-9a-f]+"\} 20.0'
            )

            def batched(status: dict[str, Any]) -> int:
                return sum(b["items"] for bs in status["load"]["batches"].values() for b in bs)

            await until(daemon, "scorer", lambda status: batched(status) == 20)
            _, metrics = await daemon.http("GET", "/metrics")
            assert re.search(pattern, metrics), metrics
            largest = re.search(r"controller_replica_batch_largest\{[^}]*\} (\d+)", metrics)
            assert largest is not None
            assert int(float(largest.group(1))) == max(sizes)
            assert (await daemon.cli("delete", "scorer", "--wait")).returncode == 0
