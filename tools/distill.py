"""distill.py: SFT data for the cold start, distilled from a teacher (the paper's cold start at
scale).

An OpenAI-compatible chat endpoint plays the Designer (it writes a workflow script from
mas.designer_messages, or one of mas.TEMPLATES is given) and the Executor (every agent call of the
script, run in the sandbox). Only what a correct run produced is kept:

    designer sample = (Designer prompt, script)     if the design's run is correct
    executor sample = (agent-call prompt, reply)    for the calls of correct runs whose own answer
                                                    is correct

written as OUT/designer.jsonl and OUT/executor.jsonl, the input of `python sft.py --data OUT`.

    python tools/distill.py --teacher http://127.0.0.1:8000 --model NAME --tasks t.jsonl --out DIR
    counts = distill(url, "NAME", tasks, "DIR")

One design a task and one run of it (seed 0, temperature 0.7, 8 requests at a time), up to
--max-tokens tokens a reply: the presets' max_tokens by default (settings.Config's 8192, the
paper's), so that the cold start learns completions as long as RL samples (a teacher's script or
reply cut short parses or grades as wrong, and is dropped). The key, if the endpoint wants one, from
OPENAI_API_KEY.

Needs: machinery/data.py, mas.py, reward.py, sandbox.py, settings.py, machinery/isolation.py,
stagewise.py
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

# run by path (python tools/distill.py): the project's root first on the path, for its imports below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mas
import reward as reward_lib
import sandbox
import settings
from machinery import data

MAX_TOKENS = settings.Config.max_tokens  # the presets' per-completion limit [paper]: 8192


def chat(url, model, messages, *, max_tokens=MAX_TOKENS, api_key=None, seed=None):
    """One POST {url}/v1/chat/completions; returns (the reply text, None), or ("", the error) when
    it failed three times (a request times out after 120 s; a 4xx other than 429 is not retried).

    url may end in /v1 or not. Errors never raise: a teacher that fails loses that one call."""
    base = url.rstrip("/")
    endpoint = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.7}
    if seed is not None:
        body["seed"] = seed
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    err = None
    for attempt in range(3):
        try:
            req = urllib.request.Request(endpoint, data=json.dumps(body).encode(), headers=headers)
            with urllib.request.urlopen(req, timeout=120.0) as r:
                reply = json.loads(r.read().decode())
            return reply["choices"][0]["message"].get("content") or "", None
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            err = f"{type(e).__name__}: {e}"
            if isinstance(e, urllib.error.HTTPError) and e.code < 500 and e.code != 429:
                break  # a 4xx other than rate limiting will not get better by retrying
            time.sleep(min(8.0, 0.5 * 2**attempt))
    return "", err


def distill(
    teacher,
    model,
    tasks,
    out_dir,
    *,
    template=None,
    short=False,
    max_tokens=MAX_TOKENS,
    api_key=None,
    log=print,
):
    """Distill SFT data from a teacher endpoint. Returns counts; writes designer.jsonl and
    executor.jsonl.

    The teacher writes one workflow script a task (kept if it parses); template=NAME uses that
    template instead (a teacher that cannot design still teaches the Executor). Every kept design
    runs once in the sandbox with the teacher answering each agent call (the module docstring says
    what is kept)."""
    os.makedirs(out_dir, exist_ok=True)
    pool, errors = ThreadPoolExecutor(max_workers=8), []  # one error a failed call (append: atomic)
    counts = {
        "tasks": len(tasks),
        "designs": 0,
        "parsed": 0,
        "runs": 0,
        "correct_runs": 0,
        "teacher_errors": 0,
        "designer_samples": 0,
        "executor_samples": 0,
        "unusable": {},
    }

    def ask(messages, seed=None):
        text, err = chat(
            teacher, model, messages, max_tokens=max_tokens, api_key=api_key, seed=seed
        )
        if err:
            errors.append(err)
        return text

    # design phase: one design a task, all requests in parallel
    dmsgs = [mas.designer_messages(data.task_text(t, short=short), short=short) for t in tasks]
    replies = (
        [mas.script_completion(mas.TEMPLATES[template]) for _ in tasks]
        if template is not None
        else list(pool.map(lambda msgs: ask(msgs, seed=0), dmsgs))
    )
    parsed = [(q, *mas.parse_script(reply), reply) for q, reply in enumerate(replies)]
    kept_designs = [(q, script, reply) for q, script, _, reply in parsed if script is not None]
    # (q, script, designer completion); a reason's first word counts the designs that were unusable
    # for it
    counts.update(
        designs=len(tasks),
        parsed=len(kept_designs),
        unusable=dict(Counter(why.split(":")[0] for _, script, why, _ in parsed if script is None)),
    )
    if log is not None:
        log(f"distill: {counts['parsed']}/{counts['designs']} designs usable")

    # execution phase: every kept design once, one sandbox call; each tick's agent calls are sent to
    # the teacher in parallel
    def generate(calls):
        return list(pool.map(lambda c: ask(c.messages), calls))

    scripts, run_tasks = [s for (_, s, _) in kept_designs], [tasks[q] for (q, _, _) in kept_designs]
    runs = (
        sandbox.run_workflows(
            scripts, run_tasks, generate, equal=reward_lib.math_equal, short=short
        )
        if scripts
        else []
    )
    counts["runs"] = len(runs)
    # correct(e) only (lam = 0): 1 when math_equal holds, or when its program passes every hidden
    # test
    scores = list(
        pool.map(lambda tr: reward_lib.reward(tr[0], tr[1], lam=0.0), zip(run_tasks, runs))
    )
    designer_rows, candidates, seen = [], [], set()
    for (q, script, completion), run, score in zip(kept_designs, runs, scores):
        if score != 1.0:
            continue
        counts["correct_runs"] += 1
        designer_rows.append(
            {
                "messages": dmsgs[q],
                "completion": completion,
                "task_id": tasks[q].get("id"),
                "structure": mas.structure_of(script),
            }
        )
        for c in run.calls:
            key = json.dumps([c.messages, c.reply])
            if key not in seen:  # voting repeats identical calls; keep each (prompt, reply) once
                seen.add(key)
                candidates.append((tasks[q], c))
    # within a correct run, a reply whose own answer is wrong (an outvoted sample, a draft the
    # critic fixed) is context for the later calls, never a target
    call_ok = list(
        pool.map(
            lambda tc: reward_lib.correctness(tc[0], mas.answer_of(tc[1].reply)) == 1.0, candidates
        )
    )
    executor_rows = [
        {"messages": c.messages, "completion": c.reply, "task_id": t.get("id"), "role": c.role}
        for (t, c), ok in zip(candidates, call_ok)
        if ok
    ]
    counts["wrong_replies_dropped"] = len(candidates) - len(executor_rows)
    pool.shutdown()
    data.write_jsonl(designer_rows, os.path.join(out_dir, "designer.jsonl"))
    data.write_jsonl(executor_rows, os.path.join(out_dir, "executor.jsonl"))
    counts.update(
        teacher_errors=len(errors),
        designer_samples=len(designer_rows),
        executor_samples=len(executor_rows),
    )
    with open(os.path.join(out_dir, "distill_stats.json"), "w") as f:
        json.dump(counts, f, indent=1)
    if log is not None:
        log("distill: " + json.dumps(counts))
    return counts


def main(argv):
    p = argparse.ArgumentParser(description="distill SFT data from a teacher endpoint")
    p.add_argument("--teacher", required=True, help="base URL of an OpenAI-compatible server")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--tasks", required=True, help="tasks JSONL (data.py format)")
    p.add_argument("--out", default="out/distill")
    p.add_argument(
        "--template", default=None, help="skip the Designer: use this mas.TEMPLATES entry"
    )
    p.add_argument(
        "--short", action="store_true", help="the tiny world's compact Designer and agent prompts"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"tokens a reply at most (default {MAX_TOKENS}: the presets' max_tokens)",
    )
    a = p.parse_args(argv)
    if not os.path.isfile(a.tasks):
        sys.exit(
            f"distill.py: no task file {a.tasks} (data.py's format: python machinery/data.py "
            "convert ...)"
        )
    distill(
        a.teacher,
        a.model,
        data.load_tasks(a.tasks),
        a.out,
        template=a.template,
        short=a.short,
        max_tokens=a.max_tokens,
        api_key=os.environ.get("OPENAI_API_KEY"),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
