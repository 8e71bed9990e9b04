"""What the operator commands print: wrapped tables lose no word, bodies never reach a
terminal as binary or megabytes."""

from __future__ import annotations

import pytest

from conveyor.celery_intake.names import rejects_of
from conveyor.cli.output import wrapped_table
from conveyor.readers.deadletters import TEXT_PREVIEW, body_preview, hexdump

REASON = ("failed: ValueError('the partner API answered 422 Unprocessable Entity for invoice "
          "7731 because its currency field was empty') on its last attempt of 4")
ROWS = [{"id": "1", "queue": "billing", "reason": REASON}, {"id": "22", "queue": "q", "reason": ""}]


@pytest.mark.parametrize("width", [None, 200, 80, 40, 12])
def test_a_wrapped_table_keeps_every_word_in_order(width: int | None) -> None:
    out = wrapped_table(ROWS, ["id", "queue", "reason"], width)
    assert " ".join(REASON.split()) in " ".join(out.split())
    if width is None:
        assert REASON in out.splitlines()[1]
    elif width >= 40:
        assert max(len(line) for line in out.splitlines()) <= width, out


def test_hexdump_shows_offsets_bytes_and_printable_ascii() -> None:
    assert hexdump(b"AB\x00\xff" * 5) == [
        "  00000000  41 42 00 ff 41 42 00 ff 41 42 00 ff 41 42 00 ff  |AB..AB..AB..AB..|",
        "  00000010  41 42 00 ff                                      |AB..|"]


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"id": "m1", "task": "t"}', '"task": "t"'),
    ("résumé\n".encode(), "résumé"),
    (b"\x1b[2Jclear the screen", "not text"),
    (b"\x80\x04\x95pickle", "not text"),
    (b"x" * (TEXT_PREVIEW * 4), "the first 16,384 characters"),
])
def test_a_body_preview_is_text_or_hex_and_short(body: bytes, expected: str) -> None:
    shown = "\n".join(body_preview(body))
    assert expected in shown and len(shown) < TEXT_PREVIEW + 500
    assert all(c.isprintable() or c == "\n" for c in shown)


def test_only_intake_queues_bring_a_rejected_queue() -> None:
    assert rejects_of("celery.reports") == "celery.reports.rejected"
    assert rejects_of("celery.reports.rejected") is None
    assert rejects_of("default") is None


def test_took_is_never_negative() -> None:
    """An attempt that started after its end was recorded (a start after its timeout)."""
    from conveyor.cli.runs import _took
    from conveyor.readers.runs import took
    assert _took({"started_at": 10.0, "ended_at": 12.5}) == "2.500s"
    assert _took({"started_at": None, "ended_at": 12.5}) == ""
    assert _took({"started_at": 10.0, "ended_at": None}) == ""
    late = {"started_at": 43.0, "ended_at": 12.0}
    assert _took(late) == "started late" and took(late) is None   # the dashboard's too
