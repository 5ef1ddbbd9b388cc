"""tiny.py: the embedded tiny world, so that the whole method runs on a laptop CPU in minutes.

Five pieces, each usable on its own:

1. `build_tokenizer()`: a character-level `PreTrainedTokenizerFast`. One token per printable ASCII
   character (plus newline and tab); anything else (real benchmark text has Unicode) maps to
   `<|unk|>`. Special tokens: `<|pad|>`, `<|unk|>`, `<|end|>` (= eos, closes every chat turn) and
   one marker per chat role. The chat template renders
   `<|system|>...<|end|><|user|>...<|end|><|assistant|>` so a chat turn costs three tokens, not the
   dozen a "<|im_start|>assistant\\n" header would cost here.
2. `tiny_config()` / `build_model()` / `save_tiny()`: a small transformers `Qwen3ForCausalLM` (so
   vLLM loads it unchanged), saved with `save_pretrained` next to its tokenizer.
3. `make_tasks(n, seed)`: a deterministic synthetic world in data.py's task format.
   - math "chain": evaluate a short expression of 2 operations of + and - on operands up to 9, e.g.
     `7-5+8`. The gold answer is exact integer arithmetic, graded by reward.math_equal. The executor
     is taught to reduce it one step at a time (`7-5=2` / `2+8=10`) before `<answer>10</answer>`, so
     that errors come from sampling a wrong digit in some step: they differ between samples and a
     vote can fix them.
   - code "fn": write a one-line Python function `f(x)` from ONE shown example (`f(2)==5`);
     run_tests checks it on three visible tests (the shown one first), five hidden tests grade it.
     Functions come from a small catalogue (CATALOGUE: `x+K`, `x-K`, `K-x` with K in 1..9, on inputs
     0..9). Every shown example fits exactly two functions (f(2)==5: x+3 or 7-x), each f with
     probability 1/2, so a single agent, a vote and a critic (which see only the task) are capped
     near half; the three visible tests single f out within the catalogue (every function that
     passes them passes the hidden tests too), so run_tests' failing case is new information and
     the repair that switches to the other function is a skill: the tester template is the one
     structure without that ceiling.
   - splits: every task belongs to "sft" (60%), "rl" (10%), "val" (10%) or "eval" (20%) by a hash of
     what the model sees (`split_of`); `make_tasks(..., split=...)` draws from one, so the cold
     start, RL, the tuning of RL's settings and the held-out figures never share a problem (the
     world holds only ~1,750 distinct math problems).
4. `sft_traces(tasks, seed)`: SFT samples for both roles, with the compact prompts (`short=True`:
   the one-line Designer prompt, `role: instructions` agent prompts, code examples as `f(3)==7`
   lines). Designer: the short designer prompt -> a template drawn from a prior that is flat in
   what the cold start then writes (PRIOR_WEIGHTS: P(template | kind) about 25% each, on val).
   Executor: every agent call of the template that suits the task (tester for code, ensemble for
   math; another 25% of the time) when run in the sandbox, answered by an oracle that knows the
   task's answer; in half the critic/tester runs the first reply is deliberately wrong (never a
   training target), so that the critic and the repair call learn to fix. A weak teacher's habit
   is planted on purpose (COPY_SHARE = 0.3): that share of the tester's repairs writes the failed
   program again instead of switching (copy_reply). It shows only after a failed test, so only in
   the tester's runs: a habit the Executor can lose only where the Designer picks the tester.
5. `exact_figures(model, tokenizer, tasks)`: what a policy would write, by teacher forcing instead
   of sampling: P(the Designer writes each template's script | task), and P(the Executor writes the
   oracle reply | context) in each of its contexts (CONTEXTS: the solver's prompt, the coder's, the
   repair after a frozen wrong program failed the visible tests, the critic keeping a right or
   fixing a wrong proposal), and P(the repair copies the failed program) (`copy`: the habit).
   `executor_score` weights the contexts by the structures a Designer picks: the Executor's
   primary row. train.py's final table compares SFT and RL with them; sampled
   accuracy on 200 tasks carries ~3.5 points of noise, these carry none.

6. `cold_start(out, seed)`: the tiny world's SFT cold start, `python sft.py --no_eval` in a
   process of its own (train.py makes it when out is missing; run by path, so nothing here imports
   sft.py). `python world/tiny.py tasks` writes the held-out "eval" tasks to data/tiny.jsonl, the
   file evaluate.py's `--tasks tiny` reads.

How these settings were chosen (the calibration runs and what moved the numbers): docs/NOTES.md.

Needs: machinery/logprob_rows.py, machinery/data.py, machinery/engine.py, mas.py, reward.py,
rollout.py, sandbox.py, machinery/decode.py, machinery/isolation.py, machinery/confine.py,
machinery/programs.py, machinery/grader.py"""

import argparse
import functools
import hashlib
import json
import math
import os
import random
import re
import subprocess
import sys

# run by path (python world/tiny.py tasks): the project's root first on the path, for its imports
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

import mas
import reward
import rollout
import sandbox
from machinery import data, engine, logprob_rows

PAD, UNK, END = "<|pad|>", "<|unk|>", "<|end|>"
ROLES = ("system", "user", "assistant")
SPECIALS = [PAD, UNK, END] + [f"<|{r}|>" for r in ROLES]
CHARS = ["\n", "\t"] + [chr(c) for c in range(32, 127)]

# Roles other than the three we have markers for would silently become plain characters; fail
# loudly.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('tiny chat template: unknown role ' + m['role']) }}{% endif %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer():
    """Character-level tokenizer: specials are ids 0..5, then one id per character (103 tokens)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every single character (newlines included) is its own pre-token; WordLevel then looks it up
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # join characters back without the spaces WordLevel would insert
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=END,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def tiny_config(hidden_size=128, num_layers=4):
    """Qwen3 architecture, tiny (tests shrink hidden_size and num_layers). Many narrow heads: 8
    heads of 32 (attention 256 wide over a 128-wide residual stream) learned to copy digits out of a
    chat prompt in ~80 SFT steps where 2 heads of 64 had not after 200 (and the tiny world is mostly
    copying). head_dim 32 is the smallest vLLM's CPU attention supports. Vocabulary: the tokenizer's
    103 tokens, padded to 128."""
    pad_id, end_id = SPECIALS.index(PAD), SPECIALS.index(END)
    return Qwen3Config(
        vocab_size=128,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=32,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=pad_id,
        eos_token_id=end_id,
        bos_token_id=end_id,
        max_window_layers=num_layers,
    )


def build_model(seed=0, **config_kw):
    """A freshly initialised tiny model and its tokenizer (same seed -> same weights). Its
    generation config takes pad and eos from the model config (transformers copies them), so
    engine.eos_ids finds <|end|>."""
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_config(**config_kw)), tokenizer


def save_tiny(path, seed=0, **config_kw):
    """Write a fresh tiny model + tokenizer in Hugging Face format (from_pretrained and vLLM read
    it)."""
    model, tokenizer = build_model(seed, **config_kw)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------------
# The synthetic world


def _chain(rng, n_ops=2, hi=9):
    """A left-to-right expression of + and - and its worked steps: ('7-5+8', ['7-5=2', '2+8=10'],
    10)."""
    value = rng.randint(2, hi)
    expr, steps = str(value), []
    for _ in range(n_ops):
        op = rng.choice(["+"] + (["-"] if value >= 2 else []))
        b = rng.randint(1, min(hi, value) if op == "-" else hi)
        new = value + b if op == "+" else value - b
        expr = f"{expr}{op}{b}"
        steps.append(f"{value}{op}{b}={new}")
        value = new
    return expr, steps, value


# f's catalogue
CATALOGUE = [t.replace("K", str(k)) for t in ("x+K", "x-K", "K-x") for k in range(1, 10)]
SHOWN = 1  # of the three visible tests that run_tests checks, the task text shows this many


@functools.cache  # the same few hundred (expr, x) pairs, asked thousands of times a task list
def _apply(expr, x):
    return eval(expr, {}, {"x": x})  # our own catalogue text only


def fits_shown(expr, x):
    """The catalogue functions that agree with f = expr at x: the shown example's candidates (one
    or two: x+K and K'-x, or x-K and K'-x, agree at one x at most)."""
    return [e for e in CATALOGUE if _apply(e, x) == _apply(expr, x)]


def _fn_task(rng, n_visible=3, n_hidden=5):
    """A one-line function and inputs (0..9): the shown example (the first visible test) fits two
    catalogue functions, and the visible outputs single f out within the catalogue. f is drawn
    uniformly and the inputs then, so given the shown example both candidates are equally likely:
    no policy that sees only the task beats a coin on which one it is."""
    while True:
        expr = rng.choice(CATALOGUE)
        xs = rng.sample(range(0, 10), n_visible + n_hidden)
        vis, hid = xs[:n_visible], xs[n_visible:]
        if len(fits_shown(expr, vis[0])) != 2:
            continue
        fits = [e for e in CATALOGUE if all(_apply(e, x) == _apply(expr, x) for x in vis)]
        # every candidate that passes the visible tests must pass the hidden ones as well
        if all(_apply(e, x) == _apply(expr, x) for e in fits for x in hid):
            return expr, vis, hid


def _derivation(expr, x, y):
    """The worked step that reads K off one example (x, y) of f = expr, in the math chain's form:
    x+K from f(2)==5 is `5-2=3`, K-x is `5+2=7`, x-K from f(2)==-3 is `2+3=5` (the steps use no
    negative numbers, like the math chains)."""
    family, k = re.sub(r"\d+", "K", expr), re.findall(r"\d+", expr)[0]
    if family == "x+K":
        return [f"{y}-{x}={k}"]
    if family == "x-K":
        return [f"{x}-{y}={k}"] if y >= 0 else [f"{x}+{-y}={k}"]
    return [f"{y}+{x}={k}"] if y >= 0 else [f"{x}-{-y}={k}"]  # K-x


# The world is small (about 1,750 distinct math problems), so independent draws for SFT, RL and
# evaluation would share many problems, and held-out figures would count memorised ones. So every
# task belongs to one split, fixed by a hash of what the model is shown; each phase draws from its
# own. "val" is carved out of what was the rl split: RL trains on "rl", its settings are tuned on
# "val", and "eval" (the final table) is never seen before a setting is chosen.
SPLITS = {"sft": range(0, 6), "rl": range(6, 7), "val": range(7, 8), "eval": range(8, 10)}  # tenths


def split_of(task):
    """'sft', 'rl', 'val' or 'eval': a stable hash of the text the model is shown (two code tasks
    that show the same example look the same to the model, whatever their other tests, so they must
    share a split)."""
    key = data.task_text(task, short=True)
    tenth = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 10
    return next(name for name, r in SPLITS.items() if tenth in r)


def _tests(expr, xs):
    """The tests of f = expr on inputs xs, in data.py's format."""
    return {"inputs": [[x] for x in xs], "outputs": [_apply(expr, x) for x in xs], "fn_name": "f"}


def _make_task(rng, kind, tid):
    if kind == "math":
        expr, steps, value = _chain(rng)
        return {
            "id": tid,
            "kind": "math",
            "question": f"Compute {expr}.",
            "answer": str(value),
            "source": "tiny",
            "metadata": {"family": "chain", "steps": steps},
        }
    if kind == "code":
        expr, vis, hid = _fn_task(rng)
        return {
            "id": tid,
            "kind": "code",
            "question": "Write f(x).",
            "answer": "",
            "tests": _tests(expr, hid),
            "public_tests": _tests(expr, vis),
            "source": "tiny",
            "metadata": {
                "family": "fn",
                "solution": f"def f(x): return {expr}",
                "steps": _derivation(expr, vis[0], _apply(expr, vis[0])),
                "shown_examples": SHOWN,
            },
        }
    raise ValueError(f"unknown task kind {kind!r}")


def make_tasks(n, seed, kinds=("math", "code"), split=None):
    """n tasks in data.py's format, kinds interleaved, fully determined by (n, seed, kinds, split).

    split: None draws from the whole world; "sft", "rl", "val" or "eval" only from that split
    (SPLITS, split_of), so the cold start, RL, tuning and the held-out figures never share a
    problem, whatever their seeds.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (one of {sorted(SPLITS)})")
    # a str seed hashes deterministically (sha512); the name is the stream's
    rng = random.Random(f"tiny-{seed}-1")
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        while True:  # a split holds a fixed share of every kind, so this ends in a few draws
            task = _make_task(rng, kind, f"tiny-{kind}-s{seed}-{i}")
            if split is None or split_of(task) == split:
                break
        tasks.append(task)
    return tasks


# --------------------------------------------------------------------------------------------------
# Synthetic SFT traces

SUITED = {"math": "ensemble", "code": "tester"}  # the template each kind of task profits from most
OTHER_SHARE = 0.25  # designer samples that show another template (a prior over all four for RL)
WRONG_SHARE = (
    0.5  # critic/tester runs whose first reply is wrong, so the second call learns to fix it
)
# The weak teacher's habit (W2): the share of the tester's repairs in the cold start's traces that
# copy the failed program instead of fixing it. A world parameter, planted so that RL has a habit
# to lose, and one that only the tester's runs show.
COPY_SHARE = 0.3
# The Designer's prior (W3): "flat", its samples show the templates with these probabilities on
# every kind, chosen on the val split so that the cold start's exact P(template | kind) is about
# 25% each (docs/NOTES.md, issue #56)
PRIOR = "flat"
PRIOR_WEIGHTS = {
    "math": {"single": 0.1, "ensemble": 0.129, "critic": 0.303, "tester": 0.468},
    "code": {"single": 0.124, "ensemble": 0.143, "critic": 0.394, "tester": 0.338},
}


def oracle_reply(task):
    """The correct reply of any agent call on a tiny task: the worked steps (math: the chain; code:
    K read off the shown example), then the answer in the tag."""
    answer = task["answer"] if task["kind"] == "math" else task["metadata"]["solution"]
    return "".join(s + "\n" for s in task["metadata"]["steps"]) + f"<answer>{answer}</answer>"


def wrong_reply(task):
    """A plausible but wrong reply, the same every time for a task (a hash of its id picks it): the
    last step off by a little (math); for code, a catalogue function that fits the examples the task
    shows but fails a visible test (the natural mistake when the shown example is ambiguous), else
    one that fails a shown one. The critic and repair calls learn to correct it (sft_traces), and
    exact_figures scores the repairs of it."""
    rng = random.Random(f"wrong-{task['id']}")
    if task["kind"] == "math":
        steps = task["metadata"]["steps"]
        lhs, rhs = steps[-1].rsplit("=", 1)
        bad = str(int(rhs) + rng.choice([d for d in (-2, -1, 1, 2) if int(rhs) + d >= 0]))
        return "".join(s + "\n" for s in steps[:-1] + [f"{lhs}={bad}"]) + f"<answer>{bad}</answer>"
    pub = task["public_tests"]
    cases = [(i[0], o) for i, o in zip(pub["inputs"], pub["outputs"])]
    shown = [(i[0], o) for i, o in data.shown_examples(task)]
    fails = [e for e in CATALOGUE if any(_apply(e, x) != y for x, y in cases)]
    fits = [e for e in fails if all(_apply(e, x) == y for x, y in shown)]
    if not fits:  # a task whose shown example singles f out: a program that fails it, bare
        return f"<answer>def f(x): return {rng.choice(fails)}</answer>"
    # the other candidate, worked out from the shown example as the oracle works out f: the reply
    # a coder that guessed the wrong one writes
    other = rng.choice(fits)
    steps = _derivation(other, *shown[0])
    return "".join(s + "\n" for s in steps) + f"<answer>def f(x): return {other}</answer>"


def copy_reply(failed):
    """The weak teacher's repair (COPY_SHARE): the failed reply's program written again, bare (no
    worked steps: it reads nothing off the task or the failing case)."""
    return f"<answer>{mas.answer_of(failed)}</answer>"


def oracle_generate(tasks, wrong_first=(), copies=()):
    """A `generate` for sandbox.run_workflows that answers every call of run k correctly for
    tasks[k], except the first call of the runs in wrong_first, which gets wrong_reply, and the
    second call of the runs in copies, which copies its program (copy_reply: the weak teacher's
    repair). Running the real template scripts with it gives executor prompts exactly as rollouts
    will show them."""
    wrong_first, copies = set(wrong_first), set(copies)

    def generate(calls):
        replies = []
        for c in calls:
            t = tasks[c.run]
            if c.run in wrong_first and c.index == 0:
                replies.append(wrong_reply(t))
            elif c.run in copies and c.index == 1:
                replies.append(copy_reply(wrong_reply(t)))
            else:
                replies.append(oracle_reply(t))
        return replies

    return generate


def sft_traces(
    tasks,
    seed,
    other_share=OTHER_SHARE,
    wrong_share=WRONG_SHARE,
    prior=PRIOR,
    copy_share=COPY_SHARE,
):
    """(designer_samples, executor_samples), each sample {"messages": [...], "completion": str}.

    Designer: the short designer prompt -> the script of the template suited to the task's kind
    (SUITED), or with probability other_share one of the other templates, so that the choice carries
    signal but RL still sees every structure. Executor: every agent call the chosen template makes
    when run in the sandbox with oracle replies (identical (prompt, reply) pairs kept once).

    prior: the Designer's samples drawn apart from the Executor's (which stay the suited template's
    runs): "flat" (PRIOR, the default), each template with PRIOR_WEIGHTS' probability on every kind;
    a template name, the one shown with probability 1 - other_share on every kind instead of the
    suited one; or "suited" (the suited template, as the Executor's runs). A cold start whose
    Designer does not prefer the suited template, while its Executor has learned the same calls.

    copy_share: the weak teacher's habit (COPY_SHARE): in that share of the tester's repairs (the
    second call, after the wrong first reply failed a visible test) the target writes the failed
    program again (copy_reply) instead of the oracle's reply, which always switches to the other
    function the shown example fits. The habit appears only after a failed test, so only in the
    tester's runs."""
    if prior not in ("flat", "suited", *mas.TEMPLATES):
        raise ValueError(f"tiny.sft_traces: prior {prior!r} (flat, suited or a template's name)")
    rng = random.Random(f"tiny-sft-{seed}")
    prior_rng = random.Random(f"tiny-prior-{seed}")
    copy_rng = random.Random(f"tiny-copy-{seed}")
    names = list(mas.TEMPLATES)
    chosen, shown, wrong_first, copies = [], [], [], []
    for k, t in enumerate(tasks):
        suited = SUITED.get(t["kind"], "single")
        others = [n for n in names if n != suited]
        name = rng.choice(others) if others and rng.random() < other_share else suited
        chosen.append(name)
        shown.append(name)
        if prior == "flat":  # the Designer's template, from its own prior
            weights = [PRIOR_WEIGHTS[t["kind"]][n] for n in names]
            shown[-1] = prior_rng.choices(names, weights)[0]
        elif prior != "suited":
            rest = [n for n in names if n != prior]
            shown[-1] = prior_rng.choice(rest) if prior_rng.random() < other_share else prior
        # the tester repairs only what visible tests catch, so it gets wrong first replies on code
        # alone
        if (
            name == "critic" or (name == "tester" and t["kind"] == "code")
        ) and rng.random() < wrong_share:
            wrong_first.append(k)
            if name == "tester" and copy_rng.random() < copy_share:
                copies.append(k)
    # width: a bounded number of live children; thousands at once would only thrash a small machine
    runs = sandbox.run_workflows(
        [mas.TEMPLATES[n] for n in chosen],
        tasks,
        oracle_generate(tasks, wrong_first, copies),
        equal=reward.math_equal,
        width=64,
        short=True,
    )
    designer, executor, seen, copies = [], [], set(), set(copies)
    for k, (t, name, show, run) in enumerate(zip(tasks, chosen, shown, runs)):
        gold = oracle_reply(t)
        if run.error is not None or (k not in copies and mas.answer_of(gold) != run.answer):
            raise RuntimeError(
                f"tiny.sft_traces: template {name!r} failed on {t['id']}: {run.error or run.answer}"
            )
        designer.append(
            {
                "messages": mas.designer_messages(data.task_text(t, short=True), short=True),
                "completion": mas.script_completion(mas.TEMPLATES[show]),
            }
        )
        for c in run.calls:
            key = json.dumps([c.messages, c.reply])
            # wrong first replies are context, never targets; a planted copy is a target
            target = c.reply == gold or (k in copies and c.index == 1)
            if target and key not in seen:
                seen.add(key)
                executor.append({"messages": c.messages, "completion": c.reply})
    return designer, executor


# --------------------------------------------------------------------------------------------------
# Exact figures: what a policy would write, by teacher forcing instead of sampling


# The Executor's contexts: which call of which template, run with which first reply. "solver" is the
# single agent's call (ensemble and critic ask the same prompt), "coder" the tester's first call,
# "repair" its second after the frozen wrong program (wrong_reply) failed the visible tests (code
# only), "keep" / "fix" the critic after a right / the wrong proposal. The target is the oracle
# reply, except in "copy": the repair's prompt, and the failed program again (copy_reply: the
# habit).
# name: (template, call, wrong first)
CONTEXTS = {
    "solver": ("single", 0, False),
    "coder": ("tester", 0, False),
    "repair": ("tester", 1, True),
    "copy": ("tester", 1, True),
    "keep": ("critic", 1, False),
    "fix": ("critic", 1, True),
}
COPIES = {"copy"}  # the contexts whose target is the failed first reply
# the contexts each template's calls see
CALLS = {
    "single": ("solver",),
    "ensemble": ("solver",),
    "critic": ("solver", "keep", "fix"),
    "tester": ("coder", "repair"),
}


def executor_contexts(tasks):
    """{context: [(messages, completion) or None, one a task]}: the prompts exactly as a rollout
    shows them (the real template run in the sandbox with oracle replies, or with wrong_reply first)
    and the oracle reply. None where a context does not occur (repair on math: its run_tests has no
    visible tests, so it passes)."""
    out = {}
    for name, (template, call, wrong) in CONTEXTS.items():
        runs = sandbox.run_workflows(
            [mas.TEMPLATES[template]] * len(tasks),
            tasks,
            oracle_generate(tasks, range(len(tasks)) if wrong else ()),
            equal=reward.math_equal,
            width=64,
            short=True,
        )
        out[name] = []
        for t, run in zip(tasks, runs):
            if run.error is not None:
                raise RuntimeError(
                    f"tiny.executor_contexts: {template} failed on {t['id']}: {run.error}"
                )
            target = copy_reply(wrong_reply(t)) if name in COPIES else oracle_reply(t)
            out[name].append((run.calls[call].messages, target) if len(run.calls) > call else None)
    return out


def repair_contexts(tasks, first_replies, copy=False):
    """[(messages, oracle reply) or None, one a task]: the tester's repair call after a first reply
    of the model's own (first_replies[task id], e.g. a cold start's sampled coder reply) failed the
    visible tests, the prompt exactly as a rollout shows it. None where the task has no such reply,
    or where the reply passed run_tests (then the tester makes no second call). final_table's
    `repair_own` row: repairs of the programs the model itself gets wrong, not of wrong_reply's
    (in this world, where the shown example fits two functions, the switch to the other one).
    copy=True: the target writes the failed program again (copy_reply; final_table's `copy_own`:
    the habit)."""
    idx = [k for k, t in enumerate(tasks) if str(t["id"]) in first_replies]
    sub = [tasks[k] for k in idx]

    def generate(calls):
        replies = []
        for c in calls:
            own = c.index == 0
            replies.append(
                first_replies[str(sub[c.run]["id"])] if own else oracle_reply(sub[c.run])
            )
        return replies

    runs = sandbox.run_workflows(
        [mas.TEMPLATES["tester"]] * len(sub),
        sub,
        generate,
        equal=reward.math_equal,
        width=64,
        short=True,
    )
    out = [None] * len(tasks)
    for k, t, run in zip(idx, sub, runs):
        if run.error is None and len(run.calls) > 1:
            own = first_replies[str(t["id"])]
            target = copy_reply(own) if copy else oracle_reply(t)
            if not (copy and mas.answer_of(own) is None):  # no program to copy
                out[k] = (run.calls[1].messages, target)
    return out


def answer_span(tokenizer, completion):
    """(a, b): the completion tokens [a, b) that spell the answer inside <answer>...</answer> (the
    rest are the format and the worked steps), by the token counts of the text before each end
    (exact for the tiny tokenizer, one token a character); None without the tags."""
    i, j = completion.find("<answer>"), completion.rfind("</answer>")
    if i < 0 or j < i:
        return None
    i += len("<answer>")
    a = len(tokenizer(completion[:i], add_special_tokens=False)["input_ids"])
    b = len(tokenizer(completion[:j], add_special_tokens=False)["input_ids"])
    return a, b


def executor_score(contexts, kinds, shares):
    """The Executor's primary exact row, one value a task: its contexts weighted as the Designer's
    structures would call them,  E_t = sum_s shares[kind_t][s] * mean_{c in CALLS[s], c occurs for
    t} P_c(t), with shares[kind][s] a fixed distribution over the templates (final_table: the SFT
    Designer's mean P(template | kind)), so that two policies' rows pair task by task."""
    out = []
    for k, kind in enumerate(kinds):
        total = 0.0
        for s, w in shares[kind].items():
            ps = [contexts[c][k] for c in CALLS[s] if contexts[c][k] is not None]
            total += w * sum(ps) / len(ps)
        out.append(total)
    return out


def exact_figures(
    model, tokenizer, tasks, batch_size=32, designer=True, executor=True, contexts=None
):
    """Sampling-free figures of a policy on tiny tasks (one teacher-forced forward per script or
    reply):

        choice[k][name]  = P(the Designer writes template `name`'s script, exactly, for tasks[k])
        contexts[c][k]   = P(the Executor writes the oracle reply, exactly, in context c of
                           tasks[k]) (CONTEXTS; None where c does not occur for the task)
        oracle[k]        = contexts["solver"][k], the single agent's call
        contexts_answer[c][k] = P(the answer tokens | the reply before them), answer_span's tokens
        contexts_steps[c][k]  = contexts[c][k] / contexts_answer[c][k]: the format and step tokens

    (and the natural logs, choice_logp and contexts_logp, which do not underflow for an untrained
    model). designer=False / executor=False skip a role's forwards (separate policies score each
    model on its own); contexts: executor_contexts(tasks), when the caller scores several policies
    on the same tasks.

    A sampled evaluation of 200 tasks at T=1 carries ~3.5 points of noise; these are exact for the
    tasks given, so the paired difference between two models measures what training changed in the
    Designer's choice of structure and in the Executor, with only the draw of tasks left as error.
    The mass that no template gets goes to other scripts (variants, or ones that do not parse).
    Under FSDP2 every rank must call this with the same tasks: each forward is collective."""
    samples, where = [], []  # where[s]: the (table, key) that sample s's log-prob goes to
    contexts = contexts or (executor_contexts(tasks) if executor else {})
    choice_logp, contexts_logp = [{} for _ in tasks], {c: [None] * len(tasks) for c in contexts}
    answer_logp = {c: [None] * len(tasks) for c in contexts}  # the answer tokens' part
    if designer:
        for k, t in enumerate(tasks):
            for n in mas.TEMPLATES:
                samples.append(
                    {
                        "messages": mas.designer_messages(
                            data.task_text(t, short=True), short=True
                        ),
                        "completion": mas.script_completion(mas.TEMPLATES[n]),
                    }
                )
                where.append((choice_logp[k], n))
    spans = [None] * len(samples)
    if executor:
        for c, pairs in contexts.items():
            for k, pair in enumerate(pairs):
                if pair is not None:
                    samples.append({"messages": pair[0], "completion": pair[1]})
                    where.append((c, k))
                    spans.append(answer_span(tokenizer, pair[1]))
    logps, span_logps = _sequence_logprobs(model, tokenizer, samples, batch_size, spans)
    for (table, key), lp, span_lp in zip(where, logps, span_logps):
        if isinstance(table, str):  # an executor context
            contexts_logp[table][key], answer_logp[table][key] = lp, span_lp
        else:
            table[key] = lp
    out = {}
    if designer:
        out["choice_logp"] = choice_logp
        out["choice"] = [{n: math.exp(v) for n, v in c.items()} for c in choice_logp]
    if executor:
        out["contexts_logp"] = contexts_logp
        out["contexts"] = {
            c: [None if v is None else math.exp(v) for v in vs] for c, vs in contexts_logp.items()
        }
        out["oracle"] = out["contexts"]["solver"]
        # P(oracle) = P(answer tokens | the rest before them) * P(format and step tokens | ...):
        # the two factors, so that a gain can be located
        out["contexts_answer"] = {
            c: [None if v is None else math.exp(v) for v in vs] for c, vs in answer_logp.items()
        }
        out["contexts_steps"] = {}
        for c, vs in contexts_logp.items():
            parts = zip(vs, answer_logp[c])
            out["contexts_steps"][c] = [None if v is None else math.exp(v - a) for v, a in parts]
    return out


def _sequence_logprobs(model, tokenizer, samples, batch_size, spans=None):
    """(log P(completion | messages) for each sample, by the trainer's own packing
    (rollout.samples_to_tensors: right padding, completion mask) and log-probs
    (logprob_rows.chunked_token_logprobs), in float64 sums; and the sum over each sample's span of
    completion tokens [a, b) (spans[s], None: no span, sum 0.0))."""
    spans = spans or [None] * len(samples)
    encoded, _ = engine.encode_samples(tokenizer, samples)
    seqs = [
        rollout.Sample(ids[:p], ids[p:], [0.0] * (len(ids) - p), (k,))
        for k, (ids, p) in enumerate(encoded)
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    seq_logp, span_logp = [], []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for s in range(0, len(seqs), batch_size):
            b = rollout.samples_to_tensors(seqs[s : s + batch_size], pad, device)
            lp = logprob_rows.chunked_token_logprobs(
                model, b["input_ids"], b["attention_mask"]
            ).double()
            seq_logp += (lp * b["completion_mask"]).sum(-1).tolist()
            for r, span in enumerate(spans[s : s + batch_size]):
                # the completion's tokens in order: completion_mask marks them
                own = lp[r][b["completion_mask"][r].bool()]
                span_logp.append(0.0 if span is None else float(own[span[0] : span[1]].sum()))
    model.train(was_training)
    return seq_logp, span_logp


# --------------------------------------------------------------------------------------------------
# The cold start and the held-out tasks, as files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_SEED = 10_007  # the held-out tasks of evaluate.py's --tasks tiny: the "eval" split


def cold_start(out, seed=0, separate=False):
    """The tiny world's cold start, `python sft.py --no_eval` in a process of its own (not a rank of
    the caller's torchrun job): out/ holds the model, or out/designer and out/executor with
    separate=True."""
    print(f"{out} is missing: running the SFT cold start (python sft.py)", flush=True)
    ours = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {}
    for k, v in os.environ.items():
        if k not in ours and not k.startswith("TORCHELASTIC"):
            env[k] = v
    cmd = [sys.executable, os.path.join(ROOT, "sft.py"), "--no_eval", "--seed", str(seed)]
    cmd += ["--out", out] + ["--roles", "separate"] * separate
    subprocess.run(cmd, check=True, env=env)


def main(argv):
    p = argparse.ArgumentParser(prog="tiny.py", description="the tiny world's held-out tasks")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tasks", help="write held-out tasks (evaluate.py --tasks tiny reads them)")
    t.add_argument("--n", type=int, default=200)
    t.add_argument("--split", default="eval", choices=sorted(SPLITS))
    t.add_argument("--seed", type=int, default=EVAL_SEED)
    t.add_argument("--out", default=os.path.join(ROOT, "data", "tiny.jsonl"))
    a = p.parse_args(argv)
    data.save_tasks(make_tasks(a.n, seed=a.seed, split=a.split), a.out)
    print(f"wrote {a.n} tiny {a.split} tasks to {a.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
