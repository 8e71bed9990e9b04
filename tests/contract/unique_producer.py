"""One producer of the uniqueness contract test (`test_unique.py`): enqueues `t.unique(i)`
with `unique_key="k<i>"` for i in 0..n-1 once the test says go (a line on stdin), so that
every producer races for every key, then prints one JSON list of [i, id, duplicate].

Usage: unique_producer.py BROKER_URL STORE_URL QUEUE N
"""

from __future__ import annotations

import json
import sys

from conveyor import limits
from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.message import Message


def main(broker_url: str, store_url: str, queue: str, n: int) -> None:
    client = Client(from_url(broker_url), limiter=limits.from_url(store_url))
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        out = []
        for i in range(n):
            handle = client.enqueue(Message(queue=queue, task="t.unique", args=(i,)),
                                    unique_key=f"k{i}")
            out.append([i, handle.id, handle.duplicate])
        print(json.dumps(out), flush=True)
    finally:
        client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
