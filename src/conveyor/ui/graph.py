"""A DAG laid out in layers, left to right, and drawn as SVG on the server.

Each task's layer is the longest path to it from a root, so every edge points right. Within a
layer tasks are ordered by the mean position of their parents (the barycentre heuristic of
Sugiyama-style layouts, one sweep), which keeps most edges short and uncrossed. Pure: ids and
edges in, coordinates and markup out; nothing here reads a store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

NODE_W, NODE_H = 170, 34
GAP_X, GAP_Y = 60, 14
MARGIN = 10
#: Characters of a task id a box shows; the whole id is in its tooltip.
LABEL = 22


@dataclass(frozen=True)
class Box:
    task_id: str
    layer: int
    row: int

    @property
    def x(self) -> int:
        return MARGIN + self.layer * (NODE_W + GAP_X)

    @property
    def y(self) -> int:
        return MARGIN + self.row * (NODE_H + GAP_Y)


def layers(tasks: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each task's layer: 0 for a root, else one more than its deepest parent (Kahn's
    topological walk: no recursion, so a 200-task chain is as easy as a fan-out)."""
    parents, children = _links(tasks, edges)
    waiting = {t: len(parents[t]) for t in tasks}
    ready = [t for t in tasks if not waiting[t]]
    depth = dict.fromkeys(ready, 0)
    for node in ready:   # grows while walking
        for child in children[node]:
            depth[child] = max(depth.get(child, 0), depth[node] + 1)
            waiting[child] -= 1
            if not waiting[child]:
                ready.append(child)
    return {t: depth.get(t, 0) for t in tasks}   # a cycle (not in a valid DAG) stays left


def _links(tasks: Sequence[str], edges: Sequence[tuple[str, str]]
           ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(parents, children) of each task, edges to unknown tasks left out."""
    parents: dict[str, list[str]] = {t: [] for t in tasks}
    children: dict[str, list[str]] = {t: [] for t in tasks}
    for up, down in edges:
        if up in parents and down in parents:
            parents[down].append(up)
            children[up].append(down)
    return parents, children


def layout(tasks: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, Box]:
    """Every task's box: its layer, and its row within the layer."""
    depth = layers(tasks, edges)
    parents = _links(tasks, edges)[0]
    boxes: dict[str, Box] = {}
    for layer in range(max(depth.values(), default=-1) + 1):
        members = [t for t in tasks if depth[t] == layer]   # declaration order breaks ties
        ranked = sorted(enumerate(members), key=lambda m: (_centre(m, parents, boxes), m[0]))
        for row, (_, task) in enumerate(ranked):
            boxes[task] = Box(task, layer, row)
    return boxes


def _centre(member: tuple[int, str], parents: dict[str, list[str]],
            boxes: dict[str, Box]) -> float:
    """Where a task wants to sit: the mean row of its parents (its own index if a root)."""
    rows = [boxes[p].row for p in parents[member[1]] if p in boxes]
    return sum(rows) / len(rows) if rows else float(member[0])


def svg(tasks: Sequence[str], edges: Sequence[tuple[str, str]], state: Callable[[str], str],
        link: Callable[[str], str]) -> str:
    """The DAG as an SVG element: a box per task (class `st-<state>`, a link to `link(task)`),
    an arrow per edge."""
    boxes = layout(tasks, edges)
    width = max((b.x for b in boxes.values()), default=0) + NODE_W + MARGIN
    height = max((b.y for b in boxes.values()), default=0) + NODE_H + MARGIN
    parts = [f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="DAG graph, {len(boxes)} tasks">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
             'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>']
    for up, down in edges:
        if up in boxes and down in boxes:
            parts.append(_edge(boxes[up], boxes[down]))
    for task in tasks:
        parts.append(_node(boxes[task], state(task), link(task)))
    parts.append("</svg>")
    return "".join(parts)


def _edge(a: Box, b: Box) -> str:
    x1, y1 = a.x + NODE_W, a.y + NODE_H // 2
    x2, y2 = b.x, b.y + NODE_H // 2
    bend = (x2 - x1) // 2
    return (f'<path class="edge" d="M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}" '
            f'marker-end="url(#arrow)"/>')


def _node(box: Box, state: str, href: str) -> str:
    label = box.task_id if len(box.task_id) <= LABEL else box.task_id[:LABEL - 1] + "…"
    return (f'<a href="{escape(href)}" class="node st-{escape(state)}" '
            f'data-task="{escape(box.task_id)}"><title>{escape(box.task_id)}: '
            f'{escape(state)}</title><rect x="{box.x}" y="{box.y}" width="{NODE_W}" '
            f'height="{NODE_H}" rx="5"/><text x="{box.x + 10}" y="{box.y + NODE_H // 2 + 5}">'
            f'{escape(label)}</text></a>')
