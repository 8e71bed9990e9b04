"""The dashboard's pure parts: routing, the token and same-origin checks, the graph layout."""

from __future__ import annotations

import json

import pytest

from conveyor.ui import auth, graph
from conveyor.ui.html import e
from conveyor.ui.http import HttpError, Request, Response, Router


def handler(*args: object, **params: str) -> Response:
    return Response.json(params)


def test_routes_match_segments_and_say_which_methods_a_path_takes() -> None:
    router = Router()
    router.add("GET", "/runs/{run_id}", handler)
    router.add("POST", "/api/runs/{run_id}/clear", handler, action=True)
    route, params = router.match("GET", "/runs/a%2Fb")
    assert params == {"run_id": "a/b"} and not route.action
    assert router.match("POST", "/api/runs/x/clear")[0].action
    with pytest.raises(HttpError) as wrong_method:
        router.match("POST", "/runs/x")
    assert wrong_method.value.status == 405 and "takes GET" in wrong_method.value.message
    with pytest.raises(HttpError) as missing:
        router.match("GET", "/runs/x/y")
    assert missing.value.status == 404


def post(headers: dict[str, str], body: dict[str, str] | None = None) -> Request:
    return Request("POST", "/api/x", headers={"host": "127.0.0.1:8700", **headers},
                   body=json.dumps(body or {}).encode())


@pytest.mark.parametrize(("token", "headers", "status", "says"), [
    ("", {"x-conveyor-token": "s3cret"}, 403, "read-only"),
    ("s3cret", {}, 401, "needs the operator's token"),
    ("s3cret", {"x-conveyor-token": "guess"}, 403, "wrong token"),
    ("s3cret", {"x-conveyor-token": "s3cret", "origin": "http://evil.example"}, 403,
     "cross-site"),
    ("s3cret", {"x-conveyor-token": "s3cret", "sec-fetch-site": "cross-site"}, 403,
     "cross-site"),
    ("s3cret", {"x-conveyor-token": "s3cret", "origin": "null"}, 403, "cross-site"),
])
def test_an_action_is_refused_without_the_right_token_from_this_origin(
        token: str, headers: dict[str, str], status: int, says: str) -> None:
    with pytest.raises(HttpError) as refused:
        auth.check_action(post({"content-type": "application/json", **headers}), token)
    assert refused.value.status == status and says in refused.value.message


def test_an_action_with_the_token_from_this_origin_or_in_the_body_passes() -> None:
    auth.check_action(post({"x-conveyor-token": "s3cret", "origin": "http://127.0.0.1:8700",
                            "sec-fetch-site": "same-origin"}), "s3cret")
    auth.check_action(post({"content-type": "application/json"}, {"token": "s3cret"}),
                      "s3cret")


def test_layers_put_every_edge_left_to_right_and_parents_beside_children() -> None:
    tasks = ["a", "b", "c", "d", "e"]
    edges = [("a", "c"), ("b", "c"), ("c", "d"), ("a", "d"), ("e", "d")]
    boxes = graph.layout(tasks, edges)
    assert {t: b.layer for t, b in boxes.items()} == {"a": 0, "b": 0, "e": 0, "c": 1, "d": 2}
    assert all(boxes[up].x < boxes[down].x for up, down in edges)
    assert len({(b.layer, b.row) for b in boxes.values()}) == len(tasks)


def test_a_long_chain_lays_out_without_recursion_and_draws_every_edge() -> None:
    tasks = [f"t{i}" for i in range(3000)]
    edges = list(zip(tasks, tasks[1:], strict=False))
    drawing = graph.svg(tasks, edges, lambda t: "success", lambda t: f"/x/{t}")
    assert graph.layout(tasks, edges)["t2999"].layer == 2999
    assert drawing.count('class="edge"') == len(edges)


def test_task_ids_are_escaped_in_the_drawing() -> None:
    drawing = graph.svg(['<b>"x"'], [], lambda t: "failed", lambda t: "/t?a=1&b=2")
    assert "<b>" not in drawing and "&lt;b&gt;" in drawing and "a=1&amp;b=2" in drawing
    assert e("<script>") == "&lt;script&gt;" and e(None) == ""
