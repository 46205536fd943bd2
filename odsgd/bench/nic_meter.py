"""The first server's NIC while a job runs on emulated hosts: its byte counters sampled every
few milliseconds, on the clock of the workers' traces, and how much of a window each
direction of the link was busy.

On `--topology hosts` (odsgd.emulate) every host is a network namespace with one NIC, `eth0`,
shaped to the same rate in both directions; the first server runs on the first host (the
ssh launcher puts server i on host i, and the scheduler beside the first server). A process's
/proc/<pid>/net/dev lists the interfaces of its own network namespace, so the counters of
that host's `eth0` can be read through any process that lives there: the meter takes one
that is there from before the job starts until after it ends (the host's sshd, see
`namespace_pid`), so that it covers the whole job, which the server process, started later by
the job, would not.

`rx` is what the server's host received (the workers' pushes: "in"), `tx` what it sent (the
answers, the pulls' weights: "out"). Times are `time.time()`, the system clock in seconds
since the epoch, the clock of MXNet's profiler traces (odsgd/worker/trace.py), so that a sample
and a trace event of the same moment have the same time.
"""
import subprocess
import threading
import time

#: a direction is busy where its rate exceeds this share of the link's rate
BUSY_SHARE = 0.5


def read_counters(pid, interface="eth0"):
    """(rx bytes, tx bytes) of `interface` in the network namespace of process `pid`."""
    with open("/proc/%d/net/dev" % pid) as f:
        for line in f:
            name, sep, fields = line.partition(":")
            if sep and name.strip() == interface:
                values = fields.split()
                return int(values[0]), int(values[8])
    raise ValueError("process %d's network namespace has no interface %r" % (pid, interface))


def namespace_pid(netns):
    """A process that lives in network namespace `netns` (`ip netns pids`, the first one):
    on an emulated host, its sshd."""
    result = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    pids = [int(p) for p in result.stdout.split()] if result.returncode == 0 else []
    if not pids:
        raise ValueError("no process lives in network namespace %s to read its counters "
                         "through" % netns)
    return pids[0]


class ServerNICMeter:
    """Samples (time, rx bytes, tx bytes) of `interface` in the network namespace of `pid`
    every `interval` seconds in a thread; a context manager around the job. `samples` holds
    them in time order; each time is taken just before its read."""

    def __init__(self, pid, interface="eth0", interval=0.003):
        self.pid = pid
        self.interface = interface
        self.interval = interval
        self.samples = []
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.sample()                  # fails here, before the job, if nothing can be read
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def sample(self):
        when = time.time()
        rx, tx = read_counters(self.pid, self.interface)
        self.samples.append((when, rx, tx))

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except (OSError, ValueError) as error:    # the namespace's process is gone
                self.error = error
                return


def server_nic_meter(place, label):
    """A ServerNICMeter on the first server's host where a job runs on emulated hosts
    (`place`, odsgd.bench.jobs.job_placement's; None elsewhere, or where its counters cannot
    be read: then a line starting with [label] says so)."""
    cluster = place.get("hosts")
    if cluster is None:
        return None
    host = cluster.hosts[0]
    try:
        pid = namespace_pid(host.netns)
        read_counters(pid, host.interface)        # readable: else a note, no meter
        return ServerNICMeter(pid, interface=host.interface)
    except (OSError, ValueError) as error:
        print("[%s] no server NIC figures: %s" % (label, error), flush=True)
        return None


def rates(samples):
    """[(start, end, in bytes/s, out bytes/s)] between consecutive samples (time, rx, tx):
    the rate of each interval, constant within it."""
    spans = []
    for (t0, rx0, tx0), (t1, rx1, tx1) in zip(samples, samples[1:]):
        if t1 > t0:
            spans.append((t0, t1, (rx1 - rx0) / (t1 - t0), (tx1 - tx0) / (t1 - t0)))
    return spans


def nic_summary(samples, link_mbit, start_s=None, end_s=None):
    """Over [start_s, end_s] (default: the samples' span), from counters (time, rx bytes, tx
    bytes) at least two of which bracket it:

    * in_busy, out_busy: the share of the window in which that direction's rate (constant
      between two samples) exceeded BUSY_SHARE of the link's rate (`link_mbit`, tc's mbit:
      10^6 bits/s); both_busy: the share in which both did at once. None where the link is
      unshaped (`link_mbit` 0: no rate to compare with);
    * in_mbit, out_mbit: the mean rates over the window, in Mbit/s;
    * window_s, and samples: how many intervals the window covered.

    The parts of the window that no two samples cover count as idle."""
    spans = rates(sorted(samples))
    if not spans:
        raise ValueError("need at least two samples at different times")
    start_s = spans[0][0] if start_s is None else start_s
    end_s = spans[-1][1] if end_s is None else end_s
    if end_s <= start_s:
        raise ValueError("empty window [%r, %r]" % (start_s, end_s))
    threshold = BUSY_SHARE * link_mbit * 1e6 / 8 if link_mbit else None
    busy = {"in": 0.0, "out": 0.0, "both": 0.0}
    moved = {"in": 0.0, "out": 0.0}
    covered = 0
    for t0, t1, rate_in, rate_out in spans:
        length = min(t1, end_s) - max(t0, start_s)
        if length <= 0:
            continue
        covered += 1
        moved["in"] += rate_in * length
        moved["out"] += rate_out * length
        if threshold is not None:
            hot_in, hot_out = rate_in > threshold, rate_out > threshold
            busy["in"] += length if hot_in else 0.0
            busy["out"] += length if hot_out else 0.0
            busy["both"] += length if hot_in and hot_out else 0.0
    window = end_s - start_s
    shares = {key: (value / window if threshold is not None else None)
              for key, value in busy.items()}
    return {"in_busy": shares["in"], "out_busy": shares["out"], "both_busy": shares["both"],
            "in_mbit": 8 * moved["in"] / window / 1e6,
            "out_mbit": 8 * moved["out"] / window / 1e6,
            "link_mbit": link_mbit or None, "busy_share": BUSY_SHARE,
            "window_s": window, "samples": covered}


def summary_line(summary):
    """One line of text for a summary of nic_summary."""
    if summary["in_busy"] is None:
        return ("server NIC: unshaped, no link rate to be busy against; in %.0f Mbit/s, out "
                "%.0f Mbit/s on average" % (summary["in_mbit"], summary["out_mbit"]))
    return ("server NIC: in busy %.0f%%, out busy %.0f%%, both %.0f%% (busy: above %.0f%% of "
            "%d Mbit/s; mean in %.0f, out %.0f Mbit/s)"
            % (100 * summary["in_busy"], 100 * summary["out_busy"], 100 * summary["both_busy"],
               100 * summary["busy_share"], summary["link_mbit"], summary["in_mbit"],
               summary["out_mbit"]))
