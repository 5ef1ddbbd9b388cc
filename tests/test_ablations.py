"""ablations.py (the set and its runner) and ablation_report.py (judging it) on small synthetic
inputs: no training is launched (launch() is replaced by a recorder).

- the run table builds the right train.py command lines at equal budgets (each arm's updates of each
  role it trains), with stage lengths that divide the budget;
- finished runs are skipped, unfinished ones launched with --resume; a different command in an
  existing out_dir stops with a clear message; bad arguments stop with clear messages;
- runs needing a missing cold start wait for the one that builds it, and a cold start made by
  another command is never reused; --jobs pins each run to its own cores;
- the command line: --help and each subcommand's help, by path from another folder; a missing
  ROOT stops in one line;
- the report: Student's t (checked against its closed forms at 1 and 2 degrees of freedom),
  paired() (by seed and task, the 95% t interval), gains over each run's own cold start, the arms
  table, what is missing, publish (with the README's Results, into --dest), and that the committed
  results/ablations/RESULTS.md and README Results are what the report makes of the committed
  numbers;
- the set (issue #56's): its five arms, its comparisons naming real arms and PLAN's keys, P3's
  threshold, the dose beside each verdict, power from a fall's size and a threshold's distance,
  publish taking both cold starts' records; the report's machinery on issue #45's set (SET45):
  each seed's own cold start in its command and built once per seed with --jobs 2, the val split
  (no table from train.py, then the val one); the rule's four outcomes on
  hand-derived numbers; t_power against pwr.t.test's 0.8031, its level at no effect and a Monte
  Carlo check; None in the repair lists; the provenance check on a two-commit git repository (and
  PLAN against the pre-registration's); the power subcommand's seeds and compute; publish keeping
  what dest holds and src lacks.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tools import ablation_report, ablations

ROOT = Path(__file__).resolve().parents[1]


def write_run(
    root,
    run,
    seed,
    rewards,
    structure="ensemble",
    exact=None,
    correct=None,
    n=4,
    table=True,
    extra=None,
):
    """A run folder as train.py leaves it: metrics.jsonl and final_table.json with per-task vectors
    on n tasks. exact = {"RL"/"SFT": (suited, executor, oracle)} gives every task those
    probabilities; correct = {row: [0/1] * n}."""
    d = Path(root) / f"{run}-s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "metrics.jsonl", "w") as f:
        for i, r in enumerate(rewards):
            f.write(
                json.dumps(
                    {
                        "step": i + 1,
                        "reward/mean": r,
                        "accuracy": r,
                        f"structure/{structure}": 1.0,
                        "time/step": 6.0,
                    }
                )
                + "\n"
            )
    if table:
        exact = exact or {"RL": (0.5, 0.3, 0.3), "SFT": (0.4, 0.3, 0.3)}
        rows = ("RL: learned designs", "RL: single agent", "SFT: designs", "SFT: single agent")
        correct = {**{r: [0.0] * n for r in rows}, **(correct or {})}
        per = {
            who: {"suited": [su] * n, "executor": [ex] * n, "oracle": [orc] * n}
            for who, (su, ex, orc) in exact.items()
        }
        for who, rows_of in (extra or {}).items():  # {"RL"/"SFT": {row: [value per task]}}
            per[who].update(rows_of)
        (d / "final_table.json").write_text(
            json.dumps(
                {
                    "tasks": n,
                    "ids": [f"t{seed}-{k}" for k in range(n)],
                    "kinds": ["math", "code"] * (n // 2),
                    "per_task": {"correct": correct, "exact": per},
                }
            )
        )
    return d


def test_equal_budgets_and_stage_lengths():
    # 10/3 -> 4, a divisor of 20
    assert [ablations.stage_length(k, 20) for k in (1, 10, 30)] == [
        1,
        4,
        10,
    ]
    assert [ablations.stage_length(k, 30) for k in (1, 10, 30)] == [1, 5, 15]
    assert [ablations.stage_length(k, 1) for k in (1, 10, 30)] == [1, 1, 1]
    for budget in (1, 7, 20, 30):
        table = ablations.runs(budget)
        assert set(table) == set(ablations.RUN_NAMES)
        for run, over in table.items():
            # simulate stagewise.py's schedule (first role executor, switch every K): each trained
            # role gets exactly `budget` updates
            mode, steps, K = over.get("mode", "stagewise"), over["steps"], over["K"]
            roles = (
                [("executor", "designer")[(s // K) % 2] for s in range(steps)]
                if mode == "stagewise"
                else ["both"] * steps
                if mode == "coupled"
                else [mode] * steps
            )
            n_d = sum(r in ("designer", "both") for r in roles)
            n_e = sum(r in ("executor", "both") for r in roles)
            assert (n_d, n_e) == tuple(budget * u for u in ablations.updates(run)), (run, budget)
    table = ablations.runs(20)
    assert table["metaagent"] == {"M": 4, "N": 2, "K": 10, "steps": 40}  # the tiny default
    assert [r for r in table if not ablations.own_start(r)] == ["separate"]


# Issue #45's set (metaagent against single-agent GRPO, two primaries), as the report's machinery
# is tested on it: the set in tools/ablations.py changes with each issue, these numbers do not
SET45 = {
    "arms": ["metaagent", "single"],
    "primary": [
        ("designer", "P1 designer: metaagent's gain on suited", "metaagent", None, "suited"),
        (
            "repair",
            "P2 repair: metaagent − single, gain on repair_own",
            "metaagent",
            "single",
            "repair_own",
        ),
    ],
    "secondary": [
        (None, "accuracy: metaagent − single", "metaagent", "single", "accuracy"),
        ("repair", "repair: metaagent − single", "metaagent", "single", "repair"),
    ],
    "title": "Issue #45's pre-registered comparisons",
    "arms_text": "Arms: `metaagent` and `single`.",
    "readme": "Issue #45's pre-registered set, seeds {seeds}:",
    "readme_end": "Issue #34's set: results/ablations34/RESULTS.md.",
}


@pytest.fixture
def set45(monkeypatch):
    """tools/ablations.py's set as issue #45's (SET45), with its PLAN and REFERENCE_SD."""
    monkeypatch.setattr(ablations, "SET", SET45)
    plan = {
        "designer": {"delta": 5.23, "sd": 3.65, "seeds": 7},
        "repair": {"delta": 0.95, "sd": 0.68, "seeds": 7},
    }
    monkeypatch.setattr(ablations, "PLAN", plan)
    monkeypatch.setattr(ablations, "REFERENCE_SD", {"designer": 3.65, "repair": 0.53})


def test_the_set_names_real_arms_and_plan_keys():
    # issue #56's: the shared default, single-agent GRPO, the two policies frozen or trained, and
    # the positive control
    arms = ["metaagent", "single", "designer_frozen", "metaagent_separate", "executor_tester"]
    assert ablations.SET["arms"] == arms
    measures = {*ablation_report.EXACT_KEYS, "accuracy", "accuracy_code", "train_change"}
    for plan_key, label, a, b, key in ablations.SET["primary"] + ablations.SET["secondary"]:
        assert a in ablations.SET["arms"] and b in (None, *ablations.SET["arms"]), label
        assert key in measures and (plan_key is None or plan_key in ablations.PLAN), label
    for plan_key, *_ in ablations.SET["primary"]:  # power needs a reference SD of each
        assert plan_key in ablations.REFERENCE_SD
    assert ablations.PLAN["accuracy"]["null"] == 8  # P3: a gain of at least 8 points
    assert ablation_report.margin(ablations.PLAN, None) is None
    # the two arms of P1 start from the seed's separate cold start, the rest from its shared one
    assert [a for a in arms if ablations.separate_start(a)] == arms[2:4]


def test_train_command_lines(tmp_path):
    cmd = ablations.train_command("flat16", 1, 20, str(tmp_path))
    assert cmd[1:3] == ["train.py", "config/tiny.py"]
    args = cmd[3:]
    assert f"--out_dir={tmp_path}/flat16-s1" in args and "--seed=1" in args and "--steps=40" in args
    assert args.index("--M=16") > 0 and "--N=1" in args and "--K=10" in args
    assert f"--init_from={tmp_path}/sft-s1" in args  # the seed's own cold start
    assert "--eval_tasks=0" not in args
    single = ablations.train_command("single", 0, 20, str(tmp_path))
    assert "--template=single" in single and "--mode=executor" in single and "--steps=20" in single
    # 16 queries x 8 single-call executions = 128 executor samples an update
    assert "--executor_batch_size=16" in single and f"--init_from={tmp_path}/sft-s0" in single
    val = ablations.train_command("metaagent", 2, 20, str(tmp_path), "val")
    assert val[-2:] == [f"--init_from={tmp_path}/sft-s2", "--eval_tasks=0"]
    assert ablations.table_command("metaagent", 2, str(tmp_path), "val")[1:] == [
        "world/final_table.py",
        f"{tmp_path}/metaagent-s2",
        "--split",
        "val",
        "--tasks",
        "200",
    ]
    assert ablations.sft_command(3, str(tmp_path))[1:] == [
        "sft.py",
        "--no_eval",
        "--seed",
        "3",
        "--prior",
        "flat",
        "--out",
        f"{tmp_path}/sft-s3",
    ]
    sep = ablations.train_command("separate", 0, 20, str(tmp_path))
    assert (
        "--policy=separate" in sep
        and "--init_from=out/tiny-sft-separate" in sep
        and "--steps=40" in sep
    )
    assert sum(a.startswith("--init_from=") for a in sep) == 1  # its own two, not the seed's
    for run in ("coupled", "designer", "executor"):
        c = ablations.train_command(run, 0, 20, str(tmp_path))
        assert f"--mode={run}" in c and "--steps=20" in c
    # issue #56's arms of two policies: the seed's own separate cold start, made by sft.py
    for run, steps in (("designer_frozen", 20), ("metaagent_separate", 40)):
        c = ablations.train_command(run, 1, 20, str(tmp_path))
        assert "--policy=separate" in c and f"--steps={steps}" in c
        assert c[-1] == f"--init_from={tmp_path}/sft-separate-s1" and ablations.separate_start(run)
    assert "--mode=designer" in ablations.train_command("designer_frozen", 1, 20, str(tmp_path))
    assert ablations.sft_command(1, str(tmp_path), separate=True)[-4:] == [
        "--roles",
        "separate",
        "--out",
        f"{tmp_path}/sft-separate-s1",
    ]
    control = ablations.train_command("executor_tester", 0, 20, str(tmp_path))
    assert "--template=tester" in control and "--mode=executor" in control
    assert not ablations.separate_start("metaagent") and not ablations.separate_start("separate")
    with pytest.raises(KeyError):
        ablations.train_command("nope", 0, 20, str(tmp_path))


def test_finished_runs_skipped_unfinished_resumed(tmp_path, monkeypatch, capsys, set45):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
    (tmp_path / "sft-s0").mkdir()  # seed 0's cold start is there: none is built
    write_run(tmp_path, "metaagent", 0, [0.1] * 6)  # finished (budget 3: 6 of 6 steps)
    write_run(tmp_path, "flat8", 0, [0.1])  # unfinished: resumed from its checkpoint
    (tmp_path / "flat8-s0" / "step_000001").mkdir()
    rc = ablations.main(
        [
            "--only",
            "metaagent,flat8,flat16",
            "--seeds",
            "0",
            "--budget",
            "3",
            "--root",
            str(tmp_path),
        ]
    )
    assert rc == 0
    launched = [next(a for a in c if a.startswith("--out_dir=")) for c in calls]
    assert launched == [f"--out_dir={tmp_path}/flat8-s0", f"--out_dir={tmp_path}/flat16-s0"]
    assert calls[0][-1] == "--resume" and "--resume" not in calls[1]  # flat16 has no checkpoint yet
    # the runner's record is its own file: train.py refuses a fresh run into a folder holding
    # run.json (rundir.run_files), so the runner never writes one
    stamp = json.loads((tmp_path / "flat8-s0" / ablations.STAMP).read_text())
    assert stamp["cmd"] == calls[0][:-1] and not (tmp_path / "flat16-s0" / "run.json").exists()
    # killed after train.py's run.json, before any checkpoint: started over, nothing to keep
    (tmp_path / "flat16-s0" / "run.json").write_text("{}")
    ablations.main(["--only", "flat16", "--seeds", "0", "--budget", "3", "--root", str(tmp_path)])
    assert calls[-1][-1] == "--overwrite"
    del calls[-1]
    # the same folder with other settings is refused, not mixed
    capsys.readouterr()
    assert (
        ablations.main(
            ["--only", "flat8", "--seeds", "0", "--budget", "5", "--root", str(tmp_path)]
        )
        == 1
    )
    assert "flat8-s0: failed (ablations.py:" in capsys.readouterr().out and len(calls) == 2


def test_failed_run_reported(tmp_path, monkeypatch, capsys, set45):
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: 3)
    rc = ablations.main(["--seeds", "0", "--budget", "2", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    # the default set; its cold start failed, so no run was launched
    assert rc == 1 and "runs metaagent, single;" in out
    assert "single-s0: failed (cold start rc 3)" in out and not (tmp_path / "sft-s0").exists()
    (tmp_path / "sft-s0").mkdir()
    rc = ablations.main(
        ["--only", "single", "--seeds", "0", "--budget", "2", "--root", str(tmp_path)]
    )
    assert rc == 1 and "single-s0: failed (rc 3)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--seeds", "0,x"], "--seeds must be a comma list"),
        (["--seeds", "1,1"], "distinct"),
        (["--budget", "0"], "--budget and --jobs must be >= 1"),
        (["--jobs", "0"], "--budget and --jobs must be >= 1"),
        (["--only", "metaagent,bogus"], "unknown run bogus"),
    ],
)
def test_bad_arguments(argv, msg, tmp_path):
    with pytest.raises(SystemExit, match=msg):
        ablations.main(argv + ["--root", str(tmp_path)])


@pytest.mark.parametrize(
    "argv",
    [["report"], ["publish", "a", "b"], ["power", "a", "--split", "test"], ["report", "a", "-x"]],
)
def test_bad_subcommand_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        ablations.main(argv)
    assert e.value.code == 2 and f"usage: ablations.py {argv[0]} " in capsys.readouterr().err


def test_a_missing_root_stops_in_one_line(tmp_path):
    for cmd in ("report", "power", "publish"):
        with pytest.raises(SystemExit, match=f"ablations.py {cmd}: no folder .*nothing"):
            ablations.main([cmd, str(tmp_path / "nothing")])


def test_help_by_path_from_another_folder(tmp_path):
    # run by path, as the docstring's commands do: machinery/provenance.py imports from elsewhere
    script = str(ROOT / "tools" / "ablations.py")
    for sub, says in (([], "--jobs"), (["report"], "--split"), (["publish"], "README")):
        p = subprocess.run(
            [sys.executable, script, *sub, "--help"], cwd=tmp_path, capture_output=True, text=True
        )
        assert p.returncode == 0 and says in p.stdout, p.stderr
    p = subprocess.run([sys.executable, script, "power", "-h"], capture_output=True, text=True)
    assert (
        p.returncode == 0 and "usage: ablations.py power [-h] [--split {eval,val}] root" in p.stdout
    )


def test_student_t():
    # closed forms: 1 degree of freedom (Cauchy) p = 1 - (2/pi) atan t; 2 degrees p = 1 - t / sqrt(2
    # + t^2). Simpson's error on these smooth integrands is below 1e-10; 1e-9 leaves room for
    # rounding
    for t in (0.3, 1.0, 4.303, 12.7, 40.0):
        cauchy, two = 1 - 2 / math.pi * math.atan(t), 1 - t / math.sqrt(2 + t * t)
        assert ablation_report.t_pvalue(t, 1) == pytest.approx(cauchy, abs=1e-9)
        assert ablation_report.t_pvalue(-t, 2) == pytest.approx(two, abs=1e-9)
    assert ablation_report.t_pvalue(0.0, 5) == pytest.approx(1.0, abs=1e-9)
    # the 97.5% quantiles of the t tables (printed to 3 decimals)
    for df, q in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228)):
        assert ablation_report.t_critical(0.05, df) == pytest.approx(q, abs=5e-4)


def test_paired():
    assert ablation_report.paired([]) is None
    one = ablation_report.paired([([1, 0, 1, 0], [0, 0, 0, 0])])  # one seed: no spread, no verdict
    assert one["D"] == 0.5 and one["SE"] is None and one["lo"] is None
    assert ablation_report.verdict(one, 0.1) == "undecided (1 seed)"
    # three seeds: d_s = 0.1, 0.2, 0.3 -> D 0.2, SE 0.1/sqrt(3), the interval D -+ 4.30 SE
    r = ablation_report.paired([([d] * 4, [0] * 4) for d in (0.1, 0.2, 0.3)])
    assert (
        r["D"] == pytest.approx(0.2) and r["S"] == 3 and r["ds"] == pytest.approx([0.1, 0.2, 0.3])
    )
    assert r["SE"] == pytest.approx(0.1 / math.sqrt(3))
    half = ablation_report.t_critical(0.05, 2) * 0.1 / math.sqrt(3)
    assert (r["lo"], r["hi"]) == pytest.approx((0.2 - half, 0.2 + half))
    # paired by task: y - x per task, then the mean
    r = ablation_report.paired([([0, 0, 0, 0], [d] * 4) for d in (0.15, 0.20, 0.25)])
    assert r["D"] == pytest.approx(-0.2)
    # the seeds are the unit: the spread of the tasks within a seed does not enter
    r = ablation_report.paired([([1, 0, 1, 0], [0, 0, 0, 0])] * 3)
    assert r["D"] == pytest.approx(0.5) and r["SE"] == 0
    assert ablation_report.verdict(r, 0.1) == "held"


def three_seeds(root):
    """Runs with no command recorded (not this script's): metaagent's Designer gains 40, 41, 42
    points of suited, flat8's 20, flat16's 50, 30, 40; every Executor gains 5 points; single has
    one seed; sampled accuracy: metaagent 3/4 and flat8 1/4 on every seed, from the same 1/4."""
    for seed in range(3):
        write_run(
            root,
            "metaagent",
            seed,
            [0.0] * 8 + [0.6, 0.6],
            exact={"RL": (0.8 + 0.01 * seed, 0.35, 0.35), "SFT": (0.4, 0.3, 0.3)},
            correct={"RL: learned designs": [1, 1, 1, 0], "SFT: designs": [1, 0, 0, 0]},
        )
        write_run(
            root,
            "flat8",
            seed,
            [0.0] * 8 + [0.2, 0.2],
            exact={"RL": (0.6, 0.35, 0.35), "SFT": (0.4, 0.3, 0.3)},
            correct={"RL: learned designs": [1, 0, 0, 0], "SFT: designs": [1, 0, 0, 0]},
        )
        write_run(
            root,
            "flat16",
            seed,
            [0.0] * 10,
            structure="single",
            exact={"RL": (0.8 + (0.1, -0.1, 0.0)[seed], 0.35, 0.35), "SFT": (0.4, 0.3, 0.3)},
        )
    write_run(root, "single", 0, [0.2] * 10, correct={"RL: single agent": [1, 1, 0, 0]})


def test_report_arms_table_and_what_is_missing(tmp_path, set45):
    three_seeds(tmp_path)
    write_run(tmp_path, "flat8", 3, [0.9] * 4, table=False)  # still running: 4 steps so far
    # trained, final table not written yet
    write_run(tmp_path, "coupled", 0, [0.5] * 10, table=False)
    md = Path(ablation_report.report(ablations, str(tmp_path))).read_text()
    # metaagent: suited gains 40, 41, 42 -> +41.00, SE 1/sqrt(3), interval +-4.30 * 0.577 = 2.48;
    # the setting from runs() at the budget of metaagent's 10 steps
    assert (
        "| metaagent | `M=4 N=2 K=1 steps=10` | 5 + 5 | 3 | +41.00 [+38.52, +43.48] | +5.00 "
        "[+5.00, +5.00] | +5.00 ± 0.00 | +50.00 ± 0.00 | +0.600 ± 0.000 | ensemble 100% |"
    ) in md
    assert "| flat8 | `M=8 N=1 K=1 steps=10` | 5 + 5 | 3 | +20.00 [+20.00, +20.00] |" in md
    # flat16: 50, 30, 40 -> SE 10/sqrt(3), interval +-24.84; ended on the single template
    assert "| flat16 | `M=16 N=1 K=1 steps=10` | 5 + 5 | 3 | +40.00 [+15.16, +64.84] |" in md
    flat16 = next(ln for ln in md.splitlines() if ln.startswith("| flat16 |"))
    assert flat16.endswith("| single 100% |")
    assert (
        "| single | `M=4 N=2 K=1 steps=5 template=single mode=executor executor_batch_size=16` "
        "| 0 + 5 | 1 | +10.00 (1 seed) |" in md
    )
    # no command recorded: not from their seed's own cold start, so the set's section judges none
    assert (
        "older runs): metaagent-s0, metaagent-s1, metaagent-s2, single-s0." in md
        and "| P1 designer: metaagent's gain on suited | 0 | n/a | - | ±5.23 | missing |" in md
    )
    assert (
        "Unfinished, left out: coupled-s0 (10 steps, no final table), flat8-s3 (4 steps, no final "
        "table)." in md
    )
    assert (
        "Missing (seeds 0, 1, 2 of metaagent, single and of every arm begun here): coupled-s0, "
        "coupled-s1,"
        in md
        and "single-s1, single-s2." in md
    )
    assert "within noise" not in md and "Bonferroni" not in md  # one rule


def test_runs_on_other_tasks_are_not_paired(tmp_path):
    write_run(
        tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.9, 0.3, 0.3), "SFT": (0.4, 0.3, 0.3)}
    )
    d = write_run(
        tmp_path, "flat8", 0, [0.1] * 5, exact={"RL": (0.1, 0.3, 0.3), "SFT": (0.4, 0.3, 0.3)}
    )
    t = json.loads((d / "final_table.json").read_text())
    t["ids"] = [i + "x" for i in t["ids"]]  # another seed's tasks, say
    (d / "final_table.json").write_text(json.dumps(t))
    results = ablation_report.collect(ablations, str(tmp_path))
    assert ablation_report.measure(results, "metaagent", "flat8", "suited") is None
    assert ablation_report.measure(results, "metaagent", "flat8", "train_change") is None
    # single-agent GRPO is measured by its single-agent rows, the others by their learned designs
    write_run(
        tmp_path,
        "single",
        0,
        [0.1] * 5,
        correct={"RL: single agent": [1, 1, 1, 1], "SFT: single agent": [1, 0, 0, 0]},
    )
    results = ablation_report.collect(ablations, str(tmp_path))
    assert ablation_report.measure(results, "single", None, "accuracy")["D"] == pytest.approx(0.75)


def readme_with_block(path):
    path.write_text("# X\n\n## Results\n\n" + "\n".join(ablations.README_BLOCK) + "\n\nafter\n")
    return path


def test_publish(tmp_path, set45):
    src = tmp_path / "out"
    three_seeds(src)
    (src / "metaagent-s0" / "step_000010" / "model").mkdir(parents=True)  # checkpoints stay behind
    (src / "metaagent-s0" / "train.log").write_text("log")
    (src / "metaagent-s0" / "run.json").write_text(json.dumps({"cmd": ["python", "train.py"]}))
    write_run(src, "flat8", 3, [0.9] * 4, table=False)  # unfinished: not published
    (src / "sft-s0" / "model").mkdir(parents=True)  # a cold start: its records alone go
    (src / "sft-s0" / "build.json").write_text("{}")
    (src / "sft-s0" / "own_first_replies.json").write_text("{}")
    (src / "sft-s1").mkdir()  # no records: nothing of it goes
    dest = tmp_path / "results"
    # a run published by an earlier sitting, which src lacks: kept
    write_run(dest, "single", 2, [0.2] * 10)
    (dest / "metaagent-s0").mkdir(parents=True)
    (dest / "metaagent-s0" / "old.txt").write_text("x")  # a run src has again: replaced
    readme = readme_with_block(tmp_path / "README.md")
    ablations.publish(str(src), str(dest), str(readme))
    assert sorted(p.name for p in (dest / "metaagent-s0").iterdir()) == [
        "final_table.json",
        "metrics.jsonl",
        "run.json",
    ]
    assert (dest / "single-s2" / "final_table.json").exists() and not (dest / "flat8-s3").exists()
    assert sorted(p.name for p in (dest / "sft-s0").iterdir()) == [
        "build.json",
        "own_first_replies.json",
    ]
    assert not (dest / "sft-s1").exists()
    assert (
        "| metaagent | `M=4 N=2 K=1 steps=10` | 5 + 5 | 3 | +41.00 [+38.52, +43.48]"
        in (dest / "RESULTS.md").read_text()
    )
    text = readme.read_text()
    assert text.startswith("# X\n\n## Results\n\n" + ablations.README_BLOCK[0]) and text.endswith(
        ablations.README_BLOCK[1] + "\n\nafter\n"
    )
    # the README's block is issue #45's set alone, and a pointer to issue #34's
    assert "Issue #45's pre-registered set" in text and "results/ablations34/RESULTS.md" in text
    assert "| flat8 |" not in text
    ablations.publish(str(src), str(dest), str(readme))  # again: the same README
    assert readme.read_text() == text
    with pytest.raises(SystemExit, match="no finished runs"):
        ablations.publish(str(tmp_path / "nothing"), str(dest), str(readme))
    (tmp_path / "plain.md").write_text("# no block\n")
    with pytest.raises(SystemExit, match="has no Results block"):
        ablations.publish(str(src), str(dest), str(tmp_path / "plain.md"))


def test_publish_takes_its_destination(tmp_path, monkeypatch, capsys):
    # the command line: results/ablations unless --dest names another folder (a new set's own)
    # the set's fixed tables (results/retable56) for results/ablations alone; --fixed '' for none
    calls = []
    monkeypatch.setattr(ablations, "publish", lambda *a, fixed: calls.append((*a, fixed)))
    assert ablations.main(["publish", str(tmp_path)]) == 0
    assert ablations.main(["publish", str(tmp_path), "--dest", "results/new"]) == 0
    assert ablations.main(["publish", str(tmp_path), "--fixed", ""]) == 0
    assert calls == [
        (str(tmp_path), ablations.RESULTS_DIR, ablations.FIXED_DIR),
        (str(tmp_path), "results/new", None),
        (str(tmp_path), ablations.RESULTS_DIR, None),
    ]
    with pytest.raises(SystemExit, match="no folder"):
        ablations.main(["publish", str(tmp_path), "--fixed", str(tmp_path / "none")])
    with pytest.raises(SystemExit):
        ablations.main(["publish", "--help"])
    assert "--dest DEST" in capsys.readouterr().out


def test_committed_results_are_current(tmp_path):
    """results/ablations/RESULTS.md, RESULTS_fixed.md (read with results/retable56's tables where
    a run has one) and the README's Results (from the fixed reading) are what `report` makes of
    the committed numbers of the set (run `python tools/ablations.py publish results/ablations`
    after changing either); before its first run is published the README says "none yet". The
    sets before it stay as they were written: issue #45's in results/ablations45, #34's in
    results/ablations34."""
    fixed = str(ROOT / "results" / "retable56")
    src = ROOT / "results" / "ablations"
    dest = tmp_path / "ablations"
    dest.mkdir()
    if src.exists():
        ignore = shutil.ignore_patterns("RESULTS*.md")
        shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True)
        results = ablation_report.collect(ablations, str(dest))
        # the set's arms, seeds from 0 on, each seed's cold starts' records beside them
        assert set(results) <= set(ablations.SET["arms"])
        for arm, per in results.items():
            for seed in per:
                separate = ablations.separate_start(arm)
                start = ablation_report.cold_start(str(dest), seed, separate)
                assert os.path.exists(os.path.join(start, "build.json")), (arm, seed)
                own = os.path.join(start, "executor" * separate, "own_first_replies.json")
                assert os.path.exists(own), (arm, seed)
        ablation_report.report(ablations, str(dest))
        ablation_report.report(ablations, str(dest), fixed=fixed)
        for name in ("RESULTS.md", "RESULTS_fixed.md"):
            assert (dest / name).read_text() == (src / name).read_text(), name
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(ablations.README_BLOCK[0]), readme.index(ablations.README_BLOCK[1])
    block = ablations.readme_block(str(dest), fixed)
    assert readme[start : end + len(ablations.README_BLOCK[1])] == block
    old = (ROOT / "results" / "ablations45" / "RESULTS.md").read_text()
    assert "| P1 designer: metaagent's gain on suited | 7 | +7.32 [+2.43, +12.21] |" in old


def test_report_errors(tmp_path):
    with pytest.raises(SystemExit, match="no finished"):
        ablation_report.report(ablations, str(tmp_path))
    write_run(tmp_path, "metaagent", 0, [0.1] * 3, table=False)
    with pytest.raises(SystemExit, match="unfinished: metaagent-s0 .3 steps, no final table."):
        ablations.main(["report", str(tmp_path)])


def test_launch_pins_cores(tmp_path):
    log = tmp_path / "log"
    rc = ablations.launch(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        str(log),
        cpus=[0],
        echo=False,
    )
    assert rc == 0 and log.read_text().splitlines()[-1] == "[0]"
    # the log records the command itself
    assert log.read_text().startswith(f"$ {sys.executable} -c")


@pytest.fixture
def every_core():
    """This thread on all the machine's cores (a test worker holds its share: tests/conftest.py)."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, [int(c) for c in os.environ["METAAGENT_TEST_CORES"].split(",")])
    yield
    os.sched_setaffinity(0, mine)


@pytest.mark.skipif(
    os.environ["METAAGENT_TEST_CORES"].count(",") < 1,
    reason="needs two cores to give each job its own",
)
def test_jobs_own_cores_and_one_cold_start_per_seed(tmp_path, monkeypatch, set45, every_core):
    # the two runs of a seed meet at their train.py launch, so both workers were at that seed while
    # its cold start was missing: each seed's cold start is built once all the same
    meet, lock, seen = threading.Barrier(2, timeout=60), threading.Lock(), []

    def fake_launch(cmd, log, cpus=None, echo=True):
        if cmd[1] == "sft.py":
            out = Path(cmd[cmd.index("--out") + 1])
            with lock:
                seen.append(("sft", out.name, out.exists(), tuple(cpus)))
            out.mkdir()  # what sft.py does last
            Path(log).write_text("sft log")
            return 0
        meet.wait()
        with lock:
            seen.append(("train", cmd[3], None, tuple(cpus)))
        return 0

    monkeypatch.setattr(ablations, "launch", fake_launch)
    rc = ablations.main(["--seeds", "0,1", "--budget", "3", "--jobs", "2", "--root", str(tmp_path)])
    assert rc == 0
    builds = [(name, existed) for kind, name, existed, _ in seen if kind == "sft"]
    assert sorted(builds) == [("sft-s0", False), ("sft-s1", False)]  # once each, never twice
    trains = sorted(x for kind, x, *_ in seen if kind == "train")
    expected = []
    for r in ("metaagent", "single"):
        expected += [f"--out_dir={tmp_path}/{r}-s{s}" for s in (0, 1)]
    assert trains == expected
    assert (tmp_path / "sft-s0" / "sft.log").read_text() == "sft log"
    build = json.loads((tmp_path / "sft-s1" / "build.json").read_text())
    assert set(build) == {"cmd", "start", "end", "commit", "dirty"}
    # the commit the repo's checkout is at (this one: the tests run in it)
    head = subprocess.run(["git", "-C", ablations.REPO, "rev-parse", "HEAD"], capture_output=True)
    assert build["commit"] == (head.stdout.decode().strip() or None)
    cores = {c for *_, c in seen}
    assert len(cores) == 2 and all(len(c) == 1 for c in cores) and len({c[0] for c in cores}) == 2
    with pytest.raises(SystemExit, match="this process has"):
        ablations.main(["--jobs", str(len(os.sched_getaffinity(0)) + 1), "--root", str(tmp_path)])


def test_val_split_trains_without_a_table_then_makes_the_val_one(tmp_path, monkeypatch, set45):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
    (tmp_path / "sft-s0").mkdir()
    d = write_run(tmp_path, "single", 0, [0.1] * 3)  # trained (budget 3), final_table.json only
    argv = ["--only", "single", "--seeds", "0", "--budget", "3", "--split", "val"]
    assert ablations.main(argv + ["--root", str(tmp_path)]) == 0
    # no training again: the val table alone
    assert [c[1] for c in calls] == ["world/final_table.py"] and "val" in calls[0]
    (d / "final_table_val.json").write_text((d / "final_table.json").read_text())
    assert ablations.is_finished(str(d), 3, "val")
    assert ablations.main(argv + ["--root", str(tmp_path)]) == 0 and len(calls) == 1  # skipped


def test_a_run_stopped_in_its_final_table_gets_it_on_resume(tmp_path, monkeypatch, set45):
    """train.py writes the eval table as its last act: a run killed there has every step logged
    and no table, and the resumed set writes it (world/final_table.py at the run's eval_tasks)
    instead of calling the run finished without one."""
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
    (tmp_path / "sft-s0").mkdir()
    d = write_run(tmp_path, "single", 0, [0.1] * 3, table=False)
    cmd = ablations.train_command("single", 0, 3, str(tmp_path), "eval")
    (d / ablations.STAMP).write_text(json.dumps({"cmd": cmd}))
    argv = ["--only", "single", "--seeds", "0", "--budget", "3", "--root", str(tmp_path)]
    assert not ablations.is_finished(str(d), 3) and ablations.trained(str(d), 3)
    assert ablations.main(argv) == 0
    assert calls == [[sys.executable, "world/final_table.py", str(d)]]  # no training again


def test_power_against_known_values():
    # pwr.t.test(n = 10, d = 1, type = "one.sample") = 0.8031 (4 decimals; Simpson's error on the
    # smooth integrand is far below that): 1e-3
    assert ablation_report.t_power(10, 1.0) == pytest.approx(0.8031, abs=1e-3)
    assert ablation_report.t_power(9, 1.0) < 0.80 and ablation_report.seeds_needed(1.0) == 10
    for S in (2, 3, 10):  # no effect: the test rejects at its level
        assert ablation_report.t_power(S, 0.0) == pytest.approx(0.05, abs=1e-6)
    assert ablation_report.seeds_needed(0.0) is None and ablation_report.seeds_needed(-1.0) is None
    # a Monte Carlo check at S = 3, effect 0.5 (few degrees of freedom): 400k draws of the t
    # statistic, SE = sqrt(p(1 - p)/n) < 8e-4; 4 SE
    np = pytest.importorskip("numpy")
    rng, S, n = np.random.default_rng(0), 3, 400_000
    x = rng.standard_normal((n, S)) + 0.5
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(S))
    mc = float(np.mean(np.abs(t) > ablation_report.t_critical(0.05, S - 1)))
    se = math.sqrt(mc * (1 - mc) / n)
    assert ablation_report.t_power(S, 0.5) == pytest.approx(mc, abs=4 * se)


def seeds_r(ds):
    return ablation_report.paired([([d] * 4, [0] * 4) for d in ds])


def test_the_rule_four_outcomes():
    t95, t90 = ablation_report.t_critical(0.05, 2), ablation_report.t_critical(0.10, 2)
    assert t95 == pytest.approx(4.303, abs=5e-4) and t90 == pytest.approx(2.920, abs=5e-4)
    # d_s = .19, .20, .21: SE = .01/sqrt 3 = .00577, 95% [.20 -+ .0248] above 0
    assert ablation_report.verdict(seeds_r((0.19, 0.20, 0.21)), 0.05) == "held"
    assert ablation_report.verdict(seeds_r((-0.19, -0.20, -0.21)), 0.05) == "reversed"
    # d_s = -.01, 0, .01: 95% [-.0248, +.0248] holds 0; 90% [-.0169, +.0169] inside +-.05
    r = seeds_r((-0.01, 0.0, 0.01))
    assert ablation_report.verdict(r, 0.05) == "equivalent within ±5.00"
    # ... but not inside +-.01: inconclusive; its power: delta/sd = .01/.01 = 1 at S = 3
    power = ablation_report.t_power(3, 1.0)
    assert ablation_report.verdict(r, 0.01) == f"inconclusive (power {power:.2f})"
    # d_s = .1, .2, .3: 95% [-.048, +.448], 90% [+.031, +.369]: inconclusive at delta .05, with
    # the power to detect .05 at sd .1
    r = seeds_r((0.1, 0.2, 0.3))
    power = ablation_report.t_power(3, 0.5)
    assert ablation_report.verdict(r, 0.05) == f"inconclusive (power {power:.2f})"
    assert ablation_report.verdict(r, None) == "inconclusive (no margin pre-registered)"
    assert ablation_report.verdict(None, 0.05) == "missing"
    assert ablation_report.verdict(seeds_r((0.2,)), 0.05) == "undecided (1 seed)"


def new_set(root, repair_single=(0.1, -0.1)):
    """Issue #45's set on 4 tasks (math, code, math, code), seeds 0-2, each from its own cold start.
    repair_own: the context occurs on the code tasks only (None on math); the cold start's prior
    shows single most on both kinds."""
    choice = {"single": [0.6, 0.5, 0.6, 0.5], "ensemble": [0.3, 0.1] * 2, "tester": [0.1, 0.4] * 2}
    for seed in range(3):
        sft = {
            "repair_own": [None, 0.2, None, 0.4],
            "repair": [None, 0.3, None, 0.3],
            "executor_answer": [0.2] * 4,
            "executor_steps": [0.5] * 4,
            "choice": choice,
        }
        rl_meta = {
            "repair_own": [None, 0.5 + 0.01 * seed, None, 0.6],  # gains .3 + .01 s, .2
            "repair": [None, 0.3, None, 0.3],
            "executor_answer": [0.3] * 4,
            "executor_steps": [0.5] * 4,
        }
        rl_single = {
            "repair_own": [None, 0.2 + repair_single[0], None, 0.4 + repair_single[1]],
            "repair": [None, 0.3, None, 0.3],
            "executor_answer": [0.2] * 4,
            "executor_steps": [0.5] * 4,
        }
        for run, rl, su in (("metaagent", rl_meta, 0.4 + 0.01 * seed), ("single", rl_single, 0.1)):
            d = write_run(
                root,
                run,
                seed,
                [0.1] * 5,
                exact={"RL": (su, 0.3, 0.3), "SFT": (0.1, 0.3, 0.3)},
                extra={"RL": rl, "SFT": sft},
            )
            t = json.loads((d / "final_table.json").read_text())
            t["ids"] = [f"t{seed}-{k}" for k in range(4)]  # one seed's tasks for both arms
            (d / "final_table.json").write_text(json.dumps(t))
            write_starts(d, run, seed, root)


def write_starts(d, run, seed, root, commit="0" * 40, dirty=False, hours=1.0):
    """The records of a run the runner made: its ablations.json and train.py's run.json."""
    cmd = ablations.train_command(run, seed, 3, str(root))
    (d / ablations.STAMP).write_text(json.dumps({"cmd": cmd}))
    start = {
        "commit": commit,
        "dirty": dirty,
        "command": cmd,
        "start": "2025-01-01T10:00:00+0000",
        "end": f"2025-01-01T{10 + int(hours):02d}:{int(60 * (hours % 1)):02d}:00+0000",
        "machine": {"cpu": "Test CPU"},
    }
    (d / "run.json").write_text(json.dumps({"starts": [start]}))


def test_repair_lists_with_none(tmp_path, set45):
    new_set(tmp_path)
    results = ablation_report.collect(ablations, str(tmp_path))
    assert results["metaagent"][0]["gain"]["repair_own"] == [
        None,
        pytest.approx(0.3),
        None,
        pytest.approx(0.2),
    ]
    # metaagent: mean over the code tasks (.3 + .01 s + .2)/2; single .0: paired .25 + .005 s
    r = ablation_report.measure(results, "metaagent", None, "repair_own")
    assert r["ds"] == pytest.approx([0.25, 0.255, 0.26])
    r = ablation_report.measure(results, "metaagent", "single", "repair_own")
    assert r["ds"] == pytest.approx([0.25, 0.255, 0.26]) and r["S"] == 3
    # a pair counts a task where both gains are there
    assert ablation_report.paired([([None, 0.4, 0.2], [0.1, None, 0.1])])["D"] == pytest.approx(0.1)
    assert ablation_report.paired([([None, None], [0.1, 0.2])]) is None
    # an older table (no repair rows): that measure missing, the report made all the same
    write_run(tmp_path / "old", "metaagent", 0, [0.1] * 5)
    old = ablation_report.collect(ablations, str(tmp_path / "old"))
    assert ablation_report.measure(old, "metaagent", None, "repair_own") is None
    md = Path(ablation_report.report(ablations, str(tmp_path / "old"))).read_text()
    assert (
        "| P2 repair: metaagent − single, gain on repair_own | 0 | n/a | - | ±0.95 | missing |"
        in md
    )


def git_repo(path):
    """A repository with two commits; returns (older, newer)."""
    import subprocess

    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    commits = []
    for k in range(2):
        (path / "f").write_text(str(k))
        subprocess.run([*git, "add", "f"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", str(k)], check=True)
        out = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
        commits.append(out.stdout.strip())
    return commits


def test_provenance_and_the_new_report(tmp_path, monkeypatch, set45):
    older, newer = git_repo(tmp_path / "repo")
    root = tmp_path / "set"
    new_set(root)
    for run, seed in (("metaagent", 0), ("metaagent", 1), ("single", 0), ("single", 1)):
        write_starts(root / f"{run}-s{seed}", run, seed, root, commit=newer)
    write_starts(root / "metaagent-s2", "metaagent", 2, root, commit=older)  # before: not counted
    write_starts(root / "single-s2", "single", 2, root, commit=newer, dirty=True)  # not counted
    for seed in (0, 1, 2):  # the cold starts' records, as build_cold_start writes them
        record = {"cmd": ablations.sft_command(seed, "/elsewhere"), "commit": newer, "dirty": False}
        (root / f"sft-s{seed}").mkdir(exist_ok=True)
        (root / f"sft-s{seed}" / "build.json").write_text(json.dumps(record))
    (root / "PREREGISTERED").write_text(newer + "\n")
    monkeypatch.setattr(ablations, "PLAN", {"designer": {"delta": 2.0}, "repair": {"delta": 5.0}})
    md = Path(ablation_report.report(ablations, str(root), repo=str(tmp_path / "repo"))).read_text()
    assert (
        "Not counted (left out of every verdict): metaagent-s2 (before the pre-registration); "
        "single-s2 (dirty tree)." in md
    )
    assert f"| metaagent-s1 | {newer[:7]} | False | 2025-01-01T10:00:00+0000 |" in md
    # P1: suited gains 30, 31 points (seed 2 left out): SE .5, 95% 30.5 -+ 12.706 * .5
    assert (
        "| P1 designer: metaagent's gain on suited | 2 | +30.50 [+24.15, +36.85] | +30.00, +31.00 "
        "| ±2.00 | held |" in md
    )
    assert "| P2 repair: metaagent − single, gain on repair_own | 2 | +25.25" in md
    assert "| 0 | code | 10.0 | 50.0 | 40.0 | single | tester: no |" in md
    assert "Every run here started from its seed's own cold start." in md
    # a cold start built before the pre-registration leaves its seed's runs out
    record = {"cmd": ablations.sft_command(1, str(root)), "commit": older, "dirty": False}
    (root / "sft-s1" / "build.json").write_text(json.dumps(record))
    _, prov = ablation_report.counted(ablations, str(root), repo=str(tmp_path / "repo"))
    why = "its cold start: before the pre-registration"
    assert prov[1]["metaagent-s1"] == why and prov[1]["single-s1"] == why
    for change, why in (
        ({"commit": newer, "dirty": True}, "its cold start: dirty tree"),
        ({"commit": "f" * 40, "dirty": None}, "commit unknown to the repository, dirty tree"),
        ({"commit": newer, "cmd": ablations.sft_command(9, "x")}, "made by another command"),
    ):
        (root / "sft-s1" / "build.json").write_text(json.dumps({**record, **change}))
        _, prov = ablation_report.counted(ablations, str(root), repo=str(tmp_path / "repo"))
        assert prov[1]["single-s1"].endswith(why)
    (root / "sft-s1" / "build.json").unlink()
    _, prov = ablation_report.counted(ablations, str(root), repo=str(tmp_path / "repo"))
    assert prov[1]["single-s1"] == "its cold start: no build.json"
    record["commit"] = newer
    (root / "sft-s1" / "build.json").write_text(json.dumps(record))
    # a start at a commit the repository does not know
    write_starts(root / "single-s1", "single", 1, root, commit="f" * 40)
    _, prov = ablation_report.counted(ablations, str(root), repo=str(tmp_path / "repo"))
    assert prov[1]["single-s1"] == "commit unknown to the repository"
    write_starts(root / "single-s1", "single", 1, root, commit=newer)
    # without the file: nothing checked, nothing left out
    (root / "PREREGISTERED").unlink()
    md = Path(ablation_report.report(ablations, str(root), repo=str(tmp_path / "repo"))).read_text()
    assert "Provenance not checked: no PREREGISTERED file" in md and "Not counted: none." in md
    # without git's history: the same
    (root / "PREREGISTERED").write_text(newer)
    md = Path(ablation_report.report(ablations, str(root), repo=str(tmp_path))).read_text()
    assert "not checked: git cannot read" in md and "Not counted: none." in md
    # no run.json: not counted
    (root / "single-s1" / "run.json").unlink()
    _, excluded, _ = ablation_report.provenance(
        ablations, str(root), ["single-s1", "metaagent-s1"], str(tmp_path / "repo")
    )
    assert excluded == {"single-s1": "no run.json"}


def test_power_subcommand(tmp_path, capsys, set45):
    new_set(tmp_path)  # runs of 1 hour each
    (tmp_path / "sft-s0").mkdir()
    (tmp_path / "sft-s0" / "build.json").write_text(
        json.dumps({"start": "2025-01-01T09:00:00+0000", "end": "2025-01-01T09:30:00+0000"})
    )
    assert ablations.main(["power", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # P1: d_s 30, 31, 32 points: sd 1 < the reference 3.65; delta the pilot's D, 31: S = 3 (at
    # S = 2 one degree of freedom's t(0.975) = 12.7 leaves the power below 0.80)
    assert (
        "P1 designer: metaagent's gain on suited: S=3, D=+31.00, sd=1.00, reference SD 3.65" in out
    )
    assert "delta +31.00 (the pilot's D), SD used 3.65: seeds for power 0.80: 3" in out
    assert ablation_report.t_power(2, 31 / 3.65) < 0.8 <= ablation_report.t_power(3, 31 / 3.65)
    # P2: sd of d_s .5 point < the reference .53; delta 25.5: 48 SDs
    assert "P2 repair: metaagent − single, gain on repair_own: S=3, D=+25.50, sd=0.50" in out
    assert "delta +25.50 (the pilot's D), SD used 0.53: seeds for power 0.80: 2" in out
    # compute: 1 h a run, .5 h a cold start, a seed = .5 + 1 * 1
    assert "a run 1.00 h (mean of 6), a cold start 0.50 h (mean of 1)" in out
    assert "--jobs 2: 1.50 h" in out and "3 seeds: 4.5 h on this machine" in out


def test_comparisons_are_of_gains_over_each_runs_own_cold_start(tmp_path):
    # separate policies start from a stronger executor cold start: RL - RL would blame the method
    # for it
    write_run(
        tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.8, 0.32, 0.3), "SFT": (0.4, 0.30, 0.3)}
    )
    write_run(
        tmp_path, "separate", 0, [0.1] * 5, exact={"RL": (0.9, 0.61, 0.3), "SFT": (0.7, 0.60, 0.3)}
    )
    results = ablation_report.collect(ablations, str(tmp_path))
    r = ablation_report.measure(results, "metaagent", "separate", "executor")
    assert r["D"] == pytest.approx(0.01)
    r = ablation_report.measure(results, "metaagent", "separate", "suited")
    assert r["D"] == pytest.approx(0.2)


def test_fewer_seeds_than_planned_is_an_interim_verdict():
    plan = {"designer": {"delta": 0.02, "sd": 0.03, "seeds": 10}}
    r = ablation_report.paired([([0.05], [0.0]), ([0.06], [0.0]), ([0.04], [0.0])])
    # D = 0.05, sd 0.01: the 95% interval is above 0, but 3 of the 10 planned seeds
    held = ablation_report.verdict(r, 0.02)
    assert ablation_report.planned(plan, "designer", r, held) == "interim, 3 of 10 seeds: held"
    assert ablation_report.planned(plan, None, r, "held") == "held"  # secondary rows have no plan


def test_the_set_judges_runs_from_their_own_cold_start_on_the_same_programs(set45):
    def summary(init, own):
        return {
            "cmd": ["python", "train.py", f"--init_from={init}"],
            "sft_rows": {"repair_own": own},
        }

    results = {
        "metaagent": {0: summary("/r/sft-s0", [None, 0.5]), 1: summary("out/tiny-sft", [0.1])},
        "single": {0: summary("/r/sft-s0", [None, 0.5])},
    }
    own, older = ablation_report.own_cold_starts(results, ablations.SET["arms"])
    # seed 1's metaagent ran from issue #34's shared cold start: left out of the set's section
    assert set(own["metaagent"]) == {0} and set(own["single"]) == {0} and older == ["metaagent-s1"]
    assert ablation_report.same_frozen_programs(own, ablations.SET["arms"]) == []
    # the two arms' cold-start rows on repair_own differ: they did not score the same programs
    own["single"][0]["sft_rows"]["repair_own"] = [None, 0.4]
    assert ablation_report.same_frozen_programs(own, ablations.SET["arms"]) == [0]


def test_plan_is_compared_with_the_pre_registrations(tmp_path):
    text = 'x = 1\nPLAN = {\n    "designer": {"delta": 5.23},\n}\ny = 2\n'
    assert ablation_report.plan_block(text) == '\nPLAN = {\n    "designer": {"delta": 5.23},\n}\n'
    assert ablation_report.plan_block("no plan here") is None
    # an unknown commit: git cannot show it, so no comparison
    assert ablation_report.plan_as_registered(ablations, "0" * 40) is None
    # a repository whose tools/ablations.py holds this file's PLAN, then another one
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    this = (ROOT / "tools" / "ablations.py").read_text()
    commits = []
    for text in (this, this.replace('"null": 8}', '"null": 9}', 1)):
        (repo / "tools" / "ablations.py").write_text(text)
        subprocess.run([*git, "add", "tools"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "plan"], check=True)
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        commits.append(head.stdout.strip())
    assert ablation_report.plan_as_registered(ablations, commits[0], str(repo)) is True
    assert ablation_report.plan_as_registered(ablations, commits[1], str(repo)) is False


def test_a_cold_start_made_by_another_command_is_never_reused(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
    argv = ["--only", "single", "--seeds", "0", "--budget", "2", "--root", str(tmp_path)]
    (tmp_path / "sft-s0").mkdir()
    other = [sys.executable, "sft.py", "--no_eval", "--seed", "0", "--out", "x"]  # no --prior flat
    (tmp_path / "sft-s0" / "build.json").write_text(json.dumps({"cmd": other}))
    assert ablations.main(argv) == 1 and not calls
    assert "single-s0: failed (cold start made by another command)" in capsys.readouterr().out
    # the same command built elsewhere (a published record names its folder): reused
    same = ablations.sft_command(0, "/elsewhere")
    (tmp_path / "sft-s0" / "build.json").write_text(json.dumps({"cmd": same}))
    assert ablations.main(argv) == 0 and [c[1] for c in calls] == ["train.py"]


def test_a_new_root_is_made_for_its_first_cold_start(tmp_path, monkeypatch):
    def fake_launch(cmd, log, cpus=None, echo=True):
        Path(log).write_text("sft log")  # the log beside the cold start: its folder must exist
        for role in ("designer", "executor"):  # sft.py --roles separate: each renamed into place
            Path(cmd[cmd.index("--out") + 1], role).mkdir(parents=True)
        return 0

    monkeypatch.setattr(ablations, "launch", fake_launch)
    root = tmp_path / "new" / "set"
    assert ablations.build_cold_start(5, str(root), separate=True) == "ok"
    assert (root / "sft-separate-s5" / "sft.log").read_text() == "sft log"
    assert json.loads((root / "sft-separate-s5" / "build.json").read_text())["cmd"][-1] == str(
        root / "sft-separate-s5"
    )


def test_an_unfinished_separate_cold_start_is_made_again(tmp_path, monkeypatch, capsys):
    # a build stopped between the two roles leaves designer/ alone: not reused, built again
    built = []

    def fake_launch(cmd, log, cpus=None, echo=True):
        out = Path(cmd[cmd.index("--out") + 1])
        built.append(sorted(p.name for p in out.iterdir()))
        (out / "designer").mkdir(exist_ok=True)
        if len(built) == 1:  # the first build finishes; the second stops after designer/
            (out / "executor").mkdir()
        return 0

    monkeypatch.setattr(ablations, "launch", fake_launch)
    start = tmp_path / "sft-separate-s3"
    (start / "designer").mkdir(parents=True)
    assert ablations.build_cold_start(3, str(tmp_path), separate=True) == "ok"
    assert (
        built == [["designer"]] and "unfinished (stopped between roles)" in capsys.readouterr().out
    )
    assert ablations.build_cold_start(3, str(tmp_path), separate=True) == "ok"  # whole: reused
    # a build that ends without its executor/ is a failed one
    (start / "build.json").unlink()
    (start / "executor").rmdir()
    assert ablations.build_cold_start(3, str(tmp_path), separate=True).startswith("failed")
    assert len(built) == 2


def mechanism_set(root):
    """Issue #56's five arms on 4 tasks (math, code, math, code), seeds 0-2, with their metrics
    lines' repair doses. accuracy_code gains: metaagent_separate 100, 100, 50 points by seed,
    designer_frozen 50; copy_own on the code tasks: metaagent falls 25 points (and 0.5 s more),
    single 0; metaagent's accuracy gain 75 (50 on code); each arm's runs from the seed's own cold
    starts.

    The dose: at seed s an Executor step k (1-5, the first five steps; none in designer_frozen)
    trained k (s + 1) repairs, A = 0.1 k - 0.2 + 0.1 s, copy rate 0.1 k, 100 Executor samples; the
    Designer's steps made repairs they did not train on, 50 Executor samples. So a seed trained
    15 (s + 1) repairs, A_s = 0.1 (55/15) - 0.2 + 0.1 s = 1/6 + 0.1 s, copy 5.5/15 = 37%; over
    seeds 0-2: 30 repairs a run, A pooled over the repairs (1/6 + 2 (1/6 + .1) + 3 (1/6 + .2)) / 6
    = +0.30 (the mean of the seeds' A: +0.27); single-agent GRPO trained none (no tester)."""
    designs = {
        "metaagent": [1, 1, 1, 0],
        "designer_frozen": [0, 1, 0, 0],
        "executor_tester": [0, 0, 0, 0],
    }
    for seed in range(3):
        designs["metaagent_separate"] = [0, 1, 0, 1] if seed < 2 else [0, 1, 0, 0]
        for arm in ablations.SET["arms"]:
            copy = 0.5 - (0.25 + 0.005 * seed) * (arm == "metaagent")
            rl = {"copy_own": [None, copy, None, copy]}
            sft = {"copy_own": [None, 0.5, None, 0.5]}
            correct = {"RL: learned designs": designs.get(arm, [0] * 4)}
            if arm == "single":
                correct = {"RL: single agent": [0, 1, 0, 0]}
            d = write_run(
                root, arm, seed, [0.1] * 10, correct=correct, extra={"RL": rl, "SFT": sft}
            )
            write_starts(d, arm, seed, root)
            lines = []
            for k in range(1, 11):
                active = "executor" if k <= 5 and ablations.updates(arm)[1] else "designer"
                line = {"step": k, "reward/mean": 0.1, "active": active}
                calls = k * (seed + 1) if arm != "single" else 0
                line.update({"repair/calls": calls, "samples/executor": 50.0})
                if calls:
                    line["repair/adv_mean"] = 0.1 * k - 0.2 + 0.1 * seed
                    line["repair/copy_rate"] = 0.1 * k
                line["repair/trained"] = calls if active == "executor" else 0
                if active == "executor":
                    line["samples/executor"] = 100.0
                lines.append(json.dumps(line))
            (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_the_mechanism_set_its_threshold_and_its_dose(tmp_path, capsys, monkeypatch):
    mechanism_set(tmp_path)
    md = Path(ablation_report.report(ablations, str(tmp_path))).read_text()
    rows = {ln.split(" | ")[0][2:]: ln for ln in md.splitlines() if ln.startswith("| P")}
    p1, p2, p3 = (rows[label] for _, label, *_ in ablations.SET["primary"])
    # at 3 of the planned seeds: interim verdicts, at PLAN's margins. P1's d_s 50, 50, 0: D 33.33,
    # sd 28.87, SE 16.67, t(0.975, 2 df) 4.3027: 33.333 -+ 71.711
    assert (
        "| 3 | +33.33 [-38.38, +105.04] | +50.00, +50.00, +0.00 | ±9.87 | interim, 3 of 10 " in p1
    )
    assert "seeds: inconclusive (power 0." in p1
    # P2: single − metaagent on copy_own, 25 + .5 s points: D 25.5, sd .5
    assert (
        "| 3 | +25.50 [+24.26, +26.74] |" in p2
        and "| ±10.42 | interim, 3 of 10 seeds: held |" in p2
    )
    # P3: a gain of 75 points at every seed (3 of 4 tasks, from none), against the threshold of 8
    assert "| +75.00 [+75.00, +75.00] |" in p3 and "seeds: held (against +8.00) |" in p3
    # P3's margin is about its threshold
    assert "| +8.00 ±5.25 | interim, 3 of 10 seeds: held (against +8.00) |" in p3
    # the dose beside each verdict (mechanism_set's docstring): designer_frozen trained none
    assert p1.endswith(
        "| metaagent_separate: 30 repairs (A +0.30, copy 37%), 100 samples an update; "
        "designer_frozen: 0 repairs |"
    )
    assert p2.endswith(
        "| single: 0 repairs, 100 samples an update; metaagent: 30 repairs (A +0.30, copy 37%), "
        "100 samples an update |"
    )
    # over the seeds behind the verdict's d_s alone: seed 0's
    results = ablation_report.collect(ablations, str(tmp_path))
    r0 = ablation_report.paired([([1.0], [0.0])])
    r0["seeds"] = [0]
    assert ablation_report.dose_text(results, ["metaagent"], r0) == (
        "metaagent: 15 repairs (A +0.17, copy 37%), 100 samples an update"
    )
    # the README's line: the repairs alone, beside each primary verdict (a registered set; git
    # cannot read this folder's history, so no run is left out)
    (tmp_path / "PREREGISTERED").write_text("0" * 40)
    monkeypatch.setattr(ablation_report, "git_state", lambda repo: {"commit": None})
    block = ablations.readme_block(str(tmp_path))
    assert "+33.33 [-38.38, +105.04], interim, 3 of 10 seeds: inconclusive (power 0." in block
    assert ", predicted held.\n" in block
    # below the threshold: the same gain against +80 is reversed
    r = ablation_report.measure(results, "metaagent", None, "accuracy")
    assert ablation_report.verdict(ablation_report.against(r, 0.80), None) == "reversed"
    # power: delta is the size of the pilot's own D (P3: its distance from the threshold), or
    # without the comparison in the pilot half the size of metaagent's gain (a fall by its size)
    assert ablations.main(["power", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "delta +33.33 (the pilot's D), SD used 28.87" in out
    assert "delta +25.50 (the pilot's D), SD used 6.19" in out
    assert "delta +67.00 (the pilot's D, from +8), SD used 5.12" in out
    for seed in range(3):
        shutil.rmtree(tmp_path / f"single-s{seed}")
    assert ablations.main(["power", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "P2 habit: single − metaagent, gain on copy_own (metaagent's fall the larger): S=0" in out
    )
    assert "delta +12.75 (half metaagent's copy_own gain), SD used 6.19" in out
    # publish takes both cold starts' records of a seed: a separate one's frozen programs are in
    # its Executor's folder (world/final_table.py's own_first_replies)
    for name in ("sft-s0", "sft-separate-s0"):
        (tmp_path / name / "executor" / "model").mkdir(parents=True)
        (tmp_path / name / "build.json").write_text("{}")
    (tmp_path / "sft-s0" / "own_first_replies.json").write_text("{}")
    (tmp_path / "sft-separate-s0" / "executor" / "own_first_replies.json").write_text("{}")
    dest = tmp_path / "published"
    ablations.publish(str(tmp_path), str(dest), str(readme_with_block(tmp_path / "README.md")))
    assert (dest / "sft-s0" / "own_first_replies.json").exists()
    assert (dest / "sft-separate-s0" / "build.json").exists()
    assert (dest / "sft-separate-s0" / "executor" / "own_first_replies.json").exists()
    assert not (dest / "sft-separate-s0" / "executor" / "model").exists()
    # no repair/trained in a run's lines (one older than issue #56): no dose
    assert ablation_report.dose([{"step": 1, "reward/mean": 0.0}]) is None


def test_fixed_tables_the_unregistered_comparisons_and_the_main_table(tmp_path, monkeypatch):
    # issue #56's set on 4 tasks (mechanism_set): metaagent's tables made again, its learned
    # designs right on every task (a gain of 100 instead of 75); the other arms have none
    mechanism_set(tmp_path)
    fixed = tmp_path / "retable"
    fixed.mkdir()
    for seed in range(3):
        t = json.loads((tmp_path / f"metaagent-s{seed}" / "final_table.json").read_text())
        t["per_task"]["correct"]["RL: learned designs"] = [1, 1, 1, 1]
        (fixed / f"metaagent-s{seed}-abc1234.json").write_text(json.dumps(t))
    (fixed / "metaagent-s10-abc1234.json").write_text("{}")  # another run's: not seed 1's
    results = ablation_report.collect(ablations, str(tmp_path), fixed=str(fixed))
    assert [s["fixed"] for s in results["metaagent"].values()] == [True] * 3
    assert not any(s["fixed"] for s in results["single"].values())
    assert ablation_report.measure(results, "metaagent", None, "accuracy")["D"] == 1.0
    r = ablation_report.measure(results, "single", "metaagent", "copy_own")
    assert ablation_report.registered_tables(results, ["single", "metaagent"], r) == {
        "single": [0, 1, 2]
    }
    assert ablation_report.tables_text(results, ["metaagent"], None, "accuracy") == "fixed"
    assert ablation_report.seeds_text([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    # the unregistered comparisons: the gains' difference, the levels after RL and at the cold
    # start (metaagent 1 on every task against single's 1 in 4, both from 0), the other CPUs
    single, separate = ablation_report.unregistered(ablations, results, fixed=True)
    # each paper figure beside its own baseline: single-agent GRPO's end point (+9.23 at 8B), not
    # the untrained single agent's (+11.17 / +12.80); the end points first, as the paper compares
    assert single == (
        "MetaAgent-X − single-agent GRPO (paper at 8B: +9.23, 38.33 against 29.10; at 4B not in "
        "this project's material): after RL +75.00 [+75.00, +75.00], gain +75.00 [+75.00, "
        "+75.00], cold start +0.00 [+0.00, +0.00] (3 seeds; registered tables at single s0-2)"
    )
    assert "+11.17" not in single and "+12.80" not in single
    assert separate.endswith(
        ": after RL -58.33 [-94.19, -22.48], cold start +0.00 [+0.00, +0.00], gain -58.33 "
        "[-94.19, -22.48] "
        "(3 seeds; registered tables at metaagent_separate s0-2)"
    )
    # `suited` by kind (P(tester | code), P(ensemble | math)): metaagent's remade tables move
    # math's tasks off the ensemble (0.4 -> 0.2) and code's onto the tester (0.4 -> 0.9); the
    # other arms gain 10 points on every task
    for seed in range(3):
        t = json.loads((fixed / f"metaagent-s{seed}-abc1234.json").read_text())
        t["per_task"]["exact"]["RL"]["suited"] = [0.2, 0.9, 0.2, 0.9]
        (fixed / f"metaagent-s{seed}-abc1234.json").write_text(json.dumps(t))
    results = ablation_report.collect(ablations, str(tmp_path), fixed=str(fixed))
    assert ablation_report.by_kind(ablations, results) == (
        "`suited` by kind, each arm's gain: code (P(tester)): metaagent +50.00 [+50.00, +50.00], "
        "designer_frozen +10.00 [+10.00, +10.00], metaagent_separate +10.00 [+10.00, +10.00]; "
        "math (P(ensemble)): metaagent -20.00 [-20.00, -20.00], designer_frozen +10.00 [+10.00, "
        "+10.00], metaagent_separate +10.00 [+10.00, +10.00]"
    )
    run_json = tmp_path / "metaagent_separate-s1" / "run.json"
    rec = json.loads(run_json.read_text())
    rec["starts"][0]["machine"]["cpu"] = "Other CPU"
    run_json.write_text(json.dumps(rec))
    results = ablation_report.collect(ablations, str(tmp_path), fixed=str(fixed))
    separate = ablation_report.unregistered(ablations, results, fixed=True)[1]
    assert separate.endswith(
        "(3 seeds; CPUs differ at s1; registered tables at metaagent_separate s0-2)"
    )
    # the report read with them: RESULTS_fixed.md, a tables column; RESULTS.md stays registered
    path = ablation_report.report(ablations, str(tmp_path), fixed=str(fixed))
    md = Path(path).read_text()
    assert path.endswith("RESULTS_fixed.md") and "(3 of 15 runs)" in md
    p3 = next(ln for ln in md.splitlines() if ln.startswith("| P3"))
    assert "| +100.00 [+100.00, +100.00] |" in p3 and p3.endswith("| fixed |")
    assert "| registered at single s0-2 |" in md
    assert (
        "Predicted in the pre-registration: P1 ceiling held, P2 habit held, P3 accuracy reversed."
        in md
    )
    registered = Path(ablation_report.report(ablations, str(tmp_path))).read_text()
    assert "| +75.00 [+75.00, +75.00] |" in registered and "| tables |" not in registered
    # the README's block from the fixed reading: each line names the registered tables it reads
    (tmp_path / "PREREGISTERED").write_text("0" * 40)
    monkeypatch.setattr(ablation_report, "git_state", lambda repo: {"commit": None})
    block = ablations.readme_block(str(tmp_path), str(fixed))
    assert "held (against +8.00), predicted reversed.\n" in block
    assert (
        f"a run's table remade in {fixed} where it has one ([every row](results/ablations/" in block
    )
    assert "held, predicted held (registered tables at single s0-2).\n" in block
    # the unregistered comparisons and `suited` by kind: the reports (the README's claims table
    # quotes them)
    assert "Unregistered" not in block and "by kind" not in block
    assert "after RL -58.33 [-94.19, -22.48], cold start +0.00 [+0.00, +0.00], gain" in md
    assert "- `suited` by kind, each arm's gain: code (P(tester)): metaagent +50.00" in md
    # two tables of one run in the folder: which to read is not guessed
    (fixed / "metaagent-s0-def5678.json").write_text("{}")
    with pytest.raises(SystemExit, match="2 tables of metaagent-s0"):
        ablation_report.collect(ablations, str(tmp_path), fixed=str(fixed))
    # a run's final_table.json, its primary rows (the main job's, results/main)
    run = tmp_path / "main"
    run.mkdir()
    ga = {"points": 6.8, "stderr": 1.4}
    table = {
        "split": "eval",
        "tasks": 2,
        "samples": 4,
        "kinds": ["math", "code"],
        "rows": {"SFT: designs": {"accuracy": 0.559}, "RL: learned designs": {"accuracy": 0.627}},
        "rl_minus_sft": {
            "learned designs": ga,
            "suited": {"points": 11.9, "stderr": 1.2},
            "copy_own": {"points": -22.7, "stderr": 1.1},
            "accuracy/code": {"points": 16.2, "stderr": 2.3},
            "accuracy/math": {"points": -2.5, "stderr": 1.3},
        },
        "per_task": {
            "exact": {
                "SFT": {
                    "suited": [0.3, 0.2],
                    "copy_own": [None, 0.5],
                    "choice": {"tester": [0.2, 0.2]},
                },
                "RL": {
                    "suited": [0.1, 0.5],
                    "copy_own": [None, 0.25],
                    "choice": {"tester": [0.6, 0.5]},
                },
            }
        },
        "train_change": 0.176,
    }
    (run / "final_table.json").write_text(json.dumps(table))
    # `suited` by kind: math's one task 0.3 -> 0.1 (P(ensemble)), code's 0.2 -> 0.5 (P(tester))
    assert ablations.table_lines(str(run)) == [
        f"{run}: eval, 2 tasks x 4 draws; CPU: no run.json",
        "  learned designs: 55.9 -> 62.7%, RL - SFT +6.8 (1.4) (code +16.2, math -2.5)",
        "  suited: P(tester | code) 20.0 -> 50.0%, RL - SFT +11.9 (1.2) (code +30.0, math -20.0)",
        "  P(tester) by kind: code 20.0 -> 50.0%, math 20.0 -> 60.0%",
        "  copy_own: 50.0 -> 25.0%, RL - SFT -22.7 (1.1)",
        "  training accuracy, last 10% - first 10%: +0.176",
    ]
    # the run's CPU and the date it ran (run.json's starts)
    start = {"start": "2026-12-05T21:45:58+0000", "machine": {"cpu": "Some CPU"}}
    (run / "run.json").write_text(json.dumps({"starts": [start]}))
    assert ablations.table_lines(str(run))[0].endswith("; CPU: Some CPU, 2026-12-05")
    assert ablations.main(["table", str(run)]) == 0
    with pytest.raises(SystemExit, match="no folder"):
        ablations.main(["table", str(tmp_path / "none")])
