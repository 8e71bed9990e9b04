"""kombu+ URLs and what this transport keeps of the seam: names, delay levels, priorities,
and the caveats printed at start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from conveyor.broker import positive_option
from conveyor.broker.bands import TOP_BAND, band_of
from conveyor.broker.reconnect import DEPRECATED_RETRY_OPTION, RETRY_OPTION, retry_seconds
from conveyor.errors import ConfigError
from conveyor.locations import redact, scheme

ID_HEADER = "x-conveyor-id"
DELIVERIES_HEADER = "x-conveyor-deliveries"
DUE_HEADER = "x-conveyor-due"
REASON_HEADER = "x-conveyor-reason"
DEAD_AT_HEADER = "x-conveyor-dead-at"
#: Delay levels 0..TOP_LEVEL; level k >= 1 holds delays of [2**k, 2**(k+1)) seconds.
TOP_LEVEL = 16
#: Shortest pause between two looks at an empty delay level.
LEVEL_POLL = 1.0
#: Messages one look at a delay level examines (the rest wait for the next look).
LEVEL_SCAN = 100
#: How long `depth` waits for deliveries already on their way to this consumer.
SETTLE = 0.05
#: Transports whose unacknowledged deliveries return when the connection drops.
CONNECTION_BOUND = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})
REDIS = frozenset({"redis", "rediss"})
OPTIONS = ("prefix", "visibility_timeout", RETRY_OPTION, DEPRECATED_RETRY_OPTION,
           "queue_expires")
#: kombu's Redis priority that holds each band: kombu pops its priority 0 first.
REDIS_STEP = {band: 9 - 3 * band for band in range(TOP_BAND + 1)}


@dataclass(frozen=True)
class KombuSettings:
    """A parsed `kombu+…` URL: kombu's own URL plus Conveyor's options."""

    url: str  # kombu's: several nodes of a cluster joined by ';' (kombu's failover list)
    transport: str
    prefix: str
    where: str
    retry_seconds: float
    transport_options: dict[str, Any] = field(default_factory=dict)
    queue_arguments: dict[str, Any] = field(default_factory=dict)
    #: one kombu URL per node of a multi-host AMQP URL (kombu+amqp://u:p@h1,h2/vhost), in
    #: its order; one for a single host
    hosts: tuple[str, ...] = ()


def parse_url(url: str) -> KombuSettings:
    """Strip `kombu+` and Conveyor's query options; kombu gets the rest untouched."""
    if not scheme(url).startswith("kombu+"):
        raise ConfigError(f"kombu broker URL {redact(url)!r} must look like "
                          "kombu+<transport>://…, e.g. kombu+redis://127.0.0.1:6379/0")
    parts = urlsplit(url[len("kombu+"):])
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in OPTIONS}
    rest = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query
                                                      if k not in OPTIONS])))
    options: dict[str, Any] = {}
    if "visibility_timeout" in ours:
        options["visibility_timeout"] = positive_option(ours, "visibility_timeout", 0.0, url)
    transport = parts.scheme.lower()
    prefix = ours.get("prefix", "")
    if transport in CONNECTION_BOUND:
        options["confirm_publish"] = True  # publish returns once the broker has the message
    if transport in REDIS and prefix:  # kombu prefixes every key, its bookkeeping too
        options["global_keyprefix"], prefix = prefix, ""
    expires = positive_option(ours, "queue_expires", 0.0, url)
    hosts = one_url_per_host(parts._replace(query=urlsplit(rest).query), transport)
    return KombuSettings(url=";".join(hosts), transport=transport, prefix=prefix, hosts=hosts,
                         where=redact(url.split("?", 1)[0]),
                         retry_seconds=retry_seconds(ours, url),
                         transport_options=options,
                         queue_arguments={"x-expires": int(expires * 1000)} if expires else {})


def one_url_per_host(parts: SplitResult, transport: str) -> tuple[str, ...]:
    """kombu's URL for each node an AMQP URL names comma-separated (h1:5672,h2:5673): kombu
    fails over along a ';'-joined list of whole URLs, not along a host list."""
    login, at, hostlist = parts.netloc.rpartition("@")
    names = hostlist.split(",")
    if transport not in CONNECTION_BOUND or len(names) == 1:
        return (urlunsplit(parts),)
    if not all(name.strip() for name in names):
        raise ConfigError(f"kombu broker URL {redact(urlunsplit(parts))!r} names an empty "
                          "host: separate hosts with single commas, e.g. "
                          "kombu+amqp://u:p@h1:5672,h2:5672/vhost")
    return tuple(urlunsplit(parts._replace(netloc=f"{login}{at}{name.strip()}"))
                 for name in names)


def level_of(seconds: float) -> int:
    """The delay level that holds a message `seconds` from due."""
    return 0 if seconds < 2 else min(int(math.log2(seconds)), TOP_LEVEL)


def level_floor(level: int) -> float:
    """Remaining time below which a message leaves `level` for a lower one."""
    return 0.0 if level == 0 else float(2 ** level)


def kombu_priority(transport: str, priority: int) -> int | None:
    """The kombu message priority that puts `priority` in its band on `transport`; None
    where kombu has no priorities (see the module docstring)."""
    if transport in REDIS:
        return REDIS_STEP[band_of(priority)]
    if transport in CONNECTION_BOUND:
        return band_of(priority)
    return None


def priority_hint(exc: BaseException) -> str:
    """What to do when a queue made by an earlier version lacks x-max-priority."""
    if "x-max-priority" not in str(exc):
        return ""
    return (f"; this version declares a queue with x-max-priority {TOP_BAND} (priorities in "
            "bands): drain and delete the queue, which an earlier version made without it")


def describe_limits(transport: str, visibility_timeout: float) -> str:
    """The one line `conveyor worker` prints at start: what this transport cannot keep."""
    crash = ("a killed consumer's messages return at once, but a message redelivered after "
             "crashes counts as one extra delivery however often it crashed"
             if transport in CONNECTION_BOUND else
             f"a killed consumer's messages return only after the {visibility_timeout:g} s "
             "visibility timeout, and a task running longer than that is redelivered "
             "while it runs")
    priorities = ("priorities in four bands (0, 1-3, 4-6, 7+)"
                  if kombu_priority(transport, 0) is not None else "priorities are ignored")
    return (f"kombu+{transport}: {priorities}; {crash}; delays are polled "
            "delay levels (never early, up to max(1 s, a quarter of the delay) late); "
            "in-flight depth counts only this process's deliveries")
