"""One error tree for the whole package.

Every message says what went wrong, where, and what to do: these strings reach people at
3 a.m. through logs and dead-letter reasons.
"""


class ConveyorError(Exception):
    """Base of every error Conveyor raises on purpose."""


class ConfigError(ConveyorError):
    """A setting is missing or has a value that is not allowed; raised at start."""


class MessageError(ConveyorError):
    """A message body cannot be trusted: malformed, oversized, wrong version, bad signature.

    The worker dead-letters the message with ``str(error)`` as the reason and keeps going.
    """


class BrokerError(ConveyorError):
    """A broker operation failed for a reason that retrying will not fix."""


class Refused(BrokerError):
    """A server answered the first contact with a no that retrying cannot change: a login
    refused, a database or role that does not exist, another kind of server on that port.
    The URL needs fixing (exit 2, like any bad setting), whichever server it names: broker,
    limits store or state store (`conveyor.refusals` words it)."""


class BrokerConnectionError(BrokerError):
    """The broker could not be reached; retryable (the transports retry with backoff)."""


class LeaseLost(BrokerError):
    """The delivery's lease expired and another consumer may own the message now.

    Raised by ack/retry/dead-letter/extend on a delivery this consumer no longer owns;
    the caller must not assume its outcome was recorded.
    """


class StateStoreUnavailable(ConveyorError):
    """The state store (SQLite file or Postgres) could not be reached: an outage, not a typo."""


class StateStoreLost(StateStoreUnavailable):
    """The state store's session was lost while in use (Postgres went away or failed over):
    the transaction in progress was rolled back, or its commit's outcome is unknown. The next
    use opens a new session (on the primary of the moment); a caller whose steps are
    idempotent runs the step again."""


class UnknownTask(ConveyorError):
    """A message names a task that no imported module registered."""


class ResultError(ConveyorError):
    """A task's result cannot be given: not stored, too large, or not there yet."""


class ResultTimeout(ResultError):
    """`handle.result(timeout=...)` passed its timeout while the task was queued or running."""


class Cancelled(ConveyorError):
    """The task was cancelled (`Client.cancel`, `conveyor tasks cancel`).

    Raised inside a running task when its cancel reaches it: catch it to clean up (the
    runner is killed `--cancel-grace` seconds later whatever it does). Raised by
    `handle.result()` for a task that was cancelled, whether it had started or not.
    """


class TaskFailed(ResultError):
    """The task failed for good; carries the remote failure so the caller can read it.

    `error_type` and `error_message` are the exception the task raised in its worker,
    `remote_traceback` its traceback as text (the exception itself never crosses processes:
    results are JSON), `reason` what the worker decided (e.g. the retry budget was spent).
    """

    def __init__(self, message: str, *, error_type: str = "", error_message: str = "",
                 remote_traceback: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error_message = error_message
        self.remote_traceback = remote_traceback
        self.reason = reason


class DeadLettered(TaskFailed):
    """The message was quarantined (bad input, unknown task, crash loop, budget spent)."""


def one_line(exc: BaseException | None) -> str:
    """`Type: first line of the message`, for a log line or an error."""
    if exc is None:
        return "no error"
    text = str(exc).strip().splitlines()
    if not text and exc.args:  # pika's connection errors wrap the cause and print nothing
        text = (str(exc.args[0]).strip() or repr(exc.args[0])).splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class NotConfirmed(BrokerError):
    """A write reached the primary but not the replicas the URL's durable mode asks for
    (`?wait_replicas=`) within `?wait_timeout_ms=`: should the primary fail now, it may be
    lost. A publish raises it: publish again (a duplicate is possible, a loss is not)."""
