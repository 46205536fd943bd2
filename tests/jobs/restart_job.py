"""Job of tests/test_restarts.py, on MXNet's plain dist_sync store (mx.kv.create), so that it
tests the launcher's restarts and nothing of dist_odsgd.

Key 0 holds SIZE floats; the servers have no optimizer, so a round stores the sum of its
pushes. At step t (0, 1, ...) the worker of rank r pushes (r + 1) * (t + 1) everywhere, pulls
the round's sum and adds it to its weights w, which are therefore the same on every worker
and, after T steps of N workers, N (N + 1) / 2 * T (T + 1) / 2 everywhere.

With ODSGD_CHECKPOINT_DIR set, rank 0 saves w every --save-every steps (a .npy file, then
the whole-checkpoint marker of odsgd.common.checkpoint_index, last), and every worker resumes from
the newest whole checkpoint there. It prints its ODSGD_RESTART_COUNT, what it resumed from,
`rank R step T` after every step and `rank R final V` at the end. Faults, on the first attempt
only (ODSGD_RESTART_COUNT=0): --kill-at STEP (SIGKILL to itself), --raise-at STEP
(ValueError, which ends the worker with exit code 1), each made by the worker of rank
--fault-rank before it pushes that step."""
import argparse
import importlib.util
import os
import signal
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = 8
RUN_NAME = "restart-job"


def checkpoint_index():
    """odsgd/common/checkpoint_index.py loaded by its path: `import
    odsgd.common.checkpoint_index` would run the package's __init__, which loads the store on
    a worker, and this job tests the launcher alone."""
    spec = importlib.util.spec_from_file_location(
        "restart_job_checkpoint_index",
        os.path.join(REPO, "odsgd", "common", "checkpoint_index.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.05, help="seconds after each step")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--tag", default="", help="ignored; makes the command line unique")
    return p.parse_args(argv)


def resume(index, directory, rank):
    """(first step, weights) from the newest whole checkpoint in `directory`, else (0, 0)."""
    found = index.latest_checkpoint(directory) if directory else None
    if found is None:
        print("rank %d resumed from nothing, step 0" % rank, flush=True)
        return 0, np.zeros(SIZE, np.float32)
    print("rank %d resumed from %s step %d" % (rank, found.prefix, found.step), flush=True)
    return found.step, np.load(found.prefix + "-weights.npy")


def save(index, directory, done, weights, num_workers):
    prefix = index.step_prefix(directory, RUN_NAME, done)
    np.save(prefix + "-weights.npy", weights)
    index.write_marker(prefix, done, "dist_sync", num_workers, [prefix + "-weights.npy"])
    print("rank 0 saved step %d" % done, flush=True)


def fault(args, rank, step, attempt):
    if attempt != "0" or rank != args.fault_rank:
        return
    if step == args.kill_at:
        print("rank %d kills itself at step %d" % (rank, step), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if step == args.raise_at:
        raise ValueError("injected at step %d" % step)


def exit_at_once_on_an_exception():
    """An uncaught exception ends this worker with exit code 1, as dist_odsgd's workers do
    (odsgd.worker.environment): on plain dist_sync the store, destroyed at exit, waits in ps-lite's
    finalize barrier for the workers that wait for this one, and the job would hang."""
    def hook(kind, value, traceback):
        sys.__excepthook__(kind, value, traceback)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.excepthook = hook


def main():
    args = parse_args()
    exit_at_once_on_an_exception()
    index = checkpoint_index()
    import mxnet as mx   # on a server this never returns: the server loop runs inside it

    kv = mx.kv.create("dist_sync")
    attempt = os.environ.get("ODSGD_RESTART_COUNT")
    directory = os.environ.get("ODSGD_CHECKPOINT_DIR")
    print("rank %d pid %d ODSGD_RESTART_COUNT=%s ODSGD_CHECKPOINT_DIR=%s"
          % (kv.rank, os.getpid(), attempt, directory), flush=True)
    first, weights = resume(index, directory, kv.rank)
    kv.init(0, mx.nd.zeros(SIZE))
    pulled = mx.nd.zeros(SIZE)
    for step in range(first, args.steps):
        fault(args, kv.rank, step, attempt)
        kv.push(0, mx.nd.full(SIZE, (kv.rank + 1) * (step + 1)))
        kv.pull(0, out=pulled)
        weights = weights + pulled.asnumpy()
        print("rank %d step %d" % (kv.rank, step), flush=True)
        if directory and kv.rank == 0 and (step + 1) % args.save_every == 0:
            save(index, directory, step + 1, weights, kv.num_workers)
        time.sleep(args.sleep)
    print("rank %d final %s" % (kv.rank, " ".join("%g" % v for v in weights)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
