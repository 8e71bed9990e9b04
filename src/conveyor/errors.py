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


class BrokerConnectionError(BrokerError):
    """The broker could not be reached; retryable (the transports retry with backoff)."""


class LeaseLost(BrokerError):
    """The delivery's lease expired and another consumer may own the message now.

    Raised by ack/retry/dead-letter/extend on a delivery this consumer no longer owns;
    the caller must not assume its outcome was recorded.
    """


class UnknownTask(ConveyorError):
    """A message names a task that no imported module registered."""
