"""Task results: what a task returned (or how it failed for good), kept for whoever asks.

A result is stored when the message asks for one (the `result` header, which
`task.enqueue()` sets unless the task says `store_result=False`): the worker writes it
before it acks, first write wins, so a redelivered message never replaces the value a caller
may already have read. Messages that do not ask (raw `Client.enqueue` of a plain message,
shell commands without `--wait`, DAG tasks, whose run keeps their values) cost nothing.

One interface (`ResultStore`) over Redis keys with a TTL, and a table in the state store
(SQLite or Postgres); `from_url` picks by URL (`Settings.stores()` has the default per broker).
"""

from conveyor.results.base import RESULT_HEADER, ResultRecord, ResultStore, encode_value
from conveyor.results.handle import ResultHandle
from conveyor.results.stores import from_url

__all__ = ["RESULT_HEADER", "ResultHandle", "ResultRecord", "ResultStore", "encode_value",
           "from_url"]
