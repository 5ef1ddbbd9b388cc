"""sandbox.py: running model-written code as the method needs it: workflow scripts, whose agent
calls are relayed to the trainer and batched, and programs under test; the limits; comparing
outputs.

How a workflow script runs. run_workflows(scripts, tasks, generate) starts one sandbox job per
script: a child process behind the boundary below (machinery/isolation.py). There the script's
workflow(task) runs, and each helper it calls (mas.py) sends one request to the trainer over the
job's socket and blocks on the reply. Here, in the trainer, a Workflows object serves each kind of
request in a method of its own and hands the agent calls to the engine on the schedule's terms:

    Agent(role, instructions)(message), agent.sample(message, n)
        n AgentCalls. schedule="ticks" (the reference): when EVERY live script waits on agent
        calls, all of them are submitted at once, in (run, index) order, so that a seeded rollout
        gets the same batches whatever the timing of the children, and polled until every one is
        answered (Workflows.tick: with a generate function, ONE generate call).
        schedule="continuous": each call is submitted as its script makes it and the engine polled
        while any is pending; a script gets its replies when all of its call's samples are done,
        so no call waits for another script's longest reply. The script gets mas.answer_of(reply),
        the text inside the answer tag; WorkflowRun.calls keeps each full reply and what the engine
        returned (token ids, ...).
    vote(answers)     mas.majority(answers, equal), with the `equal` run_workflows was given
                      (a code task's: the text alone), counted in a thread beside the event loop
                      (isolation.Background)
    run_python(code)  the program in a job of its own: its stdout, or its stdout and the error
    run_tests(code)   the program on the task's VISIBLE tests (public_tests; hidden tests never
                      enter a script): tests_report's "PASS k/k", or "FAIL j/k" and the first
                      failing case

Limits (mas.Limits): max_calls agent calls a run (sample(m, n) counts n); max_programs run_python
and run_tests calls a run; `timeout` wall seconds a run, its own time (its compute, its programs,
its votes' counts, its sleeps), never the time it waits on the trainer: from the line that asks
(or its program's end) to the reply, whatever the trainer does meanwhile (an engine call, other
runs), nor the time its program waits for its turn; what a job said while the trainer was in the
engine is read at the time it came (isolation.watching), and an answer given stands. max_output
characters of an answer, of stdout, of a helper's reply; code_timeout seconds a run_python
(run_tests: at most 4 a test); max_message characters of an agent call's role, instructions and
message, max_messages of all of a run's (sample(m, n) counts n times). Programs take turns: at most
PROGRAMS_PER_CORE a usable core run at once in one run_workflows call, the others wait with their
scripts' clocks stopped, and a program's clock starts when it starts (so that 600 scripts calling
run_tests at one tick do not time one another out). vote() takes at most mas.MAX_VOTE answers of
mas.MAX_VOTE_CHARS characters, and its count stops at the script's deadline. Every job:
isolation.MEMORY bytes of memory more than the fork-server's (its folder's included), 16 MiB files,
64 open files, CPU seconds = its timeout + 1; its stdout past the cap closes the pipe. Nothing a
script does raises in the trainer: every failure (syntax, exception, limit, timeout, crash,
protocol violation, engine failure) is its WorkflowRun.error, and the ones the trainer had to catch
are counted in `failures` (programs.py's).

Programs under test, outside workflows, are machinery/programs.py's (run_code, run_tests, passed:
reward.py grades with them).

The boundary. start() starts the fork-server (else the first job does), chooses its mode, prints
one line saying which and what it stops, and returns that line for the log. What holds, by mode
(isolation.py's docstring says how):

    a program tries to ...            isolated               fallback               unsafe
    read host files (task data,       no: an empty root      no: Landlock           yes
      the run, home), forge a grade
    write outside its folder          no: read-only binds    no: Landlock           yes
    crash the trainer by what it      no: a parse or compare failure is its failure, counted
      returns (nested 3,000 deep)
    reach a socket of the host or     no: its own network    no: seccomp (AF_UNIX   no: seccomp
      of another job                  namespace; seccomp     pairs only); Landlock
    hold memory its limit cannot      no: seccomp refuses memfd and shared memory; the folder
      count                           counts (tmpfs)         is watched (disk), its is watched
                                                             unlinked files too
    exhaust the host's tasks          no: a pids cgroup of   no: a pids cgroup of   as fallback
      (threads, processes)            its own (else          its own (else NOT
                                      RLIMIT_NPROC)          capped: start() says)
    learn another test's input or     no: each test's input handed to its process as the test
      watch other jobs (inotify,      starts; seccomp: no inotify, fanotify, flock, fcntl locks,
      locks, mounts, page cache)      listmount, mincore, cachestat, dropping pages
    outwait a test's limit (closed    no: each test killed at its deadline, its end seen on a
      pipes, SIGSTOP its group)       pidfd; a test's process is a session of its own
    outrun its budget (programs,      no: the clock counts programs; max_programs; vote capped
      votes, output floods)           and stopped at the deadline; pipes closed past the cap
    open a device (kvm, fuse, loop)   no: not there          no: Landlock           only as the
                                                                                    trainer's user
    signal, trace, renice or read     no: PID namespace,     no: seccomp, Landlock  no: seccomp
      the trainer                     seccomp                (/proc), non-dumpable
    be root on the host               no: nobody (root       the trainer's user,    as fallback
                                      trainer) or the        no capabilities
                                      trainer's user

Shared, in every mode: the page cache of the files jobs may read (the Python install). Reading a
page no process has read since it left the cache takes ~30 µs, a cached one ~1.5 µs, so a job that
reads a page tells a later or concurrent job one bit. Measured (both modes, a 2-core VM, ext4 on
virtio, readahead off by madvise(MADV_RANDOM)): 600 of 600 bits right at 16-22 kbit/s. A page
tells it once: a job can neither drop a page (fadvise, madvise MADV_PAGEOUT are denied) nor ask
which are cached (mincore, cachestat), so what it can say is bounded by the install's pages not
in the cache. What it cannot say is what a program does not hold: no expected output enters its
job, and no later test's input its process.

isolated needs unprivileged user namespaces; fallback (forced by METAAGENT_SANDBOX=fallback)
Landlock; without either start() raises SandboxUnavailable, saying what to enable, unless
METAAGENT_UNSAFE_SANDBOX=1 (exactly "1"): then it warns on every start and every run_workflows.

Needs: machinery/isolation.py, machinery/confine.py (the child processes), mas.py (the script
language), machinery/data.py (task_text: what a script receives), machinery/programs.py, reward.py
and machinery/grader.py (text_equal: how a code task's votes compare)"""

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

import mas
import reward
from machinery import data, programs
from machinery import isolation as iso  # as iso: isolation() below is the function of that name

# the fork-server's interface, part of this one
start, stop, isolation = iso.start, iso.stop, iso.isolation
remove_stale_bases, SandboxUnavailable = iso.remove_stale_bases, iso.SandboxUnavailable
UNSAFE_ENV, MODE_ENV, MEMORY = iso.UNSAFE_ENV, iso.MODE_ENV, iso.MEMORY
# programs (run_python, run_tests jobs) running at once in one run_workflows call, per core this
# process may use: when nothing else runs, each gets a quarter of a core or more, so a 4 s test
# limit leaves a right program 1 s of CPU. All at once, 600 tester scripts forked 600 test jobs at
# one tick on one core, and right programs timed out (docs/NOTES.md). The price: programs that run
# out their limits take turns too (N of them: about N × limit / slots)
PROGRAMS_PER_CORE = 4


@dataclass
class AgentCall:
    run: int  # which of the scripts
    index: int  # which of its agent calls (0, 1, ...)
    role: str
    instructions: str
    message: str
    messages: list  # the Executor's prompt: mas.agent_messages(role, instructions, message)


@dataclass
class CallRecord:
    role: str
    messages: list
    reply: str  # the full reply text (only answer_of(reply) went back to the script)
    completion: object  # whatever generate returned (token ids, log-probs, ...)
    index: int = 0


@dataclass
class WorkflowRun:
    answer: str | None
    error: str | None
    calls: list = field(default_factory=list)
    duration: float = 0.0


# --------------------------------------------------------------------------------------------------
# Workflows


def _task_parts(task, short=False):
    """(the text a script receives, the visible tests) of a task (data.py's format) or of plain
    text."""
    return (
        (task, None)
        if isinstance(task, str)
        else (data.task_text(task, short=short), task.get("public_tests") or None)
    )


def run_workflows(
    scripts,
    tasks,
    generate,
    *,
    equal=None,
    limits=None,
    width=None,
    short=False,
    schedule="ticks",
):
    """Run every (scripts[k], tasks[k]) pair concurrently in sandbox jobs; return one WorkflowRun
    each.

    generate: what answers the agent calls: a function generate(calls: [AgentCall]) -> [str, or an
      object with .text], one completion a call (answered as Batched does), or an object with
      submit(calls) and poll() -> [(call, completion)] of the calls done since (rollout's
      ExecutorCalls: the engine's requests).
    schedule: "ticks", the reference: when every live script waits on agent calls, all their calls
      are submitted at once and polled until every one is answered; "continuous": each call is
      submitted when its script makes it, and the engine is polled while anything is pending, a
      script getting its replies when all of its call's samples are done (programs run meanwhile).
      With seeded calls and an engine whose completions do not depend on their batch, the two give
      the same runs.
    equal(a, b) -> bool: how a script's vote() compares two answers (rollout passes
      reward.math_equal); None: a script that votes on any other task fails, saying so. A code
      task's vote compares text alone, whitespace aside (reward.text_equal), whatever `equal` is:
      its answers are programs or their outputs.
    limits: mas.Limits (the default: mas.Limits()). width: at most this many scripts alive at once
      (default: all of them).
    short: the tiny world's compact prompts (data.task_text(short=True),
      mas.agent_messages(short=True))."""
    assert len(scripts) == len(tasks), (len(scripts), len(tasks))
    if schedule not in ("ticks", "continuous"):
        raise ValueError(f"schedule {schedule!r}: 'ticks' or 'continuous'")
    if iso.server().unsafe:  # the opt-in is repeated in every step's log
        print(f"WARNING: sandbox {isolation()}", file=sys.stderr, flush=True)
    engine = generate if hasattr(generate, "poll") else Batched(generate)
    lim = limits or mas.Limits()
    return Workflows(scripts, tasks, engine, equal, lim, width, short, schedule).run()


class Batched:
    """A generate(calls) function as the sandbox's engine: submit() queues calls, poll() answers
    all of them with one generate call."""

    def __init__(self, generate):
        self.generate, self.queued = generate, []

    def submit(self, calls):
        self.queued += calls

    def poll(self):
        calls, self.queued = self.queued, []
        outs = list(self.generate(calls)) if calls else []
        if len(outs) != len(calls):
            raise ValueError(f"generate returned {len(outs)} completions for {len(calls)} calls")
        return list(zip(calls, outs))


@dataclass
class LiveScript:
    """A script whose job runs: its run k; the agent calls it used; what it waits on (None: it
    runs | a list of AgentCalls, `many` saying whether it asked for a list | the job of its
    run_python or run_tests | while that program waits its turn, the function that starts its
    job | "vote" while its vote is counted); done: it sent its answer or error."""

    k: int
    job: object
    used: int = 0
    programs: int = 0
    chars: int = 0  # characters of its agent calls' messages (sample(m, n): n times)
    waiting: object = None
    many: bool = False
    done: bool = False
    answers: dict = field(default_factory=dict)  # index -> completion, of the calls it waits on


class Workflows:
    """The trainer's side of one run_workflows call: the scripts' jobs, the requests their helpers
    send, and the agent calls, submitted to the engine on the schedule's terms.

    run() launches up to `width` scripts and drives every job (isolation.drive): each request
    arrives at request(), each ended job at ended() (which launches the next script), and between
    turns turn() runs: the programs whose turn has come start, then the engine's part: the tick
    (ticks) or a poll (continuous)."""

    def __init__(self, scripts, tasks, engine, equal, limits, width, short, schedule):
        self.scripts, self.engine, self.equal = scripts, engine, equal
        self.lim, self.width, self.short = limits, width or len(scripts), short
        self.schedule, self.pending = schedule, 0  # agent calls submitted and not yet answered
        self.broken = None  # why the engine failed, once it has: no call is asked of it after
        self.by_run = {}  # k -> its LiveScript
        self.runs = [WorkflowRun(None, None) for _ in scripts]
        self.parts = [_task_parts(t, short) for t in tasks]
        self.kinds = [t.get("kind") if isinstance(t, dict) else None for t in tasks]
        self.todo = deque(range(len(scripts)))  # the scripts not launched yet
        self.live = {}  # job -> its LiveScript, in launch order (that is, in k's order)
        self.jobs = []  # every job drive() watches: the scripts' and their programs'
        self.queued = deque()  # the scripts whose program waits its turn, in request order
        self.programs = []  # the programs' jobs running now, at most self.slots
        self.slots = PROGRAMS_PER_CORE * len(os.sched_getaffinity(0))
        self.background = iso.Background()  # where votes are counted

    def run(self):
        self.launch()
        iso.drive(self.jobs, idle=self.turn, busy=self.busy, wake=self.background.fd)
        while self.pending:  # the calls of scripts that ended while they decoded: none is left in
            self.poll([])  # the engine for the next call of run_workflows
        self.background.close()
        return self.runs

    def turn(self):
        """Between two turns of the event loop: start the programs that have a free slot, then
        the schedule's engine work, during which drive() cannot read: watched (iso.watching)."""
        self.background.collect()  # the votes counted
        self.start_programs()
        # ticks and continuous give the same runs (the proof: tests/test_sandbox.py,
        # test_continuous_runs_equal_ticks_runs)
        if self.schedule == "ticks":
            self.tick()
        elif self.pending:
            with iso.watching(self.jobs):
                self.poll(self.waiting_scripts())

    def busy(self):  # calls decode: the event loop only looks at the jobs, it does not wait
        return self.pending > 0

    def launch(self):
        """Start scripts while fewer than `width` are alive."""
        while self.todo and len(self.live) < self.width:
            k = self.todo.popleft()
            payload = {
                "script": str(self.scripts[k]),
                "task": self.parts[k][0],
                "max_output": self.lim.max_output,
            }
            job = iso.Job(
                "workflow",
                payload,
                self.lim.timeout,
                self.lim.max_output,
                iso.MEMORY,
                self.request,
                self.ended,
            )
            self.jobs.append(job)
            self.live[job] = self.by_run[k] = LiveScript(k, job)

    # ---- agent calls: submitted on the schedule's terms, answered as the engine finishes them

    def tick(self):
        """(ticks) When every live script waits on agent calls: submit all their calls, in (run,
        index) order, so that a seeded rollout gets the same batches whatever the timing of the
        children, and poll until every one is answered."""
        waiting = self.all_waiting()
        if not waiting:
            return
        with iso.watching(self.jobs):
            for s in waiting:
                self.submit(s)
            while self.pending:
                self.poll(waiting)

    def all_waiting(self):
        """The live scripts in run order if every one of them waits on agent calls, else [] (one
        still running may yet add calls to this tick's batch)."""
        alive = [s for s in self.live.values() if not s.done and s.job.kill_reason is None]
        if not all(isinstance(s.waiting, list) for s in alive):
            return []
        return sorted(alive, key=lambda s: s.k)

    def waiting_scripts(self):
        return [s for s in self.live.values() if isinstance(s.waiting, list)]

    def submit(self, s):
        """A script's calls to the engine. A failed submit fails every waiting run, as a failed
        poll does (part of the calls may be in the engine: nothing more is asked of it)."""
        if self.broken:
            return s.job.kill(self.broken)
        try:
            self.engine.submit(s.waiting)
            self.pending += len(s.waiting)
        except Exception as e:  # the engine failed: the runs waiting on it fail
            self.fail(self.waiting_scripts(), e)

    def poll(self, waiting):
        """The calls the engine has finished since the last poll, each to its script; a script
        whose every call is answered gets its replies (a run killed or ended while its call
        decoded: nothing of it). A failed poll fails the `waiting` runs (the trainer goes on;
        rollout re-raises an engine's failure once the sandbox is clean)."""
        try:
            done = self.engine.poll()
        except Exception as e:  # the engine failed: those runs fail
            return self.fail(waiting, e)
        for call, comp in done:
            self.pending -= 1
            s = self.by_run[call.run]
            if s.job.kill_reason is not None or s.job.finished:
                continue
            s.answers[call.index] = comp
            if isinstance(s.waiting, list) and len(s.answers) == len(s.waiting):
                self.hand_back(s)

    def fail(self, waiting, e):
        """The engine failed: the `waiting` runs fail, and every later call at once."""
        self.broken = f"generate failed: {type(e).__name__}: {e}"
        for s in waiting:
            s.job.kill(self.broken)
        self.pending = 0

    def hand_back(self, s):
        """A script's completions to its run, which keeps each full reply and what the engine
        returned, in call order; the script gets mas.answer_of(reply) of each of its calls (""
        without an answer tag): a list for agent.sample, one string for agent(message)."""
        replies = []
        for call in s.waiting:
            comp = s.answers.pop(call.index)
            text = comp if isinstance(comp, str) else getattr(comp, "text", None)
            if not isinstance(text, str):
                s.job.kill("generate returned a completion without text")
                continue
            record = CallRecord(call.role, call.messages, text, comp, call.index)
            self.runs[s.k].calls.append(record)
            replies.append(mas.answer_of(text) or "")
        s.waiting = None
        if s.job.kill_reason is None:
            s.job.reply({"ok": replies if s.many else replies[0]})

    # ---- a script's requests: mas.py's helpers, each waiting for its reply; "done" ends a script

    def request(self, job, msg):
        """One request from a script's helpers, to the method that serves it."""
        s, op = self.live[job], msg.get("op")
        if s.waiting is not None or s.done:
            job.kill("protocol violation: a request while another was pending, or after the answer")
        elif op == "done":
            self.done(s, msg)
        elif op == "agent":
            self.agent(s, msg)
        elif op == "vote":
            self.vote(s, msg)
        elif op in ("run_python", "run_tests"):
            self.program(s, op, msg)
        else:
            job.kill(f"protocol violation: unknown request {str(op)[:40]!r}")

    def done(self, s, msg):
        """The script's answer, or why it has none."""
        s.done, answer = True, msg.get("answer")
        error = str(msg.get("error", "unknown error"))[:1000]
        r = self.runs[s.k]
        if isinstance(answer, str):
            r.answer, r.error = answer[: self.lim.max_output], None
        else:
            r.answer, r.error = None, error

    def agent(self, s, msg):
        """agent(message) or agent.sample(message, n): n AgentCalls, submitted now (continuous)
        or at the next tick; the script's clock stops while it waits on the trainer."""
        role, ins, text, n = (msg.get(key) for key in ("role", "instructions", "message", "n"))
        strings = all(isinstance(x, str) for x in (role, ins, text))
        if not strings or not isinstance(n, int) or n < 1:
            return s.job.kill(
                "bad agent call: role, instructions and message must be strings, n >= 1"
            )
        if s.used + n > self.lim.max_calls:
            return s.job.kill(
                f"limit exceeded: more than max_calls={self.lim.max_calls} agent calls"
            )
        size = len(role) + len(ins) + len(text)
        s.chars += n * size
        if size > self.lim.max_message or s.chars > self.lim.max_messages:
            return s.job.kill("limit exceeded: more than max_message / max_messages characters")
        prompt = mas.agent_messages(role, ins, text, self.short)
        s.waiting = [AgentCall(s.k, s.used + i, role, ins, text, prompt) for i in range(n)]
        s.many, s.used = msg.get("many"), s.used + n
        s.job.pause(s.job.said_at)
        if self.schedule == "continuous":
            self.submit(s)

    def vote(self, s, msg):
        """vote(answers): mas.majority with the `equal` run_workflows was given, counted in a
        thread of its own (the event loop and the other scripts go on meanwhile) on the voting
        script's clock, up to its deadline, checked before each comparison (one comparison may
        overrun it: reward.math_equal's own timeout). At most mas.MAX_VOTE answers of
        mas.MAX_VOTE_CHARS characters."""
        job, votes = s.job, msg.get("answers")
        strings = isinstance(votes, list) and not {type(a) for a in votes} - {str}
        if not strings or len(votes) > mas.MAX_VOTE:
            return job.kill(f"bad vote call: at most {mas.MAX_VOTE} answers, each a string")
        if max(map(len, votes), default=0) > mas.MAX_VOTE_CHARS:
            return job.kill(f"bad vote call: an answer over {mas.MAX_VOTE_CHARS} characters")
        if self.equal is None and self.kinds[s.k] != "code":
            return job.kill(
                "vote() needs run_workflows(..., equal=...): how two answers are compared"
            )
        # a code task's answers are programs (or their outputs): the same answer only as text
        same = reward.text_equal if self.kinds[s.k] == "code" else self.equal
        s.waiting, equal = "vote", partial(_equal_before, job.deadline, same)
        self.background.run(partial(mas.majority, votes, equal), partial(self.counted, s))

    def counted(self, s, won, at):
        """A vote counted: its winner to its script (whose clock stopped then), or its failure."""
        s.waiting = None
        if isinstance(won, _PastDeadline) or at >= s.job.deadline:
            s.job.kill(f"timeout after {s.job.timeout:g}s (counting a vote)")
        elif isinstance(won, Exception):
            s.job.kill(f"vote failed: {type(won).__name__}: {won}")
        else:
            s.job.pause(at)
            s.job.reply({"ok": won})

    def program(self, s, op, msg):
        """run_python(code, input) or run_tests(code): the program in a job of its own, which the
        script waits on, its clock stopped. The job starts in its turn (start_programs)."""
        code, stdin, tests = msg.get("code"), msg.get("input", ""), self.parts[s.k][1]
        if not isinstance(code, str) or not isinstance(stdin, str):
            return s.job.kill(f"bad {op} call: code and input must be strings")
        s.programs += 1
        if s.programs > self.lim.max_programs:
            return s.job.kill(
                f"limit exceeded: more than max_programs={self.lim.max_programs} "
                "run_python / run_tests calls"
            )
        if op == "run_python":
            s.waiting = partial(
                iso.Job,
                "code",
                {"code": code, "stdin": stdin},
                self.lim.code_timeout,
                self.lim.max_output,
                on_end=partial(self.on_python, s),
            )
        elif not (tests or {}).get("inputs"):
            return s.job.reply({"ok": "PASS 0/0 (no visible tests)"})
        else:
            code = programs.program(code, tests)
            report = partial(self.on_tests, s, tests)
            s.waiting = partial(
                programs.tests_job,
                code,
                tests,
                min(4.0, self.lim.code_timeout),
                self.lim.max_output,
                on_message=report,
                on_end=report,
            )
        s.job.pause(s.job.said_at)  # until its program starts: waiting for a slot is not its time
        self.queued.append(s)

    def start_programs(self):
        """Start waiting programs while fewer than self.slots run, in the order they were asked
        for; each one's clock starts as its job does."""
        self.programs = [job for job in self.programs if not job.finished]
        while self.queued and len(self.programs) < self.slots:
            s = self.queued.popleft()
            if s.job.kill_reason is not None or s.job.finished:  # its script is gone: no program
                continue
            s.waiting = s.waiting()
            s.job.resume()  # the script's clock counts its program's time
            self.programs.append(s.waiting)
            self.jobs.append(s.waiting)

    def on_python(self, s, sub):
        """run_python's job ended: its stdout, and how it failed if it did."""
        self.answer_with(s, sub, _program_text(sub))

    def on_tests(self, s, tests, sub, _msg=None):
        """run_tests: once every outcome is in, the report (the script goes on while the job
        exits)."""
        n = len(tests["inputs"])
        if len(sub.messages) >= n or sub.finished:
            self.answer_with(s, sub, programs.tests_report(programs.outcomes(sub, n), tests))

    def answer_with(self, s, sub, text):
        """A run_python / run_tests reply, once (a script may wait on a later one); the script's
        clock stopped when its program's result was complete."""
        if s.waiting is sub and not s.job.finished:
            s.waiting = None
            s.job.pause(sub.said_at)
            s.job.reply({"ok": text[: self.lim.max_output]})

    def ended(self, job):
        """A script's job ended: its run's duration, why it has no answer if it has none (an answer
        it gave stands, though its job then outlived its deadline); the next script is
        launched."""
        s = self.live.pop(job)
        if isinstance(s.waiting, iso.Job):  # its program ends with it
            s.waiting.kill("its script ended")
        r = self.runs[s.k]
        r.duration = job.said_at - job.t0  # (its end)
        if job.kill_reason and not (s.done and job.kill_reason.startswith("timeout")):
            r.answer, r.error = None, r.error or job.kill_reason
            programs.count_failure(job.kill_reason.split(":")[0].split(" after ")[0][:60])
        elif r.answer is None and r.error is None:
            _, err, _, _, rc = programs.outcome(job)
            why = iso.last_line(err)
            if rc is not None and rc >= 0:
                why = f"the script exited (code {rc}) without returning: {why or 'no message'}"
            r.error = why
        self.launch()


class _PastDeadline(Exception):
    """A vote's count reached its script's deadline."""


def _equal_before(deadline, equal, a, b):
    """equal(a, b), unless the deadline has passed: then the count stops."""
    if time.monotonic() >= deadline:
        raise _PastDeadline
    return bool(equal(a, b))


def _program_text(job):
    """What run_python gives a script: the program's stdout, and how it failed if it did."""
    out, err, status, _, _ = programs.outcome(job)
    return out if status == "ok" else f"{out}{status}: {iso.last_line(err) or status}"
