"""`python -m odsgd.bench faults`: the fault sweep of docs/reliability.md, on emulated hosts.

    python -m odsgd.bench faults [--mbit 20] [--faults ...] [--points ...] [--json FILE]

Each of four faults (a worker killed, the server killed, a worker host's link down, Ctrl-C
to the launcher) is aimed at each of three points of a step (before the push, with the step's
rounds in flight, during a save) of odsgd/bench/fault_sweep_job.py: 2 workers and 1 server on
three emulated hosts (odsgd.emulate, root and sshd; the scheduler and the server on host 0,
a worker on each of hosts 1 and 2, every NIC shaped to --mbit), started by odsgd.launch's ssh
launcher. For each it measures the launcher's exit code, the seconds from the fault to the
launcher's exit, the launcher's reason, the processes and namespaces left, and then resumes
from the last checkpoint that every worker finished saving, in a new job, to the last step:
its weights (each worker's own and the global ones) against an uninterrupted job's. A save
that the fault cut short is loaded too, in a job of its own, to see that it is refused.

Every job runs in a cluster of its own, torn down after it.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import numpy as np

from .. import emulate
from .jobs import REPO, JobFailed, job_environment, launch_command, run_job
from .jobs import _end as end_launcher

FAULTS = ("worker killed", "server killed", "link down", "ctrl-c")
POINTS = ("before-push", "in-flight", "save")
WORKERS, SERVERS = 2, 1
#: kv.rank of the worker that marks the point: the one killed, whose host is unplugged
TARGET_RANK = 1
#: the issue's bound on the time from a fault to the launcher's exit
END_SECONDS = 10.0
#: the NumPy reference's tolerance (tests/quadratic_simulation.py)
RTOL, ATOL = 2e-5, 2e-6
JOB_MODULE = "odsgd.bench.fault_sweep_job"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench faults",
                                description=__doc__.splitlines()[0])
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    p.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS))
    p.add_argument("--steps", type=int, default=16, help="steps of the uninterrupted job")
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--fault-step", type=int, default=10,
                   help="the step of the before-push and in-flight points")
    p.add_argument("--save-step", type=int, default=12, help="the save the fault cuts short")
    p.add_argument("--mbit", type=float, default=20,
                   help="every NIC's rate: slow enough that a step's rounds stay in flight "
                        "for a while")
    p.add_argument("--part-elements", type=int, default=32768,
                   help="ODSGD_PART_ELEMENTS: the job's big weight travels in parts")
    p.add_argument("--timeout", type=int, default=240, help="--job-timeout of every job")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--keep", help="keep the checkpoints and weights in this folder")
    args = p.parse_args(argv)
    if args.save_step % args.save_every or args.fault_step % args.save_every == 0:
        p.error("--save-step must be a save (a multiple of --save-every), --fault-step not")
    return args


class Sweep(object):
    """The settings of one sweep and its folder of checkpoints and weights."""

    def __init__(self, args, folder):
        self.args = args
        self.folder = folder
        self.env = {"ODSGD_PART_ELEMENTS": str(args.part_elements), "OMP_NUM_THREADS": "1"}

    def job_args(self, out, tag, *extra):
        os.makedirs(out, exist_ok=True)
        return [JOB_MODULE, "--steps", self.args.steps, "--out", out, "--tag", tag] + \
            list(extra)

    def run_on_hosts(self, module_args):
        """Runs a job to its end on a fresh cluster; returns its output (JobFailed if it
        fails)."""
        with emulate.EmulatedCluster(WORKERS + SERVERS, mbit=self.args.mbit) as cluster:
            return run_job(module_args, WORKERS, SERVERS, timeout=self.args.timeout,
                           env=self.env, hosts=cluster)


class LiveLaunch(object):
    """odsgd.launch started on host 0 of `cluster`; its lines with the time each arrived."""

    def __init__(self, cluster, sweep, module_args):
        command = launch_command(module_args, WORKERS, SERVERS, sweep.args.timeout,
                                 hostfile=cluster.hostfile)
        env = cluster.environment(job_environment(sweep.env))
        self.process = subprocess.Popen(cluster.on_host(0, command), env=env, cwd=REPO,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        self.lines = []                   # (time it arrived, line)
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.changed:
                self.lines.append((time.time(), line.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern, timeout):
        """(arrival time, match) of the first line matching `pattern`."""
        regex, deadline = re.compile(pattern), time.time() + timeout
        with self.changed:
            while True:
                for arrived, line in self.lines:
                    match = regex.search(line)
                    if match:
                        return arrived, match
                if time.time() > deadline or not self.reader.is_alive():
                    raise JobFailed("no line matching %r:\n%s" % (pattern, self.tail()))
                self.changed.wait(0.1)

    def matches(self, pattern):
        regex = re.compile(pattern)
        with self.changed:
            return [(t, m) for t, m in ((t, regex.search(line)) for t, line in self.lines)
                    if m]

    def tail(self, count=40):
        with self.changed:
            return "\n".join(line for _, line in self.lines[-count:])

    def end(self):
        """SIGTERM to the launcher (it ends its job), SIGKILL to its group after 20 s."""
        end_launcher(self.process)


# -- aiming and injecting -------------------------------------------------------------------
def target_worker(job, timeout):
    """(pid, host address) of the worker of kv.rank TARGET_RANK, from its `rank` line."""
    _, match = job.wait_for(r"^\[worker \d+ on ([\d.]+)\] rank %d pid (\d+)" % TARGET_RANK,
                            timeout)
    return int(match.group(2)), match.group(1)


#: during a save, the file of the save whose appearance a fault waits for ('': any), and the
#: file the fault must come before to cut the save (None: any file of a whole save)
SAVE_TRIGGER = {"worker killed": "worker%d.params" % TARGET_RANK,
                "link down": "worker%d.params" % TARGET_RANK,
                "server killed": "worker0.params",   # rank 0 then has the servers save
                "ctrl-c": ""}
SAVE_CUT_BEFORE = {"worker killed": "worker%d.states" % TARGET_RANK,
                   "link down": "worker%d.states" % TARGET_RANK,
                   "server killed": "worker0.states.server",
                   "ctrl-c": None}


def aim(job, sweep, fault, point, checkpoints, timeout):
    """Waits until the job is at `point`; returns the time the point was seen: the target
    worker's line, or for a save the file SAVE_TRIGGER[fault] of the save --save-step."""
    if point == "save":
        prefix = os.path.join(checkpoints, "step%d" % sweep.args.save_step)
        job.wait_for(r"saving %s pid" % re.escape(prefix), timeout)
        return wait_for_file(prefix + "-" + SAVE_TRIGGER[fault], timeout=30)
    # only the target worker marks its points
    seen, _ = job.wait_for(r"fault-point %s step %d pid" % (point, sweep.args.fault_step),
                           timeout)
    return seen


def wait_for_file(start, timeout):
    """The time a file whose path starts with `start` appeared (polled every millisecond)."""
    folder, name = os.path.split(start)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(entry.startswith(name) for entry in os.listdir(folder)):
            return time.time()
        time.sleep(0.001)
    raise JobFailed("no file %s* appeared within %d s" % (start, timeout))


@contextlib.contextmanager
def promptly():
    """Real-time priority for this thread while it aims and strikes (root): on the busy
    2-core machine a millisecond's sleep of an ordinary thread lasted tens of milliseconds,
    in which a worker's whole save is over."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass
    try:
        yield
    finally:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def cut_the_save(fault, files_at_fault, whole_files):
    """Whether a fault during a save came before the save was done where the fault acts:
    SAVE_CUT_BEFORE[fault] not yet written (for Ctrl-C: not every file of a whole save)."""
    before = SAVE_CUT_BEFORE[fault]
    if before is None:
        return not set(whole_files) <= set(files_at_fault)
    return not any(name.startswith(before) for name in files_at_fault)


def server_pid(cluster):
    """The server's pid on host 0 (DMLC_ROLE=server in its environment)."""
    for pid in cluster.processes(0):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if b"DMLC_ROLE=server" in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    raise JobFailed("no server process on host 0")


class Fault(object):
    """One fault, made ready before the point comes, so that `strike` takes effect at once.
    `worker`: (pid, address) of the target worker; `server`: the server's pid."""

    def __init__(self, fault, cluster, job, worker, server):
        if fault not in FAULTS:
            raise ValueError("unknown fault %r" % fault)
        self.fault, self.job, self.worker, self.server = fault, job, worker, server
        self.unplug = None
        if fault == "link down":
            # `ip -batch -` runs each command as it reads it: started now, it unplugs the
            # host within a millisecond of `strike`, where starting `ip` then took 5-20 ms
            # on this busy machine, in which a save of the job is over.
            host = [h for h in cluster.hosts if h.address == worker[1]][0]
            self.unplug = subprocess.Popen(["chrt", "-f", "1", "ip", "-n", host.netns,
                                            "-batch", "-"], stdin=subprocess.PIPE, text=True)
            self.command = "link set %s down\n" % host.interface

    def strike(self):
        """Makes the fault happen; returns the time it did."""
        struck = time.time()
        if self.fault == "worker killed":
            os.kill(self.worker[0], signal.SIGKILL)
        elif self.fault == "server killed":
            os.kill(self.server, signal.SIGKILL)
        elif self.fault == "link down":
            self.unplug.stdin.write(self.command)
            self.unplug.stdin.flush()
        else:   # a terminal's Ctrl-C: SIGINT to the foreground process group
            os.killpg(self.job.process.pid, signal.SIGINT)
        return struck

    def close(self):
        """Ends the `ip` made ready (it sits in the host's namespace, where it would count
        as a process left)."""
        if self.unplug is not None:
            self.unplug.stdin.close()
            try:
                self.unplug.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.unplug.kill()
                self.unplug.wait()


# -- what a fault left ----------------------------------------------------------------------
def tagged_processes(tag):
    """Pids of the processes of this machine whose command line holds `tag`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    if tag.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def processes_left(cluster, tag, settle=1.0, grace=10.0):
    """The job's processes `settle` seconds after the launcher exited: its tag in their
    command line, or on a host (its sshd daemon excepted). Any still there `grace` seconds
    later are killed (by pid). Returns {after_exit: how many, gone_after: seconds after the
    exit until none was left (None: never), killed: how many had to be}."""
    time.sleep(settle)
    first = left = _job_processes(cluster, tag)
    started = time.time()
    while left and time.time() - started < grace:
        time.sleep(0.2)
        left = _job_processes(cluster, tag)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    gone_after = None if left else round(settle + (time.time() - started if first else 0), 1)
    return {"after_exit": len(first), "gone_after": gone_after, "killed": len(left)}


def _job_processes(cluster, tag):
    pids = set(tagged_processes(tag))
    for host in cluster.hosts:
        pids.update(cluster.processes(host.index))
    return sorted(pids)


def namespaces_left(cluster):
    """Namespaces and folders of `cluster` still there (after its teardown)."""
    return [entry for entry in emulate.leftovers() if cluster.tag in entry]


def launcher_reason(job):
    """The launcher's reason for ending the job and what it says it ended."""
    found = job.matches(r"ERROR odsgd\.launch: (.+?); ended the job(.*)$")
    if not found:
        return None, None
    match = found[-1][1]
    return match.group(1), match.group(2).strip()


# -- checkpoints ----------------------------------------------------------------------------
def saves(job, checkpoints):
    """(the steps whose save every worker finished, odsgd.save_checkpoint having returned;
    the steps whose save was started and not finished)."""
    started = {int(m.group(1)) for _, m in job.matches(
        r"saving %s/step(\d+) pid" % re.escape(checkpoints))}
    finished = [int(m.group(1)) for _, m in job.matches(
        r"\] saved %s/step(\d+)$" % re.escape(checkpoints))]
    whole = sorted(step for step in set(finished) if finished.count(step) == WORKERS)
    return whole, sorted(started - set(whole))


def files_of(checkpoints, step):
    """The files of the save after `step` (without the prefix), temporary ones included."""
    prefix = "step%d-" % step
    return sorted(f[len(prefix):] for f in os.listdir(checkpoints) if f.startswith(prefix))


# -- one fault, the resume, the comparison --------------------------------------------------
def run_fault(sweep, fault, point, tries=3):
    """The job with `fault` at `point`: what the launcher did and what was left. A fault
    during a save that came after the save was done where it acts (cut_the_save) missed its
    point: the job is run again, up to `tries` times in all."""
    for attempt in range(1, tries + 1):
        row = _attempt(sweep, fault, point, "%s_%s%s" % (
            fault.replace(" ", "_"), point, "_try%d" % attempt if attempt > 1 else ""))
        row["attempts"] = attempt
        if point != "save":
            return row
        whole = [f for f in files_of(row["checkpoints"], sweep.args.save_step -
                                     sweep.args.save_every) if not f.endswith(".tmp")]
        row["cut_the_save"] = cut_the_save(fault, row["files_at_fault"], whole)
        if row["cut_the_save"]:
            return row
    return row


def _attempt(sweep, fault, point, name):
    case = os.path.join(sweep.folder, name)
    checkpoints = os.path.join(case, "checkpoints")
    os.makedirs(checkpoints)
    tag = "odsgd-faults-%s" % uuid.uuid4().hex
    module_args = sweep.job_args(case, tag, "--save-every", sweep.args.save_every,
                                 "--checkpoints", checkpoints, "--fault-step",
                                 sweep.args.fault_step, "--fault-rank", TARGET_RANK,
                                 "--fault-point", point if point != "save" else "none")
    row = {"fault": fault, "point": point, "case": case}
    with emulate.EmulatedCluster(WORKERS + SERVERS, mbit=sweep.args.mbit) as cluster:
        job = LiveLaunch(cluster, sweep, module_args)
        try:
            row.update(_inject_and_wait(sweep, fault, point, cluster, job, checkpoints))
        finally:
            job.end()
        row["processes"] = processes_left(cluster, tag)
    row["namespaces"] = namespaces_left(cluster)
    row["reason"], row["ended"] = launcher_reason(job)
    row["whole_saves"], row["cut_saves"] = saves(job, checkpoints)
    row["cut_save_files"] = {step: files_of(checkpoints, step) for step in row["cut_saves"]}
    row["rounds_done_before_fault"] = any(
        arrived < row["fault_at"] for arrived, _ in job.matches(r"rounds of step \d+ done"))
    row["checkpoints"] = checkpoints
    return row


def _inject_and_wait(sweep, fault, point, cluster, job, checkpoints, end_timeout=60):
    timeout = sweep.args.timeout
    prepared = Fault(fault, cluster, job, target_worker(job, timeout), server_pid(cluster))
    try:
        with promptly():
            seen = aim(job, sweep, fault, point, checkpoints, timeout)
            fault_at = prepared.strike()
            files = files_of(checkpoints, sweep.args.save_step) if point == "save" else None
    finally:
        prepared.close()
    try:
        code = job.process.wait(timeout=end_timeout)
    except subprocess.TimeoutExpired:
        code = None   # still running: ended by job.end()
    seconds = time.time() - fault_at if code is not None else None
    return {"exit_code": code, "seconds": seconds, "fault_at": fault_at,
            "aim_to_fault": fault_at - seen, "files_at_fault": files}


def resume(sweep, prefix, first_step, out):
    """A new job loads `prefix` (saved after step `first_step`) and runs to the last step,
    writing its weights to `out`; returns None, or the error that ended it."""
    module_args = sweep.job_args(out, "odsgd-faults-%s" % uuid.uuid4().hex, "--resume",
                                 prefix, "--first-step", first_step)
    try:
        sweep.run_on_hosts(module_args)
    except JobFailed as failure:
        return error_of(str(failure)).replace(sweep.folder + os.sep, "")
    return None


def error_of(output):
    """The last exception of a failed job's output, in one line (else its last line)."""
    lines = [line.strip() for line in output.strip().splitlines()]
    found = [i for i, line in enumerate(lines)
             if re.search(r"\b[\w.]*(?:Error|Exception): ", line)]
    if not found:
        return lines[-1] if lines else ""
    line = lines[found[-1]]
    if line.endswith("Traceback (most recent call last):"):
        # MXNet's errors give their message after the C++ source line
        message = [text for text in lines[found[-1] + 1:found[-1] + 4]
                   if text and not text.startswith("File ")]
        return "%s %s" % (line.split(": ")[0], message[0]) if message else line
    return line


def compare(out, reference):
    """How far the weights in `out` (every worker's own and the global ones) are from
    `reference`'s: the largest max|a - b| / max|b| over the arrays, and whether every array
    is within the NumPy reference's tolerance (RTOL, ATOL)."""
    worst, close = 0.0, True
    for rank in range(WORKERS):
        name = "rank%d.npz" % rank
        with np.load(os.path.join(out, name)) as got, \
                np.load(os.path.join(reference, name)) as want:
            for key in want.files:
                a, b = got[key], want[key]
                worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
                close = close and np.allclose(a, b, rtol=RTOL, atol=ATOL)
    return {"equal": bool(close), "max_relative_difference": worst}


def resume_row(sweep, row, reference):
    """Resumes `row`'s job from its last whole save and compares; loads its cut save too."""
    found = {}
    if row["whole_saves"]:
        step = row["whole_saves"][-1]
        out = os.path.join(row["case"], "resumed")
        error = resume(sweep, os.path.join(row["checkpoints"], "step%d" % step), step, out)
        found["resumed_from"] = step
        found["resume"] = {"error": error} if error else compare(out, reference)
    for step in row["cut_saves"]:
        out = os.path.join(row["case"], "cut_step%d" % step)
        error = resume(sweep, os.path.join(row["checkpoints"], "step%d" % step), step, out)
        found.setdefault("cut_save_loads", {})[step] = \
            {"error": error} if error else compare(out, reference)
    return found


def uninterrupted(sweep):
    """The reference: one job of every step, no fault, no save. It marks the in-flight
    point (and waits there) to measure how long a step's rounds stay on the wire."""
    out = os.path.join(sweep.folder, "uninterrupted")
    output = sweep.run_on_hosts(sweep.job_args(
        out, "odsgd-faults-%s" % uuid.uuid4().hex, "--fault-point", "in-flight",
        "--fault-step", sweep.args.fault_step, "--fault-rank", TARGET_RANK))
    rounds = re.search(r"rounds of step \d+ done ([\d.]+) s after the mark", output)
    return out, float(rounds.group(1)) if rounds else None


# -- report ---------------------------------------------------------------------------------
POINT_NAMES = {"before-push": "before the push", "in-flight": "rounds in flight",
               "save": "during a save"}


def left_text(row):
    processes = row["processes"]
    text = "%d processes" % processes["after_exit"]
    if processes["after_exit"]:
        text += (" (killed %d)" % processes["killed"] if processes["killed"] else
                 " (gone %.1f s after the exit)" % processes["gone_after"])
    return text + ", %d namespaces" % len(row["namespaces"])


def resume_text(found):
    if "resume" not in found:
        return "no whole save"
    if found["resume"].get("error"):
        return "step %d: failed, `%s`" % (found["resumed_from"], found["resume"]["error"])
    return "step %d: %s, %.1e" % (found["resumed_from"], "equal" if found["resume"]["equal"]
                                  else "**differs**",
                                  found["resume"]["max_relative_difference"])


def fault_table(rows):
    lines = ["| fault | point | exit code | s to exit | the launcher's reason | left 1 s after "
             "the exit | resumed from the last whole save: vs uninterrupted, max rel. diff |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        seconds = "%.1f" % row["seconds"] if row["seconds"] is not None else "> 60"
        point = POINT_NAMES[row["point"]]
        if not row.get("cut_the_save", True):
            point += " (missed: the save was done)"
        elif row.get("attempts", 1) > 1:
            point += " (try %d)" % row["attempts"]
        lines.append("| %s | %s | %s | %s | `%s` | %s | %s |" % (
            row["fault"], point, row["exit_code"], seconds,
            (row["reason"] or "none").replace("|", "/"), left_text(row), resume_text(row)))
    return "\n".join(lines)


def cut_save_table(rows):
    lines = ["| fault | save | its files at the fault | after the job | loading it |",
             "|---|---|---|---|---|"]
    for row in rows:
        for step, files in row["cut_save_files"].items():
            loaded = row.get("cut_save_loads", {}).get(step, {})
            outcome = ("refused: `%s`" % loaded["error"] if loaded.get("error") else
                       "loaded, %s (%.1e)" % ("equal" if loaded.get("equal") else
                                              "**differs**",
                                              loaded.get("max_relative_difference", 0.0)))
            at_fault = row["files_at_fault"] if step == row.get("save_step") else None
            lines.append("| %s | step %d | %s | %s | %s |" % (
                row["fault"], step, ", ".join(at_fault or []) or "-",
                ", ".join(files) or "none", outcome))
    return "\n".join(lines)


def passed(row):
    """Whether `row` meets the issue's bar: ended within END_SECONDS with a reason, nothing
    left, and the resume equal to the uninterrupted job (and an in-flight fault came before
    the step's rounds were done)."""
    return (row["exit_code"] not in (0, None)
            and not (row["point"] == "in-flight" and row["rounds_done_before_fault"])
            and row.get("cut_the_save", True) and row["seconds"] is not None
            and row["seconds"] <= END_SECONDS and row["reason"] is not None
            and row["processes"]["after_exit"] == 0 and not row["namespaces"]
            and row.get("resume", {}).get("equal", False))


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
    print("\n" + fault_table(rows) + "\n\n" + cut_save_table(rows))
    if args.json:   # paths relative to the sweep's folder
        with open(args.json, "w") as f:
            f.write(json.dumps({"settings": vars(args), "rows": rows}, indent=1,
                               default=str).replace(folder + os.sep, "") + "\n")
    return 0 if all(passed(row) for row in rows) else 1


def sweep_all(sweep):
    reference, rounds_seconds = uninterrupted(sweep)
    print("uninterrupted job: %d steps; a step's rounds took %s s on the wire (step %d)"
          % (sweep.args.steps, rounds_seconds, sweep.args.fault_step), flush=True)
    rows = []
    for fault in sweep.args.faults:
        for point in sweep.args.points:
            row = run_fault(sweep, fault, point)
            row["save_step"] = sweep.args.save_step
            row["rounds_seconds"] = rounds_seconds
            row.update(resume_row(sweep, row, reference))
            print("%s, %s: fault %.3f s after the point was seen; exit %s after %s s, %s; "
                  "%s; resume %s" % (fault, POINT_NAMES[point], row["aim_to_fault"],
                                     row["exit_code"], row["seconds"], row["reason"],
                                     left_text(row), resume_text(row)), flush=True)
            rows.append(row)
    return rows
