"""Tests for sft.py, muon.py and distill.py: masking, batching, training that learns, HF
checkpoints, torchrun + FSDP2 (gloo, 2 ranks), Muon, the roles, and distillation from a real
OpenAI-compatible server (vLLM's own, serving the tiny model)."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

import evaluate
import mas
import sft
from machinery import data, engine, muon
from tools import distill
from world import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

torch.set_num_threads(1)
SMALL = dict(hidden_size=64, num_layers=2)


def add_samples(n, seed=0, tag="add"):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append(
            {
                "messages": [
                    {"role": "system", "content": f"You {tag}."},
                    {"role": "user", "content": f"{a}+{b}"},
                ],
                "completion": f"<answer>{a + b}</answer>",
            }
        )
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A fresh tiny model on disk and a data dir with designer.jsonl / executor.jsonl."""
    d = tmp_path_factory.mktemp("sft")
    tiny.save_tiny(str(d / "base"), seed=0, **SMALL)
    os.makedirs(d / "data")
    data.write_jsonl(add_samples(40, 1, "design"), str(d / "data" / "designer.jsonl"))
    data.write_jsonl(add_samples(40, 2, "execute"), str(d / "data" / "executor.jsonl"))
    return d


def test_prompt_masked_completion_and_end_of_turn_trained():
    tok = tiny.build_tokenizer()
    s = add_samples(1)[0]
    ((ids, P),) = engine.encode_samples(tok, [s])[0]
    assert ids[:P] == engine.prompt_ids(tok, s["messages"])
    # the prompt is the chat template with the generation prompt; the completion follows, then
    # <|end|>
    assert tok.decode(ids[:P]).endswith("<|assistant|>")
    assert tok.decode(ids[P:]) == s["completion"] + "<|end|>"
    assert engine.end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|end|>") == ids[-1]
    ids2, attn, mask = sft.collate([(ids, P), (ids[: P + 2], P)], [0, 1], tok.pad_token_id, "cpu")
    # mask[t] scores token t+1: exactly the completion tokens (and <|end|>), nothing of the prompt
    # or padding
    assert mask[0].tolist() == [0.0] * (P - 1) + [1.0] * (len(ids) - P)
    assert mask[1].sum().item() == 2 and attn[1].sum().item() == P + 2
    assert engine.encode_samples(tok, [s], max_len=P + 3) == ([], 1)  # too long: dropped, never cut


def test_length_batches_and_schedule():
    rng = random.Random(0)
    lengths = [rng.randint(1, 500) for _ in range(1000)]
    batches = sft.length_batches(lengths, 10, random.Random(1), bucket=10)
    assert sorted(k for b in batches for k in b) == list(range(1000))
    spread = sum(max(lengths[k] for k in b) - min(lengths[k] for k in b) for b in batches) / len(
        batches
    )
    assert spread < 80  # bucketed: similar lengths together (random batches would spread ~400)
    lrs = [sft.cosine_lr(s, 100, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(
        0.1, abs=0.01
    )


def test_train_sft_learns_and_writes_loadable_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machinery.chunked import token_logprobs

    model, tok = tiny.build_model(seed=0, **SMALL)
    samples = add_samples(300)
    stats = sft.train_sft(
        model,
        tok,
        samples,
        steps=60,
        lr=3e-3,
        batch_size=32,
        out_dir=str(tmp_path / "ck"),
        log=None,
    )
    # from uniform over ~100 chars to near-format
    assert stats["losses"][0] > 4.0 and stats["loss"] < 0.6
    m2 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ck"))
    t2 = AutoTokenizer.from_pretrained(str(tmp_path / "ck"))
    assert (
        t2.chat_template == tok.chat_template and t2("7+1")["input_ids"] == tok("7+1")["input_ids"]
    )
    enc, _ = engine.encode_samples(tok, samples[:4])
    ids, attn, mask = sft.collate(enc, range(4), tok.pad_token_id, "cpu")
    with torch.no_grad():
        assert torch.allclose(
            token_logprobs(model, ids, attn), token_logprobs(m2, ids, attn), atol=1e-5
        )
    # it learned the format and to stop: greedy output is an answer tag followed by <|end|>
    p = engine.prompt_ids(t2, samples[0]["messages"])
    out = m2.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False)[0, len(p) :].tolist()
    text = t2.decode(out)
    assert text.startswith("<answer>") and "</answer><|end|>" in text


def test_muon_optimizer_splits_params_and_learns():
    model, tok = tiny.build_model(seed=0, **SMALL)
    opt = muon.make_optimizer(model, "muon", 1e-3, 0.01)
    mu, adamw = opt.optimizers
    in_muon = {id(p) for g in mu.param_groups for p in g["params"]}
    in_adamw = {id(p) for g in adamw.param_groups for p in g["params"]}
    params = list(model.parameters())
    # every parameter in exactly one of them; the tied embedding and the 1-D norm gains on AdamW
    assert in_muon.isdisjoint(in_adamw) and in_muon | in_adamw == {id(p) for p in params}
    assert id(model.get_input_embeddings().weight) in in_adamw
    assert (
        all(p.ndim == 2 for p in params if id(p) in in_muon)
        and len(in_muon) == 7 * SMALL["num_layers"]
    )
    # one schedule drives both: the scheduler sees the groups of both optimizers
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    assert (
        sched.get_last_lr() == [5e-4, 5e-4]
        and mu.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] == 5e-4
    )
    stats = sft.train_sft(
        model, tok, add_samples(300), steps=60, lr=3e-3, batch_size=32, log=None, optimizer="muon"
    )
    assert stats["losses"][0] > 4.0 and stats["loss"] < 0.6
    # the state of both optimizers round-trips (Muon's momentum buffers included)
    opt2 = muon.make_optimizer(model, "muon", 1e-3, 0.01)
    model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    opt2.step()
    opt3 = muon.make_optimizer(model, "muon", 1e-3, 0.01)
    opt3.load_state_dict(opt2.state_dict())
    buf2 = next(iter(opt2.optimizers[0].state.values()))["momentum_buffer"]
    assert torch.equal(next(iter(opt3.optimizers[0].state.values()))["momentum_buffer"], buf2)
    with pytest.raises(ValueError, match="adamw"):
        muon.make_optimizer(model, "sgd", 1e-3, 0.0)


def _muon_against_torch(steps=4, lr=2e-3):
    """Our Muon and torch.optim.Muon from the same weights on the same gradients: (the largest
    weight difference of each matrix in units of its per-step update scale lr * 0.2 sqrt(max(rows,
    cols)), the weights' largest magnitude in those units)."""

    def mats(m):
        return [p for n, p in m.named_parameters() if p.ndim == 2 and "embed" not in n]

    a, b = tiny.build_model(seed=0, **SMALL)[0], tiny.build_model(seed=0, **SMALL)[0]
    ref = torch.optim.Muon(mats(a), lr=lr, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    ours = muon.Muon(mats(b), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for pa, pb in zip(mats(a), mats(b)):
            pa.grad = torch.randn(pa.shape, generator=g) * 1e-2
            pb.grad = pa.grad.clone()
        ref.step()
        ours.step()
    scale = [lr * 0.2 * max(p.shape) ** 0.5 for p in mats(a)]
    diff = max((p - q).abs().max().item() / s for p, q, s in zip(mats(a), mats(b), scale))
    return diff, max(p.abs().max().item() / s for p, s in zip(mats(a), scale))


def test_muon_is_torch_muon_up_to_the_rounding_of_its_bf16_iteration(monkeypatch):
    """sft.Muon's update is torch.optim.Muon's (adjust_lr_fn="match_rms_adamw"), same-shape matrices
    batched, up to the rounding of torch's Newton-Schulz iteration, which is bf16 (ours is fp32 on a
    CPU)."""
    steps, u16, u32 = 4, 2.0**-8, 2.0**-24  # unit roundoff of bf16 (8-bit significand) and of fp32
    # Newton-Schulz leaves the singular values in (0.5, 1.5) (torch's docstring), so an output entry
    # is at most s = 1.5, and an error in the iterate grows at most by |f'(x)| = |a + 3b x^2 + 5c
    # x^4| <= g = 1.6 an iteration on the band it converges to (x in [0.7, 1.15]).
    s, g = 1.5, 1.6

    # 1) torch's optimizer with its iteration run in fp32 by ours (one matrix at a time): the same
    # arithmetic up
    #    to summation order. A product of 128-wide matrices summed in another order differs by <=
    # 128 u32
    #    relative; the last iteration's output carries it and its inputs' error: <= (1 + g) 128 u32
    # s an entry,
    #    a step; plus the weight's own rounding when the update is added, <= u32 |w|, a step.
    def fp32_iteration(grad, coefficients, ns_steps, eps):
        tall = grad.shape[0] > grad.shape[1]
        x = muon.newton_schulz(
            (grad.T if tall else grad)[None], ns_steps, eps, dtype=torch.float32
        )[0]
        return x.T if tall else x

    with monkeypatch.context() as m:
        m.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", fp32_iteration)
        diff, w_max = _muon_against_torch(steps)
    assert diff <= steps * ((1 + g) * 128 * u32 * s + u32 * w_max), diff
    # 2) torch's own bf16 iteration: its output entry is rounded to bf16 (<= u16 s) after inheriting
    # the rounding
    #    of its bf16 inputs, carried with gain <= g: <= (1 + g) u16 s an entry, a step (~6e-2 over 4
    # steps).
    diff, _ = _muon_against_torch(steps)
    assert diff <= steps * (1 + g) * u16 * s, diff
    with pytest.raises(ValueError, match="2-D"):
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.ones(3)
        muon.Muon([p]).step()


def test_sft_on_a_cpu_computes_nothing_in_bf16():
    """The cold start's CPU path (Muon's Newton-Schulz included) runs no op on bf16 tensors: a CPU
    without native bf16 runs them many times slower, and another CPU would round them otherwise."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.seen.setdefault(t.dtype, str(func))
            return out

    tasks = tiny.make_tasks(20, seed=0, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=0)
    model, tok = tiny.build_model(seed=0, **SMALL)
    with Dtypes() as mode:
        sft.train_sft(
            model,
            tok,
            designer[:4] + executor[:12],
            steps=2,
            batch_size=8,
            optimizer="muon",
            log=None,
        )
    assert torch.float32 in mode.seen and torch.bfloat16 not in mode.seen, mode.seen
    assert torch.float16 not in mode.seen, mode.seen


FSDP_MUON = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from machinery import muon, speed
from world import tiny
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
dist.init_process_group("gloo")
ids = torch.randint(6, 100, (4, 24), generator=torch.Generator().manual_seed(0))
def run(shard):
    m = tiny.build_model(seed=0, hidden_size=64, num_layers=2)[0]
    if shard:
        speed.prepare(m, shard=True)
    opt = muon.make_optimizer(m, "muon", 1e-2, 0.01)
    for _ in range(3):                      # the same batch on every rank: FSDP must change nothing
        m(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    if not shard:
        return m.state_dict()
    return get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
single, sharded = run(False), run(True)
start = tiny.build_model(seed=0, hidden_size=64, num_layers=2)[0].state_dict()
if dist.get_rank() == 0:
    print("WORST", max((sharded[k] - single[k]).abs().max().item() for k in single))
    print("MOVED", max((single[k] - start[k]).abs().max().item() for k in single))
dist.destroy_process_group()
"""


def test_muon_under_fsdp2_equals_one_process(tmp_path):
    """2 gloo ranks, FSDP2-sharded, Muon: the same weights as one process (every rank orthogonalises
    the whole gathered matrix). torch.optim.Muon on the sharded DTensors ended 8.7e-4 away in this
    check."""
    script = tmp_path / "fsdp_muon.py"
    script.write_text(FSDP_MUON)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port",
        str(_free_port()),
        str(script),
        ROOT,
    ]
    r = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    worst = float(r.stdout.split("WORST")[1].split()[0])
    moved = float(r.stdout.split("MOVED")[1].split()[0])
    # exact: every rank computes on the same shapes with the same kernels as the one process (FSDP2
    # gathers by copying, and averages two equal gradients: (g + g) / 2 = g in floating point), in
    # one machine's arithmetic
    assert moved > 1e-2 and worst == 0.0


def test_quality_bar_figures_paired_margin_and_kinds():
    m, se = evaluate.paired_margin([1, 1, 0, 1], [0, 1, 0, 0])
    assert m == pytest.approx(0.5) and se == pytest.approx((1 / 3) ** 0.5 / 2)
    fig = {
        "tasks": 4,
        "parse": 1.0,
        "designer": 0.5,
        "structures": {"tester": 1.0},
        "templates": {"single": 0.25, "ensemble": 0.5, "tester": 0.5},
        "per_problem": {
            "designs": [1, 0, 1, 0],
            "single": [0, 0, 1, 0],
            "ensemble": [1, 1, 0, 0],
            "tester": [0, 0, 1, 1],
        },
        "kinds": ["math", "math", "code", "code"],
    }
    text = sft.format_figures(fig)
    assert "best template ensemble beats single by +25.0 points (paired standard error 47.9" in text
    # per kind, the structure that pays differs: tester on code, ensemble on math
    assert (
        "code (2 tasks): designs 50.0%, single 50.0%, ensemble 0.0%, tester 100.0%; best template "
        "tester +50.0" in text
    )
    assert (
        "math (2 tasks): designs 50.0%, single 0.0%, ensemble 100.0%, tester 0.0%; best template "
        "ensemble +100.0" in text
    )


def test_roles_single_process(base, tmp_path):
    out = tmp_path / "both"
    sft.main(
        [
            "--model",
            str(base / "base"),
            "--data",
            str(base / "data"),
            "--out",
            str(out),
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--lr",
            "1e-3",
        ]
    )
    assert os.path.isfile(out / "model.safetensors") and os.path.isfile(out / "tokenizer.json")


def _weights(path):
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def test_torchrun_fsdp2_two_ranks_separate_roles(base, tmp_path):
    """torchrun --nproc_per_node=2 (gloo): FSDP2-sharded training, rank 0 saves gathered full
    weights."""
    out = tmp_path / "fsdp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port",
        str(_free_port()),
        os.path.join(ROOT, "sft.py"),
        "--model",
        str(base / "base"),
        "--data",
        str(base / "data"),
        "--out",
        str(out),
        "--roles",
        "separate",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
    ]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "world 2" in r.stdout
    from transformers import AutoModelForCausalLM, AutoTokenizer

    w0 = _weights(base / "base")
    for role in ("designer", "executor"):
        d = str(out / role)
        m = AutoModelForCausalLM.from_pretrained(d)
        AutoTokenizer.from_pretrained(d)
        w = _weights(d)
        assert set(w) == set(w0)  # the full, unsharded state dict
        assert all(w[k].shape == w0[k].shape for k in w)
        assert any(not torch.equal(w[k], w0[k]) for k in w)  # it trained
        assert torch.isfinite(torch.cat([p.flatten() for p in m.parameters()])).all()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# distillation


def _tasks_file(tmp_path, n):
    path = str(tmp_path / "tasks.jsonl")
    with open(path, "w") as f:
        for t in tiny.make_tasks(n, seed=7):
            f.write(json.dumps(t) + "\n")
    return path


class OracleTeacher(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint (a stand-in for a strong hosted teacher, not for anything we
    ship): as Designer it writes the template suited to the task; as Executor it answers from the
    task's solution, or wrongly when `wrong` is set."""

    tasks, wrong = [], False

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        text = msgs[-1]["content"]
        task = next(
            t
            for t in self.tasks
            if data.task_text(t, short=True) in text or data.task_text(t) in text
        )
        if "workflow" in msgs[0]["content"]:
            reply = f"Here is my design.\n```python\n{mas.TEMPLATES[tiny.SUITED[task['kind']]]}```"
        elif self.wrong:
            reply = (
                "<answer>def f(x): return -1</answer>"
                if task["kind"] == "code"
                else "<answer>-1</answer>"
            )
        else:
            reply = tiny.oracle_reply(task)
        out = json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": reply}}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def test_distill_keeps_only_correct_runs(tmp_path):
    tasks = tiny.make_tasks(6, seed=7)
    OracleTeacher.tasks = tasks
    srv = ThreadingHTTPServer(("127.0.0.1", 0), OracleTeacher)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        OracleTeacher.wrong = False
        c = distill.distill(url, "oracle", tasks, str(tmp_path / "good"), short=True, log=None)
        assert (
            c["parsed"] == 6
            and c["runs"] == 6
            and c["correct_runs"] == 6
            and c["teacher_errors"] == 0
        )
        d = data.read_jsonl(str(tmp_path / "good" / "designer.jsonl"))
        e = data.read_jsonl(str(tmp_path / "good" / "executor.jsonl"))
        assert len(d) == 6 and {r["structure"] for r in d} == {"ensemble", "tester"}
        assert all(
            set(r) >= {"messages", "completion"} and r["messages"][-1]["role"] == "user"
            for r in d + e
        )
        # one distinct (prompt, reply) per task: identical voting samples kept once
        assert len(e) == 6
        assert all(mas.answer_of(r["completion"]) for r in e)
        # the samples train as they are
        model, tok = tiny.build_model(seed=0, **SMALL)
        assert sft.train_sft(model, tok, d + e, steps=2, batch_size=4, log=None)["samples"] == 12
        # a teacher that designs well but answers wrongly: nothing is kept
        OracleTeacher.wrong = True
        c = distill.distill(url, "oracle", tasks, str(tmp_path / "bad"), short=True, log=None)
        assert c["runs"] == 0 or c["correct_runs"] == 0
        assert data.read_jsonl(str(tmp_path / "bad" / "designer.jsonl")) == []
        assert data.read_jsonl(str(tmp_path / "bad" / "executor.jsonl")) == []
    finally:
        srv.shutdown()
        srv.server_close()
    # a dead endpoint: every call fails cleanly, the pipeline still writes (empty) files
    c = distill.distill(
        url, "oracle", tasks[:2], str(tmp_path / "dead"), template="single", log=None
    )
    assert c["teacher_errors"] >= 2 and c["correct_runs"] == 0
    assert os.path.isfile(tmp_path / "dead" / "executor.jsonl")


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("vllm"), reason="vLLM is not installed"
)
def test_distill_against_vllm_server(base, tmp_path):
    """The real thing: vLLM's OpenAI-compatible server serving the tiny model on 127.0.0.1, started
    and stopped here. The untrained model is almost never right, so this checks that the pipeline
    runs end to end and writes files of the right shape."""
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(base / "base"),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "16",
            "--gpu-memory-utilization",
            "0.05",
            "--enforce-eager",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 420
        while True:
            assert server.poll() is None, open(tmp_path / "server.log").read()[-3000:]
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5)
                break
            except OSError:
                assert time.time() < deadline, "vLLM server did not come up"
                time.sleep(3)
        tasks = _tasks_file(tmp_path, 4)
        r = subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "tools", "distill.py"),
                "--teacher",
                url,
                "--model",
                "tiny",
                "--tasks",
                tasks,
                "--out",
                str(tmp_path / "d"),
                "--template",
                "critic",
                "--short",
                "--max-tokens",
                "64",
            ],  # the server's context: 2048
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        stats = json.load(open(tmp_path / "d" / "distill_stats.json"))
        assert stats["runs"] == 4 and stats["teacher_errors"] == 0  # 8 agent calls answered by vLLM
        for name in ("designer.jsonl", "executor.jsonl"):
            for row in data.read_jsonl(str(tmp_path / "d" / name)):
                assert isinstance(row["completion"], str) and row["messages"][-1]["role"] == "user"
        # the Designer path too: the untrained model's scripts do not parse, and that is counted,
        # not fatal
        c = distill.distill(
            url,
            "tiny",
            tiny.make_tasks(2, seed=3),
            str(tmp_path / "s"),
            short=True,
            max_tokens=32,
            log=None,
        )
        assert (
            c["designs"] == 2
            and c["teacher_errors"] == 0
            and c["parsed"] + sum(c["unusable"].values()) == 2
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
