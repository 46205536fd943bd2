"""The key layout of the exchange (issue 33): agreed between the workers when the store is
made, left out of what a checkpoint depends on, and a step that fails part way stops the store
instead of leaving its rounds out of step.

Every job runs through odsgd.launch with a deadline (tests/cluster.py)."""
import os
import time

import numpy as np
import pytest

from cluster import JobError, run_job

pytestmark = pytest.mark.timeout(400)


def final_weights(folder):
    return [dict(np.load(os.path.join(folder, "rank%d.npz" % r))) for r in range(2)]


def max_relative_difference(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]) / (np.abs(b[k]) + 1e-12))) for k in b)


def test_workers_with_other_layout_settings_are_refused_on_every_worker(tmp_path):
    """ODSGD_PART_ELEMENTS differs per process: each worker refuses the store with a
    ValueError naming the setting, every worker's value and rank (not a ps-lite abort)."""
    run_job("layout_job.py", ["--out", tmp_path, "--part-elements-by-task"], timeout=90)
    errors = sorted(os.listdir(tmp_path))
    assert len(errors) == 2, errors
    texts = [open(os.path.join(tmp_path, name)).read() for name in errors]
    assert texts[0] == texts[1]
    assert "the workers would lay out the servers' keys differently: ODSGD_PART_ELEMENTS " \
           "is" in texts[0]
    values = [4 + int(name[len("error"):-len(".txt")]) for name in errors]
    for value in values:
        assert "%d on rank" % value in texts[0]
    assert "give every worker the same values" in texts[0]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """60 steps in one job: 2 servers, the default part size (the 300,000-element weight in
    two parts)."""
    folder = tmp_path_factory.mktemp("whole")
    run_job("layout_job.py", ["--out", folder, "--steps", 60], servers=2, timeout=150)
    return final_weights(folder)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """30 steps and a checkpoint, with 2 servers and the default part size."""
    folder = tmp_path_factory.mktemp("first")
    prefix = str(folder / "ckpt")
    run_job("layout_job.py", ["--out", folder, "--save-at", 30, "--prefix", prefix],
            servers=2, timeout=150)
    return prefix


@pytest.mark.parametrize("servers,part_elements", [(1, "0"), (3, "1024")])
def test_resume_with_another_layout_is_exact(tmp_path, uninterrupted, checkpoint, servers,
                                             part_elements):
    """The checkpoint of 2 servers and parts of 262,144 resumes on 1 server with whole arrays
    and on 3 servers with parts of 1,024: the weights after step 60 equal the uninterrupted
    run's (its momentum, counts and the schedule's drop at step 40 carried over)."""
    run_job("layout_job.py", ["--out", tmp_path, "--resume-at", 30, "--prefix", checkpoint],
            servers=servers, timeout=150, env={"ODSGD_PART_ELEMENTS": part_elements})
    for rank, weights in enumerate(final_weights(tmp_path)):
        assert max_relative_difference(weights, uninterrupted[rank]) <= 1e-6


def test_a_resume_that_counts_begin_num_update_twice_is_refused(tmp_path, checkpoint):
    """A script that resumes as for dist_sync, with begin_num_update set to the steps done,
    would shift its schedule twice (the states carry the steps): a ValueError says so."""
    with pytest.raises(JobError) as failure:
        run_job("layout_job.py", ["--out", tmp_path, "--resume-at", 30, "--prefix",
                                  checkpoint, "--begin-num-update", 30], servers=2, timeout=90)
    assert "saved by a job whose optimizer had begin_num_update=0, after 30 steps" in \
        str(failure.value)
    assert "create the optimizer with begin_num_update=0" in str(failure.value)


def test_a_step_that_fails_part_way_stops_the_store_and_the_job(tmp_path):
    """Rank 1's local update of the second of three key groups raises at step 5 and the loop
    catches it: the next trainer.step raises an error naming the first failure, a save from
    the handler is refused, and the job ends (exit code 1) instead of training on with rounds
    out of step and hanging at exit."""
    started = time.time()
    with pytest.raises(JobError) as failure:
        run_job("failed_step_job.py", ["--prefix", tmp_path / "ckpt"], timeout=90,
                env={"ODSGD_FUSION_ELEMENTS": "0"})
    output = str(failure.value)
    assert time.time() - started < 60
    assert "caught RuntimeError: injected failure of the local update" in output
    assert "save refused: StoreFailedError: save_optimizer_states refused. dist_odsgd: step 5 " \
           "failed on this worker (RuntimeError: injected failure of the local update) after " \
           "2 of its 3 key groups had sent their rounds" in output
    assert "caught StoreFailedError: pushpull refused. dist_odsgd: step 5 failed" in output
    assert "step 6 done" in output
    assert not os.path.exists(tmp_path / "ckpt-worker1.states")
