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
    python tools/bench.py train        # chunked.token_logprobs vs the full-logits log-softmax
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

engine measures a real tiny step: config/tiny.py's rollout from out/tiny-sft (`python sft.py` makes
it), rolled out as train.py rolls it out (tiny_step). torch and transformers are imported at the top
(train.py needs them anyway); vLLM only through engine.py, when importable.

Needs: grpo.py, machinery/engine.py, machinery/ranks.py, machinery/speed.py, rollout.py,
settings.py, train.py, world/tiny.py, advantage.py, evaluate.py, machinery/chunked.py,
machinery/data.py, machinery/decode.py, machinery/isolation.py, machinery/confine.py,
machinery/loggers.py, machinery/offload.py, machinery/provenance.py, machinery/recorder.py,
machinery/reload_check.py, machinery/rundir.py, machinery/shared_prompts.py, machinery/weights.py,
mas.py, reward.py, sandbox.py, stagewise.py, world/final_table.py, world/heldout.py
"""

import functools
import json
import os
import resource
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
from machinery import ranks, speed
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
    step:9768f35`), each is checked out into a temporary git worktree and run the same way; the
    working tree and the revisions take turns `rounds` times and the ratio is that of the means over
    the rounds, so a machine that slows down or speeds up during the run weighs on both sides
    alike."""
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

QWEN3_4B = {  # settings.QWEN3's shape, at the length the bench runs
    **settings.QWEN3["4b"],
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


def bench_train(variant=None, reps=3):
    """One GRPO update (forward + backward) of a Qwen3 with a large vocabulary, where the logits
    dominate (CUDA: Qwen3-4B's hidden size and vocabulary, two layers, bf16; CPU: a small one): each
    Config.logprobs="chunked" (chunked.token_logprobs) vs plain (grpo.token_logprobs: the full
    logits, log_softmax, gather), through train.logprobs as the loop calls it. Peak memory: each
    variant's update in its own process, above what was allocated before it (CUDA
    max_memory_allocated; CPU the growth of ru_maxrss); speed: in this process, taking turns,
    medians of `reps`."""
    cuda = torch.cuda.is_available()
    model = qwen3(
        {**QWEN3_4B, "num_hidden_layers": 2} if cuda else SMALL,
        "cuda" if cuda else "cpu",
        torch.bfloat16 if cuda else torch.float32,
    )
    B, T = (4, 4096) if cuda else (8, 512)
    b = {"input_ids": torch.randint(0, model.config.vocab_size, (B, T), device=model.device)}
    b["attention_mask"] = torch.ones_like(b["input_ids"])

    def update(v, rep=0):
        logp = train.logprobs(model, b, settings.Config(logprobs=v))
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
    peak = {v: in_subprocess(f"bench_train({v!r})") for v in settings.LOGPROBS if v != "shared"}
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
            train.update(cfg, 0, roles, {"executor": pol}, 0, device, world),
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
    333 tokens), at batch 8 and 32, each batch whole (--micro-tokens 0, the tiny default) and in
    micro-batches of `budget` tokens: each run `python sft.py --steps ... --no-eval` in its own
    process, its peak RSS (os.wait4's ru_maxrss), and what it holds above a run of one step on one
    sample (the imports, the traces, the model). The same seed: both runs of a batch size see the
    same batches."""
    out = tempfile.mkdtemp(prefix="bench-sft-")

    def peak_mib(batch, micro, n):
        args = ["--steps", str(n), "--batch-size", str(batch), "--micro-tokens", str(micro)]
        args += ["--no-eval", "--out", os.path.join(out, f"b{batch}-m{micro}")]
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
    """A sandbox job's start-up (sandbox.run_code of an empty program: fork from the fork-server,
    confine, run, report) beside `python -c pass` (a fresh interpreter, no sandbox), in turns, in
    each mode this machine has; and, where bubblewrap is installed, `bwrap ... python -c pass` (a
    well-kept tool's sandbox around a fresh interpreter: what each job would cost with it). Last
    line: the default mode's ratio to `python -c`."""
    import shutil

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
            binds = [a for r in sandbox.iso.server().roots for a in ("--ro-bind", r, r)]
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
    import sandbox

    r = sandbox.run_code("pass")
    assert r.status == "ok", r


def _process(cmd, rep):
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


NEED_SFT = ("step", "engine")  # they measure the tiny world from its cold start
SECTIONS = {
    "step": bench_step,
    "engine": bench_engine,
    "train": bench_train,
    "sft": bench_sft,
    "gpu": bench_gpu,
    "grade": bench_grade,
    "sandbox": bench_sandbox,
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
