"""train.py: MetaAgent-X reinforcement learning, end to end, in one readable loop.

Each step (the paper's Algorithm 1, with stagewise co-evolution):

    1. sample B queries from the training mix                    (machinery/data.py, world/tiny.py)
    2. bi-level rollout: M scripts per query, N executions per script,
       R[q, i, j] = correct + lambda * format                            (rollout.py: R [B, M, N])
    3. advantages A_D[q, i] = norm_i(mean_j R[q, i, :]), A_E[q, i, j] = norm_ij(R[q])
       (A_E over the runs that happened: a script that did not parse has none)    (advantage.py)
    4. the active role at step t, one per stage of K steps; the other's samples are dropped
                                                                                  (stagewise.py)
    5. the "old" log-probs: on-policy (one optimizer step a rollout) the training forward's own,
       detached (rho = 1); with several minibatches (the authors' setting; the paper does not say)
       the trainer's, before the first update, so that the clip acts on the later minibatches
    6. the clipped GRPO update, one token-mean per role                                (grpo.py)
          L = sum_{designer tokens} l_t / N_D  +  sum_{executor tokens} l_t / N_E
       N_role is the role's token count over all ranks, so that micro-batches and ranks add up
       exactly and a few hundred designer tokens are not drowned by thousands of executor tokens.
       A sample with A = 0 has l_t = 0 and no gradient: it is not forwarded, but its tokens count
    7. the optimizer step, with the Adam state of the role being trained (one AdamW state per role
       over the shared weights); the new weights gathered (FSDP2: each full tensor) into the engine
    8. the step's tree (rollouts.jsonl: `python tools/show.py out_dir` draws it) and its
       metrics.jsonl line, then a checkpoint every `save_every` steps (HF folders + a
       torch.distributed.checkpoint folder of the master weights, Adam states and trainer state,
       an atomic rename: machinery/rundir.py): a step's lines are on disk before its checkpoint, so
       no kill loses them

Run it:

    python train.py                                 # the tiny default on CPU: the SFT cold start
                                                    # if out/tiny-sft/ is missing, RL, a table
    python train.py config/qwen3_8b.py --M=8 --N=1  # a preset, with command-line overrides
    python train.py config/tiny.py --resume         # continue from the last checkpoint in out_dir
    python train.py config/tiny.py --overwrite      # start over in an out_dir that holds a run
                                                    # (a fresh run refuses it: it would destroy it)
    python train.py --logprobs=plain --backend=hf   # the tiny default on the plain path read here
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py      # 8 GPUs: FSDP2, an engine a rank
    torchrun --nproc_per_node=2 train.py config/tiny.py --backend=hf  # CPU: gloo, two ranks

What runs is what you read here, except where a preset switches on a speed-up proven equal to it,
named at its one dispatch point with the test that proves it: the tiny preset's logprobs="shared"
(each prompt forwarded once: machinery/shared_prompts.py; batches() below) and backend="lean"
(machinery/decode.py's written-out sampling loop; engine.make_engine, which start() calls).
The tiny preset takes both for the main job's time (measured: docs/NOTES.md, issue #44);
`--logprobs=plain --backend=hf` runs the plain path: grpo.token_logprobs and engine.HFEngine.

settings.Config holds every setting (the paper's values marked); a config file assigns some of its
names, `--name=value` (or `--name value`) overrides anything, `--help` lists every setting, and bad
settings stop the run before any model loads (settings.validate). Distributed: each rank rolls out
its share of the B queries with its own engine, the trainer is FSDP2 (gloo on CPU, NCCL + bf16 on
GPU), and every rank gathers the full weights into its engine after each update. Separate policies:
two models, one optimizer each; the one engine holds whichever role is generating (each role's view
of it: machinery/weights.py). The step's records (its tree, its metrics line, its times) are
machinery/recorder.py's. The tiny default ends with a table on held-out
tasks (world/final_table.py): RL against SFT, sampled, exact.

Needs: advantage.py, grpo.py, machinery/chunked.py, machinery/data.py, machinery/engine.py,
machinery/ranks.py, machinery/cpu_bits.py, machinery/recorder.py, machinery/rundir.py,
machinery/shared_prompts.py,
machinery/speed.py, machinery/weights.py, rollout.py, settings.py, stagewise.py,
world/final_table.py, world/heldout.py, world/tiny.py, evaluate.py, machinery/decode.py,
machinery/isolation.py, machinery/confine.py, machinery/loggers.py, machinery/offload.py,
machinery/provenance.py, machinery/reload_check.py, mas.py, reward.py, sandbox.py,
machinery/plans.py, machinery/programs.py, machinery/grader.py, machinery/results.py"""

import functools
import os
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

import advantage
import grpo
import rollout as rollout_lib
import settings
import stagewise
from machinery import chunked, data, offload, ranks, recorder, rundir, shared_prompts, speed
from machinery import engine as engine_lib
from machinery.cpu_bits import restart_pinned
from machinery.rundir import full_disk_exits
from machinery.weights import EngineWeights
from world import final_table, heldout, tiny

# --------------------------------------------------------------------------------------------------
# data: a weighted mix of task lists, sampled without replacement within each source's epoch


def load_mix(cfg):
    sources = []
    for src in cfg.data_mix:
        # "tiny", "tiny:math", "tiny:code": the tasks of the "rl" split, which SFT never showed
        if src in settings.TINY_SOURCES:
            kinds = settings.TINY_SOURCES[src]
            tasks = tiny.make_tasks(2000, seed=cfg.seed, kinds=kinds, split="rl")
        else:
            tasks = data.load_tasks(src)
        if not tasks:
            raise settings.ConfigError(f"data source {src!r} has no tasks")
        sources.append(tasks)
    return sources


# --------------------------------------------------------------------------------------------------
# the policies: {name: {name, model, opt: {state: AdamW}}}: "model", or "designer" and "executor"


def load_model(path, cfg, device):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    # fp32 master weights; checkpointing and compile per decoder layer, then FSDP2 (each layer, then
    # the root); bf16 compute on a GPU
    return speed.prepare(
        model.to(device),
        checkpointing=cfg.ac_policy,
        compile=cfg.compile_layers,
        shard=dist.get_world_size() > 1 or device.type == "cuda",
        bf16=device.type == "cuda",
    )


def opt_state(cfg, role):
    """The AdamW state a role's steps use: a shared policy keeps one per role, so each role's
    moments see only its own gradients and the frozen role's state waits for its next stage; coupled
    mode steps both in one."""
    return "both" if cfg.policy == "shared" and cfg.mode == "coupled" else role


def make_policies(cfg, ckpt, ts, device):
    """The policies, and policy_of[role]: the policy that plays each role."""
    policies = {}  # each from its cold start, or from the checkpoint's folder of its name
    for n, path in settings.model_dirs(cfg).items():
        path = os.path.join(ckpt, n) if ckpt else path
        policies[n] = {"name": n, "model": load_model(path, cfg, device), "opt": {}}
    shared = cfg.policy == "shared"
    policy_of = {r: policies["model" if shared else r] for r in ("designer", "executor")}
    for r, pol in policy_of.items():
        lr = {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[r]
        adam = torch.optim.AdamW(pol["model"].parameters(), lr=lr, weight_decay=cfg.weight_decay)
        pol["opt"].setdefault(opt_state(cfg, r), adam)
    if ts is not None:
        rundir.restore(policies, ckpt, ts)  # fp32 master weights and Adam states, every rank
        idle_to_host(cfg, policy_of, ts["step"])  # as the run left them, before the engine starts
    return policies, policy_of


def idle_to_host(cfg, policy_of, step):
    """The stage switch at step t: the Adam state of a role idle at t waits in host memory, an
    active role's is back on its device (machinery/offload.py; offload_idle_state off: nothing
    moves, both stay)."""
    if cfg.offload_idle_state:
        active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        offload.switch({r: pol["opt"][opt_state(cfg, r)] for r, pol in policy_of.items()}, active)


# --------------------------------------------------------------------------------------------------
# the update


def batches(cfg, samples, idx, values, pad_id, device):
    """The samples idx as micro-batches: each the model's inputs, `mask` (the trained tokens),
    values[name][k] (sample k's per-token vectors) laid out like it, `order` (its samples, in the
    mask's token order) and `forward` (how its log-probs are computed). The same number on every
    rank, at least one (FSDP's forwards are collective, and a step that forwards nothing still
    steps Adam, on zero gradients, as forwarding samples of A = 0 would): fillers of padding.

    The one dispatch point of Config.logprobs: "plain", the reference, one sample a row and
    grpo.token_logprobs; "chunked" (the Qwen3 presets) the lm head a chunk at a time, never the full
    logits in fp32, equal by tests/test_chunked.py::test_token_logprobs_matches_naive; "shared" (the
    tiny preset) each prompt forwarded once for its samples (machinery/shared_prompts.py: block
    masks, restarted positions), equal by tests/test_shared_prompts.py::
    test_shared_prompts_match_unshared and, run for run, tests/test_train.py::
    test_shared_rows_run_equals_plain."""
    rows = chunked.token_logprobs if cfg.logprobs == "chunked" else grpo.token_logprobs
    if cfg.logprobs == "shared":
        bs = shared_prompts.batches(samples, idx, values, pad_id, cfg.micro_batch)
        bs = [dict(b, forward=shared_prompts.logprobs) for b in bs]
    else:  # one sample a row, similar lengths together
        lengths = {k: len(samples[k].prompt_ids) + len(samples[k].completion_ids) for k in idx}
        idx = sorted(idx, key=lambda k: (lengths[k], k))
        size = cfg.micro_batch
        bs = [
            pack(samples, idx[i : i + size], values, pad_id, rows) for i in range(0, len(idx), size)
        ]
    n = int(ranks.all_sum([max(len(bs), 1)], device, dist.ReduceOp.MAX)[0])
    filler = rollout_lib.Sample([pad_id], [pad_id], [0.0], ())
    bs += [pack([filler], [], values, pad_id, rows)] * (n - len(bs))
    return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in bs]


def pack(samples, order, values, pad_id, rows):
    """One sample a row (rollout.samples_to_tensors), values laid out [S, T-1], log-probs by
    rows(model, input_ids, attention_mask); no order: filler."""
    b = rollout_lib.samples_to_tensors([samples[k] for k in order] if order else samples, pad_id)
    mask = b["completion_mask"] * bool(order)  # a filler trains nothing
    out = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], mask=mask, order=order)
    out["forward"] = functools.partial(row_logprobs, rows)
    for name, v in values.items():
        out[name] = None if v is None else laid_out(v, order, mask)
    return out


def laid_out(v, order, mask):
    """The vectors v[k] of the samples in `order`, each on its sample's trained positions."""
    if not order:
        return torch.zeros(mask.shape)
    return torch.zeros(mask.shape).masked_scatter(mask.bool(), torch.cat([v[k] for k in order]))


def row_logprobs(rows, model, b):
    return rows(model, b["input_ids"], b["attention_mask"])


@torch.no_grad()
def old_logprobs(cfg, model, samples, idx, pad_id, device):
    """log pi_old of each trained token of the samples idx, by the trainer before the update:
    {k: [L_k]}."""
    old = {}
    model.eval()
    for b in batches(cfg, samples, idx, {}, pad_id, device):
        lp = b["forward"](model, b)[b["mask"].bool()].cpu()  # log pi, laid out like the mask
        lengths = [len(samples[k].completion_ids) for k in b["order"]]
        old.update(zip(b["order"], lp.split(lengths), strict=True))
    # FSDP2 keeps the root's weights gathered after a forward without grad; the update's backward
    # would then reduce those gradients wrongly
    if hasattr(model, "reshard"):
        model.reshard()
    model.train()
    return old


def token_values(cfg, model, samples, A, pad_id, device):
    """The per-token vectors of the samples that are forwarded (A != 0): A[k] on each completion
    token of sample k, the engine's log-probs, and log pi_old: on-policy (one minibatch) None, the
    training forward's own, detached (grpo_loss's None: rho = 1); with several minibatches the
    trainer's before the update."""
    live = [k for k in range(len(samples)) if A[k] != 0 or cfg.forward_zero_adv]
    old = old_logprobs(cfg, model, samples, live, pad_id, device) if cfg.minibatches > 1 else None
    return {
        "adv": {k: A[k].expand(len(samples[k].completion_ids)) for k in live},
        "engine": {k: torch.tensor(samples[k].logprobs) for k in live},
        "old": old,
    }


def update(cfg, step, roles, policy_of, pad_id, device, world):
    """roles[role] = (samples, A [S]): cfg.minibatches optimizer steps over the role's samples.
    Returns the stats: per role the loss, clip fraction, ratio and engine/trainer log-prob gap
    (means over the forwarded tokens) and the forwarded tokens; per policy the grad norm; the lr."""
    stats, acc, gap_max = {"lr": 0.0}, Counter(), Counter()
    pols = list({id(policy_of[r]): policy_of[r] for r in roles}.values())
    values = {}
    for role, (samples, A) in roles.items():
        values[role] = token_values(cfg, policy_of[role]["model"], samples, A, pad_id, device)
    for mb in range(cfg.minibatches):
        for pol in pols:  # through the optimizers, which hold the parameters FSDP2 steps (below)
            clear_grads(pol)
        for role, (samples, A) in roles.items():
            order = np.random.default_rng([cfg.seed, step]).permutation(len(samples))
            part = [int(k) for k in np.array_split(order, cfg.minibatches)[mb]]
            n_role = ranks.all_sum([sum(len(samples[k].completion_ids) for k in part)], device)[0]
            if n_role == 0:
                continue
            # a sample with A = 0 has l_t = 0 and no gradient: not forwarded (it counts in N_role)
            live = [k for k in part if A[k] != 0 or cfg.forward_zero_adv]
            for b in batches(cfg, samples, live, values[role], pad_id, device):
                # log pi_theta, laid out like b["mask"], as batches() chose (its dispatch point)
                lp = b["forward"](policy_of[role]["model"], b)
                # l_t = -min(rho A, clip(rho) A), summed / N_role (FSDP averages ranks' gradients)
                n = n_role / world
                loss, st = grpo.grpo_loss(
                    lp, b["old"], b["adv"], b["mask"], n, b["engine"], clip_eps=cfg.clip_eps
                )
                loss.backward()
                acc[f"{role}/loss"] += loss.item() / world / cfg.minibatches
                acc[f"{role}/tokens"] += st["tokens"]
                for k in ("clip_frac", "ratio_mean", "logprob_gap"):
                    acc[f"{role}/{k}"] += st[k] * st["tokens"]
                gap_max[role] = max(gap_max[role], st["logprob_gap_max"])
        for pol in pols:  # the step of the Adam state of the role this step trains
            optimizer_step(cfg, step, pol, [r for r in roles if policy_of[r] is pol], stats)
    stats.update(recorder.role_stats(roles, acc, gap_max, device))
    return stats


def clear_grads(pol):
    """The policy's gradients freed, through its optimizers: they hold the parameters each step
    updates (FSDP2: the shards). model.zero_grad would clear the module's parameters instead, which
    after a forward without grad are the root's gathered copies, and leave the shards' last
    gradients for the next backward to add to (tests/test_first_gpu_run.py: the grad norm with and
    without such a forward, at 1 and 2 ranks)."""
    for opt in pol["opt"].values():
        opt.zero_grad(set_to_none=True)


def optimizer_step(cfg, step, pol, mine, stats):
    """One optimizer step of the policy pol, whose gradient is of the roles `mine`: clipped to norm
    grad_clip, with the Adam state of those roles (opt_state) at their lr times lr_factor; its norm
    into stats (per policy and per roles, a mean over the minibatches), and the lr. Nothing
    forwarded on any rank: no step.

    Under FSDP2 (every GPU run) the gradients are freed right after the step, and torch's cache of
    them and of the activations emptied: the engine wakes into that memory for the rollout (vLLM
    maps its own, outside torch's allocator; plans.memory_plan's wake), and no shard keeps a
    gradient for the next step.
    One process on a CPU frees them at the next update's start, as before: freeing them earlier
    moves the heap, and the tiny run's numbers with it, in their last bits (docs/NOTES.md, #46)."""
    opt = pol["opt"][opt_state(cfg, mine[0])]
    params = sum((group["params"] for group in opt.param_groups), [])  # what opt.step updates
    if not any(p.grad is not None for p in params):
        return
    gn = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)  # every rank's
    # per policy and per roles: one key when they coincide, in this order (a set's order varies)
    for key in dict.fromkeys([f"{pol['name']}/grad_norm", f"{'+'.join(mine)}/grad_norm"]):
        stats[key] = stats.get(key, 0.0) + gn / cfg.minibatches
    lr = {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[mine[0]]
    for group in opt.param_groups:
        group["lr"] = lr * lr_factor(cfg, step)
    opt.step()
    if isinstance(params[0], DTensor):
        clear_grads(pol)
        torch.cuda.empty_cache()  # theirs and the activations' memory, cached by torch, freed
    stats["lr"] = opt.param_groups[0]["lr"]


def lr_factor(cfg, step):
    """The lr's multiplier at step t (Config.lr_schedule): constant 1, or warmup_cosine [authors]
    (settings.warmup_cosine: lr_warmup steps, then down to lr_floor at the last step). Set from t
    itself rather than by torch's LambdaLR, which counts its own steps: a resume needs no scheduler
    state, and a frozen role's lr follows the run's clock, not its own updates."""
    if cfg.lr_schedule == "constant":
        return 1.0
    return settings.warmup_cosine(step, cfg.lr_warmup, cfg.steps - 1, cfg.lr_floor)


# --------------------------------------------------------------------------------------------------
# the loop


def rl_step(run, step):
    """One RL step: the README's loop, a line each."""
    cfg = run.cfg
    # 4. the active role, known first (an Executor-only step may take more queries); the idle role's
    # Adam state in host memory meanwhile
    active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
    idle_to_host(cfg, run.policy_of, step)
    run.rec.begin(step, active)
    # 1. queries: the same global batch on every rank, each rank takes its share
    b = settings.step_batch(cfg, active) // run.world
    queries = data.sample_queries(run.sources, run.mix, step, b * run.world, cfg.seed, run.pos)
    mine = queries[run.rank * b : (run.rank + 1) * b]
    # 2. rollout: M x N, R [b, M, N]; each role's view of the engine holds its weights
    designer, executor = run.weights.view("designer"), run.weights.view("executor")
    batch = rollout_lib.rollout(
        mine, designer, executor, step=step, q_offset=run.rank * b, **run.kw
    )
    run.weights.sleep()  # vLLM on a GPU frees its memory while the trainer runs
    # 3. advantages (the Executor's over the runs that happened)
    A_D = advantage.designer_advantages(batch.R)
    A_E = advantage.executor_advantages(batch.R, executed=batch.executed)
    # 4. the inactive role's samples are dropped here, never forwarded
    roles = {}
    if "designer" in active:
        roles["designer"] = (batch.designer, advantage.per_sample(batch.designer, A_D))
    if "executor" in active:
        roles["executor"] = (batch.executor, advantage.per_sample(batch.executor, A_E))
    # 5-7. old log-probs, the GRPO update, the optimizer step; the new weights into the engine
    with run.rec.timed("update"):
        stats = update(cfg, step, roles, run.policy_of, run.pad_id, run.device, run.world)
    run.weights.check_gap(stats, active, step)  # the engine sampled with the trainer's weights
    with run.rec.timed("weight_sync"):
        run.weights.sync(step, cfg.save_every)
    # 8. the step's tree and its metrics line, then a checkpoint: the lines are on disk first
    run.rec.tree(batch, mine, A_D, A_E)
    for curve in run.curves:  # the held-out curves, at their steps
        if curve.due(step + 1):
            with run.rec.timed(curve.timer):
                run.rec.add(curve(step + 1, run.weights, run.policy_of, run.tokenizer))
    run.rec.line(batch, mine, A_D, A_E, stats, run.weights.info)
    if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
        state = {"step": step + 1, "data_pos": run.pos}
        rundir.save_checkpoint(cfg, step + 1, run.policies, run.tokenizer, state, run.rank)


def main(argv):
    cfg, sources, ckpt, ts = configure(argv)
    if cfg is None:  # --plan: printed, nothing loaded
        return
    # a full disk ends the run in one line (no traceback); its last complete checkpoint stays
    with full_disk_exits("train.py", cfg.out_dir):
        run = start(cfg, argv, sources, ckpt, ts)
        for step in range(run.start, cfg.steps):
            rl_step(run, step)
        finish(run, argv)


def configure(argv):
    """(the Config, the data sources, the checkpoint to resume from and its trainer state): each
    checked before any model loads, a bad one a line and exit. `--plan`: the memory plan printed
    (settings.plan_report), and a Config of None."""
    try:
        if "--plan" in argv:  # a GPU rank's memory per rank count; loads nothing
            return print(settings.plan_report(argv)), None, None, None
        cfg = settings.parse_config(argv)
        if settings.is_tiny(cfg) and cfg.device != "cuda" and not torch.cuda.is_available():
            restart_pinned(__file__)  # the same bits on every x86 CPU: machinery/cpu_bits.py
        settings.validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
        sources = load_mix(cfg)  # a broken data file fails here, before any model loads
        ckpt, ts = rundir.latest(cfg.out_dir) if cfg.resume else (None, None)
    except (settings.ConfigError, OSError, ValueError) as e:
        sys.exit(f"train.py: {e}")
    return cfg, sources, ckpt, ts


def start(cfg, argv, sources, ckpt, ts):
    """The run set up: its folder and provenance, the tiny world's cold start where it is missing,
    the policies (resumed: the checkpoint's), the engine with the Designer's weights, the recorder,
    the held-out curves and their step-0 line. Returned as what the steps read: cfg, rank, world,
    device; policies, policy_of; eng, weights (in the engine: machinery/weights.py), tokenizer,
    pad_id; rec, curves; sources, mix (their weights), pos (their positions); kw (the rollout's
    settings); start (the first step)."""
    rank, world, device = ranks.setup(cfg.device)
    tiny_data = settings.is_tiny(cfg)
    # --overwrite deletes the run in out_dir; the tiny world makes its cold start when it is missing
    if rank == 0:
        rundir.prepare(cfg)
        rundir.provenance(cfg, argv)  # out_dir/run.json: commit, command, clock times, machine
        # missing, or stopped between a separate cold start's two roles: made (again)
        whole = rundir.cold_start_whole(cfg.init_from, separate=cfg.policy != "shared")
        if tiny_data and not cfg.resume and not whole:
            tiny.cold_start(cfg.init_from, cfg.seed, separate=cfg.policy == "separate")
    dist.barrier()
    # resume: the models come from the checkpoint's HF folders, their fp32 master weights and the
    # rest from its state/ folder
    try:
        policies, policy_of = make_policies(cfg, ckpt, ts, device)
    except rundir.RunFolderError as e:  # a checkpoint of another policy or mode
        sys.exit(f"train.py: {e}")
    name = next(iter(policies))  # the engine starts with the Designer's weights
    model_dir = os.path.join(ckpt, name) if ckpt else settings.model_dirs(cfg)[name]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # backend: engine.make_engine, its one dispatch point, names the tests that prove "lean" (the
    # tiny preset's) equal to the reference, "hf"
    eng = engine_lib.make_engine(
        model_dir, cfg.backend, chat_template_kwargs=cfg.chat_template_kwargs, **cfg.engine_kwargs
    )
    # the trainer's weights in the engine (which starts with the Designer's), each sync proven
    models = {role: pol["model"] for role, pol in policy_of.items()}
    weights = EngineWeights(eng, models, held="designer", device=device)
    weights.probe("at the engine's start")
    first, pos = (ts["step"], list(ts["data_pos"])) if ts else (0, [0] * len(sources))
    rundir.restore_rng(ts, cfg.seed, rank)
    rec = recorder.Recorder(
        cfg, rank, device, first, tiny_data
    )  # a resume drops later steps' lines
    run = SimpleNamespace(cfg=cfg, rank=rank, world=world, device=device, start=first)
    run.policies, run.policy_of, run.rec = policies, policy_of, rec
    run.eng, run.weights, run.tokenizer = eng, weights, tokenizer
    run.pad_id, run.kw = engine_lib.pad_id(tokenizer), rollout_settings(cfg, tiny_data)
    run.sources, run.mix, run.pos = sources, list(cfg.data_mix.values()), pos
    # the held-out curves (world/heldout.py): the tiny world's at each checkpoint, the benchmark's
    # every val_every steps; both at step 0 (the cold start), unless a resumed run has it
    run.curves = heldout.curves(cfg, world, rank, rec.kept, tiny_data)
    zero = {}  # the step-0 line
    for curve in run.curves:
        if first == 0 and not ranks.all_sum([curve.started], device, dist.ReduceOp.MAX)[0]:
            zero.update(curve(0, weights, policy_of, tokenizer))
    if zero:
        rec.write({"step": 0, **zero})
    return run


def rollout_settings(cfg, tiny_data):
    """The rollout's settings, the same at every step (rollout.rollout's keywords)."""
    return dict(
        M=cfg.M,
        N=cfg.N,
        seed=cfg.seed * 1000,
        template=cfg.template or None,
        designer_sampling=engine_lib.Sampling(
            temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.designer_max_tokens
        ),
        executor_sampling=engine_lib.Sampling(
            temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens
        ),
        short=tiny_data,
        lam=cfg.lam,
        format_reward=cfg.format_reward,
        **rollout_lib.config_kwargs(cfg),
    )


def finish(run, argv):
    """The tiny world's final table of the last checkpoint (world/final_table.py), the end in
    run.json, then every rank's teardown."""
    cfg = run.cfg
    run.rec.close()
    if cfg.eval_tasks > 0 and settings.is_tiny(cfg) and run.rank == 0:
        last = os.path.join(cfg.out_dir, rundir.checkpoints(cfg.out_dir)[-1])
        final_table.final_table(cfg, run.eng, last)
    if run.rank == 0:
        rundir.provenance(cfg, argv, end=True)
    # every rank done before any tears down: the engine (vLLM's groups, which it made from ours,
    # and with them ours), then our group, if the engine left it
    dist.barrier()
    run.eng.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
