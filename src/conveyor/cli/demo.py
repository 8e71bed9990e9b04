"""`conveyor demo`: a first look, with nothing to set up (the embedded SQLite broker)."""

from __future__ import annotations

import argparse
import time

from conveyor import broker as brokers
from conveyor.config import checked
from conveyor.kinds import positive_int, url
from conveyor.locations import embedded_broker_url, redact
from conveyor.message import Codec, Message


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help=run_demo.__doc__)
    demo.add_argument("--broker", default=None, type=checked(url),
                      help="broker URL (default: embedded SQLite)")
    demo.add_argument("--count", type=checked(positive_int), default=5)
    demo.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Enqueue a few messages on the embedded default broker and consume them back."""
    broker = brokers.from_url(args.broker)
    codec = Codec()
    print(f"broker: {redact(args.broker or embedded_broker_url())}")
    for i in range(args.count):
        broker.publish("demo", codec.encode(Message(queue="demo", task="demo.echo", args=(i,))))
    print(f"published {args.count} messages to queue 'demo': {broker.depth('demo')}")
    started = time.monotonic()
    done = 0
    for delivery in broker.consume(["demo"], prefetch=8, timeout=0.5):
        if delivery is None:
            break
        message = codec.decode(delivery.body)
        broker.ack(delivery)
        done += 1
        print(f"  consumed {message.id} {message.task}{tuple(message.args)}")
    elapsed = time.monotonic() - started
    print(f"consumed and acked {done} in {elapsed * 1000:.1f} ms: {broker.depth('demo')}")
    broker.close()
    return 0
