"""The revenue DAG's tasks, and the DAG itself (`build`).

    extract_orders ──► clean_orders ───┐
                                       ├──► aggregate_revenue ──► load_dashboard
    extract_payments ─► clean_payments ┘

Every task appends its name to a ledger file (a `ledger` keyword argument), so tests can
count side effects: a task recorded twice ran twice. `extract_payments` calls a flaky
partner API: it fails `fail_rate` of the time with a transient error, decided by
`random.Random(f"{seed}:{attempt}")` so a test can pick a seed that fails, then succeeds.
Workers import this module with `--app conveyor.scheduler.examples.revenue`.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from conveyor.scheduler.dag import DAG
from conveyor.tasks import task

TASKS = ("extract_orders", "extract_payments", "clean_orders", "clean_payments",
         "aggregate_revenue", "load_dashboard")


class PartnerUnavailable(Exception):
    """The partner API answered 503: transient, worth a retry."""


def record(ledger: str, name: str) -> int:
    """Append `name` to the ledger; return how many times it is there now (this attempt)."""
    if not ledger:
        return 1
    with open(ledger, "a+") as out:
        out.write(name + "\n")
        out.flush()
        out.seek(0)
        return sum(1 for line in out if line.strip() == name)


def payments_fail(seed: int, attempt: int, fail_rate: float) -> bool:
    """Whether `extract_payments` fails on `attempt` with this seed."""
    return random.Random(f"{seed}:{attempt}").random() < fail_rate


@task(name="revenue.extract_orders")
def extract_orders(ledger: str = "") -> int:
    record(ledger, "extract_orders")
    return 1200


@task(name="revenue.extract_payments")
def extract_payments(ledger: str = "", seed: int = 0, fail_rate: float = 0.4) -> int:
    attempt = record(ledger, "extract_payments")
    if payments_fail(seed, attempt, fail_rate):
        raise PartnerUnavailable(f"partner API answered 503 Service Unavailable "
                                 f"(attempt {attempt})")
    return 1180


@task(name="revenue.clean_orders")
def clean_orders(ledger: str = "", pause: float = 0.0) -> int:
    record(ledger, "clean_orders")
    time.sleep(pause)   # a slow transform, so a test can crash the scheduler meanwhile
    return 1190


@task(name="revenue.clean_payments")
def clean_payments(ledger: str = "") -> int:
    record(ledger, "clean_payments")
    return 1175


@task(name="revenue.aggregate_revenue")
def aggregate_revenue(ledger: str = "") -> float:
    record(ledger, "aggregate_revenue")
    return 48_210.5


@task(name="revenue.load_dashboard")
def load_dashboard(ledger: str = "") -> str:
    record(ledger, "load_dashboard")
    return "dashboard updated"


def build(dag_id: str = "revenue", *, ledger: str = "", seed: int = 0, fail_rate: float = 0.4,
          retry_delay: float = 0.05, pause: float = 0.0, **defaults: Any) -> DAG:
    """The revenue DAG; `extract_payments` gets three attempts with backoff and jitter."""
    dag = DAG(dag_id, **defaults)
    ledger_only = {"ledger": ledger}
    orders = dag.task(extract_orders, kwargs=ledger_only)
    payments = dag.task(extract_payments, retries=2, retry_delay=retry_delay,
                        kwargs={"ledger": ledger, "seed": seed, "fail_rate": fail_rate})
    clean_o = dag.task(clean_orders, kwargs={"ledger": ledger, "pause": pause})
    clean_p = dag.task(clean_payments, kwargs=ledger_only)
    aggregate = dag.task(aggregate_revenue, kwargs=ledger_only)
    load = dag.task(load_dashboard, kwargs=ledger_only)
    orders >> clean_o
    payments >> clean_p
    [clean_o, clean_p] >> aggregate >> load
    return dag


def ledger_counts(ledger: str) -> dict[str, int]:
    """How many times each task ran, from the ledger."""
    counts = dict.fromkeys(TASKS, 0)
    if os.path.exists(ledger):
        with open(ledger) as lines:
            for line in lines:
                counts[line.strip()] = counts.get(line.strip(), 0) + 1
    return counts
