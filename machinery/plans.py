"""plans.py: the memory a GPU rank needs, planned before any model loads, for RL (memory_plan:
train.py through settings.validate) and for SFT (sft_plan: sft.py), and checked against each GPU's
total and free memory.

The memory plan of a GPU rank, at its two moments, refused before any model loads when it does
not fit (P: the trainer's parameters, both models' with separate policies; R: the ranks, over which
FSDP2 shards every fp32 state; the engine's share gpu_memory_utilization of the GPU's memory: this
one's, or an H200's where none is here):

    update  = (4 B weights x P + 4 B gradients x the trained model's parameters
               + 8 B x a model's parameters x each Adam state on the GPU) / R
              + the engine's share (asleep: its level-2 sleep frees it for the update's activations)
              + RESERVE_GIB
    wake    = update - the gradients (freed after the optimizer step: train.update), the
              engine awake in its share: its bf16 weights (2 B a parameter, whole on every rank),
              activations, CUDA graphs, the KV cache
    fits:     update <= the GPU's memory, and the engine's share >= its weights + RESERVE_GIB
    free:     update <= what this rank's GPU has free when the run starts (free_memory_problems,
              torch.cuda.mem_get_info: another process on it, a teacher's server left running,
              stops the run there, with how much is free against what the update needs)

The Adam states a rank holds (adam_states): a shared policy trained stagewise keeps one per role,
both after the first switch, 24 B a parameter at the update; offload_idle_state keeps the idle
role's in host memory for its stage (machinery/offload.py: 8 P / R of pinned memory a rank), 16 B
on the GPU. Separate policies: two models, both resident, each with its own state (28 B a
parameter of one model at a stagewise update, 20 B with the idle model's state offloaded the same
way; coupled: both trained, 32 B). Coupled and one-role modes have no idle role.

    plan = memory_plan(cfg, 8, init_params(cfg))   # a GPU rank's memory, GiB (validate's check)
    python train.py config/qwen3_8b.py --plan --ranks=1,2,8    # plan_report: the plan per rank
                                                                # count, with and without the
                                                                # offload; loads nothing

P is init_from's (its *.safetensors headers: nothing is loaded), or, while init_from is not there
yet, Qwen3's by the size its path names (QWEN3: "sft-qwen3-8b" is Qwen3-8B; 0.6b, 4b, 8b), or
--params=8b / --params=8.19e9 on --plan's command line. The update's activations live in the
engine's share; tools/first_gpu_run.py --check prints the plan beside what it measures.

SFT's plan (sft_plan: sft.py checks it before any model loads, `sft.py --model M --plan` prints
it) has no engine: 16 B a parameter over the ranks, a micro-batch's tokens times what a token
keeps (activation checkpointing: each layer's input and one layer's intermediates), the lm head's
chunk, the bf16 weights computed with; each rank checks it against its GPU's free memory too
(short_of_memory).

The disk a run needs (--plan prints it beside the memory; first_gpu_run.py --check holds it
against what is free), GB = 1e9 bytes:

    checkpoint  = (2 B bf16 weights (4 B fp32 on a CPU) + 4 B fp32 masters) x P
                  + 8 B x a model's parameters x each Adam state saved     (checkpoint_bytes)
    RL          = checkpoint x the most step_N folders on disk at once: a save writes its folder
                  whole beside the kept ones (the 2 newest and every val_every-th) before it
                  removes the stale (checkpoints_on_disk)
    SFT         = its output (fp32: 4 B x P) + two checkpoints of --save_every (the newest and
                  the one being written: model/ 4 B + state/ 12 B a parameter) + --model's
                  download in the hub cache (2 B x P: bf16 safetensors)                 (sft_disk)
    Qwen3-8B: a checkpoint (2 + 4 + 2 x 8) B x 8.19e9 = 180 GB, 6 at once at step 400 = 1.08 TB;
    SFT 0.31 TB; the path ~1.4 TB, and the teacher's download (Qwen3-32B: 65.5 GB)

`cfg` is anything with settings.Config's fields (the plans read policy, mode, init_from,
engine_kwargs, device, offload_idle_state, batch_size, executor_batch_size, out_dir, steps,
save_every, val_every).

Needs: machinery/cpu_bits.py, machinery/provenance.py, machinery/rundir.py (cold_start_dirs: a cold
start's model folders)
"""

import dataclasses
import inspect
import json
import math
import os
import re

from machinery import rundir

RESERVE_GIB = 4.0  # ours: the CUDA context, NCCL's buffers, the allocator's fragmentation
H200_GIB = 139.0  # the plan's GPU where no GPU is here to ask: one H200
GIB = 2**30
GB = 1e9  # disk: decimal, as df -H and the hub's file sizes
SFT_CHECKPOINT_B = 16  # SFT's checkpoint a parameter: model/ fp32 4 B, state/ masters + AdamW 12 B
# Qwen3's shapes, each from its config.json on the Hugging Face hub (Qwen/Qwen3-0.6B, Qwen3-4B,
# Qwen3-8B): 0.6B and 4B tie the lm head to the embeddings, 8B does not. qwen3_params counts
# 5.96e8, 4.02e9 and 8.19e9 (tests/test_first_gpu_run.py builds each on the meta device)
QWEN3 = {
    "0.6b": dict(
        hidden_size=1024,
        num_hidden_layers=28,
        head_dim=128,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "4b": dict(
        hidden_size=2560,
        num_hidden_layers=36,
        head_dim=128,
        intermediate_size=9728,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        num_hidden_layers=36,
        head_dim=128,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=151936,
        tie_word_embeddings=False,
    ),
}


def qwen3_params(size):
    """The parameters of Qwen3-{size} (QWEN3's shapes): the embeddings (and an untied lm head of
    the same shape); a layer's q, k, v, o projections, q and k norms, gate, up and down
    projections, two norms; the final norm."""
    s = QWEN3[size]
    h, d = s["hidden_size"], s["head_dim"]
    attention = 2 * h * d * (s["num_attention_heads"] + s["num_key_value_heads"]) + 2 * d
    layer = attention + 3 * h * s["intermediate_size"] + 2 * h
    heads = 1 if s["tie_word_embeddings"] else 2
    return heads * s["vocab_size"] * h + s["num_hidden_layers"] * layer + h


def qwen3_size(path):
    """The Qwen3 size a path names ("out/sft-qwen3-8b", "Qwen/Qwen3-4B": "8b", "4b"), or None."""
    m = re.search(r"qwen3[-_]?(0\.6b|4b|8b)(?![0-9])", str(path).lower())
    return m.group(1) if m else None


def adam_states(cfg):
    """(the AdamW states a rank holds once every role has stepped, those of them on the GPU):
    stagewise keeps one per role (train.opt_state), one idle, in host memory with
    offload_idle_state; coupled steps one state (shared) or one a model (separate) every step; a
    one-role mode steps one."""
    both = cfg.mode == "stagewise" or (cfg.mode == "coupled" and cfg.policy == "separate")
    held = 2 if both else 1
    return held, held - (cfg.mode == "stagewise" and cfg.offload_idle_state)


def memory_plan(cfg, world, params):
    """A GPU rank's memory plan in GiB for a trainer of `params` parameters (both models' with
    separate policies; see the module docstring): the update's weights, grads, adam (on the GPU),
    trainer (their sum), engine, reserve, update and wake totals, total (the larger: update),
    host (offloaded Adam), states ((held, on the GPU)), engine_weights, gpu. None without a plan
    (no engine share set: the CPU presets)."""
    util = cfg.engine_kwargs.get("gpu_memory_utilization")
    if util is None or cfg.device == "cpu":
        return None
    models = 1 if cfg.policy == "shared" else 2
    one = params / models  # a model's parameters
    trained = 2 if models == 2 and cfg.mode == "coupled" else 1  # models a step updates
    held, on_gpu = adam_states(cfg)
    rank = world * GIB  # bytes of the whole -> GiB on a rank
    p = {
        "weights": 4 * params / rank,
        "grads": 4 * one * trained / rank,
        "adam": 8 * one * on_gpu / rank,
        "host": 8 * one * (held - on_gpu) / rank,
        "states": (held, on_gpu),
        "engine": util * (gpu_gib() or H200_GIB),
        "engine_weights": 2 * one / GIB,
        "reserve": RESERVE_GIB,
        "gpu": gpu_gib() or H200_GIB,
    }
    p["trainer"] = p["weights"] + p["grads"] + p["adam"]
    p["update"] = p["trainer"] + p["engine"] + p["reserve"]
    p["wake"] = p["update"] - p["grads"]
    p["total"] = p["update"]
    return p


def plan_line(cfg, world, params):
    """The plan's arithmetic, in a line (validate's message, first_gpu_run.py's print)."""
    p, util = memory_plan(cfg, world, params), cfg.engine_kwargs["gpu_memory_utilization"]
    coef = {k: p[k] * world * GIB / params for k in ("grads", "adam")}  # bytes a parameter
    host = f"; the idle Adam state in host memory, {p['host']:.1f} GiB" if p["host"] else ""
    return (
        f"update: (4 weights + {coef['grads']:g} gradients + {coef['adam']:g} Adam, "
        f"{p['states'][1]} state(s)) B x {params:.3g} params / {world} rank(s) = "
        f"{p['trainer']:.1f} GiB + the engine {util} x {p['gpu']:g} GiB = {p['engine']:.1f} GiB "
        f"(asleep: the activations' room; awake: its bf16 weights {p['engine_weights']:.1f} GiB, "
        f"the KV cache) + {p['reserve']:g} GiB reserve = {p['update']:.1f} GiB of {p['gpu']:g} "
        f"GiB; wake (gradients freed): {p['wake']:.1f} GiB{host}"
    )


def init_params(cfg):
    """The parameters the trainer holds: init_from's models' (*.safetensors headers); 0 while a
    folder is missing (validate says so on its own)."""
    return sum(
        stored_params(path)
        for path in rundir.cold_start_dirs(cfg.init_from, cfg.policy != "shared").values()
    )


def fits(cfg, world, params):
    return memory_plan(cfg, world, params)["update"] <= memory_plan(cfg, world, params)["gpu"]


def plan_fix(cfg, world, params):
    """What makes a plan that does not fit fit: the fewest ranks (within a few nodes), the offload
    of the idle Adam state, the largest engine share that still holds the engine's weights."""
    p, fixes = memory_plan(cfg, world, params), []
    more = [w for w in range(world + 1, 65) if fits(cfg, w, params)]
    # the fewest that also divide the batches (validate's other check), else the fewest
    shares = [w for w in more if cfg.batch_size % w == 0 == cfg.executor_batch_size % w]
    fewest = (shares or more or [None])[0]
    if fewest:
        fixes.append(f"at least {fewest} ranks")
    offload = dataclasses.replace(cfg, offload_idle_state=True)
    if adam_states(offload) != adam_states(cfg) and fits(offload, world, params):
        fixes.append("--offload_idle_state (the idle role's Adam state in host memory)")
    most = (p["gpu"] - p["trainer"] - p["reserve"]) / p["gpu"]
    if most * p["gpu"] >= p["engine_weights"] + p["reserve"]:  # the engine still fits
        fixes.append(f"gpu_memory_utilization <= {math.floor(100 * most) / 100:.2f}")
    return ", or ".join(fixes) or "no fix within 64 ranks: a smaller model or a larger GPU"


def plan_problems(cfg, world, params=None):
    """What is wrong with the memory plan of a model of `params` parameters (None: init_from's):
    it does not fit a rank, or it leaves the engine no room beside its weights."""
    if memory_plan(cfg, world, 0.0) is None:  # no plan: nothing to read
        return []
    params = init_params(cfg) if params is None else params
    if params <= 0:
        return []
    util = cfg.engine_kwargs["gpu_memory_utilization"]
    if not isinstance(util, float) or not 0 < util < 1:
        return [f"engine_kwargs' gpu_memory_utilization must be in (0, 1), got {util!r}"]
    p, problems = memory_plan(cfg, world, params), []
    if not fits(cfg, world, params):
        line, fix = plan_line(cfg, world, params), plan_fix(cfg, world, params)
        problems.append(f"the memory plan does not fit: {line} ({fix})")
    if p["engine"] < p["engine_weights"] + p["reserve"]:
        problems.append(
            f"the memory plan leaves the engine no KV cache: {util} x {p['gpu']:g} GiB = "
            f"{p['engine']:.1f} GiB for its bf16 weights ({p['engine_weights']:.1f} GiB) and "
            f"{p['reserve']:g} GiB of activations"
        )
    return problems


def free_memory_problems(cfg, world):
    """The plan's update (the trainer's shards, the engine's share, the reserve) against what this
    rank's GPU has free at the start: another process on it (a teacher's server left running)
    stops the run before any model loads, saying how much is free. [] without a plan or a GPU."""
    params = init_params(cfg)
    if memory_plan(cfg, world, 0.0) is None or params <= 0:
        return []
    need = memory_plan(cfg, world, params)["update"]
    short = short_of_memory(need, "the memory plan's update (trainer, engine share, reserve)")
    return [short] if short else []


def plan_params(cfg, given=None):
    """(the trainer's parameters, where they come from) for --plan: `given` ("8b": QWEN3's;
    "8.19e9"), else init_from's safetensors headers, else the Qwen3 size init_from's path names
    (twice: separate policies)."""
    models = len(rundir.cold_start_dirs(cfg.init_from, cfg.policy != "shared"))
    if given:
        size = given.lower()
        if size in QWEN3:
            return models * qwen3_params(size), f"Qwen3-{size.upper()}'s, --params"
        try:
            return models * float(given), "--params"
        except ValueError:
            raise ValueError(f"--params={given}: one of {', '.join(QWEN3)} or a count") from None
    if init_params(cfg) > 0:
        return init_params(cfg), f"init_from {cfg.init_from}'s, its safetensors headers"
    size = qwen3_size(cfg.init_from)
    if size is None:
        raise ValueError(
            f"--plan: init_from={cfg.init_from!r} holds no *.safetensors and names no Qwen3 size "
            f"({', '.join(QWEN3)}): give --params=8b or --params=8.19e9"
        )
    where = f"Qwen3-{size.upper()}'s, plans.QWEN3: init_from {cfg.init_from} is not there yet"
    return models * qwen3_params(size), where


def plan_report(cfg, world, given=None):
    """A GPU rank's memory plan per rank count in `world`, with and without offload_idle_state,
    each "fits" or "does not fit" with the fix (`train.py PRESET --plan`: settings.plan_report reads
    its flags). Loads no model, checks no data or model folder (init_from may not be there yet)."""
    if memory_plan(cfg, 1, 0.0) is None:
        return (
            "train.py --plan: no memory plan: this config runs on a CPU (device cpu, or no "
            "engine share: engine_kwargs' gpu_memory_utilization)"
        )
    params, where = plan_params(cfg, given)
    p = memory_plan(cfg, 1, params)
    gpu = "this GPU's" if gpu_gib() else "an H200's: no GPU here"
    lines = [
        f"train.py --plan: {params:.3g} parameters ({where}); policy {cfg.policy}, mode "
        f"{cfg.mode}: {p['states'][0]} AdamW state(s) a rank once every role has stepped",
        f"a rank's GPU: {p['gpu']:.1f} GiB ({gpu}); the engine's share "
        f"{cfg.engine_kwargs['gpu_memory_utilization']} x {p['gpu']:.1f} = {p['engine']:.1f} GiB "
        f"(its bf16 weights {p['engine_weights']:.1f}); reserve {p['reserve']:g} GiB",
        "update = weights + gradients + Adam on the GPU + the engine's share (asleep: the "
        "activations' room) + reserve; wake = the same without the gradients, the engine awake",
        rl_disk_line(cfg, params),
    ]
    offloads = [cfg.offload_idle_state]
    offload = dataclasses.replace(cfg, offload_idle_state=not cfg.offload_idle_state)
    if adam_states(offload) != adam_states(cfg):
        offloads.append(not cfg.offload_idle_state)
    else:
        lines.append(f"(offload_idle_state moves nothing in mode {cfg.mode}: no role is idle)")
    head = ("ranks", "weights", "grads", "Adam GPU", "Adam host", "update", "wake")
    for on in sorted(offloads, reverse=True):
        c = dataclasses.replace(cfg, offload_idle_state=on)
        mine = " (this config)" if on == cfg.offload_idle_state else ""
        lines += ["", f"offload_idle_state={on}{mine}, GiB a rank:"]
        lines.append("  ".join(f"{h:>9}" for h in head) + "  verdict")
        for w in world:
            q = memory_plan(c, w, params)
            row = [f"{w:>9}"] + [f"{q[k]:9.1f}" for k in ("weights", "grads", "adam", "host")]
            row += [f"{q['update']:9.1f}", f"{q['wake']:9.1f}"]
            verdict = (plan_problems(c, w, params) or ["fits"])[0]  # validate's verdict
            if not fits(c, w, params):  # in the table: the fix, not the arithmetic again
                verdict = f"does not fit: {plan_fix(c, w, params)}"
            if cfg.batch_size % w:
                verdict += f"; batch_size: {batch_fix('--batch_size', cfg.batch_size, w)}"
            lines.append("  ".join(row) + "  " + verdict)
    return "\n".join(lines)


def batch_fix(key, value, world):
    """What to set when `key`=value does not divide by the ranks: the nearest multiples of the
    rank count, or the rank counts that divide it."""
    near = [m for m in (value // world * world, (value // world + 1) * world) if m > 0]
    near = " or ".join(f"{key}={m} ({m // world} a rank)" for m in sorted(near, reverse=True))
    counts = [str(w) for w in range(1, value + 1) if value % w == 0]
    return f"set {near}, or run on {', '.join(counts)} ranks"


# --------------------------------------------------------------------------------------------------
# SFT's memory plan (sft.py, checked before any model loads): no engine, activations instead
SFT_CHUNK = 1024  # logprob_rows.CHUNK: tokens whose full-vocabulary logits are alive at once


def model_shape(path):
    """(parameters, shape) of a model: a folder's config.json and *.safetensors headers (nothing is
    loaded), or, for a hub id or a folder not there yet, the Qwen3 size its name says (QWEN3);
    (0, None) when neither tells. shape: hidden_size, num_hidden_layers, intermediate_size,
    vocab_size, tie_word_embeddings, max_position_embeddings."""
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
    keys += ("tie_word_embeddings",)
    config = os.path.join(str(path), "config.json")
    if os.path.isfile(config):
        with open(config) as f:
            raw = json.load(f)
        shape = {k: raw.get(k, False) for k in keys}
        shape["max_position_embeddings"] = raw.get("max_position_embeddings", 40960)
        return stored_params(path), shape
    size = qwen3_size(path)
    if size is None:
        return 0, None
    shape = {k: QWEN3[size][k] for k in keys}
    return qwen3_params(size), {**shape, "max_position_embeddings": 40960}


def sft_plan(shape, params, world, micro_tokens, checkpointing, batch_size=8):
    """A GPU rank's SFT memory in GiB (FSDP2 over `world` ranks; one process: unsharded):

    states      = 16 B x params / world      fp32 weights, gradients (kept over the
                                             micro-batches), AdamW's two moments (Muon keeps
                                             less: an upper bound)
    activations = T x per token, T = micro_tokens (a micro-batch's padded tokens; 0: the batch
                  whole, batch_size x the model's context): checkpointing full keeps each
                  decoder layer's bf16 input (2 B x hidden x layers) and one layer's
                  intermediates, recomputed in its backward (2 B x (10 hidden + 4
                  intermediate)); off keeps every layer's (x layers: ~6 MB a token at 8B)
    head        = logprob_rows.py's fp32 logits of a chunk (3 x 1024 x vocab x 4 B) and the lm
                  head's fp32 gradient accumulator (vocab x hidden x 4 B)
    bf16        = the bf16 weights computed with: one process, autocast's copy of them all
                  (2 B x params, kept for the backward); FSDP2, the root's gathered embeddings
                  (and untied head) and two layers' (one prefetched)
    total       = states + activations + head + bf16 + RESERVE_GIB <= the GPU's memory"""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    layer = 2 * (10 * h + 4 * shape["intermediate_size"])  # one layer's intermediates a token
    per_token = layers * 2 * h + layer if checkpointing == "full" else layers * layer
    tokens = micro_tokens or batch_size * shape["max_position_embeddings"]
    vocab = shape["vocab_size"]
    embeddings = vocab * h * (1 if shape["tie_word_embeddings"] else 2)
    gathered = embeddings + 2 * (params - embeddings) / layers  # FSDP2: the root, two layers
    p = {
        "states": 16 * params / world / GIB,
        "per_token": per_token,
        "tokens": tokens,
        "activations": tokens * per_token / GIB,
        "head": (3 * SFT_CHUNK * vocab * 4 + vocab * h * 4) / GIB,
        "bf16": 2 * (params if world == 1 else gathered) / GIB,
        "reserve": RESERVE_GIB,
        "gpu": gpu_gib() or H200_GIB,
    }
    p["total"] = p["states"] + p["activations"] + p["head"] + p["bf16"] + p["reserve"]
    return p


def sft_plan_line(shape, params, world, micro_tokens, checkpointing, batch_size=8):
    """SFT's plan in a line (sft.py's refusal and --plan)."""
    p = sft_plan(shape, params, world, micro_tokens, checkpointing, batch_size)
    what = "a micro-batch" if micro_tokens else "the batch whole (batch_size x context)"
    return (
        f"16 B x {params:.3g} params / {world} rank(s) = {p['states']:.1f} GiB (fp32 weights, "
        f"gradients, AdamW's two moments) + {p['tokens']} tokens, {what}, x "
        f"{p['per_token'] / 2**10:.0f} KiB (checkpointing {checkpointing}) = "
        f"{p['activations']:.1f} GiB + the lm head's chunk {p['head']:.1f} GiB + bf16 weights "
        f"{p['bf16']:.1f} GiB + {p['reserve']:g} GiB reserve = {p['total']:.1f} GiB of "
        f"{p['gpu']:g} GiB"
    )


def sft_fits(shape, params, world, batch_size, micro_tokens, checkpointing):
    p = sft_plan(shape, params, world, micro_tokens, checkpointing, batch_size)
    return p["total"] <= p["gpu"]


def sft_plan_problems(shape, params, world, micro_tokens, checkpointing, batch_size=8):
    """[] when SFT's plan fits a GPU rank, else its arithmetic and the fix: the largest
    --micro_tokens that fits, checkpointing, the fewest ranks."""
    args = (shape, params, world, micro_tokens, checkpointing, batch_size)
    p = sft_plan(*args)
    if p["total"] <= p["gpu"]:
        return []
    fixes, room = [], p["gpu"] - p["states"] - p["head"] - p["bf16"] - p["reserve"]
    if room * GIB >= SFT_CHUNK * p["per_token"]:  # at least a chunk's tokens
        fixes.append(f"--micro_tokens <= {int(room * GIB // p['per_token'])}")
    full = sft_plan(shape, params, world, micro_tokens or 16384, "full", batch_size)
    if checkpointing != "full" and full["total"] <= full["gpu"]:
        fixes.append(f"--checkpointing full with --micro_tokens {full['tokens']}")
    # the fewest ranks: as set, else (no other fix) with checkpointing and 16384 tokens
    for kw in ({}, {"micro_tokens": 16384, "checkpointing": "full"}):
        if kw and fixes:
            break
        arg = {"micro_tokens": micro_tokens, "checkpointing": checkpointing, **kw}
        more = [w for w in range(world + 1, 65) if sft_fits(shape, params, w, batch_size, **arg)]
        if more:
            how = " with --checkpointing full --micro_tokens 16384" if kw else ""
            fixes.append(f"at least {more[0]} ranks{how}")
            break
    fix = ", or ".join(fixes) or "no fix within 64 ranks"
    return [f"the SFT memory plan does not fit: {sft_plan_line(*args)} ({fix})"]


def short_of_memory(need_gib, what):
    """None when this rank's GPU (cuda:LOCAL_RANK) has `need_gib` GiB free, or when there is no
    GPU; else a line saying how much is free (torch.cuda.mem_get_info: what other processes hold
    counts, a teacher's `vllm serve` first) against what `what` needs. Asked before this process
    puts anything on the GPU (train.py's validate, sft.py's start)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    free, total = (x / GIB for x in torch.cuda.mem_get_info(local))
    if free >= need_gib:
        return None
    return (
        f"GPU {local} has {free:.1f} GiB free of {total:.1f} GiB; {what} needs {need_gib:.1f} "
        f"GiB: {total - free:.1f} GiB are held by other processes (nvidia-smi lists them; a "
        "teacher's vllm serve? stop it first)"
    )


def gpu_gib():
    """This machine's first GPU's memory in GiB (0: none, or no torch to ask)."""
    try:
        import torch
    except ImportError:
        return 0.0
    if not torch.cuda.is_available():
        return 0.0
    return torch.cuda.get_device_properties(0).total_memory / GIB


def stored_params(path):
    """The parameters a model folder's *.safetensors files hold (their headers alone: nothing is
    loaded); 0 without such files."""
    total = 0
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(path, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for key, t in header.items():
            if key != "__metadata__":
                total += math.prod(t["shape"])
    return total


def sft_report(model, hp, ranks):
    """`sft.py --plan`: a GPU rank's SFT memory plan (sft_plan) of `model` at each rank count in
    `ranks` ("1,2,8"), "fits" or "does not fit" with the fix; loads nothing (the parameters from
    the folder's safetensors headers, or Qwen3's by the size its name says). hp: sft.py's
    batch_size, micro_tokens and checkpointing."""
    params, shape = model_shape(model) if model else (0, None)
    if shape is None:
        return f"sft.py --plan: no plan for {model or 'the tiny model'} (a CPU run, or no shape)"
    lines = [
        f"sft.py --plan: {model}, {params:.3g} parameters; batch_size {hp['batch_size']} (a "
        f"step, over the ranks), micro_tokens {hp['micro_tokens']}, checkpointing "
        f"{hp['checkpointing']}",
        sft_disk_line(model, params),
    ]
    for w in map(int, ranks.split(",")):
        share = -(-hp["batch_size"] // w)  # a rank's samples a step
        plan = (shape, params, w, hp["micro_tokens"], hp["checkpointing"], share)
        problems = sft_plan_problems(*plan)
        verdict = "does not fit: " + problems[0].split(" GiB (")[-1][:-1] if problems else "fits"
        lines.append(f"{w} rank(s): {sft_plan_line(*plan)}: {verdict}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Disk: what a run writes (the module docstring's arithmetic)


def checkpoint_bytes(cfg, params, states=None):
    """Bytes of one train.py checkpoint (rundir.save_checkpoint) of a trainer of `params`
    parameters (both models' with separate policies): its HF folders (bf16 on a GPU, fp32 on a
    CPU), state/'s fp32 master weights and the two fp32 moments of each Adam state saved
    (`states`: those that have stepped; default every one a rank holds once each role has,
    adam_states). Tokenizer and config files (a few MB) are left out. The check before a save
    asks for this much free."""
    models = 1 if cfg.policy == "shared" else 2
    held = adam_states(cfg)[0] if states is None else states
    weights = (4 if cfg.device == "cpu" else 2) * params
    return weights + 4 * params + 8 * params / models * held


def checkpoints_on_disk(cfg):
    """(the most step_N folders on disk at once, the step of the save that makes them): saves
    every save_every steps and at the last, each written whole before rundir.stale's are removed
    (the `keep` newest, every val_every-th)."""
    keep = newest_kept()
    saves = sorted({*range(cfg.save_every, cfg.steps + 1, cfg.save_every), cfg.steps})
    names, most = [], (0, 0)
    for step in saves:
        names.append(f"step_{step:06d}")
        most = max(most, (len(names), step))
        gone = rundir.stale(names, keep, cfg.val_every)
        names = [n for n in names if n not in gone]
    return most


def newest_kept():
    """The newest checkpoints a save keeps (rundir.save_checkpoint's `keep`: train.py's)."""
    return inspect.signature(rundir.save_checkpoint).parameters["keep"].default


def rl_disk(cfg, params):
    """{checkpoint, count, step, total}: an RL run's checkpoints, bytes (checkpoint_bytes x
    checkpoints_on_disk)."""
    count, step = checkpoints_on_disk(cfg)
    one = checkpoint_bytes(cfg, params)
    return {"checkpoint": one, "count": count, "step": step, "total": one * count}


def rl_disk_line(cfg, params):
    """The RL run's disk in a line (`train.py --plan`)."""
    d, held = rl_disk(cfg, params), adam_states(cfg)[0]
    weights = "4 B fp32 weights" if cfg.device == "cpu" else "2 B bf16 weights"
    models = 1 if cfg.policy == "shared" else 2
    curve = f", every {cfg.val_every}th" if cfg.val_every > 0 else ""
    return (
        f"disk ({cfg.out_dir}): a checkpoint ({weights} + 4 B fp32 masters + {held} Adam "
        f"state(s) x {8 / models:g} B) x {params:.3g} params = {d['checkpoint'] / GB:.1f} GB; "
        f"at most {d['count']} on disk at once (the {newest_kept()} newest{curve}, the one being "
        f"written; at step {d['step']}): {d['total'] / GB:.0f} GB"
    )


def sft_disk(model, params):
    """{output, checkpoints, hub, total}: bytes an SFT run of `params` parameters writes (its
    output in fp32, two checkpoints of --save_every at once) and downloads (`model`, a hub id: its
    bf16 safetensors in the hub cache; a local folder: nothing)."""
    d = {
        "output": 4 * params,
        "checkpoints": 2 * SFT_CHECKPOINT_B * params,
        "hub": 0 if os.path.isdir(str(model)) else 2 * params,
    }
    d["total"] = sum(d.values())
    return d


def sft_disk_line(model, params):
    """SFT's disk in a line (`sft.py --plan`)."""
    d = sft_disk(model, params)
    hub = f"; {model}'s download {d['hub'] / GB:.1f} GB (bf16) in the hub cache" if d["hub"] else ""
    return (
        f"disk: the output 4 B x {params:.3g} = {d['output'] / GB:.1f} GB (fp32); with "
        f"--save_every two checkpoints at once ({SFT_CHECKPOINT_B} B a parameter: model/ and "
        f"state/) {d['checkpoints'] / GB:.0f} GB{hub}: {d['total'] / GB:.0f} GB"
    )
