"""Follow-ups: work a task enqueues, published by its worker on the task's behalf.

A runner never holds the worker's broker URL or signing key (see isolation.py), so a client
inside a task cannot reach the broker its worker serves by itself: built from the scrubbed
environment it would publish to the task user's embedded SQLite file, where nothing ever
runs it. Instead, every runner installs a `TaskClient` as its default client (`task.enqueue`,
`default_client()`, `Client.from_settings` without a broker URL), and an enqueue inside a
task goes to the supervisor as one frame on the runner's channel:

    runner -> supervisor  {"op": "enqueue", "seq": N, "body": <the message, unsigned JSON>,
                           "delay": D, "keep_result": K}
    supervisor -> runner  {"op": "enqueued", "seq": N, "id": I, "headers": {...},
                           "not_before": T}
                       or {"op": "enqueued", "seq": N, "error": "...", "kind": "message" |
                           "broker" | "other"}

The supervisor's `Publisher` vets the body as it vets a delivery (the same strict decoding),
then publishes it as any producer would (`Client.enqueue`): signed with the worker's key,
with an `enqueue` span whose parent is the task's `run` span while tracing is on. It does
so on a broker connection of its own, opened on the first follow-up, in a thread of its own:
the supervisor's loop (time limits, heartbeats, settles) never waits for a follow-up's
publish, and a publish during an outage retries as any client's does, then raises in the
task. The task waits for the answer: `handle.id` is the published message's, and a failure
is an exception where the task called `enqueue`, never a silent loss.

The follow-up is published at once, before the task's outcome is known (as Celery does): a
task that fails after enqueueing and is retried enqueues again, so make follow-ups
idempotent, or enqueue them last. A `seq` per request lets a runner skip an answer to a
request it stopped waiting for (a soft time limit raised during the wait, then caught).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from conveyor.client import Client, use_inside_task
from conveyor.errors import BrokerError, ConveyorError, MessageError
from conveyor.message import Codec, Message
from conveyor.results.handle import ResultHandle
from conveyor.tracing import TRACEPARENT
from conveyor.worker import frames
from conveyor.worker.metrics import Metrics

if TYPE_CHECKING:
    from conveyor.broker import Producer, Publication
    from conveyor.limits import Limiter
    from conveyor.results.base import ResultStore

log = logging.getLogger("conveyor.worker")

#: Requests one runner may have queued at once: `enqueue` waits for each answer, so only a
#: task writing to its channel by hand has more, and it must not fill the worker's memory.
MAX_OUTSTANDING = 8
_ERRORS: dict[str, type[ConveyorError]] = {"message": MessageError, "broker": BrokerError}


# -- the runner's side ----------------------------------------------------------------------

class TaskClient(Client):
    """The default client inside a task: asks the worker to publish, over the runner's
    channel. It holds no broker (`broker` is absent) and no key: the worker signs."""

    def __init__(self, channel: socket.socket | None = None) -> None:
        """No broker: Client's __init__ is not called. Without `channel` (a lane builds it
        so, once: see `prepare`) it publishes nothing until `install` gives it one."""
        self._runner_channel = channel
        self.codec = Codec()  # unsigned: the supervisor decodes, then signs with its key
        self.settings = None
        self._results = None
        self._seq = 0

    def enqueue(self, message: Message, delay: float = 0.0, *, keep_result: bool = False,
                unique_key: str = "", unique_for: float = 0.0) -> ResultHandle:
        """Publish `message` through the worker: the worker's broker, signed by the worker,
        traced as a child of this task's run. Waits for the worker's answer; raises
        MessageError (refused as a delivery would be) or BrokerError (not published)."""
        from conveyor.context import ContextError, context
        try:
            parent = context.traceparent
        except ContextError:  # a worker_process_init hook: no task, no run span
            parent = ""
        if parent and TRACEPARENT not in message.headers:
            message = replace(message, headers={**message.headers, TRACEPARENT: parent})
        self._seq += 1
        try:
            frames.send(self.channel, {"op": "enqueue", "seq": self._seq, "delay": delay,
                                       "keep_result": keep_result,
                                       "unique_key": unique_key, "unique_for": unique_for,
                                       "body": self.codec.encode(message).decode()})
        except frames.FrameTooLarge as exc:
            raise MessageError(f"follow-up {message.id} for {message.label!r} is too large "
                               f"to hand to the worker: {exc}") from None
        answer = self._answer(self._seq)
        if "error" in answer:
            raise _ERRORS.get(answer.get("kind", ""), ConveyorError)(answer["error"])
        sent = replace(message, id=answer["id"], headers=answer["headers"],
                       not_before=answer["not_before"])
        return ResultHandle(sent, self.results, duplicate=bool(answer.get("duplicate")))

    @property
    def channel(self) -> socket.socket:
        if self._runner_channel is None:
            raise ConveyorError("this process is not a runner: there is no worker to hand "
                                "a follow-up to (enqueue from a task)")
        return self._runner_channel

    def _answer(self, seq: int) -> dict[str, Any]:
        while True:
            frame = frames.recv(self.channel)
            if frame is None:
                raise BrokerError("the worker went away before it published this task's "
                                  "follow-up")
            if frame.get("op") == "enqueued" and frame.get("seq") == seq:
                return frame
            # an answer to a request this task stopped waiting for: skipped

    def publication(self, message: Message, delay: float = 0.0) -> Publication:
        raise ConveyorError("inside a task there is no broker to publish a batch to: "
                            "call enqueue for each message (the worker publishes it)")

    def results(self) -> ResultStore:
        raise ConveyorError("a task cannot wait for another task's result: the result "
                            "store is the worker's, not the task's (enqueue a follow-up "
                            "that takes the value instead; handle.id is known)")

    def close(self) -> None:
        """Nothing to close: the channel is the runner's."""


#: The client a lane built (`prepare`); its runners inherit it and only set their channel.
_prepared: TaskClient | None = None


def prepare() -> None:
    """In a lane, once: build and install the runners' TaskClient, without a channel.

    Why: a runner is a fork of its lane, and every object it builds costs it the allocation
    plus copy-on-write faults (building the client and its codec was ~50 us of a fresh
    runner's time at load 19, twice what setting one attribute of an inherited one costs)."""
    global _prepared
    _prepared = TaskClient()
    use_inside_task(_prepared)


def install(channel: socket.socket) -> None:
    """In a runner, before any task code: tasks enqueue through the worker from now on."""
    if _prepared is None:   # not forked by a lane that prepared one
        use_inside_task(TaskClient(channel))
        return
    _prepared._runner_channel = channel   # the lane installed it: only the channel is the runner's


# -- the supervisor's side ------------------------------------------------------------------

class Publisher:
    """Publishes follow-ups for runners, on a broker connection of its own in a thread of
    its own (both started on the first follow-up; a worker whose tasks enqueue nothing
    opens neither)."""

    def __init__(self, open_broker: Callable[[], Producer], codec: Codec,
                 metrics: Metrics | None = None,
                 open_limiter: Callable[[], Limiter] | None = None) -> None:
        """`open_limiter`: the worker's flow-control store, opened on the first follow-up
        with a unique key (a task's enqueue holds keys where every producer does)."""
        self._open_broker = open_broker
        self._open_limiter = open_limiter
        self._codec = codec
        self._vetting = Codec(max_bytes=codec.max_bytes)  # unsigned, as a runner sends it
        self._metrics = metrics or Metrics()
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._outstanding: dict[socket.socket, int] = {}  # requests queued, per runner

    def submit(self, channel: socket.socket, frame: dict[str, Any], task: str | None) -> None:
        """A runner asks (called on the pool's watcher thread) for the task `task` (its log
        label; None: no task runs there): queued and answered by the publishing thread, or
        refused at once (never blocking the watcher)."""
        refusal = self._refusal(channel, frame, task)
        if refusal is not None:
            log.warning("refused a follow-up of %s: %s", task or "an idle runner", refusal)
            frames.send_nowait(channel, {"op": "enqueued", "seq": frame.get("seq"),
                                         "error": refusal, "kind": "other"})
            return
        with self._lock:
            self._outstanding[channel] = self._outstanding.get(channel, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="followups",
                                                daemon=True)
                self._thread.start()
        self._requests.put(_Request(channel, frame, task or ""))

    def _refusal(self, channel: socket.socket, frame: dict[str, Any],
                 task: str | None) -> str | None:
        if frame.get("op") != "enqueue":
            return f"unknown request {frame.get('op')!r} from a runner"
        if task is None:
            return ("enqueue in a worker_process_init hook: there is no task yet; "
                    "enqueue from the task itself")
        if self._outstanding.get(channel, 0) >= MAX_OUTSTANDING:
            return (f"{MAX_OUTSTANDING} enqueues of this task are still being published: "
                    "wait for each (as enqueue does) before sending more")
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Finish what was asked, then close the connection (a stopping worker's last step
        before its broker's)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._requests.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("follow-ups still being published after %.0fs; their tasks are told "
                        "the worker went away", timeout)

    def _serve(self) -> None:
        try:
            while (request := self._requests.get()) is not None:
                answer = self._publish(request)
                with self._lock:
                    left = self._outstanding.pop(request.channel, 1) - 1
                    if left:
                        self._outstanding[request.channel] = left
                # not sent if the runner is gone (killed, timed out: the follow-up still
                # went) or reads no answers (its buffer is full): never blocks this thread
                frames.send_nowait(request.channel, {"op": "enqueued",
                                                     "seq": request.frame.get("seq"), **answer})
        finally:
            if self._client is not None:
                self._client.close()  # its broker, and the keys' store if it opened it

    def _publish(self, request: _Request) -> dict[str, Any]:
        """Publish one follow-up: the answer for its runner. Counted per queue and outcome;
        a refusal or a failure is also logged, naming the task that asked."""
        frame, queue_name = request.frame, ""
        try:
            message = self._vetting.decode(str(frame["body"]).encode())
            queue_name = message.queue
            sent = self._connected().enqueue(
                message, float(frame.get("delay") or 0.0),
                keep_result=bool(frame.get("keep_result")),
                unique_key=str(frame.get("unique_key") or ""),
                unique_for=float(frame.get("unique_for") or 0.0))
        except (MessageError, KeyError, TypeError, ValueError) as exc:
            return self._failed(request, queue_name, "refused", "message",
                                f"follow-up refused: {exc}")
        except BrokerError as exc:
            return self._failed(request, queue_name, "failed", "broker",
                                f"the worker could not publish this follow-up: {exc}")
        except Exception as exc:  # noqa: BLE001 - any failure is the task's to see, not ours
            return self._failed(request, queue_name, "failed", "other",
                                f"the worker could not publish this follow-up: "
                                f"{type(exc).__name__}: {exc}")
        self._metrics.follow_up(queue_name, "published")
        return {"id": sent.id, "headers": dict(sent.message.headers),
                "not_before": sent.message.not_before, "duplicate": sent.duplicate}

    def _failed(self, request: _Request, queue_name: str, outcome: str, kind: str,
                error: str) -> dict[str, Any]:
        self._metrics.follow_up(queue_name, outcome)
        log.warning("%s: %s", request.task, error)
        return {"error": error, "kind": kind}

    def _connected(self) -> Client:
        if self._client is None:
            self._client = Client(self._open_broker(), self._codec,
                                  open_limiter=self._open_limiter)
        return self._client


@dataclass(frozen=True)
class _Request:
    channel: socket.socket
    frame: dict[str, Any]
    task: str  # the log label of the task that asked


__all__: Sequence[str] = ["Publisher", "TaskClient", "install", "prepare"]
