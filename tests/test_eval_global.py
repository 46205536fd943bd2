"""An inference forward between training steps sees the global weights W
(odsgd/worker/eval_weights.py), and the local training trajectory does not notice.

Each API runs tests/jobs/eval_global_job.py twice (2 workers, 1 server, dist_odsgd in the OD
phase from the first step, SGD with momentum, weight decay 0.01, lr_mult and wd_mult of 0.5
and 2 on the two weight matrices):

* with ODSGD_EVAL_WEIGHTS=global (the default) and an evaluation after every epoch, as
  MXNet's fit.py makes it (Module: `fit(eval_data=...)`, which also checkpoints
  `get_params()`) and as GluonCV's scripts do (`net(x)` outside `autograd.record()`);
* with ODSGD_EVAL_WEIGHTS=local and no evaluation at all: the arrays are never swapped.

What the evaluation forward computed must be the network of the newest global weights
(pulled by the job with kv.pull into arrays of its own), computed here in NumPy; fit.py's
checkpoint must hold those weights; and every worker's local and global weights after every
epoch must be bitwise those of the run without evaluations (w_t is copied aside and back
unchanged, and the servers' sums of two gradients do not depend on their order).
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cluster import run_job

pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

EPOCHS = 3
#: float32 forward of a 6-8-3 MLP in MXNet against float64 NumPy: rounding near 1e-7
OUTPUT_TOLERANCE = 1e-5


def _run(tmp_path, api, evaluate):
    out = tmp_path / ("evaluated" if evaluate else "plain")
    out.mkdir()
    args = ["--api", api, "--epochs", EPOCHS, "--out", out] + (["--evaluate"] if evaluate else [])
    mode = "global" if evaluate else "local"
    run_job("eval_global_job.py", args, timeout=90, env={"ODSGD_EVAL_WEIGHTS": mode})
    return [dict(np.load(out / ("rank%d.npz" % rank))) for rank in range(2)]


def _softmax_mlp(x, weights):
    hidden = np.maximum(x @ weights["fc1_weight"].T + weights["fc1_bias"], 0.0)
    logits = hidden @ weights["fc2_weight"].T + weights["fc2_bias"]
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def _weights(saved, prefix):
    return {name[len(prefix):]: value.astype(np.float64) for name, value in saved.items()
            if name.startswith(prefix)}


@pytest.mark.parametrize("api", ["module", "gluon"])
def test_evaluation_sees_the_global_weights_and_training_does_not_notice(tmp_path, api):
    # Both jobs at once: each spends most of its time starting MXNet in four processes.
    with ThreadPoolExecutor(2) as pool:
        evaluated, plain = pool.map(lambda evaluate: _run(tmp_path, api, evaluate),
                                    [True, False])
    for rank in range(2):
        got, reference = evaluated[rank], plain[rank]
        assert str(got["eval_weights"]) == "global" and str(reference["eval_weights"]) == "local"
        for epoch in range(EPOCHS):
            global_weights = _weights(got, "global%d_" % epoch)
            local_weights = _weights(got, "local%d_" % epoch)
            assert len(global_weights) == 4, sorted(got)
            # the two differ: an evaluation of w_t would fail the comparison below
            assert max(np.abs(global_weights[k] - local_weights[k]).max()
                       for k in global_weights) > 1e-3
            expected = _softmax_mlp(got["val_x"].astype(np.float64), global_weights)
            np.testing.assert_allclose(got["outputs%d" % epoch], expected,
                                       rtol=0, atol=OUTPUT_TOLERANCE,
                                       err_msg="rank %d epoch %d" % (rank, epoch))
            if api == "module":   # fit.py's epoch-end checkpoint holds W
                for name, value in global_weights.items():
                    np.testing.assert_array_equal(got["checkpoint%d_%s" % (epoch, name)],
                                                  value.astype(np.float32))
        trajectory = sorted(k for k in reference if k.startswith(("local", "global")))
        assert len(trajectory) == 8 * EPOCHS
        for name in trajectory:
            np.testing.assert_array_equal(got[name], reference[name],
                                          err_msg="rank %d %s" % (rank, name))


def test_the_setting_is_validated():
    from odsgd.common.config import DEFAULTS
    from odsgd.worker.config import ODSGDConfig
    assert DEFAULTS["eval_weights"] == "global"
    assert ODSGDConfig(environ={"ODSGD_EVAL_WEIGHTS": "Local"}).eval_weights == "local"
    with pytest.raises(ValueError, match="ODSGD_EVAL_WEIGHTS must be one of global, local"):
        ODSGDConfig(environ={"ODSGD_EVAL_WEIGHTS": "servers"})
