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
"""

import sys


def bench_train(variant=None, steps=3):
    """One GRPO update (forward + backward) on a tiny Qwen3 with a large vocabulary, where the logits dominate:
    grpo.token_logprobs (chunked, recomputed in backward) vs the naive full-logits log_softmax + gather that
    TRL's GRPOTrainer computes. Each variant runs in its own subprocess, one after the other, so that each
    peak memory is its own: CUDA max_memory_allocated, or on CPU the growth of ru_maxrss over one update."""
    import json
    import os
    import resource
    import subprocess
    import time

    import torch

    if variant is None:
        here, res = os.path.dirname(os.path.abspath(__file__)), {}
        for v in ("chunked", "naive"):
            code = f"import bench; bench.bench_train({v!r}, steps={steps})"
            proc = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"bench train {v} failed:\n{proc.stderr[-3000:]}")
            res[v] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = res[v]
            print(f"{v:8s} {r['device']} vocab={r['vocab']} tokens/update={r['tokens']}: "
                  f"{r['tokens_per_s']:.0f} tokens/s, peak memory {r['peak_mb']:.0f} MB")
        c, n = res["chunked"], res["naive"]
        print(f"chunked/naive: speed x{c['tokens_per_s'] / n['tokens_per_s']:.2f}, "
              f"peak memory x{c['peak_mb'] / n['peak_mb']:.3f} (naive needs {n['peak_mb'] / c['peak_mb']:.1f}x)")
        return res

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

    def update():
        if variant == "chunked":
            logp = token_logprobs(model, ids, mask)
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss, _ = grpo_loss(logp, logp.detach(), adv, mask[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        update()
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        update()
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024  # KB on Linux
    start = time.perf_counter()
    for _ in range(steps):
        update()
    tokens = B * (T - 1)
    print(json.dumps({"device": device, "vocab": vocab, "tokens": tokens, "peak_mb": peak_mb,
                      "tokens_per_s": tokens * steps / (time.perf_counter() - start)}))


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


SECTIONS = {
    "sandbox": bench_sandbox,
    "train": bench_train,
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
