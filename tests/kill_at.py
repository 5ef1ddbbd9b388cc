"""kill_at.py: a script (train.py, evaluate.py) run in this process and SIGKILLed at one place, as
a crash there would end it; the exact-resume tests' kills, made from outside the method: the
function that runs at that place is wrapped before the script starts.

    python tests/kill_at.py POINT:N SCRIPT ARGS...     # as `python SCRIPT ARGS...`, then killed
    python -m torch.distributed.run --nproc_per_node=2 tests/kill_at.py POINT:N train.py ARGS...

Points (N: the step, 1-based, as metrics.jsonl counts them; for part, the n-th part written):

    designer-phase, executor-phase   mid-rollout: the role's first generate call of step N
                                     (weights.RoleView.hold)
    update      mid-update: step N's first GRPO loss, before its backward (grpo.grpo_loss)
    checkpoint  between a checkpoint's files: step N's HF folders written, its state/ not
                (torch.distributed.checkpoint.save, collective: every rank)
    logged      step N's metrics line on disk, its checkpoint not (recorder.Recorder.write)
    saved       step N's checkpoint whole: the run's own hook, METAAGENT_FAULT=saved:N
                (rundir.save_checkpoint)
    part        evaluate.py: the N-th benchmark's results on disk (rundir.EvalParts.write)

The step a train.py process is in is the one recorder.Recorder.begin was last given (every rank
calls it first thing in a step); before the first, none (a start's probes and curves never die)."""

import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def wrap(owner, name, before=None, after=None):
    """owner.name replaced by a function that dies when before(*args) is true (before the call) or
    after(*args) is (after it), else does what owner.name did."""
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before is not None and before(*args, **kwargs):
            die()
        out = inner(*args, **kwargs)
        if after is not None and after(*args, **kwargs):
            die()
        return out

    setattr(owner, name, wrapped)


def arm(point, n):
    """The wrap that kills at `point` of step (or part) n."""
    import torch.distributed.checkpoint as dcp

    import grpo
    from machinery import recorder, rundir, weights

    now = {"step": None}  # the 1-based step this process is in

    def begin(rec, step, active):  # kills nothing: notes the step
        now["step"] = step + 1

    wrap(recorder.Recorder, "begin", before=begin)
    if point.endswith("-phase"):
        role = point.removesuffix("-phase")
        wrap(weights.RoleView, "hold", before=lambda v: v.role == role and now["step"] == n)
    elif point == "update":
        wrap(grpo, "grpo_loss", before=lambda *a, **kw: now["step"] == n)
    elif point == "checkpoint":
        wrap(dcp, "save", before=lambda *a, **kw: now["step"] == n)
    elif point == "logged":
        wrap(recorder.Recorder, "write", after=lambda rec, m: m["step"] == n and n > 0)
    elif point == "saved":
        os.environ["METAAGENT_FAULT"] = f"saved:{n}"
    elif point == "part":
        written = [0]  # the parts on disk (a rank but the first writes none: its result is None)

        def part(parts, method, name, result):
            written[0] += result is not None
            return result is not None and written[0] == n

        wrap(rundir.EvalParts, "write", after=part)
    else:
        raise SystemExit(f"kill_at.py: no point {point!r}")


def main():
    point, n = sys.argv[1].split(":")
    sys.argv = sys.argv[2:]  # as `python SCRIPT ARGS...` would have them
    sys.path[0] = str(ROOT)
    arm(point, int(n))
    runpy.run_path(str(ROOT / sys.argv[0]), run_name="__main__")


if __name__ == "__main__":
    main()
