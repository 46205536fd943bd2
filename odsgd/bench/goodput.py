"""`python -m odsgd.bench goodput`: how much payload TCP carries through one shaped NIC of
the emulated hosts (odsgd/cluster/emulate.py), one way and both ways at once, against the closed form
MSS / (MTU + 14): every segment of MSS payload bytes costs a whole Ethernet frame at the
shaper (tbf counts the frame, headers included).

    python -m odsgd.bench goodput --mbit 156.25,390.625 --json runs/goodput.json

The benchmarks' link bound (`link_bound_samples_per_sec`) counts payload bytes at the full
rate, so no mode can pass this share of it; docs/benchmarks.md says where that matters.
"""
import argparse
import json
import subprocess
import sys
import time

from ..cluster import emulate
from .step_model import payload_share

PORT = 5301

_SINK = r"""
import socket, sys, time
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
sock, _ = server.accept()
count, first = 0, None
while True:
    data = sock.recv(1 << 20)
    if not data:
        break
    if first is None:
        first = time.perf_counter()
    count += len(data)
print(count, time.perf_counter() - first, flush=True)
"""

_SOURCE = r"""
import socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
print(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG), flush=True)
block, end = b"x" * (1 << 20), time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    sock.sendall(block)
sock.close()
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m odsgd.bench goodput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mbit", default="156.25,390.625",
                   help="NIC rates in Mbit/s, comma-separated (default: the paper cluster's "
                        "10 and 25 Gbit/s at byte scale 64)")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each transfer")
    p.add_argument("--congestion", default=emulate.CONGESTION,
                   help="TCP congestion control of the hosts (default %(default)s)")
    p.add_argument("--json", default=None, help="write the rows here")
    return p.parse_args(argv)


def transfers(cluster, pairs, seconds):
    """Runs one bulk TCP flow per (source host, destination host) of `pairs` at once;
    returns [(payload Mbit/s, MSS)] in their order."""
    sinks, sources = [], []
    try:
        for i, (_, dst) in enumerate(pairs):
            sink = subprocess.Popen(cluster.on_host(dst, [sys.executable, "-c", _SINK,
                                                          str(PORT + i)]),
                                    stdout=subprocess.PIPE, text=True)
            sinks.append(sink)
            if sink.stdout.readline().strip() != "listening":
                raise RuntimeError("the receiving end on host %d did not start" % dst)
        for i, (src, dst) in enumerate(pairs):
            sources.append(subprocess.Popen(
                cluster.on_host(src, [sys.executable, "-c", _SOURCE,
                                      cluster.hosts[dst].address, str(PORT + i),
                                      str(seconds)]),
                stdout=subprocess.PIPE, text=True))
        mss = [int(s.stdout.readline()) for s in sources]
        for source in sources:
            source.wait(timeout=seconds + 60)
        results = []
        for sink, segment in zip(sinks, mss):
            count, elapsed = sink.communicate(timeout=60)[0].split()
            results.append((int(count) * 8 / float(elapsed) / 1e6, segment))
        return results
    finally:
        for process in sinks + sources:
            if process.poll() is None:
                process.kill()
                process.wait()


def measure(mbit, seconds, congestion=emulate.CONGESTION):
    """Rows of one rate: a flow one way, then a flow each way at once, on two hosts."""
    with emulate.EmulatedCluster(2, mbit=mbit, congestion=congestion) as cluster:
        mtu = int(subprocess.run(
            cluster.on_host(0, ["cat", "/sys/class/net/%s/mtu" % cluster.hosts[0].interface]),
            capture_output=True, text=True, check=True).stdout)
        rows = []
        for name, pairs in (("one way", [(0, 1)]), ("both ways", [(0, 1), (1, 0)])):
            for (rate, mss), (src, dst) in zip(transfers(cluster, pairs, seconds), pairs):
                rows.append({"mbit": mbit, "flows": name, "from_host": src, "to_host": dst,
                             "goodput_mbit": rate, "share": rate / mbit, "mss": mss,
                             "mtu": mtu, "closed_form_share": payload_share(mtu, mss=mss),
                             "tcp_congestion": congestion})
        return rows


def main(argv=None):
    args = parse_args(argv)
    try:
        emulate.require_root_and_sshd()
    except emulate.EmulationError as error:
        print("odsgd.bench goodput: %s" % error, file=sys.stderr)
        return 2
    rows = []
    print("%10s  %-9s  %5s  %14s  %6s  %s" % ("Mbit/s", "flows", "hosts", "payload Mbit/s",
                                              "share", "MSS / (MTU + 14)"))
    for mbit in [float(m) for m in args.mbit.split(",")]:
        for row in measure(mbit, args.seconds, args.congestion):
            rows.append(row)
            print("%10g  %-9s  %d->%d  %14.2f  %6.3f  %.3f (MSS %d, MTU %d)" % (
                mbit, row["flows"], row["from_host"], row["to_host"], row["goodput_mbit"],
                row["share"], row["closed_form_share"], row["mss"], row["mtu"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python -m odsgd.bench goodput " + " ".join(
                argv if argv is not None else sys.argv[1:]), "rows": rows,
                "when": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        print("wrote %s" % args.json)
    return 0
