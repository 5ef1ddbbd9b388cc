"""mas.py: answer tags, templates, the Designer prompt, parse_script's reasons, structure_of,
vote."""

import os
import sys
from fractions import Fraction

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mas


def test_answer_of():
    assert mas.answer_of("think <answer> 42 </answer>") == "42"
    assert mas.answer_of("<answer>1</answer> then <answer>2</answer>") == "2"
    assert mas.answer_of("<answer>unclosed") is None
    assert mas.answer_of("no tag") is None
    assert mas.answer_of(None) is None


def test_limits_defaults():
    lim = mas.Limits()
    assert (lim.max_calls, lim.timeout, lim.max_output) == (16, 60.0, 8192)


@pytest.mark.parametrize("name", ["single", "ensemble", "critic", "tester"])
def test_templates_parse_and_name_themselves(name):
    src = mas.TEMPLATES[name]
    assert 3 <= len(src.strip().splitlines()) <= 6  # short: a char-level model must learn them
    script, why = mas.parse_script(f"Here is my design.\n```python\n{src}```\n")
    assert why is None and script == src
    assert mas.structure_of(src) == name


@pytest.mark.parametrize(
    "completion,reason",
    [
        ("def workflow(task):\n    return task", "no code block"),
        ("```python\ndef workflow(task)\n    return task\n```", "syntax error"),
        ("```python\ndef solve(task):\n    return task\n```", "no workflow function"),
        (
            "```python\nimport os\ndef workflow(task):\n    return os.getcwd()\n```",
            "forbidden construct: import os",
        ),
        (
            "```python\nfrom subprocess import run\ndef workflow(task):\n    return ''\n```",
            "forbidden construct",
        ),
        (
            "```python\nimport socket\ndef workflow(task):\n    return ''\n```",
            "forbidden construct",
        ),
        (
            "```python\ndef workflow(task):\n    return open('/etc/passwd').read()\n```",
            "forbidden construct: open",
        ),
        ("```python\ndef workflow(task):\n    return eval(task)\n```", "forbidden construct: eval"),
        (
            "```python\ndef workflow(task):\n    exec(task)\n    return ''\n```",
            "forbidden construct: exec",
        ),
        (
            "```python\ndef workflow(task):\n    return __import__('os').name\n```",
            "forbidden construct: __import__",
        ),
        (
            "```python\ndef workflow(task):\n    return ().__class__.__name__\n```",
            "forbidden construct: dunder",
        ),
        (None, "no code block"),
    ],
)
def test_parse_script_reasons(completion, reason):
    script, why = mas.parse_script(completion)
    assert script is None and why.startswith(reason), why


def test_parse_script_allows_safe_imports_and_picks_the_workflow_block():
    text = (
        "First a helper:\n```python\nx = 1\n```\nThen:\n```python\nimport math\n"
        "def workflow(task):\n    return str(math.sqrt(4))\n```"
    )
    script, why = mas.parse_script(text)
    assert why is None and script.startswith("import math")


def test_structure_of_other_shapes():
    loop = """def workflow(task):
    a = Agent('s', 'x')
    for _ in range(3):
        task = a(task)
    return task"""
    mixed = """def workflow(task):
    a = Agent('s', 'x')
    b = Agent('c', 'y')
    return b(vote(a.sample(task, 3)))"""
    assert mas.structure_of(loop) == "other"
    assert mas.structure_of(mixed) == "other"
    assert mas.structure_of("def workflow(task):\n    return task") == "other"
    assert mas.structure_of("def workflow(:") == "other"


def test_prompts():
    long = mas.designer_messages("What is 2+2?")
    assert long[-1] == {"role": "user", "content": "What is 2+2?"}
    for helper in ("Agent(", "sample(", "vote(", "run_python(", "run_tests(", "```python"):
        assert helper in long[0]["content"]
    assert mas.TEMPLATES["tester"] in long[0]["content"]
    short = mas.designer_messages("What is 2+2?", short=True)
    assert len(short[0]["content"]) < 100 and short[0]["content"].count("\n") <= 1
    msgs = mas.agent_messages("critic", "Check it.", "2+2=5?")
    assert (
        msgs[0]["role"] == "system"
        and "critic" in msgs[0]["content"]
        and "<answer>" in msgs[0]["content"]
    )
    assert msgs[1] == {"role": "user", "content": "2+2=5?"}
    assert mas.agent_messages("critic", "Check it.", "2+2=5?", short=True) == [
        {"role": "system", "content": "critic: Check it."},
        {"role": "user", "content": "2+2=5?"},
    ]


def test_majority_and_vote():
    def same_number(a, b):
        return Fraction(a) == Fraction(b)

    assert mas.majority(["a", " a ", "b"], str.__eq__) == "a"  # whitespace never separates answers
    assert mas.majority(["", "", "x"], str.__eq__) == "x"
    assert mas.majority([], str.__eq__) == ""
    assert mas.majority(["3", "1/2", "0.5"], same_number) == "1/2"  # by `equal`, first seen wins
    assert mas.majority(["3", "1/2", "0.5"], str.__eq__) == "3"
    with pytest.raises(TypeError):
        mas.vote("abc")
    # counted in the trainer, like every helper's work
    with pytest.raises(RuntimeError, match="sandbox"):
        mas.vote(["1", "1"])


def test_script_completion_is_what_parse_script_reads():
    for name, script in mas.TEMPLATES.items():
        assert mas.parse_script(mas.script_completion(script)) == (script, None), name


def test_helpers_need_the_sandbox_and_strings():
    a = mas.Agent("solver", "Solve.")
    with pytest.raises(TypeError):
        a(123)
    with pytest.raises(RuntimeError, match="sandbox"):
        a("hello")
    with pytest.raises(TypeError):
        mas.run_python(b"print(1)")
