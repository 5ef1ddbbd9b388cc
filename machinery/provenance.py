"""provenance.py: what made a thing: the commit of the work tree it was made from, whether that tree
had uncommitted changes, and when; and, read back, whether a commit comes at or after another.

A train.py run records it in out_dir/run.json, one entry a start (machinery/rundir.py); a set's
cold start in its build.json (tools/ablations.py), whose report (tools/ablation_report.py) counts a
run only when each of its records names the pre-registration commit or a later one, from a clean
tree. Use:

    git_state()                    # {"commit": "<sha>" or None, "dirty": False, True or None}
    time.strftime(CLOCK)           # "2026-12-03T14:48:08+0000": a record's start and end
    is_after(prereg, commit)       # True: commit is prereg or a descendant; False: not;
                                   # None: git cannot tell (no git, no repository, unknown commit)
    file_at(prereg, "tools/ablations.py")   # that file's text at that commit, or None

"dirty" is about tracked files only (git status --untracked-files=no): a run's own outputs beside
the code do not make its tree dirty. Without git, or outside a repository, commit and dirty are
None, which a check reads as unknown, never as clean. Each answer is one git call in `repo` (the
project's root unless given); the module imports nothing but the standard library (no torch), so a
tool that only launches programs can use it.

Needs: no other file (git on the PATH: without it every answer is None)
"""

import os
import subprocess

# the project's root, whose history the answers come from
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOCK = "%Y-%m-%dT%H:%M:%S%z"  # a record's clock times (time.strftime, datetime.strptime)


def git(args, repo=REPO):
    """git's finished process for `git -C repo ARGS` (text output), or None when git cannot run."""
    try:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    except OSError:
        return None


def git_state(repo=REPO):
    """{"commit": HEAD's 40 hex digits, "dirty": whether a tracked file differs from it}; both None
    when git cannot tell (no git, not a repository, no commit yet)."""
    head = git(["rev-parse", "HEAD"], repo)
    if head is None or head.returncode != 0:
        return {"commit": None, "dirty": None}
    changes = git(["status", "--porcelain", "--untracked-files=no"], repo)
    dirty = None if changes is None or changes.returncode != 0 else bool(changes.stdout.strip())
    return {"commit": head.stdout.strip(), "dirty": dirty}


def is_after(ancestor, commit, repo=REPO):
    """True when commit is ancestor or one of its descendants (git merge-base --is-ancestor: rc 0
    yes, 1 no); None when git cannot tell (no git, not a repository, a commit it does not know)."""
    p = git(["merge-base", "--is-ancestor", ancestor, commit], repo)
    return None if p is None else {0: True, 1: False}.get(p.returncode)


def file_at(commit, path, repo=REPO):
    """The text of `path` (relative to the repository's root) as `commit` holds it, or None when
    git cannot show it."""
    p = git(["show", f"{commit}:{path}"], repo)
    return p.stdout if p is not None and p.returncode == 0 else None
