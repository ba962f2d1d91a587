"""The three pages as HTML strings: Runs, a run's Timeline, Fleet. Pure (rows and models in, text out).

Server-rendered with no script, so a page is one request and what a test asserts on is what the server sent. Every
value from a run or the cloud is HTML-escaped. Links are absolute paths under the app's mount point (``root``, the
``root_path`` the api-server gives the mounted app), so they work inside the UI's iframe and behind a proxy prefix.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from urllib.parse import quote, urlencode

from interlude.ui.fleet import FleetRow, clock
from interlude.ui.runs import DAGS, RunRow
from interlude.ui.timeline import Timeline

URL_PREFIX = "/interlude"
"""Where the api-server mounts the app (AirflowPlugin.fastapi_apps' url_prefix); the extra link points under it."""

STATES = ("queued", "running", "success", "failed")

STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1b1f24}
nav a{margin-right:14px;font-weight:600}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
.state-success{color:#1a7f37}.state-failed{color:#cf222e}.state-running{color:#0969da}
.muted{color:#57606a}
form{margin:10px 0}
"""


def _e(text: object) -> str:
    return escape("" if text is None else str(text), quote=True)


def timeline_href(root: str, dag_id: str, run_id: str) -> str:
    """The timeline page of one run (the extra link and the Runs page point here)."""
    return f"{root}/timeline/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def _page(root: str, title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body>"
        f'<nav><a href="{_e(root)}/runs">Runs</a><a href="{_e(root)}/fleet">Fleet</a></nav>'
        f"<h1>{_e(title)}</h1>{body}</body></html>"
    )


def _when(at: float | None) -> str:
    return "" if at is None else dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _select(name: str, options: Sequence[str], chosen: str | None) -> str:
    items = [f'<option value=""{"" if chosen else " selected"}>any</option>']
    items += [f'<option value="{_e(o)}"{" selected" if o == chosen else ""}>{_e(o)}</option>' for o in options]
    return f'<label>{name} <select name="{name}" id="filter-{name}">{"".join(items)}</select></label> '


def runs_page(
    root: str, rows: Sequence[RunRow], dag_id: str | None, state: str | None, dags: Sequence[str] = DAGS
) -> str:
    """The Runs table, newest first, with the DAG and state filters as a GET form."""
    head = (
        "<tr><th>DAG</th><th>run</th><th>state</th><th>platform</th><th>accelerator</th><th>zone</th>"
        "<th>steps</th><th>events</th><th>goodput</th><th>started (UTC)</th><th>more</th></tr>"
    )
    body = []
    for r in rows:
        goodput = "" if r.goodput is None else f"{r.goodput:.1%}"
        events = "" if r.events is None else str(r.events)
        body.append(
            f'<tr class="run" data-dag-id="{_e(r.dag_id)}" data-run-id="{_e(r.run_id)}" data-state="{_e(r.state)}">'
            f"<td>{_e(r.dag_id)}</td>"
            f'<td><a class="timeline-link" href="{_e(timeline_href(root, r.dag_id, r.run_id))}">{_e(r.run_id)}</a></td>'
            f'<td class="state state-{_e(r.state)}">{_e(r.state)}</td><td>{_e(r.platform)}</td>'
            f'<td>{_e(r.accelerator)}</td><td>{_e(r.zone)}</td><td class="steps">{_e(r.steps)}</td>'
            f'<td class="events">{_e(events)}</td><td class="goodput">{_e(goodput)}</td><td>{_e(_when(r.start))}</td>'
            f'<td class="muted">{_e(r.detail)}</td></tr>'
        )
    form = (
        f'<form method="get" action="{_e(root)}/runs">{_select("dag_id", dags, dag_id)}'
        f'{_select("state", STATES, state)}<button type="submit">Filter</button></form>'
    )
    count = f'<p class="muted" id="run-count">{len(rows)} run(s)</p>'
    table = f'<table id="runs"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    return _page(root, "Interlude runs", form + count + table)


def timeline_page(root: str, dag_id: str, run_id: str, tl: Timeline | None, svg: str, notes: Sequence[str]) -> str:
    """One run's picture, its figures as text beside it (the same numbers the hover text gives)."""
    back = f'<p class="muted">{_e(dag_id)} / {_e(run_id)}'
    back += f' - <a href="{_e(root)}/runs?{urlencode({"dag_id": dag_id})}">all runs of this DAG</a></p>'
    if tl is None:
        return _page(root, "Run timeline", back + "".join(f'<p class="note">{_e(n)}</p>' for n in notes))
    facts = [f'<li id="headline">{_e(tl.headline())}</li>']
    facts += [f'<li class="event-line">{_e(e.title)}</li>' for e in tl.events]
    facts += [f'<li class="move-line">{_e(m.title)}</li>' for m in tl.moves]
    facts += [f'<li class="fallback-line">{_e(text)}</li>' for _, text in tl.fallbacks]
    facts += [f'<li class="node-step-line">{_e(text)}</li>' for _, text in tl.node_steps]
    if tl.badput:
        facts.append("<li>badput: " + _e(", ".join(f"{k} {v:.1f} s" for k, v in tl.badput)) + "</li>")
    notes_html = "".join(f'<p class="note muted">{_e(n)}</p>' for n in [*notes, *tl.notes])
    return _page(
        root, f"Run timeline: {run_id}", back + f'<div id="timeline">{svg}</div><ul>{"".join(facts)}</ul>' + notes_html
    )


def fleet_page(root: str, rows: Sequence[FleetRow], now: float, errors: Sequence[str]) -> str:
    """Machines and serving nodes, upcoming maintenance soonest first, and Interlude's plan for each."""
    head = (
        "<tr><th>what</th><th>name</th><th>where</th><th>accelerator</th><th>run</th><th>state</th>"
        "<th>maintenance window (UTC)</th><th>notice</th><th>Interlude will</th></tr>"
    )
    body = []
    for r in rows:
        window = clock(r.window_start) + (f" - {clock(r.window_end)}" if r.window_end is not None else "")
        body.append(
            f'<tr class="fleet-row" data-what="{_e(r.what)}" data-name="{_e(r.name)}" '
            f'data-window-start="{"" if r.window_start is None else f"{r.window_start:.0f}"}">'
            f"<td>{_e(r.what)}</td><td>{_e(r.name)}</td><td>{_e(r.where)}</td><td>{_e(r.accelerator)}</td>"
            f'<td>{_e(r.run)}</td><td>{_e(r.state)}</td><td class="window">{_e(window)}</td>'
            f'<td>{_e(r.notice)}</td><td class="action">{_e(r.action)}</td></tr>'
        )
    problems = "".join(f'<p class="note muted">could not look: {_e(e)}</p>' for e in errors)
    intro = f'<p class="muted" id="fleet-count">{len(rows)} watched, as of {_e(clock(now))}</p>'
    table = f'<table id="fleet"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    return _page(root, "Interlude fleet", intro + table + problems)
