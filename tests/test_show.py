"""show.py: the rollout page from small synthetic records (2 steps x 2 queries, M=2 designs x N=2
executions, one unparsed script, hostile text), the file reading and the command line, and the page
rendered in a real headless Chromium, opened at a URL hash."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from tools import show

EVIL = '<script>alert(1)</script> & "q"'
EVIL_ESC = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;"
EVIL_DOM = EVIL_ESC.replace("&quot;", '"')  # a browser serialises text with " unescaped
A_D = (0.87, -0.87)
A_E = ((0.52, -0.31), (1.05, -1.26))  # per design i, per execution j


def record(step, query):
    """One query of one step; design i=1 of query 1 does not parse (its runs did not happen)."""
    scripts = []
    for i in range(2):
        parsed = not (query == 1 and i == 1)
        runs = []
        for j in range(2):
            tag = f"s{step}q{query}i{i}j{j}"
            if parsed:
                calls = [
                    {
                        "role": "coder",
                        "prompt": [
                            {"role": "system", "content": f"system {tag}"},
                            {"role": "user", "content": f"user {tag} {EVIL}"},
                        ],
                        "reply": f"reply {tag} {EVIL}",
                    }
                ]
                runs.append(
                    {
                        "calls": calls,
                        "answer": f"answer {tag}",
                        "correct": 1.0,
                        "format": 1.0,
                        "R": 1.4 if j == 0 else 0.4,
                        "A_E": A_E[i][j],
                        "error": None,
                    }
                )
            else:
                runs.append(
                    {
                        "calls": [],
                        "answer": None,
                        "correct": 0.0,
                        "format": 0.0,
                        "R": 0,
                        "A_E": None,
                        "error": "unparseable script: line 1",
                    }
                )
        scripts.append(
            {
                "text": f"script {step}.{query}.{i}\n{EVIL}\nreturn x",
                "parsed": parsed,
                "error": None if parsed else "SyntaxError at line 1",
                "structure": "tester" if parsed else None,
                "A_D": A_D[i],
                "runs": runs,
            }
        )
    R = [[run["R"] for run in s["runs"]] for s in scripts]
    return {
        "step": step,
        "role": "executor" if step % 2 == 0 else "designer",
        "query": query,
        "task": {
            "id": f"task-{step}-{query}",
            "kind": "code" if query == 0 else "math",
            "text": f"Write f(x) {EVIL}",
            "gold": {"inputs": [[0]], "outputs": [1]} if query == 0 else "10",
        },
        "R": R,
        "scripts": scripts,
    }


def records(steps=(1, 2)):
    return [record(s, q) for s in steps for q in range(2)]


def metrics(steps=(1, 2)):
    return [
        {
            "step": s,
            "active": "designer" if s % 2 else "executor",
            "reward/mean": 0.61,
            "accuracy": 0.4,
            "parse_rate": 0.95,
            "kl": 0.001,
        }
        for s in steps
    ]


def run_dir(tmp_path, steps=(1, 2), extra_lines=()):
    lines = [json.dumps(r) for r in records(steps)] + list(extra_lines)
    (tmp_path / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics(steps)))
    return tmp_path


def steps_in(text):
    return sorted({int(s) for s in re.findall(r'<section class="q" id="s(\d+)-q\d+"', text)})


def test_page_grid_values_and_escaping():
    text = show.page(records(), {m["step"]: m for m in metrics()})
    assert text.count('<table class="grid">') == 4
    assert "<script>alert" not in text and EVIL_ESC in text
    for s in (1, 2):
        assert (
            f"step={s} active=" in text and "reward/mean=0.61 accuracy=0.4 parse_rate=0.95" in text
        )
        for q in range(2):
            assert f'id="s{s}-q{q}"' in text
            for i in range(2):
                assert (
                    f'id="s{s}-q{q}-i{i}" hidden' in text
                    and f"script {s}.{q}.{i}\n{EVIL_ESC}" in text
                )
                for j in range(2):
                    assert (
                        f'data-open="s{s}-q{q}-i{i}-j{j}"' in text
                        and f'id="s{s}-q{q}-i{i}-j{j}" hidden' in text
                    )
                    if not (q == 1 and i == 1):
                        assert f"reply s{s}q{q}i{i}j{j} {EVIL_ESC}" in text
    for v in A_D:
        assert f"A_D {v}" in text
    for v in (x for row in A_E for x in row):
        assert f"A_E {v}" in text
    assert "A_E —" in text and "#ddd" in text  # the runs that did not happen: grey
    assert "SyntaxError at line 1" in text and "unparseable script: line 1" in text
    assert "hsl(120," in text and "hsl(34," in text  # R=1.4 green, R=0.4 towards red
    assert '<option value="code">' in text and '<option value="designer">' in text
    # a code task's gold, as JSON
    assert "{&quot;inputs&quot;: [[0]], &quot;outputs&quot;: [1]}" in text


def test_write_default_and_explicit_range(tmp_path):
    d = run_dir(tmp_path, steps=(1, 2, 3, 4, 5))
    path = show.write(str(d))
    assert path == str(d / "rollouts.html")
    assert steps_in(open(path).read()) == [3, 4, 5]
    assert steps_in(open(show.write(str(d), steps=(2, 3))).read()) == [2, 3]
    assert steps_in(open(show.write(str(d), steps=(4, None))).read()) == [4, 5]
    assert steps_in(open(show.write(str(d), steps=(None, 1))).read()) == [1]
    with pytest.raises(SystemExit, match="no steps 7..9"):
        show.write(str(d), steps=(7, 9))


def test_bad_lines_are_skipped_and_counted(tmp_path, capsys):
    bad = [
        "{not json",
        "[1, 2]",
        '"text"',
        json.dumps({"step": 2, "query": 5, "scripts": "oops"}),
        "   ",
    ]
    d = run_dir(tmp_path, extra_lines=bad)
    rows, skipped = show.read_jsonl(str(d / "rollouts.jsonl"))
    assert len(rows) == 5 and skipped == 3  # a dict line is read; the page build drops it
    text = open(show.write(str(d))).read()
    assert "4 malformed line(s) of rollouts.jsonl skipped" in text and steps_in(text) == [1, 2]
    assert "skipped 4 malformed line(s)" in capsys.readouterr().out


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(SystemExit, match="rollouts.jsonl"):
        show.write(str(tmp_path))
    (tmp_path / "rollouts.jsonl").write_text("")
    with pytest.raises(SystemExit, match="rollouts.jsonl holds no rollout records"):
        show.write(str(tmp_path))


def test_main_steps_and_bad_ranges(tmp_path, capsys):
    d = run_dir(tmp_path, steps=(1, 2, 3, 4))
    out = str(d / "rollouts.html")
    assert show.main([str(d), "--steps", "2:3"]) == out
    assert capsys.readouterr().out.strip() == out and steps_in(open(out).read()) == [2, 3]
    assert steps_in(open(show.main([str(d), "--steps", "3:"])).read()) == [3, 4]
    assert steps_in(open(show.main([str(d), "--steps", ":2"])).read()) == [1, 2]
    assert steps_in(open(show.main([str(d), "--steps", "4"])).read()) == [4]
    for bad in ("3:2", "a:b", ":", "1:2:3", ""):
        with pytest.raises(SystemExit, match="bad --steps"):
            show.main([str(d), "--steps", bad])


def test_runs_alone_as_its_needs_line_says(tmp_path):
    """ "Needs: no other file of this project": show.py copied alone into an empty folder, run by
    path in a fresh interpreter that sees no project file (python -I), writes the page of a run
    folder."""
    shutil.copy(show.__file__, tmp_path / "show.py")
    (tmp_path / "run").mkdir()
    d = run_dir(tmp_path / "run")
    p = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "show.py"), str(d)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == str(d / "rollouts.html") and steps_in(
        (d / "rollouts.html").read_text()
    ) == [1, 2]
    assert "Needs: no other file of this project." in show.__doc__


CHROMIUM = next(
    (
        p
        for p in map(
            shutil.which, ("chromium", "chromium-browser", "google-chrome", "headless_shell")
        )
        if p
    ),
    None,
)


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser, "
    "google-chrome or headless_shell) on PATH for the rendered-page tests",
)


def rendered(url, tmp_path):
    """The DOM of url after its scripts ran, as headless Chromium serialises it."""
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and '<table class="grid">' in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def opening_tag(dom, pid):
    """The opening tag of the element with that id, as the browser serialised it after the JS
    ran."""
    return re.search(rf'<(?:div|section)[^>]*\bid="{pid}"[^>]*>', dom).group(0)


@needs_chromium
def test_rendered_in_chromium_at_a_hash(tmp_path):
    (tmp_path / "run").mkdir()
    path = show.write(str(run_dir(tmp_path / "run")))
    dom = rendered(f"file://{path}#s2-q0-i1-j0", tmp_path)
    assert "<script>alert" not in dom and "alert(1)" in dom
    assert f"script 2.0.1\n{EVIL_DOM}" in dom

    def tag(pid):
        return opening_tag(dom, pid)

    for pid in ("s2-q0-i1-j0", "s2-q0-i1"):  # the execution and its design: opened by the hash
        assert "open" in tag(pid) and "hidden" not in tag(pid), tag(pid)
    for pid in ("s2-q0-i1-j1", "s2-q0-i0-j0", "s1-q0-i1-j0", "s2-q0-i0"):
        assert "hidden" in tag(pid) and "open" not in tag(pid), tag(pid)
    panel = dom[dom.index(tag("s2-q0-i1-j0")) :]
    panel = panel[: panel.index('<div class="panel', 1)]
    assert (
        f"reply s2q0i1j0 {EVIL_DOM}" in panel
        and "user s2q0i1j0" in panel
        and "system s2q0i1j0" in panel
    )
    assert re.search(r'<td class="cell sel" data-open="s2-q0-i1-j0"', dom)  # its cell is marked


@needs_chromium
def test_clicks_and_filters_in_chromium(tmp_path):
    # What a human does, as script: click a cell (opens), a row twice (opens, closes), pick
    # kind=math.
    (tmp_path / "run").mkdir()
    path = show.write(str(run_dir(tmp_path / "run")))
    clicks = """<script>var q=function(s){return document.querySelector(s)};
q('td[data-open="s1-q1-i0-j1"]').click();q('tr[data-open="s1-q0-i0"]').click();
q('tr[data-open="s2-q0-i1"]').click();q('tr[data-open="s2-q0-i1"]').click();
var k=document.getElementById('kind');k.value='math';k.onchange();</script></body>"""
    with open(path) as f:
        text = f.read().replace("</body>", clicks)
    with open(path, "w") as f:
        f.write(text)
    dom = rendered(f"file://{path}", tmp_path)
    for pid in ("s1-q1-i0-j1", "s1-q0-i0"):
        assert "open" in opening_tag(dom, pid) and "hidden" not in opening_tag(dom, pid)
    assert "open" not in opening_tag(dom, "s2-q0-i1") and "hidden" in opening_tag(dom, "s2-q0-i1")
    for s in (1, 2):  # the filter: code queries hidden, math shown
        assert "hidden" in opening_tag(dom, f"s{s}-q0") and "hidden" not in opening_tag(
            dom, f"s{s}-q1"
        )
