"""weights.py: the weights an engine generates with, and the engine as each role sees it.

One policy plays both roles by default, so the engine always holds the right weights. With separate
policies one engine serves both roles and holds whichever role is generating: a role's view of the
engine puts that role's weights in before it generates, when the engine holds the other's.

    view(role).generate(prompts, sampling) = weights.hold(role); engine.generate(prompts, sampling)

rollout.py takes a designer engine and an executor engine; pass it the two views, and it never needs
to know whose weights the engine holds. One holder, EngineWeights, whose sources[role] is what plays
the role: the trainer's model (train.py), or a saved model's folder, or a state dict (evaluation).
One object for both roles (one model) is never reloaded.

    weights = EngineWeights(eng, {r: policy_of[r]["model"] for r in roles}, "designer", device)
    weights.probe("at the engine's start")                      # train.py: the trainer's models
    d, e = weights.view("designer"), weights.view("executor")
    batch = rollout(queries, d, e, M, N, step)
    weights.sleep(); ...the update...; weights.check_gap(stats, roles, step)
    weights.sync(step, save_every)

    folders = {"designer": "RUN/step_000300/designer", "executor": "RUN/step_000300/executor"}
    held = EngineWeights(eng, folders)                          # saved models
    batch = rollout(queries, held.view("designer"), held.view("executor"), M, N)

sync puts the trainer's new weights into the engine after each update, gathered one tensor at a
time (FSDP2: each full tensor on every rank) and reloaded in place; a folder is read one tensor at a
time at each load (nothing stays in memory). Every reload of the trainer's weights is checked
(reload_check.py): a probe at the engine's start, after the first sync and every save_every steps
(its gap and bound in that step's metrics line: `info`), check_gap on each step's own engine/trainer
log-prob gap, and on a GPU the exact check of the engine's tensors after every sync.

Needs: machinery/ranks.py, machinery/cpu_bits.py, machinery/reload_check.py, machinery/rundir.py,
machinery/decode.py,
machinery/engine.py, machinery/provenance.py
"""

import glob
import math
import os

import torch
import torch.distributed as dist
from safetensors import safe_open

from machinery import ranks, reload_check, rundir


class RoleView:
    """The engine as one role sees it: generate() holds the role's weights first
    (holder.hold(role))."""

    def __init__(self, holder, role):
        self.holder, self.role = holder, role

    def generate(self, prompts, sampling):
        self.hold()
        return self.holder.eng.generate(prompts, sampling)

    def submit(self, key, prompt, sampling):
        self.hold()
        self.holder.eng.submit(key, prompt, sampling)

    def poll(self):
        return self.holder.eng.poll()

    def hold(self):
        self.holder.hold(self.role)


def folder_weights(path):
    """(name, tensor) of a saved HF model, one tensor at a time: every *.safetensors file of the
    folder."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"{path}: no *.safetensors file (a model folder, as train.py saves them)"
        )
    for f in files:
        with safe_open(f, framework="pt") as weights:
            for name in weights.keys():
                yield name, weights.get_tensor(name)


class EngineWeights:
    """The engine's weights, each role's from sources[role]: the trainer's model (a torch module,
    gathered in the engine's dtype), a saved model's folder, or a state dict. held: the role whose
    weights the engine holds already (None: nobody's, so the first hold loads); device: the
    trainer's (on CUDA the engine computes in bf16: sleeps, wakes, and is checked exactly)."""

    def __init__(self, eng, sources, held=None, device=None):
        self.eng, self.sources, self.held = eng, sources, held
        self.device = device or torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else None  # what vLLM computes in on a GPU
        self.info, self.bound = {}, None

    def view(self, role):
        return RoleView(self, role)

    def load(self, role):
        src = self.sources[role]
        if isinstance(src, str):
            tensors = folder_weights(src)
        elif isinstance(src, torch.nn.Module):
            tensors = rundir.full_state(src, self.dtype)  # one tensor at a time
        else:
            tensors = src
        self.eng.load_weights(tensors)
        self.held = role

    def hold(self, role):
        """The engine holds this role's weights: loaded when it holds another object's."""
        if self.held is None or self.sources[role] is not self.sources[self.held]:
            self.load(role)
        self.held = role  # one shared object: its weights are already there

    def sleep(self):
        """vLLM on a GPU frees its KV cache and weights while the trainer runs (a no-op
        elsewhere)."""
        if self.cuda:
            self.eng.sleep()

    def sync(self, step, save_every):
        """The weights of step `step`'s update into the engine: the Designer's (asleep, its weights
        wake first: engine.py; separate policies: the Executor's at its phase), probed on the first
        step and on the steps that save (save_every: the same steps after a resume)."""
        self.info = {}
        self.load("designer")
        if self.cuda:
            self.eng.wake()
            self.exact(f"after the weight sync of step {step + 1}")
        if step == 0 or (step + 1) % save_every == 0:
            self.probe(f"after the weight sync of step {step + 1}")

    def exact(self, when):
        """On a GPU, where the probe's bf16 bound is loose: the engine's own tensors of layer 0's
        fused projections and of the lm head equal the trainer's bf16 cast bit for bit
        (reload_check.exact, collective: every rank calls it); any rank's mismatch stops every
        rank. An engine that cannot read its weights back (the transformers engine, which computes
        with the trainer's own copy) is not checked."""
        if not hasattr(self.eng, "read_weights"):
            return
        bad = reload_check.exact(self.eng, self.sources["designer"], self.dtype)
        (worst,) = ranks.all_sum([len(bad)], self.device, dist.ReduceOp.MAX)
        if worst:
            raise reload_check.ReloadError(
                f"{when}: the engine's weights are not the trainer's: "
                + ("; ".join(bad) or "on another rank")
            )

    def probe(self, when):
        """reload_check.probe on every rank; the largest gap (NaN: inf) and S of all ranks
        decide."""
        gap, S = reload_check.probe(self.eng, self.sources["designer"], self.device)
        gap = gap if gap == gap else math.inf  # NaN (a broken reload) is the largest of all
        gap, S = ranks.all_sum([gap, S], self.device, dist.ReduceOp.MAX)
        self.bound = reload_check.limit(self.dtype or torch.float32, S)
        # in the step's metrics
        self.info = {
            "reload/probe_gap": gap,
            "reload/probe_limit": self.bound,
        }
        reload_check.check(gap, self.bound, when)

    def check_gap(self, stats, roles, step):
        """The engine sampled step `step` with the trainer's weights: each role's mean
        engine/trainer gap over its trained tokens (update's stats, the same on every rank) within
        the last probe's bound."""
        for r in roles:
            if f"{r}/logprob_gap" in stats:
                reload_check.check(stats[f"{r}/logprob_gap"], self.bound, f"step {step + 1}, {r}")
