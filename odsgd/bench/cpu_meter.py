"""CPU seconds of every process of a benchmark job, read from /proc while the job runs.

A job's processes (launcher, scheduler, servers, workers) all inherit an environment
variable with a value unique to the job; a thread samples the cumulative CPU time
(utime + stime, all threads) of each process that carries it. Afterwards `cpu_in(window)`
gives each role's CPU seconds inside a wall-clock window, interpolated between samples.

Why from outside: a worker can time its own CPU, but the servers run MXNet's C++ server loop
and report nothing; the bound "cores / CPU seconds per step" needs all of them.

Edges: a window shorter than the sampling interval (or one at the job's end, after a
process's last sample) may hold no sample at all. So the benchmark's job itself reads the
CPU times of the job's processes at both edges of its timed window (`job_processes` once
before it, then `edge_sample` at each edge: /proc/<pid>/stat of those pids only, each read
time-stamped), and the meter takes them in (`add_edge_samples`): every timed window has a
sample at its start and at its end.
"""
import bisect
import os
import threading
import time
import uuid

MARKER = "ODSGD_BENCH_JOB"
_TICKS = os.sysconf("SC_CLK_TCK")


def _read_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS     # utime, stime


def _age(pid):
    """Seconds since the process started."""
    with open("/proc/%d/stat" % pid) as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / _TICKS


def _environ(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        entries = f.read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


class JobCPUMeter:
    """Use as a context manager around a job started with `env` updated by `.environment`."""

    def __init__(self, interval=0.2):
        self.token = uuid.uuid4().hex
        self.environment = {MARKER: self.token}
        self.interval = interval
        self.samples = {}      # pid -> [(time, cpu seconds)]
        self.roles = {}        # pid -> role
        self.foreign = set()   # pids of processes that are not the job's
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self):
        processes = job_processes(self.token, self.foreign)
        with self._lock:
            for pid, role, when, cpu in edge_sample(processes):
                self.roles[pid] = role
                bisect.insort(self.samples.setdefault(pid, []), (when, cpu))

    def add_edge_samples(self, edges):
        """Takes in samples that the job read itself (`edge_sample`'s lists, e.g. a worker's
        `cpu_edges`: one at each edge of its timed window), in time order among the meter's
        own. Pids and times may come as JSON gives them back (strings, lists)."""
        with self._lock:
            for edge in edges or ():
                for pid, role, when, cpu in edge:
                    pid = int(pid)
                    self.roles.setdefault(pid, role)
                    samples = self.samples.setdefault(pid, [])
                    bisect.insort(samples, (float(when), float(cpu)))

    def cpu_in(self, start, end):
        """{role: CPU seconds of all its processes between wall-clock `start` and `end`}."""
        totals = {}
        for pid, samples in self.samples.items():
            used = _at(samples, end) - _at(samples, start)
            role = self.roles[pid]
            totals[role] = totals.get(role, 0.0) + used
        return totals


def job_processes(token=None, foreign=None):
    """{pid: role} of the processes that carry the job's marker `token` (default: this
    process's own, from its environment; none: {}). `foreign`, a set, remembers settled
    processes that are not the job's, to skip them on the next scan."""
    token = token if token is not None else os.environ.get(MARKER)
    found = {}
    if not token:
        return found
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if foreign is not None and pid in foreign:
            continue
        try:
            # Read the environment every time: between fork and exec a child still has
            # its parent's environment (without the marker, or with the launcher's role).
            env = _environ(pid)
            if env.get(MARKER) != token:
                if foreign is not None and _age(pid) > 2.0:
                    foreign.add(pid)                   # settled and not ours: skip from now on
                continue
            found[pid] = env.get("DMLC_ROLE", "launcher")
        except (OSError, ValueError, IndexError):
            continue                                   # exited between listdir and read
    return found


def edge_sample(processes):
    """One sample of the CPU seconds of `processes` ({pid: role}, job_processes) at this
    moment: [[pid, role, time.time(), CPU seconds], ...], each time taken just before its
    read, so that a window's edge is bracketed to within a read (microseconds). Processes
    that have exited are left out. JSON-ready: it travels in the job's result file."""
    sample = []
    for pid, role in processes.items():
        try:
            when = time.time()
            sample.append([pid, role, when, _read_cpu(pid)])
        except (OSError, ValueError, IndexError):
            continue
    return sample


def _at(samples, when):
    """Cumulative CPU at time `when`, linear between samples, flat outside them (before its
    first sample a process counts from that sample: what it used earlier is start-up)."""
    times = [t for t, _ in samples]
    i = bisect.bisect_left(times, when)
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1
