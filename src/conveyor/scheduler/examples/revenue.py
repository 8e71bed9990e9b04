"""The revenue DAG's tasks, and the DAG itself (`build`).

    extract_orders ──► clean_orders ───┐
                                       ├──► aggregate_revenue ──► load_dashboard
    extract_payments ─► clean_payments ┘

Data flows down the DAG as return values: each extract writes a CSV file and returns
`{"rows": n, "path": file}`, each clean reads the file its upstream task returned (TaskFlow:
`dag.task(clean_orders, orders)`), `aggregate_revenue` sums both, and `load_dashboard`
reads the aggregate through `context.upstream("aggregate_revenue")`. Files go in the
ledger's folder (else the temp folder). Every task appends its name to a ledger file (a
`ledger` keyword argument), so tests can count side effects: a task recorded twice ran
twice. `extract_payments` calls a flaky
partner API: it fails `fail_rate` of the time with a transient error, decided by
`random.Random(f"{seed}:{attempt}")` so a test can pick a seed that fails, then succeeds
(the attempt is the ledger's count, or without a ledger the message's attempt).
Workers import this module with `--app conveyor.scheduler.examples.revenue`.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from typing import Any

from conveyor.context import context
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


def _attempt(recorded: int, ledger: str) -> int:
    """Which try this is: counted in the ledger when there is one (every run of the body,
    redeliveries included, which is what the crash tests need), else the attempt the
    message carries, so the DAG triggered by hand without a ledger fails once and then
    succeeds as it does under `conveyor up`."""
    return recorded if ledger else context.attempt


def payments_fail(seed: int, attempt: int, fail_rate: float) -> bool:
    """Whether `extract_payments` fails on `attempt` with this seed."""
    return random.Random(f"{seed}:{attempt}").random() < fail_rate


def workdir(ledger: str) -> str:
    """Where the tasks' files go: beside the ledger, else in the temp folder."""
    folder = os.path.dirname(ledger) if ledger else os.path.join(tempfile.gettempdir(),
                                                                  "conveyor-revenue")
    os.makedirs(folder, exist_ok=True)
    return folder


def write_rows(ledger: str, name: str, amounts: list[float]) -> dict[str, Any]:
    """Write `amounts` as a CSV file; what downstream tasks need: its row count and path."""
    path = os.path.join(workdir(ledger), f"{name}.csv")
    with open(path, "w") as out:
        out.writelines(f"{i},{amount:.2f}\n" for i, amount in enumerate(amounts))
    return {"rows": len(amounts), "path": path}


def read_amounts(extracted: dict[str, Any]) -> list[float]:
    with open(extracted["path"]) as lines:
        return [float(line.split(",")[1]) for line in lines]


@task(name="revenue.extract_orders")
def extract_orders(ledger: str = "") -> dict[str, Any]:
    record(ledger, "extract_orders")
    return write_rows(ledger, "orders", [40.0 + i % 7 for i in range(1200)])


@task(name="revenue.extract_payments")
def extract_payments(ledger: str = "", seed: int = 0, fail_rate: float = 0.4) -> dict[str, Any]:
    attempt = _attempt(record(ledger, "extract_payments"), ledger)
    print(f"asking the partner API for payments (attempt {attempt})", flush=True)
    if payments_fail(seed, attempt, fail_rate):
        raise PartnerUnavailable(f"partner API answered 503 Service Unavailable "
                                 f"(attempt {attempt})")
    return write_rows(ledger, "payments", [-2.5 if i % 40 == 0 else 39.0 for i in range(1180)])


@task(name="revenue.clean_orders")
def clean_orders(orders: dict[str, Any] | None = None, ledger: str = "",
                 pause: float = 0.0) -> dict[str, Any]:
    """Drop zero and negative amounts from the file `extract_orders` returned."""
    record(ledger, "clean_orders")
    time.sleep(pause)   # a slow transform, so a test can crash the scheduler meanwhile
    kept = [a for a in read_amounts(orders) if a > 0] if orders else []
    return write_rows(ledger, "orders-clean", kept)


@task(name="revenue.clean_payments")
def clean_payments(payments: dict[str, Any] | None = None, ledger: str = "") -> dict[str, Any]:
    """Refunds (negative amounts) out of the file `extract_payments` returned."""
    record(ledger, "clean_payments")
    kept = [a for a in read_amounts(payments) if a > 0] if payments else []
    return write_rows(ledger, "payments-clean", kept)


@task(name="revenue.aggregate_revenue")
def aggregate_revenue(orders: dict[str, Any] | None = None,
                      payments: dict[str, Any] | None = None,
                      ledger: str = "") -> dict[str, Any]:
    record(ledger, "aggregate_revenue")
    revenue = sum(read_amounts(orders)) if orders else 0.0
    return {"revenue": round(revenue, 2), "orders": orders["rows"] if orders else 0,
            "payments": payments["rows"] if payments else 0}


@task(name="revenue.load_dashboard")
def load_dashboard(ledger: str = "") -> str:
    """Reads its input explicitly, from the task context, instead of as an argument."""
    record(ledger, "load_dashboard")
    totals = context.upstream("aggregate_revenue")
    return f"dashboard updated: revenue {totals['revenue']:.2f} from {totals['orders']} orders"


def build(dag_id: str = "revenue", *, ledger: str = "", seed: int = 0, fail_rate: float = 0.4,
          retry_delay: float = 0.05, pause: float = 0.0, **defaults: Any) -> DAG:
    """The revenue DAG; `extract_payments` gets three attempts with backoff and jitter."""
    dag = DAG(dag_id, **defaults)
    ledger_only = {"ledger": ledger}
    orders = dag.task(extract_orders, kwargs=ledger_only)
    payments = dag.task(extract_payments, retries=2, retry_delay=retry_delay,
                        kwargs={"ledger": ledger, "seed": seed, "fail_rate": fail_rate})
    clean_o = dag.task(clean_orders, orders, kwargs={"ledger": ledger, "pause": pause})
    clean_p = dag.task(clean_payments, payments, kwargs=ledger_only)
    aggregate = dag.task(aggregate_revenue, clean_o, clean_p, kwargs=ledger_only)
    dag.task(load_dashboard, kwargs=ledger_only, upstream=[aggregate])
    return dag


def ledger_counts(ledger: str) -> dict[str, int]:
    """How many times each task ran, from the ledger."""
    counts = dict.fromkeys(TASKS, 0)
    if os.path.exists(ledger):
        with open(ledger) as lines:
            for line in lines:
                counts[line.strip()] = counts.get(line.strip(), 0) + 1
    return counts
