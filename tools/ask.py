"""ask.py: one query of your own, as a page of its bi-level tree (the paper's Table 7 cases).

The query goes through the rollout training uses: M designs by the Designer, N runs of each by the
Executor, each run graded against --gold when one is given (R = correct + lam * format, the
advantages A_D and A_E of that tree). With --against a second model answers the same query on the
same seeds, below the first. The page is tools/show.py's, written to OUT/ask.html:

    python tools/ask.py "Compute 9-7+8." --model out/tiny-rl/step_000040/model \\
        --against out/tiny-sft --gold 10 --short_prompt --max_tokens 128 \\
        --designer_max_tokens 400 --temperature 1 --top_p 1
    python tools/ask.py "Write f(x) = x + 3." --kind code \\
        --gold '{"inputs": [[1]], "outputs": [4], "fn_name": "f"}' --model ...

Without --gold nothing is graded: a run's correct is unknown (None) and its R the format reward
alone.

Needs: advantage.py, evaluate.py, machinery/engine.py, rollout.py, settings.py, tools/show.py,
machinery/data.py, machinery/decode.py, machinery/isolation.py, machinery/confine.py,
machinery/provenance.py, machinery/ranks.py, machinery/cpu_bits.py, machinery/reload_check.py,
machinery/rundir.py,
machinery/weights.py, mas.py, reward.py, sandbox.py, stagewise.py, machinery/plans.py,
machinery/programs.py, machinery/grader.py, machinery/results.py"""

import argparse
import json
import os
import sys
from pathlib import Path

# run by path (python tools/ask.py): the project's root first on the path, for its imports below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import advantage
import evaluate
import rollout as rollout_lib
import settings
from machinery import engine as engine_lib
from tools import show


def query_task(query, kind, gold):
    """The query as a task of data.py's format: math graded against gold, code against the hidden
    tests gold gives as JSON ({"inputs", "outputs", "fn_name"}); no gold, nothing to grade."""
    task = {"id": "ask", "kind": kind, "question": query, "answer": gold or "", "source": "ask"}
    if kind == "code" and gold:
        try:
            task.update(answer="", tests=json.loads(gold))
        except json.JSONDecodeError as e:
            raise SystemExit(f"--gold for a code query is the tests as JSON ({e})") from None
    return task


def ask(a):
    """The tree of one query under --model and, with --against, the other model on the same seeds;
    written as one page. Returns the page's records (one a model)."""
    task = query_task(a.query, a.kind, a.gold)
    dsamp = engine_lib.Sampling(
        temperature=a.temperature, top_p=a.top_p, max_tokens=a.designer_max_tokens
    )
    esamp = engine_lib.Sampling(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens)
    records, metrics = [], {}
    for k, path in enumerate([a.model] + ([a.against] if a.against else []), start=1):
        eng = evaluate.load_engine(path, a.backend, "--model" if k == 1 else "--against")
        batch = rollout_lib.rollout(
            [task],
            eng,
            eng,
            a.M,
            a.N,
            seed=a.seed,
            short=a.short_prompt,
            designer_sampling=dsamp,
            executor_sampling=esamp,
            lam=settings.Config.lam,
        )
        A_D = advantage.designer_advantages(batch.R)
        A_E = advantage.executor_advantages(batch.R, executed=batch.executed)
        for rec in batch.tree([task], A_D, A_E, k, "ask", a.short_prompt):
            # nothing to grade against: correct unknown, R is the format reward alone
            if not a.gold:
                for sc in rec["scripts"]:
                    for run in sc["runs"]:
                        run["correct"] = None
            records.append(rec)
        metrics[k] = {
            "step": k,
            "model": path,
            "R mean": float(batch.R[batch.executed].mean()) if batch.executed.any() else 0.0,
            "graded": bool(a.gold),
        }
        del eng
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ask.html").write_text(show.page(records, metrics, title=f"ask: {a.query}"))
    print(f"written: {out / 'ask.html'}")
    return records


def main(argv):
    p = argparse.ArgumentParser(prog="ask.py", description=__doc__.split("\n\n")[0])
    p.add_argument("query", help="the query, as the Designer will see it")
    p.add_argument("--model", required=True, help="the model playing both roles")
    p.add_argument(
        "--against", help="a second model on the same query and seeds (e.g. its cold start)"
    )
    p.add_argument(
        "--gold", help="the answer (math) or the tests as JSON (code); without it, ungraded"
    )
    p.add_argument("--kind", default="math", choices=["math", "code"])
    p.add_argument("--M", type=int, default=4, help="designs")
    p.add_argument("--N", type=int, default=4, help="runs per design")
    p.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf", "lean"])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top_p", type=float, default=0.95)
    p.add_argument("--max_tokens", type=int, default=4096, help="per Executor call")
    p.add_argument("--designer_max_tokens", type=int, default=2048)
    p.add_argument(
        "--short_prompt", action="store_true", help="the tiny world's one-line Designer prompt"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/ask")
    a = p.parse_args(argv)
    if min(a.M, a.N) < 1:
        raise SystemExit("ask.py: M and N must be >= 1")
    return ask(a)


if __name__ == "__main__":
    main(sys.argv[1:])
