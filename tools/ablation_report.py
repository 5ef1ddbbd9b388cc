"""ablation_report.py: judging a set of runs. From the folder a pre-registered set's runs went to
(tools/ablations.py runs them) it reads each run's numbers, judges the set's comparisons by one
rule, counts only the runs whose provenance passes, and writes ROOT/RESULTS.md.

Every measure is a gain: the RL model minus the run's own cold start on the same held-out tasks,
per task (the unregistered comparisons also set the levels side by side: summarize()'s "level").
A comparison of SET is A's gain minus B's (or A's against 0), paired by seed and task
(paired()), and one rule judges it (verdict()): held or reversed when the 95% t interval over the
seeds excludes 0, equivalent when the 90% interval lies inside PLAN's margin (TOST), else
inconclusive with the power the test had; "interim" while fewer seeds than PLAN's are in. A run
counts only when its provenance passes: every start in its run.json and its cold start's
build.json at or after the commit in ROOT/PREREGISTERED, from a clean tree; the report says
whether PLAN is that commit's; beside each verdict, the dose of its arms (dose(): the repair
samples they trained); then SET's unregistered comparisons, with intervals and no verdict. Then a
table of every arm's gains, without verdicts. Read with `fixed`, a folder of tables made again
(issue #56's: results/retable56), a run's table comes from there where it has one
(RESULTS_fixed.md), and each row names the registered tables it falls back on. The sets before the
current one keep their reports as written: issue #45's (this rule, its own SET) in
results/ablations45/RESULTS.md, issue #34's (an older rule: held, reversed, else "within noise") in
results/ablations34/RESULTS.md.

From the command line: `python tools/ablations.py report ROOT` (--split val: RESULTS_val.md), and
its publish and power, which judge with this file too. In Python:

    from tools import ablation_report, ablations
    ablation_report.report(ablations, "out/ablations")      # out/ablations/RESULTS.md
    results, prov = ablation_report.counted(ablations, "out/ablations")
    r = ablation_report.measure(results, "metaagent", "single", "repair_own")   # paired()'s
    ablation_report.verdict(r, 0.0095)     # "held", "reversed", "equivalent within ±0.95", ...

`the_set` is the module that defines the set, tools/ablations.py, passed in rather than imported
(the runner imports this file: an import back would be a cycle). The report reads its arms table
(runs(), RUN_NAMES, own_start(), updates()), SET (the arms, the comparisons, the report's words),
PLAN (the margins and planned seeds, and the PLAN block of the module's file, which the
pre-registration commit must hold) and sft_command() (the command a seed's cold start must have
been built by). No torch: the standard library and git.
(tests/test_ablations.py checks that the committed results/ablations/RESULTS.md and the README's
Results are what the report makes of the committed numbers.)

Needs: machinery/provenance.py (git on the PATH for the provenance check)
"""

import json
import math
import os
import re

from machinery.provenance import file_at, git_state, is_after

# the project root: the pre-registration check reads the set's file relative to it
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# world/tiny.py's SUITED: the template each kind's tasks are suited to (no torch imported here)
SUITED = {"math": "ensemble", "code": "tester"}
TAIL = 0.2  # the last 20% of steps summarise a run


# --------------------------------------------------------------------------------------------------
# a set's folder: what the runner (tools/ablations.py) writes there, read back. ROOT/<arm>-s<seed>/
# holds a run (metrics.jsonl, its final tables, train.py's run.json, the runner's ablations.json),
# ROOT/sft-s<seed>/ a seed's cold start (its build.json) and ROOT/PREREGISTERED the commit


def out_dir(root, run, seed):
    """Arm `run`'s run of seed s: ROOT/<run>-s<seed>."""
    return os.path.join(root, f"{run}-s{seed}")


def cold_start(root, seed, separate=False):
    """Seed s's own SFT cold start: ROOT/sft-s{s}, or its separate one (a Designer and an Executor
    model, for the arms of two policies) ROOT/sft-separate-s{s}."""
    return os.path.join(root, f"sft-separate-s{seed}" if separate else f"sft-s{seed}")


def table_name(split):
    """The final table a split's run is judged by: train.py's final_table.json (eval), or
    final_table_{split}.json (world/final_table.py --split)."""
    return "final_table.json" if split == "eval" else f"final_table_{split}.json"


def shown(path):
    """A path as a report writes it: relative to the project's root when inside it."""
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel


def fixed_table(fixed, name):
    """The eval table of run folder `name` made again (at a later commit, from the run's own
    checkpoint: `python world/final_table.py RUN`) and kept in the folder `fixed` as
    <name>-<commit>.json; None when `fixed` is None or holds none for it. Issue #56's set keeps
    them in results/retable56: its registered tables ran under a sandbox that timed out right
    programs under load (docs/NOTES.md)."""
    if not fixed or not os.path.isdir(fixed):
        return None
    found = [f for f in os.listdir(fixed) if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]+\.json", f)]
    if len(found) > 1:
        raise SystemExit(f"ablation_report: {fixed} holds {len(found)} tables of {name}: {found}")
    return os.path.join(fixed, found[0]) if found else None


def read_metrics(run_dir):
    """A run's metrics.jsonl lines after step 0, or [] without the file."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    # (a step-0 line holds the held-out curve's start alone)
    return [r for r in rows if r["step"] > 0]


def read_json(path):
    """The JSON in path, or None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


STAMP = "ablations.json"  # in a run folder: {"cmd": the train.py command the runner ran}


def cpus(run_dir):
    """The CPUs a run's starts ran on (train.py's run.json: each start's machine), sorted; []
    without a record."""
    starts = (read_json(os.path.join(run_dir, "run.json")) or {}).get("starts") or []
    return sorted({(st.get("machine") or {}).get("cpu", "?") for st in starts})


def run_cmd(run_dir):
    """The train.py command the runner ran in run_dir, or None."""
    return (read_json(os.path.join(run_dir, STAMP)) or {}).get("cmd")


# --------------------------------------------------------------------------------------------------
# a run's numbers


# the exact rows a final table may hold per task (older tables hold the first three)
EXACT_KEYS = (
    "suited",
    "executor",
    "oracle",
    "executor_answer",
    "executor_steps",
    "repair",
    "repair_own",
    "copy",
    "copy_own",
)


def task_gain(rl, sft):
    """RL − SFT per task; None where either is None (the context does not occur for that task)."""
    return [None if r is None or c is None else r - c for r, c in zip(rl, sft, strict=True)]


def prior(choice, kinds):
    """The cold start's prior over templates per kind of task, from its exact P(template) per task
    (choice = {template: [P per task]}): {kind: {template: mean over the kind's tasks}}. None
    without them."""
    if not choice or not kinds:
        return None
    out = {}
    for kind in sorted(set(kinds)):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        out[kind] = {t: sum(p[i] for i in idx) / len(idx) for t, p in sorted(choice.items())}
    return out


def seed_prior(the_set, results, seed):
    """Seed s's cold start's prior(), from the first arm of the seed whose table has it, of the
    arms that start from the seed's own cold start; None when none has it."""
    for a in the_set.RUN_NAMES:
        shared = the_set.own_start(a) and not the_set.separate_start(a)
        if shared and seed in results.get(a, {}) and results[a][seed]["prior"]:
            return results[a][seed]["prior"]
    return None


def most_likely(ps):
    """The template a prior's {template: P} puts most on (ties: the first by name)."""
    return max(sorted(ps), key=ps.get)


def dose(rows):
    """A run's dose of the habit's lesson, from its metrics lines (machinery/recorder.py's
    repair_metrics): {"repairs": the repair samples its updates trained (repair/trained summed over
    the steps), "adv": their mean advantage, "copy": their copy rate (both weighted by each step's
    trained repairs; None without any), "samples": the Executor samples an Executor update (the
    mean of samples/executor over the steps that trained the Executor; None without one)}; None
    for a run whose lines have no repair/trained (one older than issue #56)."""
    if not any("repair/trained" in r for r in rows):
        return None
    n = sum(r.get("repair/trained", 0) for r in rows)
    adv = copy = None
    if n:
        adv = sum(r.get("repair/trained", 0) * r.get("repair/adv_mean", 0.0) for r in rows) / n
        copy = sum(r.get("repair/trained", 0) * r.get("repair/copy_rate", 0.0) for r in rows) / n
    trained = []  # the Executor samples of each step that trained the Executor
    for r in rows:
        if "executor" in r.get("active", "") and "samples/executor" in r:
            trained.append(r["samples/executor"])
    samples = sum(trained) / len(trained) if trained else None
    return {"repairs": n, "adv": adv, "copy": copy, "samples": samples}


def summarize(run_dir, over, split="eval", table=None):
    """One run's numbers: its training curve from metrics.jsonl and, per held-out task, its final
    table's exact and sampled measures for the RL model and the SFT cold start (None without a
    metrics.jsonl). The table is the run's own (table_name()), or `table`, a path (a fixed_table();
    "fixed" says which). The sampled rows that stand for a run: its learned designs, or for an arm
    on the single template (its overrides `over` set template=single: single-agent GRPO) the
    single agent. An exact row the table lacks (an older table) is left out of "gain". Beside the
    gains, "level" holds the two sampled rows themselves, per task: "rl_accuracy" and
    "sft_accuracy" (levels, not gains: for comparisons of where two arms end or start)."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    n = max(1, math.ceil(TAIL * len(rows)))

    def mean(key, part):
        return sum(r.get(key, 0.0) for r in part) / len(part)

    tail_keys = set()  # the keys of the last steps' lines
    for r in rows[-n:]:
        tail_keys |= set(r)
    out = {
        "steps": len(rows),
        "train_change": mean("reward/mean", rows[-n:]) - mean("reward/mean", rows[:n]),
        "structures": {
            k[len("structure/") :]: mean(k, rows[-n:])
            for k in tail_keys
            if k.startswith("structure/")
        },
        "ids": None,
        "gain": {},
        "prior": None,
        "sft_rows": {},
        "cmd": run_cmd(run_dir),
        "dose": dose(rows),
        "fixed": table is not None,
        "level": {},
        "cpus": cpus(run_dir),
    }
    sampled = ("RL: learned designs", "SFT: designs")
    if over.get("template") == "single":
        sampled = ("RL: single agent", "SFT: single agent")
    table = read_json(table or os.path.join(run_dir, table_name(split)))
    try:
        exact, correct = table["per_task"]["exact"], table["per_task"]["correct"]
        rl, sft = exact["RL"], exact["SFT"]
        gain = {"suited": task_gain(rl["suited"], sft["suited"])}  # required: a table has it
        for key in EXACT_KEYS:
            if key in rl and key in sft:
                gain[key] = task_gain(rl[key], sft[key])
        gain["accuracy"] = task_gain(correct[sampled[0]], correct[sampled[1]])
        # the same on the code tasks alone (None on the others)
        code = [k == "code" for k in table.get("kinds", [])]
        gain["accuracy_code"] = [g if c else None for g, c in zip(gain["accuracy"], code)]
        # suited on each kind's tasks alone: suited_code, P(tester); suited_math, P(ensemble)
        for kind in SUITED:
            mine = [k == kind for k in table.get("kinds", [])]
            gain[f"suited_{kind}"] = [g if m else None for g, m in zip(gain["suited"], mine)]
        out["ids"] = table["ids"]
        out["prior"] = prior(sft.get("choice"), table.get("kinds"))
        # the cold start's own rows, to check that two arms of a seed scored the same programs
        out["sft_rows"] = {"repair_own": sft.get("repair_own")}
        out["gain"] = gain
        out["level"] = {"rl_accuracy": correct[sampled[0]], "sft_accuracy": correct[sampled[1]]}
    except (ValueError, KeyError, TypeError):
        pass  # no (readable) final table yet: the run has a curve but no held-out measures
    return out


def collect(the_set, root, unfinished=None, split="eval", fixed=None):
    """{run: {seed: summary}} for every ROOT/<run>-s<seed> of an arm of the_set's runs() with a
    metrics.jsonl and its split's final table; a run without its final table yet is left out and
    named in `unfinished`. fixed: a folder of tables made again (fixed_table()): a run that has
    one there is read from it (eval only)."""
    arms, out = the_set.runs(1), {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not (m and m[1] in arms):
            continue
        table = fixed_table(fixed, name) if split == "eval" else None
        s = summarize(os.path.join(root, name), arms[m[1]], split, table)
        if s and s["gain"]:  # the final table comes after the last step
            out.setdefault(m[1], {})[int(m[2])] = s
        elif s and unfinished is not None:
            unfinished.append(f"{name} ({s['steps']} steps, no final table)")
    return out


# --------------------------------------------------------------------------------------------------
# statistics: one rule for every comparison


def t_pvalue(t, df):
    """Two-sided p-value of Student's t with df degrees of freedom. With x = sqrt(df) tan(u) the
    tail integral of the density becomes c * integral_{atan(|t|/sqrt(df))}^{pi/2} cos(u)^(df-1) du,
    c = Gamma((df+1)/2) / (sqrt(pi) Gamma(df/2)): a smooth integrand, Simpson's rule on 400
    intervals."""
    lo, n = math.atan(abs(t) / math.sqrt(df)), 400
    h = (math.pi / 2 - lo) / n
    f = [math.cos(lo + i * h) ** (df - 1) for i in range(n + 1)]
    integral = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    return 2 * c * integral


def t_critical(alpha, df):
    """t such that t_pvalue(t, df) = alpha (bisection: the p-value falls as t grows)."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        lo, hi = ((lo + hi) / 2, hi) if t_pvalue((lo + hi) / 2, df) > alpha else (lo, (lo + hi) / 2)
    return (lo + hi) / 2


ALPHA = 0.05


def paired(pairs):
    """pairs: per seed, two lists over the same held-out tasks (x_s, y_s), or two one-number lists;
    None in either list marks a task where that measure's context does not occur. Returns {"D",
    "SE", "S", "ds", "used" (the pairs' indices behind ds), "lo", "hi"} (None without a pair that
    has a task):

        d_s  = mean over tasks t of (x_st - y_st),  t where neither is None
                                                                    (the seed's paired difference)
        D    = mean_s d_s,   SE = sd_s(d_s) / sqrt(S)                (sd: S - 1 in the denominator)
        [lo, hi] = D -+ t(1 - ALPHA/2, S - 1) * SE                   (the 95% interval)

    The seeds are the unit: each seed's d_s already averages its tasks, and their spread holds both
    the training run's randomness and the draw of tasks. One seed has no spread: no SE or
    interval."""
    ds, used = [], []  # used: the indices of the pairs that had a task
    for k, (x, y) in enumerate(pairs):  # a task counts where both are not None
        both = [(u, v) for u, v in zip(x, y, strict=True) if u is not None and v is not None]
        if both:
            ds.append(sum(u for u, _ in both) / len(both) - sum(v for _, v in both) / len(both))
            used.append(k)
    if not ds:
        return None
    S, D = len(ds), sum(ds) / len(ds)
    out = {"D": D, "S": S, "ds": ds, "used": used, "SE": None, "lo": None, "hi": None}
    if S > 1:
        se = math.sqrt(sum((d - D) ** 2 for d in ds) / (S - 1) / S)
        half = t_critical(ALPHA, S - 1) * se
        out.update(SE=se, lo=D - half, hi=D + half)
    return out


def normal_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2."""
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def t_power(S, effect, alpha=ALPHA):
    """The power of a two-sided one-sample t test at level alpha with S seeds when the true mean is
    effect x the SD (effect = delta / sd), by numeric integration of the noncentral t (no scipy):

        T = (Z + lam) / (U / sqrt(nu)),  Z ~ N(0, 1),  U ~ chi(nu),  nu = S - 1,
        lam = effect * sqrt(S),  c = t(1 - alpha/2, nu)
        power = P(|T| > c) = integral_0^inf f_nu(u) [Phi(lam - c u/sqrt(nu))
                                                     + Phi(-lam - c u/sqrt(nu))] du
        f_nu(u) = u^(nu-1) exp(-u^2/2) / (2^(nu/2-1) Gamma(nu/2))      (the chi density)

    Simpson's rule on [0, sqrt(nu) + 12] (the chi density is smooth there, even at nu = 1, and past
    it below 1e-30), 2000 intervals. At effect 0 it is alpha; pwr.t.test(n=10, d=1,
    type="one.sample") gives 0.8031."""
    nu, lam, c = S - 1, effect * math.sqrt(S), t_critical(alpha, S - 1)
    top, n = math.sqrt(nu) + 12, 2000
    h = top / n
    log_norm = (nu / 2 - 1) * math.log(2) + math.lgamma(nu / 2)

    def f(u):
        if u == 0:
            dens = math.exp(-log_norm) if nu == 1 else 0.0
        else:
            dens = math.exp((nu - 1) * math.log(u) - u * u / 2 - log_norm)
        q = c * u / math.sqrt(nu)
        return dens * (normal_cdf(lam - q) + normal_cdf(-lam - q))

    ys = [f(i * h) for i in range(n + 1)]
    return h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))


def seeds_needed(effect, target=0.80, most=100000):
    """The smallest S >= 2 with t_power(S, effect) >= target (the power grows with S: doubling,
    then bisection); None for effect <= 0 or past `most`."""
    if effect <= 0:
        return None
    hi = 2
    while t_power(hi, effect) < target:
        if hi > most:
            return None
        hi *= 2
    lo = hi // 2  # power(lo) < target unless lo < 2
    if lo < 2:
        return 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if t_power(mid, effect) < target else (lo, mid)
    return hi


def margin(plan, plan_key):
    """The pre-registered margin of a comparison, as a fraction (the set's PLAN holds points); None
    unset."""
    delta = plan.get(plan_key, {}).get("delta") if plan_key else None
    return None if delta is None else delta / 100


def threshold(plan, plan_key):
    """A comparison's pre-registered threshold (PLAN's "null"), in points: 0.0 when unset (the gain
    is tested against 0)."""
    return (plan.get(plan_key, {}).get("null") or 0.0) if plan_key else 0.0


def planned(plan, plan_key, r, text):
    """A verdict with fewer seeds than the plan asked for is an interim one: it says so (the set
    continues across sittings; the pre-registered verdict is the one at the planned seeds)."""
    want = plan.get(plan_key, {}).get("seeds") if plan_key else None
    if want and r is not None and r["S"] < want:
        return f"interim, {r['S']} of {want} seeds: {text}"
    return text


def verdict(r, delta):
    """The rule, on paired()'s result, delta the pre-registered margin (a fraction):

        half(a) = t(1 - a/2, S - 1) * SE
        held         D - half(0.05) > 0          (the 95% interval above 0: the predicted side)
        reversed     D + half(0.05) < 0
        equivalent   -delta < D - half(0.10) and D + half(0.10) < delta
                     (the 90% interval inside ±delta: TOST, two one-sided tests at 0.05)
        inconclusive otherwise, with the power the test had: t_power(S, delta / sd),
                     sd = SE sqrt(S) the observed SD of d_s

    No margin: no equivalence test and no power. One seed gets no verdict."""
    if r is None:
        return "missing"
    if r["S"] < 2:
        return "undecided (1 seed)"
    D, se, S = r["D"], r["SE"], r["S"]
    half95 = t_critical(ALPHA, S - 1) * se
    if D - half95 > 0:
        return "held"
    if D + half95 < 0:
        return "reversed"
    if delta is None:
        return "inconclusive (no margin pre-registered)"
    half90 = t_critical(2 * ALPHA, S - 1) * se
    if -delta < D - half90 and D + half90 < delta:
        return f"equivalent within ±{100 * delta:.2f}"
    sd = se * math.sqrt(S)
    power = 1.0 if sd == 0 else t_power(S, delta / sd)
    return f"inconclusive (power {power:.2f})"


# --------------------------------------------------------------------------------------------------
# provenance: which commit made each run and cold start, from a clean tree, after the
# pre-registration (the git answers: machinery/provenance.py)


def preregistered(root):
    """The pre-registration commit in ROOT/PREREGISTERED (one line, 40 hex digits), or None."""
    try:
        with open(os.path.join(root, "PREREGISTERED")) as f:
            line = f.read().strip()
    except OSError:
        return None
    return line.lower() if re.fullmatch(r"[0-9a-fA-F]{40}", line) else None


def plan_block(text):
    """The `PLAN = {...}` block of a set's file's text (to its closing brace at the line start), or
    None."""
    start = text.find("\nPLAN = {")
    end = text.find("\n}\n", start)
    return None if start < 0 or end < 0 else text[start : end + 3]


def plan_as_registered(the_set, prereg, repo=REPO):
    """Whether the PLAN block (the margins and planned seeds) of the_set's file (tools/ablations.py)
    is the one that file held at the pre-registration commit; None when git cannot show it."""
    path = os.path.abspath(the_set.__file__)
    registered = file_at(prereg, os.path.relpath(path, REPO), repo)
    if registered is None:
        return None
    with open(path) as f:
        return plan_block(registered) == plan_block(f.read())


def record_problems(record, prereg, repo):
    """Why a record ({"commit", "dirty"}: a run.json start, a cold start's build.json) does not
    count: its commit before the pre-registration or unknown to the repository, a dirty tree
    (dirty None, unknown, counts as dirty); [] when it counts."""
    commit = record.get("commit")
    after = is_after(prereg, commit, repo) if commit else None
    why = []
    if after is False:
        why.append("before the pre-registration")
    elif after is None:
        why.append("commit unknown to the repository")
    if record.get("dirty") is not False:
        why.append("dirty tree")
    return why


def provenance(the_set, root, names, repo=REPO):
    """(rows, excluded, note) for the run folders `names` under root: a row per start recorded in
    run.json (run, commit, dirty, start, end, CPU); {run: why} for the runs that fail the check
    (record_problems() on every start; a run without run.json starts fails it too); and a
    sentence on what was checked. Without ROOT/PREREGISTERED or git nothing is checked and
    nothing excluded (the note says so); with them, whether the_set's PLAN is the registered one."""
    prereg = preregistered(root)
    checked = prereg is not None and git_state(repo)["commit"] is not None
    rows, excluded = [], {}
    for name in names:
        starts = (read_json(os.path.join(root, name, "run.json")) or {}).get("starts") or []
        why = [] if starts else ["no run.json"]
        if not starts:
            rows.append((name, "-", "-", "-", "-", "no run.json starts"))
        for st in starts:
            commit, cpu = st.get("commit") or "", (st.get("machine") or {}).get("cpu", "?")
            rows.append(
                (name, commit[:7] or "?", st.get("dirty"), st.get("start"), st.get("end"), cpu)
            )
            if checked:
                why += record_problems(st, prereg, repo)
        if checked and why:
            excluded[name] = ", ".join(dict.fromkeys(why))
    if prereg is None:
        note = "not checked: no PREREGISTERED file (a 40-hex commit) here; no run counts as checked"
    elif not checked:
        note = f"not checked: git cannot read {repo}; no run counts as checked"
    else:
        same = plan_as_registered(the_set, prereg, repo)
        plan = {True: "the same as", False: "NOT the same as", None: "not comparable with"}[same]
        note = (
            f"checked against the pre-registration commit {prereg[:7]} (PREREGISTERED): every "
            f"start at or after it, from a clean tree; PLAN (the margins and seeds) is {plan} the "
            "pre-registration's"
        )
    return rows, excluded, note


def sft_args(cmd):
    """An sft.py command's arguments less the interpreter and the --out folder (a published cold
    start's record names the folder it was built in), each flag's name in snake case (records made
    before issue #71 wrote `--no-eval`: the same flag); None for no command."""
    if not cmd:
        return None
    args = [snake_flag(a) for a in cmd[1:]]
    if "--out" in args:
        k = args.index("--out")
        del args[k : k + 2]
    return args


def snake_flag(arg):
    """`--a-b=v` as `--a_b=v`; any other argument as it is."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return "--" + name[2:].replace("-", "_") + eq + value


def cold_start_problems(the_set, root, results, repo=REPO):
    """{run: why} for the set's runs whose seed's cold start (ROOT/sft-s{s}/build.json: the
    runner's record) fails the provenance check: no record, another command than the_set's
    sft_command(), record_problems(). Nothing without PREREGISTERED or git (provenance() says
    so)."""
    prereg = preregistered(root)
    if prereg is None or git_state(repo)["commit"] is None:
        return {}
    out = {}
    for r in the_set.SET["arms"]:
        sep = the_set.separate_start(r)
        for seed in results.get(r, {}):
            rec = read_json(os.path.join(cold_start(root, seed, sep), "build.json"))
            if rec is None:
                why = ["no build.json"]
            elif sft_args(rec.get("cmd")) != sft_args(the_set.sft_command(seed, root, sep)):
                why = ["made by another command"]
            else:
                why = record_problems(rec, prereg, repo)
            if why:
                out[f"{r}-s{seed}"] = f"its cold start: {', '.join(why)}"
    return out


def counted(the_set, root, split="eval", unfinished=None, repo=REPO, fixed=None):
    """(results, provenance): collect()'s finished runs (fixed: its folder of tables made again)
    less those that fail the provenance check (provenance(), cold_start_problems()), and that
    check's (rows, excluded, note)."""
    results = collect(the_set, root, unfinished, split, fixed)
    names = []
    for r, per in results.items():
        names += [f"{r}-s{seed}" for seed in sorted(per)]
    prov = provenance(the_set, root, sorted(names), repo)
    # a seed's cold start is part of its runs: one built before the pre-registration, from a dirty
    # tree or by another command than sft_command's leaves its runs out too
    for name, why in cold_start_problems(the_set, root, results, repo).items():
        prov[1][name] = why
    kept = {}
    for r, per in results.items():
        kept[r] = {seed: s for seed, s in per.items() if f"{r}-s{seed}" not in prov[1]}
    return {r: per for r, per in kept.items() if per}, prov


def own_cold_starts(results, arms):
    """(results less the runs of the set's `arms` that did not start from their seed's own cold
    start, the names of those runs), by their ablations.json command: older runs (issue #34's, all
    from out/tiny-sft) or runs the runner did not make, which the set's comparisons must not
    judge."""
    older = []
    for a in arms:
        for seed, s in sorted(results.get(a, {}).items()):
            # sft-s{seed}, or sft-separate-s{seed} (an arm of two policies)
            own = [os.path.basename(cold_start("", seed, sep)) for sep in (False, True)]
            inits = [x for x in s["cmd"] or [] if x.startswith("--init_from=")]
            if not any(x.endswith(tuple(own)) for x in inits):
                older.append(f"{a}-s{seed}")
    kept = {}
    for r, per in results.items():
        kept[r] = {seed: s for seed, s in per.items() if f"{r}-s{seed}" not in older}
    return kept, older


def same_frozen_programs(results, arms, separate=None):
    """The seeds whose `arms` scored different programs: the cold start's SFT row on repair_own, per
    task, must be the same in every arm's table of the seed that started from the same cold start
    (one cold start, one frozen sample of its own programs, world/final_table.py's
    own_first_replies; separate(arm): whether it started from the seed's separate one); [] when
    they agree."""
    bad = []
    for seed in sorted(set().union(*(results.get(a, {}) for a in arms))):
        rows = {}
        for a in arms:
            if seed in results.get(a, {}):
                start = bool(separate and separate(a))
                own = results[a][seed].get("sft_rows", {}).get("repair_own")
                rows.setdefault(start, []).append(own)
        for same in rows.values():
            if any(row != same[0] for row in same):
                bad.append(seed)
                break
    return bad


# --------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md


def values(summary, key):
    """A run's per-task gains on `key` (per run: [train_change]), or its per-task levels (a key of
    summarize()'s "level"); None when its table lacks it."""
    if key == "train_change":
        return [summary[key]]
    return summary["gain"].get(key, summary.get("level", {}).get(key))


def measure(results, a, b, key):
    """paired() of run a's RL − SFT gain minus run b's on `key` (per task: "suited", "executor",
    "oracle", "accuracy", and in newer tables "executor_answer", "executor_steps", "repair",
    "repair_own"; per run: "train_change"), over the seeds both runs have and on which they saw the
    same held-out tasks (checked by id). b = None: run a's gain itself (RL − SFT). A seed whose
    table lacks the measure is left out; None when no seed has it. The result's "seeds" are the
    seeds behind its d_s."""
    pairs, seeds = [], []
    for seed in sorted(set(results.get(a, {})) & set(results.get(b or a, {}))):
        sa, sb = results[a][seed], results[b or a][seed]
        x = values(sa, key)
        y = [0.0] * len(x or []) if b is None else values(sb, key)
        if x is None or y is None or (b is not None and sa["ids"] != sb["ids"]):
            continue
        pairs.append((x, y))
        seeds.append(seed)
    r = paired(pairs)
    if r is not None:
        r["seeds"] = [seeds[k] for k in r["used"]]  # the seeds behind d_s
    return r


SCALE = {"train_change": 1}  # the rest in points (x100)


def scale(key):
    """(factor, digits) a measure is written with: reward units to 3 digits (SCALE), else points
    to 2."""
    return SCALE.get(key, 100), 3 if key in SCALE else 2


def diff_text(r, key, interval=True):
    """'+1.2 [−0.4, +2.8]' (the 95% t interval) or '+1.2 ± 0.6' (the SE), in points (reward units
    for the training-reward change)."""
    if r is None:
        return "n/a"
    sc, dg = scale(key)
    if r["SE"] is None:
        return f"{sc * r['D']:+.{dg}f} (1 seed)"
    if interval:
        return f"{sc * r['D']:+.{dg}f} [{sc * r['lo']:+.{dg}f}, {sc * r['hi']:+.{dg}f}]"
    return f"{sc * r['D']:+.{dg}f} ± {sc * r['SE']:.{dg}f}"


def against(r, null):
    """paired()'s result tested against `null` (a fraction) instead of 0: D, d_s and the interval
    moved by -null, so that verdict()'s "held" reads D - half > null (a threshold prediction such
    as "a gain of at least 8 points"). None stays None."""
    if r is None or not null:
        return r
    out = {**r, "D": r["D"] - null, "ds": [d - null for d in r["ds"]]}
    if r["lo"] is not None:
        out.update(lo=r["lo"] - null, hi=r["hi"] - null)
    return out


def dose_text(results, arms, r=None, short=False):
    """The dose beside a verdict, per arm of the comparison, over the seeds behind its d_s (r,
    measure()'s result; every seed of the arm without one) that logged it (dose()): the repair
    samples a run trained (the mean over those seeds), their mean advantage A and copy rate (pooled
    over every repair trained), and the Executor samples an Executor update (the seeds' mean);
    "n/a" where none logged it. short: the repairs alone (the README's line)."""
    parts = []
    for arm in arms:
        per = results.get(arm, {})
        seeds = r["seeds"] if r else sorted(per)
        doses = [per[s]["dose"] for s in seeds if s in per and per[s].get("dose")]
        if not doses:
            parts.append(f"{arm}: n/a")
            continue
        n = sum(d["repairs"] for d in doses)
        if short:
            parts.append(f"{arm} {n / len(doses):.0f}")
            continue
        text = f"{arm}: {n / len(doses):.0f} repairs"
        if n:
            adv = sum(d["repairs"] * d["adv"] for d in doses if d["repairs"]) / n
            copy = sum(d["repairs"] * d["copy"] for d in doses if d["repairs"]) / n
            text += f" (A {adv:+.2f}, copy {copy:.0%})"
        samples = [d["samples"] for d in doses if d["samples"] is not None]
        if samples:
            text += f", {sum(samples) / len(samples):.0f} samples an update"
        parts.append(text)
    return "; ".join(parts)


def seeds_text(seeds):
    """Seeds as runs of consecutive numbers: [0, 1, 2, 5] -> "0-2, 5"."""
    parts, seeds = [], sorted(seeds)
    for k, s in enumerate(seeds):
        if k and s == seeds[k - 1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def registered_tables(results, arms, r=None):
    """{arm: seeds} of the arms' seeds behind r (measure()'s result; every seed of the arm without
    one) whose numbers come from the run's registered table, not a fixed one (collect()'s
    `fixed`)."""
    out = {}
    for arm in arms:
        per = results.get(arm, {})
        seeds = [s for s in (r["seeds"] if r else sorted(per)) if s in per]
        if reg := [s for s in seeds if not per[s].get("fixed")]:
            out[arm] = reg
    return out


def tables_text(results, arms, r, key):
    """Which tables a reading from fixed tables reads: "fixed" at every seed, else the arms and
    seeds that fall back on their registered table; the training change reads no table."""
    if key == "train_change":
        return "metrics.jsonl"
    reg = registered_tables(results, arms, r)
    if not reg:
        return "fixed"
    return "registered at " + "; ".join(f"{a} s{seeds_text(s)}" for a, s in reg.items())


def other_cpus(results, a, b, r):
    """The seeds behind r at which arms a and b ran on different CPUs (their run.json starts)."""
    seeds = r["seeds"] if r else []
    return [s for s in seeds if results[a][s].get("cpus") != results[b][s].get("cpus")]


def judged(the_set, results, plan_key, a, b, key):
    """(paired()'s result, its verdict): the rule at the set's PLAN margin, against PLAN's "null"
    where it sets one (a threshold, in points: "(against +8.00)" follows the verdict), interim
    while fewer seeds than planned."""
    r, delta = measure(results, a, b, key), margin(the_set.PLAN, plan_key)
    null = threshold(the_set.PLAN, plan_key) / 100
    said = planned(the_set.PLAN, plan_key, r, verdict(against(r, null), delta))
    if null:
        said += f" (against {100 * null:+.2f})"
    return r, said


def row(the_set, results, plan_key, label, a, b, key, tables=False):
    """One comparison's table row: seeds, D with its 95% t interval, d_s per seed, the margin (the
    set's PLAN), the verdict (judged()), the dose of its arms (dose_text()) and with `tables`
    which tables it reads (tables_text())."""
    r, said = judged(the_set, results, plan_key, a, b, key)
    delta = margin(the_set.PLAN, plan_key)
    null = threshold(the_set.PLAN, plan_key)
    sc, dg = scale(key)
    per = ", ".join(f"{sc * d:+.{dg}f}" for d in r["ds"]) if r else "-"
    cells = [
        label,
        str(r["S"] if r else 0),
        diff_text(r, key),
        per,
        (f"{null:+.2f} " if null else "") + (f"±{100 * delta:.2f}" if delta else "not set"),
        said,
        dose_text(results, [a] if b is None else [a, b], r),
    ]
    if tables:
        cells.append(tables_text(results, [a] if b is None else [a, b], r, key))
    return "| " + " | ".join(cells) + " |"


def prior_lines(the_set, results, seeds):
    """The cold start's prior per seed and kind: mean exact P(template) and whether the most
    likely template is the suited one (SUITED), from the first arm of the seed whose table has
    it (of the arms that start from the seed's own cold start)."""
    rows, templates = [], []
    for seed in seeds:
        for kind, ps in (seed_prior(the_set, results, seed) or {}).items():
            templates += [t for t in ps if t not in templates]
            rows.append((seed, kind, ps))
    if not rows:
        return ["No final table here holds the cold start's P(template) (choice): missing.", ""]
    head = " | ".join(templates)
    md = [
        f"| seed | kind | {head} | most likely | suited |",
        "|" + "---|" * (len(templates) + 4),
    ]
    for seed, kind, ps in rows:
        top = most_likely(ps)
        cells = [f"{100 * ps[t]:.1f}" if t in ps else "-" for t in templates]
        suited = SUITED.get(kind, "?")
        mark = "yes" if top == suited else "no"
        md.append(f"| {seed} | {kind} | {' | '.join(cells)} | {top} | {suited}: {mark} |")
    return [*md, ""]


def provenance_lines(prov):
    """The provenance table, the runs without a record, and the runs not counted."""
    rows, excluded, note = prov
    md = [f"Provenance {note}.", ""]
    if rows:
        md += ["| run | commit | dirty | start | end | CPU |", "|---|---|---|---|---|---|"]
        for run, commit, dirty, start, end, cpu in rows:
            md.append(f"| {run} | {commit} | {dirty} | {start} | {end or '-'} | {cpu} |")
        md.append("")
    if excluded:
        left_out = "; ".join(f"{n} ({why})" for n, why in sorted(excluded.items()))
        md.append(f"Not counted (left out of every verdict): {left_out}.")
    else:
        md.append("Not counted: none.")
    return [*md, ""]


# the measures of an unregistered comparison (SET's "unregistered"), as its line names them
LEVELS = {"accuracy": "gain", "rl_accuracy": "after RL", "sft_accuracy": "cold start"}


def unregistered(the_set, results, fixed=False):
    """SET's unregistered comparisons (none without the key): per comparison (label, a, b, keys),
    one string per key, A − B paired by seed and task (measure(): "accuracy" the gains'
    difference, "rl_accuracy" and "sft_accuracy" the levels' after RL and at the cold start),
    and what else differs between the two arms: the seeds their runs ran on other CPUs at, and
    (fixed) the seeds read from registered tables, after the count of seeds behind it. Not part of
    the pre-registration: no verdict."""
    out = []
    for label, a, b, keys in the_set.SET.get("unregistered", []):
        rs = {k: measure(results, a, b, k) for k in keys}
        r = rs[keys[0]]
        parts = [f"{LEVELS.get(k, k)} {diff_text(rs[k], k)}" for k in keys]
        also = []
        if seeds := other_cpus(results, a, b, r):
            also.append(f"CPUs differ at s{seeds_text(seeds)}")
        if fixed and (t := tables_text(results, [a, b], r, keys[0])) != "fixed":
            also.append(t.replace("registered at", "registered tables at"))
        also = [f"{r['S'] if r else 0} seeds", *also]
        out.append(f"{label}: {', '.join(parts)}" + (f" ({'; '.join(also)})" if also else ""))
    return out


def by_kind(the_set, results):
    """SET's "by_kind" (measure, arms), as one line: each arm's RL − SFT gain on the measure over
    each kind's tasks alone (summarize()'s "suited_code", "suited_math"), with its 95% t interval
    over the seeds; None without the key. Not part of the pre-registration: no verdict."""
    if "by_kind" not in the_set.SET:
        return None
    key, arms = the_set.SET["by_kind"]
    parts = []
    for kind in sorted(SUITED):
        cells = [f"{a} {diff_text(measure(results, a, None, f'{key}_{kind}'), key)}" for a in arms]
        parts.append(f"{kind} (P({SUITED[kind]})): {', '.join(cells)}")
    return f"`{key}` by kind, each arm's gain: {'; '.join(parts)}"


def section(the_set, results, prov, seeds, split, fixed=False):
    """The set's section: its primary comparisons, the secondary ones, the unregistered ones, the
    cold start's prior and the provenance, in the words of the_set's SET (fixed: a reading whose
    rows say which tables they read). Runs not from their seed's own cold start are named and
    left out."""
    words, arms = the_set.SET, the_set.SET["arms"]
    results, older = own_cold_starts(results, arms)
    seeds = [s for s in seeds if any(s in results.get(a, {}) for a in arms)]
    note = "Every run here started from its seed's own cold start."
    if older:
        note = (
            "Not from their seed's own cold start, left out of this section (older runs): "
            f"{', '.join(older)}."
        )
    bad = same_frozen_programs(results, arms, the_set.separate_start)
    frozen = (
        "At every seed the arms from one cold start scored the same frozen programs (the cold "
        "start's repair_own row is the same, task by task, in their tables)."
    )
    if bad:
        frozen = (
            f"The cold-start rows on repair_own of arms from one cold start differ at seeds {bad}: "
            "not the same programs."
        )
    head = [
        "| comparison | seeds | D [95% t interval] | d_s per seed | margin | verdict | dose |"
        + " tables |" * fixed,
        "|---|---|---|---|---|---|---|" + "---|" * fixed,
    ]
    predicted = words.get("predicted")
    if predicted:
        said = ", ".join(
            f"{label.split(':')[0]} {predicted[k]}" for k, label, *_ in words["primary"]
        )
        predicted = f"Predicted in the pre-registration: {said}."
    extra = words.get("unregistered")
    if extra:
        extra = [
            "Unregistered (not in the pre-registration, no verdict: A − B on accuracy, paired by "
            "seed and task, 95% t intervals):",
            "",
            *(f"- {line}." for line in unregistered(the_set, results, fixed)),
            *[f"- {by_kind(the_set, results)}."] * ("by_kind" in words),
            "",
        ]
    return [
        f"## {words['title']}",
        "",
        f"{words['arms_text']} Split: {split}. Per seed d_s (the mean over tasks of the gain, or "
        "of the gain difference paired by task id; `repair` and `repair_own` over the tasks where "
        "their context occurs), D = mean_s d_s, SE = sd(d_s)/√S, Student's t at S − 1 degrees of "
        "freedom. *Held*: the 95% interval above 0 (the side the comparison states); *reversed*: "
        "below 0; "
        "else *equivalent within ±X* when the 90% interval lies inside ±X, X the pre-registered "
        "margin (TOST at 0.05); else *inconclusive*, with the power the test had to detect X at "
        "the observed SD. A threshold comparison (its margin `+T ±X`) is judged by the same "
        "rule on D − T. In points. Dose: per arm, the repair samples a run trained (their "
        "mean advantage A and copy rate) and the Executor samples an Executor update, seed "
        "means.",
        "",
        *head,
        *(row(the_set, results, *c, tables=fixed) for c in words["primary"]),
        "",
        *[predicted] * bool(predicted),
        note,
        frozen,
        "",
        "Secondary:",
        "",
        *head,
        *(row(the_set, results, *c, tables=fixed) for c in words["secondary"]),
        "",
        *(extra or []),
        "### The cold start's prior (exact P(template), % mean over each kind's tasks)",
        "",
        *prior_lines(the_set, results, seeds),
        "### Provenance",
        "",
        *provenance_lines(prov),
    ]


def setting_of(the_set, results, r, budget):
    """A run's setting: the overrides of the command its first seed ran (ablations.json's "cmd"),
    less the folder, seed, cold start and table switches; runs()'s when no command was recorded."""
    cmd = next((s["cmd"] for _, s in sorted(results[r].items()) if s.get("cmd")), None)
    if not cmd:
        over = the_set.runs(budget)[r]
        return " ".join(f"{k}={v}" for k, v in over.items() if k != "init_from")
    skip = ("--out_dir=", "--seed=", "--init_from=", "--eval_tasks=", "--resume")
    return " ".join(x[2:] for x in cmd[3:] if x.startswith("--") and not x.startswith(skip))


# an arm's row in the report: (measure, with its 95% t interval; else ± SE)
ARM_MEASURES = [
    ("suited", True),
    ("executor", True),
    ("oracle", False),
    ("accuracy", False),
    ("train_change", False),
]


def run_row(the_set, results, r, budget):
    """An arm's row: its setting, updates per role, seeds, each measure's RL − SFT gain
    (ARM_MEASURES) and the structures its runs ended with (the last 20% of steps, seed mean)."""
    per = list(results[r].values())
    nd, ne = the_set.updates(r)
    gains = [diff_text(measure(results, r, None, key), key, iv) for key, iv in ARM_MEASURES]
    names = []  # every structure a seed's run ended with, in the order they first appear
    for s in per:
        names += [k for k in s["structures"] if k not in names]
    shares = {k: sum(s["structures"].get(k, 0.0) for s in per) / len(per) for k in names}
    ranked = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
    structures = ", ".join(f"{k} {v:.0%}" for k, v in ranked if v >= 0.005) or "-"
    setting = setting_of(the_set, results, r, budget)
    cells = [f"| {r}", f"`{setting}`", f"{nd * budget} + {ne * budget}", str(len(per)), *gains]
    return " | ".join([*cells, f"{structures} |"])


def report_name(split, fixed=None):
    """RESULTS.md (eval) or RESULTS_{split}.md; read with fixed tables, RESULTS_fixed.md."""
    if fixed:
        return "RESULTS_fixed.md"
    return "RESULTS.md" if split == "eval" else f"RESULTS_{split}.md"


def report(the_set, root, split="eval", repo=REPO, fixed=None):
    """ROOT/RESULTS.md (split val: RESULTS_val.md) from the runs under ROOT: the_set's section (the
    primary, secondary and unregistered comparisons, the cold start's prior, the provenance), then
    a table of every arm, and what is missing. The runs that fail the provenance check are named
    and left out of every number. fixed: a folder of tables made again (fixed_table()), read
    where a run has one, into ROOT/RESULTS_fixed.md, whose rows say which tables they read.
    Returns its path."""
    all_arms, arms = the_set.RUN_NAMES, the_set.SET["arms"]  # every arm, the set's
    unfinished = []
    if not collect(the_set, root, unfinished, split):
        raise SystemExit(
            f"ablations.py report: no finished <run>-s<seed> (metrics.jsonl and final table) "
            f"under {root}" + (f"; unfinished: {', '.join(unfinished)}" if unfinished else "")
        )
    if fixed and split != "eval":
        raise SystemExit(f"ablations.py report: fixed tables are eval tables, not {split}'s")
    results, prov = counted(the_set, root, split, None, repo, fixed)
    budget = next(s["steps"] for s in results.get("metaagent", {0: {"steps": 40}}).values()) // 2
    seeds = {0, 1, 2}  # expected of every arm begun here, and of the set's
    for per in results.values():
        seeds |= set(per)
    seeds = sorted(seeds)
    read = []
    if fixed:
        n = 0
        for per in results.values():
            n += sum(s["fixed"] for s in per.values())
        read = [
            f"Read from the tables made again in {shown(fixed)} where a run has "
            f"one ({n} of {sum(map(len, results.values()))} runs), else from the run's registered "
            f"final_table.json; the tables column says which. The registered reading: "
            f"{report_name(split)}.",
            "",
        ]
    md = [
        "# Ablations on the tiny world",
        "",
        *read,
        *section(the_set, results, prov, seeds, split, bool(fixed)),
        "## Every arm (RL − SFT, no verdicts)",
        "",
        "Every number is a **gain**, the RL model minus its own cold start on the same held-out "
        "tasks, over the seeds: `suited` and `executor` with their 95% t interval, the rest ± SE; "
        "in points (the training-reward change in reward units). `suited`: the Designer's exact "
        "P(suited template); `executor`: the Executor's exact P(oracle reply) in its own "
        "contexts; `oracle`: the single agent's exact P(oracle reply); accuracy: sampled, the "
        "learned designs' (single-agent GRPO: the single agent's); train change: the training "
        "reward over the last 20% of steps minus the first 20%. Updates: the Designer's + the "
        "Executor's. Structures (end): each script structure's share over the last 20% of steps.",
        "",
        "| run | setting | updates D + E | seeds | suited | executor | oracle | accuracy | train "
        "change | structures (end) |",
        "|" + "---|" * 10,
        *(run_row(the_set, results, r, budget) for r in all_arms if r in results),
        "",
    ]
    # expected: the set's arms, and every arm begun here
    begun = set(results)
    for name in os.listdir(root):
        if (m := re.fullmatch(r"(.+)-s(\d+)", name)) and m[1] in all_arms:
            begun.add(m[1])
    missing = []
    for r in all_arms:
        if r in arms or r in begun:
            missing += [f"{r}-s{seed}" for seed in seeds if seed not in results.get(r, {})]
    md.append(
        f"Missing (seeds {', '.join(map(str, seeds))} of {', '.join(arms)} and of every "
        f"arm begun here): {', '.join(missing) or 'none'}.\n"
    )
    if unfinished:
        md.append(f"Unfinished, left out: {', '.join(unfinished)}.\n")
    path = os.path.join(root, report_name(split, fixed))
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {path}")
    return path
