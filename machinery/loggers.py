"""loggers.py: each step's metrics line to TensorBoard and to wandb as well, for those who watch
runs there.

metrics.jsonl stays the record (plot.py draws it); these are views of it, written by rank 0 right
after each line is on disk, as Config.loggers says: "" (none, the default), "tensorboard", "wandb",
"tensorboard,wandb".

    log = loggers.Loggers(cfg, kept)   # kept: metrics.jsonl's lines after a resume truncated it
    log(m)                             # each step's line, after it is on disk
    log.close()

A killed run has logged the steps after its last checkpoint, which the resumed run does again:
- TensorBoard (out_dir/tensorboard/) is rebuilt from metrics.jsonl's kept lines at every start, so
  its event files hold each step once, as metrics.jsonl does (purge_step would keep both copies on
  disk and leave the choice to the reader).
- wandb writes through a process of its own, which buffers: a killed run's last steps (often all of
  them, offline) never reach its files. So every start first logs the kept lines that wandb does not
  hold, then its own steps: wandb ends up with each step once. A step it holds from after the killed
  run's checkpoint keeps the killed run's values; the resumed run redoes it, with the same numbers
  where resume is exact (CPU; timings aside) and metrics.jsonl keeps the redone ones. Online: one
  run for out_dir (its id in out_dir/wandb/run_id), resumed; wandb holds the steps before run.step.
  Offline, wandb cannot resume: each start is a new offline run of the group out_dir names, and
  holds the steps after the last one the earlier offline runs' files hold (read by `offline_steps`),
  so their step ranges are disjoint. `wandb sync out_dir/wandb/offline-run-*` uploads them, each as
  its own run of the group. WANDB_PROJECT names the project (default: metaagent-x).

Needs: tensorboard (through torch.utils.tensorboard) and wandb, the pip packages requirements.txt
pins
"""

import dataclasses
import glob
import os
import pathlib
import secrets
import shutil


class Loggers:
    def __init__(self, cfg, kept):
        names, self.tb, self.wandb = cfg.loggers.split(","), None, None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            path = os.path.join(cfg.out_dir, "tensorboard")
            # a view of metrics.jsonl: rebuilt from its kept lines
            shutil.rmtree(path, ignore_errors=True)
            self.tb = SummaryWriter(path)
        if "wandb" in names:
            import wandb

            id_file = pathlib.Path(cfg.out_dir, "wandb", "run_id")
            id_file.parent.mkdir(parents=True, exist_ok=True)
            if not id_file.exists():
                id_file.write_text(secrets.token_hex(4))
            run_id = id_file.read_text().strip()
            offline = wandb.setup().settings.mode in ("offline", "dryrun")
            # before this run's own files exist
            held = offline_steps(str(id_file.parent)) if offline else set()
            name = os.path.basename(os.path.abspath(cfg.out_dir))
            self.wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "metaagent-x"),
                dir=cfg.out_dir,
                name=name,
                group=f"{name}-{run_id}",
                config=dataclasses.asdict(cfg),
                id=f"{run_id}-{secrets.token_hex(2)}" if offline else run_id,
                resume=None if offline else "allow",
            )
            # wandb holds <= after
            self.after = max(held, default=-1) if offline else self.wandb.step - 1
        for m in kept:  # TensorBoard all of them again, wandb those it does not hold
            self(m)

    def __call__(self, m):
        nums = {k: float(v) for k, v in m.items() if isinstance(v, int | float) and k != "step"}
        if self.tb is not None:
            for k, v in nums.items():
                self.tb.add_scalar(k, v, m["step"])
            self.tb.flush()
        if self.wandb is not None and m["step"] > self.after:
            self.wandb.log(nums, step=m["step"])

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def offline_steps(folder):
    """The steps that the offline runs in out_dir/wandb hold (their history records)."""
    steps = set()
    for path in glob.glob(os.path.join(folder, "offline-run-*", "run-*.wandb")):
        for rec in wandb_records(path):
            if rec.WhichOneof("record_type") == "history":
                steps.add(rec.history.step.num)
    return steps


def wandb_records(path):
    """The records of one offline run's .wandb file: wandb's records (wandb_internal_pb2.Record) in
    LevelDB's log format (a 7-byte header, 32 KiB blocks, each record cut into fragments with a
    7-byte header: crc32c, length, type 1 full / 2 first / 3 middle / 4 last). A killed run's file
    may end in a partial record, a damaged one in bytes that do not parse: it is read up to
    there."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        n, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4) and pos <= len(data):
            try:
                yield wandb_internal_pb2.Record.FromString(buf)
            except DecodeError:
                return
            buf = b""
