"""train.py: MetaAgent-X reinforcement learning, end to end, in one readable loop (rl_step).

Each step (the paper's Algorithm 1, with stagewise co-evolution), a few lines of rl_step each:
    1. B queries from the training mix                                        (machinery/data.py)
    2. the bi-level rollout: M scripts a query, N runs a script, R[q, i, j] = correct + lam * format
    3. A_D[q, i] = norm_i(mean_j R[q, i, :]), A_E[q, i, j] = norm_ij(R[q])          (advantage.py)
    4. the active role, one per stage of K steps (stagewise.py); the other's samples are dropped
    5-7. update(): the clipped GRPO loss (grpo.py), its backward, clip and the role's AdamW step
    8. the step's tree and metrics line; every save_every steps a checkpoint (machinery/rundir.py)

    python train.py                                 # the tiny default on CPU: SFT, RL, a table
    python train.py config/qwen3_8b.py --M=8 --N=1  # a preset, with command-line overrides
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py  # 8 GPUs: FSDP2, an engine a rank

settings.Config holds every setting (`--help` lists them). The tiny preset takes two speed-ups
proven equal to the plain path read here: logprobs="shared" (rows_for) and backend="lean"
(engine.make_engine); `--logprobs=plain --backend=hf` runs the plain path.

Needs: advantage.py, evaluate.py, grpo.py, mas.py, reward.py, rollout.py, sandbox.py, settings.py,
stagewise.py, machinery/confine.py, machinery/cpu_bits.py, machinery/data.py, machinery/decode.py,
machinery/engine.py, machinery/grader.py, machinery/isolation.py, machinery/loggers.py,
machinery/logprob_rows.py, machinery/offload.py, machinery/plans.py, machinery/programs.py,
machinery/provenance.py, machinery/ranks.py, machinery/recorder.py, machinery/reload_check.py,
machinery/results.py, machinery/rundir.py, machinery/speed.py,
machinery/weights.py, world/final_table.py, world/heldout.py, world/tiny.py"""

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

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
from machinery import data, logprob_rows, offload, ranks, recorder, rundir, speed
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
    # the first step's idle role's Adam state in host memory, before the engine starts
    idle_to_host(cfg, policy_of, ts["step"] if ts else 0)
    return policies, policy_of


def idle_to_host(cfg, policy_of, step):
    """The stage switch at step t: the Adam state of a role idle at t waits in host memory, an
    active role's is back on its device (machinery/offload.py; offload_idle_state off: nothing
    moves, both stay)."""
    if cfg.offload_idle_state and step < cfg.steps:  # (after the last step: none to switch to)
        active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        offload.switch({r: pol["opt"][opt_state(cfg, r)] for r, pol in policy_of.items()}, active)


# --------------------------------------------------------------------------------------------------
# the update


def rows_for(cfg, pad_id):
    """How the update lays its samples out in rows and computes their log-probs (Config.logprobs),
    chosen once, at start(): batches(samples, idx, values), filler(values), logprobs(model, b)."""
    # The one dispatch point of Config.logprobs. "plain", the reference: one sample a row, log pi by
    # grpo.token_logprobs. The speed-ups, proven equal to it: "chunked" (the Qwen3 presets), the lm
    # head a chunk at a time, never the full logits in fp32 (tests/test_chunked.py::
    # test_token_logprobs_matches_naive); "shared" (the tiny preset), each prompt forwarded once for
    # its samples: block masks, restarted positions (machinery/logprob_rows.py;
    # tests/test_shared_prompts.py::test_shared_prompts_match_unshared and, run for run,
    # tests/test_train.py::test_shared_rows_run_equals_plain).
    if cfg.logprobs == "shared":
        return logprob_rows.SharedRows(pad_id, cfg.micro_batch)
    chunked = cfg.logprobs == "chunked"
    logprobs = logprob_rows.chunked_token_logprobs if chunked else grpo.token_logprobs
    return logprob_rows.Rows(logprobs, rollout_lib.samples_to_tensors, pad_id, cfg.micro_batch)


def micro_batches(rows, samples, idx, values, device):
    """The samples idx as `rows` lays them out, on device: the same number of micro-batches on every
    rank, at least one (FSDP's forwards are collective, and a step that forwards nothing still steps
    Adam, on zero gradients, as forwarding samples of A = 0 would): fillers, which train nothing."""
    bs = rows.batches(samples, idx, values)
    n = torch.tensor(max(len(bs), 1), device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)  # the most micro-batches of any rank
    bs += [rows.filler(values)] * (int(n) - len(bs))
    return [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in bs]


@torch.no_grad()
def old_logprobs(model, rows, samples, idx, device):
    """log pi_old of each trained token of the samples idx, by the trainer before the update:
    {k: [L_k]}."""
    old = {}
    model.eval()
    for b in micro_batches(rows, samples, idx, {}, device):
        lp = rows.logprobs(model, b)[b["mask"].bool()].cpu()  # in the batch's token order
        lengths = [len(samples[k].completion_ids) for k in b["order"]]
        old.update(zip(b["order"], lp.split(lengths), strict=True))
    # FSDP2 keeps the root's weights gathered after a forward without grad; the update's backward
    # would then reduce those gradients wrongly
    if hasattr(model, "reshard"):
        model.reshard()
    model.train()
    return old


def token_values(cfg, model, rows, samples, A, device):
    """The per-token vectors of the samples that are forwarded (A != 0): A[k] on each completion
    token of sample k, the engine's log-probs, and log pi_old: on-policy (one minibatch) None, the
    training forward's own, detached (grpo_loss's None: rho = 1); with several minibatches (the
    authors' setting; the paper does not say) the trainer's before the update, so that the clip acts
    on the later minibatches."""
    live = [k for k in range(len(samples)) if A[k] != 0 or cfg.forward_zero_adv]
    old = old_logprobs(model, rows, samples, live, device) if cfg.minibatches > 1 else None
    return {
        "adv": {k: A[k].expand(len(samples[k].completion_ids)) for k in live},
        "engine": {k: torch.tensor(samples[k].logprobs) for k in live},
        "old": old,
    }


def update(cfg, step, lr_scale, roles, policy_of, rows, device, world):
    """roles[role] = (samples, A [S]): cfg.minibatches optimizer steps over the roles' samples, laid
    out and scored as `rows` says (rows_for), at each role's lr times lr_scale (lr_factor). The loss
    is one token-mean per role,

        L = sum_{designer tokens} l_t / N_D  +  sum_{executor tokens} l_t / N_E

    N_role the role's tokens in the minibatch over all ranks, so that micro-batches and ranks add up
    exactly and a few hundred designer tokens are not drowned by thousands of executor tokens. A
    sample with A = 0 has l_t = 0 and no gradient: it is not forwarded, but its tokens count. Each
    Adam state (opt_state: a role's, or both roles' in coupled mode) steps once a minibatch. Returns
    the stats: per role the loss, clip fraction, ratio and engine/trainer log-prob gap (means over
    the forwarded tokens) and the forwarded tokens; per policy the grad norm; the lr."""
    stats, acc, gap_max = {"lr": 0.0}, Counter(), Counter()
    lrs = {"designer": cfg.designer_lr, "executor": cfg.executor_lr}
    values, parts, opts = {}, {}, {}  # per role; per Adam state: the roles whose gradient it steps
    for role, (samples, A) in roles.items():
        values[role] = token_values(cfg, policy_of[role]["model"], rows, samples, A, device)
        order = np.random.default_rng([cfg.seed, step]).permutation(len(samples))
        parts[role] = [[int(k) for k in part] for part in np.array_split(order, cfg.minibatches)]
        opts.setdefault(policy_of[role]["opt"][opt_state(cfg, role)], []).append(role)
    for mb in range(cfg.minibatches):
        for opt in opts:  # through the optimizers, which hold the parameters FSDP2 steps
            opt.zero_grad(set_to_none=True)
        for role, (samples, A) in roles.items():
            part, model = parts[role][mb], policy_of[role]["model"]
            tokens = sum(len(samples[k].completion_ids) for k in part)
            n_role = torch.tensor(float(tokens), dtype=torch.float64, device=device)
            dist.all_reduce(n_role)  # N_role: the role's tokens in the minibatch, on every rank
            if n_role == 0:
                continue
            live = [k for k in part if A[k] != 0 or cfg.forward_zero_adv]
            n = n_role.item() / world  # FSDP averages the ranks' gradients
            for b in micro_batches(rows, samples, live, values[role], device):
                lp = rows.logprobs(model, b)  # log pi_theta, laid out like b["mask"]
                # l_t = -min(rho A, clip(rho) A), summed / N_role
                loss, st = grpo.grpo_loss(
                    lp, b["old"], b["adv"], b["mask"], n, b["engine"], clip_eps=cfg.clip_eps
                )
                loss.backward()
                acc[f"{role}/loss"] += loss.item() / world / cfg.minibatches
                acc[f"{role}/tokens"] += st["tokens"]
                for k in ("clip_frac", "ratio_mean", "logprob_gap"):
                    acc[f"{role}/{k}"] += st[k] * st["tokens"]
                gap_max[role] = max(gap_max[role], st["logprob_gap_max"])
        for opt, mine in opts.items():  # the gradient clipped, the lr of step t, the step
            params = sum((group["params"] for group in opt.param_groups), [])
            if not any(p.grad is not None for p in params):
                continue  # nothing forwarded on any rank: no step
            gn = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)  # every rank's
            # per policy and per roles, a mean over the minibatches: one key when they coincide
            name = policy_of[mine[0]]["name"]
            for key in dict.fromkeys([f"{name}/grad_norm", f"{'+'.join(mine)}/grad_norm"]):
                stats[key] = stats.get(key, 0.0) + gn / cfg.minibatches
            for group in opt.param_groups:
                group["lr"] = lrs[mine[0]] * lr_scale
            opt.step()
            stats["lr"] = opt.param_groups[0]["lr"]
            # FSDP2 (every GPU run): the gradients and torch's cache of them freed now, for the
            # engine to wake into; one CPU process frees them at the next zero_grad, as ever
            # (earlier would move the heap, and the tiny run's numbers with it, in their last bits)
            if isinstance(params[0], DTensor):
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
    stats.update(recorder.role_stats(roles, acc, gap_max, device))  # over every rank
    return stats


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


@dataclass
class Run:
    """What the steps share besides the Config: this rank's device; the policies (policy_of[role]:
    the one that plays it), their weights in the engine (machinery/weights.py) and the tokenizer;
    the update's rows (rows_for); the recorder and the held-out curves; the data sources and the
    position in each (pos: the tasks taken so far, saved in each checkpoint); short: the tiny
    world's compact prompts."""

    device: torch.device
    policy_of: dict
    weights: EngineWeights
    tokenizer: object
    rows: object
    rec: recorder.Recorder
    curves: list
    sources: list
    pos: list
    short: bool


def rl_step(cfg, step, run):
    """One RL step: the README's loop, a line each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # 4. step t's schedule, known first: the active role (an Executor-only step may take more
    # queries) and the lr's multiplier
    active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
    lr_scale = lr_factor(cfg, step)
    run.rec.begin(step, active)
    # 1. queries: the same global batch on every rank, each rank takes its share
    share = stagewise.step_batch(active, cfg.batch_size, cfg.executor_batch_size) // world
    mix = list(cfg.data_mix.values())
    queries = data.sample_queries(run.sources, mix, step, share * world, cfg.seed, run.pos)
    mine = queries[rank * share : (rank + 1) * share]
    # 2. rollout: M x N, R [share, M, N]; each role's view of the engine holds its weights
    batch = rollout_lib.rollout(
        mine,
        run.weights.view("designer"),
        run.weights.view("executor"),
        M=cfg.M,
        N=cfg.N,
        step=step,
        lam=cfg.lam,
        format_reward=cfg.format_reward,
        template=cfg.template or None,
        designer_sampling=sampling(cfg, cfg.designer_max_tokens),
        executor_sampling=sampling(cfg, cfg.max_tokens),
        schedule=cfg.rollout_schedule,
        seed=cfg.seed * 1000,
        q_offset=rank * share,
        short=run.short,
        **rollout_lib.config_kwargs(cfg),  # the sandbox's limits, the grader's budgets
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
    t0 = time.perf_counter()
    stats = update(cfg, step, lr_scale, roles, run.policy_of, run.rows, run.device, world)
    run.rec.since("update", t0)
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
        policies = {pol["name"]: pol for pol in run.policy_of.values()}
        rundir.save_checkpoint(cfg, step + 1, policies, run.tokenizer, state, rank)
    idle_to_host(cfg, run.policy_of, step + 1)  # the stage switch: the next step's idle role


def sampling(cfg, max_tokens):
    """The rollout's sampling settings, at most max_tokens a completion."""
    return engine_lib.Sampling(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=max_tokens)


def main(argv):
    cfg, sources, ckpt, ts = configure(argv)
    if cfg is None:  # --plan: printed, nothing loaded
        return
    # a full disk ends the run in one line (no traceback); its last complete checkpoint stays
    with full_disk_exits("train.py", cfg.out_dir):
        run, first = start(cfg, argv, sources, ckpt, ts)
        for step in range(first, cfg.steps):
            rl_step(cfg, step, run)
        finish(cfg, run, argv)


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
    the held-out curves and their step-0 line. Returns (the Run, its first step)."""
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
    rec = recorder.Recorder(cfg, rank, device, first, tiny_data)  # a resume drops later lines
    # the held-out curves (world/heldout.py): the tiny world's at each checkpoint, the benchmark's
    # every val_every steps; both at step 0 (the cold start), unless a resumed run has it
    curves = heldout.curves(cfg, world, rank, rec.kept, tiny_data)
    zero = {}  # the step-0 line
    for curve in curves:
        if first == 0 and not ranks.all_sum([curve.started], device, dist.ReduceOp.MAX)[0]:
            zero.update(curve(0, weights, policy_of, tokenizer))
    if zero:
        rec.write({"step": 0, **zero})
    rows = rows_for(cfg, engine_lib.pad_id(tokenizer))
    run = Run(device, policy_of, weights, tokenizer, rows, rec, curves, sources, pos, tiny_data)
    return run, first


def finish(cfg, run, argv):
    """The tiny world's final table of the last checkpoint (world/final_table.py), the end in
    run.json, then every rank's teardown."""
    rank, eng = ranks.rank_world()[0], run.weights.eng
    run.rec.close()
    if cfg.eval_tasks > 0 and settings.is_tiny(cfg) and rank == 0:
        last = os.path.join(cfg.out_dir, rundir.checkpoints(cfg.out_dir)[-1])
        final_table.final_table(cfg, eng, last)
    if rank == 0:
        rundir.provenance(cfg, argv, end=True)
    # every rank done before any tears down: the engine (vLLM's groups, which it made from ours,
    # and with them ours), then our group, if the engine left it
    dist.barrier()
    eng.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
