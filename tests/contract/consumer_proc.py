"""A real consumer process for the crash and race tests of the conformance suite.

usage: consumer_proc.py hold URL QUEUE LEASE
       consumer_proc.py drain URL QUEUE OUTFILE IDLE_SECONDS PREFETCH
`hold` claims one message, prints `claimed <delivery_count>` and sleeps until killed.
`drain` acks messages until the queue has been idle for IDLE_SECONDS, writing one line per
processed body (and its delivery count) to OUTFILE.
"""

from __future__ import annotations

import sys
import time

from conveyor.broker import from_url


def hold(url: str, queue: str, lease: float) -> None:
    broker = from_url(url, lease_seconds=lease)
    for delivery in broker.consume([queue], timeout=1.0):
        if delivery is not None:
            print(f"claimed {delivery.delivery_count}", flush=True)
            time.sleep(3600)


def drain(url: str, queue: str, outfile: str, idle: float, prefetch: int) -> None:
    broker = from_url(url)
    last = time.monotonic()
    with open(outfile, "a") as out:
        for delivery in broker.consume([queue], prefetch=prefetch, timeout=0.2):
            if delivery is None:
                if time.monotonic() - last > idle:
                    break
                continue
            out.write(f"{delivery.body.decode()} {delivery.delivery_count}\n")
            out.flush()
            broker.ack(delivery)
            last = time.monotonic()
    broker.close()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "hold":
        hold(args[0], args[1], float(args[2]))
    else:
        drain(args[0], args[1], args[2], float(args[3]), int(args[4]))
