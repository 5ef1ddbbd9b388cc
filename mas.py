"""mas.py: the workflow-script language the Designer writes.

A multi-agent system (MAS) is a short Python script that defines `workflow(task) -> str`. It builds
agents and wires them together with plain Python; the sandbox (sandbox.run_workflows) runs it in a
child process and relays each agent call to the trainer, where one batched engine call answers all
pending calls (so the Executor's rollout is batched across every running script). What a script may
call:

    Agent(role, instructions)   an agent; agent(message) -> str makes one Executor call and returns
                                the text inside the reply's <answer> tag ("" if none). Only that
                                part flows on; the full reply is kept for training.
    agent.sample(message, n)    n calls at once (batched, not one after another) -> list[str]
    vote(answers)               majority answer, answers compared in the trainer by the `equal` that
                                sandbox.run_workflows was given (rollout gives reward.math_equal;
                                a code task's: reward.text_equal, its programs compared as text)
    run_python(code, input="")  run a program in a fresh sandbox child -> its stdout (or the error)
    run_tests(code)             run a program on the task's VISIBLE tests -> "PASS 3/3" or "FAIL 1/3
                                ..."

The four templates (TEMPLATES) are the fixed structures of the paper: single agent, ensemble voting,
solver-critic and solver-tester. parse_script takes a script out of a Designer completion, or says
why it cannot; structure_of names a script's structure from what it calls (for the structure-share
tables).

Needs: no other file of this project.
"""

import ast
import builtins
import re
from dataclasses import dataclass

ANSWER_TAG = "answer"
# the answer tag's contents, every one in a reply (reward.py reads the same tag with it)
ANSWER_RE = re.compile(rf"<{ANSWER_TAG}>(.*?)</{ANSWER_TAG}>", re.S)
ANSWER_END = f"</{ANSWER_TAG}>"


def answers_in(reply):
    """The content of every <answer>...</answer> in a reply, in order: ANSWER_RE.findall(reply), in
    time linear in the reply. What follows the last closing tag is cut off first: it holds no
    answer, and the regex would scan from each opening tag there to the end (quadratic)."""
    return ANSWER_RE.findall(reply[: reply.rfind(ANSWER_END) + len(ANSWER_END)])


def answer_of(reply):
    """Content of the last <answer>...</answer> in a reply (stripped); None if there is none."""
    found = answers_in(reply) if isinstance(reply, str) else []
    return found[-1].strip() if found else None


FAILED_TESTS = re.compile(r"\bFAIL \d+/\d+\b")  # a run_tests report of a failure (sandbox's)


def repairs(calls):
    """(repairs, copies) of one run's agent calls (sandbox.CallRecord, in order): a repair is a call
    whose message shows a failed run_tests report (the tester's second call); a copy, a repair whose
    answer is the answer of the call before it (the failed program, written again)."""
    n_repairs = n_copies = 0
    for k, c in enumerate(calls):
        if k > 0 and FAILED_TESTS.search(c.messages[-1]["content"]):
            n_repairs += 1
            n_copies += answer_of(c.reply) == answer_of(calls[k - 1].reply)
    return n_repairs, n_copies


@dataclass
class Limits:
    max_calls: int = 16  # agent calls per execution; agent.sample(m, n) counts n
    timeout: float = (
        60.0  # wall seconds per execution, not counting time spent waiting on the trainer
    )
    max_output: int = (
        8192  # chars of the answer, of captured stdout, of a run_python/run_tests reply
    )
    code_timeout: float = 10.0  # wall seconds of one run_python / run_tests from a script
    max_programs: int = 16  # run_python / run_tests calls per execution
    max_message: int = 32768  # chars of an agent call's role, instructions and message
    max_messages: int = 262144  # chars of all of them in an execution (sample(m, n): n times)


# --------------------------------------------------------------------------------------------------
# Prompts


def agent_messages(role, instructions, message, short=False):
    """The Executor's chat prompt for one agent call. short=True: `role: instructions`, for the tiny
    character-level model (the answer tag is learned from the SFT replies, not read from the
    prompt)."""
    if short:
        system = f"{role}: {instructions}"
    else:
        tag = f"<{ANSWER_TAG}></{ANSWER_TAG}>"
        system = f"You are the {role}. {instructions} Put the final answer in {tag}."
    return [
        {"role": "system", "content": system.replace("  ", " ")},
        {"role": "user", "content": message},
    ]


TEMPLATES = {
    "single": """def workflow(task):
    solver = Agent("solver", "Solve the task.")
    return solver(task)
""",
    "ensemble": """def workflow(task):
    solver = Agent("solver", "Solve the task.")
    return vote(solver.sample(task, 3))
""",
    "critic": """def workflow(task):
    solver = Agent("solver", "Solve the task.")
    critic = Agent("critic", "Check the answer and correct it.")
    answer = solver(task)
    return critic(f"{task}\\nAnswer: {answer}")
""",
    "tester": """def workflow(task):
    coder = Agent("coder", "Write a Python program.")
    code = coder(task)
    report = run_tests(code)
    return code if report.startswith("PASS") else """
    """coder(f"{task}\\nCode:\\n{code}\\nTests: {report}")
""",  # (one literal in two: the template's line is longer than ours)
}

_DESIGNER = (
    "You design a multi-agent workflow for the task. Write a Python function workflow(task) -> str "
    "that returns the final answer (for code tasks: the program). You may call:\n"
    "- Agent(role, instructions): an agent; agent(message) returns its answer (a string).\n"
    "- agent.sample(message, n): n answers at once (a list).\n"
    "- vote(answers): the majority answer.\n"
    '- run_python(code, input=""): runs a program, returns its output.\n'
    '- run_tests(code): runs a program on the task\'s examples, returns "PASS ..." or "FAIL ..." '
    "and a failing case.\n"
    "No imports, files or other I/O. Reply with one ```python code block.\n"
    "\n"
    "Example:\n"
    "```python\n"
    "{critic}```\n"
    "\n"
    "Example:\n"
    "```python\n"
    "{tester}```"
)

_DESIGNER_SHORT = "Write def workflow(task) in ```python```. Use Agent, vote, run_tests."


def designer_messages(task_text, short=False):
    """The Designer's chat prompt; short=True is a one-liner for the tiny character-level model."""
    system = _DESIGNER_SHORT if short else _DESIGNER.format(**TEMPLATES)
    return [{"role": "system", "content": system}, {"role": "user", "content": task_text}]


def script_completion(script):
    """A script as the Designer is asked to reply: one ```python block (parse_script's inverse)."""
    return f"```python\n{script.strip()}\n```"


# --------------------------------------------------------------------------------------------------
# Parsing and naming scripts

_CODE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
SAFE_IMPORTS = {
    "math",
    "re",
    "json",
    "itertools",
    "collections",
    "functools",
    "fractions",
    "statistics",
    "string",
    "random",
    "heapq",
    "bisect",
    "operator",
    "decimal",
}
FORBIDDEN_NAMES = {
    "open",
    "exec",
    "eval",
    "compile",
    "__import__",
    "globals",
    "locals",
    "vars",
    "getattr",
    "setattr",
    "delattr",
    "breakpoint",
    "input",
    "exit",
    "quit",
    "help",
    "memoryview",
}


def _forbidden(tree):
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or "."]
            )
            bad = [n for n in names if n.split(".")[0] not in SAFE_IMPORTS]
            if bad:
                return f"import {bad[0]} (line {line})"
        elif isinstance(node, ast.Name) and (
            node.id in FORBIDDEN_NAMES or node.id.startswith("__")
        ):
            return f"{node.id} (line {line})"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return f"dunder attribute .{node.attr} (line {line})"
        elif isinstance(node, ast.Global | ast.Nonlocal):
            return f"{type(node).__name__.lower()} statement (line {line})"
    return None


def parse_script(completion):
    """(script, None) or (None, reason). Reasons (each starts with one of):
    "no code block"       no ```python ... ``` block in the completion
    "syntax error: ..."   the block does not parse (message and line)
    "no workflow function" no top-level `def workflow(task)`
    "forbidden construct: ..." an import outside SAFE_IMPORTS, a name in FORBIDDEN_NAMES (open,
                          exec, eval, __import__, ...), any dunder name or attribute,
                          global/nonlocal.
    The sandbox is the real guard; this check keeps the Designer inside the language."""
    if not isinstance(completion, str):
        return None, "no code block"
    blocks = _CODE_RE.findall(completion)
    if not blocks:
        return None, "no code block"
    script = next((b for b in blocks if "def workflow" in b), blocks[0]).strip("\n") + "\n"
    try:
        tree = ast.parse(script)
    except SyntaxError as e:
        return None, f"syntax error: {e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:
        return None, f"syntax error: {type(e).__name__}"
    if not any(isinstance(n, ast.FunctionDef) and n.name == "workflow" for n in tree.body):
        return None, "no workflow function"
    bad = _forbidden(tree)
    if bad:
        return None, f"forbidden construct: {bad}"
    return script, None


def structure_of(script):
    """ "single" | "ensemble" | "critic" | "tester" | "other", from what the script calls: tester =
    runs code (run_tests / run_python); ensemble = samples or votes; critic = two or more agents;
    single = one agent called once outside any loop. A mix of these, or anything else, is
    "other"."""
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return "other"
    agents, n_agents, calls, in_loop, feats = set(), 0, 0, False, set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "Agent"
        ):
            agents |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For | ast.While | ast.comprehension)]
    looped = set()  # the calls inside a loop
    for lp in loops:
        looped |= {id(c) for c in ast.walk(lp) if isinstance(c, ast.Call)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name == "Agent":
            n_agents += 1
        elif name in ("run_tests", "run_python"):
            feats.add("tester")
        elif name in ("sample", "vote"):
            feats.add("ensemble")
        elif isinstance(f, ast.Name) and name in agents:
            calls += 1
            in_loop |= id(node) in looped
    if n_agents >= 2:
        feats.add("critic")
    if len(feats) == 1:
        return feats.pop()
    if not feats and n_agents == 1 and calls == 1 and not in_loop:
        return "single"
    return "other"


# --------------------------------------------------------------------------------------------------
# The helpers a script calls (they run inside the sandbox child; _channel is set by sandbox.py)

_channel = None


def _request(msg):
    if _channel is None:
        raise RuntimeError("mas helpers work only inside sandbox.run_workflows")
    return _channel.request(msg)


def _need_str(name, value):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")


class Agent:
    """Agent(role, instructions): call it with a message to get the text inside its answer tag."""

    def __init__(self, role, instructions=""):
        _need_str("role", role)
        _need_str("instructions", instructions)
        self.role, self.instructions = role, instructions

    def __call__(self, message):
        return self.sample(message, 1)[0]

    def sample(self, message, n):
        _need_str("message", message)
        if not isinstance(n, int) or n < 1:
            raise ValueError("n must be a positive int")
        return _request(
            {
                "op": "agent",
                "role": self.role,
                "instructions": self.instructions,
                "message": message,
                "n": n,
                "many": True,
            }
        )

    def __repr__(self):
        return f"Agent({self.role!r})"


def majority(answers, equal):
    """The most common of `answers` (strings), two answers being the same when they are equal up to
    whitespace or when equal(a, b) says so; first seen wins ties; "" when no answer is non-empty.
    What vote() returns, computed in the trainer (sandbox.run_workflows) with the equal it was
    given."""
    groups = []  # [representative, count]
    for a in answers:
        a = str(a).strip()
        if not a:
            continue
        for g in groups:
            if " ".join(a.split()) == " ".join(g[0].split()) or equal(a, g[0]):
                g[1] += 1
                break
        else:
            groups.append([a, 1])
    return max(groups, key=lambda g: g[1])[0] if groups else ""


MAX_VOTE = 64  # answers one vote() may compare
MAX_VOTE_CHARS = 16384  # characters of each (a longer "answer" is a runaway, not an answer)


def vote(answers):
    """The most common answer (majority(answers, equal) with the trainer's equal, e.g. math
    equivalence); "" for no non-empty answers."""
    if isinstance(answers, str) or not hasattr(answers, "__iter__"):
        raise TypeError("vote takes a list of answers")
    answers = [str(a) for a in answers]
    if len(answers) > MAX_VOTE:
        raise ValueError(f"vote takes at most {MAX_VOTE} answers")
    if max(map(len, answers), default=0) > MAX_VOTE_CHARS:
        raise ValueError(f"vote takes answers of at most {MAX_VOTE_CHARS} characters")
    return _request({"op": "vote", "answers": answers})


def run_python(code, input=""):  # noqa: A002 - the name a script uses
    """Run a program in a fresh sandbox child: its stdout, or its stdout and the error."""
    _need_str("code", code)
    _need_str("input", input)
    return _request({"op": "run_python", "code": code, "input": input})


def run_tests(code):
    """Run a program on the task's visible tests: "PASS k/k", or "FAIL j/k" with the first failing
    case."""
    _need_str("code", code)
    return _request({"op": "run_tests", "code": code})


def script_globals():
    """The namespace a workflow script runs in."""
    return {
        "__name__": "workflow",
        "__builtins__": builtins,
        "Agent": Agent,
        "vote": vote,
        "run_python": run_python,
        "run_tests": run_tests,
        "answer_of": answer_of,
    }
