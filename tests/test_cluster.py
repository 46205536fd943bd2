"""Multi-process tests on loopback: real scheduler, servers and workers through odsgd.launch.

Each OD-SGD run is compared with an independent NumPy simulation of docs/spec.md, section 4 on the
quadratic problem of jobs/quadratic_problem.py, or with a dist_sync run of the same job."""
import numpy as np
import pytest

from jobs import quadratic_problem as problem
from quadratic_simulation import assert_matches, run, simulate

pytestmark = pytest.mark.timeout(300)


def test_warmup_equals_dist_sync(tmp_path):
    """(a) With warmup_steps >= steps, dist_odsgd is dist_sync: same weights at every step."""
    common = dict(steps=6, lr=0.05, momentum=0.9, wd=1e-3)
    (tmp_path / "sync").mkdir()
    (tmp_path / "od").mkdir()
    sync = run(tmp_path / "sync", kvstore="dist_sync", **common)
    od = run(tmp_path / "od", kvstore="dist_odsgd", warmup_steps=6, **common)
    for a, b in zip(sync, od):
        for name in ("local_weight", "local_bias", "global_weight", "global_bias"):
            np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7, err_msg=name)
    # and dist_sync itself agrees with the simulation's warm-up rule
    history, W = simulate(2, 6, 0.05, momentum=0.9, wd=1e-3, warmup_steps=6)
    assert_matches(sync, history, W)


@pytest.mark.parametrize("mode", ["constant", "adaptive"])
def test_local_sgd_matches_numpy(tmp_path, mode):
    """(b) OD phase with local SGD (momentum, wd, compensation) after 3 warm-up steps."""
    options = dict(steps=10, lr=0.05, momentum=0.9, wd=1e-3, warmup_steps=3,
                   local_optimizer="sgd", local_lr=0.08, local_momentum=0.5, local_wd=1e-3,
                   compensation=0.5, compensation_mode=mode)
    results = run(tmp_path, **options)
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"},
                          steps=10)
    assert_matches(results, history, W)


def test_predict_matches_numpy_three_workers_two_servers(tmp_path):
    """(b) 'predict' with compensation and clipping; 3 workers, 2 servers, 2 devices each."""
    options = dict(steps=8, lr=0.05, momentum=0.9, wd=1e-3, warmup_steps=2,
                   local_optimizer="predict", compensation=0.3, clip=0.5)
    results = run(tmp_path, workers=3, servers=2, devices=2, **options)
    history, W = simulate(3, **{k: v for k, v in options.items() if k != "steps"}, steps=8)
    assert_matches(results, history, W)
    assert str(results[0]["type"]) == "dist_odsgd"


def test_module_fit_scales_like_dist_sync(tmp_path):
    """(c) Module.fit: rescale_grad = 1 / (batch * workers) as for dist_sync, OD phase."""
    options = dict(steps=8, lr=0.1, momentum=0.9, warmup_steps=2, local_optimizer="predict")
    results = run(tmp_path, api="module", **options)
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"}, steps=8,
                          rescale=1.0 / (problem.BATCH * 2))
    assert_matches(results, history, W)


def test_set_learning_rate_reaches_servers(tmp_path):
    """(d) trainer.set_learning_rate at step 4 changes the servers' rate from update 4 on."""
    options = dict(steps=9, lr=0.05, momentum=0.9, warmup_steps=2, local_optimizer="predict")
    results = run(tmp_path, lr_change_step=4, lr_change_to=0.01, **options)
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"}, steps=9,
                          lr_at=lambda t: 0.05 if t < 4 else 0.01)
    assert_matches(results, history, W)


def test_gluoncv_schedule_reaches_the_servers(tmp_path):
    """A GluonCV LRSequential (linear warm-up, then cosine), which the servers cannot unpickle,
    is translated on the worker: the servers and the local steps use GluonCV's own rate at
    every update count (computed here from a GluonCV object of our own)."""
    from jobs.quadratic_job import gluoncv_schedule
    options = dict(steps=10, lr=0.08, momentum=0.9, wd=1e-3, warmup_steps=2,
                   local_optimizer="predict")
    results = run(tmp_path, gluoncv_warmup_steps=3, **options)
    reference = gluoncv_schedule(0.08, 3, 10)
    rates = [reference(t + 1) for t in range(10)]   # MXNet's 1-based update count
    assert len(set(rates)) > 5   # warm-up and decay: a wrong count would show
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"}, steps=10,
                          lr_at=lambda t: rates[t])
    assert_matches(results, history, W)


def test_slow_worker_never_has_a_round_overtaken(tmp_path):
    """Round integrity of the pipelined exchange: worker 1 sleeps before every other step, so
    worker 0's next push is ready long before worker 1's push of the round the servers are
    collecting (they merge pushes by count). Every step of both workers, with momentum, wd,
    a rate that changes every step and a server key per parameter, must still
    be the NumPy simulation's; a push that overtook its round would mix two steps' gradients
    in one update. The store's own API (one pushpull of both keys a step): the next gradient
    needs only the last local step, so nothing but the exchange holds worker 0 back."""
    from jobs.quadratic_job import gluoncv_schedule
    options = dict(steps=14, lr=0.08, momentum=0.9, wd=1e-3, local_optimizer="predict")
    results = run(tmp_path, api="store", env={"ODSGD_FUSION_ELEMENTS": "0"},
                  gluoncv_warmup_steps=3, slow_rank=1, slow_seconds=0.4, **options)
    reference = gluoncv_schedule(0.08, 3, 14)
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"}, steps=14,
                          lr_at=lambda t: reference(t + 1))
    assert_matches(results, history, W)


def test_lr_schedule_counts_global_steps(tmp_path):
    """A FactorScheduler halves the rate every 3 global steps on the servers, and
    trainer.learning_rate on the workers follows it."""
    options = dict(steps=9, lr=0.08, momentum=0.5, warmup_steps=2, local_optimizer="predict")
    results = run(tmp_path, lr_factor_step=3, **options)

    def lr_at(t):  # MXNet's FactorScheduler at update count t + 1
        return 0.08 * 0.5 ** (t // 3)
    history, W = simulate(2, **{k: v for k, v in options.items() if k != "steps"}, steps=9,
                          lr_at=lr_at)
    assert_matches(results, history, W)
    np.testing.assert_allclose(results[0]["learning_rates"], [lr_at(t) for t in range(9)],
                               rtol=1e-6)


def test_gluoncv_nag_trainer_by_name(tmp_path):
    """GluonCV's use: gluon.Trainer(params, 'nag', {'learning_rate', 'momentum': 0.9, 'wd'},
    kvstore='dist_odsgd') with the store's defaults ('predict', no warm-up): runs end to end
    on 2 workers and follows the NumPy simulation of NAG 'predict' at every step, the global
    weights after every step included."""
    from quadratic_simulation import assert_global_steps
    results = run(tmp_path, optimizer="nag", store_by_name=1, record_global=1, steps=6,
                  lr=0.1, momentum=0.9, wd=1e-4)
    global_history = []
    history, W = simulate(2, 6, 0.1, momentum=0.9, wd=1e-4, optimizer="nag",
                          global_history=global_history)
    assert_matches(results, history, W)
    assert_global_steps(results, global_history)
    assert str(results[0]["type"]) == "dist_odsgd"
