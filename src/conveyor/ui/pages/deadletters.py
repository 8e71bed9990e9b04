"""Dead letters: the list with reasons (by queue and reason), one message's preview, and
requeue or purge, one at a time or every one whose reason matches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.broker import Administrator
from conveyor.readers import deadletters as dead
from conveyor.readers.queues import known_queues
from conveyor.ui.html import action_form, e, seg, select, table, url
from conveyor.ui.http import HttpError, Request, Response

if TYPE_CHECKING:
    from conveyor.ui.app import Dashboard

#: Dead letters listed per queue unless asked (`limit`), and the most.
LIMIT, MAX_LIMIT = 100, 10_000
#: Ids per requeue or purge call.
BATCH = 500

Action = Callable[[Administrator, str, Sequence[str] | None], int]
#: What each verb did, said in its answer.
DONE = {"requeue": "requeued", "purge": "deleted"}


def register(ui: Dashboard) -> None:
    ui.add_nav("Dead letters", "/dead-letters")
    ui.router.add("GET", "/dead-letters", list_page)
    ui.router.add("GET", "/api/dead-letters", list_api)
    ui.router.add("GET", "/dead-letters/{queue}/{dead_id}", one_page)
    ui.router.add("GET", "/api/dead-letters/{queue}/{dead_id}", one_api)
    ui.router.add("POST", "/api/dead-letters/requeue", requeue, action=True)
    ui.router.add("POST", "/api/dead-letters/purge", purge, action=True)


def queues(ui: Dashboard, chosen: str) -> list[str]:
    """The queue asked for, or every queue worth looking at."""
    return [chosen] if chosen else every_queue(ui)


def every_queue(ui: Dashboard) -> list[str]:
    """Queues in use and, as `conveyor dead-letters list` shows them, every queue the broker
    says holds dead letters (one no live worker consumes included)."""
    with ui.store() as store, ui.broker() as broker:
        return known_queues(store, ui.config.extra_queues, broker=broker)


def listing(ui: Dashboard, request: Request) -> tuple[list[str], list[dict[str, Any]]]:
    names = queues(ui, request.arg("queue"))
    limit = request.int_arg("limit", LIMIT, 1, MAX_LIMIT)
    with ui.broker() as broker:
        rows = [dead.summary(d) for q in names
                for d in dead.select(broker, q, reason=request.arg("reason"), limit=limit)]
    return names, rows


def list_api(ui: Dashboard, request: Request) -> Response:
    """Dead letters of the queues in use (or `queue`), whose reason contains `reason`."""
    names, rows = listing(ui, request)
    return Response.json({"queues": names, "dead_letters": rows})


def list_page(ui: Dashboard, request: Request) -> Response:
    names, rows = listing(ui, request)
    every = every_queue(ui)
    queue, reason = request.arg("queue"), request.arg("reason")
    body = (f"<h1>Dead letters</h1>{_filters(every, queue, reason)}"
            + _bulk(queue, reason, len(rows))
            + table(["id", "queue", "task", "deliveries", "dead at", "reason", ""],
                    (_row(r) for r in rows), cls="dead",
                    empty=f"no dead letter in {', '.join(names)}"
                          + (f" whose reason contains {reason!r}" if reason else "")))
    return ui.page(request, "Dead letters", body, active="/dead-letters",
                   poll=url("/api/dead-letters", queue=queue, reason=reason))


def _filters(every: list[str], queue: str, reason: str) -> str:
    return ('<form class="filters" method="get" action="/dead-letters">'
            f'<label>queue {select("queue", every, queue, blank="all in use")}</label>'
            f'<label>reason contains <input name="reason" value="{e(reason)}" size="30">'
            '</label><button type="submit">Filter</button></form>')


def _bulk(queue: str, reason: str, count: int) -> str:
    """Requeue or purge every one the reason filter matches."""
    if not reason or not count:
        return ""
    fields = {"queue": queue, "reason": reason}
    what = f"the dead letters whose reason contains {reason!r}"
    return ('<p class="bulk">' + action_form("/api/dead-letters/requeue",
                                              f"Requeue all {count} matching", fields=fields,
                                              confirm=f"Requeue {what}?")
            + " " + action_form("/api/dead-letters/purge", f"Purge all {count} matching",
                                fields=fields, confirm=f"Delete {what} for good?") + "</p>")


def _row(r: dict[str, Any]) -> list[str]:
    fields = {"queue": r["queue"], "id": r["id"]}
    return [f'<a href="/dead-letters/{seg(r["queue"])}/{seg(r["id"])}">{e(r["id"])}</a>',
            e(r["queue"]), e(r["task"]), e(r["deliveries"]), e(r["dead_at"][:19]),
            f'<span class="reason">{e(r["reason"])}</span>',
            action_form("/api/dead-letters/requeue", "Requeue", fields=fields)
            + " " + action_form("/api/dead-letters/purge", "Purge", fields=fields,
                                confirm=f"Delete dead letter {r['id']} for good?")]


def _find(ui: Dashboard, queue: str, dead_id: str) -> Any:
    with ui.broker() as broker:
        found = [d for d in broker.dead_letters(queue, limit=dead.SCAN)
                 if dead_id in (d.id, dead.message_id(d))]
    if not found:
        raise HttpError(404, f"no dead letter {dead_id!r} in queue {queue!r} (requeued or "
                        "purged already?)")
    return found[0]


def one_api(ui: Dashboard, request: Request, queue: str, dead_id: str) -> Response:
    """One dead letter: its summary, its body as JSON when it is, and a safe preview."""
    letter = _find(ui, queue, dead_id)
    return Response.json({**dead.summary(letter), "body_bytes": len(letter.body),
                          "body": dead.parsed(letter.body),
                          "preview": dead.body_preview(letter.body)})


def one_page(ui: Dashboard, request: Request, queue: str, dead_id: str) -> Response:
    letter = _find(ui, queue, dead_id)
    doc = dead.summary(letter)
    fields = {"queue": queue, "id": letter.id}
    facts = "".join(f"<dt>{e(k.replace('_', ' '))}</dt><dd>{e(doc[k])}</dd>"
                    for k in ("queue", "task", "message_id", "deliveries", "dead_at"))
    header, *rest = dead.body_preview(letter.body)
    body = (f'<p class="crumbs"><a href="{url("/dead-letters", queue=queue)}">dead letters of '
            f'{e(queue)}</a></p><h1>Dead letter <code>{e(letter.id)}</code></h1>'
            f'<p class="reason-block">{e(letter.reason)}</p><dl class="facts">{facts}</dl>'
            f'<p>{action_form("/api/dead-letters/requeue", "Requeue", fields=fields)} '
            + action_form("/api/dead-letters/requeue", "Requeue with a fresh retry budget",
                          fields={**fields, "fresh": "1"}) + " "
            + action_form("/api/dead-letters/purge", "Purge", fields=fields,
                          confirm=f"Delete dead letter {letter.id} for good?")
            + f'</p><h2>{e(header)}</h2><pre class="body">{e(chr(10).join(rest))}</pre>')
    return ui.page(request, f"Dead letter {letter.id}", body, active="/dead-letters")


def requeue(ui: Dashboard, request: Request) -> Response:
    """Put dead letters back on their queue; body: {"queue", "id" or "ids" or "reason" or
    "all": true} (no queue: every queue in use). Each keeps its attempt count (one more try)
    unless "fresh": true, which starts it again at attempt 1 (a fresh retry budget)."""
    return _apply(ui, request, "requeue")


def purge(ui: Dashboard, request: Request) -> Response:
    """Delete dead letters for good; the same body as requeue."""
    return _apply(ui, request, "purge")


def _apply(ui: Dashboard, request: Request, verb: str) -> Response:
    doc = request.form()
    ids = [str(i) for i in doc.get("ids") or []] + ([str(doc["id"])] if doc.get("id") else [])
    reason = str(doc.get("reason") or "")
    every = doc.get("all") in (True, "true", "1")
    if not (ids or reason or every):
        raise HttpError(400, f"say which dead letters: id, ids, reason or all (nothing was "
                        f"{DONE[verb]})")
    done, how = DONE[verb], ""
    action: Action = lambda b, q, ids: b.purge_dead(q, ids)   # noqa: E731
    if verb == "requeue":
        fresh = doc.get("fresh") in (True, "true", "1")
        action = _requeue(ui, fresh)
        how = (" with a fresh retry budget (attempt 1)" if fresh else
               ", each keeping its attempt count: one more try each")
    counts: dict[str, int] = {}
    with ui.broker() as broker:
        for queue in queues(ui, str(doc.get("queue") or "")):
            counts[queue] = _apply_queue(broker, queue, ids, reason, every, action)
    total = sum(counts.values())
    return Response.json({done: total, "queues": counts,
                          "message": f"{done} {total} dead letter(s){how}"}
                         | ({"fresh": how.startswith(" with")} if how else {}))


def _requeue(ui: Dashboard, fresh: bool) -> Action:
    """Requeue (at attempt 1 when `fresh`; an `expires` counted again from now), with the
    codec (signing key) the workers read messages with."""
    codec = ui.config.scheduler.settings.codec()

    def requeue(broker: Administrator, queue: str, ids: Sequence[str] | None) -> int:
        chosen = None if ids is None else dead.select(broker, queue, ids)
        return dead.requeue(broker, queue, chosen, codec, fresh=fresh)[0]
    return requeue


def _apply_queue(broker: Administrator, queue: str, ids: list[str], reason: str, every: bool,
                 action: Action) -> int:
    if every and not ids and not reason:
        return action(broker, queue, None)
    chosen = [d.id for d in dead.select(broker, queue, ids, reason)]
    return sum(action(broker, queue, chosen[i:i + BATCH]) for i in range(0, len(chosen), BATCH))
