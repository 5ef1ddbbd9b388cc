"""Tests for rollout.py on tiny Qwen3 models from tiny.py (1 layer, hidden 64), transformers
backend, and vLLM when it is installed. A random model writes no parseable script, so the Designer
paths use a model trained here for a few seconds to answer math prompts with a one-agent script and
code prompts with junk."""

import itertools
import math
from collections import Counter

import pytest
import torch

import grpo
import mas
import reward
from machinery import data, engine
from rollout import rollout, samples_to_tensors
from world import tiny

TASKS = tiny.make_tasks(2, seed=0)  # one math task, one code task
EXEC = engine.Sampling(temperature=1.0, max_tokens=12)
LAM = 0.4  # λ, as settings.Config.lam
SCRIPT = '```python\ndef workflow(task):\n    return Agent("a")(task)\n```'


class Counting:
    """The real engine, with a record of the size of every batch it generates: a generate call's
    prompts, or the prompts submitted before a poll."""

    def __init__(self, eng):
        self.eng, self.tokenizer, self.sizes, self.queued = eng, eng.tokenizer, [], 0

    def generate(self, prompts, sampling):
        self.sizes.append(len(prompts))
        return self.eng.generate(prompts, sampling)

    def submit(self, key, prompt, sampling):
        self.queued += 1
        self.eng.submit(key, prompt, sampling)

    def poll(self):
        if self.queued:
            self.sizes.append(self.queued)
        self.queued = 0
        return self.eng.poll()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(
        tiny.save_tiny(tmp_path_factory.mktemp("tiny"), seed=0, num_layers=1, hidden_size=64)
    )


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return engine.make_engine(tiny_dir, backend="hf")


@pytest.fixture(scope="module")
def vllm_engine(tiny_dir):
    pytest.importorskip("vllm", reason="vLLM is not installed: the vLLM rollout test is skipped")
    return engine.make_engine(tiny_dir, backend="vllm", kv_cache_gib=0.25)


@pytest.fixture(scope="module")
def designer():
    """A tiny model taught (masked SFT, a few seconds) to reply SCRIPT to math prompts and "no" to
    code."""
    model, tok = tiny.build_model(seed=1, num_layers=1, hidden_size=64)
    seqs = []
    for t in tiny.make_tasks(4, seed=1):
        p = tok.apply_chat_template(
            mas.designer_messages(data.task_text(t), short=True),
            tokenize=False,
            add_generation_prompt=True,
        )
        p = tok(p, add_special_tokens=False)["input_ids"]
        c = tok(SCRIPT if t["kind"] == "math" else "no", add_special_tokens=False)["input_ids"]
        seqs.append((p, c + [tok.eos_token_id]))
    T = max(len(p) + len(c) for p, c in seqs)
    ids = torch.full((len(seqs), T), tok.pad_token_id)
    labels = torch.full((len(seqs), T), -100)
    mask = torch.zeros(len(seqs), T, dtype=torch.long)
    for k, (p, c) in enumerate(seqs):
        ids[k, : len(p) + len(c)] = torch.tensor(p + c)
        mask[k, : len(p) + len(c)] = 1
        labels[k, len(p) : len(p) + len(c)] = torch.tensor(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    target = labels[:, 1:] != -100
    for _ in range(200):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        if torch.equal(out.logits[:, :-1].argmax(-1)[target], labels[:, 1:][target]):
            break  # greedy decoding now writes exactly the targets
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return engine.HFEngine(model.eval(), tok)


def check_batch(b, eng, tasks, M, N, lam=0.4):
    """Everything that must hold for any batch: shapes, indices, token ids vs recorded replies,
    rewards."""
    B = len(tasks)
    assert b.R.shape == b.executed.shape == (B, M, N) and b.executed.dtype == torch.bool
    assert [(r.q, r.i, r.j) for r in b.runs] == list(
        itertools.product(range(B), range(M), range(N))
    )
    per_run = Counter(s.index for s in b.executor)
    for r in b.runs:
        assert b.run(r.q, r.i, r.j) is r
        # r.reward rounded to fp32: 2^-24 relative
        assert b.R[r.q, r.i, r.j].item() == pytest.approx(r.reward)
        assert b.executed[r.q, r.i, r.j].item() == (r.run is not None)
        if r.run is None:  # not executed
            assert r.structure is None and r.n_calls == 0 and per_run[(r.q, r.i, r.j)] == 0
            continue
        assert per_run[(r.q, r.i, r.j)] == r.n_calls == len(r.run.calls)
        assert r.reward == pytest.approx(reward.reward(tasks[r.q], r.run, lam=lam))
    for s in b.executor:
        rec = b.run(*s.index).run.calls[s.call]
        assert rec.index == s.call
        # the trained-on ids are the engine's: they decode to the reply the script saw, and the
        # prompt ids are the call's chat prompt
        assert eng.tokenizer.decode(s.completion_ids, skip_special_tokens=True) == rec.reply
        assert s.prompt_ids == eng.encode_prompt(rec.messages)
        assert len(s.logprobs) == len(s.completion_ids) > 0
        assert all(lp <= 0 for lp in s.logprobs)
    for r in b.runs:
        mine = [s for s in b.executor if s.index == (r.q, r.i, r.j)]
        assert r.tokens == sum(len(s.completion_ids) for s in mine)


@pytest.mark.parametrize(
    "template,ticks", [("critic", [8, 8]), ("ensemble", [24]), ("single", [8])]
)
def test_fixed_structure_hf(hf, template, ticks):
    eng = Counting(hf)
    b = rollout(TASKS, None, eng, M=2, N=2, template=template, executor_sampling=EXEC, lam=LAM)
    check_batch(b, hf, TASKS, 2, 2)
    assert b.designer == []
    assert all(r.structure == template and r.error is None for r in b.runs)
    # one generate call per tick, holding every pending call of all 8 runs
    assert eng.sizes == ticks
    assert b.stats["generate_calls"] == len(ticks)
    assert b.scripts == [[mas.TEMPLATES[template]] * 2] * 2


def test_fixed_structure_vllm(vllm_engine):
    eng = Counting(vllm_engine)
    b = rollout(TASKS, None, eng, M=2, N=2, template="critic", executor_sampling=EXEC, lam=LAM)
    check_batch(b, vllm_engine, TASKS, 2, 2)
    assert all(r.structure == "critic" and r.error is None for r in b.runs)
    assert eng.sizes == [8, 8]


def test_unparseable_scripts_score_zero_and_stay_in_group(hf):
    eng = Counting(hf)
    ds = engine.Sampling(temperature=1.0, max_tokens=24)
    b = rollout(
        TASKS, eng, eng, M=3, N=2, designer_sampling=ds, executor_sampling=EXEC, short=True, lam=LAM
    )
    assert eng.sizes == [6]  # all B*M designer prompts in one call; nothing executed
    assert sorted(s.index for s in b.designer) == list(itertools.product(range(2), range(3)))
    assert b.scripts == [[None] * 3] * 2
    assert torch.equal(b.R, torch.zeros(2, 3, 2))
    assert all(r.error.startswith("unparseable script: ") and r.run is None for r in b.runs)
    assert b.executor == []
    check_batch(b, hf, TASKS, 3, 2)
    for s in b.designer:
        assert (
            hf.tokenizer.decode(s.completion_ids, skip_special_tokens=True)
            == b.designer_texts[s.index[0]][s.index[1]]
        )


@pytest.mark.parametrize("policies", ["shared", "separate"])
def test_designer_mix_of_parseable_and_not(designer, hf, policies):
    tasks = tiny.make_tasks(4, seed=2)  # math, code, math, code
    ex = Counting(designer if policies == "shared" else hf)
    b = rollout(
        tasks,
        designer,
        ex,
        M=2,
        N=3,
        step=3,
        designer_sampling=engine.Sampling(temperature=0, max_tokens=64),
        executor_sampling=EXEC,
        short=True,
        lam=LAM,
    )
    script, _ = mas.parse_script(SCRIPT)
    assert b.scripts == [[script] * 2 if t["kind"] == "math" else [None] * 2 for t in tasks]
    check_batch(b, designer if policies == "shared" else hf, tasks, 2, 3)
    assert ex.sizes == [12]  # 2 math tasks x M=2 x N=3 runs, one call each, all in one tick
    for r in b.runs:
        if tasks[r.q]["kind"] == "math":
            assert r.structure == mas.structure_of(script) and r.error is None and r.n_calls == 1
        else:
            assert r.run is None and r.reward == 0.0
    assert len(b.designer) == 8


class Loading:
    """The real engine, with a record of every state dict loaded into it."""

    def __init__(self, eng):
        self.eng, self.loaded = eng, []

    def generate(self, prompts, sampling):
        return self.eng.generate(prompts, sampling)

    def submit(self, key, prompt, sampling):
        self.eng.submit(key, prompt, sampling)

    def poll(self):
        return self.eng.poll()

    def load_weights(self, weights):
        self.loaded.append(weights)
        self.eng.load_weights(weights)


def test_one_engine_plays_two_roles_through_its_views(designer, hf):
    """Separate policies on one engine (machinery/weights.py): each role's view loads that role's
    weights when the engine holds the other's, and the batch is the one two engines roll out."""
    import copy

    from machinery import weights

    tasks = tiny.make_tasks(4, seed=2)  # math, code, math, code: two tasks' scripts parse
    kw = dict(
        designer_sampling=engine.Sampling(temperature=0, max_tokens=64),
        executor_sampling=EXEC,
        short=True,
        lam=LAM,
    )
    two = rollout(tasks, designer, hf, M=2, N=3, step=3, **kw)
    one = Loading(engine.HFEngine(copy.deepcopy(designer.model), designer.tokenizer))
    state = {"designer": designer.model.state_dict(), "executor": hf.model.state_dict()}
    # the engine starts with the Designer's weights
    held = weights.EngineWeights(one, state, held="designer")
    got = rollout(tasks, held.view("designer"), held.view("executor"), M=2, N=3, step=3, **kw)
    # once, before the first agent call
    assert [w is state["executor"] for w in one.loaded] == [True]
    assert torch.equal(got.R, two.R) and got.scripts == two.scripts
    for a, b in ((got.designer, two.designer), (got.executor, two.executor)):
        assert [(s.index, s.completion_ids) for s in a] == [(s.index, s.completion_ids) for s in b]
    # a second rollout: the design phase loads the Designer's weights back, the execution phase the
    # Executor's
    rollout(tasks, held.view("designer"), held.view("executor"), M=2, N=3, step=3, **kw)
    assert [w is state["designer"] for w in one.loaded] == [False, True, False]


def test_reproducible(hf):
    ds = engine.Sampling(temperature=1.0, max_tokens=16)

    def go(step, template):
        return rollout(
            TASKS,
            hf,
            hf,
            M=2,
            N=2,
            step=step,
            template=template,
            short=True,
            designer_sampling=ds,
            executor_sampling=EXEC,
            lam=LAM,
        )

    def key(b):
        return (
            b.R.tolist(),
            [
                (s.index, s.call, s.prompt_ids, s.completion_ids, s.logprobs)
                for s in b.designer + b.executor
            ],
            [(r.answer, r.error, r.n_calls, r.tokens) for r in b.runs],
            b.designer_texts,
        )

    # bit for bit: the same computation twice, same batch, same process
    for template in (
        "critic",
        None,
    ):
        assert key(go(5, template)) == key(go(5, template))
    # two ranks each rolling out half of the batch (q_offset = their first global query) draw
    # exactly what one process rolling out the whole batch draws
    whole = rollout(
        TASKS,
        hf,
        hf,
        M=2,
        N=2,
        step=5,
        short=True,
        designer_sampling=ds,
        executor_sampling=EXEC,
        lam=LAM,
    )
    halves = [
        rollout(
            TASKS[k : k + 1],
            hf,
            hf,
            M=2,
            N=2,
            step=5,
            short=True,
            designer_sampling=ds,
            executor_sampling=EXEC,
            q_offset=k,
            lam=LAM,
        )
        for k in range(len(TASKS))
    ]

    def toks(samples):
        return [(s.index[1:], s.call, s.completion_ids) for s in samples]

    assert toks(whole.designer) == [t for h in halves for t in toks(h.designer)]
    assert toks(whole.executor) == [t for h in halves for t in toks(h.executor)]
    # exact: rewards are graded from the (equal) tokens' text, not computed from floats
    assert torch.equal(whole.R, torch.cat([h.R for h in halves]))
    a, c = go(5, "critic"), go(6, "critic")
    assert [s.completion_ids for s in a.executor] != [s.completion_ids for s in c.executor]


def test_samples_to_tensors_aligned_with_token_logprobs(hf):
    b = rollout(
        TASKS,
        None,
        hf,
        M=1,
        N=2,
        template="critic",
        executor_sampling=engine.Sampling(max_tokens=12),
        lam=LAM,
    )
    t = samples_to_tensors(b.executor, pad_id=hf.pad_id)
    S = len(b.executor)
    T = max(len(s.prompt_ids) + len(s.completion_ids) for s in b.executor)
    assert t["input_ids"].shape == t["attention_mask"].shape == (S, T)
    assert t["completion_mask"].shape == t["logprobs"].shape == (S, T - 1)
    assert t["completion_mask"].sum().item() == sum(len(s.completion_ids) for s in b.executor)
    with torch.no_grad():
        lp = grpo.token_logprobs(hf.model, t["input_ids"], t["attention_mask"])
        z = hf.model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits[:, :-1]
    m = t["completion_mask"].bool()
    # the engine's KV-cache steps (left padding) and the trainer's one forward (right padding): two
    # fp32 computations of logp = z/T - logsumexp(z/T), numbers up to S = max|z/T| + log V, each
    # within ~8 ulps of S of the exact value (test_engine.logp_tol): 16·eps·S apart at most
    tol = 16 * 2.0**-23 * (z[m].abs().max().item() + math.log(z.shape[-1]))
    torch.testing.assert_close(lp[m], t["logprobs"][m], rtol=0, atol=tol)
    # position t predicts token t+1: the mask starts at the last prompt token
    s0 = b.executor[0]
    P = len(s0.prompt_ids)
    assert t["completion_mask"][0, P - 2].item() == 0 and t["completion_mask"][0, P - 1].item() == 1
    assert t["input_ids"][0, P].item() == s0.completion_ids[0]


class Failing:
    """The real engine, which fails (as vLLM does when its core dies) once it has served `ok`
    calls."""

    def __init__(self, eng, ok):
        self.eng, self.tokenizer, self.ok = eng, eng.tokenizer, ok

    def generate(self, prompts, sampling):
        if self.ok == 0:
            raise RuntimeError("engine core died")
        self.ok -= 1
        return self.eng.generate(prompts, sampling)

    def submit(self, key, prompt, sampling):
        self.eng.submit(key, prompt, sampling)

    def poll(self):
        if self.ok == 0:
            raise RuntimeError("engine core died")
        self.ok -= 1
        return self.eng.poll()


class FailingSubmit(Failing):
    """The real engine, whose submit fails (vLLM asleep, or its core gone) after `ok` requests."""

    def submit(self, key, prompt, sampling):
        if self.ok == 0:
            raise RuntimeError("engine core died")
        self.ok -= 1
        self.eng.submit(key, prompt, sampling)

    def poll(self):
        return self.eng.poll()


@pytest.mark.parametrize("schedule", ["ticks", "continuous"])
@pytest.mark.parametrize("failing", [Failing, FailingSubmit])
def test_engine_failure_is_raised_not_scored(hf, failing, schedule):
    # the sandbox turns a failed submit or poll into failed runs; rollout must not hand those to
    # the trainer
    with pytest.raises(RuntimeError, match="engine core died"):
        rollout(
            TASKS,
            None,
            failing(hf, ok=1),
            M=1,
            N=2,
            template="critic",
            executor_sampling=EXEC,
            lam=LAM,
            schedule=schedule,
        )


class Canned:
    """An engine that replies from a short list, in turn: many runs of a batch return the same
    answer."""

    def __init__(self, replies):
        self.replies, self.served, self.queued = replies, 0, []

    def generate(self, prompts, sampling):
        outs = []
        for _ in prompts:
            text = self.replies[self.served % len(self.replies)]
            self.served += 1
            outs.append([engine.Completion([1, 2], [3], text, [-0.5], "stop")])
        return outs

    def submit(self, key, prompt, sampling):
        self.queued.append((key, prompt))

    def poll(self):
        queued, self.queued = self.queued, []
        outs = self.generate([p for _, p in queued], None)
        return [(key, out) for (key, _), out in zip(queued, outs)]


def _counting_correctness(monkeypatch):
    graded = []
    real = reward.correctness

    def counting(task, answer, *a, **k):
        graded.append((task["id"], answer))
        return real(task, answer, *a, **k)

    monkeypatch.setattr(reward, "correctness", counting)
    return graded


def test_grade_each_distinct_answer_once_same_rewards(monkeypatch):
    # a real batch: right and wrong programs and answers, the same answer with and without a
    # well-formed tag (same correctness, different format)
    code = TASKS[1]["metadata"]["solution"]
    replies = [
        f"<answer>{code}</answer>",
        "<answer>3</answer>",
        f"<answer>{code}</answer> <answer>",
        "<answer>def f(x): return x</answer>",
        f"<answer>```python\n{code}\n```</answer>",
    ]
    b = rollout(TASKS, None, Canned(replies), M=2, N=3, template="single", lam=LAM)
    pairs = [(TASKS[r.q], r.run) for r in b.runs]
    graded = _counting_correctness(monkeypatch)
    every = [reward.correctness(t, r.answer) for t, r in pairs]  # each run on its own
    assert len(graded) == 12
    graded.clear()
    assert reward.grade_runs(pairs) == every == [r.correct for r in b.runs]
    assert (
        len(graded)
        == len({(t["id"], reward.graded_part(t["kind"], r.answer)) for t, r in pairs})
        < 12
    )
    # R is reward.reward's, from those grades: what reward.reward gives each run on its own
    assert [r.reward for r in b.runs] == [
        reward.reward(t, run, lam=LAM, correct=c) for c, (t, run) in zip(every, pairs)
    ]
    assert [r.reward for r in b.runs] == [reward.reward(t, run, lam=LAM) for t, run in pairs]
    assert [r.reward for r in b.runs] == [
        c + LAM * reward.format_score(r.run) for c, r in zip(every, b.runs)
    ]
    # stored in fp32
    assert b.R.flatten().tolist() == pytest.approx([r.reward for r in b.runs], abs=1e-7)
    assert len({r.reward for r in b.runs}) >= 3  # rewards do differ
    # a hand-made list: the same answer in several runs, with different replies (format) and errors,
    # a None answer, equal tasks in two dicts (graded apart: the key is the task object)
    from sandbox import CallRecord, WorkflowRun

    def run(answer, replies, error=None):
        return WorkflowRun(answer, error, [CallRecord("a", [], r, None) for r in replies])

    math, fn = TASKS
    fn2 = dict(fn, tests=dict(fn["tests"], outputs=[100] * 5))  # same id, other hidden tests
    pairs = [
        (math, run("3", ["<answer>3</answer>"])),
        (math, run("<answer>3</answer>", ["x"])),
        (math, run("\\boxed{3}", ["<answer>3</answer>", "y"])),
        (math, run("4", ["<answer>4</answer>"])),
        (math, run(None, ["<answer>3</answer>"], "NameError")),
        (fn, run(code, ["<answer>1</answer>"])),
        (fn, run(f"```python\n{code}\n```", [])),
        (fn, run(code, ["z"], "late error")),
        (fn2, run(code, ["<answer>1</answer>"])),
        (dict(fn), run("def f(x): return x", [])),
    ]
    graded.clear()
    every = [reward.reward(t, r, lam=LAM) for t, r in pairs]
    graded.clear()
    for workers in (3, 1):
        correct = reward.grade_runs(pairs, workers=workers)
        got = [reward.reward(t, r, lam=LAM, correct=c) for c, (t, r) in zip(correct, pairs)]
        assert got == every
    # fp64 sums of 1, 0.4 x (0, 1/2, 1): exact up to one rounding of 0.4 * x
    assert every == pytest.approx([1.4, 1.0, 1.2, 0.4, 0.4, 1.4, 1.0, 1.0, 0.4, 0.0])
    assert len(graded) == 2 * 6  # per call: 3, 4, None; code, fn2's code, the wrong program
