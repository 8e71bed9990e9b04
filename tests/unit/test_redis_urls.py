"""Redis URLs taken apart without a server: redis+sentinel:// (the Sentinels, master, database
and whose password is whose), the durable mode's options, and what is kept out of logs.
Against real Sentinels: tests/integration/test_redis_sentinel.py."""

from __future__ import annotations

import pytest

from conveyor import kinds, redis_clients
from conveyor.errors import ConfigError
from conveyor.locations import redact, store_urls

URL = "redis+sentinel://:pw@s1:26379,s2:26380,s3/mymaster/2"


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    address = redis_clients.parse_sentinel(
        f"{URL}?sentinel_password=sp&socket_timeout=3&prefix=p&wait_replicas=1")
    assert address.sentinels == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (address.master, address.db) == ("mymaster", 2)
    assert address.options["password"] == "pw"       # the master's
    assert address.options["socket_timeout"] == 3.0  # redis-py's own, typed by redis-py
    assert address.sentinel_options == {"password": "sp"}
    assert "prefix" not in address.options and "wait_replicas" not in address.options


def test_the_database_defaults_to_0_and_ipv6_sentinels_parse() -> None:
    address = redis_clients.parse_sentinel("redis+sentinel://[::1]:26381/m")
    assert address.sentinels == (("::1", 26381),) and address.db == 0


@pytest.mark.parametrize("bad", ["redis+sentinel:///m/0", "redis+sentinel://s1/",
                                 "redis+sentinel://s1/m/x", "redis+sentinel://s1:0/m",
                                 "redis+sentinel://s1/m/0/extra"])
def test_a_malformed_sentinel_url_says_what_it_should_look_like(bad: str) -> None:
    with pytest.raises(ConfigError, match="redis\\+sentinel://s1:26379,s2:26380"):
        redis_clients.parse_sentinel(bad)


def test_the_durable_mode_is_off_unless_asked() -> None:
    assert redis_clients.durable(URL) is None
    durable = redis_clients.durable(f"{URL}?wait_replicas=2&wait_timeout_ms=250")
    assert durable == redis_clients.Durable(2, 250)
    assert durable.command() == ("WAIT", 2, 250)
    assert durable.shortfall(2, "publish", "x") is None
    assert "1 of the 2 replica(s)" in (durable.shortfall(1, "publish", "x") or "")
    default = redis_clients.durable("redis://h/0?wait_replicas=1")
    assert default is not None and default.timeout_ms == redis_clients.WAIT_TIMEOUT_MS


@pytest.mark.parametrize("query", ["wait_replicas=0", "wait_replicas=x",
                                   "wait_timeout_ms=5", "wait_replicas=1&wait_timeout_ms=0",
                                   "wait_replicas=1&wait_timeout_ms=60000"])
def test_durable_options_out_of_range_are_config_errors(query: str) -> None:
    with pytest.raises(ConfigError):
        redis_clients.durable(f"redis://h/0?{query}")


def test_conveyors_options_never_reach_redis_py() -> None:
    plain = redis_clients.without_ours("redis://h/0?prefix=p&retry_seconds=5&wait_replicas=1"
                                       "&wait_timeout_ms=9&socket_timeout=2")
    assert plain == "redis://h/0?socket_timeout=2"


def test_passwords_in_the_query_are_masked_in_logs() -> None:
    shown = redact(f"{URL}?sentinel_password=sp&password=pw2&prefix=p")
    assert "sp" not in shown.split("?")[1] and "pw2" not in shown and ":pw@" not in shown
    assert "prefix=p" in shown and "s1:26379,s2:26380,s3" in shown


def test_a_sentinel_url_is_a_setting_and_keeps_results_and_limits_beside_it() -> None:
    assert kinds.url(URL) == URL
    with pytest.raises(ValueError, match="names no master"):
        kinds.url("redis+sentinel://s1:26379")
    with pytest.raises(ValueError, match="not a number"):
        kinds.url("redis+sentinel://s1:26379,s2:x/m/0")
    stores = store_urls(URL)
    assert stores.results == URL and stores.limits == URL
