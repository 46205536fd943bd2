"""The key layout of the exchange: agreed between the workers when the store is
made, left out of what a checkpoint depends on, and a step that fails part way stops the store
instead of leaving its rounds out of step.

Every job runs through odsgd.launch with a deadline (tests/cluster.py)."""
import os
import time

import numpy as np
import pytest

from cluster import JobError, run_job
from saved_weights import load_ranks
from odsgd.worker import checkpoint as checkpoints
from odsgd.common import checkpoint_index, state_files

pytestmark = pytest.mark.timeout(400)


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
    return load_ranks(folder)


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
    for rank, weights in enumerate(load_ranks(tmp_path)):
        assert max_relative_difference(weights, uninterrupted[rank]) <= 1e-6


def test_a_resume_that_counts_begin_num_update_twice_is_refused(tmp_path, checkpoint):
    """A script that resumes as for dist_sync, with begin_num_update set to the steps done,
    would shift its schedule twice (the states carry the steps): a ValueError says so."""
    with pytest.raises(JobError) as failure:
        run_job("layout_job.py", ["--out", tmp_path, "--resume-at", 30, "--prefix",
                                  checkpoint, "--begin-num-update", 30], servers=2, timeout=90)
    assert "saved by a job whose optimizer had begin_num_update=0, after 30 steps" in \
        failure.value.output
    assert "create the optimizer with begin_num_update=0" in failure.value.output


def test_a_step_that_fails_part_way_stops_the_store_and_the_job(tmp_path):
    """Rank 1's local update of the second of three key groups raises at step 5 and the loop
    catches it: the next trainer.step raises an error naming the first failure, a save from
    the handler is refused, and the job ends (exit code 1) instead of training on with rounds
    out of step and hanging at exit."""
    started = time.time()
    with pytest.raises(JobError) as failure:
        run_job("failed_step_job.py", ["--prefix", tmp_path / "ckpt"], timeout=90,
                env={"ODSGD_FUSION_ELEMENTS": "0"})
    output = failure.value.output
    assert time.time() - started < 60
    assert "caught RuntimeError: injected failure of the local update" in output
    assert "save refused: StoreFailedError: save_checkpoint refused. dist_odsgd: step 5 " \
           "failed on this worker (RuntimeError: injected failure of the local update) after " \
           "2 of its 3 key groups had sent their rounds" in output
    assert "caught StoreFailedError: pushpull refused. dist_odsgd: step 5 failed" in output
    for what in ("set_optimizer", "barrier"):    # no call of the store goes through
        assert "%s refused: StoreFailedError: %s refused. dist_odsgd: step 5 failed" \
            % (what, "_barrier" if what == "barrier" else what) in output
    assert "step 6 done" in output
    # The handler's save was refused before it wrote a file: the good checkpoint of step 3 at
    # the same prefix is whole (its weights file is the one its states were saved with).
    prefix = str(tmp_path / "ckpt")
    for rank in range(2):
        params_file, states_file = checkpoints.checkpoint_files(prefix, rank)
        saved = state_files.load_worker_states(states_file, rank)
        assert saved["global_step"] == 4
        checkpoints.check_weights_file(params_file, states_file, saved)
    assert checkpoint_index.latest_checkpoint(str(tmp_path)).step == 4


def test_resume_from_parts_of_4_into_parts_of_8_is_exact(tmp_path):
    """The quadratic problem's weight and bias (18 elements, one fused key) saved in parts of
    4 on 2 servers and resumed in parts of 8: the servers' momentum of each element is where
    it was, and 10 steps equal one job's (the NumPy simulation's too)."""
    from quadratic_simulation import RTOL, ATOL, simulate
    options = ["--lr", 0.05, "--momentum", 0.9, "--wd", 1e-3, "--warmup-steps", 2]
    prefix = str(tmp_path / "ckpt")
    for name in ("whole", "first", "resumed"):
        (tmp_path / name).mkdir()
    run_job("quadratic_job.py", ["--out", tmp_path / "whole", "--steps", 10] + options,
            servers=2, env={"ODSGD_PART_ELEMENTS": "4"})
    run_job("quadratic_job.py", ["--out", tmp_path / "first", "--steps", 6,
                                 "--save-prefix", prefix] + options,
            servers=2, env={"ODSGD_PART_ELEMENTS": "4"})
    run_job("quadratic_job.py", ["--out", tmp_path / "resumed", "--steps", 10,
                                 "--resume-prefix", prefix, "--first-step", 6] + options,
            servers=2, env={"ODSGD_PART_ELEMENTS": "8"})
    _, W = simulate(2, 10, 0.05, momentum=0.9, wd=1e-3, warmup_steps=2)
    for rank in range(2):
        resumed = dict(np.load(tmp_path / "resumed" / ("rank%d.npz" % rank)))
        np.testing.assert_allclose(resumed["global_weight"], W[0], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(resumed["global_bias"], W[1], rtol=RTOL, atol=ATOL)


def _sync_and_odsgd(tmp_path, env, **options):
    """The quadratic job with dist_sync and with dist_odsgd in warm-up over every step (then
    it must be dist_sync exactly), under the layout settings of `env`."""
    from quadratic_simulation import run
    runs = []
    for kvstore in ("dist_sync", "dist_odsgd"):
        out = tmp_path / kvstore
        out.mkdir()
        runs.append(run(out, kvstore=kvstore, warmup_steps=1000, env=env, **options))
    return runs


@pytest.mark.parametrize("optimizer,env,options", [
    # weight (15) and bias (3), each below the part size, in one fused key of 18 elements
    # that it cuts in two
    ("lamb", {"ODSGD_FUSION_ELEMENTS": "20", "ODSGD_PART_ELEMENTS": "16"}, {}),
    # the weight alone in parts of 8 (the bias frozen: Nadam's shared schedule makes any
    # two parameters depend on the order the servers update them in, in dist_sync too)
    ("nadam", {"ODSGD_FUSION_ELEMENTS": "0", "ODSGD_PART_ELEMENTS": "8"},
     {"freeze_bias_steps": 100}),
])
def test_optimizers_not_exact_on_parts_equal_dist_sync(tmp_path, optimizer, env, options):
    """LAMB on a fused key that the part size would cut, Nadam on a parameter it would cut in
    two: the store keeps their arrays whole, and every step equals dist_sync's."""
    sync, od = _sync_and_odsgd(tmp_path, env, optimizer=optimizer, steps=8, lr=0.05,
                               wd=0.01, local_optimizer="sgd", **options)
    for rank in range(2):
        for name in ("local_weight", "global_weight", "local_bias"):
            np.testing.assert_allclose(od[rank][name], sync[rank][name], rtol=1e-6,
                                       atol=1e-7, err_msg="worker %d %s" % (rank, name))


def test_weights_of_another_save_beside_the_states_are_refused(tmp_path, checkpoint):
    """A save to the same prefix cut short after a worker wrote its new weights but before its
    new states leaves weights of one save beside states of another: the load refuses it
    (the states record the CRC of the weights file they were saved with)."""
    import glob
    import shutil
    import mxnet as mx
    for path in glob.glob(checkpoint + "*"):
        shutil.copy(path, tmp_path)
    prefix = str(tmp_path / os.path.basename(checkpoint))
    weights = mx.nd.load(prefix + "-worker1.params")
    mx.nd.save(prefix + "-worker1.params", {k: v * 1.01 for k, v in weights.items()})
    with pytest.raises(JobError) as failure:
        run_job("layout_job.py", ["--out", tmp_path, "--resume-at", 30, "--prefix", prefix],
                servers=2, timeout=90)
    assert "ckpt-worker1.params is not the weights file that" in failure.value.output
    assert "load an earlier checkpoint" in failure.value.output


def test_a_failure_in_the_first_step_counts_the_groups_it_made(tmp_path):
    """The first step fuses the three small parameters into one key group: a failure of that
    step's local update reports the groups of the step as made (1 of 1 sent), not the keys'
    groups from before the fusion."""
    with pytest.raises(JobError) as failure:
        run_job("failed_step_job.py", ["--prefix", tmp_path / "ckpt", "--fail-at", 0,
                                       "--fail-group", 0, "--groups", 1, "--good-save-at", -1],
                timeout=90)
    assert "dist_odsgd: step 0 failed on this worker (RuntimeError: injected failure of the " \
           "local update) after 1 of its 1 key groups had sent their rounds" in failure.value.output
