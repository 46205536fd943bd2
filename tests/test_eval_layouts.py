"""Evaluation with the training network between epochs, as real jobs.

An inference-mode forward of a conv net makes MXNet's CPU build keep the conv weights in an
MKL-DNN layout, which the library operators cannot write in place (odsgd/native/layout.py).
The local update passes the weights as outputs only, for every lam, and MXNet drops the
layout itself, with no wait (the Module job with lam = 0 and the weights as inputs too,
without a reorder, failed 3 runs of 3 with MXNet's message). With the compensation term
(lam 0.1) the update reads w_t from the store's flat copy of the weights, gathered from them
at the first step (an MKL-DNN layout is read through a copy, inside MXNet's engine) and again
after load_global_weights, which the jobs call after their first epoch before training on.

Each job (2 workers, 1 server, dist_odsgd in the OD phase from the first step, 3 epochs:
tests/jobs/eval_layout_job.py) runs twice: with the fused operators loaded, and with the
NDArray fallback (ODSGD_NATIVE_LIB pointing to a missing file). Both must finish, and their
weights agree.

Tolerance: the fused operator and the fallback compute the same float32 formulas, the
fallback as separate MXNet operators whose rounding may differ in the last bit, and 18 steps
of SGD with momentum through two ReLU convolutions can let such differences grow. Measured
here: identical for Module, at most 6e-8 for Gluon, on weights up to 3.4. rtol = atol = 1e-5
leaves room for other CPUs' rounding, while a wrong or skipped update of any array (the
failure this guards against) moves weights by 1e-3 or more.

On fbfd6d0 (before the layout handling) the Module job failed with MXNet's "We can't
generate TBlob for MKLDNN data" in 2 of 3 runs on this machine: whether it fails depends on
whether the training forward's asynchronous reorder back to the default layout runs before
the local update does.
"""
import numpy as np
import pytest

from cluster import run_job

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

RTOL = ATOL = 1e-5
EPOCHS = 3


def _run(tmp_path, api, fallback, compensation):
    out = tmp_path / ("fallback" if fallback else "fused")
    out.mkdir()
    env = {"ODSGD_NATIVE_LIB": str(tmp_path / "no-such-lib.so")} if fallback else {}
    run_job("eval_layout_job.py", ["--api", api, "--epochs", EPOCHS, "--out", out,
                                   "--compensation", compensation], timeout=90, env=env)
    return [dict(np.load(out / ("rank%d.npz" % rank))) for rank in range(2)]


@pytest.mark.parametrize("compensation", [0.0, 0.1])
@pytest.mark.parametrize("api", ["module", "gluon"])
def test_training_with_evaluation_matches_the_fallback(tmp_path, api, compensation):
    fused = _run(tmp_path, api, fallback=False, compensation=compensation)
    fallback = _run(tmp_path, api, fallback=True, compensation=compensation)
    for rank in range(2):
        assert bool(fused[rank]["native_loaded"]), "the fused run did not load the library"
        assert not bool(fallback[rank]["native_loaded"])
        names = sorted(k for k in fused[rank] if k.startswith(("global_", "epoch")))
        assert len([n for n in names if n.startswith("global_")]) == 6, names
        assert len([n for n in names if n.startswith("epoch")]) == 6 * EPOCHS, names
        for name in names:
            np.testing.assert_allclose(fused[rank][name], fallback[rank][name], rtol=RTOL,
                                       atol=ATOL, err_msg="rank %d %s" % (rank, name))
    # Training did move the weights (the comparison above is not of two untouched copies).
    initial_conv = fused[0]["epoch0_conv0_weight"]
    assert np.abs(fused[0]["global_conv0_weight"] - initial_conv).max() > 1e-3
