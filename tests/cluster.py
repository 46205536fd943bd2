"""Starts real ps-lite jobs (scheduler, servers, workers on loopback) through odsgd.launch for
the tests, with a deadline, and ends exactly the processes it started."""
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "jobs")


class JobError(AssertionError):
    """A job failed: str() shows the end of its output, `output` holds all of it (what a test
    searches: a message near the start of a long output is past the end that str() shows)."""

    def __init__(self, message, output):
        super(JobError, self).__init__("%s:\n%s" % (message, output[-6000:]))
        self.output = output


def run_job(script, args, workers=2, servers=1, timeout=120, env=None):
    """Runs `python tests/jobs/<script> <args>` as a job of `workers` workers and `servers`
    servers; returns its combined output. Raises JobError with the output when the job fails
    or runs past `timeout` seconds."""
    command = [sys.executable, "-m", "odsgd.launch", "--job-timeout", str(timeout),
               "-n", str(workers), "-s", str(servers), "--launcher", "local",
               sys.executable, os.path.join(JOBS, script)] + [str(a) for a in args]
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")   # 2 cores shared by every process of the job
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=full_env, cwd=REPO, start_new_session=True, text=True)
    try:
        output, _ = launcher.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        # The launcher ends its own job on SIGTERM; SIGKILL its group if it does not.
        launcher.send_signal(signal.SIGTERM)
        try:
            output, _ = launcher.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            output, _ = launcher.communicate()
        raise JobError("job %s %s timed out" % (script, args), output)
    if launcher.returncode != 0:
        raise JobError("job %s %s failed (exit %d)" % (script, args, launcher.returncode),
                       output)
    return output


class WatchedLauncher(object):
    """A launcher command started in a session of its own, its output read line by line while
    it runs (`wait_for`), ended by the test when it must be (`end`). `tag`, a string unique to
    the job, is in every command line of it: what `leftovers` finds."""

    def __init__(self, command, env, timeout, tag):
        import threading
        self.tag, self.timeout, self.started_at = tag, timeout, time.time()
        self.lines = []
        self.changed = threading.Condition()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                        start_new_session=True, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def output(self):
        with self.changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern, timeout=60):
        """The first match of `pattern` in the output, waiting up to `timeout` seconds."""
        regex = re.compile(pattern)
        deadline = time.time() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    match = regex.search(line)
                    if match:
                        return match
                if time.time() > deadline or (self.process.poll() is not None
                                              and not self.reader.is_alive()):
                    raise AssertionError("no line matches %r:\n%s"
                                         % (pattern, "\n".join(self.lines[-60:])))
                self.changed.wait(0.2)

    def pids(self):
        """{label: pid} of the processes the launcher started ('worker 1', 'server 0', ...)."""
        return {m.group(1): int(m.group(2)) for m in
                re.finditer(r"started (.+?) \(pid (\d+)\)", self.output)}

    def finish(self, timeout=None):
        """Waits for the launcher to exit; returns its exit code."""
        try:
            code = self.process.wait(timeout=timeout or self.timeout + 30)
        except subprocess.TimeoutExpired:
            self.end()
            raise AssertionError("the launcher did not exit:\n" + self.output[-6000:])
        self.reader.join(10)
        return code

    def leftovers(self):
        """Processes (pid, command line) whose command line has this job's tag."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if self.tag in cmdline and "pytest" not in cmdline:
                found.append((int(entry), cmdline.strip()))
        return found

    def end(self):
        """Ends the launcher (it ends its job on SIGTERM), then any process of this job that is
        still there, by pid."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for pid, _ in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def started_jobs(job_class):
    """The body of a fixture that starts jobs: yields start(*args, **kwargs), a new
    job_class(*args, **kwargs) (a WatchedLauncher), and ends every job it started after the
    test."""
    jobs = []

    def start(*args, **kwargs):
        job = job_class(*args, **kwargs)
        jobs.append(job)
        return job
    yield start
    for job in jobs:
        job.end()


def assert_no_leftovers(job):
    """No process of `job` (a WatchedLauncher: its tag in the command line) is left; it had
    started some (the launcher logs each), so the check is not vacuous."""
    assert re.search(r"started .*?\(pid \d+\)", job.output), job.output[-3000:]
    deadline = time.time() + 5   # the kernel may take a moment to reap a killed process
    while job.leftovers() and time.time() < deadline:
        time.sleep(0.2)
    assert job.leftovers() == [], "processes left behind:\n%s\n%s" % (job.leftovers(),
                                                                       job.output[-3000:])


def free_port():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HandStartedJob(object):
    """A job started as MXNet's tools/launch.py --launcher local or a cluster manager starts
    one: each process with the DMLC_* variables set by hand, no odsgd.launch. The scheduler and
    the servers run `python -c "import mxnet"` (MXNet serves the job inside that import);
    `workers` is one (argv, extra environment) per worker. Each process runs in a session of
    its own, its output and exit time recorded; `end` kills, by pid, those still running."""

    def __init__(self, workers, servers=1, env=None, server_env=None):
        import threading
        base = dict(os.environ)
        base.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                     "DMLC_NUM_WORKER": str(len(workers)), "DMLC_NUM_SERVER": str(servers),
                     "DMLC_NODE_HOST": "127.0.0.1", "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": REPO + os.pathsep + base.get("PYTHONPATH", "")})
        for name in ("ODSGD_JOB_KEY_FILE", "ODSGD_RESTART_COUNT"):
            base.pop(name, None)
        base.update(env or {})
        serve = [sys.executable, "-c", "import mxnet"]
        plan = [("scheduler", serve, {"DMLC_ROLE": "scheduler"})]
        plan += [("server %d" % i, serve, dict(server_env or {}, DMLC_ROLE="server"))
                 for i in range(servers)]
        plan += [("worker %d" % i, argv, dict(extra or {}, DMLC_ROLE="worker"))
                 for i, (argv, extra) in enumerate(workers)]
        self.processes, self.outputs, self.exited_at = {}, {}, {}
        self.readers = []
        for label, argv, extra in plan:
            process_env = dict(base)
            process_env.update({k: v for k, v in extra.items() if v is not None})
            for name in [k for k, v in extra.items() if v is None]:
                process_env.pop(name, None)
            process = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=process_env, cwd=REPO,
                                       start_new_session=True, text=True)
            self.processes[label], self.outputs[label] = process, []
            reader = threading.Thread(target=self._read, args=(label, process), daemon=True)
            reader.start()
            self.readers.append(reader)

    def _read(self, label, process):
        for line in process.stdout:
            self.outputs[label].append(line)
        process.wait()
        self.exited_at[label] = time.time()

    def output(self, label=None):
        labels = [label] if label else list(self.processes)
        return "\n".join("[%s] %s" % (name, line.rstrip("\n"))
                         for name in labels for line in list(self.outputs[name]))

    def wait(self, timeout):
        """{label: exit code} once every process exited; AssertionError with the output after
        `timeout` seconds (the processes still running are killed)."""
        deadline = time.time() + timeout
        while len(self.exited_at) < len(self.processes) and time.time() < deadline:
            time.sleep(0.1)
        if len(self.exited_at) < len(self.processes):
            running = [l for l in self.processes if l not in self.exited_at]
            self.end()
            raise AssertionError("still running after %g s: %s\n%s"
                                 % (timeout, running, self.output()[-6000:]))
        return {label: p.returncode for label, p in self.processes.items()}

    def end(self):
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        for reader in self.readers:
            reader.join(5)
