"""machinery/provenance.py on a small git repository of two commits: the commit and dirty state of a
work tree (untracked files do not count, outside a repository both are None), whether a commit
comes at or after another, a file as a commit holds it; and run.json as rundir.provenance writes it
with them, a start and its end.
"""

import dataclasses
import json
import subprocess
import time
from datetime import datetime

from machinery import provenance

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def repo_with_two_commits(path):
    """A repository whose file f holds "0" then "1"; returns (older, newer)."""
    path.mkdir()
    subprocess.run([*GIT, "-C", str(path), "init", "-q"], check=True)
    commits = []
    for k in range(2):
        (path / "f").write_text(str(k))
        subprocess.run([*GIT, "-C", str(path), "add", "f"], check=True)
        subprocess.run([*GIT, "-C", str(path), "commit", "-q", "-m", str(k)], check=True)
        commits.append(provenance.git_state(str(path))["commit"])
    return commits


def test_git_state_and_the_history(tmp_path):
    repo = tmp_path / "repo"
    older, newer = repo_with_two_commits(repo)
    assert len(older) == 40 and older != newer
    assert provenance.git_state(str(repo)) == {"commit": newer, "dirty": False}
    (repo / "out.log").write_text("a run's output")  # untracked: still clean
    assert provenance.git_state(str(repo))["dirty"] is False
    (repo / "f").write_text("changed")  # a tracked file: dirty
    assert provenance.git_state(str(repo)) == {"commit": newer, "dirty": True}
    # outside a repository git cannot tell: unknown, never clean
    (tmp_path / "plain").mkdir()
    assert provenance.git_state(str(tmp_path / "plain")) == {"commit": None, "dirty": None}
    assert provenance.is_after(older, newer, str(repo)) is True
    assert provenance.is_after(newer, newer, str(repo)) is True
    assert provenance.is_after(newer, older, str(repo)) is False
    assert provenance.is_after(older, "f" * 40, str(repo)) is None  # a commit it does not know
    assert provenance.is_after(older, newer, str(tmp_path / "plain")) is None
    assert provenance.file_at(older, "f", str(repo)) == "0"
    assert provenance.file_at(newer, "f", str(repo)) == "1"
    assert provenance.file_at(newer, "nothing", str(repo)) is None
    # the project's own checkout (the tests run in it)
    head = subprocess.run(["git", "-C", provenance.REPO, "rev-parse", "HEAD"], capture_output=True)
    assert provenance.git_state()["commit"] == (head.stdout.decode().strip() or None)


def test_run_json_records_each_start(tmp_path):
    from machinery import rundir  # torch: only here

    @dataclasses.dataclass
    class Cfg:
        out_dir: str
        seed: int = 0

    cfg = Cfg(str(tmp_path))
    rundir.provenance(cfg, ["--seed=0"])
    rundir.provenance(cfg, ["--seed=0"], end=True)
    rundir.provenance(cfg, ["--seed=0", "--resume"])  # a resume adds a start
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["config"] == {"out_dir": str(tmp_path), "seed": 0}
    first, second = info["starts"]
    assert {k: first[k] for k in ("commit", "dirty")} == provenance.git_state()
    assert first["command"][-1] == "--seed=0" and second["command"][-1] == "--resume"
    assert second["end"] is None and first["machine"]["cores"] >= 1
    start, end = (datetime.strptime(first[k], provenance.CLOCK) for k in ("start", "end"))
    assert 0 <= (end - start).total_seconds() < 60
    assert abs(time.time() - end.timestamp()) < 60
