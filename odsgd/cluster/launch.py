"""`python -m odsgd.launch`: MXNet's own tools/launch.py and dmlc_tracker, mended for current
Python, with a job that ends as a whole.

    python -m odsgd.launch -n 2 -s 1 --launcher local python train.py --kvstore dist_odsgd

All of launch.py's options pass through (local, ssh, mpi, sge, yarn launchers). What this
module changes, in this process only:

* `threading.Thread.isAlive`, removed in Python 3.9, is restored as `is_alive` (dmlc_tracker
  calls it in the scheduler's join loop and dies without it, leaving the job running).
* The scheduler's port is one the kernel picks as free (dmlc_tracker takes the first free
  one from 9091, which two jobs started together on one machine both take).
* The scheduler is odsgd/cluster/ps_scheduler.py, not the training command: MXNet runs its scheduler
  inside `import mxnet` and exits there, so the command never got further, and that import
  cost 2 s of one core while every other process of the job was starting too. The command
  stays on the scheduler's command line (`--job '...'`), so `ps` shows whose it is.
* The launcher itself imports nothing of MXNet (odsgd/__init__.py).
* With `--launcher local` every process talks over loopback: the tracker's host address and
  ps-lite's node address (DMLC_NODE_HOST) are 127.0.0.1, so a machine (or network namespace)
  with no other interface works.
* Every process the tracker starts (scheduler, servers, workers; for ssh and mpi the ssh or
  mpirun client) is recorded, and its output is forwarded line by line with a prefix such as
  `[worker 1] `, keeping its last lines. When one exits with an error or is killed, or after
  `--job-timeout` seconds, or on Ctrl-C / SIGTERM, all others are ended (through their own
  process group, which each gets: SIGTERM, then SIGKILL after 5 s) and the launcher exits
  non-zero, naming the process that failed and printing its last lines.
* On Linux each child also gets SIGKILL when the launcher itself dies (even by SIGKILL), so a
  killed launcher leaves no job behind on this machine.
* `--max-restarts N` starts the whole job again after a failure (odsgd/cluster/restarts.py: each
  attempt is a child `python -m odsgd.launch` without the restart options, which reports how
  it ended); every process gets ODSGD_RESTART_COUNT (0 for the first attempt) and, with
  `--checkpoint-dir DIR`, ODSGD_CHECKPOINT_DIR.
* launch.py's `--env-server NAME:VALUE` and `--env-worker NAME:VALUE` set NAME for the servers
  or the workers only (not the scheduler), over this machine's value, with the local and ssh
  launchers. MXNet 1.9's launch.py hands them to dmlc_tracker, whose parser does not know
  them: they would land in front of the command (`A:1: command not found`) with every
  launcher. Other launchers refuse them.

With `--launcher ssh` (`-H` defaults to $ODSGD_HOSTFILE, see odsgd.emulate):

* The scheduler runs here and binds the job's address: the address of DMLC_INTERFACE when it
  is set, else the one this machine reaches the hostfile's first host from; servers and
  workers bind the address of their host in the hostfile (DMLC_NODE_HOST). No job port is
  opened on loopback or on any other address.
* Every remote process gets the variables dmlc_tracker passes, its role's --env-server or
  --env-worker values and this machine's DMLC_*, PS_*, MXNET_*, ODSGD_*, OMP_*, KMP_*,
  PYTHONPATH, PYTHONUNBUFFERED and LD_LIBRARY_PATH, each quoted (dmlc_tracker passes a
  handful, unquoted); the command is quoted for the remote shell.
* ssh runs with a pty (`-tt`), no stdin, BatchMode and keep-alive probes every
  SSH_ALIVE_SECONDS (ODSGD_SSH_ALIVE_SECONDS; 0 turns them off): a host that drops off the
  network ends its ssh client after 3 unanswered probes, which fails the job; ending an ssh
  client closes its pty, whose SIGHUP ends the remote process.
* The launcher watches its own host's link: when the interface of the job's address goes
  down, the job fails naming this host and the roles on it.
* Each process is named with its host, e.g. `[worker 1 on 198.18.0.3]`.
"""
import argparse
import collections
import functools
import logging
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings

from ..common import config  # imports nothing of MXNet
from . import job_keys, restarts  # neither
from .parent_death import die_with_parent  # neither
from .ps_scheduler import mxnet_package_file  # neither

LOG = logging.getLogger("odsgd.launch")
#: subprocess.Popen before the launcher replaces it (_TrackedPopen): for calls that are no
#: processes of the job
_PLAIN_POPEN = subprocess.Popen

#: seconds between ssh keep-alive probes (3 unanswered ones end the ssh client)
SSH_ALIVE_SECONDS = 2
#: variables of this machine passed to every ssh-launched process
SSH_ENV_PREFIXES = ("DMLC_", "PS_", "MXNET_", "ODSGD_", "OMP_", "KMP_")
SSH_ENV_NAMES = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "LD_LIBRARY_PATH")
#: variables dmlc_tracker (or odsgd.launch) sets for each process: --env-server and
#: --env-worker may not override them (a server told DMLC_ROLE=worker would hang the job)
TRACKER_NAMES = ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI",
                 "DMLC_PS_ROOT_PORT", "DMLC_NODE_HOST", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER")
#: launchers for which odsgd.launch passes --env-server / --env-worker on
ROLE_ENV_LAUNCHERS = ("local", "ssh")
#: lines of each process's output kept for the failure report
TAIL_LINES = 20
#: seconds between SIGTERM and SIGKILL when the job is ended
GRACE_SECONDS = 5.0
#: What some of ps-lite's and MXNet's fatal messages mean, for the failure report.
HINTS = (
    (re.compile(r"vals->size\(\) == total_val"),
     "a worker pulled an array whose size differs from the one rank 0 initialised the key "
     "with: the parameter shapes differ between workers (every worker must build the same "
     "model)"),
    (re.compile(r"lshape == rshape: operands shape mismatch"),
     "an array pushed to a server has another shape than the one rank 0 initialised the key "
     "with: the parameter shapes differ between workers (every worker must build the same "
     "model)"),
    (re.compile(r"bind failed"),
     "a process could not bind its port: another program holds it (odsgd.launch picks a free "
     "port for the scheduler; by hand, choose another DMLC_PS_ROOT_PORT)"),
)


class ProcessRecord(object):
    """One process of the job: its Popen, a label such as 'worker 1', its last output lines."""

    def __init__(self, process, label, host=None):
        self.process = process
        self.label = label
        self.host = host                       # the remote host of an ssh client
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.output_done = threading.Event()   # set when its output reached end of file
        self.output_done.set()                 # until a reader is attached
        self.exited_at = None                  # time.time() when it exited, code 0 or not

    def describe_exit(self, returncode):
        """In the words of the cause the restart loop reads (restarts.exit_cause)."""
        cause = restarts.exit_cause(returncode, self.host is not None)
        if returncode < 0:
            how = "was killed by signal %d (%s)" % (
                -returncode, restarts.signal_name(-returncode) or "unknown signal")
        elif cause == "connection-lost":
            how = ("exited with code 255 (ssh: the connection to %s was lost or refused, or "
                   "the remote process was killed)" % self.host)
        elif cause == "killed":
            how = ("exited with code %d (a shell's code for signal %d, %s)"
                   % (returncode, returncode - 128, restarts.signal_name(returncode - 128)))
        else:
            how = "exited with code %d" % returncode
        return "%s (pid %d) %s" % (self.label, self.process.pid, how)


class Job(object):
    """The processes of one launched job and what went wrong with them."""

    def __init__(self, out=None):
        self.lock = threading.Lock()
        self.out = out                       # stream for the children's lines (sys.stdout)
        self.out_lock = threading.Lock()
        self.records = []
        self.failures = []                   # (record, text), in the order they were seen
        self.failed_at = None                # time.time() of the first failure
        self._ending = False
        self._role_counts = collections.Counter()
        #: seconds the processes get to end by themselves (ODSGD_EXIT_WAIT, set by main)
        self.exit_wait = config.DEFAULT_EXIT_WAIT

    @property
    def failure(self):
        """Text naming the first process that failed, or None."""
        return self.failures[0][1] if self.failures else None

    # -- bookkeeping -----------------------------------------------------------------------
    def started(self, process, env=None, command=None):
        with self.lock:
            host = _remote_host(command)
            label = self._label(env, command)
            record = ProcessRecord(process, label if host is None else
                                   "%s on %s" % (label, host), host)
            self.records.append(record)
        return record

    def _label(self, env, command):
        env = env or {}
        role = env.get("DMLC_ROLE")
        if role is None:   # ssh and mpi pass the role inside the command line
            match = re.search(r"DMLC_ROLE[= ](\w+)", command if isinstance(command, str)
                              else " ".join(map(str, command or [])))
            role = match.group(1) if match else "process"
        if role == "scheduler":
            return "scheduler"
        task = env.get("DMLC_TASK_ID")
        if task is not None and task.isdigit():
            index = int(task)
            # dmlc_tracker's local launcher numbers workers 0..n-1, then servers n..n+s-1
            if role == "server" and env.get("DMLC_NUM_WORKER", "").isdigit():
                index -= int(env["DMLC_NUM_WORKER"])
        else:
            index = self._role_counts[role]
            self._role_counts[role] += 1
        return "%s %d" % (role, index)

    def record_of(self, process):
        with self.lock:
            for record in self.records:
                if record.process is process:
                    return record
        return None

    def exited(self, process, returncode):
        record = self.record_of(process)
        if record is None:
            return
        if record.exited_at is None:
            record.exited_at = time.time()
        if returncode == 0:
            return
        with self.lock:
            if self._ending or any(r is record for r, _ in self.failures):
                return
            self.failures.append((record, record.describe_exit(returncode)))
            if self.failed_at is None:
                self.failed_at = time.time()

    def workers_gone(self, after_seconds):
        """Text for a job whose workers all exited with code 0 at least `after_seconds` ago
        while the scheduler still waits, else None. In a real job the scheduler ends with the
        workers (ps-lite's finalize is a barrier of every node); still waiting means the
        workers never joined it: the script created no dist store."""
        with self.lock:
            workers = [r for r in self.records if r.label.startswith("worker")]
            if not workers or any(r.exited_at is None or r.process.returncode != 0
                                  for r in workers):
                return None
            if time.time() - max(r.exited_at for r in workers) < after_seconds:
                return None
        return ("every worker exited with code 0, but the scheduler still waits for them "
                "after %d s: the workers never joined the job. The script created no "
                "distributed kvstore (dist_sync, dist_async, dist_odsgd): check its kvstore "
                "flag (e.g. GluonCV's segmentation train.py turns --kvstore into 'local' "
                "with --no-cuda)" % after_seconds)

    # -- output ----------------------------------------------------------------------------
    def attach_output(self, record, read_fd):
        """Forwards the lines read from `read_fd` to self.out as '[label] line', keeping the
        last TAIL_LINES in record.tail."""
        record.output_done.clear()
        thread = threading.Thread(target=self._forward, args=(record, read_fd),
                                  name="output of %s" % record.label, daemon=True)
        thread.start()

    def _forward(self, record, read_fd):
        prefix = "[%s] " % record.label
        try:
            with open(read_fd, "rb", closefd=True) as pipe:
                for raw in iter(pipe.readline, b""):
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    record.tail.append(line)
                    self.write(prefix + line + "\n")
        except (OSError, ValueError):
            pass
        finally:
            record.output_done.set()

    def write(self, text):
        out = self.out or sys.stdout
        with self.out_lock:
            try:
                out.write(text)
                out.flush()
            except (OSError, ValueError):
                pass   # the console is gone: keep draining the pipes all the same

    def wait_for_output(self, timeout=5.0):
        deadline = time.time() + timeout
        for record in list(self.records):
            record.output_done.wait(max(0.0, deadline - time.time()))

    # -- ending ----------------------------------------------------------------------------
    def running(self):
        with self.lock:
            return [r for r in self.records if r.process.poll() is None]

    def wait_for_exit(self, timeout):
        """Waits up to `timeout` seconds for every process to exit by itself; True if all
        did."""
        deadline = time.time() + timeout
        while self.running():
            if time.time() > deadline:
                return False
            time.sleep(0.1)
        return True

    def end_all(self, grace=GRACE_SECONDS):
        """SIGTERM, then SIGKILL after `grace` seconds, to every process still running, each
        through its own process group (so its children end too). Returns the labels of the
        processes that were still running (empty if none had to be ended)."""
        self._ending = True
        running = self.running()
        ended = [r.label for r in running]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for record in running:
                try:
                    os.killpg(record.process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.time() + grace
            while time.time() < deadline and any(r.process.poll() is None for r in running):
                time.sleep(0.05)
            running = [r for r in running if r.process.poll() is None]
            if not running:
                break
        return ended

    def report_failures(self):
        """Logs every failed process with its last output lines; when none failed (a timeout,
        a signal to the launcher) the last few lines of every process instead."""
        self.wait_for_output(2.0)
        if self.failures:
            shown = [(record, text, TAIL_LINES) for record, text in self.failures]
        else:
            shown = [(record, "%s (pid %d)" % (record.label, record.process.pid), 5)
                     for record in self.records]
        for record, text, count in shown:
            lines = list(record.tail)[-count:]
            if lines:
                LOG.error("odsgd.launch: %s; its last %d output lines:\n%s", text, len(lines),
                          "\n".join("    " + line for line in lines))
            else:
                LOG.error("odsgd.launch: %s; it printed nothing", text)
            for pattern, hint in HINTS:
                if any(pattern.search(line) for line in record.tail):
                    LOG.error("odsgd.launch: hint for %s: %s", record.label, hint)


JOB = Job()


def _remote_host(command):
    """The host an ssh client of dmlc_tracker runs its process on, or None."""
    if isinstance(command, str) and command.startswith("ssh "):
        match = re.search(r"DMLC_NODE_HOST=([^; ]+);", command)
        return match.group(1) if match else None
    return None


#: options for dmlc_tracker's ssh clients (set for --launcher ssh)
_SSH_OPTIONS = None


def ssh_options(alive_seconds):
    """ssh's options for a job's processes: a pty, so that a closed connection hangs the
    remote process up; no stdin and no prompts; keep-alive probes that notice a lost host."""
    options = ["-n", "-tt", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if alive_seconds > 0:
        options += ["-o", "ServerAliveInterval=%g" % alive_seconds,
                    "-o", "ServerAliveCountMax=3"]
    return " ".join(options)


class _TrackedPopen(subprocess.Popen):
    """Popen that puts each child in its own session, forwards its output through JOB with a
    prefix (unless the caller captures it) and reports its exit to JOB."""

    def __init__(self, args, *rest, **kwargs):
        kwargs["start_new_session"] = True
        if _SSH_OPTIONS and isinstance(args, str) and args.startswith("ssh "):
            args = "ssh " + _SSH_OPTIONS + " " + args[len("ssh "):]
        if kwargs.get("preexec_fn") is None:
            kwargs["preexec_fn"] = die_with_parent()
        env = kwargs.get("env")
        if env is not None:
            env = dict(env)
            env.setdefault("PYTHONUNBUFFERED", "1")   # lines reach the console as printed
            kwargs["env"] = env
        capture = (len(rest) <= 3 and kwargs.get("stdout") is None
                   and kwargs.get("stderr") is None)
        read_fd = write_fd = None
        if capture:
            read_fd, write_fd = os.pipe()
            kwargs["stdout"] = kwargs["stderr"] = write_fd
        try:
            super(_TrackedPopen, self).__init__(args, *rest, **kwargs)
        except BaseException:
            if capture:
                os.close(read_fd)
            raise
        finally:
            if capture:
                os.close(write_fd)
        record = JOB.started(self, env, args)
        LOG.info("odsgd.launch: started %s (pid %d)", record.label, self.pid)
        if capture:
            JOB.attach_output(record, read_fd)

    def wait(self, timeout=None):
        returncode = super(_TrackedPopen, self).wait(timeout)
        JOB.exited(self, returncode)
        return returncode


class JobFailed(RuntimeError):
    """The job ends: str() says why; `cause` is one of odsgd.cluster.restarts' causes ('process' where
    a process of the job failed, whose exit tells the cause)."""

    def __init__(self, text, cause="process"):
        super(JobFailed, self).__init__(text)
        self.cause = cause


def _wait_for_scheduler(deadline, link_watch=None):
    """Replaces PSTracker.join: waits for the scheduler thread, watching for failures (and,
    for ssh jobs, this host's link)."""
    def join(tracker):
        if tracker.cmd is None:
            return
        while tracker.thread.is_alive():
            if JOB.failure is not None:
                raise JobFailed(JOB.failure)
            lost = link_watch.lost() if link_watch is not None else None
            if lost is not None:
                raise JobFailed(lost, "link-lost")
            if deadline is not None and time.time() > deadline:
                raise JobFailed("the job ran past --job-timeout", "timeout")
            stranded = JOB.workers_gone(JOB.exit_wait)
            if stranded is not None:
                raise JobFailed(stranded, "stalled")
            tracker.thread.join(0.2)
        if JOB.failure is not None:
            raise JobFailed(JOB.failure)
    return join


#: what runs as the job's scheduler in place of the training command (odsgd/cluster/ps_scheduler.py)
SCHEDULER_COMMAND = " ".join(shlex.quote(part) for part in (
    sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ps_scheduler.py")))


def _scheduler_init(tracker_init):
    """PSTracker.__init__ with the scheduler's port picked by the kernel, running
    odsgd/cluster/ps_scheduler.py. dmlc_tracker takes the first free port from 9091 on, so two jobs
    started on one machine at about the same time get the same port and one scheduler dies
    with "bind failed". And it runs the training command as the scheduler, which only gets as
    far as `import mxnet` (MXNet runs the scheduler inside it and exits): ps_scheduler makes
    the same calls without the 2 s of that import (see there)."""
    def init(self, hostIP, cmd, port=9091, port_end=9999, envs=None):
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        if cmd is not None:   # the training command rides along: `ps` shows whose it is
            cmd = "%s --job %s" % (SCHEDULER_COMMAND, shlex.quote(cmd))
        tracker_init(self, hostIP, cmd, port=port, port_end=port + 100, envs=envs)
    return init


def mxnet_launch_script():
    """Path of the installed MXNet's tools/launch.py (found without importing mxnet)."""
    return mxnet_package_file("tools", "launch.py", who="odsgd.launch")


class LinkWatch(object):
    """Watches the interface that holds this host's job address (Linux sysfs)."""

    def __init__(self, address):
        self.address = address
        self.interface = _interface_of(address)

    def lost(self):
        """A message naming this host and its roles when its link is down, else None."""
        if self.interface is None:
            return None
        try:
            with open("/sys/class/net/%s/operstate" % self.interface) as f:
                state = f.read().strip()
        except OSError:
            state = "gone"
        if state not in ("down", "lowerlayerdown", "notpresent", "gone"):
            return None
        roles = ["scheduler"] + [r.label.split(" on ")[0] for r in JOB.records
                                 if r.host == self.address]
        return ("host %s (%s, where this launcher runs) lost its link: %s is %s"
                % (self.address, ", ".join(roles), self.interface, state))


def _interface_of(address):
    """Name of the local interface that holds `address` (None for loopback or not found)."""
    try:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                                 text=True).stdout
    except OSError:
        return None
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address and fields[1] != "lo":
            return fields[1]
    return None


def read_hostfile(path):
    """The host addresses of a dmlc hostfile (`host`, `host:port` or `host slots=n` lines)."""
    try:
        with open(path) as f:
            lines = [line.split("slots=")[0].strip() for line in f]
    except OSError as error:
        raise SystemExit("odsgd.launch: cannot read the hostfile %s (%s); give -H HOSTFILE, "
                         "one host a line" % (path, error.strerror))
    hosts = [line.split(":")[0] for line in lines if line]
    if not hosts:
        raise SystemExit("odsgd.launch: the hostfile %s names no host" % path)
    return hosts


def job_address(first_host):
    """The address the scheduler binds for an ssh job: DMLC_INTERFACE's address when set,
    else this machine's source address towards the first host of the hostfile."""
    import socket
    interface = os.environ.get("DMLC_INTERFACE")
    if interface:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", interface],
                                 capture_output=True, text=True).stdout.split()
        if len(listing) < 4:
            raise SystemExit("odsgd.launch: DMLC_INTERFACE=%s has no IPv4 address here"
                             % interface)
        return listing[3].split("/")[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((socket.gethostbyname(first_host), 9))   # sends nothing
        except OSError as error:
            raise SystemExit("odsgd.launch: no route from here to the hostfile's first host "
                             "%s (%s)" % (first_host, error.strerror))
        return probe.getsockname()[0]


def _remote_env(pass_envs, role_env=None, remote_keys=None):
    """dmlc_tracker.ssh.get_env, mended: this machine's job variables too, then the
    --env-server or --env-worker values of the process's role (pass_envs['DMLC_ROLE']), then
    dmlc_tracker's own; each quoted for the remote shell (the whole remote command is inside
    single quotes). Each name is exported once, so no value depends on the export order.
    ODSGD_JOB_KEY_FILE is the path of the key's file on the process's host (`remote_keys`,
    odsgd/cluster/job_keys.py), never the key."""
    own = (role_env or {}).get(pass_envs.get("DMLC_ROLE"), {})
    own = {k: v for k, v in own.items() if k not in pass_envs}
    key_path = remote_keys.path_on(pass_envs["DMLC_NODE_HOST"]) \
        if remote_keys is not None and "DMLC_NODE_HOST" in pass_envs else None
    if key_path is not None:
        own[job_keys.job_key.KEY_FILE_VARIABLE] = key_path
    names = [k for k in sorted(os.environ)
             if (k.startswith(SSH_ENV_PREFIXES) or k in SSH_ENV_NAMES)
             and k not in pass_envs and k not in own]
    exports = ["export %s=%s;" % (k, remote_quote(os.environ[k])) for k in names]
    exports += ["export %s=%s;" % (k, remote_quote(v)) for k, v in own.items()]
    exports += ["export %s=%s;" % (k, remote_quote(str(v))) for k, v in pass_envs.items()]
    return " ".join(exports)


def _with_role_env(exec_cmd, role_env):
    """dmlc_tracker.local.exec_cmd, mended: the process's environment also holds its role's
    --env-server or --env-worker values (over this machine's; dmlc_tracker's own win)."""
    def exec_with_role_env(cmd, num_attempt, role, taskid, pass_env):
        env = dict(role_env.get(role, {}))
        env.update(pass_env)   # a copy: dmlc_tracker gives every process the same dict
        return exec_cmd(cmd, num_attempt, role, taskid, env)
    return exec_with_role_env


def remote_quote(word):
    """`word` for a shell that dmlc_tracker's ssh launcher reaches inside single quotes:
    double quotes (single quotes would end its own)."""
    if re.fullmatch(r"[\w@%+=:,./-]+", word):
        return word
    if "'" in word:
        raise SystemExit("odsgd.launch: %r holds a single quote, which dmlc_tracker's ssh "
                         "launcher cannot pass to the remote shell; leave it out" % word)
    return '"' + re.sub(r'([\\"$`])', r"\\\1", word) + '"'


#: the job key's files on the hosts of an ssh job (odsgd/cluster/job_keys.py)
REMOTE_KEYS = None


def _mend_dmlc_tracker(launcher, deadline, hostfile=None, role_env=None):
    role_env = role_env or {}
    link_watch = None
    if launcher == "ssh" and hostfile:
        # before Popen is replaced: the `ip` these run is no process of the job
        global _SSH_OPTIONS, REMOTE_KEYS
        from dmlc_tracker import ssh
        address = job_address(read_hostfile(hostfile)[0])
        link_watch = LinkWatch(address)
        REMOTE_KEYS = job_keys.RemoteKeys(job_keys.ssh_ports(hostfile), _PLAIN_POPEN)
        ssh.get_env = functools.partial(_remote_env, role_env=role_env,
                                        remote_keys=REMOTE_KEYS)
        alive = float(os.environ.get("ODSGD_SSH_ALIVE_SECONDS", SSH_ALIVE_SECONDS))
        _SSH_OPTIONS = ssh_options(alive)
        LOG.info("odsgd.launch: ssh job; the scheduler binds %s", address)
    if not hasattr(threading.Thread, "isAlive"):
        threading.Thread.isAlive = threading.Thread.is_alive
    # dmlc_tracker calls setDaemon, deprecated since 3.10: keep the job's log readable.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*setDaemon.*")
    subprocess.Popen = _TrackedPopen
    # dmlc_tracker's threads raise on a failed process with the whole environment in the
    # message; JOB reports the failure instead, in one line.
    threading.excepthook = lambda hook_args: LOG.debug("tracker thread: %s", hook_args.exc_value)
    from dmlc_tracker import tracker
    if link_watch is not None:
        tracker.get_host_ip = lambda host_ip=None: link_watch.address
    tracker.PSTracker.join = _wait_for_scheduler(deadline, link_watch)
    tracker.PSTracker.__init__ = _scheduler_init(tracker.PSTracker.__init__)
    if launcher == "local":
        from dmlc_tracker import local
        os.environ.setdefault("DMLC_NODE_HOST", "127.0.0.1")
        tracker.get_host_ip = lambda host_ip=None: "127.0.0.1"
        local.exec_cmd = _with_role_env(local.exec_cmd, role_env)


#: launch.py's options that take a value (and ours); --p3 takes none.
_VALUE_OPTIONS = {"-n", "--num-workers", "-s", "--num-servers", "-H", "--hostfile",
                  "--sync-dst-dir", "--launcher", "--env-server", "--env-worker", "--env",
                  "--job-timeout", "--max-restarts", "--restart-on", "--checkpoint-dir"}


def split_command(argv):
    """(launcher options, the training command): the command starts at the first argument
    that is neither an option nor an option's value."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            break
        i += 2 if (arg in _VALUE_OPTIONS and "=" not in arg) else 1
    return argv[:i], argv[i:]


def parse_own_options(argv):
    """Splits off this wrapper's own options (before the command) and --env-server /
    --env-worker, which it passes on itself (own.role_env). The training command goes to
    launch.py as one quoted argument: launch.py parses with parse_known_args, which would
    otherwise take the command's own -n, --num-workers, --env... for itself."""
    options, command = split_command(argv)
    # No abbreviations: `--env` (launch.py's) would be an ambiguous prefix of --env-server.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_job_timeout(parser)
    parser.add_argument("--launcher", default="ssh")
    parser.add_argument("-H", "--hostfile", default=None)
    parser.add_argument("--env-server", action="append", default=[])
    parser.add_argument("--env-worker", action="append", default=[])
    own, rest = parser.parse_known_args(options)
    own.role_env = role_environment(own.env_server, own.env_worker, own.launcher)
    rest += ["--launcher", own.launcher]
    if own.launcher in ("ssh", "mpi") and own.hostfile is None:
        own.hostfile = os.environ.get("ODSGD_HOSTFILE")
    if own.hostfile is not None:
        rest += ["-H", own.hostfile]
    if command:
        quote = remote_quote if own.launcher == "ssh" else shlex.quote
        rest.append(" ".join(quote(part) for part in command))
    return own, own.launcher, rest


def role_environment(env_server, env_worker, launcher):
    """{'server': {NAME: VALUE}, 'worker': {...}} from the --env-server / --env-worker
    NAME:VALUE options (the last value of a name wins). Refused, before anything starts: a
    malformed pair, a name the tracker sets, a launcher other than local and ssh, and for ssh
    a value the remote shell cannot be given (a single quote)."""
    role_env = {"server": _name_values(env_server, "--env-server"),
                "worker": _name_values(env_worker, "--env-worker")}
    if any(role_env.values()) and launcher not in ROLE_ENV_LAUNCHERS:
        raise SystemExit("odsgd.launch: --env-server / --env-worker are passed on with the "
                         "local and ssh launchers only, not with --launcher %s" % launcher)
    if launcher == "ssh":
        for values in role_env.values():
            for value in values.values():
                remote_quote(value)
    return role_env


def _name_values(pairs, option):
    values = {}
    for pair in pairs:
        name, colon, value = pair.partition(":")
        if not colon or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise SystemExit("odsgd.launch: %s %r: give NAME:VALUE, e.g. %s OMP_NUM_THREADS:4"
                             % (option, pair, option))
        if name in TRACKER_NAMES:
            raise SystemExit("odsgd.launch: %s %s: the tracker sets %s for each process"
                             % (option, pair, name))
        values[name] = value
    return values


def _keep_ctrl_c(install):
    """signal.signal as launch.py sees it: its own SIGINT handler (sys.exit(0), so a job
    stopped with Ctrl-C would exit 0 and `odsgd.launch ... && next` would go on) is not
    installed; Python's KeyboardInterrupt stays, and the job ends with exit code 130."""
    def signal_for_launch_py(signum, handler):
        if signum == signal.SIGINT:
            return install(signum, signal.default_int_handler)
        return install(signum, handler)
    return signal_for_launch_py


def own_options_help():
    """The help of odsgd.launch's own options (launch.py's follow them in --help)."""
    parser = argparse.ArgumentParser(prog="odsgd.launch", usage=argparse.SUPPRESS,
                                     add_help=False)
    group = parser.add_argument_group("Own options")
    _add_job_timeout(group)
    restarts.add_options(group)
    return parser.format_help().strip()


def _add_job_timeout(parser):
    parser.add_argument("--job-timeout", type=float, default=None, metavar="SECONDS",
                        help="end the whole job after this long (each attempt, with "
                        "--max-restarts)")


def parse_restart_options(argv):
    """(odsgd.cluster.restarts.Settings, `argv` less --max-restarts, --restart-on and
    --checkpoint-dir), which are this launcher's and come before the training command."""
    options, command = split_command(argv)
    parser = argparse.ArgumentParser(prog="odsgd.launch", add_help=False, allow_abbrev=False)
    restarts.add_options(parser)
    parsed, rest = parser.parse_known_args(options)
    settings = restarts.Settings(parsed.max_restarts, parsed.restart_on, parsed.checkpoint_dir)
    return settings, rest + command


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\n%s\n\nODSGD_EXIT_WAIT=SECONDS (default %g): how long the processes get to "
              "end by themselves once the scheduler finished (docs/env.md).\n"
              "launch.py's options follow:\n" % (own_options_help(), config.DEFAULT_EXIT_WAIT))
        argv = ["--launcher", "local", "--help"]   # launch.py's own help; starts nothing
    settings, argv = parse_restart_options(argv)
    # one key for the job, all its attempts: a child launcher finds the variable set
    key_folder = job_keys.job_key_file(parse_own_options(argv)[1])
    try:
        return _run_attempts(argv, settings)
    finally:
        job_keys.remove_folder(key_folder)


def _run_attempts(argv, settings):
    if settings.max_restarts > 0:
        # each attempt is a child `python -m odsgd.launch` that ends up below
        return restarts.run(argv, settings)
    if settings.checkpoint_dir is not None:
        os.environ[restarts.CHECKPOINT_DIR_VARIABLE] = os.path.abspath(settings.checkpoint_dir)
    os.environ.setdefault(restarts.RESTART_COUNT_VARIABLE, "0")
    # popped: the report is this launcher's to write, not its processes'
    report_path = os.environ.pop(restarts.REPORT_VARIABLE, None)
    outcome = run_job(argv)
    if report_path:
        restarts.write_report(report_path, outcome)
    return outcome.code


def run_job(argv):
    """Runs one job through MXNet's launch.py (odsgd.launch's options, no restart options);
    returns how it ended, an odsgd.cluster.restarts.Outcome."""
    own, launcher, rest = parse_own_options(argv)
    try:
        JOB.exit_wait = config.exit_wait_seconds()
    except ValueError as error:
        raise SystemExit("odsgd.launch: %s" % error)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    deadline = time.time() + own.job_timeout if own.job_timeout else None
    if launcher == "ssh" and not own.hostfile:
        raise SystemExit("odsgd.launch: --launcher ssh needs -H HOSTFILE (or ODSGD_HOSTFILE)")
    _mend_dmlc_tracker(launcher, deadline, own.hostfile, own.role_env)

    def on_signal(signum, _frame):
        raise JobFailed("the launcher received signal %d" % signum, "interrupted")
    signal.signal(signal.SIGTERM, on_signal)

    script = mxnet_launch_script()
    sys.argv = [script] + rest
    code, reason, cause = 0, None, "finished"
    install_signal_handler = signal.signal
    try:
        signal.signal = _keep_ctrl_c(install_signal_handler)
        runpy.run_path(script, run_name="__main__")
        # The scheduler is done; the others finish exiting by themselves (their exit codes
        # still count) before anything left is ended.
        wait = JOB.exit_wait if deadline is None else min(JOB.exit_wait, deadline - time.time())
        if not JOB.wait_for_exit(max(wait, 0.0)) and JOB.failure is None:
            raise JobFailed("%s still running %.0f s after the scheduler finished"
                            % (", ".join(r.label for r in JOB.running()), wait), "stalled")
    except JobFailed as failure:
        code, reason, cause = 1, str(failure), failure.cause
    except KeyboardInterrupt:
        code, reason, cause = 130, "interrupted", "interrupted"
    except SystemExit as stop:  # launch.py's own Ctrl-C handler exits 0: still end the job
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        cause = "finished" if code == 0 else "launcher-error"
    finally:
        signal.signal = install_signal_handler
        ended = JOB.end_all()
        if REMOTE_KEYS is not None:
            REMOTE_KEYS.remove_all()
    if code == 0 and JOB.failure is not None:
        code, reason, cause = 1, JOB.failure, "process"
    if cause == "process":
        record = JOB.failures[0][0]
        cause = restarts.exit_cause(record.process.returncode, record.host is not None)
    _report_end(reason, ended)
    return restarts.Outcome(code, reason, cause)


def _report_end(reason, ended):
    """Logs why the job ended (when it failed) and what had to be ended."""
    if reason is not None:
        JOB.report_failures()
        took = (" %.1f s after the failure" % (time.time() - JOB.failed_at)
                if JOB.failed_at is not None else "")
        LOG.error("odsgd.launch: %s; ended the job%s (%s)", reason, took,
                  "ended %s" % ", ".join(ended) if ended else "no other process was left")
    else:
        JOB.wait_for_output()


def exit_now(code):
    """Exits at once with `code`, its output flushed. Run as `python -m odsgd.launch` the
    launcher does not import MXNet (odsgd/__init__.py), but imported from Python
    (`odsgd.launch.main`) it has, and MXNet's shutdown at a normal exit took 0.5-2 s on a busy
    2-core machine (the fault sweep of docs/reliability.md: Ctrl-C ended the job in 0.1 s and
    the launcher exited 2.1 s later). The launcher ran nothing of MXNet, and by now every
    process of its job has exited or been ended: there is nothing for that shutdown to do."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
