"""Imports: every project module imports cleanly, imports go one way, and each advertised module
works when copied into an empty folder with exactly the project files its docstring's `Needs:` line
names.

The project's modules are the method at the top level and the files of its three folders
(machinery/, world/, tools/), named as Python imports them (machinery.engine) and as the Needs lines
name them (machinery/engine.py). The import graph is read from the source (every `import` statement,
those inside functions and `if` blocks included, and `__import__("name")` with a constant name): a
hidden import is still an edge.
"""

import ast
import importlib
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tokenize
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("machinery", "world", "tools")
FILES = []  # every project module's path: the top level's and each package's (its __init__ aside)
for pattern in ("*.py", *(f"{d}/*.py" for d in PACKAGES)):
    FILES += [p.relative_to(ROOT) for p in ROOT.glob(pattern) if p.name != "__init__.py"]
FILES.sort()
# {"machinery.engine": machinery/engine.py, ...}
MODULES = {".".join(f.with_suffix("").parts): f for f in FILES}


def test_the_layout_is_the_readme_s():
    """The method at the top level; the machinery, the world and the tools in their folders."""
    top = sorted(m for m in MODULES if "." not in m)
    method = ["advantage", "evaluate", "grpo", "mas", "reward", "rollout", "sandbox", "settings"]
    assert top == [*method, "sft", "stagewise", "train"], top
    for d in PACKAGES:  # each folder a package: its __init__.py says what the folder holds
        doc = ast.get_docstring(ast.parse((ROOT / d / "__init__.py").read_text())) or ""
        assert len(doc) > 80, f"{d}/__init__.py needs a docstring saying what the folder holds"


def code_lines(path):
    """The lines of `path` that hold code: a token other than a comment, and not a docstring."""
    src = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in skip or tok.type == tokenize.ENDMARKER:
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def test_the_method_stays_small():
    """The budgets of the minimal reference (issue #71): the top level at most 2,600 code lines,
    train.py 300; settings.py 400 lines in all; no top-level function over 80 lines."""
    top = [ROOT / f for f in FILES if len(f.parts) == 1]
    sizes = {p.name: code_lines(p) for p in top}
    assert sum(sizes.values()) <= 2600, sizes
    assert sizes["train.py"] <= 300
    assert len((ROOT / "settings.py").read_text().splitlines()) <= 400
    for p in top:
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 80, f"{p.name}: {node.name} is {length} lines"


# What the method's docstrings leave to docs/: a test's path or name, an issue number, a NOTES
# section (\btest_ skips names such as public_test_cases; NOTES in capitals, unlike the verb).
HISTORY = re.compile(r"tests/|\btest_\w|(?i:\bissues? #?\d)|(?<![\w&])#\d+\b|\bNOTES\b")


def docstrings(path):
    """(name, docstring) of the module (name "module") and of each class and function in it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", "module"), doc


def test_history_pattern_catches_the_real_cases_only():
    caught = [
        "(tests/test_evaluate.py: two gloo ranks on a CPU)",
        "equal by tests/test_chunked.py::",
        "test_shared_rows_run_equals_plain.",
        "(measured: docs/NOTES.md, issue #44);",
        "in their last bits (docs/NOTES.md, #46).",
        "chosen on val (Issue 43)",
    ]
    passed = [
        "public_test_cases (JSON)",
        "the tests pass",
        "rank #rank",
        "a latest_step",
        "a thread notes when",
    ]
    assert [s for s in caught if not HISTORY.search(s)] == []
    assert [s for s in passed if HISTORY.search(s)] == []


def test_the_method_s_docstrings_teach_without_history():
    """The top level's docstrings teach (equations, contracts, usage); where a fact was proven or
    measured is docs/' business, or a `#` comment's at the one place a reader needs the proof."""
    found = []
    for f in FILES:
        if len(f.parts) > 1:
            continue
        for name, doc in docstrings(ROOT / f):
            found += [f"{f}:{name}: {line}" for line in doc.splitlines() if HISTORY.search(line)]
    assert found == [], "\n".join(found)


@pytest.fixture(scope="module")
def fresh_imports():
    """Each module imported in a fresh interpreter of its own (an import that only works because
    another module ran first would hide in one), as many at once as this process may use cores
    (at most 4)."""

    def one(name):
        cmd = [sys.executable, "-c", f"import {name}"]
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:  # this module's test fails, saying so
            return subprocess.CompletedProcess(cmd, None, "", f"{e}")

    with ThreadPoolExecutor(max_workers=min(4, len(os.sched_getaffinity(0)))) as pool:
        return dict(zip(sorted(MODULES), pool.map(one, sorted(MODULES)), strict=True))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_imports(name, fresh_imports):
    assert fresh_imports[name].returncode == 0, fresh_imports[name].stderr[-2000:]


def test_module_docstrings():
    for name, path in MODULES.items():
        mod = importlib.import_module(name)
        assert mod.__doc__ and len(mod.__doc__.strip()) > 80, (
            f"{path} needs a docstring saying what it holds"
        )


# --------------------------------------------------------------------------------------------------
# The import graph


def imports_of(name):
    """The project modules `name` imports anywhere in its source (`from machinery import engine` and
    `from machinery.engine import Sampling` both name machinery.engine)."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / MODULES[name]).read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value)
    return (found & set(MODULES)) - {name}


GRAPH = {name: imports_of(name) for name in MODULES}


def closure(name):
    seen, todo = set(), [name]
    while todo:
        for dep in GRAPH[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def find_cycle(graph):
    """One cycle as a list of modules [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for d in sorted(graph[n]):
            if state.get(d) == "open":
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def tier(name):
    """The node a module counts as between the tiers: each top-level file, or its folder."""
    return name.split(".")[0]


def test_no_import_cycle_between_the_tiers():
    """Each top-level file and each of machinery/, world/, tools/ one node, imports inside functions
    included: no cycle. So nothing in the method, machinery/ or world/ imports tools/, and world/
    and a method file never import each other both ways."""
    tiers = {tier(n): set() for n in GRAPH}
    for name, deps in GRAPH.items():
        tiers[tier(name)] |= {tier(d) for d in deps} - {tier(name)}
    cycle = find_cycle(tiers)
    assert cycle is None, "import cycle between the tiers: " + " -> ".join(cycle)
    for name, deps in GRAPH.items():
        if tier(name) != "tools":
            assert not {d for d in deps if tier(d) == "tools"}, f"{name} imports tools/"


def needs(name):
    """The project files named by the module docstring's one `Needs:` paragraph (the line and those
    that continue it, up to a blank line), as module names: machinery/engine.py is
    machinery.engine."""
    doc = importlib.import_module(name).__doc__ or ""
    paragraphs = re.findall(r"^Needs:(.*?)(?:\n\s*\n|\Z)", doc, re.M | re.S)
    assert len(paragraphs) == 1, (
        f"{MODULES[name]}: its docstring needs one 'Needs: a.py, b.py' (or 'no other file')"
    )
    return {f.replace("/", ".") for f in re.findall(r"(?<![\w/.])([\w/]+)\.py\b", paragraphs[0])}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_needs_line_names_every_project_file_the_module_imports(name):
    named = needs(name)
    assert named <= set(MODULES), (
        f"{MODULES[name]} names files that are not project modules: {named - set(MODULES)}"
    )
    missing = closure(name) - named
    assert not missing, (
        f"{MODULES[name]} imports (directly or not) {sorted(missing)}, which its Needs line omits"
    )


# --------------------------------------------------------------------------------------------------
# Copied alone (with its Needs), each advertised module works: a real call, in a fresh interpreter
# whose only project files are the copies (python -I: no PYTHONPATH, no user site, no script
# directory)

PRELUDE = """
import importlib, os, sys
sys.path.insert(0, os.getcwd())
{short} = importlib.import_module({name!r})
assert os.path.abspath({short}.__file__) == os.path.join(os.getcwd(), {path!r}), {short}.__file__
"""

SANDBOX_START = """
import sandbox
try:
    sandbox.start()
    isolated = True
except sandbox.SandboxUnavailable:
    isolated = False
"""

CALLS = {
    "advantage": """
import torch
R = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]])
d, e = advantage.designer_advantages(R), advantage.executor_advantages(R)
assert d.shape == (1, 2) and d[0, 0] > 0 > d[0, 1]
assert e.shape == (1, 2, 2) and e[0, 0, 0] > 0 > e[0, 1, 0]
""",
    "stagewise": """
roles = [stagewise.active_roles(t, stage_len=2) for t in range(4)]
assert roles == [{"executor"}, {"executor"}, {"designer"}, {"designer"}], roles
""",
    "grpo": """
import torch
logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
loss, stats = grpo.grpo_loss(logp, None, torch.tensor([2.0]), torch.ones(1, 2), clip_eps=0.2)
loss.backward()
# exact in any IEEE arithmetic: rho = exp(0) = 1, then sums and halves of small integers
assert loss.item() == -2.0 and logp.grad.tolist() == [[-1.0, -1.0]] and stats["tokens"] == 2
""",
    "machinery.logprob_rows": """
import torch
h = torch.randn(3, 4, dtype=torch.float64)
w = torch.randn(5, 4, dtype=torch.float64)
t = torch.tensor([0, 4, 2])
ref = torch.log_softmax(h @ w.T, -1).gather(1, t[:, None])[:, 0]
got = logprob_rows.chunked_logprobs(h, w, t, chunk_size=2)
assert torch.allclose(got, ref)   # float64: ~1e-15 apart, rtol 1e-5
b = logprob_rows.shared_prompt_rows([([5, 6, 7], [[8, 9], [10]])], pad_id=0)
assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10]] and b["targets"].tolist() == [8, 9, 10]
assert b["positions"].tolist() == [2, 3, 2] and b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3]]
""",
    "mas": """
script, why = mas.parse_script(mas.script_completion(mas.TEMPLATES["critic"]))
assert why is None and script == mas.TEMPLATES["critic"] and mas.structure_of(script) == "critic"
assert mas.majority(["2", "3", " 2 "], str.__eq__) == "2"
assert mas.answer_of("x <answer>4</answer>") == "4"
""",
    "machinery.data": """
shown = {"inputs": ["2"], "outputs": ["4"]}
task = {"id": "t", "kind": "code", "question": "Double it.", "public_tests": shown}
assert data.task_text(task, short=True) == "Double it.\\nin: 2\\nout: 4"
""",
    "sandbox": SANDBOX_START
    + """
import mas
if isolated:
    assert sandbox.programs.run_code("print(6 * 7)").stdout == "42\\n"
    prog = "print(int(input()) * 2)"
    shown = {"inputs": ["2\\n"], "outputs": ["4\\n"]}
    task = {"id": "t", "kind": "code", "question": "Double it.", "public_tests": shown}
    seen = []
    def generate(calls):
        seen.extend(c.message for c in calls)
        return [f"<answer>{prog}</answer>" for c in calls]
    run, = sandbox.run_workflows([mas.TEMPLATES["tester"]], [task], generate, equal=str.__eq__)
    assert (run.answer, run.error) == (prog, None), run
    assert "Example 1:" in seen[0]          # the task as data.task_text renders it
else:
    print("SKIP: no isolation here")
""",
    "reward": """
from types import SimpleNamespace
from machinery import isolation
try:
    isolation.start()
    isolated = True
except isolation.SandboxUnavailable:
    isolated = False
# a run as sandbox.run_workflows returns it: its answer, its calls' full replies
run = SimpleNamespace(answer="25", calls=[SimpleNamespace(reply="<answer>25</answer>")])
# 1.0 + 0.4 * 1.0: the double 1.4 on any IEEE CPU
assert reward.reward({"id": "m", "kind": "math", "answer": "025"}, run, lam=0.4) == 1.4
# SymPy, in a grader process
assert reward.math_equal("\\\\frac{1}{2}", "\\\\sqrt{\\\\frac{1}{4}}")
if isolated:
    tests = {"inputs": ["2\\n", "5\\n"], "outputs": ["4", "10"]}
    assert reward.code_score("print(int(input()) * 2)", tests) == 1.0
else:
    print("SKIP: no isolation here (code_score)")
""",
    "machinery.weights": """
import os, torch
from safetensors.torch import save_file
os.makedirs("m")
save_file({"a": torch.ones(2), "b": torch.zeros(3)}, "m/model.safetensors")
got = dict(weights.folder_weights("m"))   # a saved model's tensors, one at a time
assert sorted(got) == ["a", "b"] and torch.equal(got["a"], torch.ones(2))
# one folder for both roles: the engine (None here) is never asked to load anything
held = weights.EngineWeights(None, {"designer": "m", "executor": "m"}, held="designer")
held.hold("executor")
assert held.held == "executor"
""",
    "machinery.recorder": """
import torch
R, E = torch.tensor([[[1.4, 0.4]]]), torch.ones(1, 1, 2, dtype=torch.bool)
recs = [{"correct": True, "structure": "single"}, {"correct": False, "structure": "single"}]
m = recorder.signal_metrics(recs, R, E, torch.zeros(1, 1), torch.tensor([[[0.7, -0.7]]]))
assert m["signal/all_correct"] == 0.0
assert m["designer/dead_groups"] == 1.0 and m["executor/dead_groups"] == 0.0
assert m["signal/same_structure"] == 1.0 and m["entropy/designs"] == 0.0
""",
    "rollout": """
s = rollout.Sample(prompt_ids=[5, 6], completion_ids=[7, 8], logprobs=[-0.5, -0.25], index=(0, 0))
t = rollout.samples_to_tensors([s], pad_id=0)
assert t["input_ids"].tolist() == [[5, 6, 7, 8]]
assert t["completion_mask"].tolist() == [[0.0, 1.0, 1.0]]
assert t["logprobs"].tolist() == [[0.0, -0.5, -0.25]]
""",
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_copied_module_works_with_only_its_needs(name, tmp_path):
    for f in {name} | needs(name):  # each at its own path (machinery/engine.py), no __init__.py
        (tmp_path / MODULES[f]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / MODULES[f], tmp_path / MODULES[f])
    short = name.rsplit(".", 1)[-1]
    code = PRELUDE.format(name=name, short=short, path=str(MODULES[name])) + textwrap.dedent(
        CALLS[name]
    )
    code += "\nprint('OK')\n"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (proc.stdout + proc.stderr)[
        -3000:
    ]
    if "SKIP" in proc.stdout:
        pytest.skip(proc.stdout.strip().splitlines()[0])
