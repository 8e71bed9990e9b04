"""What the daemons record for `conveyor status` and the dashboard: workers' heartbeats,
schedulers' leases, queue depth samples, and the autoscaler's evaluations and changes; and
task results kept in the state store. Typed over named queries, like `state/runs.py`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.state.records import QueueSample, Scaler, Scaling, SchedulerLease, WorkerRecord
from conveyor.state.store import Repository


class Workers(Repository):
    """The worker registry: one row per live worker, upserted every heartbeat."""

    def all(self) -> list[WorkerRecord]:
        """By host, then pid."""
        return [WorkerRecord.from_row(row) for row in self.store.rows("workers")]

    def beat(self, *, worker_id: str, hostname: str, pid: int, queues: str, concurrency: int,
             interval: float, started_at: float, busy: int, now: float,
             runners: str | None, code_version: str = "") -> None:
        """Upsert a worker's row; `runners` is JSON text (see `WorkerRecord.runners`)."""
        self.store.exec("upsert_worker", worker_id=worker_id, hostname=hostname, pid=pid,
                        queues=queues, concurrency=concurrency, interval=interval,
                        started_at=started_at, busy=busy, now=now, runners=runners,
                        code_version=code_version or None)

    def live_versions(self, now: float) -> dict[str, set[str]]:
        """Code version -> the queues its live (not stale) workers serve: where a pinned
        run's tasks can go (scheduler/pinning.py)."""
        served: dict[str, set[str]] = {}
        for worker in self.all():
            if worker.code_version and not worker.stale(now):
                served.setdefault(worker.code_version, set()).update(worker.queues.split(","))
        return served

    def newest_version(self, now: float, queues: Sequence[str]) -> str | None:
        """The code version of the live worker started last among those serving one of
        `queues` (None: no live worker of them announces one)."""
        live = [w for w in self.all() if w.code_version and not w.stale(now)
                and set(w.queues.split(",")) & set(queues)]
        return max(live, key=lambda w: w.started_at).code_version if live else None

    def forget_silent(self, now: float, older_than: float) -> None:
        """Rows of workers silent for longer than `older_than` seconds (crashed long ago)."""
        self.store.exec("forget_workers", now=now, older_than=older_than)

    def delete(self, worker_id: str) -> None:
        self.store.exec("delete_worker", worker_id=worker_id)


class Schedulers(Repository):
    """Each live scheduler's lease, renewed while it runs."""

    def all(self) -> list[SchedulerLease]:
        """Oldest first."""
        return [SchedulerLease.from_row(row) for row in self.store.rows("schedulers")]

    def renew(self, *, scheduler: str, hostname: str, pid: int, now: float,
              lease: float) -> None:
        self.store.exec("renew_scheduler", scheduler=scheduler, hostname=hostname, pid=pid,
                        now=now, lease=lease)

    def forget_lapsed(self, now: float, older_than: float) -> None:
        """Rows of schedulers whose lease lapsed `older_than` seconds ago (killed)."""
        self.store.exec("forget_lapsed_schedulers", now=now, older_than=older_than)

    def forget(self, scheduler: str) -> None:
        self.store.exec("forget_scheduler", scheduler=scheduler)


class QueueSamples(Repository):
    """Queue depth sampled by the schedulers, one row per queue per sampling period."""

    def since(self, since: float) -> list[QueueSample]:
        """By queue, then time."""
        return [QueueSample.from_row(row)
                for row in self.store.rows("queue_samples", since=since)]

    def insert(self, *, at: float, queue: str, ready: int, in_flight: int, delayed: int,
               dead: int, succeeded: int | None, failed: int | None) -> None:
        """One sample; a second one for the same period and queue is ignored."""
        self.store.exec("insert_queue_sample", at=at, queue=queue, ready=ready,
                        in_flight=in_flight, delayed=delayed, dead=dead, succeeded=succeeded,
                        failed=failed)

    def forget(self, before: float) -> None:
        self.store.exec("forget_queue_samples", before=before)


class Scalers(Repository):
    """Each autoscaler target's last evaluation, and the replica changes made."""

    def all(self) -> list[Scaler]:
        return [Scaler.from_row(row) for row in self.store.rows("scalers")]

    def recent_scalings(self, limit: int) -> list[Scaling]:
        """Newest first."""
        return [Scaling.from_row(row)
                for row in self.store.rows("recent_scalings", limit=limit)]

    def evaluated(self, evaluation: dict[str, Any], now: float) -> None:
        """Upsert a target's evaluation (the `Evaluation` fields, as a dict)."""
        self.store.exec("upsert_scaler", **evaluation, now=now)

    def scaled(self, *, target: str, from_replicas: int, to_replicas: int, reason: str,
               now: float) -> None:
        self.store.exec("insert_scaling", target=target, from_replicas=from_replicas,
                        to_replicas=to_replicas, reason=reason, now=now)

    def forget_scalings(self, before: float) -> None:
        self.store.exec("forget_scalings", before=before)


class Results(Repository):
    """Task results (`handle.result()`): one final record per message until it expires."""

    def put(self, *, message_id: str, record: str, now: float, ttl: float,
            channel: str) -> bool:
        """Store `record` unless a live one is there (first write wins); on Postgres, notify
        `channel` in the same statement. Whether it was stored."""
        return bool(self.store.rows("put_result", message_id=message_id, record=record,
                                    now=now, ttl=ttl, channel=channel))

    def get(self, message_id: str, now: float) -> str | None:
        row = self.store.one("get_result", message_id=message_id, now=now)
        return None if row is None else str(row["record"])

    def forget_expired(self, now: float) -> None:
        self.store.exec("forget_expired_results", now=now)
