"""A worker that ends without finishing ends the whole job, whatever launched it: here jobs
started by hand (the DMLC_* variables set per process, as MXNet's tools/launch.py or a cluster
manager does), with nothing else that ends the others when one exits. Every process has
exited within ODSGD_EXIT_WAIT + 5 s of the first worker's end: the workers with exit code 1
naming the rank and why, the server and the scheduler with 1 (0 when every worker finished:
tests/test_job_key.py's hand-started job)."""
import json
import os
import re
import signal
import sys
import time

import pytest

from cluster import JOBS, HandStartedJob
from odsgd.common import job_key

pytestmark = pytest.mark.timeout(300)
EXIT_WAIT = 10.0


def run(worker_argv, kill_after_step=None, env=None):
    """A hand-started job of 2 workers running `worker_argv` and 1 server, ODSGD_EXIT_WAIT=10;
    with `kill_after_step`, SIGKILL to the first worker that prints that step. Returns (exit
    codes, exit times, the job)."""
    job = HandStartedJob([(worker_argv, {}), (worker_argv, {})],
                         env=dict(env or {}, ODSGD_EXIT_WAIT=str(EXIT_WAIT)))
    try:
        if kill_after_step is not None:
            victim = _wait_for_step(job, kill_after_step)
            os.kill(job.processes[victim].pid, signal.SIGKILL)
        codes = job.wait(120)
    finally:
        job.end()
    return codes, dict(job.exited_at), job


def _wait_for_step(job, step, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for label in ("worker 0", "worker 1"):
            if any(line.startswith("step %d pid" % step) for line in job.outputs[label]):
                return label
        time.sleep(0.05)
    raise AssertionError("no worker made step %d:\n%s" % (step, job.output()[-4000:]))


def assert_whole_job_ended(codes, exited_at, job):
    assert_ended_in_time(exited_at, job)
    assert codes["server 0"] == 1 and codes["scheduler"] == 1, (codes, job.output()[-6000:])
    assert "every worker has ended, 1 without finishing" in job.output("server 0") or \
        "every worker has ended, 2 without finishing" in job.output("server 0"), \
        job.output("server 0")


def assert_ended_in_time(exited_at, job):
    first = min(exited_at[w] for w in ("worker 0", "worker 1"))
    late = {label: round(t - first, 1) for label, t in exited_at.items()
            if t - first > EXIT_WAIT + 5}
    assert late == {}, (late, job.output()[-6000:])


def test_a_job_whose_workers_finish_ends_with_code_0():
    """Both workers make their 6 steps and pass the exit check: every process exits 0."""
    argv = [sys.executable, os.path.join(JOBS, "fault_job.py"), "--steps", "6", "--sleep", "0"]
    codes, exited_at, job = run(argv)
    assert set(codes.values()) == {0}, (codes, job.output()[-6000:])
    assert "without finishing" not in job.output(), job.output()[-6000:]
    assert_ended_in_time(exited_at, job)


def test_the_other_workers_end_when_a_step_failed(tmp_path):
    """Rank 1's step 5 fails and its loop catches it and trains on (a careless loop): rank 0,
    blocked in that step's rounds, ends with exit code 1 and a message naming rank 1 and step
    5, as rank 1 does at its exit; then the server and the scheduler."""
    argv = [sys.executable, os.path.join(JOBS, "failed_step_job.py"), "--prefix",
            tmp_path / "ckpt"]
    codes, exited_at, job = run(argv, env={"ODSGD_FUSION_ELEMENTS": "0"})
    assert codes["worker 0"] == codes["worker 1"] == 1, (codes, job.output()[-6000:])
    # the processes are started in order, but ps-lite gives the ranks: find rank 1 by its line
    failed = [w for w in ("worker 0", "worker 1")
              if "caught RuntimeError: injected failure of the local update" in job.output(w)]
    assert len(failed) == 1, job.output()
    other = ({"worker 0", "worker 1"} - set(failed)).pop()
    assert "dist_odsgd: worker 1's step 5 failed (RuntimeError: injected failure of the local " \
           "update)" in job.output(other), job.output(other)
    assert_whole_job_ended(codes, exited_at, job)


@pytest.mark.parametrize("fault", ["raise", "kill", "refuse"])
def test_a_worker_that_ends_without_finishing_ends_the_job(fault, tmp_path):
    """An exception in rank 1's own code between steps (before its forward), SIGKILL of a
    worker after step 3, or a refusal at rank 1's first step (update_on_kvstore=False): the
    other worker, waiting in its round, ends naming the rank and why. The first job has a key
    (every command, announcement and the scheduler's datagram signed), the others none."""
    argv = [sys.executable, os.path.join(JOBS, "fault_job.py"), "--steps", "400",
            "--sleep", "0.02"]
    argv += {"raise": ["--raise-at", "4"], "kill": [], "refuse": ["--refuse"]}[fault]
    env = {}
    if fault == "raise":
        env["ODSGD_JOB_KEY_FILE"] = str(tmp_path / "key")
        job_key.write_key_file(env["ODSGD_JOB_KEY_FILE"], job_key.new_key())
    codes, exited_at, job = run(argv, kill_after_step=3 if fault == "kill" else None, env=env)
    assert ("has no key" in job.output("server 0")) == (fault != "raise"), job.output("server 0")
    assert "refused" not in job.output("server 0"), job.output("server 0")
    assert sorted([codes["worker 0"], codes["worker 1"]]) == \
        ([-signal.SIGKILL, 1] if fault == "kill" else [1, 1]), (codes, job.output()[-6000:])
    why = {"raise": r"worker 1 ended without finishing \(RuntimeError: injected failure at "
                    r"step 4\)",
           "kill": r"worker \d ended without finishing and without a word \(killed by a "
                   r"signal[^)]*\)",
           "refuse": r"worker 1 ended without finishing \(ValueError: [^;]*update_on_kvstore=True"
                      r"[^;]*\)"}[fault]
    ended = re.compile(r"dist_odsgd: %s; the job cannot go on without it, so worker \d ends too"
                       % why)
    assert any(ended.search(job.output(w)) for w in ("worker 0", "worker 1")), \
        job.output()[-6000:]
    assert_whole_job_ended(codes, exited_at, job)


def test_a_watch_tells_finished_failed_silent_and_forged_ends_apart(monkeypatch, tmp_path):
    """In one process, no job: four announcers, one watch of them all. One finishes, one
    fails at step 7, one has its connections closed without a word (as a killed process's
    are), one sends a line with a MAC not made with the job's key (a forged end, ignored) and
    then closes: the
    watch reports the failed one with its line, the last two as ended without a word, and
    that all have ended."""
    import threading
    from odsgd.common import job_watch
    monkeypatch.setenv("DMLC_NODE_HOST", "127.0.0.1")
    monkeypatch.setenv("ODSGD_JOB_KEY_FILE", str(tmp_path / "key"))
    job_key.write_key_file(str(tmp_path / "key"), job_key.new_key())
    announcers = [job_watch.Announcer(rank) for rank in range(4)]
    failures, done = {}, threading.Event()
    watch = job_watch.Watch({a.rank: (a.address, a.port, a.token) for a in announcers},
                            lambda rank, message: failures.setdefault(rank, message),
                            lambda failed: done.set())
    deadline = time.time() + 10
    while any(len(a._watchers) < 1 for a in announcers) and time.time() < deadline:
        time.sleep(0.05)
    announcers[0].announce(job_watch.FINISHED)
    announcers[1].announce(job_watch.FAILED, "RuntimeError: boom", 7)
    forged = {"rank": 3, "end": job_watch.FAILED, "error": "forged", "step": None,
              "token": announcers[3].token, "mac": "0" * 64}
    announcers[3]._watchers[0].sendall((json.dumps(forged) + "\n").encode())
    for announcer in announcers:
        for connection in announcer._watchers:
            connection.close()
    assert done.wait(10), (failures, watch.ended)
    assert sorted(failures) == [1, 2, 3]
    assert failures[1]["error"] == "RuntimeError: boom" and failures[1]["step"] == 7
    assert failures[2] is None and failures[3] is None
    assert job_watch.describe(1, failures[1]) == "worker 1's step 7 failed (RuntimeError: boom)"
