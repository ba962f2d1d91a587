"""Draw a `Timeline` as one SVG string, server-side: no script, no charting library, nothing for the UI to ship.

Pure (model in, text out). Every mark carries a class and ``data-*`` attributes a test (or a person's devtools) can
find it by, and a ``<title>`` child: browsers show it as hover text, so the figures are one pointer away
(https://developer.mozilla.org/en-US/docs/Web/SVG/Element/title). Text is XML-escaped: stage names, reasons and node
names come from the run and the cloud.
"""

from __future__ import annotations

from html import escape

from interlude.ui.timeline import EventMark, Move, PodLane, StageLane, Timeline

WIDTH = 1100
LEFT = 150  # lane labels
RIGHT = 20
LANE_H = 64
TOP = 46  # the headline
AXIS_H = 34
LEGEND_H = 46  # two rows of swatches

COLOURS = {
    "lane": "#f4f6f8",
    "steps": "#1f6feb",
    "tick": "#0b3d91",
    "notice": "#f2c94c",
    "down": "#eb5757",
    "restore": "#9b51e0",
    "recompute": "#f2994a",
    "move": "#27ae60",
    "pods": "#2d9cdb",
    "fallback": "#e67e22",
    "node_step": "#6d4c41",
}

LEGEND = (
    ("steps", "steps over time"),
    ("tick", "committed checkpoint"),
    ("notice", "notice"),
    ("down", "down"),
    ("restore", "restore"),
    ("recompute", "recomputed steps"),
    ("move", "failover move"),
    ("pods", "serving pods"),
    ("fallback", "fallback"),
    ("node_step", "node maintenance step"),
)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _title(text: str) -> str:
    return f"<title>{_e(text)}</title>"


class _Scale:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.span = start, max(end - start, 1e-6)

    def x(self, t: float) -> float:
        return round(LEFT + (t - self.start) / self.span * (WIDTH - LEFT - RIGHT), 2)

    def rel(self, t: float) -> str:
        return f"+{t - self.start:.1f} s"


def _axis(scale: _Scale, y: float) -> list[str]:
    out = [f'<g class="axis"><line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}" stroke="#888"/>']
    for i in range(6):
        t = scale.start + scale.span * i / 5
        x = scale.x(t)
        out.append(f'<line x1="{x}" y1="{y}" x2="{x}" y2="{y + 5}" stroke="#888"/>')
        out.append(f'<text x="{x}" y="{y + 18}" font-size="11" text-anchor="middle">{_e(scale.rel(t))}</text>')
    out.append("</g>")
    return out


def _polyline(points: list[tuple[float, float]], colour: str, css: str, title: str) -> str:
    text = " ".join(f"{x},{y}" for x, y in points)
    return (
        f'<polyline class="{css}" points="{text}" fill="none" stroke="{colour}" stroke-width="2">'
        f"{_title(title)}</polyline>"
    )


def _legend(y: float) -> list[str]:
    """Swatches in rows that fit the width."""
    out = [f'<g class="legend" transform="translate({LEFT},{y})">']
    x, row = 0.0, 0
    for key, label in LEGEND:
        width = 22 + 6.2 * len(label)
        if x and x + width > WIDTH - LEFT - RIGHT:
            x, row = 0.0, row + 1
        yy = row * 16
        out.append(
            f'<g class="legend-item" data-key="{key}"><rect x="{x}" y="{yy}" width="12" height="12" '
            f'fill="{COLOURS[key]}"/><text x="{x + 16}" y="{yy + 10}" font-size="11">{_e(label)}</text></g>'
        )
        x += width
    out.append("</g>")
    return out


def _lane_box(y: float, label: str) -> str:
    return (
        f'<rect x="{LEFT}" y="{y + 2}" width="{WIDTH - LEFT - RIGHT}" height="{LANE_H - 4}" fill="{COLOURS["lane"]}"/>'
        f'<text x="8" y="{y + LANE_H / 2 + 4}" font-size="13">{_e(label)}</text>'
    )


def _level(y: float, value: float, top: float) -> float:
    """The height of `value` (0..top) inside the lane that starts at y."""
    return round(y + LANE_H - 8 - value / top * (LANE_H - 20), 2)


def _header(tl: Timeline) -> list[str]:
    out = [f'<text class="headline" x="{LEFT}" y="20" font-size="14" font-weight="bold">{_e(tl.headline())}</text>']
    if tl.goodput is not None:
        bad = ", ".join(f"{k} {v:.1f} s" for k, v in tl.badput if v) or "none"
        hover = f"goodput {tl.goodput:.2%} of {tl.wall_seconds or 0:.1f} s wall; badput: {bad}"
        out.append(
            f'<text class="goodput" x="{LEFT}" y="38" font-size="12" data-goodput="{tl.goodput:.4f}">'
            f"goodput {tl.goodput:.1%}{_title(hover)}</text>"
        )
    return out


def _stage_lane(lane: StageLane, y: float, scale: _Scale) -> list[str]:
    top = max(lane.steps, max((s for _, s in lane.points), default=0), 1)
    points = [(scale.x(t), _level(y, s, top)) for t, s in lane.points]
    out = [f'<g class="lane stage" data-stage="{_e(lane.stage)}">{_title(lane.title)}', _lane_box(y, lane.stage)]
    out.append(_polyline(points, COLOURS["steps"], "steps", f"{lane.stage}: steps over time, {lane.steps} in all"))
    for tick in lane.ticks:
        x = scale.x(tick.at)
        out.append(
            f'<line class="tick" data-step="{tick.step}" x1="{x}" y1="{y + 4}" x2="{x}" y2="{y + 14}" '
            f'stroke="{COLOURS["tick"]}" stroke-width="2">'
            f"{_title(f'{tick.stage}: checkpoint step {tick.step} committed at {scale.rel(tick.at)}')}</line>"
        )
    out.append("</g>")
    return out


def _event(ev: EventMark, y: float, scale: _Scale) -> list[str]:
    out = [
        f'<g class="event" data-event-id="{_e(ev.event_id)}" data-kind="{_e(ev.kind)}" data-stage="{_e(ev.stage)}">'
        f"{_title(ev.title)}"
    ]
    for band in ev.bands:
        x0, x1 = scale.x(band.start), scale.x(band.end)
        out.append(
            f'<rect class="band band-{band.kind}" data-kind="{band.kind}" x="{x0}" y="{y + 16}" '
            f'width="{max(x1 - x0, 1.5):.2f}" height="{LANE_H - 28}" fill="{COLOURS[band.kind]}" '
            f'fill-opacity="0.65">{_title(band.title)}</rect>'
        )
    if ev.recompute is not None:
        r = ev.recompute
        x0, x1 = scale.x(r.start), scale.x(r.end)
        out.append(
            f'<rect class="recompute" data-steps="{r.steps}" x="{x0}" y="{y + LANE_H - 14}" '
            f'width="{max(x1 - x0, 1.5):.2f}" height="8" fill="{COLOURS["recompute"]}">{_title(r.title)}</rect>'
        )
    out.append("</g>")
    return out


def _move(move: Move, y: float, scale: _Scale) -> str:
    x, colour = scale.x(move.at), COLOURS["move"]
    return (
        f'<g class="move" data-from="{_e(move.source)}" data-to="{_e(move.target)}">{_title(move.title)}'
        f'<line x1="{x}" y1="{y + 2}" x2="{x}" y2="{y + LANE_H - 2}" stroke="{colour}" '
        f'stroke-width="3" stroke-dasharray="5,3"/>'
        f'<text x="{x + 4}" y="{y + 14}" font-size="10" fill="{colour}">{_e("-> " + move.target)}</text></g>'
    )


def _pod_lane(pods: PodLane, y: float, top: float, scale: _Scale) -> list[str]:
    points: list[tuple[float, float]] = []
    for t, n in pods.points:  # a step chart: the count holds until the next change
        if points:
            points.append((scale.x(t), points[-1][1]))
        points.append((scale.x(t), _level(y, n, top)))
    out = [f'<g class="lane pods" data-accelerator="{_e(pods.accelerator)}">{_title(pods.title)}']
    out += [_lane_box(y, "pods on " + pods.accelerator), _polyline(points, COLOURS["pods"], "pod-count", pods.title)]
    for t, n in pods.points:
        out.append(
            f'<circle class="pod-sample" data-count="{n}" cx="{scale.x(t)}" cy="{_level(y, n, top)}" r="3" '
            f'fill="{COLOURS["pods"]}">{_title(f"{pods.accelerator}: {n} running at {scale.rel(t)}")}</circle>'
        )
    out.append("</g>")
    return out


def _marks(
    css: str, colour: str, marks: tuple[tuple[float, str], ...], top: float, bottom: float, scale: _Scale
) -> list[str]:
    out = []
    for at, text in marks:
        x = scale.x(at)
        out.append(
            f'<g class="{css}">{_title(f"{scale.rel(at)}: {text}")}<line x1="{x}" y1="{top}" x2="{x}" '
            f'y2="{bottom}" stroke="{colour}" stroke-width="2" stroke-dasharray="2,2"/>'
            f'<polygon points="{x - 5},{top} {x + 5},{top} {x},{top + 8}" fill="{colour}"/></g>'
        )
    return out


def render(tl: Timeline) -> str:
    """The whole picture: headline with the goodput figure, a lane per stage (then per accelerator), the event
    bands, checkpoint ticks, recomputed steps, moves, fallbacks and node steps, a time axis and a legend."""
    scale = _Scale(tl.start, tl.end)
    bottom = TOP + max(len(tl.lanes) + len(tl.pods), 1) * LANE_H
    height = bottom + AXIS_H + LEGEND_H
    body: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="interlude-timeline" role="img" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" data-run-key="{_e(tl.run_key)}" '
        f'font-family="sans-serif">',
        _title(f"{tl.run_key}: {tl.headline()}"),
        *_header(tl),
    ]
    row = {lane.stage: TOP + i * LANE_H for i, lane in enumerate(tl.lanes)}
    for lane in tl.lanes:
        body += _stage_lane(lane, row[lane.stage], scale)
    for ev in tl.events:
        body += _event(ev, row.get(ev.stage, TOP), scale)
    body += [_move(m, row.get(m.stage, TOP), scale) for m in tl.moves]
    base = TOP + len(tl.lanes) * LANE_H
    top_pods = max((n for lane in tl.pods for _, n in lane.points), default=0) or 1
    for i, pods in enumerate(tl.pods):
        body += _pod_lane(pods, base + i * LANE_H, top_pods, scale)
    body += _marks("fallback", COLOURS["fallback"], tl.fallbacks, base, bottom, scale)
    body += _marks("node-step", COLOURS["node_step"], tl.node_steps, base, bottom, scale)
    body += _axis(scale, bottom + 4)
    body += _legend(bottom + AXIS_H)
    body.append("</svg>")
    return "".join(body)
