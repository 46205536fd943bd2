"""Every MXNet path is exact: Module and Gluon with weight decay, biases, BatchNorm,
lr_mult and wd_mult against dist_sync side by side (warm-up covering every step) and against
the NumPy simulation in the OD phase; W_0 from rank 0 after kv.init; schedules with
begin_num_update; a parameter that starts training late; multipliers changed mid-run."""
import numpy as np
import pytest

from jobs import quadratic_problem as problem
from cluster import run_job
from quadratic_simulation import assert_matches, run, simulate

pytestmark = pytest.mark.timeout(300)


def run_rates(tmp_path, name, **options):
    out = tmp_path / name
    out.mkdir()
    args = ["--out", out]
    for key, value in options.items():
        args += ["--" + key.replace("_", "-"), value]
    # dist_odsgd in warm-up over every step: it must then be dist_sync exactly
    run_job("rates_job.py", args, env={"ODSGD_WARMUP_STEPS": "1000"})
    return [dict(np.load(out / ("rank%d.npz" % r))) for r in range(2)]


def assert_same_runs(a, b):
    assert sorted(a[0]) == sorted(b[0])
    for rank, (x, y) in enumerate(zip(a, b)):
        for name in x:
            np.testing.assert_allclose(y[name], x[name], rtol=1e-6, atol=1e-7,
                                       err_msg="worker %d %s" % (rank, name))


def test_module_rates_equal_dist_sync(tmp_path):
    """Module.fit: wd 0.05, biases (wd_mult 0 by name), BatchNorm, lr_mult 0.3 from
    mx.AttrScope: dist_odsgd in warm-up equals dist_sync at every step on every worker."""
    sync = run_rates(tmp_path, "sync", api="module", kvstore="dist_sync")
    od = run_rates(tmp_path, "od", api="module", kvstore="dist_odsgd")
    assert_same_runs(sync, od)


def test_gluon_rates_equal_dist_sync(tmp_path):
    """gluon.Trainer with Parameter.lr_mult 0.3 and wd_mult 0 on biases and beta. MXNet's
    dist_sync with update_on_kvstore=True drops them on the servers (the optimizer is pickled
    without param_dict); dist_sync with update_on_kvstore=False applies them as written, and
    dist_odsgd (in warm-up) must equal that."""
    sync = run_rates(tmp_path, "sync", api="gluon", kvstore="dist_sync", update_on_kvstore=0)
    od = run_rates(tmp_path, "od", api="gluon", kvstore="dist_odsgd")
    assert_same_runs(sync, od)
    # and the multipliers matter here: without them the run differs
    dropped = run_rates(tmp_path, "dropped", api="gluon", kvstore="dist_sync")
    assert np.abs(dropped[0]["final_fc1_weight"] - sync[0]["final_fc1_weight"]).max() > 1e-3


@pytest.mark.parametrize("api", ["gluon", "module"])
@pytest.mark.parametrize("local_optimizer", ["predict", "sgd"])
def test_od_phase_uses_each_parameters_rates(tmp_path, api, local_optimizer):
    """OD phase with wd > 0, lr_mult 0.3 on the weight and wd_mult 0 on the bias (Gluon sets
    it, Module gives it by name): every worker's local weights equal the simulation in which
    the servers and the local step use each parameter's own rates."""
    options = dict(steps=8, lr=0.05, momentum=0.9, wd=0.05, warmup_steps=2,
                   local_optimizer=local_optimizer, lr_mult_weight=0.3, api=api)
    local = {}
    if local_optimizer == "sgd":
        local = dict(local_lr=0.08, local_momentum=0.5, local_wd=0.02)
        options.update(local)
    if api == "gluon":
        options["wd_mult_bias"] = 0.0
    results = run(tmp_path, **options)
    rescale = 1.0 / problem.BATCH / (2 if api == "module" else 1)
    history, W = simulate(2, 8, 0.05, momentum=0.9, wd=0.05, warmup_steps=2,
                          local_optimizer=local_optimizer, rescale=rescale,
                          lr_mults=(0.3, 1.0), wd_mults=(1.0, 0.0), **local)
    assert_matches(results, history, W)


def test_gluon_lr_mult_changed_mid_run_reaches_the_servers(tmp_path):
    """A Gluon user freezes the weight (lr_mult 0) at step 4: from that step on neither the
    servers nor the local step move it."""
    options = dict(steps=8, lr=0.05, momentum=0.0, wd=0.0, warmup_steps=2,
                   lr_mult_change_step=4, lr_mult_change_to=0.0)
    results = run(tmp_path, **options)
    history, W = simulate(2, 8, 0.05, warmup_steps=2,
                          lr_mults_at=lambda t: (1.0, 1.0) if t < 4 else (0.0, 1.0))
    assert_matches(results, history, W)
    np.testing.assert_array_equal(results[0]["local_weight"][4], results[0]["local_weight"][-1])


def test_init_takes_rank_zeros_values(tmp_path):
    """kv.init with other values on rank 1: W_0 is rank 0's on every worker (docs/spec.md, section 3),
    so the first local step on rank 1 starts from rank 0's weights."""
    results = run(tmp_path, api="store", steps=5, lr=0.05, momentum=0.9, wd=1e-3,
                  warmup_steps=0, rank_init_offset=0.25)
    history, W = simulate(2, 5, 0.05, momentum=0.9, wd=1e-3)
    assert_matches(results, history, W)


def test_schedule_counts_from_begin_num_update(tmp_path):
    """The servers read the schedule at begin_num_update + t + 1; so does the local step."""
    options = dict(steps=8, lr=0.08, momentum=0.5, warmup_steps=1, lr_factor_step=3,
                   begin_num_update=5)
    results = run(tmp_path, **options)

    def lr_at(t):  # FactorScheduler(3, 0.5) at update count 5 + t + 1
        return 0.08 * 0.5 ** ((5 + t) // 3)
    history, W = simulate(2, 8, 0.08, momentum=0.5, warmup_steps=1, lr_at=lr_at)
    assert_matches(results, history, W)
    np.testing.assert_allclose(results[0]["learning_rates"], [lr_at(t) for t in range(8)],
                               rtol=1e-6)


def test_late_parameter_keeps_the_global_step(tmp_path):
    """The bias is frozen (grad_req 'null') for 5 steps, then trains: it enters the OD phase
    at once (warm-up is 3 global steps, not 3 of its own) and at the schedule's global count."""
    options = dict(steps=9, lr=0.08, momentum=0.5, warmup_steps=3, lr_factor_step=2,
                   freeze_bias_steps=5)
    results = run(tmp_path, **options)

    def lr_at(t):
        return 0.08 * 0.5 ** (t // 2)
    history, W = simulate(2, 9, 0.08, momentum=0.5, warmup_steps=3, lr_at=lr_at,
                          trained_from=(0, 5))
    assert_matches(results, history, W)


def test_late_parameter_after_an_epoch_check(tmp_path):
    """As above, with the epoch's step check (equal_steps, whose probe rounds the servers do
    not apply) every 2 steps while the bias is still frozen: the bias's key, new at step 5,
    keeps its first real round."""
    options = dict(steps=8, lr=0.08, momentum=0.5, warmup_steps=3, freeze_bias_steps=5,
                   epoch_every=2)
    results = run(tmp_path, **options)
    history, W = simulate(2, 8, 0.08, momentum=0.5, warmup_steps=3, trained_from=(0, 5))
    assert_matches(results, history, W)


def test_float16_weights_with_multi_precision(tmp_path):
    """float16 weights, multi_precision SGD (the servers keep float32 copies): the fused
    operators take float32 only, so the local step runs as NDArray operations in float16 (the
    documented behaviour). Warm-up equals dist_sync exactly; the OD phase follows the float32
    simulation to float16 precision."""
    common = dict(api="store", steps=6, lr=0.05, momentum=0.9, wd=1e-3, dtype="float16")
    (tmp_path / "sync").mkdir()
    (tmp_path / "warm").mkdir()
    (tmp_path / "od").mkdir()
    sync = run(tmp_path / "sync", kvstore="dist_sync", **common)
    warm = run(tmp_path / "warm", kvstore="dist_odsgd", warmup_steps=6, **common)
    for a, b in zip(sync, warm):
        for name in ("local_weight", "local_bias", "global_weight", "global_bias"):
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)
    od = run(tmp_path / "od", kvstore="dist_odsgd", warmup_steps=2, **common)
    history, W = simulate(2, 6, 0.05, momentum=0.9, wd=1e-3, warmup_steps=2)
    assert_matches(od, history, W, rtol=2e-2, atol=5e-3)   # float16: 11-bit mantissa


ESTIMATES = ("own", "previous", "shrunk")


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_nag_predict_matches_numpy_at_every_step(tmp_path, estimate):
    """Global optimizer NAG (MXNet 1.9.1's nag_mom_update on the servers) with 'predict':
    wd 0.05, lr_mult 0.3 on the weight, wd_mult 0 on the bias, 2 warm-up steps, constant
    compensation, and Trainer.set_learning_rate at step 5. Every worker's local weights and
    the global weights after every step equal the simulation, whose servers run MXNet's NAG
    rule and whose workers keep the estimate of the servers' state that docs/predict.md
    states (from 0 at the first OD step, advanced with lr x wd of the round before), with each
    estimate of the round's gradient sum (ODSGD_PREDICT_ESTIMATE): 'previous' takes the
    previous round's from the third step on, at the rate ratio of the change at step 5."""
    _predict_matches_numpy_at_every_step(tmp_path, "nag", estimate)


@pytest.mark.parametrize("estimate", ESTIMATES)
def test_sgd_predict_matches_numpy_at_every_step(tmp_path, estimate):
    """The same run with the global optimizer SGD (MXNet's sgd_mom_update on the servers):
    'previous' keeps the servers' momentum (the last weight change) per parameter and takes
    the previous round's sum recovered from it."""
    _predict_matches_numpy_at_every_step(tmp_path, "sgd", estimate)


def _predict_matches_numpy_at_every_step(tmp_path, optimizer, estimate):
    from quadratic_simulation import assert_global_steps
    options = dict(steps=9, lr=0.05, momentum=0.9, wd=0.05, warmup_steps=2,
                   local_optimizer="predict", compensation=0.3, lr_mult_weight=0.3,
                   wd_mult_bias=0.0, lr_change_step=5, lr_change_to=0.02)
    results = run(tmp_path, optimizer=optimizer, record_global=1,
                  env={"ODSGD_PREDICT_ESTIMATE": estimate}, **options)
    assert all(str(r["predict_estimate"]) == estimate for r in results)   # reached the store
    global_history = []
    history, W = simulate(2, 9, 0.05, momentum=0.9, wd=0.05, warmup_steps=2,
                          local_optimizer="predict", compensation=0.3, lr_mults=(0.3, 1.0),
                          wd_mults=(1.0, 0.0), lr_at=lambda t: 0.05 if t < 5 else 0.02,
                          optimizer=optimizer, global_history=global_history,
                          estimate=estimate)
    assert_matches(results, history, W)
    assert_global_steps(results, global_history)


@pytest.mark.parametrize("optimizer", ["sgd", "nag"])
def test_parameters_in_parts_match_numpy_across_schedule_boundaries(tmp_path, optimizer):
    """Every array cut into server keys of 2 elements (ODSGD_PART_ELEMENTS, no fusion), whose
    rounds the servers apply in whatever order they arrive: the local and global weights
    after every step equal the simulation, with wd 0.05, lr_mult 0.3 on the weight, wd_mult 0
    on the bias and a FactorScheduler that halves the rate every 2 steps, its first change on
    the first OD step. There the predict reads the rate of the warm-up's last round (lr x wd
    of the round before) after the new one: asked in that order, MXNet's FactorScheduler
    answers the decayed rate for both (odsgd/common/rates.py, ScheduleAtAnyCount)."""
    from quadratic_simulation import assert_global_steps
    assert problem.OUT_UNITS > 2     # the bias is cut too
    options = dict(steps=9, lr=0.08, momentum=0.9, wd=0.05, warmup_steps=2, lr_factor_step=2,
                   local_optimizer="predict", lr_mult_weight=0.3, wd_mult_bias=0.0)
    results = run(tmp_path, optimizer=optimizer, record_global=1,
                  env={"ODSGD_PART_ELEMENTS": "2", "ODSGD_FUSION_ELEMENTS": "0"}, **options)
    global_history = []
    history, W = simulate(2, 9, 0.08, momentum=0.9, wd=0.05, warmup_steps=2,
                          local_optimizer="predict", lr_mults=(0.3, 1.0), wd_mults=(1.0, 0.0),
                          lr_at=lambda t: 0.08 * 0.5 ** (t // 2), optimizer=optimizer,
                          global_history=global_history)
    assert_matches(results, history, W)
    assert_global_steps(results, global_history)


def test_adam_predict_matches_numpy_at_every_step(tmp_path):
    """Global optimizer Adam with 'predict' (Adam's own step on W_t with N g, the worker's
    estimate of the servers' Adam state advanced by it): wd 0.05, lr_mult 0.3 on the weight,
    wd_mult 0 on the bias, 2 warm-up steps and Trainer.set_learning_rate at step 5. Every
    worker's local weights and the global weights after every step equal the simulation, whose
    servers run MXNet's Adam with its bias correction at the update count."""
    from quadratic_simulation import assert_global_steps
    options = dict(steps=8, lr=0.05, wd=0.05, warmup_steps=2, lr_mult_weight=0.3,
                   wd_mult_bias=0.0, lr_change_step=5, lr_change_to=0.02)
    results = run(tmp_path, optimizer="adam", record_global=1, **options)
    global_history = []
    history, W = simulate(2, 8, 0.05, wd=0.05, warmup_steps=2, lr_mults=(0.3, 1.0),
                          wd_mults=(1.0, 0.0), lr_at=lambda t: 0.05 if t < 5 else 0.02,
                          optimizer="adam", global_history=global_history)
    assert_matches(results, history, W)
    assert_global_steps(results, global_history)
