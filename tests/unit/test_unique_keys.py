"""How a task's enqueue names its unique key: per call, or the task's template or function."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import client as clients
from conveyor import limits
from conveyor.broker import from_url
from conveyor.client import Client
from conveyor.errors import ConfigError
from conveyor.flow import UNIQUE_HEADER
from conveyor.tasks import task


@task(name="u.invoice", unique_key="invoice:{invoice_id}")
def invoice(invoice_id: int, copy: int = 0) -> None:
    """Keyed by a template of its arguments."""


@task(name="u.report", unique_key=lambda day, **_: f"report:{day}", unique_for=60)
def report(day: str, fmt: str = "pdf") -> None:
    """Keyed by a function of its arguments, for a window."""


@task(name="u.plain")
def plain(a: int) -> None:
    """No key of its own."""


@pytest.fixture(autouse=True)
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    url = f"sqlite:///{tmp_path}/broker.db"
    made = Client(from_url(url), limiter=limits.from_url(url))
    monkeypatch.setattr(clients, "_default", made)
    yield made
    made.close()


def test_a_task_template_key_is_formatted_from_each_calls_arguments(client: Client) -> None:
    first, again, other = invoice.enqueue(42), invoice.enqueue(42, copy=1), invoice.enqueue(43)
    assert (again.duplicate, again.id, other.duplicate) == (True, first.id, False)
    assert first.message.headers[UNIQUE_HEADER] == "invoice:42"
    assert client.broker.depth("default").ready == 2


def test_a_task_key_function_and_window(client: Client) -> None:
    first = report.enqueue("2026-11-26")
    assert report.enqueue("2026-11-26", fmt="csv").id == first.id
    assert UNIQUE_HEADER not in first.message.headers  # a window: the worker gives nothing back


def test_enqueue_takes_unique_key_for_itself_and_it_wins_over_the_tasks(client: Client) -> None:
    first = plain.enqueue(1, unique_key="sum")
    again = plain.enqueue(2, unique_key="sum", unique_for=60)
    assert first.message.kwargs == {} and (again.duplicate, again.id) == (True, first.id)
    assert not invoice.enqueue(42, unique_key="mine").duplicate
    assert invoice.enqueue(42, unique_key="mine").duplicate


def test_a_template_naming_no_argument_is_refused_at_decoration() -> None:
    with pytest.raises(ConfigError, match="no argument 'order'"):
        task(name="u.bad", unique_key="order:{order}")(lambda invoice_id: None)


def test_a_negative_window_is_refused(client: Client) -> None:
    with pytest.raises(ConfigError, match="unique_for=-1"):
        plain.enqueue(1, unique_key="k", unique_for=-1)
