"""Making the fault sweep's faults on emulated hosts (odsgd.emulate, root): the launcher
started and read line by line, a fault made ready before its point comes and struck the
moment the point is seen, and what a job left behind. Imports nothing of MXNet."""
import contextlib
import os
import re
import signal
import subprocess
import threading
import time

from ..cluster import emulate
from .jobs import REPO, JobFailed, job_environment, launch_command
from .jobs import _end as end_launcher


class LiveLaunch(object):
    """`python -m odsgd.launch` (with `restart_options`) started on host 0 of `cluster`; its
    lines with the time each arrived. `on_line(arrived, line)` callbacks run in the reading
    thread, as each line arrives."""

    def __init__(self, cluster, module_args, workers, servers, timeout, env,
                 restart_options=()):
        command = launch_command(module_args, workers, servers, timeout,
                                 hostfile=cluster.hostfile)
        at = command.index("odsgd.launch") + 1
        command[at:at] = [str(option) for option in restart_options]
        self.process = subprocess.Popen(cluster.on_host(0, command),
                                        env=cluster.environment(job_environment(env)),
                                        cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines = []                   # (time it arrived, line)
        self.on_line = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            arrived, line = time.time(), line.rstrip("\n")
            with self.changed:
                self.lines.append((arrived, line))
                self.changed.notify_all()
            for callback in list(self.on_line):
                callback(arrived, line)
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern, timeout, after=0.0):
        """(arrival time, match) of the first line matching `pattern` that arrived after
        `after`."""
        regex, deadline = re.compile(pattern), time.time() + timeout
        with self.changed:
            seen = 0
            while True:
                for arrived, line in self.lines[seen:]:
                    match = regex.search(line) if arrived >= after else None
                    if match:
                        return arrived, match
                seen = len(self.lines)
                if time.time() > deadline or not self.reader.is_alive():
                    raise JobFailed("no line matching %r:\n%s" % (pattern, self.tail()))
                self.changed.wait(0.1)

    def snapshot(self):
        with self.changed:
            return list(self.lines)

    def tail(self, count=40):
        with self.changed:
            return "\n".join(line for _, line in self.lines[-count:])

    def end(self):
        """SIGTERM to the launcher (it ends its job), SIGKILL to its group after 20 s."""
        end_launcher(self.process)


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


def wait_for_file(start, timeout):
    """The time a file whose path starts with `start` appeared (polled every millisecond)."""
    folder, name = os.path.split(start)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(entry.startswith(name) for entry in os.listdir(folder)):
            return time.time()
        time.sleep(0.001)
    raise JobFailed("no file %s* appeared within %d s" % (start, timeout))


def role_pid(cluster, role, attempt, timeout=60.0):
    """The pid of the job's `role` process ('server', 'scheduler') of attempt `attempt` on
    host 0: DMLC_ROLE and ODSGD_RESTART_COUNT in its environment, Python running it (not a
    shell that runs it)."""
    wanted = {b"DMLC_ROLE=" + role.encode(), b"ODSGD_RESTART_COUNT=%d" % attempt}
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in cluster.processes(0):
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    environ = set(f.read().split(b"\0"))
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    program = os.path.basename(f.read().split(b"\0")[0])
            except OSError:
                continue
            if wanted <= environ and program.startswith(b"python"):
                return pid
        time.sleep(0.1)
    raise JobFailed("no %s process of attempt %d on host 0 within %d s"
                    % (role, attempt, timeout))


class Unplug(object):
    """A host's link, ready to go down within a millisecond and to come back: `ip -batch -`
    runs each command as it reads it, where starting `ip` took 5-20 ms on this busy machine,
    in which a save of the job is over. Back up, the host's route gets the cluster's TCP
    congestion control again (odsgd.emulate sets it on the route, which the link's going
    down removed)."""

    def __init__(self, cluster, host):
        self.host = host
        self.route = None
        if cluster.congestion:
            self.route = ("route replace %s.0/%d dev %s proto kernel scope link src %s "
                          "congctl %s\n" % (emulate.NETWORK, emulate.PREFIX_LENGTH,
                                            host.interface, host.address, cluster.congestion))
        self.ip = subprocess.Popen(["chrt", "-f", "1", "ip", "-n", host.netns, "-batch", "-"],
                                   stdin=subprocess.PIPE, text=True)
        self.down = False

    def _send(self, command):
        self.ip.stdin.write(command)
        self.ip.stdin.flush()

    def strike(self):
        self._send("link set %s down\n" % self.host.interface)
        self.down = True

    def restore(self):
        if self.down:
            self._send("link set %s up\n" % self.host.interface + (self.route or ""))
            self.down = False

    def close(self):
        """Ends the `ip` (it sits in the host's namespace, where it would count as a process
        left); the link is up again first."""
        with contextlib.suppress(OSError, ValueError):
            self.restore()
            self.ip.stdin.close()
        try:
            self.ip.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.ip.kill()
            self.ip.wait()


class Fault(object):
    """An outside fault (fault_cases.OUTSIDE_FAULTS) of one attempt, made ready before its
    point comes so that `strike` takes effect at once. For a link down, every worker host is
    made ready (the point's line says which one is the target); its link comes back when the
    attempt's launcher has ended the job (`restore_when_ended`), so that the next attempt
    reaches the host again, as after a passing outage."""

    def __init__(self, fault, cluster, job, attempt, worker_hosts):
        self.fault, self.job, self.pid = fault, job, None
        self.unplugs = {}
        if fault in ("server killed", "scheduler killed"):
            self.pid = role_pid(cluster, fault.split()[0], attempt)
        elif fault == "link down":
            self.unplugs = {host.address: Unplug(cluster, host) for host in worker_hosts}

    def strike(self, worker_pid, worker_address):
        """Makes the fault happen (`worker_*`: the target worker's, from its point's line);
        returns the time it did."""
        struck = time.time()
        if self.fault == "worker killed":
            os.kill(worker_pid, signal.SIGKILL)
        elif self.fault in ("server killed", "scheduler killed"):
            os.kill(self.pid, signal.SIGKILL)
        elif self.fault == "link down":
            self.unplugs[worker_address].strike()
            self.job.on_line.append(self._restore_when_ended)
        elif self.fault == "ctrl-c":   # a terminal's: SIGINT to the foreground process group
            os.killpg(self.job.process.pid, signal.SIGINT)
        else:
            raise ValueError("%r is no outside fault" % self.fault)
        return struck

    def _restore_when_ended(self, _arrived, line):
        if re.search(r"ERROR odsgd\.launch: .*; ended the job", line):
            for unplug in self.unplugs.values():
                unplug.restore()

    def close(self):
        for unplug in self.unplugs.values():
            unplug.close()


# -- what a job left ------------------------------------------------------------------------
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
