"""Declaring limits: key templates checked at decoration, formatted at enqueue, carried in
one header; an unlimited task's message carries none."""

from __future__ import annotations

import pytest

from conveyor import Limit, Rate, task
from conveyor.errors import ConfigError
from conveyor.flow import LIMITS_HEADER, Spec, limits_of


@task(name="u.flow.sync", concurrency=Limit(key="tenant:{tenant_id}", max=2),
      rate=Rate(key="partner-api", per_second=10, burst=20))
def sync_tenant(tenant_id: str, full: bool = False) -> None:
    return None


@task(name="u.flow.plain")
def plain(x: int) -> int:
    return x


def test_keys_are_formatted_from_the_bound_arguments() -> None:
    for message in (sync_tenant.message(("acme",)),
                    sync_tenant.message((), {"tenant_id": "acme"})):
        assert limits_of(message.headers) == [
            Spec("c", "tenant:acme", max=2), Spec("r", "partner-api", per_second=10, burst=20)]


def test_an_unlimited_task_carries_no_limits_header() -> None:
    assert LIMITS_HEADER not in plain.message((1,)).headers


def test_given_headers_keep_the_limits() -> None:
    message = sync_tenant.message(("acme",), headers={"x": "1"})
    assert message.headers["x"] == "1" and LIMITS_HEADER in message.headers


def test_a_template_naming_no_argument_fails_at_decoration() -> None:
    with pytest.raises(ConfigError, match="has no argument 'tenant'"):
        @task(name="u.flow.bad", concurrency=Limit(key="tenant:{tenant}", max=1))
        def bad(tenant_id: str) -> None:
            return None


def test_a_broken_template_or_bad_numbers_fail_at_once() -> None:
    with pytest.raises(ConfigError, match="not a valid template"):
        Limit(key="tenant:{tenant", max=1)
    with pytest.raises(ConfigError, match="at least 1"):
        Limit(key="k", max=0)
    with pytest.raises(ConfigError, match="per_second must be above 0"):
        Rate(key="k", per_second=0)


def test_arguments_that_do_not_fit_fail_at_enqueue() -> None:
    with pytest.raises(ConfigError, match="do not fit its signature"):
        sync_tenant.message((), {"nope": 1})


def test_worker_metrics_show_limits_per_key() -> None:
    from prometheus_client import generate_latest

    from conveyor.limits import Usage
    from conveyor.worker.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.limits([Usage("tenant:acme", in_use=2, waiting=7, denied=9)])
    metrics.limit_denied("tenant:acme", "parked")
    text = generate_latest(metrics.registry).decode()
    assert 'conveyor_limit_in_use{key="tenant:acme"} 2.0' in text
    assert 'conveyor_limit_waiting{key="tenant:acme"} 7.0' in text
    assert 'conveyor_limit_denied_total{key="tenant:acme",verdict="parked"} 1.0' in text
    metrics.limits([Usage("tenant:globex", in_use=1, waiting=0, denied=0)])
    text = generate_latest(metrics.registry).decode()
    assert 'conveyor_limit_in_use{key="tenant:globex"} 1.0' in text
    assert 'conveyor_limit_in_use{key="tenant:acme"}' not in text  # forgotten by the store


def test_dag_tasks_carry_their_limits_and_pools_in_the_spec() -> None:
    from conveyor import DAG
    from conveyor.flow import decode

    dag = DAG("u_flow_dag", pools={"exports": 4})
    own = dag.task(sync_tenant, "acme")
    pooled = dag.command("export", ["true"], pool="exports", pool_slots=2,
                         rate=Rate(key="warehouse", per_second=2))
    plain_node = dag.command("plain", ["true"])
    assert decode(own.spec()["limits"]) == [
        Spec("c", "tenant:acme", max=2), Spec("r", "partner-api", per_second=10, burst=20)]
    assert decode(pooled.spec()["limits"]) == [
        Spec("r", "warehouse", per_second=2), Spec("c", "pool:exports", max=4, weight=2)]
    assert plain_node.spec()["limits"] == ""


def test_dag_limit_mistakes_name_the_line() -> None:
    from conveyor import DAG, DagError

    dag = DAG("u_flow_dag_bad")
    with pytest.raises(DagError, match="pool 'exports' is not declared"):
        dag.command("export", ["true"], pool="exports")
    first = dag.command("first", ["true"])
    with pytest.raises(DagError, match="return value"):
        dag.task(sync_tenant, first)


def test_a_dag_task_s_message_carries_its_limits_to_the_worker() -> None:
    from conveyor import DAG
    from conveyor.scheduler.workloads import workload
    from tests.support import task_instance

    node = DAG("u_flow_dag_msg").task(sync_tenant, "acme")
    ti = task_instance(spec=node.spec(), task_id=node.id)
    message = workload(ti, "events").message
    assert limits_of(message.headers)[0] == Spec("c", "tenant:acme", max=2)
