"""`python -m odsgd.emulate`: an emulated cluster of N hosts on this machine, to run ssh jobs.

    python -m odsgd.emulate --hosts 3 --mbit 100 -- \\
        python -m odsgd.launch --launcher ssh -H '$ODSGD_HOSTFILE' -n 2 -s 1 python train.py

Each host is a network namespace with one NIC (`eth0`, a veth pair) plugged into a bridge
that lives in a namespace of its own (the "switch"), so nothing is added to this machine's
own namespace. Host i has the address 198.18.0.(i+1)/24: 198.18.0.0/15 is reserved for
benchmarking network devices (RFC 2544), and no host has a route beyond its /24, so nothing is
routed out. Each NIC is shaped in both directions with `tc tbf` (egress on the host's side of
the veth: what the host sends; egress on the switch's side: what it receives). A delay needs
netem, which not every kernel has; --delay-ms is refused with a clear error where it is
missing.

TCP between the hosts runs CUBIC, Linux's default congestion control, whatever this machine's
default is (`--congestion`; `default` keeps the kernel's): a namespace inherits the machine's
default (BBR on some cloud images), and that default decides how N workers' flows share a
server's NIC: at 8 workers + 1 server under BBR, the server's answers reached some workers
hundreds of milliseconds after others, and every round waited for the slowest worker
(docs/benchmarks.md, "TCP congestion control on the emulated hosts").
The algorithm is set on each host's route to the cluster's network (`ip route ... congctl`),
which a namespace allows where its sysctl may only pick from `tcp_allowed_congestion_control`.

Every host runs an sshd that listens on its own address only and accepts only a key generated
for this cluster (no passwords, no keyboard-interactive, root only by key). The keys, the
sshd configurations, the ssh client configuration and the hostfile lie in a temporary folder
under /run (root-only, in memory). COMMAND runs on the first host with ODSGD_HOSTFILE set to
the hostfile and an `ssh` on PATH that uses the generated key and known host keys, so `ssh
<address> ...` (and dmlc_tracker's ssh launcher) works without prompts and without touching
~/.ssh.

Everything is torn down at the end, also on errors, Ctrl-C and SIGTERM: COMMAND's process
group, every process left in a host's namespace (sshd included), the namespaces (with them the
veths and the bridge) and the temporary folder. The exit code is COMMAND's.

Also usable from Python:

    with EmulatedCluster(hosts=3, mbit=100) as cluster:
        subprocess.run(cluster.on_host(0, argv), env=cluster.environment())

`EmulatedCluster(..., outsider=True)` also plugs an "outsider" into the switch: a namespace
that is no host of the cluster (not in the hostfile, no sshd) with the address
198.18.1.254/24 only, so it reaches the hosts only on addresses of 198.18.1.0/24 that
`add_address` gives them. The tests use it to try a job's ports from outside the job.
"""
import argparse
import contextlib
import getpass
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

#: name prefix of every namespace and temporary folder this module creates
PREFIX = "odsgd-emu"
#: the emulated hosts' network (RFC 2544 benchmarking range), one /24 of it
NETWORK = "198.18.0"
PREFIX_LENGTH = 24
#: TCP congestion control of the hosts' connections: Linux's default (module docstring)
CONGESTION = "cubic"
#: another /24 of that range for addresses outside every job: the outsider's and the second
#: addresses of add_address (nothing routes between it and NETWORK)
OUTSIDE_NETWORK = "198.18.1"
SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = "/run/sshd"   # sshd's compiled-in privilege separation folder (Debian)
#: seconds an sshd waits for an answer from a silent client before it ends the session (3
#: probes, one a second): a host cut off from the job's launcher ends its processes.
CLIENT_ALIVE_INTERVAL = 1
CLIENT_ALIVE_COUNT = 3


class EmulationError(RuntimeError):
    pass


def _run(argv, check=True):
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise EmulationError("%s failed (exit %d): %s"
                             % (" ".join(argv), result.returncode, result.stderr.strip()))
    return result


def _in(netns, *argv):
    return ["ip", "netns", "exec", netns] + list(argv)


def require_root_and_sshd():
    """Raises EmulationError naming the fix when the emulation cannot run here."""
    if os.geteuid() != 0:
        raise EmulationError("odsgd.emulate needs root (network namespaces, tc, sshd); run it "
                             "as root")
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise EmulationError("odsgd.emulate needs `%s`; install iproute2 and "
                                 "openssh-client" % tool)
    if not os.access(SSHD, os.X_OK):
        raise EmulationError("odsgd.emulate needs %s; install openssh-server (`make install` "
                             "does so when run as root)" % SSHD)


def netem_available():
    """Whether this kernel has the netem qdisc (tried on a throwaway namespace's loopback)."""
    name = "%s-probe-%d" % (PREFIX, os.getpid())
    _run(["ip", "netns", "add", name])
    try:
        return _run(_in(name, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                        "1ms"), check=False).returncode == 0
    finally:
        _run(["ip", "netns", "delete", name], check=False)


class Host(object):
    def __init__(self, index, netns, address):
        self.index = index
        self.netns = netns
        self.address = address
        self.interface = "eth0"       # its NIC, inside its namespace
        self.switch_port = "p%d" % index   # the other end, inside the switch namespace
        self.sshd = None              # Popen

    def __repr__(self):
        return "Host(%d, %s, %s)" % (self.index, self.netns, self.address)


class EmulatedCluster(object):
    """N emulated hosts (see the module's docstring); a context manager that tears everything
    down on exit."""

    def __init__(self, hosts, mbit=0, delay_ms=0, user=None, outsider=False,
                 congestion=CONGESTION):
        if not 1 <= hosts <= 250:
            raise EmulationError("--hosts must be between 1 and 250, not %d" % hosts)
        if mbit < 0 or delay_ms < 0:
            raise EmulationError("--mbit and --delay-ms must not be negative")
        self.mbit = mbit
        self.delay_ms = delay_ms
        self.congestion = asked_congestion(congestion)
        self.user = user or getpass.getuser()
        tag = "%s-%d-%d" % (PREFIX, os.getpid(), int(time.time() * 1000) % 100000)
        self.tag = tag
        self.switch = tag + "-sw"
        self.hosts = [Host(i, "%s-h%d" % (tag, i), "%s.%d" % (NETWORK, i + 1))
                      for i in range(hosts)]
        # not in self.hosts: no sshd, not in the hostfile
        self.outsider = (Host(hosts, tag + "-out", OUTSIDE_NETWORK + ".254")
                         if outsider else None)
        self.folder = None
        self.namespaces = []          # created, in order
        self.hostfile = None
        self.ssh_config = None
        self.bin = None               # folder with the `ssh` wrapper

    # -- set up ----------------------------------------------------------------------------
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        require_root_and_sshd()
        if self.delay_ms and not netem_available():
            raise EmulationError("--delay-ms needs the netem qdisc, which this kernel lacks; "
                                 "leave --delay-ms out (tbf/htb shape the rate only)")
        self._make_folder()
        self._add_namespace(self.switch)
        _run(_in(self.switch, "ip", "link", "add", "br0", "type", "bridge"))
        _run(_in(self.switch, "ip", "link", "set", "br0", "up"))
        for host in self.hosts:
            self._add_host(host)
        if self.outsider is not None:
            self._add_host(self.outsider)
        self._write_keys_and_configs()
        # sshd refuses to start without its privilege separation folder, which Debian's
        # service scripts create at boot; a freshly installed, never started openssh-server
        # (a container, CI) has none.
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
        for host in self.hosts:
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_for_sshd(host)

    def _make_folder(self):
        # sshd's StrictModes wants every folder above the authorized keys owned by root and
        # not writable by others: /tmp is world-writable, /run is not (and is in memory).
        base = "/run" if _strict_modes_ok("/run") else None
        self.folder = tempfile.mkdtemp(prefix=self.tag + "-", dir=base)
        os.chmod(self.folder, 0o700)
        self.strict_modes = base is not None

    def _add_namespace(self, name):
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(_in(name, "ip", "link", "set", "lo", "up"))
        # IPv4 only: no link-local IPv6 address a job could be reached on besides its own.
        _run(_in(name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1"), check=False)

    def _add_host(self, host):
        self._add_namespace(host.netns)
        # Both ends are created inside the namespaces: nothing appears in this machine's own.
        _run(["ip", "-n", self.switch, "link", "add", host.switch_port, "type", "veth",
              "peer", "name", host.interface, "netns", host.netns])
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "master", "br0"])
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "up"])
        _run(["ip", "-n", host.netns, "addr", "add",
              "%s/%d" % (host.address, PREFIX_LENGTH), "dev", host.interface])
        _run(["ip", "-n", host.netns, "link", "set", host.interface, "up"])
        if self.congestion:
            self._set_congestion(host)
        if self.mbit or self.delay_ms:
            self._shape(host.netns, host.interface)            # what the host sends
            self._shape(self.switch, host.switch_port)         # what the host receives

    def _set_congestion(self, host):
        # The kernel's route to the host's /24, with the algorithm: every connection between
        # hosts (both ends, passive ones too) takes it from the route.
        network = ipaddress.ip_interface("%s/%d" % (host.address, PREFIX_LENGTH)).network
        done = _run(["ip", "-n", host.netns, "route", "replace", str(network), "dev",
                     host.interface, "proto", "kernel", "scope", "link", "src", host.address,
                     "congctl", self.congestion], check=False)
        if done.returncode != 0:
            raise EmulationError(
                "this kernel cannot give the emulated hosts TCP congestion control %r (%s); "
                "load it (modprobe tcp_%s) or keep the kernel's default with --congestion "
                "default" % (self.congestion, done.stderr.strip(), self.congestion))

    def _shape(self, netns, device):
        command = ["tc", "qdisc", "add", "dev", device]
        if self.delay_ms:
            _run(_in(netns, *command, "root", "handle", "1:", "netem", "delay",
                     "%gms" % self.delay_ms))
            command += ["parent", "1:", "handle", "2:"]
        else:
            command += ["root"]
        if self.mbit:
            _run(_in(netns, *command, *tbf_arguments(self.mbit)))

    def _write_keys_and_configs(self):
        folder = self.folder
        self.client_key = os.path.join(folder, "id_ed25519")
        _keygen(self.client_key, "odsgd-emulate client")
        self.authorized_keys = os.path.join(folder, "authorized_keys")
        shutil.copyfile(self.client_key + ".pub", self.authorized_keys)
        os.chmod(self.authorized_keys, 0o600)
        known = []
        for host in self.hosts:
            host.host_key = os.path.join(folder, "host%d_ed25519" % host.index)
            _keygen(host.host_key, "odsgd-emulate host %d" % host.index)
            with open(host.host_key + ".pub") as f:
                known.append("%s %s" % (host.address, " ".join(f.read().split()[:2])))
            host.sshd_config = os.path.join(folder, "sshd%d_config" % host.index)
            host.sshd_log = os.path.join(folder, "sshd%d.log" % host.index)
            with open(host.sshd_config, "w") as f:
                f.write(self._sshd_config(host))
        self.known_hosts = os.path.join(folder, "known_hosts")
        with open(self.known_hosts, "w") as f:
            f.write("\n".join(known) + "\n")
        self.ssh_config = os.path.join(folder, "ssh_config")
        with open(self.ssh_config, "w") as f:
            f.write(SSH_CONFIG % dict(user=self.user, key=self.client_key,
                                      known_hosts=self.known_hosts))
        self.bin = os.path.join(folder, "bin")
        os.mkdir(self.bin)
        wrapper = os.path.join(self.bin, "ssh")
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\n# ssh with this emulated cluster\'s key and host keys\n'
                    'exec %s -F %s "$@"\n' % (shutil.which("ssh"), self.ssh_config))
        os.chmod(wrapper, 0o700)
        self.hostfile = os.path.join(folder, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("".join(host.address + "\n" for host in self.hosts))

    def _sshd_config(self, host):
        return SSHD_CONFIG % dict(
            address=host.address, host_key=host.host_key,
            authorized_keys=self.authorized_keys, user=self.user,
            strict_modes="yes" if self.strict_modes else "no",
            pid_file=os.path.join(self.folder, "sshd%d.pid" % host.index),
            alive=CLIENT_ALIVE_INTERVAL, alive_count=CLIENT_ALIVE_COUNT)

    def _start_sshd(self, host):
        # -D: stays in the foreground (its pid is ours to end); -e -E: log to a file we read.
        with open(host.sshd_log, "w"):
            pass
        host.sshd = subprocess.Popen(_in(host.netns, SSHD, "-D", "-f", host.sshd_config,
                                         "-E", host.sshd_log),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def _wait_for_sshd(self, host, timeout=10.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(host.sshd_log) as f:
                log = f.read()
            if "Server listening on" in log:
                return
            if host.sshd.poll() is not None:
                break
            time.sleep(0.05)
        raise EmulationError("the sshd of host %d (%s) did not start: %s"
                             % (host.index, host.address, log.strip() or "no log"))

    # -- use -------------------------------------------------------------------------------
    def environment(self, base=None):
        """Environment for commands on the hosts: the hostfile and the ssh wrapper."""
        env = dict(os.environ if base is None else base)
        env["ODSGD_HOSTFILE"] = self.hostfile
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", os.defpath)
        return env

    def on_host(self, index, argv):
        """argv that runs `argv` on host `index`."""
        return _in(self.hosts[index].netns, *argv)

    def on_outsider(self, argv):
        """argv that runs `argv` in the outsider's namespace (outsider=True)."""
        if self.outsider is None:
            raise EmulationError("this cluster has no outsider; create it with outsider=True")
        return _in(self.outsider.netns, *argv)

    def add_address(self, index, address):
        """Gives host `index` a second address on its NIC, `address`/24, e.g. one of
        OUTSIDE_NETWORK: an address of the host that no job of the hostfile binds. It goes
        with the host's namespace at teardown."""
        host = self.hosts[index]
        _run(["ip", "-n", host.netns, "addr", "add", "%s/%d" % (address, PREFIX_LENGTH),
              "dev", host.interface])

    def link_down(self, index):
        """Unplugs host `index`: its NIC goes down, inside its namespace."""
        host = self.hosts[index]
        _run(["ip", "-n", host.netns, "link", "set", host.interface, "down"])

    def processes(self, index):
        """Pids of the processes on host `index` other than its sshd daemon (sessions that
        sshd started for a client are included)."""
        host = self.hosts[index]
        pids = set(namespace_pids(host.netns))
        if host.sshd is not None:
            pids.discard(_child_pid(host.sshd.pid))
            pids.discard(host.sshd.pid)
        return sorted(pids)

    # -- tear down -------------------------------------------------------------------------
    def stop(self):
        """Ends every process on the hosts (sshd last), deletes the namespaces (the veths and
        the bridge go with them) and the temporary folder. Safe to call twice."""
        for host in self.hosts:
            if host.sshd is not None and host.sshd.poll() is None:
                _signal_group(host.sshd.pid, signal.SIGTERM)
        for name in reversed(self.namespaces):
            _kill_all_in(name)
        for host in self.hosts:
            if host.sshd is not None:
                _signal_group(host.sshd.pid, signal.SIGKILL)
                try:
                    host.sshd.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for name in reversed(self.namespaces):
            _run(["ip", "netns", "delete", name], check=False)
        self.namespaces = []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def asked_congestion(name):
    """The congestion control `name` asks for, or None where it asks for the kernel's own
    default (`default`, empty or None)."""
    return None if name in (None, "", "default") else name


def tbf_arguments(mbit, min_burst=64 * 1024 + 1500, latency_ms=100):
    """`tc` arguments of a token bucket of `mbit` Mbit/s. The bucket holds at least
    `min_burst` bytes (default: one 64 KiB segment, as veth passes GSO segments that big) and
    4 ms of traffic (the kernel's timer granularity at high rates); `latency_ms` of queue keep
    TCP from losing packets in bursts."""
    rate_bytes = mbit * 1e6 / 8
    burst = int(max(min_burst, rate_bytes / 250))
    return ["tbf", "rate", "%gmbit" % mbit, "burst", str(burst), "latency", "%dms" % latency_ms]


def _strict_modes_ok(path):
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022 and os.access(path, os.W_OK)


def _keygen(path, comment):
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def namespace_pids(netns):
    result = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def _child_pid(pid):
    """The one child of `pid` (`ip netns exec` execs, so usually the pid itself)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            children = f.read().split()
        return int(children[0]) if children else pid
    except (OSError, ValueError):
        return pid


def _signal_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_all_in(netns, timeout=5.0):
    """SIGTERM, then SIGKILL, to every process whose network namespace is `netns` (all of them
    were started on the emulated host, by its sshd or by `on_host`)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = namespace_pids(netns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + timeout
        while pids and time.time() < deadline:
            pids = namespace_pids(netns)
            time.sleep(0.05)
        if not pids:
            return


def leftovers(ignore_creators=()):
    """What any emulated cluster of this machine left behind: namespaces, processes in them,
    temporary folders (empty when everything was torn down). Clusters made by a process of
    `ignore_creators` are left out (one that still runs, e.g. a benchmark beside the tests,
    owns them)."""
    found = []
    names = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in names:
        name = line.split(" ")[0]
        if name.startswith(PREFIX) and creator_pid(name) not in ignore_creators:
            found.append("namespace %s (processes %s)" % (name, namespace_pids(name)))
    for base in ("/run", tempfile.gettempdir()):
        for entry in os.listdir(base):
            if entry.startswith(PREFIX) and creator_pid(entry) not in ignore_creators:
                found.append("folder %s" % os.path.join(base, entry))
    return found


def other_creators():
    """Pids of the processes other than this one whose emulated clusters exist now, running
    or not (a benchmark beside the tests, or a job killed before it could tear down): what a
    check for leftovers leaves to them, as they were there before it."""
    creators = {_creator_of(entry) for entry in leftovers()}
    return {pid for pid in creators if pid is not None and pid != os.getpid()}


def remove_orphans():
    """Tears down what emulated clusters of processes that no longer run left behind (their
    maker was killed by SIGKILL, or the machine's session ended under it): the processes on
    their hosts, their namespaces (veths and bridge go with them) and folders. Returns what it
    removed, as `leftovers` names it."""
    removed = []
    for entry in leftovers():
        pid = _creator_of(entry)
        if pid is None or pid == os.getpid() or os.path.exists("/proc/%d" % pid):
            continue
        kind, path = entry.split()[:2]
        if kind == "namespace":
            _kill_all_in(path)
            _run(["ip", "netns", "delete", path], check=False)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(entry)
    return removed


def _creator_of(entry):
    """The maker's pid of a `leftovers` entry ('namespace NAME (...)' or 'folder PATH')."""
    return creator_pid(os.path.basename(entry.split()[1]))


def creator_pid(name):
    """The pid of the process that made the namespace or folder `name` (PREFIX-<pid>-..., or
    PREFIX-probe-<pid> for the throwaway netem probe), or None for a name of neither form."""
    fields = name[len(PREFIX) + 1:].split("-")
    field = fields[1] if fields[0] == "probe" and len(fields) > 1 else fields[0]
    return int(field) if field.isdigit() else None


SSHD_CONFIG = """\
# sshd of one emulated host: its own address only, the generated key only.
ListenAddress %(address)s
Port 22
HostKey %(host_key)s
PidFile %(pid_file)s
AuthorizedKeysFile %(authorized_keys)s
AllowUsers %(user)s
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
PermitRootLogin prohibit-password
HostbasedAuthentication no
UsePAM no
StrictModes %(strict_modes)s
PermitUserEnvironment no
AllowTcpForwarding no
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
PrintMotd no
# A session whose client is cut off ends (its processes get SIGHUP with the pty) after
# %(alive_count)s unanswered probes.
ClientAliveInterval %(alive)d
ClientAliveCountMax %(alive_count)d
LogLevel VERBOSE
"""

SSH_CONFIG = """\
# ssh client configuration of an emulated cluster: its key, its hosts' keys, no prompts.
Host *
    User %(user)s
    IdentityFile %(key)s
    IdentitiesOnly yes
    IdentityAgent none
    UserKnownHostsFile %(known_hosts)s
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    PasswordAuthentication no
    KbdInteractiveAuthentication no
    LogLevel ERROR
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m odsgd.emulate",
        description="Runs COMMAND on the first of N emulated hosts (network namespaces with "
                    "a shaped NIC and an sshd each); ODSGD_HOSTFILE names the hostfile.")
    parser.add_argument("--hosts", type=int, help="number of hosts")
    parser.add_argument("--remove-orphans", action="store_true",
                        help="only tear down what emulated clusters of processes that no "
                             "longer run left behind (namespaces, their processes, folders)")
    parser.add_argument("--mbit", type=float, default=0,
                        help="rate of every NIC, each direction, in Mbit/s (0: unshaped)")
    parser.add_argument("--delay-ms", type=float, default=0,
                        help="one-way delay of every NIC (needs netem)")
    parser.add_argument("--congestion", default=CONGESTION,
                        help="TCP congestion control between the hosts (default %(default)s, "
                             "Linux's default; 'default': this kernel's own)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- COMMAND ...: run on host 0 (a shell expands $ODSGD_HOSTFILE "
                             "if the command is `sh -c '...'`)")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.remove_orphans:
        return args
    if args.hosts is None:
        parser.error("give the number of hosts: --hosts N")
    if not args.command:
        parser.error("give the command to run after --, e.g. -- python -m odsgd.launch "
                     "--launcher ssh -H '$ODSGD_HOSTFILE' ...")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.remove_orphans:
        if os.geteuid() != 0:
            print("odsgd.emulate: --remove-orphans needs root (it deletes network namespaces)",
                  file=sys.stderr)
            return 2
        removed = remove_orphans()
        print("odsgd.emulate: removed %d orphans%s" % (
            len(removed), "".join("\n  " + entry for entry in removed)), file=sys.stderr)
        return 0

    def on_sigterm(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_sigterm)
    command = None
    try:
        with EmulatedCluster(args.hosts, args.mbit, args.delay_ms,
                             congestion=args.congestion) as cluster:
            env = cluster.environment()
            # $ODSGD_HOSTFILE in an argument is replaced, so no shell is needed for -H.
            argv = [a.replace("$ODSGD_HOSTFILE", cluster.hostfile) for a in args.command]
            print("odsgd.emulate: %d hosts %s, NICs at %s; hostfile %s" % (
                len(cluster.hosts), ", ".join(h.address for h in cluster.hosts),
                "%g Mbit/s" % args.mbit if args.mbit else "full speed", cluster.hostfile),
                file=sys.stderr, flush=True)
            command = subprocess.Popen(cluster.on_host(0, argv), env=env,
                                       start_new_session=True)
            try:
                return command.wait()
            except KeyboardInterrupt:
                _end_command(command)
                return 130
    except EmulationError as error:
        print("odsgd.emulate: %s" % error, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if command is not None:
            _end_command(command)
        return 130


def _end_command(process, grace=10.0):
    """SIGTERM to the command's process group (odsgd.launch ends its job on it), SIGKILL after
    `grace` seconds."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
