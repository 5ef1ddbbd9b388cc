"""tiny.py: tokenizer, chat template, model save/load, the synthetic world and its SFT traces."""

import json
import math
import re
import subprocess
import sys

import pytest
import torch

from world import tiny

try:
    import sandbox

    SANDBOX, WHY = sandbox.isolation(), ""
except Exception as e:  # no user namespaces here (SandboxUnavailable), or sandbox.py missing
    SANDBOX, WHY = None, str(e)
needs_sandbox = pytest.mark.skipif(SANDBOX is None, reason=f"no sandbox here: {WHY}")


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


def test_tokenizer_round_trip_is_one_token_per_character(tok):
    text = "def f(x): return x*3+1\n\t<answer>42</answer> ~!{}"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_unknown_characters_map_to_unk(tok):
    ids = tok("π≈3.14 é")["input_ids"]
    assert ids.count(tok.unk_token_id) == 3
    assert len(ids) == len("π≈3.14 é")
    assert tok.decode(ids, skip_special_tokens=True) == "3.14 "


def test_special_tokens_are_single_ids(tok):
    for s in tiny.SPECIALS:
        assert tok(s)["input_ids"] == [tok.convert_tokens_to_ids(s)]
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<|pad|>" and tok.unk_token == "<|unk|>"
    assert len({tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}) == 3


def test_chat_template(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>Be brief.<|end|><|user|>1+1?<|end|><|assistant|>"
    no_gen = tok.apply_chat_template(msgs, tokenize=False)
    assert no_gen == "<|system|>Be brief.<|end|><|user|>1+1?<|end|>"
    full = msgs + [{"role": "assistant", "content": "<answer>2</answer>"}]
    assert tok.apply_chat_template(full, tokenize=False).endswith(
        "<|assistant|><answer>2</answer><|end|>"
    )
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    assert tok.decode(ids) == text
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_model_saves_and_reloads(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny.build_model(seed=3)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size >= len(tok)
    tiny.save_tiny(tmp_path, seed=3)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([tok2("Compute 2+3.")["input_ids"]])
    with torch.no_grad():
        # bit for bit: same weights (an exact fp32 round trip), same input, same shapes, one process
        assert torch.equal(model(ids).logits, model2(ids).logits)  # same seed, same weights
    msgs = [{"role": "user", "content": "hi"}]
    assert tok2.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(
        msgs, tokenize=False
    )
    assert tok2.decode(tok2("a\nb é")["input_ids"]) == "a\nb <|unk|>"
    out = model2.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok2.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 5) or out[0, -1].item() == tok2.eos_token_id


def test_make_tasks_is_deterministic_and_well_formed():
    a = tiny.make_tasks(40, seed=7)
    assert a == tiny.make_tasks(40, seed=7)
    assert a != tiny.make_tasks(40, seed=8)
    assert json.loads(json.dumps(a)) == a  # plain JSON, as data.save_tasks writes it
    assert len({t["id"] for t in a}) == 40
    assert [t["kind"] for t in a[:4]] == ["math", "code", "math", "code"]
    assert {t["kind"] for t in tiny.make_tasks(6, 0, kinds=("code",))} == {"code"}
    for t in a:
        assert set(t) >= {"id", "kind", "question", "answer", "source", "metadata"}
        if t["kind"] == "code":
            for k in ("tests", "public_tests"):
                assert t[k]["fn_name"] == "f" and len(t[k]["inputs"]) == len(t[k]["outputs"])
            assert not set(map(tuple, t["tests"]["inputs"])) & set(
                map(tuple, t["public_tests"]["inputs"])
            )


def test_splits_share_no_problem_whatever_the_seeds():
    from machinery import data

    draws = {s: tiny.make_tasks(600, seed=0 if s == "sft" else 1, split=s) for s in tiny.SPLITS}
    texts = {s: {data.task_text(t) for t in ts} for s, ts in draws.items()}
    for s, ts in draws.items():
        assert {tiny.split_of(t) for t in ts} == {s} and {t["kind"] for t in ts} == {"math", "code"}
    names = sorted(texts)
    for k, a in enumerate(names):  # sft, rl, val (tuning) and eval: no text in two of them
        for b in names[k + 1 :]:
            assert not texts[a] & texts[b], (a, b)
    # the same seed without a split draws from the whole world, so its tasks fall into every split
    assert {tiny.split_of(t) for t in tiny.make_tasks(100, seed=0)} == set(tiny.SPLITS)
    with pytest.raises(ValueError, match="unknown split"):
        tiny.make_tasks(2, seed=0, split="test")


def test_math_answers_are_exact():
    for t in tiny.make_tasks(60, seed=1, kinds=("math",)):
        expr = re.fullmatch(r"Compute ([0-9+\-*()]+)\.", t["question"]).group(1)
        assert str(eval(expr)) == t["answer"]  # Python's own precedence: the parentheses are right
        steps = t["metadata"]["steps"]
        assert len(steps) == 2
        assert steps[-1].endswith("=" + t["answer"])
        for s in steps:
            lhs, rhs = s.split("=")
            assert str(eval(lhs)) == rhs


def test_code_solutions_pass_hidden_and_visible_tests_in_a_subprocess():
    tasks = tiny.make_tasks(60, seed=5, kinds=("code",))
    prog = (
        "import json, sys\n"
        "res = []\n"
        "for code, tests in json.load(sys.stdin):\n"
        "    g = {}\n"
        "    exec(code, g)\n"
        "    res.append([g[tests['fn_name']](*i) for i in tests['inputs']] == tests['outputs'])\n"
        "print(json.dumps(res))\n"
    )
    jobs = [(t["metadata"]["solution"], t[k]) for t in tasks for k in ("tests", "public_tests")]
    out = subprocess.run(
        [sys.executable, "-c", prog],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert all(json.loads(out.stdout))


def test_visible_examples_single_out_the_function():
    # any catalogue function that fits the visible tests also fits the hidden ones: tester-of-k is
    # sound
    for t in tiny.make_tasks(40, seed=11, kinds=("code",)):
        pub, hid = t["public_tests"], t["tests"]
        for e in tiny.CATALOGUE:
            if all(tiny._apply(e, *i) == o for i, o in zip(pub["inputs"], pub["outputs"])):
                assert all(tiny._apply(e, *i) == o for i, o in zip(hid["inputs"], hid["outputs"]))


def test_wrong_reply_is_wrong_and_well_formed():
    import mas
    import reward

    for t in tiny.make_tasks(20, seed=4):
        bad, good = tiny.wrong_reply(t), tiny.oracle_reply(t)
        assert bad == tiny.wrong_reply(t)  # frozen: the same for every policy
        assert reward.correctness(t, mas.answer_of(good)) == 1.0
        assert mas.answer_of(bad) is not None and reward.correctness(t, mas.answer_of(bad)) == 0.0


def test_every_shown_example_fits_two_functions_and_the_wrong_reply_is_the_other():
    from machinery import data

    tasks = tiny.make_tasks(200, seed=3, kinds=("code",))
    right = 0
    for t in tasks:
        pub = t["public_tests"]
        (x0,), y0 = pub["inputs"][0], pub["outputs"][0]
        # one of the three tests shown
        assert data.task_text(t, short=True) == f"Write f(x).\nf({x0})=={y0}"
        (step,) = t["metadata"]["steps"]  # K read off the shown example, as a math chain step
        lhs, k = step.split("=")
        assert (
            str(eval(lhs)) == k
            and re.fullmatch(r"\d+[+-]\d+", lhs)
            and k in t["metadata"]["solution"]
        )
        assert tiny.oracle_reply(t) == f"{step}\n<answer>{t['metadata']['solution']}</answer>"
        # W1: the shown example fits f and exactly one other catalogue function
        fits = [e for e in tiny.CATALOGUE if tiny._apply(e, x0) == y0]
        solution = t["metadata"]["solution"].removeprefix("def f(x): return ")
        (other,) = [e for e in fits if e != solution]
        # the other one fails a visible test, and wrong_reply is it, worked out as the oracle works
        assert any(tiny._apply(other, *i) != o for i, o in zip(pub["inputs"], pub["outputs"]))
        (wstep,) = tiny._derivation(other, x0, y0)
        assert tiny.wrong_reply(t) == f"{wstep}\n<answer>def f(x): return {other}</answer>"
        right += "-x" in solution
    # f is drawn before the inputs, so given the example either candidate is f half the time: the
    # K-x family is one of the two candidates of every example (x+K and x-K never agree), so it is
    # f in ~half the tasks (SE ~3.5% of 200: 35% to 65% is beyond 4 SE)
    assert 0.35 * len(tasks) < right < 0.65 * len(tasks)


@needs_sandbox
def test_sft_traces_run_the_real_templates_with_oracle_replies():
    import mas

    tasks = tiny.make_tasks(24, seed=2)
    kw = dict(seed=0, other_share=0.6, wrong_share=1.0, prior="suited")
    designer, executor = tiny.sft_traces(tasks, **kw)
    assert designer == tiny.sft_traces(tasks, **kw)[0]
    assert len(designer) == len(tasks)
    structures = []
    for t, d in zip(tasks, designer):
        assert d["messages"][-1]["content"].startswith(t["question"])
        script, why = mas.parse_script(d["completion"])
        assert why is None, why
        structures.append((t["kind"], mas.structure_of(script)))
    assert set(s for _, s in structures) == set(mas.TEMPLATES)  # every template shows up
    suited = sum(s == tiny.SUITED[k] for k, s in structures)
    assert suited > len(tasks) / 3  # and the suited one most often
    golds = {mas.answer_of(tiny.oracle_reply(t)) for t in tasks}
    for s in executor:
        assert s["messages"][0]["role"] == "system" and s["messages"][1]["role"] == "user"
        # copy_share 0.5 by default: a repair's target may copy the failed program; every other
        # target is correct
        copied = "\nTests: FAIL" in s["messages"][1]["content"]
        assert copied or mas.answer_of(s["completion"]) in golds
    users = [s["messages"][1]["content"] for s in executor]
    # with wrong_share=1 every critic/tester run on code shows its second call something to fix
    assert any("\nAnswer: " in u for u in users)
    assert any("\nTests: FAIL" in u for u in users)


@needs_sandbox
def test_the_weak_teachers_repairs_copy_the_failed_reply_at_copy_share():
    import mas

    tasks = tiny.make_tasks(40, seed=2, kinds=("code",))
    kw = dict(seed=0, other_share=0.0, wrong_share=1.0)  # every task a tester run, wrong first
    for share in (0.0, 0.5, 1.0):
        _, executor = tiny.sft_traces(tasks, copy_share=share, **kw)
        repairs = [s for s in executor if "\nTests: FAIL" in s["messages"][1]["content"]]
        # a repair a task (two tasks that show the same prompt and reply: one sample)
        assert len(tasks) - 3 <= len(repairs) <= len(tasks)
        copied = 0
        for s in repairs:
            failed = s["messages"][1]["content"].split("\nCode:\n")[1].split("\nTests:")[0]
            copy = mas.answer_of(s["completion"]) == failed
            copied += copy
            # the copy is the failed program again, bare: no worked steps
            assert not copy or s["completion"] == f"<answer>{failed}</answer>"
        if share in (0.0, 1.0):
            assert copied == share * len(repairs)
        else:  # ~20 of ~40 (SE ~3.2; the draw is fixed by the seed): 8 to 32 is beyond 3.5 SE
            assert 8 <= copied <= 32


@needs_sandbox
def test_oracle_runs_score_full_reward():
    import mas
    import reward

    tasks = tiny.make_tasks(8, seed=9)
    runs = sandbox.run_workflows(
        [mas.TEMPLATES["tester"]] * 8, tasks, tiny.oracle_generate(tasks, {1, 3})
    )
    assert [reward.correctness(t, r.answer) for t, r in zip(tasks, runs)] == [1.0] * 8
    assert [len(r.calls) for r in runs[:4]] == [1, 2, 1, 2]  # the wrong first code got repaired


@needs_sandbox
def test_exact_figures_are_the_teacher_forced_sequence_logprobs():
    from transformers import AutoModelForCausalLM

    import mas

    torch.manual_seed(0)
    tok = tiny.build_tokenizer()
    model = AutoModelForCausalLM.from_config(tiny.tiny_config(hidden_size=64, num_layers=2)).eval()
    tasks = tiny.make_tasks(3, seed=5)
    # padded batches mixing designer and executor
    f = tiny.exact_figures(model, tok, tasks, batch_size=5)
    one = tiny.exact_figures(model, tok, tasks, batch_size=1)  # no padding at all
    # Sums of ~100-240 fp32 token log-probs from two computations (other batch rows and padding).
    # Each token's logp = z - logsumexp(z) is within ~8 ulps of its magnitude per side
    # (test_engine.logp_tol: here |z| <= ~1.2, so logsumexp ~ log V dominates); all are negative, so
    # the sums are within 16·eps·|sum| (fp32 eps = 2^-23) whatever the CPU. A padding or mask error
    # moves a token by >= 1e-2.
    rel = 16 * 2.0**-23
    for a, b in zip(f["choice_logp"], one["choice_logp"]):
        assert all(a[n] == pytest.approx(b[n], rel=rel, abs=0) for n in a)
    for c in tiny.CONTEXTS:
        for a, b in zip(f["contexts_logp"][c], one["contexts_logp"][c]):
            assert (a is None and b is None) or a == pytest.approx(b, rel=rel, abs=0)
    # tasks 0, 2 are math, 1 code: a repair only where visible tests can fail; the critic on both
    # kinds
    assert [v is None for v in f["contexts"]["repair"]] == [True, False, True]
    assert all(v is not None for c in ("solver", "coder", "keep", "fix") for v in f["contexts"][c])
    assert f["oracle"] == f["contexts"]["solver"]
    ex = tiny.exact_figures(model, tok, tasks, batch_size=5, designer=False)
    assert "choice" not in ex and ex["contexts"]["fix"] == pytest.approx(
        f["contexts"]["fix"], rel=rel, abs=0
    )
    # one sequence by hand: the Designer writing the tester script for task 0, closed by the
    # end-of-turn token
    text = sandbox._task_parts(tasks[0], short=True)[0]  # the text the sandbox hands a script
    prompt = tok.apply_chat_template(
        mas.designer_messages(text, short=True), tokenize=False, add_generation_prompt=True
    )
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(mas.script_completion(mas.TEMPLATES["tester"]), add_special_tokens=False)[
        "input_ids"
    ]
    ids = torch.tensor([p_ids + c_ids + [tok.eos_token_id]])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1).gather(-1, ids[0, 1:, None])[
            :, 0
        ]
    # as above
    assert f["choice_logp"][0]["tester"] == pytest.approx(
        lp[len(p_ids) - 1 :].sum().item(), rel=rel, abs=0
    )
    assert set(f["choice"][0]) == set(mas.TEMPLATES) and len(f["oracle"]) == len(tasks)
    assert all(0.0 <= p <= 1.0 for c in f["choice"] for p in c.values())
    assert all(x < 0 for x in f["contexts_logp"]["solver"])
    # the answer tokens' factor by hand: the solver's oracle reply for task 0, its tokens [a, b)
    messages, completion = tiny.executor_contexts(tasks)["solver"][0]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p_ids + c_ids + [tok.eos_token_id]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0][len(p_ids) - 1 :]
    a, b = tiny.answer_span(tok, completion)
    assert completion[a:b] == tasks[0]["answer"]  # one token a character
    answer = math.exp(lp[a:b].sum().item())
    # a sum of b - a (here 1-2) token log-probs: the same 16·eps bound, on the log
    assert f["contexts_answer"]["solver"][0] == pytest.approx(answer, rel=rel)
    # the two factors multiply back to the whole reply's probability, in every context
    for c in tiny.CONTEXTS:
        parts = zip(f["contexts"][c], f["contexts_answer"][c], f["contexts_steps"][c])
        for whole, ans, steps in parts:
            assert (whole is None and ans is None) or whole == pytest.approx(ans * steps, rel=1e-12)


def test_answer_span_is_the_text_between_the_tags(tok):
    reply = "7-5=2\n2+8=10\n<answer>10</answer>"
    a, b = tiny.answer_span(tok, reply)
    assert reply[a:b] == "10" and tiny.answer_span(tok, "no tags") is None


@needs_sandbox
def test_executor_contexts_are_the_prompts_a_rollout_shows():
    import mas

    tasks = tiny.make_tasks(2, seed=5, kinds=("code",))
    ctx = tiny.executor_contexts(tasks)
    for k, t in enumerate(tasks):
        shown = sandbox._task_parts(t, short=True)[0]  # the text the sandbox hands a script
        wrong = mas.answer_of(tiny.wrong_reply(t))
        for c in tiny.CONTEXTS:
            messages, completion = ctx[c][k]
            target = tiny.copy_reply(tiny.wrong_reply(t)) if c in tiny.COPIES else None
            target = target or tiny.oracle_reply(t)
            assert completion == target and messages[1]["content"].startswith(shown)
        assert ctx["copy"][k][0] == ctx["repair"][k][0]  # the habit, in the repair's prompt
        assert ctx["solver"][k][0][0]["content"].startswith("solver:")
        assert ctx["coder"][k][0][1]["content"] == shown
        # the frozen wrong program and its real test report
        repair = ctx["repair"][k][0][1]["content"]
        assert (
            repair.startswith(f"{shown}\nCode:\n{wrong}\nTests: FAIL ") and "expected: " in repair
        )
        assert ctx["keep"][k][0][1]["content"] == f"{shown}\nAnswer: {t['metadata']['solution']}"
        assert ctx["fix"][k][0][1]["content"] == f"{shown}\nAnswer: {wrong}"


@needs_sandbox
def test_repair_contexts_repair_the_models_own_wrong_programs():
    tasks = tiny.make_tasks(3, seed=5, kinds=("code",))
    ctx = tiny.executor_contexts(tasks)
    ids = [str(t["id"]) for t in tasks]
    # task 0: a wrong program (wrong_reply's, so the prompt is the repair context's); task 1: a
    # right one (it passes the visible tests: no second call); task 2: no reply of its own
    first = {ids[0]: tiny.wrong_reply(tasks[0]), ids[1]: tiny.oracle_reply(tasks[1])}
    got = tiny.repair_contexts(tasks, first)
    assert got[0] == ctx["repair"][0] and got[1] is None and got[2] is None
    copied = tiny.repair_contexts(tasks, first, copy=True)
    assert copied[0] == ctx["copy"][0] and copied[1] is None and copied[2] is None
    # another wrong program: its own code and its own test report in the prompt
    bad = "<answer>def f(x): return 100</answer>"
    own = tiny.repair_contexts(tasks, {ids[2]: bad})[2]
    assert own[1] == tiny.oracle_reply(tasks[2])
    assert "Code:\ndef f(x): return 100\nTests: FAIL " in own[0][1]["content"]


def test_sft_traces_prior_moves_the_designer_alone():
    import mas

    tasks = tiny.make_tasks(60, seed=3, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=1, prior="suited")
    d_single, e_single = tiny.sft_traces(tasks, seed=1, prior="single")
    assert e_single == executor  # the Executor's traces are the suited templates' runs still
    assert [d["messages"] for d in d_single] == [d["messages"] for d in designer]
    script = {mas.script_completion(s): n for n, s in mas.TEMPLATES.items()}
    shown = [script[d["completion"]] for d in d_single]
    suited = [script[d["completion"]] == tiny.SUITED[t["kind"]] for d, t in zip(designer, tasks)]
    # other_share 0.25: single on ~75% of the 60 (the draw is fixed by the seed: 3 SE is ~17
    # points, so more than half is far inside); the default shows the suited one as often
    assert shown.count("single") > 30 and sum(suited) > 30
    assert set(shown) == set(mas.TEMPLATES)  # every structure still shown
    # flat (the default): each template with PRIOR_WEIGHTS' probability, 11.5-44% (on 60 tasks
    # each template 2 to 35 times is beyond 3 SE either way)
    d_flat, e_flat = tiny.sft_traces(tasks, seed=1)
    flat = [script[d["completion"]] for d in d_flat]
    assert e_flat == executor and all(2 <= flat.count(n) <= 35 for n in mas.TEMPLATES)
    with pytest.raises(ValueError, match="prior"):
        tiny.sft_traces(tasks, seed=1, prior="none")


def test_executor_score_weights_each_structures_contexts():
    contexts = {
        "solver": [0.5, 0.2],
        "coder": [0.1, 0.3],
        "repair": [None, 0.7],
        "keep": [0.9, 0.6],
        "fix": [0.3, 0.0],
    }
    shares = {
        "math": {"single": 0.5, "tester": 0.5, "ensemble": 0.0, "critic": 0.0},
        "code": {"single": 0.0, "ensemble": 0.25, "critic": 0.25, "tester": 0.5},
    }
    got = tiny.executor_score(contexts, ["math", "code"], shares)
    # math: single -> solver, tester -> coder (no repair on math); code: solver,
    # (solver+keep+fix)/3, (coder+repair)/2
    assert got == pytest.approx(
        [0.5 * 0.5 + 0.5 * 0.1, 0.25 * 0.2 + 0.25 * (0.2 + 0.6 + 0.0) / 3 + 0.5 * 0.5], rel=1e-15
    )
