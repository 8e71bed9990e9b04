"""What `conveyor worker` was told: its flags as one frozen record (see worker/cli.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

#: RabbitMQ deliveries a worker may hold beyond its slots by default (`--read-ahead`). On a
#: quorum queue the next push comes 1-1.3 ms after an ack (a Raft commit) and in bursts, so
#: a supervisor starting a short task every ~0.5 ms needs several at hand; with 1 its slots
#: waited for the broker 40% of the time (3 messages in flight), with 8 about 4%.
READ_AHEAD = 8


@dataclass(frozen=True)
class WorkerConfig:
    """Everything `conveyor worker` was told; see `conveyor.worker.cli` for the flags."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 2
    apps: tuple[str, ...] = ()
    memory_limit: int = 0
    max_tasks_per_child: int = 1
    read_ahead: int = READ_AHEAD  # see Broker.consume(ahead=...): RabbitMQ and Postgres
    time_limit: float = 0.0
    soft_time_limit: float = 0.0
    soft_grace: float = 10.0
    cancel_grace: float = 10.0  # a cancelled run's time to clean up before SIGKILL
    uid: int | None = None
    gid: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    #: what this worker announces (worker/code_version.py); it also serves `<queue>@<it>`
    code_version: str = ""
    heartbeat_interval: float = 10.0
    drain_timeout: float = 30.0
    burst: bool = False
    metrics_port: int = 0
    max_retries: int = 3
    max_deliveries: int = 20
    exit_after_outage: float = 0.0  # seconds the broker may stay away; 0: ride out any outage
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
