"""A worker whose step failed ends the other workers, whatever launched the job: here a job
started by hand (the DMLC_* variables set per process, as MXNet's tools/launch.py or a cluster
manager does), with nothing that ends the others when one exits."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cluster import JOBS, REPO

pytestmark = pytest.mark.timeout(300)
WORKERS = 2


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(role, command, port, log):
    env = dict(os.environ, DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1",
               DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(WORKERS),
               DMLC_NODE_HOST="127.0.0.1", OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_the_other_workers_end_when_a_step_failed(tmp_path):
    """Rank 1's step 5 fails and its loop catches it and trains on (a careless loop): rank 0,
    blocked in that step's rounds, ends with exit code 1 and a message naming rank 1 and step
    5, within ODSGD_EXIT_WAIT (30 s) of the failure, as rank 1 does at its exit."""
    port = free_port()
    logs = {name: open(str(tmp_path / ("%s.log" % name)), "w")
            for name in ("scheduler", "server", "worker0", "worker1")}
    idle = [sys.executable, "-c", "import mxnet"]   # the server loop runs inside the import
    processes = {"scheduler": start("scheduler", idle, port, logs["scheduler"])}
    processes["server"] = start("server", idle, port, logs["server"])
    job = [sys.executable, os.path.join(JOBS, "failed_step_job.py"), "--prefix",
           str(tmp_path / "ckpt")]
    env_fusion = {"ODSGD_FUSION_ELEMENTS": "0"}
    os.environ.update(env_fusion)
    try:
        for rank in range(WORKERS):
            processes["worker%d" % rank] = start("worker", job, port, logs["worker%d" % rank])
        started = time.time()
        codes = {}
        while len(codes) < WORKERS and time.time() - started < 120:
            for rank in range(WORKERS):
                code = processes["worker%d" % rank].poll()
                if code is not None and rank not in codes:
                    codes[rank] = (code, time.time() - started)
            time.sleep(0.2)
    finally:
        for name in env_fusion:
            os.environ.pop(name)
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for log in logs.values():
            log.close()
    output = {name: open(str(tmp_path / ("%s.log" % name))).read() for name in logs}
    assert len(codes) == WORKERS, "a worker was still waiting after 120 s:\n%s" % output
    assert [code for code, _ in codes.values()] == [1, 1], (codes, output)
    # the processes are started in order, but ps-lite gives the ranks: find rank 1 by its line
    failed = [p for p in range(WORKERS)
              if "caught RuntimeError: injected failure of the local update"
              in output["worker%d" % p]]
    assert len(failed) == 1, output
    other = 1 - failed[0]
    assert "dist_odsgd: worker 1's step 5 failed (RuntimeError: injected failure of the local " \
           "update)" in output["worker%d" % other], output["worker%d" % other]
    assert abs(codes[0][1] - codes[1][1]) < 30, codes
