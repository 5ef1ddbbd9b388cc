"""show.py: one self-contained HTML page of a run's bi-level rollout tree, to read what the two
roles did.

It reads RUN_DIR/rollouts.jsonl, one JSON line per query per step, as train.py writes it:

    {"step": 3, "role": "executor" | "designer" | "designer+executor", "query": 0,
     "task": {"id": str, "kind": "math" | "code" | ..., "text": str, "gold": str or JSON},
     "R": M x N rewards (0 where no run happened),
     "scripts": M of {"text", "parsed", "error", "structure", "A_D",
                      "runs": N of {"calls": [{"role", "prompt": [{"role", "content"}], "reply"}],
                                    "answer", "correct", "format", "R", "A_E" (null: did not run),
                                    "error"}}]}

and RUN_DIR/metrics.jsonl when present (its step's key=value line heads each step). Per step and
query the page shows the task and the M x N grid: a row per design (structure, A_D, row mean R̄), a
cell per execution (R, A_E), coloured red -> green over R = 0..1.4, grey where no run happened.
Clicking a row opens the design's script and its parse error, clicking a cell that execution's calls
(every prompt message and the reply), its answer, correct, format and error. Panels are in the DOM
(hidden until opened) with stable ids, s{step}-q{query}-i{i} for a design and
s{step}-q{query}-i{i}-j{j} for an execution, and the page opens the one its URL hash names
(rollouts.html#s3-q0-i1-j0 opens that execution and its design). Filters hide queries by task kind
and role. Everything shown is escaped (model output is untrusted); no network, no fonts, nothing
outside the file. A malformed line of rollouts.jsonl is skipped and counted (page and stdout); of
metrics.jsonl, ignored.

    python tools/show.py out/tiny-rl                   # the last 3 steps ->
                                                       # out/tiny-rl/rollouts.html
    python tools/show.py out/tiny-rl --steps 10:12     # steps 10..12 (inclusive; also 10: and :12)

Needs: no other file of this project.
"""

import argparse
import html
import json
import os
import sys

RMAX = 1.4  # the top of the colour scale: correct + lambda * format at their best
# a metrics line's first keys
KEYS = (
    "step",
    "model",
    "active",
    "reward/mean",
    "accuracy",
    "parse_rate",
)

CSS = """body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}
pre{white-space:pre-wrap;word-break:break-word;background:#f5f5f5;padding:.4em .6em;margin:.2em 0;
max-height:28em;overflow:auto}
section.q{border:1px solid #ddd;border-radius:6px;padding:.3em 1em .6em;margin:.8em 0}
table.grid{border-collapse:collapse;margin:.5em 0}
.grid td,.grid th{border:1px solid #bbb;padding:3px 8px;text-align:center}
tr.row{cursor:pointer}tr.row:hover{background:#eef}td.cell{cursor:pointer;min-width:5em}
.sel{outline:2px solid #226}.panel{border-left:3px solid #48c;padding-left:.8em;margin:.6em 0}
.call{border-top:1px dashed #ccc;margin-top:.4em}.m{font-family:monospace;color:#555}
.err,.warn{color:#b00}"""

JS = """function mark(id,on){document.querySelectorAll('[data-open]').forEach(function(t){
if(t.dataset.open===id)t.classList.toggle('sel',on)})}
function toggle(id,on){var e=document.getElementById(id);if(!e)return null;e.hidden=!on;
e.classList.toggle('open',on);mark(id,on);return e}
document.addEventListener('click',function(ev){var t=ev.target.closest('[data-open]');if(!t)return;
var e=document.getElementById(t.dataset.open);toggle(t.dataset.open,!!e&&e.hidden)});
function fromHash(){var id=location.hash.slice(1);if(!id)return;
toggle(id.replace(/-j[0-9]+$/,''),true);
var e=toggle(id,true),s=document.getElementById(id.replace(/-i.*$/,''))||e;if(s)s.scrollIntoView()}
function filt(){var k=document.getElementById('kind').value,r=document.getElementById('role').value;
document.querySelectorAll('section.q').forEach(function(s){
s.hidden=(k&&s.dataset.kind!==k)||(r&&s.dataset.role.split('+').indexOf(r)<0)});
document.querySelectorAll('div.step').forEach(function(d){
d.hidden=!d.querySelector('section.q:not([hidden])')})}
document.getElementById('kind').onchange=document.getElementById('role').onchange=filt;
window.addEventListener('hashchange',fromHash);fromHash();"""


def esc(v):
    """Any value as escaped HTML text: strings as they are, None as a dash, anything else as
    JSON."""
    return (
        "—"
        if v is None
        else html.escape(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
    )


def fmt(v):
    return f"{v:.3g}" if isinstance(v, int | float) and not isinstance(v, bool) else esc(v)


def colour(r, ran):
    if not ran or not isinstance(r, int | float):
        return "#ddd"
    return f"hsl({120 * max(0.0, min(1.0, r / RMAX)):.0f},65%,78%)"


def run_panel(pid, i, j, run):
    calls = "".join(
        f'<div class="call"><b>call {k}: {esc(c.get("role"))}</b>'
        + "".join(
            f"<div><i>{esc(m.get('role'))}</i><pre>{esc(m.get('content'))}</pre></div>"
            for m in c.get("prompt") or []
        )
        + f'<div><i>reply</i><pre class="reply">{esc(c.get("reply"))}</pre></div></div>'
        for k, c in enumerate(run.get("calls") or [])
    )
    facts = " ".join(f"{k}={fmt(run.get(k))}" for k in ("correct", "format", "R", "A_E"))
    err = f'<p class="err">error: {esc(run["error"])}</p>' if run.get("error") else ""
    answer = esc(run.get("answer"))
    return (
        f'<div class="panel" id="{pid}" hidden><h4>design i={i}, execution j={j}</h4>'
        f'<p class="m">{facts}</p>{err}<div>answer:</div><pre>{answer}</pre>'
        f"{calls or '<p>no calls</p>'}</div>"
    )


def query_html(r):
    """One query's block: the task, the grid, and (hidden) every script and execution panel."""
    task, pid = r.get("task") or {}, f"s{int(r['step'])}-q{int(r['query'])}"
    n = max([len(d["runs"]) for d in r["scripts"]] or [0])
    rows, panels = [], []
    for i, d in enumerate(r["scripts"]):
        ri, cells = r["R"][i], ""
        err = f'<p class="err">parse error: {esc(d["error"])}</p>' if d.get("error") else ""
        panels.append(
            f'<div class="panel" id="{pid}-i{i}" hidden>'
            f"<h4>design i={i} script (parsed={fmt(d.get('parsed'))})</h4>"
            f'{err}<pre class="script">{esc(d.get("text"))}</pre></div>'
        )
        for j, run in enumerate(d["runs"]):
            cells += (
                f'<td class="cell" data-open="{pid}-i{i}-j{j}" style="background:'
                f'{colour(ri[j], run.get("A_E") is not None)}">{fmt(ri[j])}<br>'
                f"<small>A_E {fmt(run.get('A_E'))}</small></td>"
            )
            panels.append(run_panel(f"{pid}-i{i}-j{j}", i, j, run))
        mean = fmt(sum(ri) / len(ri) if ri else 0)
        rows.append(
            f'<tr class="row" data-open="{pid}-i{i}"><th>i={i}</th>'
            f"<td>{esc(d.get('structure'))}</td><td>A_D {fmt(d.get('A_D'))}</td>"
            f"<td>{mean}</td>{cells}</tr>"
        )
    head = "".join(f"<th>j={j}</th>" for j in range(n))
    where = f"step {int(r['step'])} · query {int(r['query'])}"
    what = f"{esc(task.get('kind'))} · {esc(task.get('id'))}"
    return (
        f'<section class="q" id="{pid}" data-kind="{esc(str(task.get("kind")))}" '
        f'data-role="{esc(str(r.get("role")))}"><h3>{where} · {what}</h3>'
        f'<pre class="task">{esc(task.get("text"))}</pre>'
        f'<div>gold:</div><pre class="gold">{esc(task.get("gold"))}</pre>'
        '<table class="grid"><tr><th>design</th>'
        f"<th>structure</th><th>A_D</th><th>R̄</th>{head}</tr>{''.join(rows)}</table>"
        f"{''.join(panels)}</section>"
    )


def metric_line(m):
    if not m:
        return '<p class="m">(no metrics.jsonl line for this step)</p>'
    first = " ".join(f"{k}={fmt(m[k])}" for k in KEYS if k in m)
    rest = " ".join(f"{k}={fmt(v)}" for k, v in m.items() if k not in KEYS)
    details = f'<details><summary>all metrics</summary><p class="m">{rest}</p></details>'
    return f'<p class="m">{first}</p>{details}'


def page(records, metrics=None, title="rollouts", skipped=0):
    """The HTML document of `records` (rollouts.jsonl dicts); metrics = {step: metrics.jsonl dict}
    or None."""
    metrics, steps = metrics or {}, sorted({r["step"] for r in records})
    kinds = sorted({str((r.get("task") or {}).get("kind")) for r in records})
    roles = set()
    for r in records:
        roles |= set(str(r.get("role")).split("+"))
    roles = sorted(roles)

    def opts(vs):
        return '<option value="">all</option>' + "".join(
            f'<option value="{esc(v)}">{esc(v)}</option>' for v in vs
        )

    body = "".join(
        f'<div class="step"><h2>step {s}</h2>{metric_line(metrics.get(s))}'
        + "".join(
            query_html(r) for r in sorted(records, key=lambda r: r["query"]) if r["step"] == s
        )
        + "</div>"
        for s in steps
    )
    warn = (
        f'<p class="warn">{skipped} malformed line(s) of rollouts.jsonl skipped</p>'
        if skipped
        else ""
    )
    span = f"steps {steps[0]}..{steps[-1]}, " if steps else ""
    head = f'<meta charset="utf-8"><title>{esc(title)}</title><style>{CSS}</style>'
    help_ = "Click a design's row for its script, a cell for that execution's calls."
    kind = f'<select id="kind">{opts(kinds)}</select>'
    role = f'<select id="role">{opts(roles)}</select>'
    return (
        f"<!DOCTYPE html><html><head>{head}</head><body><h1>{esc(title)}</h1>"
        f"<p>{span}{len(records)} queries. {help_}</p>{warn}<p>task kind {kind} role {role}</p>"
        f"{body}<script>{JS}</script></body></html>"
    )


def read_jsonl(path):
    """(the JSON-object lines of path, how many non-blank lines were not one)."""
    rows, skipped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in filter(str.strip, f):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                skipped += 1
    return rows, skipped


def renders(r):
    try:
        return isinstance(r["step"], int) and isinstance(r["query"], int) and bool(query_html(r))
    except (KeyError, TypeError, AttributeError, IndexError, ValueError):
        return False


def write(run_dir, steps=None):
    """run_dir/rollouts.html of the steps a..b (steps=(a, b), either None: open; default the last
    3)."""
    path = os.path.join(run_dir, "rollouts.jsonl")
    if not os.path.isdir(run_dir):
        raise SystemExit(f"show.py: no run folder {run_dir} (train.py makes it: its --out_dir)")
    if not os.path.exists(path):
        raise SystemExit(f"show.py: no {path} (train.py writes it as it trains)")
    rows, skipped = read_jsonl(path)
    good = [r for r in rows if renders(r)]
    skipped += len(rows) - len(good)
    present = sorted({r["step"] for r in good})
    if not present:
        raise SystemExit(
            f"show.py: {path} holds no rollout records ({skipped} malformed lines skipped)"
        )
    a, b = steps or (present[-3:][0], None)
    kept = [r for r in good if (a is None or r["step"] >= a) and (b is None or r["step"] <= b)]
    if not kept:
        raise SystemExit(
            f"show.py: no steps {a}..{b} in {path} (it has steps {present[0]}..{present[-1]})"
        )
    mpath = os.path.join(run_dir, "metrics.jsonl")
    metrics = (
        {m["step"]: m for m in read_jsonl(mpath)[0] if "step" in m} if os.path.exists(mpath) else {}
    )
    out = os.path.join(run_dir, "rollouts.html")
    with open(out, "w", encoding="utf-8") as f:
        f.write(
            page(kept, metrics, f"rollouts: {os.path.basename(os.path.normpath(run_dir))}", skipped)
        )
    if skipped:
        print(f"show.py: skipped {skipped} malformed line(s) of {path}")
    return out


def parse_steps(text):
    """'A:B' (inclusive), 'A:', ':B' or 'A' -> (a, b), None for an open end."""
    a, sep, b = text.partition(":")
    try:
        lo = int(a) if a.strip() else None
        hi = (int(b) if b.strip() else None) if sep else lo
    except ValueError:
        lo = hi = None
    if (lo is None and hi is None) or (lo is not None and hi is not None and lo > hi):
        raise SystemExit(f"show.py: bad --steps {text!r}: want A:B (inclusive, A <= B), A: or :B")
    return lo, hi


def main(argv):
    ap = argparse.ArgumentParser(
        prog="show.py", description="An HTML page of a run's rollout tree."
    )
    ap.add_argument("run_dir")
    ap.add_argument("--steps", help="A:B inclusive, A: or :B (default: the last 3 steps)")
    args = ap.parse_args(argv)
    path = write(args.run_dir, parse_steps(args.steps) if args.steps is not None else None)
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
