"""Result records, the size cap, the default store per broker, and the worker's keeper."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor import results
from conveyor.config import Settings
from conveyor.errors import (
    Cancelled,
    ConfigError,
    DeadLettered,
    MessageError,
    ResultError,
    TaskFailed,
)
from conveyor.message import Message
from conveyor.results import ResultRecord
from conveyor.worker.outcome import Action, Outcome
from conveyor.worker.results import ResultKeeper, final_record, wanted

ERROR = {"type": "ValueError", "message": "bad day", "traceback": "Traceback\n  ValueError"}


def test_a_success_unwraps_to_its_value() -> None:
    record = ResultRecord.decode(ResultRecord("succeeded", value=[1, {"a": None}]).encode())
    assert record.unwrap("m") == [1, {"a": None}]


def test_a_failure_unwraps_to_task_failed_with_the_remote_traceback() -> None:
    with pytest.raises(TaskFailed) as caught:
        ResultRecord("failed", error=ERROR, reason="failed: bad day (budget spent)",
                      task="t.x").unwrap("m1")
    text = str(caught.value)
    assert text.startswith("task t.x (m1) failed: ValueError: bad day")
    assert "remote traceback:\nTraceback\n  ValueError" in text
    assert caught.value.error_type == "ValueError"
    assert not isinstance(caught.value, DeadLettered)


def test_a_quarantine_unwraps_to_dead_lettered_with_its_reason() -> None:
    with pytest.raises(DeadLettered, match=r"dead-lettered: unknown task 't.y'"):
        ResultRecord("dead_lettered", reason="unknown task 't.y'", task="t.y").unwrap("m")


def test_a_cancel_unwraps_to_cancelled_not_a_failure() -> None:
    record = ResultRecord.decode(ResultRecord("cancelled", reason="cancelled while running",
                                              task="t.z").encode())
    with pytest.raises(Cancelled, match=r"t.z \(m\) was cancelled: cancelled while running"):
        record.unwrap("m")
    assert not issubclass(Cancelled, TaskFailed)


def test_a_record_that_is_not_one_is_a_message_error() -> None:
    with pytest.raises(MessageError, match="malformed result record"):
        ResultRecord.decode(b'{"v": 1, "status": "maybe"}')


def test_the_cap_counts_encoded_bytes_and_never_truncates() -> None:
    results.encode_value("x" * 90, 92)
    with pytest.raises(ResultError, match="is 94 bytes, over the 92-byte cap"):
        results.encode_value("x" * 92, 92)


@pytest.mark.parametrize(("settings", "expected"), [
    (Settings(broker_url="redis://h:6379/0?prefix=p"), "redis://h:6379/0?prefix=p"),
    (Settings(broker_url="sqlite:///srv/q/broker.db"), "sqlite:///srv/q/results.db"),
    (Settings(broker_url="postgresql://u@h/db?schema=s&ack_commit=sync"),
     "postgresql://u@h/db?schema=s"),
    (Settings(broker_url="amqp://g@h//", state_url="postgresql://u@h/state"),
     "postgresql://u@h/state"),
    (Settings(broker_url="redis://h", result_url="sqlite:///r.db"), "sqlite:///r.db"),
])
def test_the_default_store_follows_the_broker(settings: Settings, expected: str) -> None:
    assert settings.stores().results == expected


def test_an_unknown_result_url_is_one_line() -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'amqp'.*CONVEYOR_RESULT_URL"):
        results.from_url("amqp://guest:pw@h//")


def test_result_settings_come_from_the_environment() -> None:
    s = Settings.from_env({"CONVEYOR_RESULT_TTL": "3600", "CONVEYOR_RESULT_MAX_BYTES": "2KiB"})
    assert (s.result_ttl, s.result_max_bytes) == (3600.0, 2048)
    with pytest.raises(ConfigError, match="CONVEYOR_RESULT_TTL='soon'.*number of seconds"):
        Settings.from_env({"CONVEYOR_RESULT_TTL": "soon"})


def test_only_messages_that_ask_are_kept() -> None:
    assert wanted(Message(queue="q", task="t", headers={"result": "keep"}))
    assert not wanted(Message(queue="q", task="t"))
    assert not wanted(Message(queue="q", task="t", headers={"result": "keep",
                                                            "settle": "report"}))


@pytest.mark.parametrize(("outcome", "action", "status"), [
    (Outcome("succeeded", result=5), Action("ack"), "succeeded"),
    (Outcome("failed", error=ERROR), Action("retry", 1.0), None),
    (Outcome("failed", error=ERROR), Action("dead_letter", reason="spent"), "failed"),
    (Outcome("oom_killed", reason="cap"), Action("dead_letter", reason="spent"), "dead_lettered"),
    (Outcome("interrupted"), Action("requeue"), None),
    (Outcome("cancelled", reason="cancelled while running"), Action("ack"), "cancelled"),
])
def test_only_final_outcomes_make_a_record(outcome: Outcome, action: Action,
                                           status: str | None) -> None:
    record = final_record(Message(queue="q", task="t"), outcome, action)
    assert (record.status if record else None) == status


def test_the_keeper_fails_an_oversized_success_and_stores_before_settling(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/results.db"
    keeper = ResultKeeper(lambda: results.from_url(url), ttl=60, max_bytes=10)
    big = keeper.check(Outcome("succeeded", result="x" * 20))
    assert big.kind == "failed" and big.error["type"] == "ResultTooLarge"
    message = Message(queue="q", task="t", headers={"result": "keep"})
    ok = keeper.check(Outcome("succeeded", result=7))
    assert keeper.keep(message, ok, Action("ack")) == Action("ack")
    keeper.close()
    with results.from_url(url) as store:
        got = store.get(message.id)
        assert got is not None and got.value == 7


def test_a_keeper_that_cannot_store_requeues_instead_of_acking(tmp_path: Path) -> None:
    def unreachable() -> results.ResultStore:
        return results.from_url("postgresql://nobody@127.0.0.1:1/none")

    keeper = ResultKeeper(unreachable, ttl=60, max_bytes=100)
    message = Message(queue="q", task="t", headers={"result": "keep"})
    action = keeper.keep(message, Outcome("succeeded", result=1), Action("ack"))
    assert action.verb == "requeue" and "result not stored" in action.reason


def test_a_skip_is_recorded_skipped_and_its_result_is_none() -> None:
    from conveyor.message import Message
    from conveyor.worker.outcome import Action, Outcome
    from conveyor.worker.results import final_record

    message = Message(queue="q", task="t.skip")
    record = final_record(message, Outcome("skipped", reason="nothing new"), Action("ack"))
    assert record is not None and record.status == "skipped" and record.reason == "nothing new"
    assert ResultRecord.decode(record.encode()).unwrap("m") is None
