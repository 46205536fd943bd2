"""`python -m odsgd.launch`: MXNet's own tools/launch.py and dmlc_tracker, mended for current
Python, with a job that ends as a whole.

    python -m odsgd.launch -n 2 -s 1 --launcher local python train.py --kvstore dist_odsgd

All of launch.py's options pass through (local, ssh, mpi, sge, yarn launchers). What this
module changes, in this process only:

* `threading.Thread.isAlive`, removed in Python 3.9, is restored as `is_alive` (dmlc_tracker
  calls it in the scheduler's join loop and dies without it, leaving the job running).
* With `--launcher local` every process talks over loopback: the tracker's host address and
  ps-lite's node address (DMLC_NODE_HOST) are 127.0.0.1, so a machine (or network namespace)
  with no other interface works.
* Every process the tracker starts is recorded. When one exits with an error (or is killed),
  or after `--job-timeout` seconds, or on Ctrl-C / SIGTERM, all others are ended (by their own
  process group, which each gets) and the launcher exits non-zero, naming the one that failed.
"""
import argparse
import importlib.util
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import warnings

LOG = logging.getLogger("odsgd.launch")

ROLE_ORDER = {"scheduler": 0, "server": 1, "worker": 2}


class Job(object):
    """The processes of one launched job."""

    def __init__(self):
        self.lock = threading.Lock()
        self.processes = []      # (Popen, role, task id)
        self.failure = None      # text naming the first process that failed

    def started(self, process, env):
        env = env or {}
        with self.lock:
            self.processes.append((process, env.get("DMLC_ROLE", "process"),
                                   env.get("DMLC_TASK_ID", "")))

    def exited(self, process, returncode):
        if returncode == 0:
            return
        with self.lock:
            if self.failure is not None or getattr(self, "_ending", False):
                return
            for proc, role, task in self.processes:
                if proc is process:
                    how = ("killed by signal %d" % -returncode if returncode < 0
                           else "exited with code %d" % returncode)
                    self.failure = "%s %s (pid %d) %s" % (role, task, proc.pid, how)

    def end_all(self, grace=5.0):
        """SIGTERM, then SIGKILL after `grace` seconds, to every process still running, each
        through its own process group (so its children end too)."""
        self._ending = True
        with self.lock:
            running = [proc for proc, _, _ in self.processes if proc.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in running:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.time() + grace
            while time.time() < deadline and any(p.poll() is None for p in running):
                time.sleep(0.05)
            running = [p for p in running if p.poll() is None]
            if not running:
                return


JOB = Job()


class _TrackedPopen(subprocess.Popen):
    """Popen that puts each child in its own session and reports its exit to JOB."""

    def __init__(self, *args, **kwargs):
        kwargs["start_new_session"] = True
        super(_TrackedPopen, self).__init__(*args, **kwargs)
        JOB.started(self, kwargs.get("env"))

    def wait(self, timeout=None):
        returncode = super(_TrackedPopen, self).wait(timeout)
        JOB.exited(self, returncode)
        return returncode


def _wait_for_scheduler(deadline):
    """Replaces PSTracker.join: waits for the scheduler thread, watching for failures."""
    def join(tracker):
        if tracker.cmd is None:
            return
        while tracker.thread.is_alive():
            if JOB.failure is not None:
                raise JobFailed(JOB.failure)
            if deadline is not None and time.time() > deadline:
                raise JobFailed("the job ran past --job-timeout")
            tracker.thread.join(0.2)
        if JOB.failure is not None:
            raise JobFailed(JOB.failure)
    return join


class JobFailed(RuntimeError):
    pass


def mxnet_launch_script():
    """Path of the installed MXNet's tools/launch.py (found without importing mxnet)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("odsgd.launch: mxnet is not installed in this Python (%s); run "
                         "`make install`" % sys.executable)
    path = os.path.join(list(spec.submodule_search_locations)[0], "tools", "launch.py")
    if not os.path.exists(path):
        raise SystemExit("odsgd.launch: %s is missing from the mxnet package" % path)
    return path


def _mend_dmlc_tracker(launcher, deadline):
    if not hasattr(threading.Thread, "isAlive"):
        threading.Thread.isAlive = threading.Thread.is_alive
    # dmlc_tracker calls setDaemon, deprecated since 3.10: keep the job's log readable.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*setDaemon.*")
    subprocess.Popen = _TrackedPopen
    # dmlc_tracker's threads raise on a failed process with the whole environment in the
    # message; JOB reports the failure instead, in one line.
    threading.excepthook = lambda hook_args: LOG.debug("tracker thread: %s", hook_args.exc_value)
    from dmlc_tracker import tracker
    tracker.PSTracker.join = _wait_for_scheduler(deadline)
    if launcher == "local":
        os.environ.setdefault("DMLC_NODE_HOST", "127.0.0.1")
        tracker.get_host_ip = lambda host_ip=None: "127.0.0.1"


def parse_own_options(argv):
    """Splits off this wrapper's own options (before the command); the rest goes to
    launch.py unchanged."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--job-timeout", type=float, default=None)
    own, rest = parser.parse_known_args(argv)
    launcher = "ssh"
    for i, arg in enumerate(rest):
        if arg == "--launcher" and i + 1 < len(rest):
            launcher = rest[i + 1]
        elif arg.startswith("--launcher="):
            launcher = arg.split("=", 1)[1]
    return own, launcher, rest


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nOwn option: --job-timeout SECONDS  end the whole job after this long.\n"
              "launch.py's options follow:\n")
    own, launcher, rest = parse_own_options(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    deadline = time.time() + own.job_timeout if own.job_timeout else None
    _mend_dmlc_tracker(launcher, deadline)

    def on_signal(signum, _frame):
        raise JobFailed("the launcher received signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)

    script = mxnet_launch_script()
    sys.argv = [script] + rest
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except JobFailed as failure:
        LOG.error("odsgd.launch: %s; ending the job", failure)
        code = 1
    except KeyboardInterrupt:
        LOG.error("odsgd.launch: interrupted; ending the job")
        code = 130
    except SystemExit as stop:  # launch.py's own Ctrl-C handler exits 0: still end the job
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        JOB.end_all()
    if code == 0 and JOB.failure is not None:
        LOG.error("odsgd.launch: %s", JOB.failure)
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
