"""What TCP and the shaped queues did during a job on emulated hosts: retransmitted segments,
retransmission timeouts and packets the shapers dropped, summed over the cluster.

A step on emulated hosts can be slower than its bytes over the link for reasons that the byte
counters (odsgd.bench.nic_meter) do not show: N workers' pushes meet in one server's shaped
port (incast), its queue overflows, and a sender that lost the tail of a burst waits a
retransmission timeout (at least 200 ms on Linux) before it sends again. These counters say
whether that happened: each host is a network namespace with its own TCP statistics
(/proc/net/snmp `Tcp: RetransSegs`, /proc/net/netstat `TcpExt: TCPTimeouts`, read through a
process that lives there), and each shaped queue (`tc -s qdisc`) counts its drops: on a
host's side of its veth what the host sends, on the switch's side what it receives
(odsgd/cluster/emulate.py).

`counting(cluster, steps)` around a job: `snapshot(cluster)` before and after it, the
difference per step.
"""
import contextlib
import subprocess

from .nic_meter import namespace_pid

#: (file under /proc/<pid>/net, its section, the counter, our name)
TCP_COUNTERS = (("snmp", "Tcp", "OutSegs", "segments_sent"),
                ("snmp", "Tcp", "RetransSegs", "retransmitted_segments"),
                ("netstat", "TcpExt", "TCPTimeouts", "retransmission_timeouts"),
                ("netstat", "TcpExt", "TCPLossProbes", "tail_loss_probes"))


def parse_proc_counters(text):
    """{section: {counter: value}} of the text of /proc/net/snmp or /proc/net/netstat, whose
    sections are pairs of lines: `Section: names...` then `Section: values...`."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    sections = {}
    for names, values in zip(lines[::2], lines[1::2]):
        section = names[0].rstrip(":")
        if values[0].rstrip(":") != section:
            raise ValueError("unpaired lines of %s in a /proc/net counters file" % section)
        sections[section] = {key: int(value) for key, value in zip(names[1:], values[1:])}
    return sections


def tcp_counters(pid):
    """TCP_COUNTERS of the network namespace of process `pid`, by our names."""
    files = {}
    result = {}
    for name, section, counter, ours in TCP_COUNTERS:
        if name not in files:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                files[name] = parse_proc_counters(f.read())
        result[ours] = files[name].get(section, {}).get(counter, 0)
    return result


def parse_qdisc_drops(text):
    """Dropped packets of every qdisc in `tc -s qdisc show` output (the `dropped N` of each
    ` Sent ... (dropped N, overlimits M requeues K)` line), summed."""
    total = 0
    for line in text.splitlines():
        words = line.replace(",", " ").replace("(", " ").split()
        if words[:1] == ["Sent"] and "dropped" in words:
            total += int(words[words.index("dropped") + 1])
    return total


def qdisc_drops(netns, device):
    """Packets the qdiscs of `device` in network namespace `netns` dropped so far."""
    result = subprocess.run(["tc", "-n", netns, "-s", "qdisc", "show", "dev", device],
                            capture_output=True, text=True, check=True)
    return parse_qdisc_drops(result.stdout)


def snapshot(cluster):
    """The cluster's counters now: TCP_COUNTERS summed over its hosts, `drops_sending` (the
    hosts' own queues), `drops_receiving` (the switch's port of every host) and
    `drops_receiving_first_host` (the port of host 0, where the first server runs)."""
    totals = {ours: 0 for _, _, _, ours in TCP_COUNTERS}
    sending, receiving = 0, []
    for host in cluster.hosts:
        for ours, value in tcp_counters(namespace_pid(host.netns)).items():
            totals[ours] += value
        sending += qdisc_drops(host.netns, host.interface)
        receiving.append(qdisc_drops(cluster.switch, host.switch_port))
    totals.update(drops_sending=sending, drops_receiving=sum(receiving),
                  drops_receiving_first_host=receiving[0])
    return totals


@contextlib.contextmanager
def counting(cluster, steps):
    """Around a job of `steps` steps on `cluster`: yields a dict that holds, once the block
    has ended, the job's counts per step (snapshot before and after, per_step of their
    difference). The one way the benchmarks count a job. Without a cluster (None: a job not
    on emulated hosts) there is nothing to count: yields None."""
    if cluster is None:
        yield None
        return
    counts = {}
    before = snapshot(cluster)
    yield counts
    counts.update(per_step(difference(before, snapshot(cluster)), steps))


def difference(before, after):
    """after - before, counter by counter."""
    return {key: after[key] - before[key] for key in after}


def per_step(counts, steps):
    """Each count over `steps` (the job's steps of one worker), rounded to 0.01."""
    return {key: round(value / float(steps), 2) for key, value in counts.items()}


def summary_line(counts):
    """One line of a job's counts per step (per_step's output)."""
    return ("per step: %.2f retransmitted segments, %.2f retransmission timeouts, %.2f tail "
            "loss probes; drops %.2f sending, %.2f receiving (%.2f at the first server)"
            % (counts["retransmitted_segments"], counts["retransmission_timeouts"],
               counts["tail_loss_probes"], counts["drops_sending"], counts["drops_receiving"],
               counts["drops_receiving_first_host"]))
