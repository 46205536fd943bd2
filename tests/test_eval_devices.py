"""The global weights W shown to an evaluation (odsgd/worker/eval_weights.py) when every
parameter lives on several devices: a Gluon net on [cpu(0), cpu(1)] (separate contexts in
MXNet's CPU build), each batch split across them, lr_mult and wd_mult on, SGD with momentum
and wd (tests/jobs/eval_devices_job.py, 2 workers, 1 server, through odsgd.launch).

* An EMA-style write while W is shown (p.set_data on some parameters after an inference
  call) is kept on every device, the other parameters get w_t back on every device, and the
  run equals, bit for bit, the one that writes the same values without the evaluation.
* An evaluation alone changes nothing: the run equals the plain one.
* The two-device run trains the model that one device does: the same steps on one context
  (a gradient summed over two half batches instead of one whole batch: float32 rounding).
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cluster import run_job
from saved_weights import assert_same_weights, load_ranks

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WRITTEN = ("dense0_weight", "dense1_bias")   # what the job's 'write' and 'ema' cases set
PARAMS = ("dense0_weight", "dense0_bias", "dense1_weight", "dense1_bias")
#: 12 steps of SGD with momentum from sums of two half-batch gradients against whole-batch
#: ones: float32 rounding, far below what a wrong or skipped step moves (1e-3 and more)
ONE_DEVICE_TOLERANCE = 1e-5


def _run(tmp_path, case, devices=2):
    out = tmp_path / ("%s-%d" % (case, devices))
    out.mkdir()
    run_job("eval_devices_job.py", ["--out", out, "--case", case, "--devices", devices],
            timeout=150)
    return load_ranks(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("devices")
    jobs = [("ema", 2), ("write", 2), ("eval", 2), ("plain", 2), ("ema", 1)]
    # Two jobs at once: each spends most of its time starting MXNet in four processes.
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda job: _run(tmp_path, *job), jobs))
    return dict(zip(jobs, done))


def test_every_device_holds_the_same_weights(runs):
    for (case, devices), workers in runs.items():
        for rank, saved in enumerate(workers):
            for prefix in ("after", "w", "W"):
                for name in PARAMS:
                    for device in range(1, devices):
                        np.testing.assert_array_equal(
                            saved["%s:%s@%d" % (prefix, name, device)],
                            saved["%s:%s@0" % (prefix, name)],
                            err_msg="%s, %d devices, rank %d" % (case, devices, rank))


def test_a_value_written_while_w_is_shown_is_kept_on_every_device(runs):
    ema, written, evaluated = runs["ema", 2], runs["write", 2], runs["eval", 2]
    assert_same_weights(ema, written)
    for rank in range(2):
        for name in PARAMS:
            for device in range(2):
                key = "after:%s@%d" % (name, device)
                if name in WRITTEN:
                    # the user's values, not the w_t the evaluation set aside
                    assert np.abs(ema[rank][key] - evaluated[rank][key]).max() > 1e-3, key
                else:
                    np.testing.assert_array_equal(ema[rank][key], evaluated[rank][key],
                                                  err_msg="rank %d %s" % (rank, key))
        # W and w differ (the evaluation did show something other than w_t)
        assert max(np.abs(ema[rank]["W:%s@0" % n] - ema[rank]["w:%s@0" % n]).max()
                   for n in PARAMS) > 1e-4


def test_an_evaluation_alone_changes_nothing(runs):
    assert_same_weights(runs["eval", 2], runs["plain", 2])


def test_two_devices_train_what_one_device_does(runs):
    two, one = runs["ema", 2], runs["ema", 1]
    for rank in range(2):
        for name in sorted(one[rank]):
            for device in range(2):
                np.testing.assert_allclose(two[rank][name.replace("@0", "@%d" % device)],
                                           one[rank][name], rtol=ONE_DEVICE_TOLERANCE,
                                           atol=ONE_DEVICE_TOLERANCE,
                                           err_msg="rank %d %s" % (rank, name))
