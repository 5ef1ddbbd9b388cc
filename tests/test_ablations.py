"""ablations.py on small synthetic inputs: no training is launched (launch() is replaced by a recorder).

- the run table builds the right train.py command lines, K scaled to the run length;
- finished runs are skipped, unfinished ones launched with --resume; a different command in an existing
  out_dir stops with a clear message; bad arguments stop with clear messages;
- the report: mean ± std over seeds of the last 20% of steps, the held-out accuracy parsed from train.log,
  the direction sentences (held / within noise / reversed / undecided), a PNG per comparison, pairings.
"""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ablations  # noqa: E402


def write_run(root, run, seed, rewards, acc=None, heldout=None, structure="ensemble"):
    d = Path(root) / f"{run}-s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "metrics.jsonl", "w") as f:
        for i, r in enumerate(rewards):
            f.write(json.dumps({"step": i + 1, "reward/mean": r, "accuracy": acc if acc is not None else r,
                                f"structure/{structure}": 1.0, "time/step": 6.0}) + "\n")
    if heldout is not None:   # the table train.py prints at the end
        (d / "train.log").write_text(
            "step    1 ...\n\ntraining reward (mean of 1 steps): first 0.1 -> last 0.2\n"
            f"{'':24s} {'reward':>7s} {'accuracy':>9s}  structures\n"
            f"{'RL: learned designs':24s} {0.5:7.3f} {heldout:9.1%}  ensemble 60%, single 40%\n"
            f"{'RL: single agent':24s} {0.4:7.3f} {heldout / 2:9.1%}  single 100%\n"
            f"{'SFT: designs':24s} {0.1:7.3f} {0.05:9.1%}  unparsed 90%\n"
            f"{'SFT: single agent':24s} {0.1:7.3f} {0.02:9.1%}  single 100%\n")
    return d


def test_k_scaled_to_run_length():
    assert [ablations.k_scaled(k, 90) for k in (1, 10, 30)] == [1, 10, 30]
    assert [ablations.k_scaled(k, 60) for k in (1, 10, 30)] == [1, 7, 20]
    assert [ablations.k_scaled(k, 2) for k in (1, 10, 30)] == [1, 1, 1]
    table = ablations.runs(60)
    assert table["metaagent"] == {"M": 4, "N": 4, "K": 20}
    assert table["k1"]["K"] == 1 and table["k10"]["K"] == 7
    assert set(table) == set(ablations.RUN_NAMES)
    for c in ablations.COMPARISONS.values():   # every comparison names real runs
        assert set(c["runs"]) <= set(table) and all(a in table and b in table for a, b in c["claims"])


def test_train_command_lines(tmp_path):
    cmd = ablations.train_command("flat16", 1, 60, str(tmp_path), ["--eval_tasks=50"])
    assert cmd[1:3] == ["train.py", "config/tiny.py"]
    args = cmd[3:]
    assert f"--out_dir={tmp_path}/flat16-s1" in args and "--seed=1" in args and "--steps=60" in args
    assert args.index("--M=16") > 0 and "--N=1" in args and "--K=20" in args
    assert args[-2:] == ["--eval_tasks=50", "--progress=False"]
    single = ablations.train_command("single", 0, 30, str(tmp_path))
    assert "--template=single" in single and "--mode=executor" in single
    sep = ablations.train_command("separate", 0, 30, str(tmp_path))
    assert "--policy=separate" in sep and "--executor_init=out/tiny-sft-separate/executor" in sep
    for run in ("coupled", "designer", "executor"):
        assert f"--mode={run}" in ablations.train_command(run, 0, 30, str(tmp_path))
    with pytest.raises(ValueError, match="unknown run"):
        ablations.train_command("nope", 0, 30, str(tmp_path))


def test_finished_runs_skipped_unfinished_resumed(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ablations, "launch", lambda cmd, log: calls.append(cmd) or 0)
    write_run(tmp_path, "metaagent", 0, [0.1, 0.2, 0.3])        # finished (3 of 3 steps)
    write_run(tmp_path, "flat8", 0, [0.1])                      # unfinished: resumed from its checkpoint
    (tmp_path / "flat8-s0" / "step_000001").mkdir()
    rc = ablations.main(["--only", "metaagent,flat8,flat16", "--seeds", "0", "--steps", "3",
                         "--root", str(tmp_path), "--cut", "pairings"])
    assert rc == 0
    launched = [next(a for a in c if a.startswith("--out_dir=")) for c in calls]
    assert launched == [f"--out_dir={tmp_path}/flat8-s0", f"--out_dir={tmp_path}/flat16-s0"]
    assert calls[0][-1] == "--resume" and "--resume" not in calls[1]   # flat16 has no checkpoint yet
    stamp = json.loads((tmp_path / "flat8-s0" / "run.json").read_text())
    assert stamp["cmd"] == calls[0][:-1]
    # the same folder with other settings is refused, not mixed
    with pytest.raises(SystemExit, match="different command"):
        ablations.main(["--only", "flat8", "--seeds", "0", "--steps", "5", "--root", str(tmp_path)])


def test_failed_run_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ablations, "launch", lambda cmd, log: 3)
    rc = ablations.main(["--only", "single", "--seeds", "0", "--steps", "2", "--root", str(tmp_path)])
    assert rc == 1 and "single-s0: failed (rc 3)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--seeds", "0,x"], "--seeds must be a comma list"),
    (["--seeds", "1,1"], "distinct"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--only", "metaagent,bogus"], "unknown run bogus"),
    (["--cut", "hierarchy,nope"], "unknown comparison nope"),
    (["--only", "flat8", "--cut", "hierarchy"], "leave no run"),
    (["--", "eval_tasks=5"], "train.py overrides"),
    (["report"], "usage"),
    (["--pairings-tasks", "0"], "--pairings-tasks must be >= 1"),
])
def test_bad_arguments(argv, msg, tmp_path):
    with pytest.raises(SystemExit, match=msg):
        ablations.main(argv + (["--root", str(tmp_path)] if argv[0] != "report" and "--" not in argv else []))


def test_verdict_rule():
    assert ablations.verdict([0.5, 0.6, 0.7], [0.1, 0.2, 0.3])[0] == "held"          # +0.4 vs sqrt(.02)
    assert ablations.verdict([0.1, 0.2, 0.3], [0.5, 0.6, 0.7])[0] == "reversed"
    assert ablations.verdict([0.1, 0.3, 0.5], [0.1, 0.2, 0.3])[0] == "within noise"
    word, d, s = ablations.verdict([0.5], [0.1])
    assert word.startswith("undecided") and d == pytest.approx(0.4) and s == 0
    assert ablations.verdict([], [0.1])[0] == "missing"


def test_report_tables_sentences_plots(tmp_path):
    # 10 steps: the last 20% is steps 9-10. metaagent ends at 0.5 / 0.6 / 0.7 (mean 0.6, std 0.1),
    # flat8 at 0.1 / 0.2 / 0.3 (held), flat16 at 0.55 / 0.6 / 0.65 (within noise)
    for seed, (m, f8, f16) in enumerate([(0.5, 0.1, 0.55), (0.6, 0.2, 0.6), (0.7, 0.3, 0.65)]):
        write_run(tmp_path, "metaagent", seed, [0.0] * 8 + [m, m], acc=0.25, heldout=0.3 + 0.1 * seed)
        write_run(tmp_path, "flat8", seed, [0.0] * 8 + [f8 - 0.05, f8 + 0.05], acc=0.25, heldout=0.1)
        write_run(tmp_path, "flat16", seed, [0.0] * 8 + [f16, f16], heldout=0.3 + 0.1 * seed, structure="single")
    write_run(tmp_path, "single", 0, [0.2] * 10)                     # one seed, no final table
    part = write_run(tmp_path, "flat8", 3, [0.9] * 4)                 # still running: 4 of its 10 steps
    (part / "run.json").write_text(json.dumps({"cmd": ["python", "train.py", "--steps=10"]}))
    path = ablations.report(str(tmp_path))
    md = Path(path).read_text()
    assert "| metaagent | `M=4 N=4 K=3` | 3 | 0.600 ± 0.100 | +0.600 ± 0.100 | 25.0% ± 0.0% | 40.0% ± 10.0% | +35.0% ± 10.0% | ensemble 100% |" in md
    assert "| flat8 | `M=8 N=1 K=3` | 3 | 0.200 ± 0.100 |" in md and "## All runs" in md
    assert "| 1.0 |" in md                                          # 10 steps x 6 s
    assert "metaagent > flat8: held on training reward (+0.400 vs combined std 0.141)" in md
    assert "held on held-out accuracy (+0.300 vs combined std 0.100)" in md
    assert "held on held-out gain over SFT (+0.300 vs combined std 0.100)" in md
    sent16 = next(ln for ln in md.splitlines() if ln.startswith("- metaagent > flat16"))
    assert "within noise on training reward" in sent16 and "within noise on held-out accuracy" in sent16
    assert "| single | " in md and "0.200 (1 seed) | +0.000 (1 seed) | 20.0% (1 seed) | n/a | n/a |" in md
    assert "undecided (fewer than 2 seeds) on training reward (+0.400" in md
    assert "SFT cold start, held-out accuracy with its own designs: 5.0% ± 0.0%" in md
    assert "Unfinished, left out: flat8-s3 (4/10 steps)." in md and "seeds 0, 1, 2." in md
    assert "Paper: hierarchical M=4xN=4 > flat M=8xN=1" in md and "Not run" in md and "policy" in md
    for name in ("hierarchy", "single_agent"):
        png = tmp_path / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"(plots/{name}.png)" in md
    assert not (tmp_path / "plots" / "policy.png").exists()
    # no pairings yet: the section says how to make them
    assert "--pairings sft=out/tiny-sft" in md


def test_heldout_of_single_run_is_its_single_agent_row(tmp_path):
    d = write_run(tmp_path, "single", 0, [0.1] * 5, heldout=0.4)
    assert ablations.summarize(str(d), "single")["heldout_acc"] == pytest.approx(0.2)
    assert ablations.summarize(str(d), "metaagent")["heldout_acc"] == pytest.approx(0.4)
    # the gain is paired with the run's own SFT row: single agent vs single agent, designs vs designs
    assert ablations.summarize(str(d), "single")["heldout_gain"] == pytest.approx(0.2 - 0.02)
    assert ablations.summarize(str(d), "metaagent")["heldout_gain"] == pytest.approx(0.4 - 0.05)
    rows = ablations.final_table(str(d / "train.log"))
    assert set(rows) == {"RL: learned designs", "RL: single agent", "SFT: designs", "SFT: single agent"}
    assert rows["RL: learned designs"]["structures"] == "ensemble 60%, single 40%"


def test_report_pairings(tmp_path):
    write_run(tmp_path, "metaagent", 0, [0.1] * 5)
    write_run(tmp_path, "metaagent", 1, [0.1] * 5)
    for seed, (ss, sr, rs, rr) in enumerate([(0.1, 0.3, 0.2, 0.4), (0.1, 0.3, 0.1, 0.5)]):
        d = tmp_path / f"pairings-s{seed}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps(
            {"pairings": {"sft/sft": {"tiny": ss}, "sft/rl": {"tiny": sr}, "rl/sft": {"tiny": rs},
                          "rl/rl": {"tiny": rr}}}))
    md = Path(ablations.report(str(tmp_path))).read_text()
    assert "| SFT | 10.0% ± 0.0% | 30.0% ± 0.0% |" in md
    assert "| RL | 15.0% ± 7.1% | 45.0% ± 7.1% |" in md
    assert f"- executor improved (sft/rl > sft/sft in held-out pass@1): held (+0.200 vs combined std {0:.3f})." in md
    s = math.sqrt(0.005)
    assert f"- designer improved (rl/sft > sft/sft in held-out pass@1): within noise (+0.050 vs combined std {s:.3f})." in md


def test_pairings_command(tmp_path):
    (tmp_path / "metaagent-s2" / "step_000010" / "model").mkdir(parents=True)
    (tmp_path / "metaagent-s2" / "step_000020" / "model").mkdir(parents=True)
    cmd = ablations.pairings_command(str(tmp_path), 2, n_tasks=7)
    assert cmd[1] == "evaluate.py" and cmd[3:5] == ["sft=out/tiny-sft", f"rl={tmp_path}/metaagent-s2/step_000020/model"]
    assert " --tasks tiny --n-tiny 7 --mode auto --short-prompt " in " ".join(cmd)
    assert cmd[-2:] == ["--out", f"{tmp_path}/pairings-s2"] and "--seed 2" in " ".join(cmd)


def test_report_errors(tmp_path):
    with pytest.raises(SystemExit, match="no <run>-s<seed>/metrics.jsonl"):
        ablations.report(str(tmp_path))


def test_final_table_json_is_preferred_to_the_log(tmp_path):
    d = write_run(tmp_path, "metaagent", 0, [0.1] * 5, heldout=0.4)
    rows = {"RL: learned designs": {"reward": 0.5, "accuracy": 0.25, "structures": "tester 100%"}}
    (d / "final_table.json").write_text(json.dumps({"tasks": 4, "rows": rows}))
    assert ablations.final_table(str(d / "train.log")) == rows
    assert ablations.summarize(str(d), "metaagent")["heldout_acc"] == pytest.approx(0.25)
    (d / "final_table.json").write_text("{half")                   # unreadable: the log still counts
    assert ablations.final_table(str(d / "train.log"))["RL: learned designs"]["accuracy"] == pytest.approx(0.4)
