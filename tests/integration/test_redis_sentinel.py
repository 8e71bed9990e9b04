"""redis+sentinel:// everywhere a Redis URL is taken (broker, results, limiter, control
channel), the errors when no Sentinel answers or the master name is unknown, and the durable
mode's WAIT, against a Sentinel deployment of the module's own (sentinel_servers.py). The
failover itself is test_sentinel_failover.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from conveyor import limits, redis_clients, results
from conveyor.broker import Publication, from_url
from conveyor.broker.redis import RedisBroker
from conveyor.control.for_broker import for_broker
from conveyor.errors import BrokerConnectionError, ConfigError, NotConfirmed, Refused
from conveyor.locations import store_urls
from conveyor.results import ResultRecord
from tests.integration.sentinel_servers import MASTER, SentinelCluster, deployment
from tests.support import free_port, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("redis-sentinel")]


@pytest.fixture(scope="module")
def sentinel_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    yield from deployment(tmp_path_factory)


@pytest.fixture
def url(sentinel_cluster: SentinelCluster, unique: str) -> Iterator[str]:
    yield f"{sentinel_cluster.url}?prefix={unique}"
    with sentinel_cluster.primary().client() as c:
        for key in c.scan_iter(match=f"{unique}:*", count=1000):
            c.delete(key)


def test_every_store_opens_on_a_sentinel_url(url: str, unique: str) -> None:
    stores = store_urls(url)
    assert stores.results == url and stores.limits == url
    with from_url(url) as broker:
        assert isinstance(broker, RedisBroker)
        broker.publish(unique, b"hello")
        delivery = next(d for d in broker.consume([unique], timeout=5) if d is not None)
        assert delivery.body == b"hello"
        broker.ack(delivery)
    store = results.from_url(stores.results)
    try:
        record = ResultRecord(status="succeeded", value=42, finished_at=time.time())
        assert store.put("m1", record, ttl=60)
        got = store.get("m1")
        assert got is not None and got.value == 42
    finally:
        store.close()
    limits.from_url(stores.limits)   # opens (its first contact is a PING)
    channel = for_broker(url, lambda: limits.from_url(stores.limits))
    subscription = channel.subscribe()
    try:
        channel.announce("cancel-me")
        heard = wait_for(lambda: subscription.next(0.5), 10, "the announcement")
        assert heard == ["cancel-me"]
    finally:
        subscription.close()
        channel.close()


def test_the_client_lands_on_the_master_not_a_sentinel(sentinel_cluster: SentinelCluster,
                                                       url: str) -> None:
    client = redis_clients.connect(url)
    try:
        assert client.info("server")["tcp_port"] == sentinel_cluster.master_port()
        assert client.info("replication")["role"] == "master"
    finally:
        client.close()


def test_an_unknown_master_name_is_said_at_once(sentinel_cluster: SentinelCluster) -> None:
    wrong = sentinel_cluster.url.replace(f"/{MASTER}/", "/nosuchmaster/")
    started = time.monotonic()
    with pytest.raises(Refused) as caught:
        from_url(wrong)
    assert time.monotonic() - started < 30   # not the 60 s retry budget
    message = str(caught.value)
    assert "'nosuchmaster'" in message and MASTER in message and "master name" in message


def test_no_sentinel_answering_names_them(sentinel_cluster: SentinelCluster) -> None:
    dead = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{MASTER}/0"
    with pytest.raises(BrokerConnectionError) as caught:
        from_url(f"{dead}?retry_seconds=1")
    assert "no Sentinel answered" in str(caught.value)


@pytest.mark.parametrize("bad", ["redis+sentinel:///mymaster/0",
                                 "redis+sentinel://127.0.0.1:26379/",
                                 "redis+sentinel://127.0.0.1:26379/m/x",
                                 "redis+sentinel://127.0.0.1:notaport/m/0",
                                 "redis+sentinel://127.0.0.1:26379/m/0?wait_replicas=0",
                                 "redis+sentinel://127.0.0.1:26379/m/0?wait_timeout_ms=5",
                                 "redis://127.0.0.1:6379/0?wait_replicas=1&wait_timeout_ms=0"])
def test_a_malformed_url_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError):
        redis_clients.durable(bad)
        if bad.startswith("redis+sentinel"):
            redis_clients.parse_sentinel(bad)


def test_durable_publish_and_ack_wait_for_the_replica(url: str, unique: str) -> None:
    with from_url(f"{url}&wait_replicas=1&wait_timeout_ms=5000") as broker:
        broker.publish(unique, b"kept")
        delivery = next(d for d in broker.consume([unique], timeout=5) if d is not None)
        broker.ack(delivery)
        assert broker.depth(unique).ready == 0


def test_a_publish_the_replicas_do_not_confirm_raises(url: str, unique: str) -> None:
    """Two replicas asked of a deployment that has one: the WAIT times out."""
    with from_url(f"{url}&wait_replicas=2&wait_timeout_ms=50") as broker:
        with pytest.raises(NotConfirmed) as caught:
            broker.publish(unique, b"maybe")
        assert "1 of the 2 replica(s)" in str(caught.value)
        assert "publish again" in str(caught.value)
        with pytest.raises(NotConfirmed):
            broker.publish_many([Publication(unique, b"again")])
        assert broker.depth(unique).ready == 2   # on the primary, only not confirmed


def test_a_durable_result_waits_for_the_replica(url: str) -> None:
    record = ResultRecord(status="succeeded", value=1, finished_at=time.time())
    store = results.from_url(f"{url}&wait_replicas=1&wait_timeout_ms=5000")
    try:
        assert store.put("kept", record, ttl=60)
        assert not store.put("kept", record, ttl=60)   # first write wins, as ever
    finally:
        store.close()
    store = results.from_url(f"{url}&wait_replicas=2&wait_timeout_ms=50")
    try:
        with pytest.raises(NotConfirmed):
            store.put("unconfirmed", record, ttl=60)
        assert store.get("unconfirmed") is not None   # on the primary, only not confirmed
    finally:
        store.close()
