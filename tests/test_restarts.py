"""`python -m odsgd.launch --max-restarts N`: which endings restart the whole job, giving up
when a failed attempt saved no new whole checkpoint, Ctrl-C / SIGTERM never restarting; and
real jobs (tests/jobs/restart_job.py, plain dist_sync) killed, raising and signalled through
the local launcher, each checked to leave no process behind."""
import os
import re
import signal
import sys
import uuid

import pytest

from cluster import JOBS, REPO, WatchedLauncher, assert_no_leftovers, started_jobs
from odsgd.common import checkpoint_index
from odsgd.cluster import restarts
from odsgd.cluster.launch import parse_restart_options
from odsgd.cluster.restarts import Outcome, Settings, decide, exit_cause

pytestmark = pytest.mark.timeout(300)

#: the job's shape (tests/jobs/restart_job.py): 2 workers pushing (rank + 1) * (step + 1)
WORKERS = 2
SAVE_EVERY = 5


def final_weight(steps, workers=WORKERS):
    """The job's weights after `steps` steps, in closed form: sum over t of the round's sum
    of (r + 1) * (t + 1), whatever attempt ran which steps."""
    return workers * (workers + 1) // 2 * steps * (steps + 1) // 2


# -- the decision, called directly ---------------------------------------------------------
def test_exit_causes():
    """A signal (negative code, or 128 + N from a shell or ssh) is 'killed'; an ssh client's
    255 is a lost connection; any other code is the script's own exit."""
    assert exit_cause(-signal.SIGKILL) == "killed"
    assert exit_cause(128 + signal.SIGKILL) == "killed"
    assert exit_cause(128 + signal.SIGTERM, over_ssh=True) == "killed"
    assert exit_cause(255, over_ssh=True) == "connection-lost"
    assert exit_cause(255) == "exit-code"          # a local process that exited 255
    assert exit_cause(1) == exit_cause(2) == "exit-code"
    assert exit_cause(128 + 100) == "exit-code"    # no signal 100


#: cause -> (restarted with --restart-on failure, with --restart-on any)
RESTARTED = {
    "killed": (True, True), "connection-lost": (True, True), "timeout": (True, True),
    "link-lost": (True, True), "launcher-killed": (True, True),
    "exit-code": (False, True), "stalled": (False, True),
    "launcher-error": (False, False), "interrupted": (False, False),
}


@pytest.mark.parametrize("cause", sorted(RESTARTED))
@pytest.mark.parametrize("restart_on", ["failure", "any"])
def test_which_endings_restart(cause, restart_on):
    restart, words = decide(Outcome(1, "it failed", cause), Settings(3, restart_on, None), 0)
    assert restart == RESTARTED[cause][restart_on == "any"], words
    if restart:
        assert words == "restarting"
    else:
        assert words.startswith(("not restarted", "stopped by")), words


def test_interrupted_and_finished_attempts_never_restart():
    settings = Settings(5, "any", None)
    for code in (1, 130):
        restart, words = decide(Outcome(code, "interrupted", "interrupted"), settings, 0)
        assert not restart and "never restarted" in words
    assert decide(Outcome(0, None, "finished"), settings, 0) == (False, "the job is done")


def test_restarts_stop_at_max_restarts():
    settings = Settings(2, "failure", None)
    killed = Outcome(1, "worker 1 was killed", "killed")
    assert [decide(killed, settings, attempt)[0] for attempt in range(3)] == [True, True, False]
    assert decide(killed, settings, 2)[1] == "no restart left (--max-restarts 2)"


def _save(folder, step, name="run"):
    prefix = checkpoint_index.step_prefix(str(folder), name, step)
    with open(prefix + "-weights.npy", "w") as f:
        f.write("weights")
    checkpoint_index.write_marker(prefix, step, "dist_sync", 2, [prefix + "-weights.npy"])
    return checkpoint_index.latest_checkpoint(str(folder))


def test_a_failed_attempt_without_a_new_whole_checkpoint_gives_up(tmp_path):
    """With --checkpoint-dir: restarted only when the attempt made a whole checkpoint that
    was not the newest before it; a save cut short (no marker) does not count."""
    settings = Settings(3, "failure", str(tmp_path))
    killed = Outcome(1, "server 0 was killed", "killed")
    restart, words = decide(killed, settings, 0, None, None)
    assert not restart
    assert words == ("giving up: the attempt made no new whole checkpoint in %s (there is "
                     "none)" % tmp_path)
    first = _save(tmp_path, 40)
    open(checkpoint_index.step_prefix(str(tmp_path), "run", 50) + "-weights.npy", "w").close()
    assert restarts.newest_checkpoint(str(tmp_path)) == first   # step 50 has no marker
    restart, words = decide(killed, settings, 1, first, restarts.newest_checkpoint(
        str(tmp_path)))
    assert not restart and words.endswith("(the newest is still %s, step 40)" % first.prefix)
    assert decide(killed, settings, 1, None, first) == (
        True, "restarting (resumes from %s, step 40)" % first.prefix)
    second = _save(tmp_path, 50)
    assert decide(killed, settings, 1, first, second) == (
        True, "restarting (resumes from %s, step 50)" % second.prefix)
    # the same checkpoint saved again during the attempt is no progress
    assert not decide(killed, settings, 1, second, _save(tmp_path, 50))[0]
    assert restarts.newest_checkpoint(None) is None


def test_restart_options_are_split_off_before_the_command():
    """They are the launcher's, taken from before the training command only; the rest goes
    to each attempt in its order."""
    settings, rest = parse_restart_options(
        ["--max-restarts", "2", "-n", "2", "--restart-on=any", "--checkpoint-dir", "ck",
         "--launcher", "local", "python", "x.py", "--max-restarts", "9"])
    assert settings == Settings(2, "any", "ck")
    assert rest == ["-n", "2", "--launcher", "local", "python", "x.py", "--max-restarts", "9"]
    assert parse_restart_options(["-n", "1", "python"]) == (Settings(0, "failure", None),
                                                             ["-n", "1", "python"])


@pytest.mark.parametrize("options,message", [
    (["--max-restarts", "-1"], "give a whole number >= 0"),
    (["--max-restarts", "two"], "give a whole number >= 0"),
    (["--restart-on", "crash"], "invalid choice: 'crash'"),
])
def test_bad_restart_options_are_refused(options, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_restart_options(options + ["-n", "1", "python"])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_report_of_an_attempt(tmp_path):
    """What an attempt's launcher writes is read back; where it wrote nothing its exit code
    says what happened to it."""
    path = str(tmp_path / "attempt.json")
    outcome = Outcome(1, "worker 1 (pid 7) was killed by signal 9 (SIGKILL)", "killed")
    restarts.write_report(path, outcome)
    assert restarts.read_report(path, 1, 5) == outcome
    missing = str(tmp_path / "none.json")
    assert restarts.read_report(missing, -9, 5) == Outcome(
        -9, "the attempt's launcher (pid 5) was killed by signal 9", "launcher-killed")
    assert restarts.read_report(missing, 2, 5).cause == "launcher-error"
    assert restarts.read_report(missing, 0, 5) == Outcome(0, None, "finished")


@pytest.mark.parametrize("returned,signum,code", [
    (-signal.SIGKILL, None, 128 + signal.SIGKILL),  # the last attempt's launcher was killed
    (-signal.SIGINT, signal.SIGINT, 130),  # Ctrl-C reached it before its handler
    (1, signal.SIGTERM, 1),                # SIGTERM: a traceback's 1, the launcher's own 1
])
def test_the_exit_code_is_a_shells(returned, signum, code, monkeypatch):
    """run() exits with a code os._exit can pass on: 128 + N where the attempt's launcher was
    killed by signal N, and 130 / 1 after Ctrl-C / SIGTERM whatever the attempt returned."""
    def attempt(argv, number, settings, stop, report_path):
        stop.signum = signum
        return restarts.read_report(report_path, returned, 5)
    monkeypatch.setattr(restarts, "run_attempt", attempt)
    assert restarts.run(["python"], Settings(0, "failure", None)) == code


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 1)])
def test_signal_between_attempts_ends_the_job(monkeypatch, signum, code):
    """Ctrl-C / SIGTERM after an attempt ended and before the next starts: no next attempt,
    today's exit codes; the handlers of the caller are back afterwards."""
    started = []

    def attempt(argv, number, settings, stop, report_path):
        started.append(number)
        return Outcome(1, "worker 1 was killed", "killed")

    def newest(directory):    # read after each attempt, before the next starts
        if started:
            os.kill(os.getpid(), signum)
        return None

    before = signal.getsignal(signum)
    monkeypatch.setattr(restarts, "run_attempt", attempt)
    monkeypatch.setattr(restarts, "newest_checkpoint", newest)
    assert restarts.run(["python"], Settings(3, "failure", None)) == code
    assert started == [0]
    assert signal.getsignal(signum) is before


# -- real jobs -----------------------------------------------------------------------------
class AttemptsJob(WatchedLauncher):
    """`python -m odsgd.launch --launcher local ... restart_job.py` that a test watches while
    it runs; `tag`, unique to it, is on every command line of the job, the attempts'
    launchers' included: WatchedLauncher.end and assert_no_leftovers find them all
    (tests/cluster.py)."""

    def __init__(self, launcher_options, job_args, timeout=60):
        tag = "odsgd-restart-test-%s" % uuid.uuid4().hex
        command = ([sys.executable, "-m", "odsgd.launch", "--job-timeout", str(timeout)]
                   + launcher_options + ["-n", str(WORKERS), "-s", "1", "--launcher", "local",
                                         sys.executable, os.path.join(JOBS, "restart_job.py")]
                   + [str(a) for a in job_args] + ["--tag", tag])
        env = dict(os.environ, OMP_NUM_THREADS="1", ODSGD_EXIT_WAIT="10",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("ODSGD_RESTART_COUNT", None)
        env.pop("ODSGD_CHECKPOINT_DIR", None)
        # every attempt may take the whole --job-timeout
        super(AttemptsJob, self).__init__(command, env, 3 * timeout, tag)

    def attempts_started(self):
        return re.findall(r"attempt (\d+) of \d+ started", self.output)


@pytest.fixture
def jobs():
    yield from started_jobs(AttemptsJob)


def finals(output):
    """{rank: the weights it ended with}."""
    return {int(m.group(1)): [float(v) for v in m.group(2).split()]
            for m in re.finditer(r"rank (\d) final ([-\d. e+]+)$", output, re.M)}


def test_killed_worker_restarts_the_job_from_its_checkpoint(jobs, tmp_path):
    """Attempt 0 saves at steps 5 and 10; a worker kills itself before step 12. Attempt 1
    (ODSGD_RESTART_COUNT=1) resumes from step 10 on every worker and ends with the closed
    form of an uninterrupted run."""
    steps, kill_at = 20, 12
    job = jobs(["--max-restarts", "1", "--checkpoint-dir", str(tmp_path)],
               ["--steps", steps, "--kill-at", kill_at])
    code = job.finish()
    output = job.output
    assert code == 0, output[-6000:]
    # a worker reaches step 12 only after rank 0 finished step 11: the checkpoint of step 10
    # is whole by then, and the next save (15) is not reached
    resumed = kill_at // SAVE_EVERY * SAVE_EVERY
    prefix = checkpoint_index.step_prefix(str(tmp_path), "restart-job", resumed)
    assert re.search(r"attempt 1 of 2 ended: worker \d \(pid \d+\) was killed by signal 9 "
                     r"\(SIGKILL\); restarting \(resumes from %s, step %d\)"
                     % (re.escape(prefix), resumed), output), output[-4000:]
    assert job.attempts_started() == ["1", "2"]
    for rank in range(WORKERS):
        assert re.search(r"rank %d pid \d+ ODSGD_RESTART_COUNT=1 ODSGD_CHECKPOINT_DIR=%s$"
                         % (rank, re.escape(str(tmp_path))), output, re.M), output[-4000:]
        assert "rank %d resumed from %s step %d" % (rank, prefix, resumed) in output
    assert finals(output) == {r: [final_weight(steps)] * 8 for r in range(WORKERS)}
    assert "attempt 2 of 2 ended: exit code 0; the job is done" in output
    assert_no_leftovers(job)


def test_without_restarts_a_killed_worker_fails_the_job(jobs):
    """--max-restarts 0: one attempt, exit 1, as without the option."""
    job = jobs(["--max-restarts", "0"], ["--kill-at", 3])
    assert job.finish() == 1
    output = job.output
    assert re.search(r"worker \d \(pid \d+\) was killed by signal 9 \(SIGKILL\); ended the "
                     r"job", output), output[-4000:]
    assert "attempt" not in output and "ODSGD_RESTART_COUNT=0" in output
    assert "final" not in output
    assert_no_leftovers(job)


@pytest.mark.parametrize("restart_on", ["failure", "any"])
def test_worker_exception_restarts_only_with_restart_on_any(jobs, restart_on):
    job = jobs(["--max-restarts", "1", "--restart-on", restart_on], ["--raise-at", 4])
    code = job.finish()
    output = job.output
    ended = re.search(r"attempt 1 of 2 ended: worker \d \(pid \d+\) exited with code 1; (.*)",
                      output)
    assert ended, output[-4000:]
    assert "ValueError: injected at step 4" in output
    if restart_on == "failure":
        assert code == 1
        assert ended.group(1).startswith("not restarted: a process exited with an error")
        assert job.attempts_started() == ["1"]
    else:
        assert code == 0, output[-4000:]
        assert ended.group(1) == "restarting"
        assert len(re.findall(r"rank \d pid \d+ ODSGD_RESTART_COUNT=1 ", output)) == WORKERS
        assert finals(output) == {r: [final_weight(20)] * 8 for r in range(WORKERS)}
    assert_no_leftovers(job)


def test_failed_attempt_without_a_new_checkpoint_gives_up(jobs, tmp_path):
    """A worker is killed before the first save (step 5): restarting would start from the
    same place, so the launcher gives up although restarts are left."""
    job = jobs(["--max-restarts", "2", "--checkpoint-dir", str(tmp_path)], ["--kill-at", 3])
    assert job.finish() == 1
    output = job.output
    assert re.search(r"attempt 1 of 3 ended: worker \d \(pid \d+\) was killed by signal 9 "
                     r"\(SIGKILL\); giving up: the attempt made no new whole checkpoint in "
                     r"%s \(there is none\)" % re.escape(str(tmp_path)), output), output[-4000:]
    assert job.attempts_started() == ["1"]
    assert_no_leftovers(job)


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 1), (signal.SIGINT, 130)])
def test_signal_to_the_launcher_ends_the_job_without_restart(jobs, signum, code):
    job = jobs(["--max-restarts", "2"], ["--steps", 10000])
    job.wait_for(r"^\[worker \d\] rank \d step 3$")
    job.process.send_signal(signum)
    assert job.finish() == code
    output = job.output
    assert re.search(r"attempt 1 of 3 ended: .*; stopped by Ctrl-C / SIGTERM to the "
                     r"launcher, never restarted", output), output[-4000:]
    assert job.attempts_started() == ["1"]
    assert_no_leftovers(job)


def test_killed_server_restarts_the_job(jobs, tmp_path):
    """SIGKILL to the server (by the pid the launcher printed) once a checkpoint is whole:
    the job starts again, resumes from the newest whole checkpoint and ends as an
    uninterrupted run."""
    steps = 60
    job = jobs(["--max-restarts", "1", "--checkpoint-dir", str(tmp_path)],
               ["--steps", steps, "--sleep", 0.05])
    job.wait_for(r"rank 0 saved step %d$" % SAVE_EVERY)
    server = int(job.wait_for(r"started server 0 \(pid (\d+)\)").group(1))
    os.kill(server, signal.SIGKILL)
    code = job.finish()
    output = job.output
    assert code == 0, output[-6000:]
    ended = re.search(r"attempt 1 of 2 ended: server 0 \(pid %d\) was killed by signal 9 "
                      r"\(SIGKILL\); restarting \(resumes from (\S+), step (\d+)\)" % server,
                      output)
    assert ended, output[-4000:]
    resumed = int(ended.group(2))
    assert resumed >= SAVE_EVERY and resumed % SAVE_EVERY == 0
    assert ended.group(1) == checkpoint_index.step_prefix(str(tmp_path), "restart-job",
                                                          resumed)
    assert output.count("resumed from %s step %d" % (ended.group(1), resumed)) == WORKERS
    assert finals(output) == {r: [final_weight(steps)] * 8 for r in range(WORKERS)}
    assert_no_leftovers(job)
