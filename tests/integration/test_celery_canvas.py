"""Celery's canvas through the intake: an unchanged Celery producer's chain, group and chord
(Redis and RabbitMQ as Celery's broker, results in Redis) run by a real `conveyor worker`, and
`AsyncResult.get()` returns or raises what Celery would; what the intake cannot run is
refused at once with the reason. Also the pieces, on messages Celery itself builds."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import chain, chord, group
from celery.exceptions import ChordError, TaskRevokedError
from kombu.exceptions import ContentDisallowed

from conveyor.broker import from_url
from conveyor.celery_intake.canvas import (
    JOIN_KEY,
    SIZE_KEY,
    Follower,
    chord_error,
    publish_step,
    step_message,
    unique_key,
)
from conveyor.celery_intake.canvas_embed import (
    CHAIN,
    CHORD,
    GROUP,
    GROUP_INDEX,
    CanvasRefused,
    canvas_headers,
)
from conveyor.celery_intake.conversion import Accepted, Rejected, convert
from conveyor.celery_intake.names import intake_queue
from conveyor.celery_intake.results import RedisResults
from conveyor.celery_intake.run_results import prefix
from conveyor.client import Client
from conveyor.config import Settings
from conveyor.events import Event
from conveyor.message import Codec, Message
from conveyor.state.store import from_url as state_store
from tests.conftest import (
    POSTGRES_URL,
    REDIS_URL,
    delete_redis_prefix,
    drop_postgres_schema,
    require_service,
)
from tests.integration.test_celery_intake import Setup, setup  # noqa: F401 - the fixture
from tests.integration.workerkit import ROOT, worker_env
from tests.support import stop, wait_for

pytestmark = pytest.mark.slow


def sig(task: str, *args: Any, task_id: str = "id-2", **extra: Any) -> dict[str, Any]:
    return {"task": task, "args": list(args), "kwargs": {}, "options": {"task_id": task_id},
            "subtask_type": None, "immutable": False, **extra}


# -- the pieces ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("embed", "headers", "phrase"), [
    ({"callbacks": [sig("t.add")]}, {}, "link/link_error callbacks (callbacks)"),
    ({"errbacks": [sig("t.add")]}, {}, "link/link_error callbacks (errbacks)"),
    ({"chain": [sig("celery.chord", subtask_type="chord")]}, {}, "a group or chord inside"),
    ({"chain": [sig("t.add", options={"task_id": "x", "link": [sig("t.add")]})]}, {},
     "has its own link"),
    ({"chain": [sig("t.add")], "chord": sig("t.tsum")}, {"group": "g", "group_index": 0},
     "a chain inside a chord's group"),
    ({"chord": sig("t.tsum")}, {}, "without 'group' and 'group_index'"),
    ({"chord": sig("celery.chain", subtask_type="chain")}, {"group": "g", "group_index": 0},
     "a canvas as a chord's callback"),
    ({"chain": [{"task": "t.add", "options": {}}]}, {}, "has no task id"),
])
def test_what_the_intake_cannot_run_is_refused_with_its_reason(
        embed: dict[str, Any], headers: dict[str, Any], phrase: str) -> None:
    with pytest.raises(CanvasRefused, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        canvas_headers(embed, headers, follows=True)


@pytest.mark.parametrize(("embed", "headers", "phrase"), [
    ({"callbacks": [sig("t.add")]}, {}, "link/link_error callbacks (callbacks)"),
    ({"chain": [sig("t.add", options={"task_id": "x", "link_error": [sig("t.add")]})]}, {},
     "t.add has link_error callbacks"),
    ({"chord": sig("celery.group", subtask_type="group", kwargs={"tasks": [sig("t.add")]})},
     {"group": "g", "group_index": 0}, "a chord's callback that starts with a group"),
    ({"chord": sig("t.tsum")}, {}, "without 'group' and 'group_index'"),
    ({"chain": [{"task": "t.add", "options": {}}]}, {}, "has no task id"),
])
def test_what_a_canvas_run_cannot_honour_is_refused_with_its_reason(
        embed: dict[str, Any], headers: dict[str, Any], phrase: str) -> None:
    from conveyor.celery_intake.canvas_embed import refuse_links
    from conveyor.celery_intake.canvas_plan import starts_a_run
    with pytest.raises(CanvasRefused, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        refuse_links(embed)
        starts_a_run("t.add", "id-1", "q", headers, [1], {}, embed)


def test_a_chain_needs_the_result_backend_the_intake_follows() -> None:
    with pytest.raises(CanvasRefused, match="needs --celery-result-backend"):
        canvas_headers({"chain": [sig("t.add", 1)]}, {}, follows=False)
    assert canvas_headers({"chain": None, "chord": None}, {}, follows=False) == {}


def test_the_next_step_is_the_message_a_celery_worker_would_send() -> None:
    parent = {"celery_id": "id-1", "celery_queue": "q"}
    raw = step_message(sig("t.add", 10, task_id="id-2"), [3], "q", parent,
                       [sig("t.add", 5, 5, task_id="id-3", immutable=True)])
    args, kwargs, embed = json.loads(raw.body)
    assert (raw.queue, raw.task_id, raw.task_name, args) == ("q", "id-2", "t.add", [3, 10])
    assert raw.headers["root_id"] == "id-1" and raw.headers["parent_id"] == "id-1"
    out = convert(raw, "celery.q", lambda name: None, 0.0, "results")
    assert isinstance(out, Accepted) and out.message.id == "id-2"
    assert json.loads(out.message.headers[CHAIN]) == embed["chain"]
    immutable = step_message(sig("t.add", 5, 5, immutable=True, options={
        "task_id": "id-3", "queue": "other"}), [13], "q", parent)
    assert json.loads(immutable.body)[0] == [5, 5] and immutable.queue == "other"


def test_a_failed_member_makes_the_chord_error_celery_stores() -> None:
    culprit = {"id": "m1", "status": "FAILURE", "result": {
        "exc_type": "ValueError", "exc_message": ["kaput"], "exc_module": "builtins"}}
    doc = chord_error("cb", culprit)
    assert doc["status"] == "FAILURE" and doc["task_id"] == "cb"
    assert doc["result"] == {"exc_type": "ChordError", "exc_module": "celery.exceptions",
                             "exc_message": ["Dependency m1 raised ValueError('kaput')"]}


def test_a_refused_canvas_message_is_rejected_not_run() -> None:
    from tests.integration.test_celery_protocol import celery_message
    raw = celery_message(link=None)
    body = json.loads(raw.body)
    body[2]["callbacks"] = [sig("t.add")]
    out = convert(raw.__class__(**{**raw.__dict__, "body": json.dumps(body).encode()}),
                  "celery.q", lambda name: None, 0.0, "results")
    assert isinstance(out, Rejected) and "link/link_error" in out.reason


def test_a_canvas_delivered_again_makes_one_run(unique: str, tmp_path: Path) -> None:
    """The outcome loop creates a run, then acks: a crash in between delivers the canvas
    again (or a chord member twice), and the run it made is found, not made again. A
    chord member that comes before its group's size is kept until the rest come."""
    from conveyor.celery_intake.canvas_runs import CanvasRuns
    from conveyor.celery_intake.conversion import CeleryMessage
    from conveyor.celery_intake.run_results import RunResults

    state_url = f"sqlite:///{tmp_path}/state.db"
    backend = RedisResults(REDIS_URL)
    woken: list[str] = []
    watcher = RunResults(backend, partial(state_store, state_url), prefix(state_url),
                         threading.Event())
    canvas = CanvasRuns(backend, partial(state_store, state_url), watcher, woken.append)

    def message(task_id: str, embed: dict[str, Any], **headers: Any) -> CeleryMessage:
        return CeleryMessage("q", "application/json", "utf-8",
                             {"task": "t.add", "id": task_id, **headers},
                             json.dumps([[1, 2], {}, embed]).encode())
    chained = message(f"{unique}-1", {"chain": [sig("t.add", 10, task_id=f"{unique}-2")]})
    callback = sig("t.tsum", task_id=f"{unique}-cb")
    members = [message(f"{unique}-m{i}", {"chord": callback}, group=f"{unique}-g",
                       group_index=i) for i in (1, 0)]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        made = [canvas.start(chained), canvas.start(chained)]
        # Celery writes the group's size just before it sends the last member: one that
        # comes before it waits for the rest, as in Celery's own join
        joined = [canvas.start(members[0])]
        client.set(SIZE_KEY.format(group=f"{unique}-g"), 2, ex=600)
        joined += [canvas.start(m) for m in (members[0], members[1], members[1])]
        store = state_store(state_url)
        try:
            rows = list(store.rows("recent_runs", dag_id="", state="", limit=10))
        finally:
            store.close()
    finally:
        canvas.close()
        keys = list(client.scan_iter(match=prefix(state_url) + "*"))
        client.delete(SIZE_KEY.format(group=f"{unique}-g"), *keys)
        client.close()
        backend.close()
    assert made[0] is not None and made == [made[0]] * 2
    assert joined[:2] == [None, None] and joined[2] is not None and joined[3] == joined[2]
    assert sorted(r["run_id"] for r in rows) == sorted({made[0], joined[2]})
    assert sorted(r["dag_id"] for r in rows) == ["canvas.add", "canvas.tsum"]


# -- end to end -----------------------------------------------------------------------------------

def test_celery_chain_group_and_chord_return_what_celery_would(setup: Setup) -> None:  # noqa: F811
    with warnings.catch_warnings():
        # Celery's results (a chord's, a chain's parents) unsubscribe when collected, on a
        # connection of their own that nobody closes: Celery's leak, not the intake's
        warnings.simplefilter("ignore", ResourceWarning)
        check_canvases(setup)
        gc.collect()
    assert "Traceback" not in setup.output(), setup.output()


def check_canvases(setup: Setup) -> None:  # noqa: F811
    app = setup.app
    add, tsum, fail = app.tasks["t.add"], app.tasks["t.tsum"], app.tasks["t.fail"]
    setup.worker()
    chained = chain(add.s(1, 2), add.s(10), add.s(100)).apply_async()
    immutable = chain(add.s(1, 2), add.si(5, 5)).apply_async()
    grouped = group(add.s(i, i) for i in range(4)).apply_async()
    chorded = chord([add.s(i, i) for i in range(5)], tsum.s()).apply_async()
    failing = chain(add.s(1, 1), fail.si("kaput"), add.s(1)).apply_async()
    chord_failing = chord([add.s(1, 1), fail.si("broken")], tsum.s()).apply_async()
    linked = add.apply_async((1, 1), link=add.s(2))
    nested = chain(add.s(1, 1), group(add.s(1), add.s(2)), tsum.s()).apply_async()
    first_of_nested = nested.parent.parent
    try:
        assert setup.get(chained, 60) == 113, setup.output()
        assert setup.get(immutable, 60) == 10
        assert grouped.get(timeout=60) == [0, 2, 4, 6]
        assert setup.get(chorded, 60) == 20
        with pytest.raises(ValueError, match="kaput"):
            setup.get(failing, 60)
        assert failing.state == "PENDING"          # the step after the failure never ran
        # the producer's get() raises the member's error (Celery checks the group first),
        # and the callback's own result is Celery's ChordError naming that member
        with pytest.raises((ValueError, ChordError), match="broken"):
            setup.get(chord_failing, 60)
        callback = app.AsyncResult(chord_failing.id)
        with pytest.raises(ChordError, match=r"Dependency .* raised ValueError\('broken'\)"):
            callback.get(timeout=60)
        with pytest.raises(ContentDisallowed, match="link/link_error callbacks"):
            setup.get(linked, 30)
        with pytest.raises(ContentDisallowed, match="a group or chord inside a chain"):
            setup.get(first_of_nested, 30)
    finally:
        setup.task_ids += [r.id for r in (*grouped.results, failing.parent, chained.parent,
                                          chained.parent.parent, immutable.parent)]
        client = redis.Redis.from_url(REDIS_URL)
        try:
            for result in (chorded, chord_failing):
                gid = result.parent.id if result.parent is not None else ""
                client.delete(JOIN_KEY.format(group=gid), SIZE_KEY.format(group=gid))
        finally:
            client.close()


def test_a_redelivered_outcome_publishes_each_follow_up_once(unique: str) -> None:
    """The outcome loop follows before it acks, so a crash (or a second worker) follows an
    outcome again: the next chain step and the chord's callback are still published once."""
    broker_url = f"{REDIS_URL}?prefix={unique}"
    client = Client.from_settings(Settings(broker_url=broker_url))
    backend = RedisResults(REDIS_URL)
    follower = Follower(backend, partial(publish_step, client, lambda name: None, "results"))
    queue, group_id = f"q-{unique}", f"{unique}-group"
    step = Event(kind="succeeded", message_id="m1", task="t.add", attempt=1, result=3,
                 headers={"celery_id": f"{unique}-1", "celery_queue": queue,
                          CHAIN: json.dumps([sig("t.add", 10, task_id=f"{unique}-2")])})
    members = [Event(kind="succeeded", message_id=f"m{i}", task="t.add", attempt=1, result=i,
                     headers={"celery_id": f"{unique}-m{i}", "celery_queue": queue,
                              CHORD: json.dumps(sig("t.tsum", task_id=f"{unique}-cb")),
                              GROUP: group_id, GROUP_INDEX: str(i)}) for i in (1, 0)]
    redis_client = redis.Redis.from_url(REDIS_URL)
    try:
        for event in (step, step, members[0]):   # a member before the size: it waits
            follower.follow(event, {"status": "SUCCESS", "result": event.result})
        redis_client.set(SIZE_KEY.format(group=group_id), 2, ex=600)
        for event in (members[0], members[1], members[1]):
            follower.follow(event, {"status": "SUCCESS", "result": event.result})
        published = drain(broker_url, intake_queue(queue))
    finally:
        redis_client.delete(SIZE_KEY.format(group=group_id), JOIN_KEY.format(group=group_id))
        redis_client.close()
        backend.close()
        client.close()
        delete_redis_prefix(unique)
    assert sorted((m.id, m.args) for m in published) == [
        (f"{unique}-2", (3, 10)), (f"{unique}-cb", ([0, 1],))]


def test_a_follower_killed_before_publishing_loses_nothing(unique: str) -> None:
    """Killed between taking the step's key and publishing, a follower leaves the key to
    lapse (PUBLISHING s, shortened here): the redelivered outcome then publishes the step."""
    broker_url = f"{REDIS_URL}?prefix={unique}"
    client = Client.from_settings(Settings(broker_url=broker_url))
    backend = RedisResults(REDIS_URL)
    follower = Follower(backend, partial(publish_step, client, lambda name: None, "results"))
    queue = f"q-{unique}"
    step = Event(kind="succeeded", message_id="m1", task="t.add", attempt=1, result=3,
                 headers={"celery_id": f"{unique}-1", "celery_queue": queue,
                          CHAIN: json.dumps([sig("t.add", 10, task_id=f"{unique}-2")])})
    try:
        client.limiter().hold(unique_key(f"{unique}-2"), "killed", time.time(), 0.3)
        follower.follow(step, {"status": "SUCCESS", "result": 3})   # it is held: nothing
        time.sleep(0.4)
        follower.follow(step, {"status": "SUCCESS", "result": 3})   # lapsed: published
        follower.follow(step, {"status": "SUCCESS", "result": 3})   # held a day: nothing
        published = drain(broker_url, intake_queue(queue))
    finally:
        backend.close()
        client.close()
        delete_redis_prefix(unique)
    assert [(m.id, m.args) for m in published] == [(f"{unique}-2", (3, 10))]


def drain(broker_url: str, queue: str) -> list[Message]:
    """Every message waiting on `queue`, acked as read."""
    published: list[Message] = []
    with from_url(broker_url) as broker:
        for delivery in broker.consume([queue], prefetch=10, timeout=0.5):
            if delivery is None:
                break
            broker.ack(delivery)
            published.append(Codec().decode(delivery.body))
    return published


# -- as scheduler runs ------------------------------------------------------------------------

@dataclass
class Runs:
    """A scheduler beside the Celery setup's workers: its state store and environment."""

    state_url: str
    env: dict[str, str]
    scheduler: subprocess.Popen[bytes] | None = None

    def rows(self, query: str, **params: Any) -> list[Any]:
        store = state_store(self.state_url)
        try:
            return list(store.rows(query, **params))
        finally:
            store.close()


@pytest.fixture
def runs(request: pytest.FixtureRequest, setup: Setup, tmp_path: Path,  # noqa: F811
         unique: str) -> Iterator[Runs]:
    """A state store (SQLite, or Postgres when parametrized so), a scheduler on it; the
    intake's keys (and a Postgres schema) deleted at the end."""
    (tmp_path / "dags").mkdir()
    postgres = getattr(request, "param", "sqlite") == "postgres"
    if postgres:
        require_service("postgres")
    state_url = f"{POSTGRES_URL}?schema={unique}s" if postgres else \
        f"sqlite:///{tmp_path}/state.db"
    env = {"CONVEYOR_STATE_URL": state_url, "CONVEYOR_EVENTS_QUEUE": f"events-{unique}",
           "CONVEYOR_SCHEDULER_CONTROL_QUEUE": f"control-{unique}",
           "CONVEYOR_DAGS_FOLDER": str(tmp_path / "dags"),
           "CONVEYOR_QUEUE_SAMPLE_INTERVAL": "0"}
    made = Runs(state_url, env)
    log = (tmp_path / "scheduler.log").open("wb")
    made.scheduler = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "scheduler"], cwd=ROOT,
        env=worker_env(setup.conveyor_url, **env), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    yield made
    stop(made.scheduler)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix(state_url) + "*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
    if postgres:
        drop_postgres_schema(f"{unique}s")


def every_id(result: Any) -> list[str]:
    """A result's id, its parents' and its group's members' (what the test cleans up)."""
    found: list[str] = []
    while result is not None:
        found.append(result.id)
        found += [r.id for r in getattr(result, "results", None) or []]
        result = result.parent
    return found


def test_celery_canvases_run_as_scheduler_runs(setup: Setup, runs: Runs) -> None:  # noqa: F811
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)   # Celery's, as above
        check_canvas_runs(setup, runs)
        gc.collect()


@pytest.mark.parametrize("setup", ["redis"], indirect=True)
@pytest.mark.parametrize("runs", ["postgres"], indirect=True)
def test_celery_canvases_run_as_scheduler_runs_on_postgres(
        setup: Setup, runs: Runs) -> None:  # noqa: F811
    """The same canvases with the scheduler's state store on Postgres (the watcher's two
    queries per turn, Runs.many and TaskInstances.of_runs, have SQL of their own there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        check_canvas_runs(setup, runs)
        gc.collect()


def check_canvas_runs(setup: Setup, runs: Runs) -> None:  # noqa: F811
    app = setup.app
    add, tsum, fail = app.tasks["t.add"], app.tasks["t.tsum"], app.tasks["t.fail"]
    setup.worker(**runs.env)
    sent = {
        "chain": chain(add.s(1, 2), add.s(10), add.s(100)).apply_async(),
        "immutable": chain(add.s(1, 2), add.si(5, 5)).apply_async(),
        "chord": chord([add.s(i, i) for i in range(5)], tsum.s()).apply_async(),
        # Celery makes chain(a, group, b) a chain(a, chord(group, b)): one message
        "group in chain": chain(add.s(1, 1), group(add.s(1), add.s(2)), tsum.s()).apply_async(),
        "group ends chain": chain(add.s(1, 1), group(add.s(1), add.s(2))).apply_async(),
        "chain in chord": chord([chain(add.s(1, 1), add.s(5)), add.s(2, 2)],
                                tsum.s()).apply_async(),
        "chain after group": chain(group(add.s(1, 1), add.s(2, 2)), tsum.s(),
                                   add.s(3)).apply_async(),
        "countdown": chain(add.s(2, 2), add.s(1)).apply_async(countdown=1),
        "failing": chain(add.s(1, 1), fail.si("kaput"), add.s(1)).apply_async(),
        "chord failing": chord([add.s(1, 1), fail.si("broken")], tsum.s()).apply_async(),
    }
    linked = chain(add.s(1, 1), add.s(2).on_error(tsum.s())).apply_async()
    try:
        assert setup.get(sent["chain"], 60) == 113, setup.output()
        assert setup.get(sent["immutable"], 60) == 10
        assert setup.get(sent["chord"], 60) == 20
        assert setup.get(sent["group in chain"], 60) == 7          # (2+1) + (2+2)
        assert sent["group ends chain"].get(timeout=60) == [3, 4]  # a GroupResult
        assert setup.get(sent["chain in chord"], 60) == 11         # (1+1+5) + (2+2)
        assert setup.get(sent["chain after group"], 60) == 9       # (2 + 4) + 3
        assert sent["chain"].parent.get(timeout=10) == 13          # each step's result
        assert setup.get(sent["countdown"], 60) == 5
        with pytest.raises(ValueError, match="kaput") as caught:
            setup.get(sent["failing"], 60)
        assert caught.value.args == ("kaput",)
        assert sent["failing"].state == "PENDING"          # the step after it never ran
        with pytest.raises((ValueError, ChordError), match="broken"):
            setup.get(sent["chord failing"], 60)
        with pytest.raises(ChordError, match=r"Dependency .* raised ValueError\('broken'\)"):
            app.AsyncResult(sent["chord failing"].id).get(timeout=60)
        with pytest.raises(ContentDisallowed, match="link_error callbacks"):
            setup.get(linked, 30)
    finally:
        for result in [*sent.values(), linked]:
            setup.task_ids += every_id(result)
    made = runs.rows("recent_runs", dag_id="", state="", limit=50)
    assert len(made) == len(sent), made                    # one run per canvas, no more
    assert {r["run_type"] for r in made} == {"canvas"}
    assert sorted(r["state"] for r in made) == ["failed"] * 2 + ["success"] * 8
    assert {r["dag_id"] for r in made} == {"canvas.add", "canvas.tsum"}
    listed = subprocess.run([sys.executable, "-m", "conveyor.cli", "runs", "list"], cwd=ROOT,
                            env=worker_env(setup.conveyor_url, **runs.env), text=True,
                            capture_output=True, timeout=60)
    shown = listed.stdout.count("canvas.add") + listed.stdout.count("canvas.tsum")
    assert shown == len(sent), listed                  # as users see them
    assert "Traceback" not in setup.output(), setup.output()


@pytest.mark.parametrize("setup", ["redis"], indirect=True)
def test_a_worker_killed_mid_chain_loses_and_repeats_nothing(
        setup: Setup, runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    """kill -9 of the worker (and the runner) running step two of a chain: the step comes
    back to the next worker after the broker's lease (3 s here), the steps that succeeded
    are not run again, and that worker's intake takes over the run's results (6 s lease)."""
    ledger = str(tmp_path / "ledger")
    app = setup.app

    def step(task: str, token: str) -> Any:
        return app.signature(task, args=(ledger, token), immutable=True)
    first = setup.worker(**runs.env)
    sent = chain(step("t.record", "one"), step("t.hang_once", "two"),
                 step("t.record", "three")).apply_async()
    setup.task_ids += every_id(sent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)   # Celery's, as above
        runner = wait_for(lambda: next((line.split()[2] for line in Path(ledger).read_text()
                                        .splitlines() if line.startswith("start two")), None),
                          60, "step two to start", ignore=(FileNotFoundError,),
                          detail=setup.output)
        first.kill()
        first.wait(10)
        try:
            os.kill(int(runner), signal.SIGKILL)
        except ProcessLookupError:
            pass   # it died with its worker
        setup.worker(**runs.env)
        assert setup.get(sent, 90) == "three", setup.output()
        assert sent.parent.parent.get(timeout=10) == "one"
        gc.collect()
    assert "its watcher is gone, this intake writes its results now" in setup.output()
    lines = Counter(" ".join(line.split()[:2]) for line in Path(ledger).read_text().splitlines())
    assert lines == {"start one": 1, "done one": 1, "start two": 2, "done two": 1,
                     "start three": 1, "done three": 1}
    assert [r["state"] for r in runs.rows("recent_runs", dag_id="", state="", limit=5)] == [
        "success"]


@pytest.mark.parametrize("setup", ["redis"], indirect=True)
def test_celery_revoke_cancels_a_task_of_a_canvas_run(
        setup: Setup, runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    """revoke(id) of a chain's pending step cancels it in the run: what follows never runs,
    `get()` raises TaskRevokedError; a revoke of the running step lets it go on."""
    marker, release = str(tmp_path / "running"), str(tmp_path / "release")
    app = setup.app
    setup.worker(**runs.env)
    sent = chain(app.signature("t.wait_for_file", args=(marker, release), immutable=True),
                 app.tasks["t.add"].si(1, 1), app.tasks["t.add"].s(1)).apply_async()
    setup.task_ids += every_id(sent)
    waiting, running = sent.parent, sent.parent.parent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)   # Celery's, as above
        wait_for(lambda: Path(marker).exists(), 60, "the first step to run",
                 detail=setup.output)
        app.control.revoke(running.id)              # running: goes on, as in Celery
        app.control.revoke(waiting.id)              # pending: never runs

        def states() -> dict[str, str]:
            run = runs.rows("recent_runs", dag_id="", state="", limit=1)[0]
            return {r["task_id"]: r["state"] for r in runs.rows("run_tis",
                                                                run_id=run["run_id"])}
        wait_for(lambda: states().get("add-1") == "cancelled", 30, "the revoke",
                 detail=setup.output)
        Path(release).write_text("go")
        with pytest.raises(TaskRevokedError):
            waiting.get(timeout=60)
        assert running.get(timeout=60) == "released"
        gc.collect()
    wait_for(lambda: runs.rows("recent_runs", dag_id="", state="", limit=1)[0]["state"]
             == "failed", 30, "the run to end")
    assert states() == {"wait_for_file-0": "success", "add-1": "cancelled",
                        "add-2": "upstream_failed"}


@pytest.mark.parametrize("setup", ["redis"], indirect=True)
def test_a_scheduler_killed_between_steps_of_a_celery_chain_loses_and_repeats_nothing(
        setup: Setup, runs: Runs, tmp_path: Path) -> None:  # noqa: F811
    """SIGKILL of the scheduler running a Celery chain's run, with step one done and step two
    claimed, not published (tests/integration/scheduler_crashing.py): the next scheduler
    publishes step two after the claim's lease; the producer's get() returns the last step's
    result, and each step ran once."""
    ledger = str(tmp_path / "ledger")
    app = setup.app

    def step(task: str, token: str) -> Any:
        return app.signature(task, args=(ledger, token), immutable=True)
    stop(runs.scheduler)                  # the fixture's, replaced by one that dies
    env = worker_env(setup.conveyor_url, **runs.env)
    runs.scheduler = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.scheduler_crashing"], cwd=ROOT,
        env={**env, "CONVEYOR_TEST_DIE_PUBLISHING": "record-1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    setup.worker(**runs.env)
    sent = chain(step("t.record", "one"), step("t.record", "two"),
                 step("t.record", "three")).apply_async()
    setup.task_ids += every_id(sent)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)   # Celery's, as above
        assert runs.scheduler.wait(60) == -9, "the scheduler should have died at step two"
        (run,) = runs.rows("recent_runs", dag_id="", state="", limit=5)
        tis = {r["task_id"]: r for r in runs.rows("run_tis", run_id=run["run_id"])}
        assert (tis["record-0"]["state"], tis["record-1"]["state"],
                tis["record-1"]["published_at"]) == ("success", "queued", None)
        runs.scheduler = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "scheduler"], cwd=ROOT, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert setup.get(sent, 90) == "three", setup.output()
        assert sent.parent.get(timeout=10) == "two"
        gc.collect()
    (run,) = runs.rows("recent_runs", dag_id="", state="", limit=5)
    assert run["state"] == "success"
    lines = Counter(" ".join(line.split()[:2]) for line in Path(ledger).read_text().splitlines())
    assert lines == {"start one": 1, "done one": 1, "start two": 1, "done two": 1,
                     "start three": 1, "done three": 1}
