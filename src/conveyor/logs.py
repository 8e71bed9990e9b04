"""Logging for every daemon: one line per event, for people (`human`) or machines (`json`).

Lines about a task carry its ids. The supervisor writes them as `task=… id=… attempt=…
run=…` in the message (or passes them as `extra=`); the JSON format lifts them into fields
(`task`, `message_id`, `attempt`, `run_id`) so a log pipeline can filter on them.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

FORMATS = ("human", "json")
HUMAN = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: word in a log line -> field of a JSON log line
TASK_WORDS = {"task": "task", "id": "message_id", "attempt": "attempt", "run": "run_id"}
_PAIR = re.compile(r"(?<![\w.])(task|id|attempt|run)=(\S+)")


def log_format(text: str) -> str:
    """Check a --log-format value."""
    if text not in FORMATS:
        raise ValueError(f"must be one of {', '.join(FORMATS)}")
    return text


def task_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The task ids of a record: from `extra=` if given, else from its `key=value` words."""
    found = {field: getattr(record, field) for field in TASK_WORDS.values()
             if getattr(record, field, None) not in (None, "")}
    if not found:
        for word, value in _PAIR.findall(record.getMessage()):
            found.setdefault(TASK_WORDS[word], int(value) if value.isdigit() else value)
    return found


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the task's ids."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"at": round(record.created, 6), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage(),
                               **task_fields(record)}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup(level: str = "INFO", fmt: str = "human") -> None:
    """Send every log line to stderr in `fmt`; replaces handlers set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(HUMAN))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
