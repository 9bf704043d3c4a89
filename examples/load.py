"""Load for the autoscaling example: `python examples/load.py [--url ...] [--clients N]`.

Runs in three phases (ramp up, hold, stop) and prints, each second, the requests answered, how
many distinct replicas answered them and how many requests failed (an answer other than 200, or
none), so that the autoscaler's work is visible without a token: replicas appear as the load
rises and go once it stops (see `controller status auto`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
import urllib.parse


def client(
    url: str, stop: threading.Event, seen: list[str], failed: list[str], lock: threading.Lock
) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
    while not stop.is_set():
        try:
            conn.request("GET", parts.path or "/")
            answer = conn.getresponse()
            body = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            with lock:
                failed.append(type(exc).__name__)
            time.sleep(0.1)  # a client's pause before it tries again
            continue
        with lock:
            if answer.status == 200:
                seen.append(json.loads(body)["replica"])
            else:
                failed.append(str(answer.status))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/auto")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients at the peak")
    parser.add_argument("--seconds", type=int, default=40, help="how long the peak lasts")
    args = parser.parse_args()
    lock = threading.Lock()
    seen: list[str] = []
    failed: list[str] = []
    stops: list[threading.Event] = []
    start = time.monotonic()
    for second in range(args.seconds + 10):
        # One more client every half second up to the peak: the load ramps up.
        while len(stops) < min(args.clients, 2 * (second + 1)):
            stop = threading.Event()
            threading.Thread(
                target=client, args=(args.url, stop, seen, failed, lock), daemon=True
            ).start()
            stops.append(stop)
        time.sleep(max(0.0, start + second + 1 - time.monotonic()))
        with lock:
            answered, seen[:] = list(seen), []
            lost, failed[:] = list(failed), []
        print(
            f"t={second + 1:3d}s  clients={len(stops):3d}  answered={len(answered):4d}  "
            f"replicas answering={len(set(answered))}  failed={len(lost)}",
            flush=True,
        )
    for stop in stops:
        stop.set()
    print("load stopped: the backend scales down after its window, and to zero after its delay")


if __name__ == "__main__":
    main()
