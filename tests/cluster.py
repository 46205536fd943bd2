"""Starts real ps-lite jobs (scheduler, servers, workers on loopback) through odsgd.launch for
the tests, with a deadline, and ends exactly the processes it started."""
import os
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "tests", "jobs")


class JobError(AssertionError):
    pass


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
        raise JobError("job %s %s timed out:\n%s" % (script, args, output[-6000:]))
    if launcher.returncode != 0:
        raise JobError("job %s %s failed (exit %d):\n%s"
                       % (script, args, launcher.returncode, output[-6000:]))
    return output
