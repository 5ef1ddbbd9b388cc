"""ablations.py on small synthetic inputs: no training is launched (launch() is replaced by a
recorder).

- the run table builds the right train.py command lines at equal budgets (each arm's updates of each
  role it trains), with stage lengths that divide the budget;
- finished runs are skipped, unfinished ones launched with --resume; a different command in an
  existing out_dir stops with a clear message; bad arguments stop with clear messages;
- runs needing a missing cold start wait for the one that builds it; --jobs pins each run to its own
  cores;
- the report: Student's t (checked against its closed forms at 1 and 2 degrees of freedom), the one
  rule (paired by seed and task, the 95% t interval), gains over each run's own cold start, the run
  table, the claim sentences, the pairings, what is missing, publish (with the README's Results),
  and that the committed results/ablations/RESULTS.md and README Results are what the report makes
  of the committed numbers.
"""

import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest

from tools import ablations

ROOT = Path(__file__).resolve().parents[1]


def write_run(
    root, run, seed, rewards, structure="ensemble", exact=None, correct=None, n=4, table=True
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
    for _, claims, _, _ in ablations.COMPARISONS.values():  # each names real runs and rows
        assert claims and all(
            a in table and b in table and set(rows) <= {"suited", "executor"}
            for a, b, rows in claims
        )
    assert ablations.n_tests() == 17


def test_train_command_lines(tmp_path):
    cmd = ablations.train_command("flat16", 1, 20, str(tmp_path))
    assert cmd[1:3] == ["train.py", "config/tiny.py"]
    args = cmd[3:]
    assert f"--out_dir={tmp_path}/flat16-s1" in args and "--seed=1" in args and "--steps=40" in args
    assert args.index("--M=16") > 0 and "--N=1" in args and "--K=10" in args
    single = ablations.train_command("single", 0, 20, str(tmp_path))
    assert "--template=single" in single and "--mode=executor" in single and "--steps=20" in single
    sep = ablations.train_command("separate", 0, 20, str(tmp_path))
    assert (
        "--policy=separate" in sep
        and "--init_from=out/tiny-sft-separate" in sep
        and "--steps=40" in sep
    )
    for run in ("coupled", "designer", "executor"):
        c = ablations.train_command(run, 0, 20, str(tmp_path))
        assert f"--mode={run}" in c and "--steps=20" in c
    with pytest.raises(KeyError):
        ablations.train_command("nope", 0, 20, str(tmp_path))


def test_finished_runs_skipped_unfinished_resumed(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
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
    stamp = json.loads((tmp_path / "flat8-s0" / "run.json").read_text())
    assert stamp["cmd"] == calls[0][:-1]
    # the same folder with other settings is refused, not mixed
    capsys.readouterr()
    assert (
        ablations.main(
            ["--only", "flat8", "--seeds", "0", "--budget", "5", "--root", str(tmp_path)]
        )
        == 1
    )
    assert "flat8-s0: failed (ablations.py:" in capsys.readouterr().out and len(calls) == 2


def test_failed_run_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: 3)
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
        (["report"], "usage"),
        (["publish", "a", "b"], "usage"),
    ],
)
def test_bad_arguments(argv, msg, tmp_path):
    with pytest.raises(SystemExit, match=msg):
        ablations.main(
            argv + (["--root", str(tmp_path)] if argv[0] not in ("report", "publish") else [])
        )


def test_student_t():
    # closed forms: 1 degree of freedom (Cauchy) p = 1 - (2/pi) atan t; 2 degrees p = 1 - t / sqrt(2
    # + t^2). Simpson's error on these smooth integrands is below 1e-10; 1e-9 leaves room for
    # rounding
    for t in (0.3, 1.0, 4.303, 12.7, 40.0):
        assert ablations.t_pvalue(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-9)
        assert ablations.t_pvalue(-t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-9)
    assert ablations.t_pvalue(0.0, 5) == pytest.approx(1.0, abs=1e-9)
    # the 97.5% quantiles of the t tables (printed to 3 decimals)
    for df, q in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228)):
        assert ablations.t_critical(0.05, df) == pytest.approx(q, abs=5e-4)


def test_paired_rule():
    assert ablations.paired([]) is None and ablations.verdict(None) == "missing"
    one = ablations.paired([([1, 0, 1, 0], [0, 0, 0, 0])])  # one seed: no spread, no verdict
    assert one["D"] == 0.5 and one["SE"] is None and ablations.verdict(one) == "undecided (1 seed)"
    # three seeds: d_s = 0.1, 0.2, 0.3 -> D 0.2, SE 0.1/sqrt(3), t = 2 sqrt(3) = 3.46 < 4.30: within
    # noise
    r = ablations.paired([([d] * 4, [0] * 4) for d in (0.1, 0.2, 0.3)])
    assert (
        r["D"] == pytest.approx(0.2)
        and r["SE"] == pytest.approx(0.1 / math.sqrt(3))
        and r["S"] == 3
    )
    half = ablations.t_critical(0.05, 2) * 0.1 / math.sqrt(3)
    assert (r["lo"], r["hi"]) == pytest.approx((0.2 - half, 0.2 + half))
    assert (
        r["p"] == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(2 + 12))
        and ablations.verdict(r) == "within noise"
    )
    # d_s = 0.19, 0.20, 0.21: t = 34.6, p = 8e-4 < 0.05/17: held, and held under Bonferroni too
    r = ablations.paired([([d] * 4, [0] * 4) for d in (0.19, 0.20, 0.21)])
    assert ablations.verdict(r) == "held" and ablations.verdict(r, 17) == "held (also at α/17)"
    r = ablations.paired([([0] * 4, [d] * 4) for d in (0.15, 0.20, 0.25)])  # t = -6.9, p = 0.02
    assert ablations.verdict(r) == "reversed" and ablations.verdict(r, 17) == "reversed"
    # the seeds are the unit: the spread of the tasks within a seed does not enter
    r = ablations.paired([([1, 0, 1, 0], [0, 0, 0, 0])] * 3)
    assert (
        r["D"] == pytest.approx(0.5)
        and r["SE"] == 0
        and r["p"] == 0.0
        and ablations.verdict(r) == "held"
    )


def three_seeds(root):
    """metaagent's Designer gains 20 points of suited more than flat8's on every seed (+ 1 point a
    seed: held), flat16's scatters around metaagent's (within noise); single has one seed; the
    Executors gain alike; sampled accuracy: metaagent 3/4 vs flat8 1/4 on every seed, from the same
    1/4."""
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


def test_report_tables_sentences(tmp_path):
    three_seeds(tmp_path)
    write_run(tmp_path, "flat8", 3, [0.9] * 4, table=False)  # still running: 4 steps so far
    # trained, final table not written yet
    write_run(tmp_path, "coupled", 0, [0.5] * 10, table=False)
    md = Path(ablations.report(str(tmp_path))).read_text()
    # metaagent: suited gains 40, 41, 42 -> +41.00, SE 1/sqrt(3), interval +-4.30 * 0.577 = 2.48
    assert (
        "| metaagent | `M=4 N=2 K=1 steps=10` | 5 + 5 | 3 | +41.00 [+38.52, +43.48] | +5.00 "
        "[+5.00, +5.00] | "
        "+5.00 ± 0.00 | +50.00 ± 0.00 | +0.600 ± 0.000 | ensemble 100% |"
    ) in md
    assert (
        "| single | `M=4 N=2 K=1 steps=5 template=single mode=executor` | 0 + 5 | 1 | +10.00 (1 "
        "seed) |" in md
    )
    sent = next(ln for ln in md.splitlines() if ln.startswith("- metaagent > flat8"))
    assert sent == (
        "- metaagent > flat8 (seeds: 3): suited +21.00 [+18.52, +23.48], held (also at α/17) "
        "(per seed: +20.00, +21.00, +22.00); executor +0.00 [+0.00, +0.00], within noise (per "
        "seed: "
        "+0.00, +0.00, +0.00); secondary: oracle +0.00 ± 0.00, accuracy (sampled) +50.00 ± 0.00, "
        "training-reward change +0.400 ± 0.000."
    )
    sent16 = next(ln for ln in md.splitlines() if ln.startswith("- metaagent > flat16"))
    assert "suited +1.00 [-25.17, +27.17], within noise" in sent16
    assert "- metaagent > single (seeds: 1): executor +5.00 (1 seed), undecided (1 seed);" in md
    assert (
        "**Hierarchical M×N vs flat M×1 (paper Table 3)**: paper hierarchical > flat; here 1 held, "
        "3 within "
        "noise of its 4 primary tests." in md
    )
    assert (
        "**Shared vs separate policies (paper Table 5)**: paper shared >= separate; not yet run"
        in md
    )
    assert (
        "Unfinished, left out: coupled-s0 (10 steps, no final table), flat8-s3 (4 steps, no final "
        "table)." in md
    )
    assert (
        "Missing (seeds 0, 1, 2 of every run): coupled-s0, coupled-s1," in md
        and "single-s1, single-s2." in md
    )
    assert "17 primary tests: by chance alone about 0.85" in md


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
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "metaagent", "flat8", "suited") is None
    assert ablations.measure(results, "metaagent", "flat8", "train_change") is None
    # single-agent GRPO is measured by its single-agent rows, the others by their learned designs
    write_run(
        tmp_path,
        "single",
        0,
        [0.1] * 5,
        correct={"RL: single agent": [1, 1, 1, 1], "SFT: single agent": [1, 0, 0, 0]},
    )
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "single", None, "accuracy")["D"] == pytest.approx(0.75)


def test_report_pairings(tmp_path):
    write_run(
        tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.7, 0.32, 0.3), "SFT": (0.5, 0.3, 0.3)}
    )
    write_run(
        tmp_path, "metaagent", 1, [0.1] * 5, exact={"RL": (0.7, 0.34, 0.3), "SFT": (0.5, 0.3, 0.3)}
    )
    md = Path(ablations.report(str(tmp_path))).read_text()
    # suited depends on the Designer alone, executor on the Executor alone: two paired RL - SFT
    # differences; executor: d_s = 2, 4 points -> SE 1, interval 3 -+ 12.706
    assert "- the Designer (suited): RL − SFT +20.00 [+20.00, +20.00], held (also at α/17)." in md
    assert "- the Executor (executor): RL − SFT +3.00 [-9.71, +15.71], within noise." in md
    assert "the Designer (suited) held (also at α/17), the Executor (executor) within noise." in md


def readme_with_block(path):
    path.write_text("# X\n\n## Results\n\n" + "\n".join(ablations.README_BLOCK) + "\n\nafter\n")
    return path


def test_publish(tmp_path):
    src = tmp_path / "out"
    three_seeds(src)
    (src / "metaagent-s0" / "step_000010" / "model").mkdir(parents=True)  # checkpoints stay behind
    (src / "metaagent-s0" / "train.log").write_text("log")
    (src / "metaagent-s0" / "run.json").write_text(json.dumps({"cmd": ["python", "train.py"]}))
    write_run(src, "flat8", 3, [0.9] * 4, table=False)  # unfinished: not published
    dest = tmp_path / "results"
    (dest / "stale-s0").mkdir(parents=True)  # what dest held is replaced
    readme = readme_with_block(tmp_path / "README.md")
    ablations.publish(str(src), str(dest), str(readme))
    assert sorted(p.name for p in (dest / "metaagent-s0").iterdir()) == [
        "final_table.json",
        "metrics.jsonl",
        "run.json",
    ]
    assert not (dest / "stale-s0").exists() and not (dest / "flat8-s3").exists()
    assert (
        "metaagent > flat8 (seeds: 3): suited +21.00 [+18.52, +23.48], held"
        in (dest / "RESULTS.md").read_text()
    )
    text = readme.read_text()
    assert text.startswith("# X\n\n## Results\n\n" + ablations.README_BLOCK[0]) and text.endswith(
        ablations.README_BLOCK[1] + "\n\nafter\n"
    )
    assert "paper hierarchical > flat; here 1 held, 3 within noise of its 4 primary tests." in text
    ablations.publish(str(src), str(dest), str(readme))  # again: the same README
    assert readme.read_text() == text
    with pytest.raises(SystemExit, match="no finished runs"):
        ablations.publish(str(tmp_path / "nothing"), str(dest), str(readme))
    (tmp_path / "plain.md").write_text("# no block\n")
    with pytest.raises(SystemExit, match="has no Results block"):
        ablations.publish(str(src), str(dest), str(tmp_path / "plain.md"))


def test_committed_results_are_current(tmp_path):
    """results/ablations/RESULTS.md and the README's Results are what `report` makes of the
    committed numbers (run `python tools/ablations.py publish results/ablations` after changing
    either)."""
    import shutil

    src = ROOT / "results" / "ablations"
    dest = tmp_path / "ablations"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("RESULTS.md"))
    results = ablations.collect(str(dest))
    assert {r: sorted(per) for r, per in results.items()} == {
        r: [0, 1, 2] for r in ablations.RUN_NAMES
    }
    ablations.report(str(dest))
    assert (dest / "RESULTS.md").read_text() == (src / "RESULTS.md").read_text()
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(ablations.README_BLOCK[0]), readme.index(ablations.README_BLOCK[1])
    assert readme[start : end + len(ablations.README_BLOCK[1])] == ablations.readme_block(str(dest))


def test_report_errors(tmp_path):
    with pytest.raises(SystemExit, match="no finished"):
        ablations.report(str(tmp_path))
    with pytest.raises(SystemExit, match="usage"):
        ablations.main(["report", str(tmp_path), "--readmee", "x"])


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


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give each job its own"
)
def test_jobs_own_cores_and_wait_for_a_missing_cold_start(tmp_path, monkeypatch):
    sft = tmp_path / "tiny-sft"  # missing: the first run builds it
    monkeypatch.setattr(ablations, "SFT_DIR", str(sft))
    seen, lock, calls = [], threading.Lock(), []
    # the two runs after the cold start meet, so both workers ran one
    meet = threading.Barrier(2, timeout=60)

    def fake_run_one(run, seed, budget, root, cpus, echo):
        existed = sft.exists()
        with lock:
            calls.append(run)
            k = len(calls)
        if k in (2, 3):
            meet.wait()
        sft.mkdir(exist_ok=True)  # what train.py does
        with lock:
            seen.append((run, seed, tuple(cpus), existed, echo))
        return "ok"

    monkeypatch.setattr(ablations, "run_one", fake_run_one)
    rc = ablations.main(
        [
            "--only",
            "metaagent,flat8,flat16",
            "--seeds",
            "0,1",
            "--budget",
            "3",
            "--jobs",
            "2",
            "--root",
            str(tmp_path),
        ]
    )
    assert rc == 0 and len(seen) == 6 and not any(echo for *_, echo in seen)
    assert sum(not existed for *_, existed, _ in seen) == 1  # built once, never twice at once
    cores = {c for *_, c, _, _ in seen}
    assert len(cores) == 2 and all(len(c) == 1 for c in cores) and len({c[0] for c in cores}) == 2
    with pytest.raises(SystemExit, match="this process has"):
        ablations.main(["--jobs", str(len(os.sched_getaffinity(0)) + 1), "--root", str(tmp_path)])


def test_claims_compare_gains_over_each_runs_own_cold_start(tmp_path):
    # separate policies start from a stronger executor cold start: RL - RL would blame the method
    # for it
    write_run(
        tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.8, 0.32, 0.3), "SFT": (0.4, 0.30, 0.3)}
    )
    write_run(
        tmp_path, "separate", 0, [0.1] * 5, exact={"RL": (0.9, 0.61, 0.3), "SFT": (0.7, 0.60, 0.3)}
    )
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "metaagent", "separate", "executor")["D"] == pytest.approx(
        0.01
    )
    assert ablations.measure(results, "metaagent", "separate", "suited")["D"] == pytest.approx(0.2)
    assert (
        "metaagent > separate (seeds: 1): suited +20.00 (1 seed), undecided (1 seed); executor "
        "+1.00 (1 seed)"
        in ablations.claim_sentence("metaagent", "separate", ablations.BOTH, results)
    )
