"""odsgd.save_checkpoint and odsgd.resume_or_start with a gluon.Trainer on MXNet's own stores
(odsgd/worker/mxnet_store_checkpoint.py): dist_sync resumes to the uninterrupted run's weights bit for
bit, and its training is the plain dist_sync run's (the uninterrupted run is plain: MXNet's own
servers); a local store likewise; dist_async resumes from the saved step.

A run of 8 steps that saves after steps 3 and 6 and ends (steps 7 and 8 are lost with it), and
a new job that resumes from the newest whole checkpoint and runs to step 12, against one job of
12 steps (tests/jobs/store_checkpoint_job.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from cluster import JOBS, REPO, run_job
from saved_weights import assert_same_weights, load_ranks

pytestmark = pytest.mark.timeout(600)


def job(kvstore, out, options, servers=1, env=None):
    args = ["--out", out, "--kvstore", kvstore] + options
    if kvstore.startswith("dist"):
        return run_job("store_checkpoint_job.py", args, servers=servers, env=env, timeout=150)
    done = subprocess.run([sys.executable, os.path.join(JOBS, "store_checkpoint_job.py")] +
                          [str(a) for a in args], capture_output=True, text=True, timeout=150,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def interrupted_and_resumed(tmp_path, kvstore, uninterrupted=True, **cluster):
    """The uninterrupted job runs plain (no resume_or_start: the servers run MXNet's own
    updater), so that the resumed job equal to it is also the plain store's training."""
    folders = {name: tmp_path / name for name in ("whole", "first", "resumed", "ckpt")}
    for folder in folders.values():
        folder.mkdir()
    ckpt = str(folders["ckpt"])
    if uninterrupted:
        job(kvstore, folders["whole"], ["--steps", 12, "--plain"], **cluster)
    job(kvstore, folders["first"], ["--steps", 8, "--dir", ckpt, "--save-every", 3], **cluster)
    output = job(kvstore, folders["resumed"], ["--steps", 12, "--dir", ckpt], **cluster)
    return folders, output


@pytest.mark.parametrize("kvstore,workers,cluster", [
    ("dist_sync", 2, {}),
    # the first weight (1,200 elements) sliced over 2 servers by MXNet: each keeps its slice's
    # momentum, saved whole and cut again
    ("dist_sync", 2, {"servers": 2, "env": {"MXNET_KVSTORE_BIGARRAY_BOUND": "500"}}),
    ("local", 1, {})])
def test_resume_is_exact(tmp_path, kvstore, workers, cluster):
    folders, output = interrupted_and_resumed(tmp_path, kvstore, **cluster)
    assert "rank 0 starts at step 6" in output
    assert_same_weights(load_ranks(folders["resumed"], workers),
                        load_ranks(folders["whole"], workers))


def test_dist_async_resumes_from_the_saved_step(tmp_path):
    folders, output = interrupted_and_resumed(tmp_path, "dist_async", uninterrupted=False)
    assert output.count("starts at step 6") == 2
    for run in load_ranks(folders["resumed"]):
        assert all(np.isfinite(value).all() for value in run.values())
