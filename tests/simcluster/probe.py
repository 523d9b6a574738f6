"""Times the extender's filter and prioritize from a process of its own, as kube-scheduler calls them:
in the harness's process, the simulated kubelets sharing its event loop would delay reading the
answers and count against the extender.

`python -m simcluster.probe URL` reads a JSON list of ExtenderArgs on stdin, sends each to filter
and then prioritize, one call at a time on one kept-alive connection, and writes
{"filter": [seconds...], "prioritize": [seconds...]} to stdout. Standard library only."""

from __future__ import annotations

import http.client
import json
import sys
import time
from typing import Any
from urllib.parse import urlsplit


def time_calls(url: str, bodies: list[bytes]) -> dict[str, list[float]]:
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=10)
    timed: dict[str, list[float]] = {"filter": [], "prioritize": []}
    try:
        for body in bodies:
            for verb, samples in timed.items():
                start = time.perf_counter()
                connection.request("POST", f"/{verb}", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                samples.append(time.perf_counter() - start)
                if response.status != 200:
                    raise RuntimeError(f"extender {verb}: HTTP {response.status}")
    finally:
        connection.close()
    return timed


def main(argv: list[str]) -> int:
    args: list[Any] = json.load(sys.stdin)
    json.dump(time_calls(argv[0], [json.dumps(a).encode() for a in args]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
