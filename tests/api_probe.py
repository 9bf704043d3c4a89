"""Times a daemon's ``/healthz`` from a process of its own (so that the load a test generates
does not delay the probe itself): ``python api_probe.py URL SECONDS`` prints one JSON list of
latencies in milliseconds, one request every 50 ms."""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.parse


def main() -> None:
    url, seconds = sys.argv[1], float(sys.argv[2])
    parts = urllib.parse.urlsplit(url)
    end = time.monotonic() + seconds
    latencies = []
    while time.monotonic() < end:
        began = time.monotonic()
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            raise SystemExit(f"/healthz answered {response.status}")
        latencies.append((time.monotonic() - began) * 1000)
        time.sleep(max(0.0, 0.05 - (time.monotonic() - began)))
    print(json.dumps(latencies))


if __name__ == "__main__":
    main()
