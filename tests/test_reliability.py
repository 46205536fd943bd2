"""Reliability of dist_odsgd jobs: faults end the whole job quickly and loudly,
unequal data per worker never hangs, checkpoints resume exactly, and a larger job holds.

Every job runs through odsgd.launch with a deadline. A test that injects a fault kills exactly
the process it means to, by the pid the launcher printed, and afterwards checks that no process
of the job is left (by a string unique to the job's command line)."""
import os
import re
import signal
import sys
import time
import uuid

import numpy as np
import pytest

from cluster import JOBS, REPO, WatchedLauncher, assert_no_leftovers, run_job, started_jobs
from quadratic_simulation import RTOL, ATOL, simulate

pytestmark = pytest.mark.timeout(300)

#: the bound on the time from a fault to the launcher's exit
FAIL_FAST_SECONDS = 30
#: ODSGD_EXIT_WAIT of the tests that wait for it (the default, 30 s, would only make them longer)
EXIT_WAIT = 8


class LiveJob(WatchedLauncher):
    """An odsgd.launch job of tests/jobs/<script> that a test watches line by line while it
    runs (tests/cluster.py)."""

    def __init__(self, script, args, workers=2, servers=1, timeout=90, env=None, tag=None):
        tag_given = tag
        tag = tag or "odsgd-test-%s" % uuid.uuid4().hex
        command = [sys.executable, "-m", "odsgd.launch", "--job-timeout", str(timeout),
                   "-n", str(workers), "-s", str(servers), "--launcher", "local",
                   sys.executable, os.path.join(JOBS, script)] + [str(a) for a in args]
        if tag_given is None:
            command += ["--tag", tag]
        full_env = dict(os.environ, OMP_NUM_THREADS="1")
        full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.update(env or {})
        super(LiveJob, self).__init__(command, full_env, timeout, tag)


@pytest.fixture
def live_jobs():
    yield from started_jobs(LiveJob)


# -- failure detection -----------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["worker 1", "server 0", "scheduler"])
def test_killed_process_ends_the_job(live_jobs, victim):
    """kill -9 of a worker, a server or the scheduler while training runs: the launcher ends
    every process and exits non-zero within 30 s, naming the process and its last lines."""
    job = live_jobs("fault_job.py", ["--sleep", "0.05"])
    job.wait_for(r"^\[worker 1\] step 3 ")
    pid = job.pids()[victim]
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    code = job.finish(timeout=FAIL_FAST_SECONDS + 30)
    took = time.time() - killed_at
    output = job.output
    assert code != 0, output[-3000:]
    assert took < FAIL_FAST_SECONDS, "the launcher took %.1f s:\n%s" % (took, output[-3000:])
    assert "%s (pid %d) was killed by signal 9 (SIGKILL)" % (victim, pid) in output
    assert re.search(r"ended the job [\d.]+ s after the failure", output), output[-3000:]
    if victim.startswith("worker"):
        report = output[output.index("its last"):]
        assert re.search(r"^    step \d+ pid %d" % pid, report, re.M), report[:2000]
    assert_no_leftovers(job)


def test_worker_exception_ends_the_job(live_jobs):
    """An uncaught exception on a worker: exit code 1 at once, the traceback in the report."""
    job = live_jobs("fault_job.py", ["--raise-at", "5"])
    job.wait_for(r"^\[worker \d\] step 2 ")
    started = time.time()
    code = job.finish(timeout=FAIL_FAST_SECONDS + 30)
    output = job.output
    assert code != 0
    assert time.time() - started < FAIL_FAST_SECONDS
    assert re.search(r"worker \d \(pid \d+\) exited with code 1; its last \d+ output lines",
                     output), output[-3000:]
    assert "RuntimeError: injected failure at step 5" in output[output.index("its last"):]
    assert_no_leftovers(job)


def test_hung_worker_ends_at_job_timeout(live_jobs):
    """A worker that hangs (here: sleeps forever) holds the others in their next pull; the
    job ends at --job-timeout, with every process's last lines."""
    # 20 s: the hang (about 6 s after the start on a quiet machine) must come before the
    # timeout even when MXNet starts slowly on a busy one
    job = live_jobs("fault_job.py", ["--hang-at", "3"], timeout=20)
    # the scheduler gives ranks in connection order, so kv.rank 0 may be any launched worker
    job.wait_for(r"^\[worker \d\] hanging at step 3")
    code = job.finish(timeout=60)
    output = job.output
    assert code != 0
    assert "the job ran past --job-timeout" in output
    assert "hanging at step 3" in output[output.index("its last"):]
    assert_no_leftovers(job)


def test_workers_that_never_join_end_the_job(live_jobs):
    """Workers that create no distributed store (a script that turned its kvstore flag into
    'local') exit 0 while the scheduler and the server wait for them forever: the launcher
    ends the job about ODSGD_EXIT_WAIT seconds later, non-zero, saying why, instead of at
    --job-timeout."""
    job = live_jobs("fault_job.py", ["--no-store"], timeout=300,
                    env={"ODSGD_EXIT_WAIT": str(EXIT_WAIT)})
    job.wait_for(r"^\[worker \d\] trained without a distributed store")
    started = time.time()
    code = job.finish(timeout=EXIT_WAIT + 60)
    output = job.output
    assert code != 0
    assert EXIT_WAIT - 1 < time.time() - started < EXIT_WAIT + 30, output[-3000:]
    assert "every worker exited with code 0, but the scheduler still waits for them" in output
    assert "the job ran past --job-timeout" not in output
    assert_no_leftovers(job)


def test_killed_launcher_takes_its_job_along(live_jobs):
    """kill -9 of the launcher itself: every process of the job gets SIGKILL from the kernel
    (PR_SET_PDEATHSIG), nothing is left."""
    job = live_jobs("fault_job.py", [])
    job.wait_for(r"^\[worker 1\] step 3 ")
    children = job.pids()
    assert len(children) == 4, children
    # the scheduler is odsgd/cluster/ps_scheduler.py, the training command (with its tag) beside it
    with open("/proc/%d/cmdline" % children["scheduler"], "rb") as f:
        scheduler = f.read().decode().split("\0")
    assert scheduler[1].endswith(os.path.join("odsgd", "cluster", "ps_scheduler.py")), scheduler
    assert scheduler[2] == "--job" and "fault_job.py" in scheduler[3] and job.tag in scheduler[3]
    os.kill(job.process.pid, signal.SIGKILL)
    job.finish(timeout=10)
    assert_no_leftovers(job)


def test_ctrl_c_ends_the_job_with_a_non_zero_code(live_jobs):
    """SIGINT to the launcher (Ctrl-C): every process is ended, exit code 130 and the reason,
    so that `odsgd.launch ... && next` stops (launch.py's own handler would exit 0)."""
    job = live_jobs("fault_job.py", [])
    job.wait_for(r"^\[worker 1\] step 3 ")
    os.kill(job.process.pid, signal.SIGINT)
    assert job.finish(timeout=30) == 130
    assert "odsgd.launch: interrupted; ended the job" in job.output, job.output[-2000:]
    assert_no_leftovers(job)


# -- unequal data per worker ------------------------------------------------------------------
def test_unequal_shards_with_equal_steps_finish_and_match(tmp_path):
    """Shards of 3 and 5 batches, two epochs: odsgd.equal_steps makes every worker run 3 steps
    an epoch; the job finishes and the global weights are the NumPy simulation's (the step
    checks' probe rounds leave the model unchanged)."""
    output = run_job("uneven_job.py", ["--out", tmp_path, "--epochs", 2, "--batches", 3,
                                       "--extra", 2, "--rule", "equal"], timeout=90)
    assert output.count("3 of 5 local batches") == 2
    _, W = simulate(2, 6, 0.05, momentum=0.9, warmup_steps=2)
    for rank in range(2):
        result = np.load(tmp_path / ("rank%d.npz" % rank))
        assert int(result["steps"]) == 6
        np.testing.assert_allclose(result["global_weight"], W[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(result["global_bias"], W[1], rtol=RTOL, atol=ATOL)


def test_unequal_shards_without_the_rule_fail_clearly(live_jobs, tmp_path):
    """Each worker runs its whole shard (3 and 5 batches): the worker that finishes first
    finds at exit that another pushed more steps, and ends the job with the rule, instead of
    waiting in ps-lite's finalize barrier forever."""
    job = live_jobs("uneven_job.py", ["--out", tmp_path, "--epochs", 1, "--rule", "ignore"],
                    timeout=90, tag=str(tmp_path))
    code = job.finish()
    output = job.output
    assert code != 0
    assert "the workers made different numbers of steps" in output, output[-3000:]
    assert "odsgd.equal_steps(trainer, len(local_batches))" in output
    assert time.time() - job.started_at < 60
    assert_no_leftovers(job)


def test_worker_without_a_step_ends_the_job(live_jobs, tmp_path):
    """Worker 0's shard is empty and nobody calls equal_steps: it makes no step, while worker
    1 waits for it in the keys' first initialisation. Worker 0 cannot probe (it holds no key);
    it waits ODSGD_EXIT_WAIT seconds at exit, then ends the job with the rule."""
    job = live_jobs("uneven_job.py", ["--out", tmp_path, "--epochs", 1, "--batches", 0,
                                      "--extra", 2, "--rule", "none"],
                    timeout=120, tag=str(tmp_path), env={"ODSGD_EXIT_WAIT": str(EXIT_WAIT)})
    code = job.finish()
    output = job.output
    assert code != 0
    assert "worker 0 made no step" in output
    assert "worker 0 has made 0 steps and is exiting, and the other workers have not come" \
        in output, output[-3000:]
    assert time.time() - job.started_at < 60
    assert_no_leftovers(job)


def test_two_trainers_on_one_store_fail_with_the_reason(live_jobs):
    """A second gluon.Trainer on the same store would reuse keys 0, 1, ...: a ValueError that
    says so, and the job ends non-zero."""
    job = live_jobs("two_trainers_job.py", [], timeout=90)
    code = job.finish()
    assert code != 0
    assert "key 0 is already initialised in this dist_odsgd store: a store serves one " \
        "gluon.Trainer or Module" in job.output, job.output[-3000:]
    assert time.time() - job.started_at < 60
    assert_no_leftovers(job)


def test_a_second_store_in_one_process_is_refused(live_jobs):
    """Two dist_odsgd stores in one process would share the servers' key numbers: the second is
    a ValueError naming the fix, and the first store trains on."""
    job = live_jobs("two_trainers_job.py", ["--second-store"], timeout=90)
    assert job.finish() == 0, job.output[-3000:]
    assert "second store refused: dist_odsgd: this process already has a dist_odsgd store" \
        in job.output, job.output[-3000:]
    assert "pass that store (kvstore=kv) to every Trainer or Module" in job.output
    assert_no_leftovers(job)


# -- checkpoint and resume --------------------------------------------------------------------
def test_checkpoint_resume_is_exact(tmp_path):
    """10 steps in one job equal 6 steps + odsgd.save_checkpoint + a new job that loads it and
    makes 4 more, in the OD phase, with global momentum 0.9, local momentum, adaptive
    compensation and a learning-rate schedule (servers' update counts), on 2 servers."""
    options = ["--lr", 0.05, "--momentum", 0.9, "--wd", 1e-3, "--warmup-steps", 3,
               "--local-optimizer", "sgd", "--local-lr", 0.08, "--local-momentum", 0.5,
               "--compensation", 0.5, "--compensation-mode", "adaptive", "--lr-factor-step", 4]
    for name in ("whole", "first", "resumed"):
        (tmp_path / name).mkdir()
    prefix = str(tmp_path / "ckpt")
    run_job("quadratic_job.py", ["--out", tmp_path / "whole", "--steps", 10] + options,
            servers=2, timeout=90)
    run_job("quadratic_job.py", ["--out", tmp_path / "first", "--steps", 6,
                                 "--save-prefix", prefix] + options, servers=2, timeout=90)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["whole", "first", "resumed", "ckpt-worker0.params", "ckpt-worker0.states",
         "ckpt-worker1.params", "ckpt-worker1.states", "ckpt-worker0.states.servers",
             "ckpt.whole.json"])
    run_job("quadratic_job.py", ["--out", tmp_path / "resumed", "--steps", 10,
                                 "--resume-prefix", prefix, "--first-step", 6] + options,
            servers=2, timeout=90)
    runs = {name: [dict(np.load(tmp_path / name / ("rank%d.npz" % r))) for r in range(2)]
            for name in ("whole", "resumed")}

    def lr_at(t):
        return 0.05 * 0.5 ** (t // 4)
    history, W = simulate(2, 10, 0.05, momentum=0.9, wd=1e-3, warmup_steps=3,
                          local_optimizer="sgd", local_lr=0.08, local_momentum=0.5,
                          local_wd=0.0, compensation=0.5, compensation_mode="adaptive",
                          lr_at=lr_at)
    for rank in range(2):
        whole, resumed = runs["whole"][rank], runs["resumed"][rank]
        np.testing.assert_allclose(whole["global_weight"], W[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(whole["local_weight"], history[rank][0], rtol=RTOL,
                                   atol=ATOL)
        for name in ("local_weight", "local_bias"):
            np.testing.assert_allclose(resumed[name], whole[name][6:], rtol=1e-6, atol=1e-7,
                                       err_msg="worker %d %s" % (rank, name))
        for name in ("global_weight", "global_bias"):
            np.testing.assert_allclose(resumed[name], whole[name], rtol=1e-6, atol=1e-7,
                                       err_msg="worker %d %s" % (rank, name))
        np.testing.assert_allclose(resumed["learning_rates"], whole["learning_rates"][6:])


# -- load -------------------------------------------------------------------------------------
def test_eight_workers_two_servers_two_hundred_steps(tmp_path):
    """8 workers and 2 servers on this machine, 200 steps (20 of warm-up): every worker
    finishes and the global weights are the NumPy simulation's."""
    started = time.time()
    run_job("quadratic_job.py", ["--out", tmp_path, "--steps", 200, "--lr", 0.02,
                                 "--momentum", 0.9, "--warmup-steps", 20,
                                 "--local-optimizer", "predict"],
            workers=8, servers=2, timeout=150)
    took = time.time() - started
    history, W = simulate(8, 200, 0.02, momentum=0.9, warmup_steps=20)
    for rank in range(8):
        result = np.load(tmp_path / ("rank%d.npz" % rank))
        assert result["local_weight"].shape[0] == 200
        np.testing.assert_allclose(result["global_weight"], W[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(result["global_bias"], W[1], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(result["local_weight"][-1], history[rank][0][-1],
                                   rtol=1e-4, atol=1e-6)
    assert took < 120, "the 8-worker job took %.0f s" % took


# -- the servers' side, in this process -------------------------------------------------------
def test_server_optimizer_control_probe_and_states(monkeypatch):
    """ServerOptimizer as a server runs it: a control key stores the sum it receives, a probe
    round leaves the weights, states and update counts of the keys it names alone (once, however
    many workers announce it; other keys are updated), and get_states/set_states
    carry momentum and update counts over to a fresh server."""
    import mxnet as mx
    from odsgd.server import updater as servers
    monkeypatch.setattr(servers, "_CONTROL_KEYS", set())
    monkeypatch.setattr(servers, "_PROBING", {})
    monkeypatch.setattr(servers, "_PROBED", {})
    monkeypatch.setattr(servers, "_RUNNING", None)

    def server(optimizer):   # what a server holds after unpickling the worker's command
        import pickle
        return pickle.loads(pickle.dumps(servers.ServerOptimizer(optimizer), 0))

    running = server(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=0.5))
    assert servers._RUNNING is running
    updater = mx.optimizer.get_updater(running)
    weight, grad = mx.nd.ones((2, 3)), mx.nd.full((2, 3), 2.0)
    updater(0, grad, weight)                       # momentum -0.1 * 0.5 * 2 = -0.1
    np.testing.assert_allclose(weight.asnumpy(), 0.9, rtol=1e-6)

    assert pickle_command(servers.control_key_command(7)) is running
    table = mx.nd.zeros((2, 4), dtype="float64")
    updater(7, mx.nd.array([[1, 1, 5, 3], [1, 1, 5, 4]], dtype="float64"), table)
    np.testing.assert_array_equal(table.asnumpy(), [[1, 1, 5, 3], [1, 1, 5, 4]])

    assert pickle_command(servers.probe_command(1, [0])) is running
    assert pickle_command(servers.probe_command(1, [0])) is running   # the other worker's
    other = mx.nd.ones((2, 3))
    updater(5, grad, other)                        # a key the probe did not name: applied
    np.testing.assert_allclose(other.asnumpy(), 0.9, rtol=1e-6)
    updater(0, mx.nd.zeros((2, 3)), weight)        # the probe round: nothing applied
    np.testing.assert_allclose(weight.asnumpy(), 0.9, rtol=1e-6)
    assert running.optimizer._index_update_count[0] == 1
    updater(0, grad, weight)                       # momentum 0.9 * -0.1 - 0.1 = -0.19
    np.testing.assert_allclose(weight.asnumpy(), 0.71, rtol=1e-6)

    from odsgd.server import states as server_states
    saved = server_states.join([running.get_states(2)], {})
    fresh = server(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=0.5))
    fresh.set_states(saved)
    assert fresh.optimizer.num_update == 2
    assert fresh.optimizer._index_update_count[0] == 2
    fresh_updater = mx.optimizer.get_updater(fresh)
    fresh_updater(0, grad, weight)                 # momentum 0.9 * -0.19 - 0.1 = -0.271
    np.testing.assert_allclose(weight.asnumpy(), 0.71 - 0.271, rtol=1e-5)


def pickle_command(body):
    """What a server does with a command's body: unpickle it (which runs the command) and get
    the optimizer to install."""
    import pickle
    return pickle.loads(body.encode("ascii"))


def test_launcher_labels_and_exit_descriptions():
    """How the launcher names processes: from the environment of the local launcher, from the
    command line of the ssh and mpi launchers; and how it describes an exit."""
    from odsgd.cluster.launch import Job, ProcessRecord
    job = Job()
    assert job._label({"DMLC_ROLE": "scheduler"}, "python train.py") == "scheduler"
    assert job._label({"DMLC_ROLE": "worker", "DMLC_TASK_ID": "1",
                       "DMLC_NUM_WORKER": "2"}, "python train.py") == "worker 1"
    assert job._label({"DMLC_ROLE": "server", "DMLC_TASK_ID": "3",
                       "DMLC_NUM_WORKER": "2"}, "python train.py") == "server 1"
    ssh = ("ssh -o StrictHostKeyChecking=no node1 -p 22 'export DMLC_ROLE=server; "
           "cd /work; python train.py'")
    assert job._label(None, ssh) == "server 0"
    assert job._label(None, ssh.replace("server", "worker")) == "worker 0"
    assert job._label(None, ssh.replace("server", "worker")) == "worker 1"
    assert job._label(None, "mpirun -n 2 -x DMLC_ROLE=worker python train.py") == "worker 2"
    assert job._label(None, "mpirun -n 1 -env DMLC_ROLE server python t.py") == "server 1"

    class Exited(object):
        pid = 42
    record = ProcessRecord(Exited(), "worker 1")
    assert record.describe_exit(-9) == "worker 1 (pid 42) was killed by signal 9 (SIGKILL)"
    assert record.describe_exit(137) == ("worker 1 (pid 42) exited with code 137 (a shell's "
                                         "code for signal 9, SIGKILL)")
    assert record.describe_exit(2) == "worker 1 (pid 42) exited with code 2"
