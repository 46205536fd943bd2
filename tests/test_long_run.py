"""The paths a long run takes around its checkpoints lose nothing: an evaluation right before a
save, a save right after a load, an EMA-style write while the global weights are shown.

Each case is held to the run that took no such path: every worker's own weights w^i and the
global weights W after the last step (tests/jobs/long_run_job.py, 2 workers, 1 server, SGD
with momentum 0.9 and wd 1e-4). Every job runs through odsgd.launch with a deadline."""
import numpy as np
import pytest

from cluster import JobError, run_job
from saved_weights import load_ranks

pytestmark = pytest.mark.timeout(600)
STEPS, SAVE_AT = 20, 10


def max_relative_difference(runs, references):
    return max(float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(b[k])) + 1e-12))
               for run, reference in zip(runs, references) for a, b in [(run, reference)]
               for k in b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """20 steps, no evaluation and no save."""
    folder = tmp_path_factory.mktemp("whole")
    run_job("long_run_job.py", ["--out", folder, "--steps", STEPS], timeout=150)
    return load_ranks(folder)


def test_an_evaluation_before_a_save_is_not_saved_as_the_local_weights(tmp_path,
                                                                        uninterrupted):
    """net(x) outside autograd.record() shows W in the parameters; the save right after it
    must store each worker's w^i, and the run itself must not move."""
    first = tmp_path / "first"
    first.mkdir()
    prefix = str(tmp_path / "ckpt")
    run_job("long_run_job.py", ["--out", first, "--steps", STEPS, "--save-at", SAVE_AT,
                                "--prefix", prefix, "--eval-before-save"], timeout=150)
    assert max_relative_difference(load_ranks(first), uninterrupted) == 0.0
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    run_job("long_run_job.py", ["--out", resumed, "--steps", STEPS, "--resume-from", prefix],
            timeout=150)
    assert max_relative_difference(load_ranks(resumed), uninterrupted) <= 1e-6


def test_a_save_right_after_a_load_keeps_the_servers_states(tmp_path, uninterrupted):
    """Load a checkpoint and save it again under another prefix with no step between (a
    pre-emption handler right after a restart): the second checkpoint resumes to the same
    weights as the first (the servers' momentum is saved though no round touched it)."""
    first = tmp_path / "first"
    first.mkdir()
    prefix, again = str(tmp_path / "ckpt"), str(tmp_path / "again")
    run_job("long_run_job.py", ["--out", first, "--steps", SAVE_AT, "--save-at", SAVE_AT,
                                "--prefix", prefix], timeout=150)
    run_job("long_run_job.py", ["--out", first, "--resume-from", prefix, "--save-again",
                                again], timeout=150)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    run_job("long_run_job.py", ["--out", resumed, "--steps", STEPS, "--resume-from", again],
            timeout=150)
    assert max_relative_difference(load_ranks(resumed), uninterrupted) <= 1e-6


@pytest.mark.parametrize("workers", [1, 3])
def test_a_checkpoint_of_another_number_of_workers_is_refused(tmp_path, workers):
    """A checkpoint of 2 workers resumed with fewer (which loaded with the old gradient scale)
    or more (which failed on a missing file): a ValueError naming both counts."""
    prefix = str(tmp_path / "ckpt")
    run_job("long_run_job.py", ["--out", tmp_path, "--steps", SAVE_AT, "--save-at", SAVE_AT,
                                "--prefix", prefix], timeout=150)
    with pytest.raises(JobError) as refused:
        run_job("long_run_job.py", ["--out", tmp_path, "--steps", STEPS, "--resume-from",
                                    prefix], workers=workers, timeout=150)
    assert "was saved by a job of 2 workers; this job has %d" % workers in refused.value.output
    assert "resume it with 2 workers (-n 2)" in refused.value.output
