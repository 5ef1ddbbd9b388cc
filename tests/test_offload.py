"""machinery/offload.py: the idle role's Adam state leaves the optimizer for the other role's stage
and comes back bit for bit, through train.py's own calls.

A shared policy trained stagewise (K=2: the Executor at steps 0-1, the Designer at 2-3, the
Executor at 4-5) by train.update, twice from the same weights on the same samples: with
offload_idle_state (train.idle_to_host before each step, as rl_step and make_policies call it) and
without. During each
stage the idle role's optimizer holds no state (opt.state is empty; every moment is in
opt.host_state, a copy: no storage the optimizer held), and after every step each weight, moment
and step count equals the other run's bit for bit. A checkpoint taken while the Executor's state is
held saves it (rundir.save_checkpoint: the same Adam states in state/ as the run without the
offload), and a resume from it (train.make_policies) restores both states and puts the one idle
at the resumed step (the Designer's) back in host memory, where the uninterrupted run has it; the
resumed run's last two steps then equal the run's without the offload.

At 1 rank (the model as train.py holds it on a CPU: plain tensors), a shared policy and separate
ones (two models, the idle model's state held), and at 2 gloo ranks (FSDP2, the moments DTensor
shards); each under torchrun with this file as its script, so its process group is its own.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
K, STEPS, SAVED = 2, 6, 4  # the checkpoint after step 4 (index 3): the Designer's stage


def samples_of(role, seed):
    """A role's samples of a step (random token ids, shared prompts) and their advantages."""
    import random

    from rollout import Sample

    rng = random.Random(seed)
    out = []
    for p in range(3):
        prompt = [rng.randrange(6, 60) for _ in range(rng.randint(4, 9))]
        for _ in range(3):
            c = [rng.randrange(6, 60) for _ in range(rng.randint(2, 7))]
            out.append(Sample(prompt, c, [-1.0] * len(c), (p, len(out))))
    adv = torch.randn(len(out), generator=torch.Generator().manual_seed(seed))
    return {role: (out, adv)}


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def states(policy_of, cfg):
    """{role: [each parameter's state, in the optimizer's parameter order]}, wherever it is: in
    opt.state or held in opt.host_state."""
    import train

    out = {}
    for role, pol in policy_of.items():
        opt = pol["opt"][train.opt_state(cfg, role)]
        held = getattr(opt, "host_state", {})
        out[role] = [opt.state[p] if p in opt.state else held.get(p, {}) for p in params_of(opt)]
    return out


def assert_same(a, b, what):
    """Two runs' weights, states or saved state dicts, bit for bit (DTensors: this rank's shards);
    the numbers and names in them equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        a, b = list(a.values()), list(b.values())
    if isinstance(a, list | tuple):
        assert len(a) == len(b), what
        for x, y in zip(a, b, strict=True):
            assert_same(x, y, what)
    elif torch.is_tensor(a):
        assert torch.equal(local(a), local(b)), what
    else:
        assert a == b, what


def check(tmp, device, policy="shared"):
    """Both runs, side by side, with every assertion of the module docstring; returns the number of
    moments that were held."""
    import torch.distributed as dist

    import settings
    import stagewise
    import train
    from machinery import rundir
    from world import tiny

    model_dir = os.path.join(tmp, "m")
    if dist.get_rank() == 0:  # separate policies: both from the same weights
        for sub in ("",) if policy == "shared" else ("designer", "executor"):
            tiny.save_tiny(os.path.join(model_dir, sub), seed=0, hidden_size=32, num_layers=2)
    dist.barrier()
    world, tok = dist.get_world_size(), tiny.build_tokenizer()
    runs = {}
    for on in (False, True):
        cfg = settings.Config(
            init_from=model_dir,
            out_dir=os.path.join(tmp, f"offload-{on}"),
            K=K,
            mode="stagewise",
            policy=policy,
            micro_batch=4,
            designer_lr=1e-3,
            executor_lr=2e-3,
            offload_idle_state=on,
        )
        policies, policy_of = train.make_policies(cfg, None, None, device)
        runs[on] = dict(cfg=cfg, policies=policies, policy_of=policy_of)
    held = 0
    for step in range(STEPS):
        (role,) = stagewise.active_roles(step, "stagewise", K, "executor")
        idle = {"designer": "executor", "executor": "designer"}[role]
        for on, r in runs.items():
            opt = r["policy_of"][idle]["opt"][idle]
            before = []  # the optimizer's own moments, kept alive
            for st in opt.state.values():
                before += [t for t in st.values() if t.dim() > 0]
            train.idle_to_host(r["cfg"], r["policy_of"], step)
            if on and step >= K:  # the idle role has stepped: its state is held, not in opt.state
                assert len(opt.state) == 0 and len(opt.host_state) == len(params_of(opt))
                moments = []
                for st in opt.host_state.values():
                    moments += [t for k, t in st.items() if k != "step"]
                assert all(local(t).device.type == "cpu" for t in moments)
                dtensors = [type(t).__name__ == "DTensor" for t in moments]
                assert all(dtensors) if world > 1 else not any(dtensors)  # FSDP2's shards
                # copies: no storage of the optimizer's own tensors (alive in `before`)
                ptrs = {local(t).data_ptr() for t in before}
                assert not {local(t).data_ptr() for t in moments} & ptrs
                held += len(moments)
            if not on and step >= K:
                assert len(opt.state) == len(params_of(opt))  # both states where they were
            active_opt = r["policy_of"][role]["opt"][role]
            assert not getattr(active_opt, "host_state", {})  # the active role's is back
            train.update(
                r["cfg"],
                step,
                train.lr_factor(r["cfg"], step),
                samples_of(role, step),
                r["policy_of"],
                train.rows_for(r["cfg"], 0),
                device,
                world,
            )
        for name in runs[False]["policies"]:
            a, b = (runs[on]["policies"][name]["model"].state_dict() for on in (False, True))
            assert_same(a, b, f"{name}'s weights after step {step}")
        sa, sb = (states(runs[on]["policy_of"], runs[on]["cfg"]) for on in (False, True))
        for r in sa:
            assert_same(sa[r], sb[r], f"{r}'s Adam state after step {step}")
        if step + 1 == SAVED:  # a checkpoint with the Executor's state held
            for r in runs.values():
                train_state = {"step": SAVED, "data_pos": [0]}
                rundir.save_checkpoint(
                    r["cfg"], SAVED, r["policies"], tok, train_state, dist.get_rank()
                )
            saved = []  # every rank reads the states whole (collective)
            for on in (False, True):
                folder = os.path.join(runs[on]["cfg"].out_dir, f"step_{SAVED:06d}")
                keys = rundir.read_state(folder, ["trainer"])["trainer"]["optimizers"]
                saved.append(rundir.read_state(folder, keys))
            assert len(saved[1]) == 2  # both roles' states, the held one among them
            assert_same(saved[0], saved[1], "the saved Adam states")
            # the resume: both states restored, the idle one (the Designer's at step 4) held
            cfg = runs[True]["cfg"]
            ckpt, ts = rundir.latest(cfg.out_dir)
            policies, policy_of = train.make_policies(cfg, ckpt, ts, device)
            resumed = dict(cfg=cfg, policies=policies, policy_of=policy_of)
            opt = policy_of["designer"]["opt"]["designer"]
            assert len(opt.state) == 0 and len(opt.host_state) == len(params_of(opt))
            sr = states(policy_of, cfg)
            for r in sr:
                assert_same(sr[r], sb[r], f"{r}'s Adam state after the resume")
            runs[True] = resumed
    return held


def params_of(opt):
    """The parameters opt steps, in its order."""
    out = []
    for group in opt.param_groups:
        out += group["params"]
    return out


def ranks_run(tmp, n, policy="shared"):
    """check() at n gloo ranks, in processes of their own (torchrun: a process group of their
    own, whatever other tests left in this one); returns what rank 0 printed."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            __file__,
            str(tmp),
            policy,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("policy", ["shared", "separate"])
def test_the_idle_state_is_held_and_returns_bit_for_bit(tmp_path, policy):
    out = ranks_run(tmp_path, 1, policy)
    # the Executor's state during the Designer's stage (2 steps), the Designer's during the
    # Executor's second (2 steps, the resumed run's): every parameter's two moments each time
    from world import tiny

    n = len(list(tiny.build_model(seed=0, hidden_size=32, num_layers=2)[0].parameters()))
    assert f"offload: OK, 1 ranks, {policy}, {4 * 2 * n} held" in out, out


def test_at_two_gloo_ranks(tmp_path):
    out = ranks_run(tmp_path, 2)
    assert out.count("offload: OK, 2 ranks, shared") == 2, out


if __name__ == "__main__":  # a rank of ranks_run
    sys.path.insert(0, str(ROOT))
    from machinery import ranks

    rank, world, device = ranks.setup("cpu")
    held = check(sys.argv[1], device, sys.argv[2])
    print(f"offload: OK, {world} ranks, {sys.argv[2]}, {held} held", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
