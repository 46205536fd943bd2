"""Starting benchmark and study jobs: a local cluster through odsgd.launch, optionally inside
a network namespace whose loopback is shaped to a given bandwidth.

Used by `make demo`, `odsgd.bench throughput` and `odsgd.bench convergence`.
"""
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from ..cluster.emulate import CONGESTION, asked_congestion, tbf_arguments

#: global optimizers of the image jobs that take the jobs' --momentum (the others, Adam and
#: the adaptive family, take theirs through --optimizer-params)
MOMENTUM_OPTIMIZERS = ("sgd", "nag", "signum", "lars", "lbsgd")


def parse_optimizer_params(text):
    """'beta1=0.8,epsilon=1e-6,centered=true' -> {'beta1': 0.8, 'epsilon': 1e-06,
    'centered': True}: the global optimizer's own arguments of an image job; ValueError that
    shows the form otherwise."""
    params = {}
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError("bad optimizer parameter %r: give NAME=VALUE,... e.g. "
                             "beta1=0.9,epsilon=1e-7" % item)
        value = value.strip()
        if value.lower() in ("true", "false"):
            params[name.strip()] = value.lower() == "true"
            continue
        try:
            params[name.strip()] = int(value) if re.fullmatch(r"[-+]?\d+", value) \
                else float(value)
        except ValueError:
            raise ValueError("optimizer parameter %s=%r is not a number or true/false"
                             % (name, value)) from None
    return params


def global_optimizer_params(optimizer, lr, momentum, wd, params_text=""):
    """The arguments of an image job's global optimizer: the rate, weight decay, --momentum
    where the optimizer takes one (MOMENTUM_OPTIMIZERS), then --optimizer-params."""
    params = {"learning_rate": lr, "wd": wd}
    if optimizer in MOMENTUM_OPTIMIZERS:
        params["momentum"] = momentum
    params.update(parse_optimizer_params(params_text))
    return params

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class JobFailed(RuntimeError):
    pass


def launch_command(module_args, workers, servers, timeout, hostfile=None):
    """argv that runs `python -m <module_args>` as a job of `workers` workers and `servers`
    servers on this machine, or with `hostfile` through the ssh launcher on its hosts."""
    launcher = ["--launcher", "local"] if hostfile is None else \
        ["--launcher", "ssh", "-H", hostfile]
    return [sys.executable, "-m", "odsgd.launch", "--job-timeout", str(int(timeout)),
            "-n", str(workers), "-s", str(servers)] + launcher + \
        [sys.executable, "-m"] + [str(a) for a in module_args]


def emulated_hosts(bandwidth_mbit, count, congestion=CONGESTION):
    """`count` emulated hosts (odsgd.emulate), each NIC shaped to `bandwidth_mbit` (0 =
    unshaped), TCP between them under `congestion`: run_job(..., hosts=...) puts one server
    or worker on each, the scheduler with the first server."""
    from ..cluster.emulate import EmulatedCluster
    return EmulatedCluster(count, mbit=bandwidth_mbit, congestion=congestion)


def job_environment(env=None):
    full = dict(os.environ)
    full["PYTHONPATH"] = REPO + os.pathsep + full.get("PYTHONPATH", "")
    full.setdefault("PYTHONUNBUFFERED", "1")
    full.update(env or {})
    return full


def run_job(module_args, workers=2, servers=1, timeout=600, env=None, netns=None,
            show=None, stall_timeout=None, hosts=None):
    """Runs the job and returns its output. `show(line)` decides which lines are echoed as
    progress (default: none). With `stall_timeout`, a job that prints nothing for that many
    seconds is ended (a hung collective shows no CPU and no output; without this it would
    wait for `timeout`). `netns`: run it inside that namespace; `hosts`: an emulated cluster
    (emulated_hosts), the job spread over its hosts by the ssh launcher. Raises JobFailed
    with the reason and the end of the output."""
    environment = job_environment(env)
    if hosts is not None:
        command = hosts.on_host(0, launch_command(module_args, workers, servers, timeout,
                                                  hostfile=hosts.hostfile))
        environment = hosts.environment(environment)
    else:
        command = launch_command(module_args, workers, servers, timeout)
    if netns is not None:
        command = ["ip", "netns", "exec", netns] + command
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=environment, cwd=REPO, text=True,
                               start_new_session=True)
    lines, stalled = [], None
    output = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, output), daemon=True)
    reader.start()
    try:
        while True:
            try:
                line = output.get(timeout=stall_timeout)
            except queue.Empty:
                stalled = stall_timeout
                _end(process)
                break
            if line is None:
                break
            lines.append(line)
            if show is not None and show(line):
                sys.stdout.write(line)
                sys.stdout.flush()
        process.wait(timeout=timeout + 30)
    except BaseException:
        # Ctrl-C or an error here: the launcher ends its own job on SIGTERM.
        _end(process)
        raise
    name = " ".join(map(str, module_args))
    if stalled is not None:
        raise JobFailed("job %s made no progress (printed nothing) for %d s; ended it. Its last "
                        "output:\n%s" % (name, stalled, "".join(lines[-40:])))
    if process.returncode != 0:
        raise JobFailed("job %s failed (exit %d):\n%s"
                        % (name, process.returncode, "".join(lines[-40:])))
    return "".join(lines)


def _read_lines(stream, output):
    for line in stream:
        output.put(line)
    output.put(None)


def _end(process):
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, capture_output=True, text=True)


@contextlib.contextmanager
def shaped_namespace(bandwidth_mbit, name=None):
    """A network namespace whose loopback carries at most `bandwidth_mbit` Mbit/s (token
    bucket, `tc qdisc tbf`; 0 = unshaped), deleted on exit, also on error or Ctrl-C.

    Every process of a job started inside it talks over this one loopback, so the shaped
    rate is shared by all pushes and pulls, as on a worker's network link."""
    if os.geteuid() != 0:
        raise PermissionError("network namespaces need root; run as root or use "
                              "--bandwidth-mbit 0 without a namespace")
    name = name or "odsgd-%d-%d" % (os.getpid(), int(time.time() * 1000) % 100000)
    _ip("netns", "add", name)
    try:
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        if bandwidth_mbit:
            # loopback's packets are up to 64 KiB; the bucket holds a few of them
            subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo",
                            "root"] + tbf_arguments(bandwidth_mbit, min_burst=256 * 1024,
                                                    latency_ms=50),
                           check=True, capture_output=True, text=True)
        yield name
    finally:
        _ip("netns", "delete", name, check=False)


@contextlib.contextmanager
def loopback_link(bandwidth_mbit):
    """The netns argument of run_job for a job on loopback: None unshaped (0), else a
    shaped_namespace."""
    if not bandwidth_mbit:
        yield None
    else:
        with shaped_namespace(bandwidth_mbit) as name:
            yield name


TOPOLOGIES = ("loopback", "hosts")
TOPOLOGY_HELP = ("loopback: every process on one loopback, shaped as a whole; hosts: one "
                 "emulated host per server and per worker (odsgd.emulate, root and sshd), each "
                 "NIC shaped to the bandwidth, the ssh launcher across them")


def tcp_congestion(topology, congestion=CONGESTION):
    """The TCP congestion control a job on `topology` runs: on emulated hosts `congestion`
    (job_placement's), on loopback or with "default" this kernel's default."""
    if topology == "hosts" and asked_congestion(congestion):
        return congestion
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip()
    except OSError:
        return None


@contextlib.contextmanager
def job_placement(topology, bandwidth_mbit, workers, servers, congestion=CONGESTION):
    """Where the jobs of one bandwidth run, as run_job's keyword arguments: {'netns': ...}
    on one (shaped) loopback, or {'hosts': ...} on emulated hosts, one per process, TCP
    between them under `congestion` (odsgd.emulate)."""
    if topology == "hosts":
        with emulated_hosts(bandwidth_mbit, servers + workers, congestion) as cluster:
            yield {"hosts": cluster}
    elif topology == "loopback":
        with loopback_link(bandwidth_mbit) as netns:
            yield {"netns": netns}
    else:
        raise ValueError("topology must be one of %s, got %r" % (", ".join(TOPOLOGIES),
                                                                  topology))


#: the link models of the bound: "full" (a NIC's two directions are queues of their own that
#: run at the same time, as the emulated hosts' are) and "half" (one medium per NIC for both
#: directions, the two-direction count), kept so that older results stay comparable; the
#: shaped loopback has one queue for everything, so both give the same there
DUPLEX = ("full", "half")


def step_wire_bytes(topology, workers, servers, parameter_bytes, duplex="full"):
    """Bytes that one global step puts through the busiest shaped queue, every worker pushing
    and pulling every parameter (M = `parameter_bytes`) once a step.

    hosts (a NIC per process, shaped by one tbf per direction, see odsgd.emulate): a worker's
    NIC carries M out (its push) and M in (its pull) at the same time; the S servers' NICs
    together carry N*M in and N*M out, at best evenly, so the busiest direction of the busiest
    NIC carries max(M, N*M/S). "half" counts both directions of that NIC: twice that.

    loopback (one namespace whose `lo` is shaped by one tbf on its egress, see
    shaped_namespace): every byte that any process sends, push or pull, leaves through that
    one queue exactly once (received packets pass no qdisc), and there is no second direction
    to run in parallel, so the one queue carries 2*N*M whatever S and whatever `duplex`."""
    if duplex not in DUPLEX:
        raise ValueError("duplex must be one of %s, got %r" % (", ".join(DUPLEX), duplex))
    if workers < 1 or servers < 1 or parameter_bytes < 0:
        raise ValueError("need workers >= 1, servers >= 1 and parameter_bytes >= 0")
    if topology == "loopback":
        return 2 * workers * parameter_bytes
    if topology == "hosts":
        one_way = max(parameter_bytes, workers * parameter_bytes / servers)
        return one_way if duplex == "full" else 2 * one_way
    raise ValueError("topology must be one of %s, got %r" % (", ".join(TOPOLOGIES), topology))


def step_wire_bits(topology, workers, servers, parameter_bytes, duplex="full"):
    """step_wire_bytes in bits."""
    return 8 * step_wire_bytes(topology, workers, servers, parameter_bytes, duplex)


def link_bytes_per_sec(bandwidth_mbit):
    """R: bytes/s of one shaped queue (one NIC direction, or the loopback) at `bandwidth_mbit`
    (tc's mbit: 10^6 bits/s); None unshaped (0)."""
    return bandwidth_mbit * 1e6 / 8 if bandwidth_mbit else None


def link_step_seconds(topology, workers, servers, parameter_bytes, bandwidth_mbit,
                      duplex="full"):
    """The link's lower bound on one step's time: step_wire_bytes / R, i.e. on hosts
    max(M / R, N * M / (S * R)) (full duplex), on loopback 2 * N * M / R, R the bytes/s
    of one shaped queue (link_bytes_per_sec); None unshaped."""
    rate = link_bytes_per_sec(bandwidth_mbit)
    if rate is None:
        return None
    return step_wire_bytes(topology, workers, servers, parameter_bytes, duplex) / rate
