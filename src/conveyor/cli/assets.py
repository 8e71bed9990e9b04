"""`conveyor assets list|show|touch` and `conveyor events send`: data and events from
outside a DAG, and what the schedulers know of each asset.

`touch` and `send` write the event to the state store (queued for every DAG scheduled on it,
state/assets.py) and poke the schedulers through the broker, as `dags trigger` does; a
running `conveyor scheduler` starts the runs whose conditions now hold.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from conveyor.cli.output import json_argument, table
from conveyor.errors import ConfigError
from conveyor.readers.assets import asset_doc, asset_rows
from conveyor.scheduler import daemon as daemons
from conveyor.scheduler.cli import common_flags, config_from
from conveyor.state import store as stores
from conveyor.state.assets import asset_uri, event_key, record_event


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    assets = commands.add_parser("assets", help="assets: list, show, record an update").\
        add_subparsers(dest="assets_command", required=True)
    listing = assets.add_parser("list", help="every asset: producers, consumers, last event")
    common_flags(listing, dags=False)
    listing.set_defaults(run=run_list)
    show = assets.add_parser("show", help="one asset and its latest events")
    show.add_argument("uri", help="the asset's URI (an event: event:NAME)")
    show.add_argument("--limit", type=int, default=20, help="events to show (default 20)")
    common_flags(show, dags=False)
    show.set_defaults(run=run_show)
    touch = assets.add_parser("touch", help="record an update of an asset made outside a "
                              "DAG: the DAGs scheduled on it count it")
    touch.add_argument("uri", help="the asset's URI, e.g. s3://lake/orders")
    touch.add_argument("--extra", type=json_argument(dict), default={},
                       help="a JSON object kept with the event (the consumer run sees it)")
    common_flags(touch, dags=False)
    touch.set_defaults(run=run_touch)
    events = commands.add_parser("events", help="send a named event").add_subparsers(
        dest="events_command", required=True)
    send = events.add_parser("send", help="send an event: each DAG scheduled on "
                             "Event(NAME) gets a run with the payload as its conf")
    send.add_argument("name", help="the event's name, e.g. invoice.paid")
    send.add_argument("--payload", type=json_argument(dict), default={},
                      help="a JSON object: the run's conf")
    send.add_argument("--dedupe-key", default=None, help="an event sent again with the "
                      "same key (for this name) is a no-op")
    common_flags(send, dags=False)
    send.set_defaults(run=run_send)


def run_list(args: argparse.Namespace) -> int:
    rows = _read(args, asset_rows)
    if args.json:
        print(json.dumps({"assets": rows}, indent=2))
    else:
        shown = [{**r, "producers": ",".join(r["producers"]),
                  "consumers": ",".join(r["consumers"])} for r in rows]
        print(table(shown, ["uri", "producers", "consumers", "events", "queued",
                            "last_event"]))
    return 0


def run_show(args: argparse.Namespace) -> int:
    doc = _read(args, lambda store: asset_doc(store, args.uri, args.limit))
    if doc is None:
        raise ConfigError(f"no asset {args.uri!r}: no loaded DAG names it and no event of it "
                          "was recorded (see `conveyor assets list`)")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['uri']}\n  producers: {', '.join(doc['producers']) or '-'}\n  consumers: "
          f"{', '.join(doc['consumers']) or '-'}\n  events: {doc['events']} "
          f"({doc['queued']} queued for a consumer)")
    print(table([{**e, "extra": json.dumps(e["extra"]),
                  "from": e["run_id"] and f"{e['dag_id']}/{e['task_id']}" or e["source"]}
                 for e in doc["latest"]], ["event_id", "at", "from", "extra"]))
    return 0


def run_touch(args: argparse.Namespace) -> int:
    return _record(args, asset_uri(args.uri), args.extra, None)


def run_send(args: argparse.Namespace) -> int:
    return _record(args, event_key(args.name), args.payload, args.dedupe_key)


def _record(args: argparse.Namespace, uri: str, extra: dict[str, Any],
            dedupe_key: str | None) -> int:
    config = config_from(args)
    event_id, new = _read(args, lambda store: record_event(
        store, uri, extra, time.time(), source="cli", dedupe_key=dedupe_key))
    if new:
        daemons.poke(config, "")
    if args.json:
        print(json.dumps({"event_id": event_id, "uri": uri, "new": new}))
    elif new:
        print(f"event {event_id} of {uri} recorded")
    else:
        print(f"event {uri} with dedupe key {dedupe_key!r} was sent before (event "
              f"{event_id}): nothing done")
    return 0


def _read(args: argparse.Namespace, read: Any) -> Any:
    store = stores.from_url(config_from(args).settings.state_url)
    try:
        return read(store)
    finally:
        store.close()
