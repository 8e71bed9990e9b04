"""A RabbitMQ broker URL naming several nodes (a cluster): how it is parsed, walked and
reported. The real failover, on a 3-node cluster the test starts, is
tests/integration/test_rabbitmq_cluster.py; here the shared node stands for the one node that
answers and closed loopback ports for the nodes that do not.
"""

from __future__ import annotations

import logging

import pytest

from conveyor.broker.kombu import KombuBroker
from conveyor.broker.kombu import parse_url as parse_kombu
from conveyor.broker.rabbitmq import ManagementAPI, RabbitMQBroker, parse_url
from conveyor.broker.rabbitmq.connection import NoNodeAnswered
from conveyor.errors import BrokerConnectionError, BrokerError, ConfigError
from conveyor.kinds import url as url_kind
from tests.conftest import require_service

DEAD = "127.0.0.1:1"  # nothing listens on port 1: refused at once


def test_a_multi_host_url_gives_one_set_of_parameters_per_node_in_order() -> None:
    settings = parse_url("amqp://u:pw@h1:5672,h2:5673,[::1]/vh?heartbeat=7&retry_seconds=5")
    assert [(h.host, h.port) for h in settings.hosts] == [("h1", 5672), ("h2", 5673),
                                                          ("::1", 5672)]
    assert {(h.virtual_host, h.heartbeat, h.credentials.username, h.credentials.password)
            for h in settings.hosts} == {("vh", 7, "u", "pw")}
    assert settings.host_names == ("h1:5672", "h2:5673", "[::1]:5672")
    assert settings.where == "amqp://u:***@h1:5672,h2:5673,[::1]/vh"
    assert settings.retry_seconds == 5 and settings.params is settings.hosts[0]
    # each node's management API on its default port, unless ?management= lists them
    assert settings.management == ("http://h1:15672", "http://h2:15672", "http://[::1]:15672")
    given = parse_url("amqps://u:pw@h1,h2/?management=https://h1:1,https://h2:2")
    assert given.management == ("https://h1:1", "https://h2:2")
    assert given.host_names == ("h1:5671", "h2:5671")
    assert parse_url("amqp://localhost").management == ("http://localhost:15672",)


@pytest.mark.parametrize("joiner", [",", ";"])
def test_a_list_of_whole_urls_is_one_cluster(joiner: str) -> None:
    """A list in conveyor.toml (broker_url = ["amqp://…", "amqp://…"]) reaches the parser
    comma-joined; Celery's failover list is joined by ';'. Each URL keeps its own login."""
    settings = parse_url(joiner.join(["amqp://a:1@h1:5672/v?management=http://h1:1",
                                      "amqp://b:2@h2:5673,h3/v?retry_seconds=5"]))
    assert settings.host_names == ("h1:5672", "h2:5673", "h3:5672")
    assert [h.credentials.username for h in settings.hosts] == ["a", "b", "b"]
    assert settings.management == ("http://h1:1",) and settings.retry_seconds == 5
    assert settings.where == f"amqp://a:***@h1:5672/v{joiner}amqp://b:***@h2:5673,h3/v" \
        .replace(";", ",")


@pytest.mark.parametrize("url", ["amqp://u:p@h1,,h2/", "amqp://u:p@h1,h2:x/"])
def test_a_malformed_host_list_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="RabbitMQ URL"):
        parse_url(url)


def test_a_setting_may_name_several_hosts_each_with_a_valid_port() -> None:
    assert url_kind("amqp://u:p@h1:5672,h2:5673/v") == "amqp://u:p@h1:5672,h2:5673/v"
    with pytest.raises(ValueError, match="'h2:99999'"):
        url_kind("amqp://u:p@h1:5672,h2:99999/v")


def test_the_walk_passes_nodes_that_do_not_answer_and_says_where_it_landed(
        caplog: pytest.LogCaptureFixture) -> None:
    require_service("rabbitmq")
    caplog.set_level(logging.INFO, "conveyor.broker.rabbitmq")
    broker = RabbitMQBroker(f"amqp://guest:guest@{DEAD},127.0.0.1:5672/%2F")
    try:
        assert broker.node == 1
        assert "connected to RabbitMQ node 127.0.0.1:5672 (2 of 2" in caplog.text
        # the node a connection was lost from is tried last: here the live one
        broker._drop_connection()
        assert broker._connection().is_open and broker.node == 1
    finally:
        broker.close()


def test_no_node_answering_names_each_node_and_why() -> None:
    with pytest.raises(BrokerConnectionError) as caught:
        RabbitMQBroker(f"amqp://guest:guest@{DEAD},127.0.0.1:2/%2F?retry_seconds=0.3")
    text = str(caught.value)
    assert "no RabbitMQ node answered: 127.0.0.1:1: ConnectionRefusedError" in text, text
    assert "127.0.0.1:2: ConnectionRefusedError" in text, text
    assert isinstance(caught.value.__cause__, NoNodeAnswered)


def test_the_management_api_follows_the_node_that_answers() -> None:
    require_service("rabbitmq")
    api = ManagementAPI(["http://127.0.0.1:1", "http://127.0.0.1:15672"], "guest", "guest",
                        "/")
    assert api.queue_family("no-such-queue-anywhere") == {}
    assert api.base == "http://127.0.0.1:15672"  # asked first from now on
    dead = ManagementAPI(["http://127.0.0.1:1", "http://127.0.0.1:2"], "guest", "guest", "/")
    with pytest.raises(BrokerError, match="no node's management API answered: "
                       "http://127.0.0.1:1 is unreachable .*; http://127.0.0.1:2 is "):
        dead.queue_family("q")


def test_kombu_amqp_walks_the_nodes_of_a_multi_host_url_too() -> None:
    settings = parse_kombu("kombu+amqp://u:pw@h1:5672,h2:5673/v?prefix=app.")
    assert settings.hosts == ("amqp://u:pw@h1:5672/v", "amqp://u:pw@h2:5673/v")
    assert settings.url == ";".join(settings.hosts)  # kombu's own failover list
    assert parse_kombu("kombu+redis://h:6379/0").hosts == ("redis://h:6379/0",)
    require_service("rabbitmq")
    broker = KombuBroker(f"kombu+amqp://guest:guest@{DEAD},127.0.0.1:5672//")
    try:
        assert broker.node == 1
    finally:
        broker.close()
    with pytest.raises(BrokerConnectionError, match="no RabbitMQ node answered: 127.0.0.1:1: "
                       ".*; 127.0.0.1:2: "):
        KombuBroker(f"kombu+amqp://guest:guest@{DEAD},127.0.0.1:2//?retry_seconds=0.3")
