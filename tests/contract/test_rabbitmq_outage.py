"""RabbitMQ outages a shared server cannot stage: connections cut during the handshake.

A node that is stopping or starting accepts a TCP connection, sends `Connection.Start` and
drops it; pika reports that as a *probable* authentication error. A relay between client and
the shared server plays such a node (the server itself is never touched): a consumer and a
publisher that meet it while reconnecting must retry, and only RabbitMQ's own refusal of a
login at the first connect may stop them with the login message.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from conveyor.broker.rabbitmq import RabbitMQBroker
from conveyor.broker.rabbitmq.bands import bands_high_first
from conveyor.client import Client
from conveyor.errors import BrokerConnectionError, BrokerError
from conveyor.message import Message
from tests.conftest import RABBITMQ_URL, require_service
from tests.integration.workerkit import finish, start_worker, stop, task_message
from tests.support import free_port


class HandshakeRelay:
    """A TCP relay to the shared RabbitMQ. In `handshake` mode a new connection gets the
    server's Connection.Start and is then closed, as by a node going down; `drop_all()` cuts
    the connections being relayed."""

    def __init__(self) -> None:
        self.mode = "pass"
        self.handshake_closes = 0
        self.connections = 0  # relayed in "pass" mode
        self._live: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F" + (f"?{query}" if query else "")

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", 5672))
        if self.mode == "handshake":
            upstream.sendall(client.recv(8))  # the protocol header
            client.sendall(upstream.recv(65536))  # Connection.Start
            time.sleep(0.05)  # let the client answer (StartOk), then vanish
            for sock in (client, upstream):
                sock.close()
            with self._lock:
                self.handshake_closes += 1
            return
        with self._lock:
            self._live += [client, upstream]
            self.connections += 1
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def drop_all(self) -> None:
        with self._lock:
            doomed, self._live = self._live, []
        for sock in doomed:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._listener.close()
        self.drop_all()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def relay() -> Iterator[HandshakeRelay]:
    require_service("rabbitmq")
    relay = HandshakeRelay()
    yield relay
    relay.close()


@pytest.fixture
def queue(unique: str) -> Iterator[str]:
    name = f"hs-{unique}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    try:
        channel = connection.channel()
        for member in (*bands_high_first(name), f"{name}.dead"):
            channel.queue_delete(member)
    finally:
        connection.close()


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def one_line_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged: every record one line, no traceback, nothing from pika itself."""
    assert not [r for r in caplog.records if r.name.startswith("pika")]
    lines = [r.getMessage() for r in caplog.records]
    assert all("\n" not in line and not r.exc_info for line, r in zip(lines, caplog.records,
                                                                     strict=True))
    return lines


def test_a_consumer_reconnecting_through_handshake_closes_keeps_consuming(
        relay: HandshakeRelay, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    consumer = RabbitMQBroker(relay.url())
    producer = RabbitMQBroker(RABBITMQ_URL)
    try:
        steps = consumer.consume([queue], timeout=0.2)
        assert next(steps) is None
        relay.mode = "handshake"
        relay.drop_all()
        while relay.handshake_closes < 3:  # the consumer meets a node going down, thrice
            assert next(steps) is None
        relay.mode = "pass"
        producer.publish(queue, b"after the restart")
        deadline = time.monotonic() + 20
        delivery = next(steps)
        while delivery is None and time.monotonic() < deadline:
            delivery = next(steps)
        assert delivery is not None and delivery.body == b"after the restart"
        consumer.ack(delivery)
    finally:
        consumer.close()
        producer.close()
    lines = one_line_records(caplog)
    assert not any("refused the login" in line for line in lines)
    assert sum("conveyor" in r.name for r in caplog.records) <= 3 + 2 * relay.handshake_closes


def test_a_new_client_retries_handshake_closes_then_publishes(
        relay: HandshakeRelay, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    def node_back_after(closes: int) -> threading.Thread:
        """The node is back once `closes` more connections were cut mid-handshake."""
        relay.mode, target = "handshake", relay.handshake_closes + closes

        def back() -> None:
            wait_for(lambda: relay.handshake_closes >= target, 20, f"{closes} closes")
            relay.mode = "pass"
        thread = threading.Thread(target=back)
        thread.start()
        return thread

    returning = node_back_after(2)
    broker = RabbitMQBroker(relay.url(retry_seconds="30"))  # a fresh publisher: retries
    returning.join()
    client = Client(broker)
    try:
        client.enqueue(Message(queue=queue, task="t.noop"))
        returning = node_back_after(2)  # an existing publisher meets the same: it retries too
        relay.drop_all()
        client.enqueue(Message(queue=queue, task="t.noop"))
        returning.join()
        assert broker.depth(queue).ready == 2
    finally:
        broker.close()
    assert not any("refused the login" in line for line in one_line_records(caplog))


def test_a_publisher_that_never_gets_past_the_handshake_says_how_long_it_tried(
        relay: HandshakeRelay) -> None:
    relay.mode = "handshake"
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError,
                       match=r"stayed unreachable for 1\.\d s .*retry_seconds=1") as caught:
        RabbitMQBroker(relay.url(retry_seconds="1"))
    assert "refused the login" not in str(caught.value)
    assert time.monotonic() - started < 10


def test_a_wrong_password_stops_at_the_first_connect_with_the_login_message() -> None:
    require_service("rabbitmq")
    started = time.monotonic()
    with pytest.raises(BrokerError, match="refused the login .* check the user, password"):
        RabbitMQBroker(RABBITMQ_URL.replace("guest:guest@", "guest:wrong@", 1))
    assert time.monotonic() - started < 10


def test_a_worker_facing_an_unreachable_rabbitmq_says_one_line_per_attempt() -> None:
    """Issue 14: it used to print ~170 lines with 13 pika tracebacks before the clear line."""
    # nothing listens there, and no other test is handed it meanwhile
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F?retry_seconds=2"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    done = subprocess.run([sys.executable, "-m", "conveyor.cli", "worker", "-b", url,
                           "-Q", "x", "-c", "1"], capture_output=True, text=True, timeout=60,
                          env=env)
    lines = done.stderr.splitlines() + done.stdout.splitlines()
    attempts = [line for line in lines if "attempt" in line and "reconnecting in" in line]
    assert done.returncode == 1, done.stderr  # runtime: the broker stayed away
    assert "Traceback" not in done.stderr and "pika" not in done.stderr.replace(
        "pika.", ""), done.stderr
    assert lines[-1].startswith("conveyor: connecting: RabbitMQ at") and \
        "stayed unreachable for 2.0 s" in lines[-1] and "ConnectionRefusedError" in lines[-1]
    assert len(lines) <= len(attempts) + 4, lines  # start-up lines, attempts, the error


def test_a_worker_process_reconnecting_through_handshake_closes_stays_up(
        relay: HandshakeRelay, queue: str, tmp_path: Path) -> None:
    """The issue's reproduction: `conveyor worker` behind a node that keeps closing new
    connections right after Connection.Start exited 64 ms later; now it keeps its pid and
    runs what is published once the node is back."""
    log = tmp_path / "record.log"
    worker = start_worker(relay.url(), queue, burst=False)
    try:
        wait_for(lambda: relay.connections >= 1, 30, "the worker's connection")
        time.sleep(1)  # let it subscribe
        relay.mode = "handshake"
        relay.drop_all()
        wait_for(lambda: relay.handshake_closes >= 3, 30, "three handshake closes")
        assert worker.poll() is None, finish(worker)
        relay.mode = "pass"
        producer = RabbitMQBroker(RABBITMQ_URL)
        Client(producer).enqueue(task_message("t.record", queue, str(log), "after"))
        producer.close()
        wait_for(lambda: log.exists() and "done after" in log.read_text(), 30, "the task")
        assert worker.poll() is None
    finally:
        stop(worker)
        out = finish(worker, timeout=60)
    assert worker.returncode == 0 and "refused the login" not in out, out
    assert "Traceback" not in out, out
