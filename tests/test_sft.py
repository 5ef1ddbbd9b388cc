"""Tests for sft.py and muon.py: masking, batching, training that learns, HF checkpoints, torchrun +
FSDP2 (gloo, 2 ranks), Muon, the roles; micro-batches by a token budget whose accumulated gradient
is the whole batch's (1 and 2 ranks). (Distillation: tests/test_distill.py; SFT's memory plan:
tests/test_settings.py.)"""

import os
import random
import socket
import subprocess
import sys

import pytest
import torch

import settings
import sft
from machinery import data, engine, muon, results
from world import final_table, tiny

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
    lrs = [settings.warmup_cosine(s, warmup=10, end=100, floor=0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(
        0.1, abs=0.01
    )


def test_train_sft_learns_and_writes_loadable_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machinery.logprob_rows import chunked_token_logprobs as token_logprobs

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
from world import final_table, tiny
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
    m, se = results.paired_margin([1, 1, 0, 1], [0, 1, 0, 0])
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
    text = final_table.format_figures(fig)
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
            "--batch_size",
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
        "--batch_size",
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


def test_the_batch_is_global_one_rank_or_two_see_the_same_samples(base, tmp_path):
    """--batch_size is samples a step over every rank, --epochs a run's length: under torchrun at
    1 and 2 ranks the same steps (ceil(0.25 x 80 / 8) = 3), the same tokens trained, and the same
    first batch (its loss, before any update, to fp32 rounding)."""
    seen = {}
    for world in (1, 2):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}"]
        cmd += ["--master_port", str(_free_port()), os.path.join(ROOT, "sft.py")]
        cmd += ["--model", str(base / "base"), "--data", str(base / "data")]
        cmd += ["--out", str(tmp_path / f"w{world}"), "--epochs", "0.25", "--batch_size", "8"]
        cmd += ["--lr", "1e-3", "--micro_tokens", "0", "--checkpointing", "off"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"80 samples, 0.25 epochs = 3 steps of 8 ({8 // world} a rank)" in r.stdout
        first = float(r.stdout.split("sft step     0/3  loss ")[1].split()[0])
        tokens = int(r.stdout.split("sft done: 3 steps, final loss ")[1].split(", ")[1].split()[0])
        seen[world] = (first, tokens)
    assert seen[1][1] == seen[2][1] > 0
    assert seen[2][0] == pytest.approx(seen[1][0], rel=1e-5)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# what fits a GPU: micro-batches by a token budget, their gradients accumulated (sft.py's docstring)


def test_micro_batches_hold_each_sample_once_within_the_budget():
    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(40)]
    batch = list(range(3, 35))
    for budget in (60, 100, 333):
        parts = sft.micro_batches(batch, lengths, budget)
        assert sorted(sum(parts, [])) == batch
        # rows x the longest row (padding counted), or one sample alone
        assert all(len(p) * max(lengths[k] for k in p) <= budget for p in parts)
    assert sft.micro_batches(batch, lengths, 0) == [batch]  # 0: the batch whole, in its order
    assert sft.micro_batches(batch, lengths, 10**6) == [batch]  # within the budget: the same
    # a sample longer than the budget cannot fit any micro-batch: refused, with the fix
    model, tok = tiny.build_model(seed=0, **SMALL)
    with pytest.raises(ValueError, match="longer than micro_tokens=8 .*raise --micro_tokens"):
        sft.train_sft(model, tok, add_samples(4), steps=1, batch_size=4, log=None, micro_tokens=8)


ACCUMULATE = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import sft
from torch.optim.optimizer import register_optimizer_step_pre_hook
from world import final_table, tiny
dist.init_process_group("gloo")
tasks = tiny.make_tasks(40, seed=0, split="sft")
designer, executor = tiny.sft_traces(tasks, seed=0)
samples = designer[:16] + executor[:48]     # 60 to 333 tokens: designer scripts, agent calls
def step(micro_tokens):
    # one step of train_sft; the gradients the optimizer steps with (gathered), the forwards run
    model, tok = tiny.build_model(seed=0, hidden_size=32, num_layers=2)
    grads, forwards = [], []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    def keep(opt, args, kwargs):
        for group in opt.param_groups:
            for p in group["params"]:
                g = p.grad
                grads.append(g.full_tensor() if hasattr(g, "full_tensor") else g.clone())
    hook = register_optimizer_step_pre_hook(keep)
    stats = sft.train_sft(model, tok, samples, steps=1, lr=1e-3, batch_size=8, log=None,
                          optimizer="adamw", clip=1e9, micro_tokens=micro_tokens)
    hook.remove()
    return grads, len(forwards), stats
whole, n_whole, a = step(0)
micro, n_micro, b = step(400)
worst = max(((g - h).abs().max() / g.abs().max()).item() for g, h in zip(whole, micro))
row = [dist.get_rank(), n_whole, n_micro, worst, a["trained_tokens"], a["loss"], b["loss"]]
# a file a rank: two ranks' lines on one stdout pipe can interleave
with open(f"{sys.argv[2]}/result.{dist.get_rank()}", "w") as f:
    f.write(" ".join(map(str, row)))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("world", [1, 2])
def test_micro_batches_accumulate_the_whole_batchs_gradient(tmp_path, world):
    """One step on 8 samples (a global batch: 4 a rank at 2 ranks), whole and in micro-batches of
    400 tokens (up to 7 a batch): the gradient the optimizer steps with is the whole batch's, to
    fp32 rounding, and so is the loss; at 2 ranks (FSDP2) every rank runs as many forwards, fillers
    making up the count."""
    script = tmp_path / "accumulate.py"
    script.write_text(ACCUMULATE)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}"]
    cmd += ["--master_port", str(_free_port()), str(script), ROOT, str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [(tmp_path / f"result.{k}").read_text().split() for k in range(world)]
    for _, n_whole, n_micro, worst, tokens, loss, micro_loss in rows:
        # the batch forwarded whole once; in micro-batches several times, the same on every rank
        assert int(n_whole) == 1 and int(n_micro) == int(rows[0][2]) > 1
        # a gradient entry sums the batch's N trained tokens' terms (N over every rank), here in
        # other groups and from other padded shapes: within N x 2^-24 of the tensor's largest entry
        eps = int(tokens) * 2.0**-24
        assert float(worst) <= eps
        assert float(micro_loss) == pytest.approx(float(loss), rel=eps)


def test_plan_prints_each_rank_count_and_loads_nothing():
    """`sft.py --model Qwen/Qwen3-8B --plan`: the run on --data's plan (micro-batches of 16384
    tokens, checkpointed layers) before any file is here; exits 0 whether it fits or not."""
    cmd = [sys.executable, "sft.py", "--model", "Qwen/Qwen3-8B", "--plan", "--ranks", "1,8"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    head, disk, one, eight = r.stdout.strip().splitlines()
    assert "8.19e+09 parameters" in head and "micro_tokens 16384, checkpointing full" in head
    assert disk.startswith("disk: the output 4 B x 8.19e+09 = 32.8 GB (fp32)")  # plans.sft_disk
    assert one.startswith("1 rank(s): ") and one.endswith("does not fit: at least 2 ranks")
    assert eight.startswith("8 rank(s): ") and eight.endswith(": fits")


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_save_every_and_resume_give_the_bytes_of_a_run_left_alone(tmp_path, optimizer):
    """train_sft stopped after its step-3 checkpoint (of 8) and resumed ends with the safetensors
    bytes of a run left alone: weights, optimizer states (Muon's momentum, AdamW's moments), the
    schedule's position, the batch stream and the RNGs all come back; the checkpoints go with the
    run's end."""
    from machinery import rundir
    from world import tiny

    tasks = tiny.make_tasks(60, seed=0, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=0)

    class Stop(Exception):
        pass

    def stop_at_5(line):
        if line.startswith("sft step     5/"):
            raise Stop

    def train(out, log=None, resume=False):
        model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        kw = dict(optimizer=optimizer, log=log, log_every=1, save_every=3, resume=resume)
        sft.train_sft(model, tok, designer[:20] + executor[:60], 8, 2e-3, 8, str(out), **kw)

    train(tmp_path / "a")
    with pytest.raises(Stop):
        train(tmp_path / "b", log=stop_at_5)
    assert rundir.checkpoints(tmp_path / "b") == ["step_000003"]
    train(tmp_path / "b", resume=True)
    a, b = ((tmp_path / d / "model.safetensors").read_bytes() for d in "ab")
    assert a == b and rundir.finished(str(tmp_path / "b"))


def test_a_killed_sft_resumes_to_the_bytes_of_a_run_left_alone(base, tmp_path):
    """sft.py --data (the base fixture's samples: the path of a distilled cold start, AdamW,
    micro-batches, checkpointed layers) --steps=40 --save_every=20, SIGKILLed once
    OUT/step_000020/ (model/ and state/) appears, then --resume: the final model.safetensors is
    byte for byte the uninterrupted run's, and the checkpoints go with the run's end. A fresh run
    into the folder the killed one left is refused (it would train over its checkpoints)."""
    import signal
    import time

    from machinery import rundir

    cmd = [sys.executable, "sft.py", f"--data={base / 'data'}", "--batch_size=8"]
    cmd += ["--steps=40", "--save_every=20"]
    alone, d = tmp_path / "alone", tmp_path / "d"
    r = subprocess.run([*cmd, f"--out={alone}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    p = subprocess.Popen(
        [*cmd, f"--out={d}"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while not (d / "step_000020").is_dir():
        assert p.poll() is None, "the run ended before its step-20 checkpoint"
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL
    assert {x.name for x in (d / "step_000020").iterdir()} == {"model", "state"}
    assert not (d / "model.safetensors").exists()
    r = subprocess.run([*cmd, f"--out={d}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "--resume" in r.stderr.strip().splitlines()[-1], r.stderr
    r = subprocess.run([*cmd, f"--out={d}", "--resume"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "sft step    25/40" in r.stdout and "sft step     0/40" not in r.stdout
    assert (d / "model.safetensors").read_bytes() == (alone / "model.safetensors").read_bytes()
    assert rundir.checkpoints(d) == [] and rundir.finished(str(d))
