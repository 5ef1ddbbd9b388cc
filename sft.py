"""sft.py: the supervised cold start of both roles (SFT), before RL.

A sample is a chat prompt and the completion the model should write: {"messages": [...],
"completion": str}. Designer samples pair the Designer prompt with a workflow script, Executor
samples pair one agent call's prompt with its reply. The prompt is rendered with the tokenizer's
chat template (add_generation_prompt=True), exactly as the engine renders it at rollout time; the
completion ids and the end-of-turn token are appended. Only the completion is trained on:

    L(theta) = - (1 / |C|) * sum_{t in C} log pi_theta(y_t | prompt, y_<t)

where C is the set of completion tokens (plus the end-of-turn token, so the model learns to stop) of
the whole batch on all ranks: a token-mean, with the token count all-reduced so every rank divides
by the same number. Log-probs come from logprob_rows.chunked_token_logprobs (never the
full-vocabulary logits in fp32). Batches are length-bucketed (samples of similar length together,
little padding); AdamW, or Muon on the hidden matrices (muon.py; the tiny default), with linear
warmup and cosine decay; gradient-norm clipping; Hugging Face checkpoints (model and tokenizer).

What fits a GPU: a batch goes forward and backward in micro-batches of at most --micro_tokens
tokens (padding counted), their gradients accumulated before the one optimizer step. Each
micro-batch m adds sum_{t in C_m} -log pi / |C|, |C| the whole batch's count: the sum over m is L
exactly, so the step is the whole batch's (to fp32 rounding). Activation checkpointing
(speed.prepare's "full") keeps each decoder layer's input alone. The memory plan of a GPU rank
(plans.sft_plan: 16 B a parameter of states over the ranks, the micro-batch's activations, the
lm head's chunk) is checked before any model loads and refused with its arithmetic and the fix.
The tiny default forwards each batch whole, without checkpointing; a run on --data takes
micro-batches of 16384 tokens and checkpointed layers (SCALE), for --epochs (2) of 64 samples a
step. batch_size is global, samples a step over every rank: a run's steps, and each step's
samples, are the same on one GPU or eight. Before a GPU run starts, each rank checks that its GPU
has the plan's memory free (torch.cuda.mem_get_info; a teacher's server still up holds most of it).

    python sft.py                                   # tiny default: build, train on CPU, write
                                                    # out/tiny-sft/, print the quality-bar figures
                                                    # on held-out tasks
    python sft.py --roles separate                  # two cold-started models: OUT/designer,
                                                    # OUT/executor
    python sft.py --model Qwen/Qwen3-8B --data DIR --config config/qwen3_8b.py --out out/sft-8b
                                                    # DIR holds designer.jsonl, executor.jsonl;
                                                    # prompts rendered as the preset's RL renders
                                                    # them (chat_template_kwargs: thinking off);
                                                    # --epochs 2 of 64 samples a step (SCALE)
    torchrun --nproc_per_node=8 sft.py --model ...  # FSDP2 (nccl on GPU, gloo on CPU), each
                                                    # batch shared by the ranks: the same run
    python sft.py --steps=40 --save_every=20 --out=D   # a checkpoint every 20 steps: D/step_000020/
    python sft.py --steps=40 --save_every=20 --out=D --resume   # ... and on from it, to the bytes
                                                    # of a run left alone
    python sft.py --model Qwen/Qwen3-8B --plan --ranks 1,2,8
                                                    # a GPU rank's memory plan; loads nothing

Roles: "both" trains one model on both sample sets (shared policy) into OUT; "separate" trains one
model a role, OUT/designer and OUT/executor, each from the same base weights. At scale the data
comes from a teacher (distill.py); in the tiny world from tiny.sft_traces.

From Python:
    stats = train_sft(model, tokenizer, samples, steps=300, lr=2e-3, batch_size=64, out_dir="out/x")
    figures = final_table.evaluate_sft("out/x", heldout_tasks)  # (world/final_table.py) the
                                              # quality bar: parse rate, template accuracies

Needs: evaluate.py, machinery/logprob_rows.py, machinery/data.py, machinery/engine.py,
machinery/muon.py, machinery/ranks.py, machinery/cpu_bits.py, machinery/rundir.py,
machinery/speed.py,
machinery/weights.py, mas.py, rollout.py, settings.py, world/tiny.py, machinery/decode.py,
machinery/isolation.py, machinery/confine.py, machinery/provenance.py,
machinery/reload_check.py, reward.py, sandbox.py, stagewise.py, machinery/plans.py,
machinery/programs.py, world/final_table.py, world/heldout.py, machinery/grader.py,
machinery/results.py"""

import argparse
import functools
import itertools
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM, AutoTokenizer

import mas
import rollout
import settings
from machinery import cpu_bits, data, muon, plans, ranks, rundir, speed
from machinery import engine as engine_lib
from machinery.logprob_rows import chunked_token_logprobs
from machinery.rundir import full_disk_exits
from world import final_table, tiny

# the tiny default: Muon, 1300 steps of 8 samples on the traces of 3000 tasks of the sft split, 600
# of them with their designer sample (the calibration behind it: docs/NOTES.md)
TINY = dict(
    steps=1300, lr=2e-3, batch_size=8, train_tasks=3000, designer_tasks=600, optimizer="muon"
)
# ... each batch whole, no checkpointing (the cold start's numbers as they were); a run on --data:
# AdamW, micro-batches of 16384 tokens and checkpointed layers (its memory plan: plans.sft_plan)
TINY.update(micro_tokens=0, checkpointing="off", save_every=0)
# batch_size: samples a step over every rank (8 a rank on 8 GPUs), a run's length in epochs over
# the samples read (EPOCHS, ours; steps = ceil(epochs x samples / batch_size)), so it does not
# depend on the GPU count
SCALE = dict(
    steps=None, lr=1e-5, batch_size=64, optimizer="adamw", micro_tokens=16384, checkpointing="full"
)
SCALE.update(save_every=100)  # a checkpoint every 100 steps: --resume loses at most 100
EPOCHS = 2
HP = ("steps", "lr", "batch_size", "optimizer", "micro_tokens", "checkpointing", "save_every")

# --------------------------------------------------------------------------------------------------
# batching: samples tokenized by engine.encode_samples (the chat-template prompt, the completion,
# the end of turn)


def length_batches(lengths, batch_size, rng, bucket=32):
    """Shuffle, then sort within windows of bucket*batch_size samples so each batch holds similar
    lengths; the batch order is shuffled again so long and short batches interleave."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    window = batch_size * bucket
    for s in range(0, len(order), window):
        part = sorted(order[s : s + window], key=lengths.__getitem__)
        batches += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


def micro_batches(idx, lengths, budget):
    """A batch's samples as micro-batches of at most `budget` tokens each, padding counted (rows x
    the longest row): shortest first, a new micro-batch whenever the next sample would pass the
    budget. budget 0, or a batch within it: the batch whole, in its order."""
    if budget <= 0 or len(idx) * max(lengths[k] for k in idx) <= budget:
        return [list(idx)]
    out = [[]]
    for k in sorted(idx, key=lengths.__getitem__):
        if out[-1] and (len(out[-1]) + 1) * lengths[k] > budget:
            out.append([])
        out[-1].append(k)
    return out


def collate(encoded, idx, pad_id, device):
    """Right-padded input_ids/attention_mask [B, T] and the loss mask [B, T-1] aligned with
    grpo.token_logprobs (position t scores token t+1): 1 on completion tokens only. The trainer's
    own packing (rollout.samples_to_tensors), as tiny.exact_figures packs its sequences."""
    pairs = [encoded[k] for k in idx]
    seqs = [
        rollout.Sample(ids[:p], ids[p:], [0.0] * (len(ids) - p), (r,))
        for r, (ids, p) in enumerate(pairs)
    ]
    b = rollout.samples_to_tensors(seqs, pad_id, device)
    return b["input_ids"], b["attention_mask"], b["completion_mask"]


# --------------------------------------------------------------------------------------------------
# distributed: FSDP2 when torchrun started us (machinery/ranks.py's group), one process otherwise


def start():
    """(rank, world, device): under torchrun a rank of ranks.setup's group (nccl on a GPU, gloo on
    a CPU, its share of the cores); one process without a group otherwise, on a GPU if there is
    one (its threads as torch sets them: the tiny cold start's numbers do not move)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        return ranks.setup("auto")
    rank, world = ranks.rank_world()
    if torch.cuda.is_available():
        return rank, world, torch.device("cuda", torch.cuda.current_device())
    return rank, world, torch.device("cpu")


# --------------------------------------------------------------------------------------------------
# training


def train_sft(
    model,
    tokenizer,
    samples,
    steps=300,
    lr=2e-3,
    batch_size=64,
    out_dir=None,
    *,
    seed=0,
    weight_decay=0.01,
    clip=1.0,
    min_lr_ratio=0.1,
    log_every=25,
    log=print,
    optimizer="adamw",
    template_kwargs=None,
    micro_tokens=0,
    checkpointing="off",
    save_every=0,
    resume=False,
):
    """Train `model` on chat samples for `steps` optimizer steps; save to out_dir (HF format) if
    given. Prompts are rendered with template_kwargs (the preset's chat_template_kwargs, as RL,
    evaluation and distillation render them).

    batch_size is samples a step over every rank (a global batch: a run's length and what a step
    sees do not depend on the rank count). Under torchrun the model is sharded with FSDP2
    (speed.prepare's layout, unless it already is), each rank trains on its share of each
    length-bucketed batch (batch_size / world samples), and FSDP reduces the gradients.
    checkpointing (speed.prepare's: off | full) keeps each decoder layer's input alone and replays
    the layer in the backward.
    micro_tokens > 0: a batch goes forward and backward in micro-batches of at most that many
    tokens (micro_batches), their gradients accumulated before the one optimizer step; each
    micro-batch's loss is divided by the batch's token count over every rank, so the sum is the
    batch's token-mean exactly (equal to the whole batch's gradient to fp32 rounding). Every rank
    forwards as many micro-batches (FSDP2's forwards are collective): fillers that train nothing.
    save_every > 0: a checkpoint every save_every steps, out_dir/step_N/ (rundir.save_training: it
    reads no RNG, changes no number); resume: on from out_dir's newest, to the bytes of a run left
    alone. Returns a stats dict."""
    rank, world = ranks.rank_world()
    check_batches(samples, batch_size, world)
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    encoded = encode_checked(tokenizer, samples, micro_tokens, template_kwargs)
    if not isinstance(model, FSDPModule):  # checkpointed layers; FSDP2 under torchrun
        speed.prepare(model, checkpointing, shard=world > 1, bf16=device.type == "cuda")
    model.train()
    opt, sched = optimizer_schedule(model, optimizer, lr, weight_decay, steps, min_lr_ratio)
    first = rundir.resume_training(out_dir, model, opt, sched, seed) if resume else 0
    lengths = [len(e[0]) for e in encoded]
    # (resumed: past the batches of the steps done, where the run left the stream)
    stream = itertools.islice(rank_batches(lengths, batch_size, seed, rank, world), first, None)
    step_of = functools.partial(sft_step, model, encoded, lengths, micro_tokens, clip, opt, sched)
    losses, tokens, t0 = [], 0, time.perf_counter()
    for step in range(first, steps):
        loss, n_tok, gnorm = step_of(next(stream), engine_lib.pad_id(tokenizer))
        losses.append(loss)
        tokens += n_tok
        if rank == 0 and log is not None and (step % log_every == 0 or step == steps - 1):
            log(progress(step, steps, loss, sched, gnorm, tokens / (time.perf_counter() - t0)))
        if out_dir and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            rundir.save_training(out_dir, step + 1, model, opt, sched, tokenizer)
    wall = time.perf_counter() - t0
    if out_dir is not None:
        rundir.save_model(model, tokenizer, out_dir)
    model.eval()
    return {
        "steps": steps,
        "loss": losses[-1],
        "losses": losses,
        "trained_tokens": tokens,
        "wall_s": wall,
        "samples": len(encoded),
    }


def optimizer_schedule(model, optimizer, lr, weight_decay, steps, min_lr_ratio):
    """The optimizer (muon.make_optimizer's) and its schedule: linear warmup over steps // 20, then
    cosine down to min_lr_ratio x lr at the last step (settings.warmup_cosine)."""
    opt = muon.make_optimizer(model, optimizer, lr, weight_decay)
    lr_at = functools.partial(
        settings.warmup_cosine, warmup=max(1, steps // 20), end=steps, floor=min_lr_ratio
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)


def progress(step, steps, loss, sched, gnorm, speed_now):
    """A step's printed line: loss, lr, gradient norm, tokens/s."""
    gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
    return (
        f"sft step {step:5d}/{steps}  loss {loss:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
        f"gnorm {float(gn):.2f}  {speed_now:.0f} tok/s"
    )


def check_batches(samples, batch_size, world):
    """A global batch splits evenly over the ranks, each of which gets a sample."""
    if len(samples) < world:
        raise ValueError(f"{len(samples)} samples cannot give each of {world} ranks one")
    if batch_size % world:
        raise ValueError(
            f"batch_size={batch_size} (samples a step, over every rank) must be divisible by the "
            f"{world} ranks: {batch_size // world * world or world} or "
            f"{(batch_size // world + 1) * world}"
        )


def encode_checked(tokenizer, samples, micro_tokens, template_kwargs):
    """The samples tokenized (engine.encode_samples); none of them longer than a micro-batch."""
    encoded, _ = engine_lib.encode_samples(tokenizer, samples, template_kwargs=template_kwargs)
    if not encoded:
        raise ValueError("no trainable samples")
    longest = max(len(e[0]) for e in encoded)
    if 0 < micro_tokens < longest:
        raise ValueError(
            f"a sample of {longest} tokens is longer than micro_tokens={micro_tokens} (its "
            f"micro-batch would pass the memory plan's): raise --micro_tokens"
        )
    return encoded


def rank_batches(lengths, batch_size, seed, rank, world):
    """Every rank builds the same batch list (same seed); a batch is one step over every rank, each
    rank taking its share of it (its samples rank, rank + world, ... of the batch, sorted by
    length): disjoint shards, a step the same samples at any rank count. A batch shorter than the
    ranks (an epoch's last) is left out on several ranks: every rank has a share."""
    rng = random.Random(seed)
    while True:
        for batch in length_batches(lengths, batch_size, rng):
            if len(batch) >= world:
                yield batch[rank::world]


def sft_step(model, encoded, lengths, micro_tokens, clip, opt, sched, mine, pad_id):
    """One optimizer step on this rank's share `mine` of a batch: its micro-batches forward and
    backward, each loss the global token-mean's share, the gradient clipped, the step. Returns
    (the batch's loss, its trained tokens over every rank, the gradient norm)."""
    _, world = ranks.rank_world()
    device = next(model.parameters()).device
    # (FSDP2 computes in bf16 itself)
    bf16 = device.type == "cuda" and not isinstance(model, FSDPModule)
    micro = [
        collate(encoded, part, pad_id, device)
        for part in micro_batches(mine, lengths, micro_tokens)
    ]
    if world > 1 and micro_tokens > 0:  # as many forwards on every rank: fillers
        count = torch.tensor([len(micro)], device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        for _ in range(int(count) - len(micro)):
            ids, attn, mask = collate([([pad_id, pad_id], 1)], [0], pad_id, device)
            micro.append((ids, attn, mask * 0))  # a sequence that trains no token
    n_tok = sum(mask.sum() for _, _, mask in micro)
    if world > 1:
        dist.all_reduce(n_tok)
    total = 0.0
    for ids, attn, mask in micro:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            lp = chunked_token_logprobs(model, ids, attn)
        # FSDP averages gradients over ranks, so scale by world: the global token-mean; each
        # micro-batch's share of it, its gradient added to the others' until the step
        loss = -(lp.float() * mask).sum() * world / n_tok.clamp(min=1)
        loss.backward()
        total = total + loss.detach() / world
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    if world > 1:
        dist.all_reduce(total)
    return total.item(), int(n_tok.item()), gnorm


# --------------------------------------------------------------------------------------------------
# the command line


def _load_base(model_path, device, seed):
    if model_path is None:
        model, tok = tiny.build_model(seed=seed)
    else:
        tok = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model.to(device), tok


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="SFT cold start (no arguments: the tiny default on CPU)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", help="HF model folder or hub id (none: the tiny world's model)")
    p.add_argument(
        "--data", help="a folder with designer.jsonl, executor.jsonl (none: tiny traces)"
    )
    p.add_argument("--out", default="out/tiny-sft")
    p.add_argument("--roles", default="both", choices=["both", "separate"])
    p.add_argument("--steps", type=int, help="optimizer steps (or --epochs)")
    p.add_argument(
        "--epochs",
        type=float,
        help=f"passes over the samples read (on --data: {EPOCHS}; steps = ceil(epochs x samples "
        "/ batch_size))",
    )
    p.add_argument("--lr", type=float, help="peak lr (tiny: 2e-3; --data: 1e-5)")
    p.add_argument("--batch_size", type=int, help="samples a step over every rank (tiny 8, 64)")
    p.add_argument("--optimizer", choices=["muon", "adamw"], help="(tiny: muon; --data: adamw)")
    p.add_argument(
        "--micro_tokens",
        type=int,
        help="tokens a micro-batch (padding counted), gradients accumulated over a batch's (0: "
        "the batch whole, the tiny default; --data: 16384)",
    )
    p.add_argument(
        "--checkpointing", choices=speed.MODES, help="activation checkpointing (tiny off, full)"
    )
    p.add_argument(
        "--config",
        help="the RL preset whose chat_template_kwargs render the prompts (config/qwen3_8b.py: "
        "thinking off), so SFT trains on the prompts RL samples from (none: the tiny preset's)",
    )
    p.add_argument("--no_eval", action="store_true", help="tiny: no quality bar on 200 val tasks")
    p.add_argument(
        "--other_share",
        type=float,
        default=tiny.OTHER_SHARE,
        help="tiny: the share of designer samples showing a template other than the suited one",
    )
    p.add_argument(
        "--prior",
        default=tiny.PRIOR,
        choices=["flat", "suited", *sorted(mas.TEMPLATES)],
        help="tiny: the templates the Designer's samples show, with tiny.PRIOR_WEIGHTS on every "
        "kind (flat), the suited one (suited), or this template most (the Executor's unchanged)",
    )
    p.add_argument("--save_every", type=int, help="a checkpoint every N steps (tiny 0: none; 100)")
    p.add_argument("--resume", action="store_true", help="go on from OUT's newest checkpoint")
    p.add_argument("--plan", action="store_true", help="a GPU rank's memory plan; loads nothing")
    p.add_argument("--ranks", default="1,2,8", help="--plan's rank counts")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def run_settings(a):
    """(the settings of the run: TINY's or SCALE's where a flag is not given, its length in epochs
    or None, the chat template's switches), or a one-line exit on a bad argument."""
    try:
        template_kwargs = settings.chat_template_kwargs(a.config)
    except settings.ConfigError as e:
        sys.exit(f"sft.py: --config: {e}")
    # before any process group or model
    if a.model is not None and engine_lib.missing_model(a.model):
        sys.exit(
            f"sft.py: --model: {engine_lib.missing_model(a.model)} (a Hugging Face model folder, "
            f"as from_pretrained reads it, or a hub id; no --model: the tiny world's model)"
        )
    for name in ("designer.jsonl", "executor.jsonl") if a.data is not None else ():
        if not os.path.isfile(os.path.join(a.data, name)):
            sys.exit(
                f"sft.py: --data: no {os.path.join(a.data, name)} (python tools/distill.py --out "
                f"{a.data} writes designer.jsonl and executor.jsonl)"
            )
    dirs = rundir.cold_start_dirs(a.out, separate=a.roles == "separate").values()
    if not a.resume and any(rundir.checkpoints(d) for d in dirs):
        sys.exit(f"sft.py: {a.out} holds a run's checkpoints: --resume goes on (or delete them)")
    if a.steps is not None and a.epochs is not None:
        sys.exit("sft.py: --steps or --epochs: a run's length is one of them")
    given = {k: getattr(a, k) for k in HP if getattr(a, k, None) is not None}
    hp = {k: given.get(k, (TINY if a.data is None else SCALE)[k]) for k in HP}
    # the run's length in epochs: --epochs, else (on --data without --steps) EPOCHS
    epochs = a.epochs if a.epochs is not None else (EPOCHS if hp["steps"] is None else None)
    if a.plan:  # of a run on --data
        hp = {k: given.get(k, SCALE[k]) for k in HP}
    return hp, epochs, template_kwargs


def check_gpu_plan(a, hp):
    """A GPU run's memory plan, before any model loads (the tiny model trains on a CPU): each rank
    asks of its own GPU, before anything is on it."""
    if a.model is None or not torch.cuda.is_available():
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    params, shape = plans.model_shape(a.model)
    share = -(-hp["batch_size"] // world)  # a rank's samples a step
    plan = (shape, params, world, hp["micro_tokens"], hp["checkpointing"], share)
    problems = plans.sft_plan_problems(*plan) if shape else []
    if problems:
        sys.exit(f"sft.py: {problems[0]}")
    short = shape and plans.short_of_memory(plans.sft_plan(*plan)["total"], "its plan")
    if short:
        sys.exit(f"sft.py: {short}")


def read_samples(a, rank):
    """(designer samples, executor samples): the tiny world's traces of TINY["train_tasks"] tasks of
    the sft split, or --data's files (tools/distill.py's)."""
    if a.data is not None:
        designer = data.read_jsonl(os.path.join(a.data, "designer.jsonl"))
        return designer, data.read_jsonl(os.path.join(a.data, "executor.jsonl"))
    t0 = time.perf_counter()
    tasks = tiny.make_tasks(TINY["train_tasks"], seed=a.seed, split="sft")
    designer, executor = tiny.sft_traces(
        tasks, seed=a.seed, other_share=a.other_share, prior=a.prior
    )
    # the four scripts are learned from fewer samples than the executor's arithmetic needs
    designer = designer[: TINY["designer_tasks"]]
    if rank == 0:
        print(
            f"tiny traces: {len(designer)} designer + {len(executor)} executor samples "
            f"from {len(tasks)} tasks in {time.perf_counter() - t0:.1f}s"
        )
    return designer, executor


def train_role(a, hp, epochs, out_dir, samples, template_kwargs, device):
    """One model from the base weights on `samples`, into out_dir."""
    rank, world = ranks.rank_world()
    model, tok = _load_base(a.model, device, a.seed)
    run = dict(hp)
    if epochs is not None:  # steps = ceil(epochs x samples / batch_size), at any rank count
        run["steps"] = max(1, math.ceil(epochs * len(samples) / hp["batch_size"]))
    if rank == 0:
        length = f"{epochs:g} epochs = " if epochs is not None else ""
        print(
            f"sft -> {out_dir}: {len(samples)} samples, {length}{run['steps']} steps of "
            f"{hp['batch_size']} ({hp['batch_size'] // world} a rank), {run}, world {world}"
        )
    kw = dict(out_dir=out_dir, seed=a.seed, template_kwargs=template_kwargs, resume=a.resume)
    stats = train_sft(model, tok, samples, **kw, **run)
    if rank == 0:
        print(
            f"sft done: {stats['steps']} steps, final loss {stats['loss']:.4f}, "
            f"{stats['trained_tokens']} tokens, {stats['wall_s']:.1f}s"
        )


def main(argv):
    a = parse_args(argv)
    hp, epochs, template_kwargs = run_settings(a)
    if a.plan:
        return print(plans.sft_report(a.model, hp, a.ranks))
    check_gpu_plan(a, hp)
    rank, world, device = start()
    designer, executor = read_samples(a, rank)
    jobs = [(a.out, designer + executor)]  # roles "both": one model
    if a.roles == "separate":
        jobs = [(os.path.join(a.out, "designer"), designer)]
        jobs.append((os.path.join(a.out, "executor"), executor))
    t0 = time.perf_counter()
    with full_disk_exits("sft.py", a.out):  # a full disk: one line; the last checkpoint stays
        for out_dir, samples in jobs:  # every role starts cold from the same base
            if not (a.resume and rundir.finished(out_dir)):  # (a resumed run's finished role)
                train_role(a, hp, epochs, out_dir, samples, template_kwargs, device)
    if world > 1:
        # every rank past its last collective before any tears the group down: a rank that left
        # first can make gloo abort the other at exit (seen once, tests/test_sft.py under load)
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    print(f"SFT wall time: {time.perf_counter() - t0:.1f}s")
    if a.data is None and not a.no_eval:  # the quality bar, on heldout.tasks(200, seed, "val")
        held = tiny.make_tasks(200, seed=a.seed + 2_000_003, split="val")
        paths = dict(model_path=a.out)
        if a.roles == "separate":
            paths = dict(
                model_path=os.path.join(a.out, "executor"),
                designer_path=os.path.join(a.out, "designer"),
            )
        figures = final_table.evaluate_sft(tasks=held, seed=a.seed, **paths)
        print(final_table.format_figures(figures))


if __name__ == "__main__":
    if parse_args(sys.argv[1:]).model is None and not torch.cuda.is_available():
        cpu_bits.restart_pinned(__file__)  # the same bits on every x86 CPU
    main(sys.argv[1:])
