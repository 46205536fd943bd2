"""LocalUpdater (the OD-phase step of docs/spec.md, section 4) against the NumPy reference, through
the fused operator and through the NDArray fallback, for random shapes and every option."""
import itertools
import zlib

import mxnet as mx
import numpy as np
import pytest

import od_reference as ref
from odsgd.worker import local_update
from odsgd import native
from odsgd.worker.config import ODSGDConfig
from odsgd.worker.local_update import LocalUpdater

SHAPES = [(1,), (7,), (33, 5), (4, 3, 2), (1031,)]
RTOL, ATOL = 1e-5, 1e-6


def seed_of(*case):
    """A random seed of a test case that is the same in every run (hash() of a str is not)."""
    return zlib.crc32(repr(case).encode())


@pytest.fixture(params=["fused", "fallback"])
def path(request, monkeypatch):
    if request.param == "fused":
        assert native.load(), "the native library must be built (make native)"
    else:
        monkeypatch.setattr(native, "accepts", lambda arrays: False, raising=False)
    return request.param


# The tests of 'predict' below hold the estimate N * gc of the round's gradient sum unless they
# name another (ODSGD_PREDICT_ESTIMATE; the estimates are tested together further down).
OWN = {"ODSGD_PREDICT_ESTIMATE": "own"}


def make_updater(num_workers=3, lr=0.1, momentum=0.9, wd=1e-3, rescale=0.25, **store):
    optimizer = mx.optimizer.SGD(learning_rate=lr, momentum=momentum, wd=wd,
                                 rescale_grad=rescale)
    return LocalUpdater(ODSGDConfig(environ=OWN, **store), optimizer, num_workers), optimizer


def arrays(shape, rng):
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(4)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["constant", "adaptive"])
@pytest.mark.parametrize("clip", [None, 0.3])
def test_local_sgd(path, shape, mode, clip):
    rng = np.random.RandomState(seed_of(shape, mode, clip))
    params = {"learning_rate": 0.07, "momentum": 0.6, "wd": 2e-3}
    if clip:
        params["clip_gradient"] = clip
    updater, opt = make_updater(local_optimizer="sgd", local_optimizer_params=params,
                                compensation=0.8, compensation_mode=mode)
    w, W, W_prev, grad = arrays(shape, rng)
    m, v = np.zeros_like(w), np.zeros_like(w)
    weight = mx.nd.array(w)
    for step in range(4):           # states carry over between calls
        grad = rng.uniform(-2, 2, shape).astype(np.float32)
        W = W + rng.uniform(-0.1, 0.1, shape).astype(np.float32)
        expected = ref.local_sgd_step(w, W, grad, m, v, rescale_grad=0.25, lr=0.07,
                                      momentum=0.6, wd=2e-3, lam=0.8, mode=mode,
                                      clip_gradient=clip)
        updater.update("k", step, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W_prev))
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=RTOL, atol=ATOL)
        w = expected


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lam,mode", [(0.0, "constant"), (0.5, "constant"), (0.5, "adaptive")])
def test_predict(path, shape, lam, mode):
    rng = np.random.RandomState(seed_of(shape, lam, mode))
    updater, opt = make_updater(local_optimizer="predict", compensation=lam,
                                compensation_mode=mode)
    w, W, W_prev, _ = arrays(shape, rng)
    v = np.zeros_like(w)
    weight = mx.nd.array(w)
    for step in range(3):
        grad = rng.uniform(-2, 2, shape).astype(np.float32)
        expected = ref.predict_step(w, W, W_prev, grad, v, rescale_grad=0.25, lr=0.1,
                                    momentum=0.9, wd=1e-3, lam=lam, num_workers=3, mode=mode)
        updater.update(0, step, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W_prev))
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=RTOL, atol=ATOL)
        w, W_prev, W = expected, W, W + rng.uniform(-0.1, 0.1, shape).astype(np.float32)


def test_predict_follows_the_global_schedule(path):
    """'predict' uses the servers' rate for update t: lr_scheduler(t + 1)."""
    updater, opt = make_updater(local_optimizer="predict")
    opt.lr_scheduler = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.1)
    rng = np.random.RandomState(3)
    w, W, W_prev, grad = arrays((5,), rng)
    weight = mx.nd.array(w)
    updater.update(0, 4, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W_prev))
    expected = ref.predict_step(w, W, W_prev, grad, np.zeros_like(w), rescale_grad=0.25,
                                lr=0.1 * 0.5 ** 2, momentum=0.9, wd=1e-3, lam=0.0,
                                num_workers=3)
    np.testing.assert_allclose(weight.asnumpy(), expected, rtol=RTOL, atol=ATOL)


def test_derived_local_learning_rate():
    """Unset, the local rate of 'sgd' is lr_g * N / (1 - mu_g) * (1 - mu_l)."""
    updater, _ = make_updater(num_workers=4, lr=0.05, momentum=0.9, local_optimizer="sgd",
                              local_optimizer_params={"momentum": 0.5})
    assert updater.local_learning_rate(0) == pytest.approx(0.05 * 4 / 0.1 * 0.5)


def test_mx_optimizer_as_local_optimizer():
    """Any other mx.optimizer is applied to a copy of W_t; here Adam, against NumPy."""
    updater, _ = make_updater(local_optimizer="adam",
                              local_optimizer_params={"learning_rate": 0.01})
    rng = np.random.RandomState(5)
    w, W, W_prev, _ = arrays((6, 4), rng)
    m, v = np.zeros_like(w), np.zeros_like(w)
    weight = mx.nd.array(w)
    for step in range(3):
        grad = rng.uniform(-1, 1, w.shape).astype(np.float32)
        updater.update(1, step, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W_prev))
        # MXNet's Adam with bias correction folded into the rate, on g = r * grad
        g = 0.25 * grad
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        lr = 0.01 * np.sqrt(1 - 0.999 ** (step + 1)) / (1 - 0.9 ** (step + 1))
        expected = W - lr * m / (np.sqrt(v) + 1e-8)
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=1e-5, atol=1e-6)


def test_fallback_and_fused_agree():
    """Both paths on the same inputs agree to float32 rounding (not bit for bit: the fused
    kernel evaluates the same formula in another order)."""
    assert native.load()
    rng = np.random.RandomState(11)
    shape = (100003,)
    w, W, W_prev, grad = arrays(shape, rng)
    args = dict(rescale_grad=0.5, clip_gradient=0.4, lr=0.03, momentum=0.7, wd=1e-4, lam=0.9,
                adaptive=True, beta=0.95, eps=1e-7)
    results = []
    for fn in (native.local_update_, local_update.ndarray_local_update_):
        weight, mom, var = mx.nd.array(w), mx.nd.zeros(shape), mx.nd.zeros(shape)
        fn(weight, mx.nd.array(grad), mx.nd.array(W), mom, var, **args)
        results.append((weight.asnumpy(), mom.asnumpy(), var.asnumpy()))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_local_schedule_starts_from_the_local_learning_rate():
    """local 'sgd' with learning_rate and lr_scheduler: the schedule's base is learning_rate,
    as MXNet's optimizers make it (FactorScheduler(2, 0.5) at count t + 1: 0.5 ** (t // 2)),
    and the caller's scheduler is not changed."""
    schedule = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5)   # base_lr 0.01
    updater, _ = make_updater(local_optimizer="sgd",
                              local_optimizer_params={"learning_rate": 0.2, "momentum": 0.0,
                                                      "lr_scheduler": schedule})
    assert [updater.local_learning_rate(t) for t in range(6)] == pytest.approx(
        [0.2 * 0.5 ** (t // 2) for t in range(6)])
    assert schedule.base_lr == 0.01


def nag_updater(**local_params):
    optimizer = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=0.5,
                                 lr_scheduler=mx.lr_scheduler.FactorScheduler(2, 0.5,
                                                                              base_lr=0.1))
    config = ODSGDConfig(environ={}, local_optimizer="nag", local_optimizer_params=local_params)
    return LocalUpdater(config, optimizer, 2), optimizer


@pytest.mark.parametrize("given_momentum", [None, 0.5])
def test_mx_optimizer_follows_the_global_schedule(given_momentum):
    """Another mx.optimizer as local optimizer ('nag' here): its rate follows the global
    schedule each step, derived with the momentum it is actually given (NAG's own default 0
    when none is given, not the global 0.9). With momentum 0, one NAG step from W is
    W - lr (g + 0) exactly; with momentum its first step from a zero state is the same."""
    params = {} if given_momentum is None else {"momentum": given_momentum}
    updater, optimizer = nag_updater(**params)
    mu_l = given_momentum or 0.0
    rng = np.random.RandomState(8)
    for step in (0, 3, 6):
        W = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        grad = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        weight = mx.nd.zeros((4, 3))
        key = "k%d" % step        # a fresh state, so the first NAG step of each key
        updater.update(key, step, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W))
        lr = 0.1 * 0.5 ** (step // 2) * 2 / (1 - 0.9) * (1 - mu_l)
        g = np.float32(0.5) * grad
        expected = W - np.float32(lr) * (g + np.float32(mu_l) * g) if mu_l else \
            W - np.float32(lr) * g
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=1e-5, atol=1e-6)


def test_mx_optimizer_follows_set_learning_rate():
    """Without a schedule, a rate set on the global optimizer (Trainer.set_learning_rate)
    changes the next local step's rate."""
    optimizer = mx.optimizer.SGD(learning_rate=0.1, momentum=0.0, rescale_grad=1.0)
    updater = LocalUpdater(ODSGDConfig(environ={}, local_optimizer="nag"), optimizer, 2)
    W, grad = np.ones((3,), np.float32), np.full((3,), 0.5, np.float32)
    for step, lr in ((0, 0.1), (1, 0.02)):
        optimizer.set_learning_rate(lr)
        weight = mx.nd.zeros((3,))
        updater.update("k%d" % step, step, weight, mx.nd.array(grad), mx.nd.array(W),
                       mx.nd.array(W))
        np.testing.assert_allclose(weight.asnumpy(), W - np.float32(lr * 2) * grad, rtol=1e-6)


def test_group_update_uses_each_parameters_rates(path):
    """update_group over several arrays: each uses its own lr * lr_mult and wd * wd_mult."""
    from odsgd.worker.key_groups import KeyGroup
    updater, _ = make_updater(local_optimizer="predict")
    rng = np.random.RandomState(21)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    multipliers = [(0.3, 1.0), (1.0, 0.0), (0.0, 2.0)]
    w = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    W = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    Wp = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    g = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    weights = [mx.nd.array(a) for a in w]
    group = KeyGroup(7, ["a", "b", "c"], [0, 1, 2], weights)
    for view, value in zip(group.views(group.current), W):
        view[:] = value
    for view, value in zip(group.views(group.previous), Wp):
        view[:] = value
    updater.update_group(group, 0, weights, [mx.nd.array(a) for a in g], multipliers)
    for i, (lr_mult, wd_mult) in enumerate(multipliers):
        expected = ref.predict_step(w[i], W[i], Wp[i], g[i], np.zeros_like(w[i]),
                                    rescale_grad=0.25, lr=0.1 * lr_mult, momentum=0.9,
                                    wd=1e-3 * wd_mult, lam=0.0, num_workers=3)
        np.testing.assert_allclose(weights[i].asnumpy(), expected, rtol=RTOL, atol=ATOL)


# -- 'predict' for the global optimizer NAG (docs/predict.md) ------------------------------

def nag_global(lr=0.1, momentum=0.9, wd=1e-3, rescale=0.25, **kwargs):
    return mx.optimizer.NAG(learning_rate=lr, momentum=momentum, wd=wd, rescale_grad=rescale,
                            **kwargs)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("lam,mode,clip", [(0.0, "constant", None), (0.5, "constant", 0.3),
                                           (0.5, "adaptive", None)])
def test_nag_predict(path, shape, lam, mode, clip):
    """The global optimizer NAG: 'predict' keeps the estimate of the servers' state and
    applies NAG's update with N * gc, step after step (the estimate carried over)."""
    rng = np.random.RandomState(seed_of("nag", shape, lam, mode, clip))
    params = {"clip_gradient": clip} if clip else None
    updater = LocalUpdater(ODSGDConfig(environ=OWN, local_optimizer="predict", compensation=lam,
                                       compensation_mode=mode, local_optimizer_params=params),
                           nag_global(), 3)
    assert updater.nag_predict
    _check_nag_steps(updater, shape, rng, 4, lam, mode, clip)


def _check_nag_steps(updater, shape, rng, steps, lam, mode, clip=None):
    """`steps` NAG 'predict' steps of `updater` (global NAG of nag_global(), 3 workers)
    against the reference, the weights and the estimate of the servers' state after each."""
    w, W, W_prev, _ = arrays(shape, rng)
    est, v = np.zeros_like(w), np.zeros_like(w)
    weight = mx.nd.array(w)
    for step in range(steps):
        grad = rng.uniform(-2, 2, shape).astype(np.float32)
        expected = ref.nag_predict_step(w, W, W_prev, grad, est, v, rescale_grad=0.25, lr=0.1,
                                        momentum=0.9, wd=1e-3, prev_decay=0.1 * 1e-3, lam=lam,
                                        num_workers=3, mode=mode, clip_gradient=clip)
        updater.update(0, step, weight, mx.nd.array(grad), mx.nd.array(W), mx.nd.array(W_prev))
        np.testing.assert_allclose(weight.asnumpy(), expected, rtol=RTOL, atol=ATOL,
                                   err_msg="step %d" % step)
        group = updater._groups[0]
        np.testing.assert_allclose(group.mom.asnumpy().reshape(shape), est, rtol=RTOL,
                                   atol=ATOL, err_msg="estimate, step %d" % step)
        w, W_prev, W = expected, W, W + rng.uniform(-0.1, 0.1, shape).astype(np.float32)


@pytest.mark.parametrize("given", [{}, {"compensation_mode": "adaptive"}])
def test_nag_predict_compensates_by_default(path, given):
    """Nothing given with the global optimizer NAG, or only its measured mode: the step is
    docs/spec.md section 4's with the measured default, adaptive lam = 4 (docs/convergence.md, "Delay
    compensation with NAG")."""
    rng = np.random.RandomState(seed_of("nag default", sorted(given.items())))
    updater = LocalUpdater(ODSGDConfig(environ=OWN, **given), nag_global(), 3)
    _check_nag_steps(updater, (33, 5), rng, 3, 4.0, "adaptive")


@pytest.mark.parametrize("optimizer,local,store,expected", [
    ("sgd", "predict", {}, (0.0, "constant")),
    ("nag", "sgd", {}, (0.0, "constant")),                 # the authors' local SGD: lam 0
    ("nag", "predict", {"compensation": 0.0}, (0.0, "constant")),
    ("nag", "predict", {"environ": {"ODSGD_COMPENSATION": "0"}}, (0.0, "constant")),
    ("nag", "predict", {"compensation": 1.5}, (1.5, "constant")),
    # the default lam belongs to the mode it was measured in: another mode alone turns it off
    ("nag", "predict", {"compensation_mode": "constant"}, (0.0, "constant")),
    ("nag", "predict", {"environ": {"ODSGD_COMPENSATION_MODE": "constant"}}, (0.0, "constant")),
    ("sgd", "predict", {"compensation": 2.0, "compensation_mode": "adaptive"},
     (2.0, "adaptive"))])
def test_compensation_default_is_per_global_optimizer(optimizer, local, store, expected):
    """The NAG default applies to 'predict' with NAG only, and any lam given (0 too, as an
    argument or ODSGD_COMPENSATION) wins; without lam there is no local copy to keep."""
    global_optimizer = nag_global() if optimizer == "nag" else \
        mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.25)
    store = dict(store)
    environ = dict(OWN, **store.pop("environ", {}))
    updater = LocalUpdater(ODSGDConfig(environ=environ, local_optimizer=local, **store),
                           global_optimizer, 2)
    assert (updater.rule.lam, updater.rule.compensation_mode) == expected
    assert ("local" in updater.rule.buffers) == bool(expected[0])


def _nag_group(rng, shapes):
    from odsgd.worker.key_groups import KeyGroup
    weights = [mx.nd.array(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
    return KeyGroup(9, ["a", "b", "c"][:len(shapes)], list(range(len(shapes))), weights), weights


def _set_global(group, W, W_prev):
    for view, value in zip(group.views(group.current), W):
        view[:] = value
    for view, value in zip(group.views(group.previous), W_prev):
        view[:] = value


def test_nag_predict_uses_the_rates_of_the_round_before(path):
    """update_group with per-parameter multipliers: this step's lr * lr_mult and wd * wd_mult
    for the prediction, and lr * wd of the round that produced W_t for the estimate: the
    schedule's rate of step - 1 at the first call, then the rates the worker used at its
    previous step, so that a Trainer.set_learning_rate between two steps is seen one round
    late, as by the servers."""
    rng = np.random.RandomState(31)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    multipliers = [(0.3, 1.0), (1.0, 0.0), (0.5, 2.0)]
    optimizer = nag_global(lr=0.1, wd=0.01,
                           lr_scheduler=mx.lr_scheduler.FactorScheduler(2, 0.5, base_lr=0.1))
    # 'predict' by default; lam 0 here, the rates are the point (its default: below)
    updater = LocalUpdater(ODSGDConfig(environ=OWN, compensation=0.0), optimizer, 2)
    group, weights = _nag_group(rng, shapes)
    w = [a.asnumpy() for a in weights]
    est = [np.zeros(s, np.float32) for s in shapes]
    W = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    W_prev = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]

    def lr_at(step):   # FactorScheduler(2, 0.5) at count step + 1, until the schedule is dropped
        return 0.1 * 0.5 ** (step // 2)
    prev_lr = lr_at(4)          # first call at step 5: the schedule's rate of step 4
    for step in (5, 6, 7):
        if step == 7:           # Trainer.set_learning_rate without a schedule
            optimizer.lr_scheduler = None
            optimizer.set_learning_rate(0.02)
        lr = 0.02 if step == 7 else lr_at(step)
        _set_global(group, W, W_prev)
        g = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        updater.update_group(group, step, weights, [mx.nd.array(a) for a in g], multipliers)
        for i, (lr_mult, wd_mult) in enumerate(multipliers):
            w[i] = ref.nag_predict_step(w[i], W[i], W_prev[i], g[i], est[i], np.zeros_like(w[i]),
                                        rescale_grad=0.25, lr=lr * lr_mult, momentum=0.9,
                                        wd=0.01 * wd_mult,
                                        prev_decay=prev_lr * lr_mult * 0.01 * wd_mult,
                                        lam=0.0, num_workers=2)
            np.testing.assert_allclose(weights[i].asnumpy(), w[i], rtol=RTOL, atol=ATOL,
                                       err_msg="step %d, array %d" % (step, i))
        np.testing.assert_allclose(group.mom.asnumpy(),
                                   np.concatenate([e.ravel() for e in est]), rtol=RTOL,
                                   atol=ATOL)
        prev_lr = lr
        W_prev, W = W, [a + rng.uniform(-0.1, 0.1, a.shape).astype(np.float32) for a in W]


def test_nag_predict_estimate_survives_a_checkpoint(path):
    """get_states / set_states carry the estimate: a fresh updater loaded from the states
    continues exactly as the one that saved them."""
    rng = np.random.RandomState(41)
    shapes = [(6,), (2, 3)]
    updaters = [LocalUpdater(ODSGDConfig(environ={}), nag_global(), 2) for _ in range(2)]
    group, weights = _nag_group(rng, shapes)
    multipliers = [(1.0, 1.0)] * 2
    for step in range(3):
        _set_global(group, [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes],
                    [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes])
        updaters[0].update_group(group, step, weights,
                                 [mx.nd.array(rng.uniform(-1, 1, s)) for s in shapes],
                                 multipliers)
    saved = updaters[0].get_states([group])
    assert np.abs(np.concatenate([saved["states"][k][0].ravel() for k in ("a", "b")])).max() > 0
    other, other_weights = _nag_group(np.random.RandomState(0), shapes)
    for a, b in zip(other_weights, weights):
        b.copyto(a)
    group.current.copyto(other.current)
    group.previous.copyto(other.previous)
    updaters[1].set_states(saved, [other])
    np.testing.assert_array_equal(other.mom.asnumpy(), group.mom.asnumpy())
    grads = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    for updater, g_, ws in ((updaters[0], group, weights), (updaters[1], other, other_weights)):
        updater.update_group(g_, 3, ws, [mx.nd.array(a) for a in grads], multipliers)
    for a, b in zip(weights, other_weights):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    np.testing.assert_array_equal(other.mom.asnumpy(), group.mom.asnumpy())


def test_predict_keeps_a_state_for_nag_and_for_the_previous_estimate():
    """NAG needs the estimate of its state whatever the estimate of the sum; the SGD predict
    keeps the servers' momentum only for the 'previous' estimate, which recovers the previous
    round's sum from it."""
    from odsgd.worker.key_groups import KeyGroup
    for optimizer, estimate, state in ((mx.optimizer.SGD(momentum=0.9), "own", False),
                                       (mx.optimizer.SGD(momentum=0.9), "shrunk", False),
                                       (mx.optimizer.SGD(momentum=0.9), "previous", True),
                                       (nag_global(), "own", True),
                                       (nag_global(), "previous", True)):
        group = KeyGroup(3, ["a"], [0], [mx.nd.zeros((4,))])
        config = ODSGDConfig(environ={"ODSGD_PREDICT_ESTIMATE": estimate})
        LocalUpdater(config, optimizer, 2).prepare(group)
        assert (group.mom is not None) == state, (type(optimizer).__name__, estimate)
        assert group.mom is None or group.mom.shape == (4,)


# -- the estimate of the round's gradient sum (docs/predict.md) -----------------------------

def test_predict_estimate_setting():
    """ODSGD_PREDICT_ESTIMATE picks the estimate (any case); another value is a ValueError
    naming the variable and the choices; unset, the documented default."""
    from odsgd.common.config import DEFAULTS, PREDICT_ESTIMATES
    assert ODSGDConfig(environ={}).predict_estimate == DEFAULTS["predict_estimate"]
    assert DEFAULTS["predict_estimate"] in PREDICT_ESTIMATES
    for name in PREDICT_ESTIMATES:
        config = ODSGDConfig(environ={"ODSGD_PREDICT_ESTIMATE": name.upper()})
        assert config.predict_estimate == name and config.as_dict()["predict_estimate"] == name
    with pytest.raises(ValueError, match="ODSGD_PREDICT_ESTIMATE must be one of own, previous, "
                                         "shrunk, got 'mean'"):
        ODSGDConfig(environ={"ODSGD_PREDICT_ESTIMATE": "mean"})


def expected_scales(estimate, workers, momentum, lr, previous_lr):
    """own_scale / prev_scale as docs/predict.md states them (previous_lr None: the previous
    round is not known to the worker)."""
    if estimate == "own":
        return dict(own_scale=workers)
    if estimate == "shrunk":
        return dict(own_scale=workers / (1.0 + momentum))
    if not previous_lr:
        return dict(own_scale=workers, prev_scale=0.0)
    return dict(own_scale=1.0, prev_scale=(workers - 1) / workers * lr / previous_lr)


ESTIMATE_CASES = list(itertools.product(["sgd", "nag"], ["own", "previous", "shrunk"]))


@pytest.mark.parametrize("optimizer,estimate", ESTIMATE_CASES)
def test_predict_estimates(path, optimizer, estimate):
    """update_group over three parameters (one with lr_mult 0 from step 3 on, so that at step
    6 its previous round's rate is 0) at steps 0-3 and, after a step the worker does not take,
    5-6, with Trainer.set_learning_rate at step 2: every step's weights and state equal the
    reference with the scales of docs/predict.md. 'previous' knows the round before at steps
    1-3 and 6 (not at 0 and 5: no local step before them), at the ratio of the rates it
    used."""
    rng = np.random.RandomState(seed_of("estimates", optimizer, estimate))
    shapes = [(3, 4), (5,), (2, 2, 2)]
    global_optimizer = nag_global(lr=0.1, wd=0.01) if optimizer == "nag" else \
        mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.25)
    # lam 0 with NAG too: the estimates are the point here (NAG's default lam: above)
    updater = LocalUpdater(ODSGDConfig(environ={"ODSGD_PREDICT_ESTIMATE": estimate},
                                       compensation=0.0), global_optimizer, 4)
    group, weights = _nag_group(rng, shapes)
    w = [a.asnumpy() for a in weights]
    state = [np.zeros(s, np.float32) for s in shapes]
    W = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    W_prev = [a.copy() for a in W]                       # step 0: W_{-1} = W_0
    last = {}                                            # array -> (step, lr) of its last step
    for step in (0, 1, 2, 3, 5, 6):
        if step == 2:
            global_optimizer.set_learning_rate(0.04)
        multipliers = [(0.3, 1.0), (1.0, 0.0), (0.0 if step >= 3 else 0.5, 2.0)]
        _set_global(group, W, W_prev)
        g = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        updater.update_group(group, step, weights, [mx.nd.array(a) for a in g], multipliers)
        for i, (lr_mult, wd_mult) in enumerate(multipliers):
            lr = global_optimizer.learning_rate * lr_mult
            before = last.get(i)
            known = before is not None and before[0] == step - 1
            # unknown: the rate of step - 1 by the schedule (here the rate set) and today's
            # multipliers, for lr x wd of the estimate's update
            prev_lr = before[1] if known else lr
            args = dict(rescale_grad=0.25, lr=lr, momentum=0.9, wd=0.01 * wd_mult, lam=0.0,
                        num_workers=4, prev_decay=prev_lr * 0.01 * wd_mult,
                        **expected_scales(estimate, 4, 0.9, lr, prev_lr if known else None))
            if optimizer == "nag":
                w[i] = ref.nag_predict_step(w[i], W[i], W_prev[i], g[i], state[i],
                                            np.zeros_like(w[i]), **args)
            elif estimate == "previous":
                w[i] = ref.predict_step(w[i], W[i], W_prev[i], g[i], np.zeros_like(w[i]),
                                        est=state[i], **args)
            else:
                args.pop("prev_decay")
                w[i] = ref.predict_step(w[i], W[i], W_prev[i], g[i], np.zeros_like(w[i]),
                                        **args)
            np.testing.assert_allclose(weights[i].asnumpy(), w[i], rtol=RTOL, atol=ATOL,
                                       err_msg="step %d, array %d" % (step, i))
            last[i] = (step, lr)
        if group.mom is not None:
            np.testing.assert_allclose(group.mom.asnumpy(),
                                       np.concatenate([e.ravel() for e in state]), rtol=RTOL,
                                       atol=ATOL, err_msg="state, step %d" % step)
        W_prev, W = W, [a + rng.uniform(-0.1, 0.1, a.shape).astype(np.float32) for a in W]


def test_previous_estimate_survives_a_checkpoint(path):
    """The SGD predict with the 'previous' estimate: get_states / set_states carry the copy of
    the servers' momentum and the rates of the last local step, so a fresh updater loaded
    from them continues exactly as the one that saved them (which knows the round before)."""
    rng = np.random.RandomState(43)
    shapes = [(6,), (2, 3)]
    environ = {"ODSGD_PREDICT_ESTIMATE": "previous"}
    updaters = [LocalUpdater(ODSGDConfig(environ=environ), mx.optimizer.SGD(momentum=0.9,
                                                                            wd=0.01), 2)
                for _ in range(2)]
    group, weights = _nag_group(rng, shapes)
    multipliers = [(1.0, 1.0)] * 2
    for step in range(3):
        _set_global(group, [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes],
                    [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes])
        updaters[0].update_group(group, step, weights,
                                 [mx.nd.array(rng.uniform(-1, 1, s)) for s in shapes],
                                 multipliers)
    saved = updaters[0].get_states([group])
    assert saved["optimizer_states"]["last_rates"]["a"][0] == 2
    other, other_weights = _nag_group(np.random.RandomState(0), shapes)
    for a, b in zip(other_weights, weights):
        b.copyto(a)
    group.current.copyto(other.current)
    group.previous.copyto(other.previous)
    updaters[1].set_states(saved, [other])
    grads = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    for updater, g_, ws in ((updaters[0], group, weights), (updaters[1], other, other_weights)):
        updater.update_group(g_, 3, ws, [mx.nd.array(a) for a in grads], multipliers)
    for a, b in zip(weights, other_weights):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    np.testing.assert_array_equal(other.mom.asnumpy(), group.mom.asnumpy())
    # without the rates (states of a store that did not save them) the first step falls back
    fresh, _ = _nag_group(np.random.RandomState(0), shapes)
    third = LocalUpdater(ODSGDConfig(environ=environ), mx.optimizer.SGD(momentum=0.9, wd=0.01),
                         2)
    third.set_states(dict(saved, optimizer_states=None), [fresh])
    assert third.rule.previous_rates(fresh, 3) == [None, None]


# -- local_flat: the worker's own copy of w_t (lam != 0) -----------------------------------------

def _local_group(rng, shapes, lam=2.0, mode="adaptive"):
    """An 'sgd' updater with compensation and a key group of `shapes` with W_t set."""
    from odsgd.worker.key_groups import KeyGroup
    params = {"learning_rate": 0.07, "momentum": 0.6, "wd": 2e-3}
    updater, _ = make_updater(local_optimizer="sgd", local_optimizer_params=params,
                              compensation=lam, compensation_mode=mode)
    weights = [mx.nd.array(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
    group = KeyGroup(3, list(range(len(shapes))), list(range(len(shapes))), weights)
    return updater, group, weights


def _local_sgd_reference(w, W, grads, m, v, lam=2.0, mode="adaptive"):
    return [ref.local_sgd_step(w[k], W[k], grads[k], m[k], v[k], rescale_grad=0.25, lr=0.07,
                               momentum=0.6, wd=2e-3, lam=lam, mode=mode)
            for k in range(len(w))]


def _group_step(updater, group, weights, step, rng, state):
    """One update_group with new W_t and gradients; `state` (w, m, v as NumPy) follows the
    reference."""
    W = [rng.uniform(-1, 1, w.shape).astype(np.float32) for w in state["w"]]
    grads = [rng.uniform(-2, 2, w.shape).astype(np.float32) for w in state["w"]]
    for view, value in zip(group.views(group.current), W):
        view[:] = value
    updater.update_group(group, step, weights, [mx.nd.array(g) for g in grads],
                         [(1.0, 1.0)] * len(weights))
    state["w"] = _local_sgd_reference(state["w"], W, grads, state["m"], state["v"])
    for k, weight in enumerate(weights):
        np.testing.assert_allclose(weight.asnumpy(), state["w"][k], rtol=RTOL, atol=ATOL,
                                   err_msg="array %d, step %d" % (k, step))


def _counting(monkeypatch, module, name):
    """Counts the calls of module.name (still calling it); returns the list of calls."""
    calls, original = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


def _start_state(weights):
    w = [a.asnumpy() for a in weights]
    return {"w": w, "m": [np.zeros_like(a) for a in w], "v": [np.zeros_like(a) for a in w]}


def test_local_weights_are_gathered_every_step_and_never_waited_for(monkeypatch):
    """With lam != 0 the fused step reads w_t from group.local, gathered from the weights at
    every step (equal to the weights bit for bit after the step), and the step never waits
    for the weights (no to_default_layout)."""
    from odsgd.native import layout
    assert native.load()
    rng = np.random.RandomState(31)
    updater, group, weights = _local_group(rng, [(3, 4), (70001,), (2, 2, 2)])
    state = _start_state(weights)
    gathers = _counting(monkeypatch, native, "gather_")
    waits = _counting(monkeypatch, layout, "to_default_layout")
    for step in range(4):
        _group_step(updater, group, weights, step, rng, state)
        np.testing.assert_array_equal(group.local.asnumpy(),
                                      np.concatenate([a.asnumpy().ravel() for a in weights]))
    assert len(gathers) == 4 and not waits


def test_a_write_into_the_parameters_between_steps_is_what_the_next_step_reads(path):
    """A value written into the parameters between two steps without telling the store (an
    EMA, a weight constraint written in place, Module.set_params, or the store's own
    load_global_weights and load_checkpoint) is w_t for the next step's compensation term, as
    the NumPy reference computes it from that value (the fused and the fallback path)."""
    rng = np.random.RandomState(36)
    updater, group, weights = _local_group(rng, [(3, 4), (1031,)])
    state = _start_state(weights)
    for step in range(2):
        _group_step(updater, group, weights, step, rng, state)
    written = [rng.uniform(-1, 1, w.shape).astype(np.float32) for w in state["w"]]
    for weight, value in zip(weights, written):
        weight[:] = value
    state["w"] = written
    for step in range(2, 4):
        _group_step(updater, group, weights, step, rng, state)


def test_without_compensation_there_is_no_local_copy():
    rng = np.random.RandomState(32)
    updater, group, weights = _local_group(rng, [(5,)], lam=0.0, mode="constant")
    updater.update_group(group, 0, weights, [mx.nd.ones((5,))], [(1.0, 1.0)])
    assert group.local is None and "local" not in updater.rule.buffers


def test_a_group_the_updater_has_not_stepped_reads_the_parameters():
    """A key group made anew (fusion, _make_whole, a checkpoint's set_states) reads w_t from
    its parameters at its first step, whatever its local buffer holds."""
    assert native.load()
    rng = np.random.RandomState(34)
    updater, group, weights = _local_group(rng, [(3, 4), (1031,)])
    updater.prepare(group)
    group.local[:] = np.nan                 # e.g. parts copied from groups that had none
    _group_step(updater, group, weights, 5, rng, _start_state(weights))


def test_a_fallback_step_in_between_refills_the_local_copy(monkeypatch):
    """The NDArray fallback writes the weights only: a fused step after it gathers w_t from
    the weights again."""
    assert native.load()
    rng = np.random.RandomState(35)
    updater, group, weights = _local_group(rng, [(3, 4), (1031,)])
    state = _start_state(weights)
    _group_step(updater, group, weights, 0, rng, state)
    with monkeypatch.context() as patched:
        patched.setattr(native, "accepts", lambda arrays: False)
        group.native_answers.clear()
        _group_step(updater, group, weights, 1, rng, state)
    group.native_answers.clear()
    gathers = _counting(monkeypatch, native, "gather_")
    _group_step(updater, group, weights, 2, rng, state)
    assert len(gathers) == 1


# -- 'predict' for every other global optimizer (docs/predict.md) ---------------------------

ADAPTIVE = {"adam": dict(beta1=0.8, beta2=0.99, epsilon=1e-6),
            "rmsprop": dict(gamma1=0.85, epsilon=1e-6),
            "adagrad": dict()}


def adaptive_optimizer(family, clip, schedule, lr=0.02, wd=3e-3, rescale=0.25):
    params = dict(ADAPTIVE[family])
    if family == "adagrad":
        params["eps"] = 1e-6
    return mx.optimizer.create(family, learning_rate=lr, wd=wd, rescale_grad=rescale,
                               clip_gradient=clip, begin_num_update=4,
                               lr_scheduler=mx.lr_scheduler.FactorScheduler(2, 0.5, base_lr=lr)
                               if schedule else None, **params)


@pytest.mark.parametrize("family", sorted(ADAPTIVE))
@pytest.mark.parametrize("clip,schedule", [(None, False), (0.4, True)])
def test_adaptive_predict(path, family, clip, schedule):
    """'predict' with a global Adam, RMSProp or AdaGrad, per parameter (with its lr_mult and
    wd_mult), step after step along the servers' own trajectory (W_{t+1} their step on a sum of
    gradients), at the rate of the servers' round (schedule at begin_num_update + t + 1):
    RMSProp and AdaGrad their step on W_t with N g, the state the worker's own estimate; Adam
    with the state recovered from the global steps (bias correction at the servers' count).
    Held to the NumPy reference, through Adam's one-pass operator and its NDArray fallback."""
    from odsgd.worker.key_groups import KeyGroup
    optimizer = adaptive_optimizer(family, clip, schedule)
    updater = LocalUpdater(ODSGDConfig(environ=OWN), optimizer, 3)
    rng = np.random.RandomState(seed_of(family, clip, schedule))
    shapes, multipliers = [(3, 4), (5,)], [(0.3, 1.0), (1.0, 0.0)]
    weights = [mx.nd.array(rng.uniform(-1, 1, s).astype(np.float32)) for s in shapes]
    group = KeyGroup(7, ["a", "b"], [0, 1], weights)
    _, names = ref.ADAPTIVE_STEPS[family]
    states = [[np.zeros(s, np.float32) for _ in names] for s in shapes]
    servers = [[np.zeros(s, np.float32) for _ in names] for s in shapes]
    own = [[np.zeros(s, np.float32)] for s in shapes]
    W = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    W_prev = [w.copy() for w in W]

    def rates(step, i):
        lr = 0.02 * (0.5 ** ((4 + step) // 2) if schedule else 1.0)
        r = dict(ADAPTIVE[family], lr=lr * multipliers[i][0], wd=3e-3 * multipliers[i][1],
                 clip_gradient=clip)
        if family == "adam":
            r["t"] = 4 + step + 1
        if family == "adagrad":
            r["epsilon"] = 1e-6
        return r
    for step in range(5):
        g = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        for view, value in zip(group.views(group.current), W):
            view[:] = value
        for view, value in zip(group.views(group.previous), W_prev):
            view[:] = value
        updater.update_group(group, step, weights, [mx.nd.array(a) for a in g], multipliers)
        for i in range(len(shapes)):
            if family == "adam":
                expected = ref.adam_predict_step(
                    W[i], W_prev[i], g[i], states[i], own[i], num_workers=3, rescale_grad=0.25,
                    previous_lr=rates(step - 1, i)["lr"] if step else None, **rates(step, i))
            else:
                expected = ref.adaptive_predict_step(family, W[i], g[i], states[i],
                                                     num_workers=3, rescale_grad=0.25,
                                                     **rates(step, i))
            np.testing.assert_allclose(weights[i].asnumpy(), expected, rtol=RTOL, atol=ATOL,
                                       err_msg="%s step %d parameter %d" % (family, step, i))
        # the servers' round: the sum of three workers' gradients, of which this one's is one
        G = [3 * a + rng.uniform(-0.5, 0.5, a.shape).astype(np.float32) for a in g]
        W_prev, W = W, [ref.ADAPTIVE_STEPS[family][0](W[i], G[i], servers[i], rescale_grad=0.25,
                                                      **rates(step, i))
                        for i in range(len(shapes))]


def test_adam_state_is_the_servers_with_one_worker(path):
    """With one worker the sum is its own gradient: the recovered state is the servers' state
    and each prediction is the servers' next weights (to float32 rounding)."""
    from odsgd.worker.key_groups import KeyGroup
    optimizer = adaptive_optimizer("adam", None, False)
    updater = LocalUpdater(ODSGDConfig(environ=OWN), optimizer, 1)
    rng = np.random.RandomState(11)
    W = rng.uniform(-1, 1, (20,)).astype(np.float32)
    weights = [mx.nd.zeros((20,))]
    group = KeyGroup(3, [0], [0], weights)
    server = [np.zeros(20, np.float32), np.zeros(20, np.float32)]
    W_prev = W.copy()
    for step in range(8):
        g = rng.uniform(-1, 1, (20,)).astype(np.float32) * (1 + step)
        group.views(group.current)[0][:] = W
        group.views(group.previous)[0][:] = W_prev
        updater.update_group(group, step, weights, [mx.nd.array(g)], [(1.0, 1.0)])
        before = [a.copy() for a in server]
        W_prev, W = W, ref.global_adam_step(W, g, server, t=4 + step + 1, rescale_grad=0.25,
                                            lr=0.02, wd=3e-3, **ADAPTIVE["adam"])
        # the recovery divides float32 weight differences (rounding ~6e-8) by the rate (0.02)
        # and the state carries what it recovers: 5e-5 is a quarter of a percent of a step
        np.testing.assert_allclose(weights[0].asnumpy(), W, rtol=1e-4, atol=5e-5)
    # and the state it keeps is the servers' before their last round (rounding grows in it
    # as in the weights)
    for kept, servers in zip((group.mom, group.var), before):
        np.testing.assert_allclose(kept.asnumpy(), servers, rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("family", sorted(ADAPTIVE))
def test_adaptive_reference_is_mxnets_optimizer(family):
    """The reference's servers' step of each family is what MXNet's optimizer computes (rates,
    clipping and weight decay as its operator orders them), over several steps."""
    optimizer = adaptive_optimizer(family, 0.4, False, rescale=0.5)
    rng = np.random.RandomState(seed_of(family))
    W = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    weight = mx.nd.array(W)
    state = optimizer.create_state(0, weight)
    _, names = ref.ADAPTIVE_STEPS[family]
    reference_state = [np.zeros_like(W) for _ in names]
    optimizer.begin_num_update = 0
    for step in range(3):
        G = rng.uniform(-2, 2, W.shape).astype(np.float32)
        optimizer.update(0, weight, mx.nd.array(G), state)
        rates = dict(ADAPTIVE[family], lr=0.02, wd=3e-3, clip_gradient=0.4)
        if family == "adam":
            rates["t"] = step + 1
        if family == "adagrad":
            rates["epsilon"] = 1e-6
        W = ref.ADAPTIVE_STEPS[family][0](W, G, reference_state, rescale_grad=0.5, **rates)
        np.testing.assert_allclose(weight.asnumpy(), W, rtol=RTOL, atol=ATOL)


def test_every_builtin_optimizer_is_predicted():
    """Every dense optimizer MXNet 1.9.1 ships gets a local step with the store's defaults:
    finite, not W_t itself (a prediction was made), none refused."""
    from odsgd.worker.key_groups import KeyGroup
    names = ["adam", "rmsprop", "adagrad", "adadelta", "adamax", "nadam", "ftrl", "ftml",
             "signum", "lamb", "lars", "lbsgd", "dcasgd", "sgld", "sgd", "nag"]
    for name in names:
        optimizer = mx.optimizer.create(name, learning_rate=0.01, rescale_grad=0.5, wd=1e-3)
        updater = LocalUpdater(ODSGDConfig(environ=OWN), optimizer, 2)
        rng = np.random.RandomState(seed_of(name))
        weights = [mx.nd.array(rng.uniform(-1, 1, (4, 3)).astype(np.float32))]
        group = KeyGroup(3, [0], [0], weights)
        W = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
        group.views(group.current)[0][:] = W
        group.views(group.previous)[0][:] = W
        for step in range(2):
            updater.update_group(group, step, weights,
                                 [mx.nd.array(rng.uniform(-1, 1, (4, 3)).astype(np.float32))],
                                 [(1.0, 1.0)])
        local = weights[0].asnumpy()
        assert np.isfinite(local).all(), name
        assert (local != W).any(), name   # LARS's trust ratio makes its step small


def test_compensation_with_another_global_optimizer_names_the_fix():
    """The delay compensation is defined for SGD and NAG only: with Adam it is refused when
    the optimizer is set, naming the setting that works."""
    optimizer = mx.optimizer.Adam(learning_rate=0.01)
    with pytest.raises(ValueError, match=r"global optimizer Adam set compensation=0 "
                                         r"\(ODSGD_COMPENSATION=0\)"):
        LocalUpdater(ODSGDConfig(environ=OWN, compensation=0.5), optimizer, 2)


def test_an_optimizer_without_an_update_takes_the_global_weights():
    """A user's optimizer with no update() of its own: no prediction, w_{t+1} = W_t."""
    from odsgd.worker.key_groups import KeyGroup

    class Mine(mx.optimizer.Optimizer):
        pass
    updater = LocalUpdater(ODSGDConfig(environ=OWN), Mine(learning_rate=0.1), 2)
    weights = [mx.nd.ones((3,))]
    group = KeyGroup(3, [0], [0], weights)
    group.views(group.current)[0][:] = np.float32([0.5, -1.0, 2.0])
    updater.update_group(group, 0, weights, [mx.nd.ones((3,))], [(1.0, 1.0)])
    np.testing.assert_array_equal(weights[0].asnumpy(), [0.5, -1.0, 2.0])


def test_sgld_is_predicted_by_the_mean_of_its_step():
    """SGLD's noise is drawn on the servers: the prediction is its step without the noise,
    W - lr / 2 (r N grad + wd W)."""
    from odsgd.worker.key_groups import KeyGroup
    optimizer = mx.optimizer.SGLD(learning_rate=0.1, wd=0.01, rescale_grad=0.5)
    updater = LocalUpdater(ODSGDConfig(environ=OWN), optimizer, 2)
    rng = np.random.RandomState(3)
    W, grad = [rng.uniform(-1, 1, (5,)).astype(np.float32) for _ in range(2)]
    weights = [mx.nd.zeros((5,))]
    group = KeyGroup(3, [0], [0], weights)
    group.views(group.current)[0][:] = W
    updater.update_group(group, 0, weights, [mx.nd.array(grad)], [(1.0, 1.0)])
    expected = W - 0.05 * (0.5 * 2 * grad + 0.01 * W)
    np.testing.assert_allclose(weights[0].asnumpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("family", ["adam", "rmsprop"])
def test_adaptive_predict_state_survives_a_checkpoint(family):
    """The worker's estimate of the servers' state (Adam's m and v in the group's flat buffers,
    RMSProp's in the optimizer copy's states) is saved with get_states and loaded by a new
    updater: its next step equals the uninterrupted one's."""
    from odsgd.worker.key_groups import KeyGroup
    rng = np.random.RandomState(seed_of(family, "checkpoint"))
    W = [rng.uniform(-1, 1, (3, 4)).astype(np.float32) for _ in range(3)]
    g = [rng.uniform(-1, 1, (3, 4)).astype(np.float32) for _ in range(3)]

    def setup():
        updater = LocalUpdater(ODSGDConfig(environ=OWN), adaptive_optimizer(family, None, False),
                               2)
        weights = [mx.nd.zeros((3, 4))]
        return updater, weights, KeyGroup(3, [0], [0], weights)

    def step(updater, weights, group, t):
        group.views(group.current)[0][:] = W[t]
        updater.update_group(group, t, weights, [mx.nd.array(g[t])], [(1.0, 1.0)])
        return weights[0].asnumpy()

    first, weights, group = setup()
    step(first, weights, group, 0)
    step(first, weights, group, 1)
    saved = first.get_states([group])
    expected = step(first, weights, group, 2)
    second, weights2, group2 = setup()
    second.set_states(saved, [group2])
    np.testing.assert_array_equal(step(second, weights2, group2, 2), expected)


@pytest.mark.parametrize("name", ["lars", "rmsprop", "lbsgd", "signum"])
def test_float16_weights_are_predicted_from_the_float32_master_copy(name):
    """float16 weights with multi_precision: the prediction is the float32 one (the master
    copy set to W_t each step, wherever the class keeps it: MXNet's SGD, NAG and LARS after
    their state, the others before it), rounded to float16; the states carry on in float32."""
    from odsgd.worker.key_groups import KeyGroup
    rng = np.random.RandomState(seed_of(name, "float16"))
    shape = (6, 5)
    globals_ = [rng.uniform(-1, 1, shape).astype(np.float16) for _ in range(4)]
    grads = [rng.uniform(-1, 1, shape).astype(np.float16) for _ in range(3)]
    results = {}
    for dtype in (np.float32, np.float16):
        momentum = {} if name == "rmsprop" else {"momentum": 0.9}
        optimizer = mx.optimizer.create(name, learning_rate=0.05, rescale_grad=0.5, wd=1e-2,
                                        multi_precision=dtype == np.float16, **momentum)
        updater = LocalUpdater(ODSGDConfig(environ=OWN), optimizer, 2)
        weights = [mx.nd.zeros(shape, dtype=dtype)]
        group = KeyGroup(3, [0], [0], weights)
        results[dtype] = []
        for step, grad in enumerate(grads):
            group.views(group.previous)[0][:] = globals_[step].astype(dtype)
            group.views(group.current)[0][:] = globals_[step + 1].astype(dtype)
            updater.update_group(group, step, weights, [mx.nd.array(grad, dtype=dtype)],
                                 [(1.0, 1.0)])
            results[dtype].append(weights[0].asnumpy())
    for step, (single, half) in enumerate(zip(results[np.float32], results[np.float16])):
        assert half.dtype == np.float16
        np.testing.assert_allclose(half.astype(np.float32), single.astype(np.float16),
                                   rtol=2e-3, atol=2e-3, err_msg="%s step %d" % (name, step))


def test_a_local_optimizer_on_float16_weights_starts_from_the_global_weights():
    """local_optimizer='adam' with multi_precision on float16 weights steps from W_t each step
    (its float32 master copy set to W_t, not left at its own last result), as in float32."""
    rng = np.random.RandomState(41)
    shape = (6, 4)
    steps = [[rng.uniform(-1, 1, shape).astype(np.float16) for _ in range(3)]
             for _ in range(3)]                        # (W_prev, W, grad) per step
    results = {}
    for dtype in (np.float32, np.float16):
        params = {"learning_rate": 0.01, "multi_precision": dtype == np.float16}
        updater, _ = make_updater(local_optimizer="adam", local_optimizer_params=params)
        weight = mx.nd.zeros(shape, dtype=dtype)
        results[dtype] = []
        for step, (W_prev, W, grad) in enumerate(steps):
            updater.update(1, step, weight, mx.nd.array(grad, dtype=dtype),
                           mx.nd.array(W, dtype=dtype), mx.nd.array(W_prev, dtype=dtype))
            results[dtype].append(weight.asnumpy())
    for step, (single, half) in enumerate(zip(results[np.float32], results[np.float16])):
        np.testing.assert_allclose(half.astype(np.float32), single.astype(np.float16),
                                   rtol=2e-3, atol=2e-3, err_msg="step %d" % step)
