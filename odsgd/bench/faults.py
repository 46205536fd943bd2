"""`python -m odsgd.bench faults`: the fault sweep of docs/reliability.md, on emulated hosts.

    python -m odsgd.bench faults [--faults ...] [--points ...] [--json FILE]

Every case runs the job odsgd/bench/fault_sweep_job.py under `odsgd.launch --max-restarts N`:
2 workers and 1 server on three emulated hosts (odsgd.emulate, root and sshd; the launcher,
the scheduler and the server on host 0, a worker on each of hosts 1 and 2, every NIC shaped
to --mbit), the ssh launcher. The job resumes itself from the newest whole checkpoint of its
folder. Seven faults (odsgd/bench/fault_cases.py: a worker, the server or the scheduler
killed, a worker host's link down, Ctrl-C to the launcher, a worker that hangs, a worker's
ValueError) strike at three points of the first attempt (before the push, rounds in flight,
during a save) and at three of the attempt restarted after a first fault (workers up before
the load, during the load, the first step); one more case repeats a fault before the
restarted attempt saved anything, with --checkpoint-dir, for the launcher to give up. Each
row: the launcher's exit code, restarts, its words on the attempt, the step resumed from, the
steps replayed, the seconds from the fault to the first resumed step, what was left, and the
weights at the end against an uninterrupted job's (odsgd/bench/fault_report.py).

Every case runs in a cluster of its own, torn down after it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid

from ..common import checkpoint_index
from ..cluster import emulate
from . import fault_cases, fault_report
from .fault_cases import FAULTS, INSIDE_FAULTS, POINTS, POINT_NAMES, RUN_NAME
from .fault_injection import (Fault, LiveLaunch, namespaces_left, processes_left, promptly,
                              wait_for_file)
from .jobs import JobFailed, run_job

WORKERS, SERVERS = fault_report.WORKERS, 1
#: kv.rank of the worker that marks the points of the first attempt and of the load and the
#: first step; the restarted attempt's `up` is marked by the worker on the last host
TARGET_RANK = 1
JOB_MODULE = "odsgd.bench.fault_sweep_job"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench faults",
                                description=__doc__.splitlines()[0])
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    p.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS))
    p.add_argument("--no-give-up", dest="give_up", action="store_false",
                   help="leave out the case where the launcher gives up")
    p.add_argument("--steps", type=int, default=16, help="steps of the job")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--fault-step", type=int, default=10,
                   help="the step of the before-push and in-flight points")
    p.add_argument("--save-step", type=int, default=12, help="the save the fault cuts short")
    p.add_argument("--mbit", type=float, default=20,
                   help="every NIC's rate: slow enough that a step's rounds stay in flight "
                        "for a while")
    p.add_argument("--part-elements", type=int, default=32768,
                   help="ODSGD_PART_ELEMENTS: the job's big weight travels in parts")
    p.add_argument("--timeout", type=int, default=240,
                   help="--job-timeout of every attempt (but a hang's)")
    p.add_argument("--hang-timeout", type=int, default=60,
                   help="--job-timeout of the hang's cases, which end each attempt: longer "
                        "than an attempt takes")
    p.add_argument("--tries", type=int, default=3,
                   help="runs of a case whose fault missed its point")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--keep", help="keep the checkpoints and weights in this folder")
    args = p.parse_args(argv)
    if args.save_step % args.save_every or args.fault_step % args.save_every == 0 or \
            args.save_step <= args.fault_step:
        p.error("--save-step must be a save (a multiple of --save-every) after --fault-step, "
                "--fault-step no save")
    return args


class Sweep(object):
    """The settings of one sweep and its folder of checkpoints and weights."""

    def __init__(self, args, folder):
        self.args = args
        self.folder = folder
        self.env = {"ODSGD_PART_ELEMENTS": str(args.part_elements), "OMP_NUM_THREADS": "1"}

    def job_args(self, out, tag, *extra):
        os.makedirs(out, exist_ok=True)
        return [JOB_MODULE, "--steps", self.args.steps, "--out", out, "--tag", tag,
                "--fault-step", self.args.fault_step, "--save-step", self.args.save_step,
                "--fault-rank", TARGET_RANK] + list(extra)

    def timeout(self, fault):
        """The --job-timeout of every attempt of a case of `fault`."""
        return self.args.hang_timeout if fault == "hang" else self.args.timeout


def case_job_args(sweep, case, folder, tag, fault_host):
    """The job's arguments for `case`: its checkpoints, its marks and injected fault."""
    args = ["--save-every", sweep.args.save_every, "--checkpoints",
            os.path.join(folder, "checkpoints"), "--fault-host", fault_host]
    if case.first_fault is not None:
        args += ["--mark", "%s:0" % case.first_fault[1]]
    if case.fault in INSIDE_FAULTS:
        args += ["--inject", "%s:%s:%d" % (case.fault, case.point, case.attempt)]
    elif case.point != "save":   # an outside fault aims at a save by its files
        args += ["--mark", "%s:%d" % (case.point, case.attempt)]
    os.makedirs(os.path.join(folder, "checkpoints"))
    return sweep.job_args(os.path.join(folder, "out"), tag, *args)


def files_of(checkpoints, step):
    """The files of the job's save after `step` (without its prefix), temporaries and the
    marker included."""
    prefix = checkpoint_index.step_prefix(checkpoints, RUN_NAME, step)
    return [path[len(prefix):].lstrip("-")
            for path in checkpoint_index.checkpoint_files(prefix)]


def cut_the_save(fault, files_at_fault, files_at_end):
    """Whether a fault during a save came before the save was done where the fault acts:
    before the target's states file (for the server: the servers' states; for the
    scheduler: the marker). Ctrl-C acts when the attempt's launcher ends the job (the restart
    loop passes it on within 0.1 s): the save must not be whole (no marker) when the attempt
    had ended."""
    if fault == "ctrl-c":
        return ".whole.json" not in files_at_end
    before = {"server killed": "worker0.states.server",
              "scheduler killed": ".whole.json"}.get(fault, "worker%d.states" % TARGET_RANK)
    return not any(name.startswith(before) for name in files_at_fault)


#: during a save, the file whose appearance an outside fault waits for: the target's weights
#: (for the server and the scheduler rank 0's, whose save then has the servers write theirs
#: and the marker written). Ctrl-C (None) strikes at the save's start, the first worker's
#: `saving` line: it takes up to 0.1 s more to reach the job, and a save's files are all
#: written within some 20 ms of the first.
SAVE_TRIGGER = {"server killed": "worker0.params", "scheduler killed": "worker0.params",
                "ctrl-c": None}


# -- one case -------------------------------------------------------------------------------
def run_case(sweep, case, reference):
    """`case` run (again where its fault missed its point, up to --tries in all): its row."""
    for attempt in range(1, sweep.args.tries + 1):
        name = case.name + ("_try%d" % attempt if attempt > 1 else "")
        row = _run_once(sweep, case, os.path.join(sweep.folder, name))
        row["tries"] = attempt
        if not row["missed"]:
            break
    row["comparison"] = fault_report.compare(os.path.join(row["case"], "out"), reference)
    return row


def _run_once(sweep, case, folder):
    tag = "odsgd-faults-%s" % uuid.uuid4().hex
    checkpoints = os.path.join(folder, "checkpoints")
    restart_options = ["--max-restarts", case.max_restarts]
    if case.checkpoint_dir:
        restart_options += ["--checkpoint-dir", checkpoints]
    row = case.row(case=folder)
    prepared = []   # the faults made ready: closed once the launcher has exited
    with emulate.EmulatedCluster(WORKERS + SERVERS, mbit=sweep.args.mbit) as cluster:
        module_args = case_job_args(sweep, case, folder, tag, cluster.hosts[-1].address)
        job = LiveLaunch(cluster, module_args, WORKERS, SERVERS, sweep.timeout(case.fault),
                         sweep.env, restart_options)
        ends = AttemptEnds(job, checkpoints, sweep.args.save_step)
        try:
            row.update(_faults_and_exit(sweep, case, cluster, job, checkpoints, prepared))
        finally:
            job.end()
            for fault in prepared:
                fault.close()
        row["processes"] = processes_left(cluster, tag)
    row["namespaces"] = namespaces_left(cluster)
    lines = job.snapshot()
    with open(os.path.join(folder, "launcher.log"), "w") as log:   # to read a row's story
        log.writelines("%.3f %s\n" % line for line in lines)
    row.update(fault_report.measure(lines, row["fault_at"]))
    row["at_attempt_ends"] = ends.found
    if case.point == "save":
        end = ends.found.get(case.attempt, {})
        row["cut_save"] = {"step": sweep.args.save_step, "files_at_fault": row["files_at_fault"],
                           "files_at_end": end.get("files", []),
                           "latest_at_end": end.get("latest")}
    row["missed"] = missed(sweep, case, row, lines)
    return row


class AttemptEnds(object):
    """At each attempt's end (the launcher's line): the newest whole checkpoint and the files
    of the save after --save-step, before a restarted attempt saves there again."""

    def __init__(self, job, checkpoints, save_step):
        self.checkpoints, self.save_step = checkpoints, save_step
        self.found = {}
        job.on_line.append(self.look)

    def look(self, _arrived, line):
        ended = fault_report.ATTEMPT_ENDED.search(line)
        if ended:
            latest = checkpoint_index.latest_checkpoint(self.checkpoints)
            self.found[int(ended.group(1)) - 1] = {
                "latest": None if latest is None else latest.step,
                "files": files_of(self.checkpoints, self.save_step)}


def _faults_and_exit(sweep, case, cluster, job, checkpoints, prepared):
    """Strikes the first fault (if any) and the case's own; waits for the launcher's exit."""
    found = {}
    if case.first_fault is not None:
        first = strike_at(sweep, case.first_fault, 0, cluster, job, checkpoints, prepared)
        found["first_fault_at"] = first["fault_at"]
    found.update(strike_at(sweep, (case.fault, case.point), case.attempt, cluster, job,
                           checkpoints, prepared, after=found.get("first_fault_at", 0.0)))
    try:
        found["exit_code"] = job.process.wait(
            timeout=(case.max_restarts + 1) * (sweep.timeout(case.fault) + 60))
    except subprocess.TimeoutExpired:   # still running: ended by job.end()
        found["exit_code"] = None
    return found


def strike_at(sweep, fault_point, attempt, cluster, job, checkpoints, prepared, after=0.0):
    """Waits until attempt `attempt` of the job is at the point and makes the fault there
    (an inside fault: sees the job make it). Returns {fault_at, aim_to_fault, target_pid,
    files_at_fault (a save)}."""
    fault, point = fault_point
    limit = sweep.timeout(fault) + 120
    job.wait_for(r"odsgd\.launch: attempt %d of \d+ started" % (attempt + 1), limit,
                 after=after)
    if fault in INSIDE_FAULTS:
        seen, match = job.wait_for(_point_line(point, attempt), limit, after=after)
        return {"fault_at": seen, "aim_to_fault": 0.0, "target_pid": int(match.group(3)),
                "files_at_fault": _save_files(sweep, point, checkpoints)}
    ready = Fault(fault, cluster, job, attempt, cluster.hosts[1:])
    prepared.append(ready)
    with promptly():
        if point == "save":
            seen, pid, address = _aim_at_save(sweep, fault, attempt, job, checkpoints, limit)
        else:
            seen, match = job.wait_for(_point_line(point, attempt), limit, after=after)
            pid, address = int(match.group(3)), match.group(1)
        fault_at = ready.strike(pid, address)
        files = _save_files(sweep, point, checkpoints)
    return {"fault_at": fault_at, "aim_to_fault": fault_at - seen, "target_pid": pid,
            "files_at_fault": files}


def _point_line(point, attempt):
    """The job's line at `point` of `attempt`: groups (host, step, pid)."""
    return (r"^\[worker \d+ on ([\d.]+)\] fault-point %s attempt %d( step \d+)? pid (\d+)"
            % (point, attempt))


def _aim_at_save(sweep, fault, attempt, job, checkpoints, limit):
    """(time seen, target pid, target address) once the save after --save-step has its
    trigger file: the target's weights file (SAVE_TRIGGER for the others)."""
    prefix = checkpoint_index.step_prefix(checkpoints, RUN_NAME, sweep.args.save_step)
    _, match = job.wait_for(r"^\[worker \d+ on ([\d.]+)\] rank %d attempt %d pid (\d+)"
                            % (TARGET_RANK, attempt), limit)
    seen, _ = job.wait_for(r"saving %s attempt %d pid" % (re.escape(prefix), attempt), limit)
    trigger = SAVE_TRIGGER.get(fault, "worker%d.params" % TARGET_RANK)
    if trigger is not None:
        seen = wait_for_file(prefix + "-" + trigger, timeout=30)
    return seen, int(match.group(2)), match.group(1)


def _save_files(sweep, point, checkpoints):
    return files_of(checkpoints, sweep.args.save_step) if point == "save" else None


def missed(sweep, case, row, lines):
    """Why the case's fault missed its point (None where it hit it): the target got past
    the point before the fault (its line of having done so came first), or a save was done
    where the fault acts (cut_the_save)."""
    if case.point == "save":
        cut = row["cut_save"]
        return None if cut_the_save(case.fault, cut["files_at_fault"], cut["files_at_end"]) \
            else "the save was done"
    pid, attempt = row["target_pid"], case.attempt
    rounds = r"^rounds of step \d+ done [\d.]+ s after the mark attempt %d$" % attempt
    past = {"up": r"^rank \d+ attempt %d pid %d$" % (attempt, pid),
            "load": r"^resumed from step \d+ attempt %d pid %d$" % (attempt, pid),
            "before-push": r"^step %d attempt %d loss \S+ pid %d$" % (sweep.args.fault_step,
                                                                      attempt, pid),
            "in-flight": rounds, "first-step": rounds}
    pattern = past[case.point]
    early = [t for t, _ in fault_report.worker_lines(lines, pattern) if t < row["fault_at"]]
    return "the target got past it first" if early else None


# -- the sweep ------------------------------------------------------------------------------
def uninterrupted(sweep):
    """The reference: one job of every step, no fault, no save, no restart option. It marks
    the in-flight point (and waits there) to measure how long a step's rounds stay on the
    wire."""
    out = os.path.join(sweep.folder, "uninterrupted")
    with emulate.EmulatedCluster(WORKERS + SERVERS, mbit=sweep.args.mbit) as cluster:
        output = run_job(sweep.job_args(out, "odsgd-faults-%s" % uuid.uuid4().hex, "--mark",
                                        "in-flight:0"),
                         WORKERS, SERVERS, timeout=sweep.args.timeout, env=sweep.env,
                         hosts=cluster)
    rounds = re.search(r"rounds of step \d+ done ([\d.]+) s after the mark", output)
    return out, float(rounds.group(1)) if rounds else None


def progress(row):
    """One line on a case, as it ends."""
    return ("%s, %s: fault %.3f s after the point was seen; exit %s, %d restarts, `%s; %s`; "
            "resumed from %s, %d replayed, %s s to the first resumed step; %s; %s; %s" % (
                row["fault"], POINT_NAMES[row["point"]], row["aim_to_fault"],
                row["exit_code"], row["restarts_used"], row["reason"], row["decision"],
                row["resumed_from"], row["steps_replayed"],
                fault_report.or_dash(row["seconds_to_resumed_step"], "%.1f"),
                fault_report.left_text(row), fault_report.versus_text(row),
                "passed" if fault_report.passed(row) else "FAILED"))


def sweep_all(sweep):
    reference, rounds_seconds = uninterrupted(sweep)
    print("uninterrupted job: %d steps; a step's rounds took %s s on the wire (step %d)"
          % (sweep.args.steps, rounds_seconds, sweep.args.fault_step), flush=True)
    rows = []
    for case in fault_cases.plan(sweep.args.faults, sweep.args.points, sweep.args.give_up):
        try:
            row = run_case(sweep, case, reference)
        except JobFailed as failure:   # the case could not be aimed: said, and the sweep goes on
            row = failed_row(case, failure)
        row["rounds_seconds"] = rounds_seconds
        print(progress(row), flush=True)
        rows.append(row)
    return rows


def failed_row(case, failure):
    """The row of a case whose point never came (its output's end in `error`)."""
    return case.row(error=str(failure)[-3000:], missed="its point never came", exit_code=None,
                    restarts_used=0, reason=None, decision=None, resumed_from=None,
                    steps_replayed=0, seconds_to_resumed_step=None, aim_to_fault=0.0,
                    comparison=None, processes={"after_exit": 0, "gone_after": None,
                                                "killed": 0}, namespaces=[])


def main(argv=None):
    args = parse_args(argv)
    try:
        emulate.require_root_and_sshd()
    except emulate.EmulationError as error:
        print("odsgd.bench faults: %s" % error)
        return 2
    folder = args.keep or tempfile.mkdtemp(prefix="odsgd-faults-")
    os.makedirs(folder, exist_ok=True)
    try:
        rows = sweep_all(Sweep(args, folder))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    tables = fault_report.fault_table(rows) + "\n\n" + fault_report.cut_save_table(rows)
    print("\n" + tables.replace(folder + os.sep, ""))   # paths relative to the sweep's folder
    if args.json:
        with open(args.json, "w") as f:
            settings = {k: v for k, v in vars(args).items() if k != "keep"}   # a local path
            f.write(json.dumps({"settings": settings, "rows": rows}, indent=1,
                               default=str).replace(folder + os.sep, "") + "\n")
    return 0 if all(fault_report.passed(row) for row in rows) else 1
