"""ablations.py on small synthetic inputs: no training is launched (launch() is replaced by a recorder).

- the run table builds the right train.py command lines, K scaled to the run length;
- finished runs are skipped, unfinished ones launched with --resume; a different command in an existing
  out_dir stops with a clear message; bad arguments stop with clear messages;
- runs needing a missing cold start wait for the one that builds it; --jobs pins each run to its own cores;
- the report: the one rule for differences (paired by seed and task, beyond noise past 2 SE), the run table
  from final_table.json's per-task vectors, the claim sentences, the exact pairings, publish, and that the
  committed results/ablations/RESULTS.md is what the report makes of the committed numbers.
"""

import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ablations  # noqa: E402


def write_run(root, run, seed, rewards, structure="ensemble", exact=None, correct=None, n=4, table=True):
    """A run folder as train.py leaves it: metrics.jsonl and final_table.json with per-task vectors on n tasks.
    exact = {"RL"/"SFT": (suited, oracle)} gives every task those probabilities; correct = {row: [0/1] * n}."""
    d = Path(root) / f"{run}-s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "metrics.jsonl", "w") as f:
        for i, r in enumerate(rewards):
            f.write(json.dumps({"step": i + 1, "reward/mean": r, "accuracy": r,
                                f"structure/{structure}": 1.0, "time/step": 6.0}) + "\n")
    if table:
        exact = exact or {"RL": (0.5, 0.3), "SFT": (0.4, 0.3)}
        rows = ("RL: learned designs", "RL: single agent", "SFT: designs", "SFT: single agent")
        correct = {**{r: [0.0] * n for r in rows}, **(correct or {})}
        per = {who: {"suited": [su] * n, "oracle": [orc] * n,
                     "choice": {"single": [0.1] * n, "ensemble": [su] * n, "critic": [0.0] * n, "tester": [su] * n}}
               for who, (su, orc) in exact.items()}
        (d / "final_table.json").write_text(json.dumps({
            "tasks": n, "ids": [f"t{seed}-{k}" for k in range(n)], "kinds": ["math", "code"] * (n // 2),
            "per_task": {"correct": correct, "exact": per}}))
    return d


def test_k_scaled_to_run_length():
    assert [ablations.k_scaled(k, 90) for k in (1, 10, 30)] == [1, 10, 30]
    assert [ablations.k_scaled(k, 60) for k in (1, 10, 30)] == [1, 7, 20]
    assert [ablations.k_scaled(k, 2) for k in (1, 10, 30)] == [1, 1, 1]
    table = ablations.runs(60)
    assert table["metaagent"] == {"M": 4, "N": 4, "K": 20}
    assert table["k1"]["K"] == 1 and table["k10"]["K"] == 7
    assert set(table) == set(ablations.RUN_NAMES)
    for _, claims, _, _ in ablations.COMPARISONS.values():   # every comparison names real runs
        assert claims and all(a in table and b in table for a, b in claims)


def test_train_command_lines(tmp_path):
    cmd = ablations.train_command("flat16", 1, 60, str(tmp_path))
    assert cmd[1:3] == ["train.py", "config/tiny.py"]
    args = cmd[3:]
    assert f"--out_dir={tmp_path}/flat16-s1" in args and "--seed=1" in args and "--steps=60" in args
    assert args.index("--M=16") > 0 and "--N=1" in args and "--K=20" in args
    single = ablations.train_command("single", 0, 30, str(tmp_path))
    assert "--template=single" in single and "--mode=executor" in single
    sep = ablations.train_command("separate", 0, 30, str(tmp_path))
    assert "--policy=separate" in sep and "--init_from=out/tiny-sft-separate" in sep
    for run in ("coupled", "designer", "executor"):
        assert f"--mode={run}" in ablations.train_command(run, 0, 30, str(tmp_path))
    with pytest.raises(KeyError):
        ablations.train_command("nope", 0, 30, str(tmp_path))


def test_finished_runs_skipped_unfinished_resumed(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: calls.append(cmd) or 0)
    write_run(tmp_path, "metaagent", 0, [0.1, 0.2, 0.3])        # finished (3 of 3 steps)
    write_run(tmp_path, "flat8", 0, [0.1])                      # unfinished: resumed from its checkpoint
    (tmp_path / "flat8-s0" / "step_000001").mkdir()
    rc = ablations.main(["--only", "metaagent,flat8,flat16", "--seeds", "0", "--steps", "3",
                         "--root", str(tmp_path)])
    assert rc == 0
    launched = [next(a for a in c if a.startswith("--out_dir=")) for c in calls]
    assert launched == [f"--out_dir={tmp_path}/flat8-s0", f"--out_dir={tmp_path}/flat16-s0"]
    assert calls[0][-1] == "--resume" and "--resume" not in calls[1]   # flat16 has no checkpoint yet
    stamp = json.loads((tmp_path / "flat8-s0" / "run.json").read_text())
    assert stamp["cmd"] == calls[0][:-1]
    # the same folder with other settings is refused, not mixed
    capsys.readouterr()
    assert ablations.main(["--only", "flat8", "--seeds", "0", "--steps", "5", "--root", str(tmp_path)]) == 1
    assert "flat8-s0: failed (ablations.py:" in capsys.readouterr().out and len(calls) == 2


def test_failed_run_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ablations, "launch", lambda cmd, log, *rest: 3)
    rc = ablations.main(["--only", "single", "--seeds", "0", "--steps", "2", "--root", str(tmp_path)])
    assert rc == 1 and "single-s0: failed (rc 3)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--seeds", "0,x"], "--seeds must be a comma list"),
    (["--seeds", "1,1"], "distinct"),
    (["--steps", "0"], "--steps and --jobs must be >= 1"),
    (["--jobs", "0"], "--steps and --jobs must be >= 1"),
    (["--only", "metaagent,bogus"], "unknown run bogus"),
    (["report"], "usage"),
    (["publish", "a", "b"], "usage"),
])
def test_bad_arguments(argv, msg, tmp_path):
    with pytest.raises(SystemExit, match=msg):
        ablations.main(argv + (["--root", str(tmp_path)] if argv[0] not in ("report", "publish") else []))


def test_paired_rule():
    D, SE, S = ablations.paired([([1, 0, 1, 0], [0, 0, 0, 0])])          # one seed: the task-paired error
    assert (D, S) == (0.5, 1) and SE == pytest.approx(math.sqrt(1 / 3 / 4))
    # seeds that disagree: the seed-to-seed spread decides
    D, SE, S = ablations.paired([([d] * 4, [0] * 4) for d in (0.1, 0.2, 0.3)])
    assert D == pytest.approx(0.2) and SE == pytest.approx(0.1 / math.sqrt(3)) and S == 3
    # seeds that agree exactly cannot make it sharper than its tasks allow
    D, SE, S = ablations.paired([([1, 0, 1, 0], [0, 0, 0, 0])] * 3)
    assert D == pytest.approx(0.5) and SE == pytest.approx(math.sqrt(3 * (1 / 12)) / 3)
    assert ablations.paired([]) == (None, None, 0)
    assert ablations.verdict(0.5, 0.2, 3) == "held" and ablations.verdict(-0.5, 0.2, 3) == "reversed"
    assert ablations.verdict(0.3, 0.2, 2) == "within noise" and ablations.verdict(None, None, 0) == "missing"
    assert ablations.verdict(0.5, 0.01, 1) == "undecided (1 seed)"    # the run's own randomness unmeasured


def three_seeds(root):
    """metaagent beats flat8 by 20 points of P(suited) on every seed (held), flat16 scatters around it (within
    noise); single has one seed; sampled accuracy: metaagent 3/4 vs flat8 1/4 on every seed."""
    for seed in range(3):
        write_run(root, "metaagent", seed, [0.0] * 8 + [0.6, 0.6], exact={"RL": (0.8 + 0.01 * seed, 0.35),
                  "SFT": (0.4, 0.3)}, correct={"RL: learned designs": [1, 1, 1, 0], "SFT: designs": [1, 0, 0, 0]})
        write_run(root, "flat8", seed, [0.0] * 8 + [0.2, 0.2], exact={"RL": (0.6 + 0.01 * seed, 0.35),
                  "SFT": (0.4, 0.3)}, correct={"RL: learned designs": [1, 0, 0, 0], "SFT: designs": [1, 0, 0, 0]})
        write_run(root, "flat16", seed, [0.0] * 10, structure="single",
                  exact={"RL": (0.8 + (0.1, -0.1, 0.0)[seed], 0.35), "SFT": (0.4, 0.3)})
    write_run(root, "single", 0, [0.2] * 10, correct={"RL: single agent": [1, 1, 0, 0]})


def test_report_tables_sentences(tmp_path):
    three_seeds(tmp_path)
    write_run(tmp_path, "flat8", 3, [0.9] * 4, table=False)           # still running: 4 steps so far
    write_run(tmp_path, "coupled", 0, [0.5] * 10, table=False)        # trained, final table not written yet
    md = Path(ablations.report(str(tmp_path))).read_text()
    # metaagent: P(suited) 81.0% (mean of 80, 81, 82), RL - SFT +41.0 with the seeds' spread as its error
    se = 100 * 0.01 / math.sqrt(3)
    assert (f"| metaagent | `M=4 N=4 K=3` | 3 | 81.0% | +41.0 ± {se:.1f} | 35.0% | +5.0 ± 0.0 | 75.0% | "
            "+50.0 ± 16.7 | 0.600 | +0.600 | ensemble 100% |") in md
    assert "| single | `M=4 N=4 K=3 template=single mode=executor` | 1 | 50.0% | +10.0 ± 0.0 (1 seed) |" in md
    sent = next(ln for ln in md.splitlines() if ln.startswith("- metaagent > flat8"))
    assert sent == ("- metaagent > flat8 (seeds: 3): P(suited template) +20.0 ± 0.0, held; P(oracle reply) "
                    "+0.0 ± 0.0, within noise; held-out accuracy (sampled) +50.0 ± 16.7, held; training reward "
                    "+0.400 ± 0.000, held.")
    sent16 = next(ln for ln in md.splitlines() if ln.startswith("- metaagent > flat16"))
    assert "P(suited template) +1.0 ± 6.1, within noise" in sent16
    assert "- metaagent > single (seeds: 1): P(suited template) +30.0 ± 0.0 (1 seed), undecided (1 seed);" in md
    assert "Unfinished, left out: coupled-s0 (10 steps, no final table), flat8-s3 (4 steps, no final table)." in md
    assert "Not yet run" in md and "policy (needs separate)" in md and "schedule (needs coupled, designer, executor)" in md
    assert "## Hierarchical 4x4 vs flat (paper Table 3)" in md and "## Shared vs separate" not in md


def test_runs_on_other_tasks_are_not_paired(tmp_path):
    write_run(tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.9, 0.3), "SFT": (0.4, 0.3)})
    d = write_run(tmp_path, "flat8", 0, [0.1] * 5, exact={"RL": (0.1, 0.3), "SFT": (0.4, 0.3)})
    t = json.loads((d / "final_table.json").read_text())
    t["ids"] = [i + "x" for i in t["ids"]]                        # another seed's tasks, say
    (d / "final_table.json").write_text(json.dumps(t))
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "metaagent", "flat8", "suited") == (None, None, 0)
    assert ablations.measure(results, "metaagent", "flat8", "train_reward")[0] == 0.0   # the curves still pair
    # single-agent GRPO is measured by its single-agent rows, the others by their learned designs
    write_run(tmp_path, "single", 0, [0.1] * 5, correct={"RL: single agent": [1, 1, 1, 1], "SFT: single agent": [1, 0, 0, 0]})
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "single", "single", "accuracy", "RL", "SFT")[0] == pytest.approx(0.75)


def test_report_pairings(tmp_path):
    write_run(tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.7, 0.32), "SFT": (0.5, 0.3)})
    write_run(tmp_path, "metaagent", 1, [0.1] * 5, exact={"RL": (0.7, 0.34), "SFT": (0.5, 0.3)})
    md = Path(ablations.report(str(tmp_path))).read_text()
    # P(suited) depends on the Designer alone, P(oracle) on the Executor alone: two paired RL - SFT differences
    assert "- the Designer (P(suited template)): SFT 50.0%, RL 70.0%, RL − SFT +20.0 ± 0.0, held." in md
    assert "- the Executor (P(oracle reply)): SFT 30.0%, RL 33.0%, RL − SFT +3.0 ± 1.0, held." in md


def test_publish(tmp_path):
    src = tmp_path / "out"
    three_seeds(src)
    (src / "metaagent-s0" / "step_000010" / "model").mkdir(parents=True)    # checkpoints stay behind
    (src / "metaagent-s0" / "train.log").write_text("log")
    (src / "metaagent-s0" / "run.json").write_text(json.dumps({"cmd": ["python", "train.py"]}))
    write_run(src, "flat8", 3, [0.9] * 4, table=False)                      # unfinished: not published
    dest = tmp_path / "results"
    (dest / "stale-s0").mkdir(parents=True)                                 # what dest held is replaced
    ablations.publish(str(src), str(dest))
    assert sorted(p.name for p in (dest / "metaagent-s0").iterdir()) == ["final_table.json", "metrics.jsonl",
                                                                          "run.json"]
    assert not (dest / "stale-s0").exists() and not (dest / "flat8-s3").exists()
    assert "metaagent > flat8 (seeds: 3): P(suited template) +20.0 ± 0.0, held" in (dest / "RESULTS.md").read_text()
    with pytest.raises(SystemExit, match="no finished runs"):
        ablations.publish(str(tmp_path / "nothing"), str(dest))


def test_committed_results_are_current(tmp_path):
    """results/ablations/RESULTS.md is what `report` makes of the committed numbers (run `python ablations.py
    report results/ablations` after changing either)."""
    import shutil
    src = ROOT / "results" / "ablations"
    dest = tmp_path / "ablations"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("RESULTS.md"))
    assert len(ablations.collect(str(dest))) == len(ablations.RUN_NAMES)   # every run has its numbers
    ablations.report(str(dest))
    assert (dest / "RESULTS.md").read_text() == (src / "RESULTS.md").read_text()


def test_report_errors(tmp_path):
    with pytest.raises(SystemExit, match="no finished"):
        ablations.report(str(tmp_path))
    with pytest.raises(SystemExit, match="usage"):
        ablations.main(["report", str(tmp_path), "--readmee", "x"])


def test_launch_pins_cores(tmp_path):
    log = tmp_path / "log"
    rc = ablations.launch([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], str(log),
                          cpus=[0], echo=False)
    assert rc == 0 and log.read_text().splitlines()[-1] == "[0]"
    assert log.read_text().startswith(f"$ {sys.executable} -c")          # the log records the command itself


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to give each job its own")
def test_jobs_own_cores_and_wait_for_a_missing_cold_start(tmp_path, monkeypatch):
    sft = tmp_path / "tiny-sft"                                       # missing: the first run builds it
    monkeypatch.setattr(ablations, "SFT_DIR", str(sft))
    seen, lock, calls = [], threading.Lock(), []
    meet = threading.Barrier(2, timeout=60)   # the two runs after the cold start meet, so both workers ran one

    def fake_run_one(run, seed, steps, root, cpus, echo):
        existed = sft.exists()
        with lock:
            calls.append(run)
            k = len(calls)
        if k in (2, 3):
            meet.wait()
        sft.mkdir(exist_ok=True)                                      # what train.py does
        with lock:
            seen.append((run, seed, tuple(cpus), existed, echo))
        return "ok"
    monkeypatch.setattr(ablations, "run_one", fake_run_one)
    rc = ablations.main(["--only", "metaagent,flat8,flat16", "--seeds", "0,1", "--steps", "3", "--jobs", "2",
                         "--root", str(tmp_path)])
    assert rc == 0 and len(seen) == 6 and not any(echo for *_, echo in seen)
    assert sum(not existed for *_, existed, _ in seen) == 1          # built once, never twice at once
    cores = {c for *_, c, _, _ in seen}
    assert len(cores) == 2 and all(len(c) == 1 for c in cores) and len({c[0] for c in cores}) == 2
    with pytest.raises(SystemExit, match="this process has"):
        ablations.main(["--jobs", str(len(os.sched_getaffinity(0)) + 1), "--root", str(tmp_path)])


def test_claims_compare_gains_over_each_runs_own_cold_start(tmp_path):
    # separate policies start from a stronger executor cold start: RL - RL would blame the method for it
    write_run(tmp_path, "metaagent", 0, [0.1] * 5, exact={"RL": (0.8, 0.32), "SFT": (0.4, 0.30)})
    write_run(tmp_path, "separate", 0, [0.1] * 5, exact={"RL": (0.9, 0.61), "SFT": (0.7, 0.60)})
    results = ablations.collect(str(tmp_path))
    assert ablations.measure(results, "metaagent", "separate", "oracle")[0] == pytest.approx(-0.29)
    assert ablations.measure(results, "metaagent", "separate", "oracle", "gain", "gain")[0] == pytest.approx(0.01)
    assert "metaagent > separate (seeds: 1): P(suited template) +20.0 ± 0.0 (1 seed)" in \
        ablations.claim_sentence("metaagent", "separate", results)
