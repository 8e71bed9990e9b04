"""What a Celery producer's `AsyncResult` sees of an outcome Celery has no state for."""

from __future__ import annotations

from conveyor.celery_intake.results import Outcomes
from conveyor.events import Event


def test_a_task_that_skipped_itself_is_a_success_with_none() -> None:
    """Celery has no skipped state: the document is SUCCESS with a None result, what
    `handle.result()` returns for a Conveyor producer."""
    outcomes = Outcomes(backend=None)  # type: ignore[arg-type]   # document() stores nothing
    event = Event(kind="skipped", message_id="m1", task="t.skip", attempt=1,
                  headers={"celery_id": "c1"}, reason="nothing to do")
    document = outcomes.document(event)
    assert document is not None
    assert (document["task_id"], document["status"], document["result"]) == ("c1", "SUCCESS",
                                                                              None)
