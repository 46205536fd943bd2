"""The multi-array operators (odsgd.native.multi_update_, gather_, scatter_) against the NumPy
reference tests/od_reference.py, array by array, and their layout handling.

The updates write the weights without reading them, for every lam: the old weights w_t,
which the compensation term reads, come from local_flat, the caller's flat copy of them,
which the same pass overwrites with w_{t+1}. The tests fill the weights with NaN before each
call: one read of them would show in the results.

Tolerance as in test_fused_op.py (its docstring gives the reasoning): rtol 1e-5, atol 1e-6;
local_flat is written with the very values the weights get and must equal them exactly.
"""
import itertools
import zlib

import numpy as np
import pytest

import od_reference as ref
from test_fused_op import native  # noqa: F401  (the session fixture: builds and loads)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

RTOL, ATOL = 1e-5, 1e-6
STEPS = 3
# P = 1; many small odd-sized arrays; a mix with one array large enough to be split over
# threads (the kernels thread above 32768 elements per thread).
GROUPS = {
    "one": [(7, 3)],
    "many": [(1,), (3,), (17, 31), (2, 3, 5), (1023,), (16,), (16, 16), (5, 1, 1, 3)] * 4,
    "mixed": [(3,), (70001,), (2, 2), (33, 1025)],
}


def _seed(*case):
    return zlib.crc32(repr(case).encode())


def _nd(array):
    import mxnet as mx
    return mx.nd.array(array, dtype="float32")


def _flat(arrays):
    return np.concatenate([a.ravel() for a in arrays]).astype(np.float32)


def _last_extension_error(err):
    lines = [line for line in str(err).splitlines() if line.strip().startswith("[")]
    return lines[-1] if lines else str(err)


OPTIONS = list(itertools.product(["sgd", "predict", "predict+previous"],
                                 ["constant", "adaptive"], [False, True]))


def _estimates(rng, P, previous):
    """Per-array own_scales (the default N = 3, and others) and, for an estimate that takes
    the previous round, prev_scales (0 included: an array whose previous round is unknown) and
    prev_decays; else None for both."""
    own = [float(x) for x in rng.choice([3.0, 1.0, 3 / 1.9], P)]
    if not previous:
        return own, None, None
    return (own, [float(x) for x in rng.choice([0.0, 2 / 3, 1.5], P)],
            [float(x) for x in rng.choice([0.0, 1e-3, 0.02], P)])


def _nan_weights(weights):
    """Fills the weights with NaN: the updates must not read them (they are outputs only)."""
    for weight in weights:
        weight[:] = np.nan


def _assert_local_is_weights(local_flat, weights, what):
    """local_flat holds exactly the values the call wrote into the weights."""
    np.testing.assert_array_equal(local_flat.asnumpy(), _flat([w.asnumpy() for w in weights]),
                                  err_msg="local_flat differs from the weights, " + what)


@pytest.mark.parametrize("kind,mode,clip", OPTIONS)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_multi_update_matches_reference(native, group, kind, mode, clip):  # noqa: F811
    """lam != 0: every array k with its own lr and wd (the predicts: and own estimate of the
    round's sum, 'predict+previous' with the previous round's sum), w_t read from local_flat
    (made once with gather_, then kept by the operator) and the weights NaN before every
    call, states carried over STEPS steps, against the single-array reference formulas of
    docs/spec.md, section 4; the SGD predict with the previous round also against the NDArray
    fallback of odsgd.worker.local_update."""
    shapes = GROUPS[group]
    P = len(shapes)
    rng = np.random.default_rng(_seed(group, kind, mode, clip))
    lrs = [float(x) for x in rng.uniform(0.01, 0.2, P)]
    wds = [float(x) for x in rng.choice([0.0, 0.01, 0.05], P)]
    kind, _, previous = kind.partition("+")
    own, prev, decays = _estimates(rng, P, previous)
    common = dict(rescale_grad=0.5, clip_gradient=0.8 if clip else None, momentum=0.9,
                  lam=0.5, beta=0.9, eps=1e-7)
    W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    w = [(a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    W_prev = [a.copy() for a in W]
    m = [np.zeros(s, np.float32) for s in shapes]
    v = [np.zeros(s, np.float32) for s in shapes]
    weights = [_nd(a) for a in w]
    local_flat = native.gather_(weights, _nd(np.zeros(sum(a.size for a in w), np.float32)))
    fallback = [_nd(a) for a in w]
    fallback_est = [_nd(a) for a in m]
    fallback_var = [_nd(a) for a in v]
    mom_flat = _nd(np.zeros(sum(a.size for a in w), np.float32))
    var_flat = _nd(_flat(v)) if mode == "adaptive" else None
    for t in range(STEPS):
        grads_np = [(2.0 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        for k in range(P):
            if kind == "sgd":
                w[k] = ref.local_sgd_step(w[k], W[k], grads_np[k], m[k], v[k], lr=lrs[k],
                                          wd=wds[k], mode=mode, **common)
            else:
                estimate = dict(own_scale=own[k], prev_scale=prev[k], est=m[k],
                                prev_decay=decays[k]) if previous else dict(own_scale=own[k])
                w[k] = ref.predict_step(w[k], W[k], W_prev[k], grads_np[k], v[k], lr=lrs[k],
                                        wd=wds[k], num_workers=3, mode=mode, **estimate,
                                        **common)
        global_flat = _nd(_flat(W))
        flats = dict(mom_flat=mom_flat) if kind == "sgd" else dict(
            prev_global_flat=_nd(_flat(W_prev)), num_workers=3, own_scales=own)
        if previous:
            flats.update(est_flat=mom_flat, prev_scales=prev, prev_decays=decays)
            _predict_fallback(fallback, grads_np, W, W_prev, fallback_est, fallback_var, lrs,
                              wds, own, prev, decays, dict(common, adaptive=mode == "adaptive"))
        _nan_weights(weights)
        returned = native.multi_update_(kind, weights, [_nd(g) for g in grads_np], global_flat,
                                        var_flat=var_flat, local_flat=local_flat, lrs=lrs,
                                        wds=wds, adaptive=mode == "adaptive", **flats, **common)
        assert returned is weights
        for k in range(P):
            np.testing.assert_allclose(weights[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                       err_msg="weight %d, step %d" % (k, t))
            if previous:
                np.testing.assert_allclose(fallback[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                           err_msg="fallback weight %d, step %d" % (k, t))
                np.testing.assert_allclose(fallback_est[k].asnumpy(), m[k], rtol=RTOL,
                                           atol=ATOL, err_msg="fallback est %d" % k)
        _assert_local_is_weights(local_flat, weights, "step %d" % t)
        if kind == "sgd" or previous:
            np.testing.assert_allclose(mom_flat.asnumpy(), _flat(m), rtol=RTOL, atol=ATOL,
                                       err_msg="mom / est, step %d" % t)
        if mode == "adaptive":
            np.testing.assert_allclose(var_flat.asnumpy(), _flat(v), rtol=RTOL, atol=ATOL,
                                       err_msg="var, step %d" % t)
        W_prev, W = W, [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]


def _predict_fallback(weights, grads_np, W, W_prev, est, var, lrs, wds, own, prev, decays,
                      common):
    """odsgd.worker.local_update's NDArray fallback of the SGD predict, array by array."""
    from odsgd.worker.local_update import ndarray_predict_update_
    for k, weight in enumerate(weights):
        ndarray_predict_update_(weight, _nd(grads_np[k]), _nd(W[k]), _nd(W_prev[k]), var[k],
                                lr=lrs[k], wd=wds[k], num_workers=3, own_scale=own[k],
                                prev_scale=prev[k], est=est[k], prev_decay=decays[k], **common)


def test_multi_update_equals_single_array_calls(native):  # noqa: F811
    """One multi-array call and P one-array calls (local_update_, P = 1, which makes its own
    flat copy of the weight for w_t) give the same bits."""
    rng = np.random.default_rng(11)
    shapes = GROUPS["many"]
    w = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    lrs = [0.01 * (k + 1) for k in range(len(shapes))]
    common = dict(rescale_grad=0.25, clip_gradient=None, momentum=0.5, lam=0.2,
                  adaptive=False, beta=0.9, eps=1e-7)
    multi = [_nd(a) for a in w]
    mom_flat = _nd(np.zeros(sum(a.size for a in w), np.float32))
    native.multi_update_("sgd", multi, [_nd(a) for a in g], _nd(_flat(W)), mom_flat=mom_flat,
                         local_flat=_nd(_flat(w)), lrs=lrs, wds=[0.0] * len(w), **common)
    for k in range(len(shapes)):
        single, mom = _nd(w[k]), _nd(np.zeros(shapes[k], np.float32))
        native.local_update_(single, _nd(g[k]), _nd(W[k]), mom, None, lr=lrs[k], wd=0.0,
                             **common)
        np.testing.assert_array_equal(multi[k].asnumpy(), single.asnumpy())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_gather_and_scatter_are_exact_inverses(native, group):  # noqa: F811
    import mxnet as mx
    shapes = GROUPS[group]
    rng = np.random.default_rng(_seed("gather", group))
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    flat = mx.nd.zeros((sum(a.size for a in values),))
    assert native.gather_([_nd(a) for a in values], flat) is flat
    np.testing.assert_array_equal(flat.asnumpy(), _flat(values))
    targets = [mx.nd.zeros(s) for s in shapes]
    assert native.scatter_(_nd(_flat(values) * 2), targets) is targets
    for target, value in zip(targets, values):
        np.testing.assert_array_equal(target.asnumpy(), 2 * value)


def _group(P=3, n=4, dtype="float32"):
    import mxnet as mx
    weights = [mx.nd.ones((n,), dtype=dtype) for _ in range(P)]
    grads = [mx.nd.ones((n,), dtype=dtype) for _ in range(P)]
    return weights, grads, mx.nd.zeros((P * n,)), mx.nd.zeros((P * n,))


COMMON = dict(rescale_grad=1.0, clip_gradient=None, momentum=0.9, lam=0.0, adaptive=False,
              beta=0.9, eps=1e-7)


@pytest.mark.parametrize("case,error,message", [
    ("no_arrays", ValueError, "no arrays (P = 0)"),
    ("lengths", ValueError, "one entry per array"),
    ("bad_kind", ValueError, "kind must be 'sgd' or 'predict'"),
    ("sgd_without_mom", TypeError, "needs mom_flat"),
    ("predict_without_prev", TypeError, "needs prev_global_flat"),
    ("sgd_with_prev", TypeError, "does not use prev_global_flat"),
    ("adaptive_without_var", TypeError, "var_flat is required"),
    ("lam_without_local", TypeError, "lam=0.5 reads the old weights w_t, and the weights are "
                                     "outputs only: pass local_flat"),
])
def test_python_side_misuse_is_refused(native, case, error, message):  # noqa: F811
    weights, grads, global_flat, mom = _group()
    kwargs = dict(COMMON, lrs=[0.1] * 3, wds=[0.0] * 3, mom_flat=mom)
    kind = "sgd"
    if case == "no_arrays":
        weights, grads, kwargs["lrs"], kwargs["wds"] = [], [], [], []
    elif case == "lengths":
        kwargs["lrs"] = [0.1] * 2
    elif case == "bad_kind":
        kind = "adam"
    elif case == "sgd_without_mom":
        kwargs["mom_flat"] = None
    elif case == "predict_without_prev":
        kind, kwargs["mom_flat"] = "predict", None
    elif case == "sgd_with_prev":
        kwargs["prev_global_flat"] = global_flat
    elif case == "lam_without_local":
        kwargs["lam"] = 0.5
    else:
        kwargs["adaptive"] = True
    with pytest.raises(error) as caught:
        native.multi_update_(kind, weights, grads, global_flat, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("case,lam,message", [
    ("float16", 0.0, "only float32"),
    ("float16", 0.5, "only float32"),
    # The weights are outputs only: their sizes are the gradients', and MXNet holds the shapes
    # the operator infers from the gradients to the output arrays.
    ("grad_shape", 0.0, "'global_flat' has shape (12,) but must be 1-D of length 13 (the "
                        "sum of the gradients' sizes"),
    ("grad_shape", 0.5, "'global_flat' has shape (12,) but must be 1-D of length 13 (the "
                        "sum of the gradients' sizes"),
    ("grad_reshaped", 0.0, "Shape inconsistent, Provided = [4], inferred shape=[2,2]"),
    ("flat_length", 0.0, "'global_flat' has shape (11,) but must be 1-D of length 12"),
    ("flat_length", 0.5, "'global_flat' has shape (11,) but must be 1-D of length 12"),
    ("local_length", 0.5, "'local_flat' has shape (11,) but must be 1-D of length 12"),
    ("mom_is_global", 0.0, "shares memory with"),
    ("local_is_global", 0.5, "shares memory with"),
    ("weight_in_local", 0.0, "shares memory with"),
    ("weight_in_local", 0.5, "shares memory with"),
    ("weight_twice", 0.0, "shares memory with"),
])
def test_operator_misuse_gets_a_clear_error(native, case, lam, message):  # noqa: F811
    import mxnet as mx
    weights, grads, global_flat, mom = _group()
    local = mx.nd.zeros((12,))
    if case == "float16":
        weights, grads, _, _ = _group(dtype="float16")
    elif case == "grad_shape":
        grads[1] = mx.nd.ones((5,))
    elif case == "grad_reshaped":
        grads[1] = mx.nd.ones((2, 2))
    elif case == "weight_twice":
        weights[2] = weights[0]
    elif case == "flat_length":
        global_flat = mx.nd.zeros((11,))
    elif case == "local_length":
        local = mx.nd.zeros((11,))
    elif case == "mom_is_global":
        mom = global_flat
    elif case == "local_is_global":
        local = global_flat
    else:
        weights[2] = local[4:8]
    with pytest.raises(mx.base.MXNetError) as caught:
        native.multi_update_("sgd", weights, grads, global_flat, mom_flat=mom, local_flat=local,
                             lrs=[0.1] * 3, wds=[0.0] * 3, **dict(COMMON, lam=lam))
        mx.nd.waitall()     # overlap is found when the operator runs
    assert message in _last_extension_error(caught.value)


def test_gather_refuses_a_wrong_length(native):  # noqa: F811
    import mxnet as mx
    with pytest.raises(mx.base.MXNetError) as caught:
        native.scatter_(mx.nd.zeros((7,)), [mx.nd.zeros((2, 3))])
    assert "'flat' has shape (7,) but must be 1-D of length 6" in _last_extension_error(
        caught.value)
    with pytest.raises(ValueError, match="no arrays"):
        native.gather_([], mx.nd.zeros((1,)))


def test_accepts_only_what_the_operators_take(native):  # noqa: F811
    import mxnet as mx
    f32 = [mx.nd.zeros((3,)), mx.nd.zeros((2, 2))]
    assert native.accepts(f32)
    assert not native.accepts([])
    assert not native.accepts(f32 + [mx.nd.zeros((3,), dtype="float16")])
    assert not native.accepts([mx.nd.zeros((3,), dtype="float64")])
    assert not native.accepts([mx.nd.zeros((4, 4)).tostype("row_sparse")])
    assert not native.accepts([mx.nd.zeros((3,), ctx=mx.cpu(0)), mx.nd.zeros((3,), ctx=mx.cpu(1))])


def test_zero_size_arrays_are_handled(native):  # noqa: F811
    """With NumPy shape semantics MXNet has arrays of size 0; among others they are skipped,
    and all of them together leave nothing to do."""
    import mxnet as mx
    with mx.util.np_shape(True):
        rng = np.random.default_rng(5)
        shapes = [(3,), (0,), (2, 0), (4,)]
        w = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        weights = [mx.nd.array(a) for a in w]
        mom = mx.nd.array(np.zeros(7, np.float32))
        local = mx.nd.array(_flat(w))
        common = dict(COMMON, lam=0.3)
        native.multi_update_("sgd", weights, [mx.nd.array(a) for a in g], mx.nd.array(_flat(W)),
                             mom_flat=mom, local_flat=local, lrs=[0.1] * 4, wds=[0.0] * 4,
                             **common)
        for k in (0, 3):
            m = np.zeros(shapes[k], np.float32)
            expected = ref.local_sgd_step(w[k], W[k], g[k], m, np.zeros_like(m), lr=0.1, wd=0.0,
                                          **{a: b for a, b in common.items()
                                             if a != "adaptive"})
            np.testing.assert_allclose(weights[k].asnumpy(), expected, rtol=RTOL, atol=ATOL)
        _assert_local_is_weights(local, weights, "arrays of size 0 among others")
        assert weights[1].shape == (0,) and weights[2].shape == (2, 0)


# ------------------------------------------------------------------------------------------
# The weights as outputs only, and MKL-DNN layouts

UPDATE_KINDS = ["sgd", "predict", "predict+previous", "nag_predict", "nag_predict+previous"]
# setting -> (lam, compensation mode, whether the call gets local_flat)
SETTINGS = {"lam=0": (0.0, "constant", False), "lam=0.5": (0.5, "constant", True),
            "lam=0.5 adaptive": (0.5, "adaptive", True)}


def _no_layout_wait(monkeypatch):
    """Fails the test if odsgd.native.layout.to_default_layout (the wait for the weights'
    pending writes) is called."""
    from odsgd.native import layout

    def refuse(arrays, context):
        raise AssertionError("to_default_layout was called: the call waited for the weights")
    monkeypatch.setattr(layout, "to_default_layout", refuse)


def _reference_steps(kind, previous, w, W, W_prev, grads, state, lrs, wds, own, prev, decays,
                     common, v=None):
    """One step of every array by tests/od_reference.py; `state` is m ('sgd') or est (the
    predicts), `v` (zeros when None: constant mode never reads it) the adaptive mode's v,
    both updated in place; returns the new w."""
    v = [np.zeros_like(a) for a in w] if v is None else v
    out = []
    for k in range(len(w)):
        if kind == "sgd":
            out.append(ref.local_sgd_step(w[k], W[k], grads[k], state[k], v[k], lr=lrs[k],
                                          wd=wds[k], **common))
        elif kind == "predict":
            estimate = dict(own_scale=own[k], prev_scale=prev[k], est=state[k],
                            prev_decay=decays[k]) if previous else dict(own_scale=own[k])
            out.append(ref.predict_step(w[k], W[k], W_prev[k], grads[k], v[k], lr=lrs[k],
                                        wd=wds[k], num_workers=3, **estimate, **common))
        else:
            out.append(ref.nag_predict_step(w[k], W[k], W_prev[k], grads[k], state[k], v[k],
                                            lr=lrs[k], wd=wds[k], prev_decay=decays[k],
                                            num_workers=3, own_scale=own[k],
                                            prev_scale=prev[k] if previous else None,
                                            **common))
    return out


def _state_arguments(kind, previous, state_flat, W_prev, own, prev, decays):
    """multi_update_'s keyword arguments of the states of `kind`."""
    if kind == "sgd":
        return dict(mom_flat=state_flat)
    flats = dict(prev_global_flat=_nd(_flat(W_prev)), num_workers=3, own_scales=own)
    if kind == "nag_predict" or previous:
        flats.update(est_flat=state_flat, prev_decays=decays)
    if previous:
        flats.update(prev_scales=prev)
    return flats


@pytest.mark.parametrize("kind", UPDATE_KINDS)
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_lam0_without_local_flat_matches_reference(native, monkeypatch, group, kind,  # noqa: F811
                                                   clip):
    """lam = 0, not adaptive (the default), no local_flat: multi_update_ does not wait for the
    weights, and the kernels take W_t where they would read w_t (the compensation term is
    0 * (W - w)). The weights are NaN before every call; the reference steps finite w. States
    carried over STEPS steps, every array with its own lr, wd and estimate."""
    import mxnet as mx
    _no_layout_wait(monkeypatch)
    shapes = GROUPS[group]
    P = len(shapes)
    rng = np.random.default_rng(_seed("overwrite", group, kind, clip))
    kind, _, previous = kind.partition("+")
    lrs = [float(x) for x in rng.uniform(0.01, 0.2, P)]
    wds = [float(x) for x in rng.choice([0.0, 0.01, 0.05], P)]
    own, prev, decays = _estimates(rng, P, True)
    common = dict(rescale_grad=0.5, clip_gradient=0.8 if clip else None, momentum=0.9,
                  lam=0.0, beta=0.9, eps=1e-7)
    W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    W_prev = [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    w = [(a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    state = [np.zeros(s, np.float32) for s in shapes]
    state_flat = _nd(np.zeros(sum(a.size for a in w), np.float32))
    weights = [mx.nd.zeros(s) for s in shapes]
    for t in range(STEPS):
        grads_np = [(2.0 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        w = _reference_steps(kind, previous, w, W, W_prev, grads_np, state, lrs, wds, own, prev,
                             decays, common)
        _nan_weights(weights)
        returned = native.multi_update_(kind, weights, [_nd(g) for g in grads_np],
                                        _nd(_flat(W)), lrs=lrs, wds=wds, adaptive=False,
                                        **_state_arguments(kind, previous, state_flat, W_prev,
                                                           own, prev, decays), **common)
        assert returned is weights
        for k in range(P):
            np.testing.assert_allclose(weights[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                       err_msg="weight %d, step %d" % (k, t))
        if kind != "predict" or previous:
            np.testing.assert_allclose(state_flat.asnumpy(), _flat(state), rtol=RTOL,
                                       atol=ATOL, err_msg="mom / est, step %d" % t)
        W_prev, W = W, [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]


def _raw_update(kind, weights, grads, flats, **attrs):
    """The operator of `kind` called directly (mx.nd.<op>), lam = 0 and local=0 unless `attrs`
    say otherwise; `flats`: global, mom or prev_global, var, local (and est for the
    predicts)."""
    import mxnet as mx
    op = getattr(mx.nd, {"sgd": "odsgd_multi_local_update",
                         "predict": "odsgd_multi_predict_update",
                         "nag_predict": "odsgd_multi_nag_predict_update"}[kind])
    values = dict(num_arrays=len(weights), lrs="0.05", wds="0.01", rescale_grad=0.5,
                  clip_gradient=-1, momentum=0.9, lam=0, adaptive=0, beta=0.9, eps=1e-7,
                  local=0)
    if kind != "sgd":
        values.update(own_scales="3.0", previous=0)
    if kind == "nag_predict":
        values["prev_decays"] = "0.001"
    values.update(attrs)
    op(*(list(grads) + list(flats)), out=list(weights), **values)


@pytest.mark.parametrize("kind", ["sgd", "predict", "nag_predict"])
def test_lam0_gives_the_same_bits_with_and_without_local_flat(native, kind):  # noqa: F811
    """With lam = 0, local=1 (w_t read from local_flat) and local=0 (W_t read in its place)
    give the same bits, states included (WeightAt's claim), and local=1 leaves w_{t+1} in
    local_flat."""
    import mxnet as mx
    rng = np.random.default_rng(_seed("bits", kind))
    shapes = [(3, 5), (70001,)]
    w = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    total = sum(a.size for a in w)
    W, W_prev, state = (rng.standard_normal(total).astype(np.float32) for _ in range(3))
    results = []
    for local in (False, True):
        weights = [mx.nd.zeros(s) for s in shapes]
        states = [_nd(state)]
        placeholder = mx.nd.zeros((1,))
        local_flat = _nd(_flat(w)) if local else placeholder
        flats = [_nd(W)] + ([states[0], placeholder, local_flat] if kind == "sgd" else
                            [_nd(W_prev), placeholder, local_flat, states[0]])
        _raw_update(kind, weights, [_nd(a) for a in g], flats, lrs="0.05,0.1", local=int(local))
        results.append([a.asnumpy() for a in weights + states])
        if local:
            _assert_local_is_weights(local_flat, weights, "lam = 0")
    for before, after in zip(*results):
        np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("attrs,message", [
    (dict(lam=0.5), "lam=0.5 reads the old weights w_t, which the weights (outputs only) do "
                    "not give: pass local_flat"),
    (dict(local=2), "attribute 'local' must be 0 or 1, got '2'"),
    (dict(send=0), "unknown attribute 'send'"),
])
def test_raw_operator_misuse_gets_a_clear_error(native, attrs, message):  # noqa: F811
    import mxnet as mx
    weights, grads, global_flat, mom = _group(P=2)
    with pytest.raises(mx.base.MXNetError) as caught:
        _raw_update("sgd", weights, grads, [global_flat, mom, mx.nd.zeros((1,)),
                                            mx.nd.zeros((8,))], **attrs)
        mx.nd.waitall()
    assert message in _last_extension_error(caught.value)


def _failing_call(native, weights, grads, global_flat, shared, lam):
    """A call that the engine refuses when it runs it: mom_flat overlaps local_flat."""
    native.multi_update_("sgd", weights, grads, global_flat, mom_flat=shared, local_flat=shared,
                         lrs=[0.1] * 3, wds=[0.0] * 3, **dict(COMMON, lam=lam))


@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_a_failure_inside_the_operator_surfaces_at_the_next_wait(native, lam):  # noqa: F811
    """An error found when the engine runs the operator lands on its outputs, and MXNet 1.9
    raises it once, at the first wait on any of them. The next call on the same weights
    waits for nothing, for every lam (the weights are outputs only): the engine passes the
    error on to that call's outputs, and reading its weights raises it."""
    import mxnet as mx
    weights, grads, global_flat, _ = _group()
    _failing_call(native, weights, grads, global_flat, mx.nd.zeros((12,)), lam)
    native.multi_update_("sgd", weights, grads, global_flat, mom_flat=mx.nd.zeros((12,)),
                         local_flat=mx.nd.zeros((12,)), lrs=[0.1] * 3, wds=[0.0] * 3,
                         **dict(COMMON, lam=lam))
    with pytest.raises(mx.base.MXNetError) as caught:
        weights[1].asnumpy()
    assert "shares memory with" in _last_extension_error(caught.value)


def _conv_net(seed):
    import mxnet as mx
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=3), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Conv2D(8, 3, in_channels=8), mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(4, in_units=8 * 4 * 4))
    net.initialize(mx.init.Xavier())
    return net


def _conv_net_weights(seed):
    """The values a net of _conv_net(seed) starts with (read from a net of its own, so that
    nothing waits for the nets under test)."""
    return [p.data().asnumpy() for p in _conv_net(seed).collect_params().values()]


def _conv_net_after_inference(seed, wait=True):
    """A conv net whose conv weights MXNet's CPU build holds in an MKL-DNN layout after an
    inference-mode forward (the training network evaluated between epochs); with
    wait=False the forward (and the reorders it queues when it runs) may still be queued."""
    import mxnet as mx
    net = _conv_net(seed)
    out = net(mx.nd.ones((2, 3, 8, 8)))
    if wait:
        out.asnumpy()
        mx.nd.waitall()
    return [p.data() for p in net.collect_params().values()]


def _mkldnn_build():
    import mxnet as mx
    return mx.runtime.Features().is_enabled("MKLDNN")


@pytest.mark.skipif(not _mkldnn_build(), reason="needs MXNet's CPU build with MKL-DNN")
def test_weights_after_inference_are_in_an_mkldnn_layout(native):  # noqa: F811
    """Proves the layout the tests below meet: after an inference forward, the raw scatter
    operator (its arrays are inputs and outputs, without the wrapper's reorder) fails on a
    conv weight with MXNet's MKL-DNN message; scatter_, which reorders them first, writes
    them."""
    import mxnet as mx
    probe = _conv_net_after_inference(seed=4)[0]
    with pytest.raises(mx.base.MXNetError, match="MKLDNN"):
        mx.nd.odsgd_scatter(mx.nd.zeros((probe.size,)), probe, out=probe, num_arrays=1)
        mx.nd.waitall()
    values = _conv_net_weights(seed=4)
    targets = _conv_net_after_inference(seed=5)
    native.scatter_(_nd(_flat(values)), targets)
    for target, value in zip(targets, values):
        np.testing.assert_array_equal(target.asnumpy(), value)


@pytest.mark.skipif(not _mkldnn_build(), reason="needs MXNet's CPU build with MKL-DNN")
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("finished", [True, False])
def test_weights_in_mkldnn_layouts_need_no_wait(native, monkeypatch, finished,  # noqa: F811
                                                setting):
    """Weights after an inference forward of a conv net go through multi_update_ (every kind)
    with no layout wait and equal the reference. With lam != 0 local_flat is first made from
    them with gather_ (as the store fills it), which reads an MKL-DNN layout through a copy
    inside the engine, without a wait either. finished=True: the forward has run, so the conv
    weights are in an MKL-DNN layout when the operators run; finished=False: the forward,
    and the reorders it queues when it runs, may still be queued."""
    import mxnet as mx
    _no_layout_wait(monkeypatch)
    lam, mode, with_local = SETTINGS[setting]
    rng = np.random.default_rng(_seed("mkldnn", finished, setting))
    common = dict(rescale_grad=0.5, clip_gradient=None, momentum=0.9, lam=lam, beta=0.9,
                  eps=1e-7)
    values = _conv_net_weights(seed=4)
    for kind in UPDATE_KINDS:
        weights = _conv_net_after_inference(seed=4, wait=finished)
        shapes = [v.shape for v in values]
        P, total = len(shapes), sum(v.size for v in values)
        local = native.gather_(weights, mx.nd.zeros((total,))) if with_local else None
        kind, _, previous = kind.partition("+")
        lrs, wds = [0.05 + 0.01 * k for k in range(P)], [0.01] * P
        own, prev, decays = _estimates(rng, P, True)
        W = [(v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32) for v in values]
        W_prev = [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        state = [(0.1 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        state_flat = _nd(_flat(state))
        v = [np.zeros(s, np.float32) for s in shapes]
        var_flat = _nd(_flat(v)) if mode == "adaptive" else None
        expected = _reference_steps(kind, previous, values, W, W_prev, grads, state, lrs, wds,
                                    own, prev, decays, dict(common, mode=mode), v)
        native.multi_update_(kind, weights, [_nd(g) for g in grads], _nd(_flat(W)), lrs=lrs,
                             wds=wds, var_flat=var_flat, local_flat=local,
                             adaptive=mode == "adaptive", **_state_arguments(
                                 kind, previous, state_flat, W_prev, own, prev, decays),
                             **common)
        for k in range(P):
            np.testing.assert_allclose(weights[k].asnumpy(), expected[k], rtol=RTOL,
                                       atol=ATOL, err_msg="%s array %d" % (kind, k))
        if local is not None:
            _assert_local_is_weights(local, weights, kind)


@pytest.mark.skipif(not _mkldnn_build(), reason="needs MXNet's CPU build with MKL-DNN")
@pytest.mark.parametrize("setting", ["lam=0", "lam=0.5 adaptive"])
def test_updates_between_inference_and_training_forwards(native, monkeypatch,  # noqa: F811
                                                         setting):
    """Training with evaluation in between and no wait anywhere: each round an inference
    forward (which reorders the conv weights into MKL-DNN layouts when it runs), a local
    update of every weight, a training forward and backward (which reorders them back),
    another update. local_flat (lam != 0) is gathered from the weights once, before the
    first update, and kept by the operator. After eight updates the weights equal the
    reference."""
    import mxnet as mx
    _no_layout_wait(monkeypatch)
    lam, mode, with_local = SETTINGS[setting]
    net = _conv_net(seed=7)
    weights = [p.data() for p in net.collect_params().values()]
    w = _conv_net_weights(seed=7)
    shapes = [a.shape for a in w]
    P, total = len(shapes), sum(a.size for a in w)
    rng = np.random.default_rng(8)
    common = dict(rescale_grad=0.5, clip_gradient=None, momentum=0.9, lam=lam, beta=0.9,
                  eps=1e-7)
    lrs, wds = [0.05] * P, [0.01] * P
    mom, v = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    mom_flat = mx.nd.zeros((total,))
    var_flat = mx.nd.zeros((total,)) if mode == "adaptive" else None
    local = native.gather_(weights, mx.nd.zeros((total,))) if with_local else None
    data = mx.nd.array(rng.standard_normal((2, 3, 8, 8)))
    for t in range(8):
        W = [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in w]
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        if t % 2 == 0:
            net(data)                                   # inference forward
        else:
            with mx.autograd.record():
                loss = net(data).sum()
            loss.backward()                             # training forward and backward
        native.multi_update_("sgd", weights, [_nd(g) for g in grads], _nd(_flat(W)),
                             mom_flat=mom_flat, var_flat=var_flat, local_flat=local, lrs=lrs,
                             wds=wds, adaptive=mode == "adaptive", **common)
        w = _reference_steps("sgd", False, w, W, W, grads, mom, lrs, wds, None, None, None,
                             dict(common, mode=mode), v)
    for k in range(P):
        np.testing.assert_allclose(weights[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                   err_msg="array %d" % k)
    np.testing.assert_allclose(mom_flat.asnumpy(), _flat(mom), rtol=RTOL, atol=ATOL)
    if local is not None:
        _assert_local_is_weights(local, weights, "after eight updates")


# ------------------------------------------------------------------------------------------
# 'predict' for the global optimizer NAG (docs/predict.md)

def _nag_kernel(W, grad_sum, mom, **options):
    """mx.nd.nag_mom_update, MXNet's own NAG kernel, on copies: (W', mom')."""
    import mxnet as mx
    weight, state = _nd(W), _nd(mom)
    mx.nd.nag_mom_update(weight, _nd(grad_sum), state, out=weight, **options)
    return weight.asnumpy(), state.asnumpy()


@pytest.mark.parametrize("clip", [False, True])
def test_nag_reference_is_mxnets_nag(clip):
    """ref.global_nag_step equals MXNet 1.9.1's nag_mom_update (and mx.optimizer.NAG's update
    with momentum 0, plain sgd_update), clipping included: the servers' rule the NAG predict
    estimates."""
    import mxnet as mx
    rng = np.random.default_rng(_seed("nag-kernel", clip))
    W = rng.standard_normal(500).astype(np.float32)
    mom = rng.standard_normal(500).astype(np.float32)
    grad = (3.0 * rng.standard_normal(500)).astype(np.float32)
    options = dict(lr=0.1, wd=0.01, momentum=0.9, rescale_grad=0.5)
    if clip:
        options["clip_gradient"] = 0.8
    expected_W, expected_mom = _nag_kernel(W, grad, mom, **options)
    m = mom.copy()
    got = ref.global_nag_step(W, grad, m, rescale_grad=0.5, lr=0.1, momentum=0.9, wd=0.01,
                              clip_gradient=0.8 if clip else None)
    np.testing.assert_allclose(got, expected_W, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(m, expected_mom, rtol=RTOL, atol=ATOL)
    # momentum 0: mx.optimizer.NAG keeps no state and applies sgd_update
    optimizer = mx.optimizer.NAG(learning_rate=0.1, momentum=0.0, wd=0.01, rescale_grad=0.5,
                                 clip_gradient=0.8 if clip else None)
    weight = _nd(W)
    optimizer.update(0, weight, _nd(grad), optimizer.create_state(0, weight))
    got = ref.global_nag_step(W, grad, np.zeros_like(W), rescale_grad=0.5, lr=0.1, momentum=0.0,
                              wd=0.01, clip_gradient=0.8 if clip else None)
    np.testing.assert_allclose(got, weight.asnumpy(), rtol=RTOL, atol=ATOL)


def test_nag_estimate_recovers_the_servers_state():
    """The estimate rule of ref.nag_predict_step, fed the global weights of MXNet's own NAG
    kernel run with changing rates (0 included) and wd, recovers the kernel's state: to
    float32 rounding from a zero start, and from a wrong start with its error shrinking by
    mu / (1 + mu) a step."""
    rng = np.random.default_rng(3)
    mu = 0.9
    W = rng.standard_normal(300).astype(np.float32)
    state = np.zeros_like(W)
    est, wrong = np.zeros_like(W), np.ones_like(W)
    errors = []
    for t, lr in enumerate([0.1, 0.05, 0.0, 0.2, 0.1, 0.1, 0.02, 0.1]):
        W_prev = W
        W, state = _nag_kernel(W, rng.standard_normal(300).astype(np.float32), state, lr=lr,
                               wd=0.01, momentum=mu, rescale_grad=0.5)
        for e in (est, wrong):   # the estimate part of the rule alone (lr, grad irrelevant)
            ref.nag_predict_step(W, W, W_prev, np.zeros_like(W), e, np.zeros_like(W),
                                 rescale_grad=1.0, lr=0.0, momentum=mu, wd=0.0,
                                 prev_decay=lr * 0.01, lam=0.0, num_workers=1)
        np.testing.assert_allclose(est, state, rtol=1e-5, atol=1e-6, err_msg="step %d" % t)
        errors.append(np.abs(wrong - state).max())
    np.testing.assert_allclose(errors, [(mu / (1 + mu)) ** (t + 1) for t in range(8)],
                               rtol=1e-3)


def test_nag_predict_is_nag_applied_to_n_times_the_gradient():
    """With the estimate right before the step (est = the servers' state of W_{t-1}), the
    step's estimate is the servers' state of W_t and the prediction is MXNet's NAG step on
    W_t with the gradient sum N * g (lam = 0), at another rate than the round before."""
    rng = np.random.default_rng(4)
    W_prev = rng.standard_normal(200).astype(np.float32)
    state_prev = rng.standard_normal(200).astype(np.float32)
    W, state = _nag_kernel(W_prev, rng.standard_normal(200).astype(np.float32), state_prev,
                           lr=0.1, wd=0.01, momentum=0.9, rescale_grad=0.5)
    grad = rng.standard_normal(200).astype(np.float32)
    est = state_prev.copy()
    predicted = ref.nag_predict_step(W, W, W_prev, grad, est, np.zeros_like(W), rescale_grad=0.5,
                                     lr=0.05, momentum=0.9, wd=0.01, prev_decay=0.1 * 0.01,
                                     lam=0.0, num_workers=3)
    np.testing.assert_allclose(est, state, rtol=1e-5, atol=1e-6)
    expected, _ = _nag_kernel(W, 3 * grad, state, lr=0.05, wd=0.01, momentum=0.9,
                              rescale_grad=0.5)
    np.testing.assert_allclose(predicted, expected, rtol=RTOL, atol=ATOL)


NAG_OPTIONS = list(itertools.product(["constant", "adaptive"], [False, True], [False, True]))


@pytest.mark.parametrize("mode,clip,previous", NAG_OPTIONS)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_multi_nag_predict_matches_reference(native, group, mode, clip, previous):  # noqa: F811
    """Kind 'nag_predict', lam != 0: every array k with its own lr, wd and estimate of the
    round's sum (with and without the previous round's), w_t from local_flat and the weights
    NaN before every call, the estimate and v carried over STEPS steps, against the NumPy
    reference; and the NDArray fallback of odsgd.worker.local_update on the same inputs."""
    import mxnet as mx
    from odsgd.worker.local_update import ndarray_nag_predict_update_
    shapes = GROUPS[group]
    P = len(shapes)
    rng = np.random.default_rng(_seed("nag", group, mode, clip, previous))
    lrs = [float(x) for x in rng.uniform(0.01, 0.2, P)]
    wds = [float(x) for x in rng.choice([0.0, 0.01, 0.05], P)]
    own, prev, decays = _estimates(rng, P, True)
    prev = prev if previous else [None] * P
    common = dict(rescale_grad=0.5, clip_gradient=0.8 if clip else None, momentum=0.9,
                  lam=0.5, beta=0.9, eps=1e-7)
    W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    w = [(a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    W_prev = [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    est = [np.zeros(s, np.float32) for s in shapes]
    v = [np.zeros(s, np.float32) for s in shapes]
    weights = [_nd(a) for a in w]
    fallback = [_nd(a) for a in w]
    total = sum(a.size for a in w)
    local_flat = _nd(_flat(w))
    est_flat = _nd(np.zeros(total, np.float32))
    est_fallback = [mx.nd.zeros(s) for s in shapes]
    var_flat = _nd(_flat(v)) if mode == "adaptive" else None
    var_fallback = [mx.nd.zeros(s) for s in shapes]
    for t in range(STEPS):
        grads_np = [(2.0 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        for k in range(P):
            w[k] = ref.nag_predict_step(w[k], W[k], W_prev[k], grads_np[k], est[k], v[k],
                                        lr=lrs[k], wd=wds[k], prev_decay=decays[k],
                                        num_workers=3, mode=mode, own_scale=own[k],
                                        prev_scale=prev[k], **common)
        _nan_weights(weights)
        returned = native.multi_update_("nag_predict", weights, [_nd(g) for g in grads_np],
                                        _nd(_flat(W)), prev_global_flat=_nd(_flat(W_prev)),
                                        est_flat=est_flat, var_flat=var_flat,
                                        local_flat=local_flat,
                                        lrs=lrs, wds=wds, prev_decays=decays, own_scales=own,
                                        prev_scales=prev if previous else None,
                                        adaptive=mode == "adaptive",
                                        num_workers=3, **common)
        assert returned is weights
        for k in range(P):
            ndarray_nag_predict_update_(fallback[k], _nd(grads_np[k]), _nd(W[k]),
                                        _nd(W_prev[k]), est_fallback[k], var_fallback[k],
                                        lr=lrs[k], wd=wds[k], prev_decay=decays[k],
                                        num_workers=3, own_scale=own[k], prev_scale=prev[k],
                                        adaptive=mode == "adaptive", **common)
        for k in range(P):
            np.testing.assert_allclose(weights[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                       err_msg="weight %d, step %d" % (k, t))
            np.testing.assert_allclose(fallback[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                       err_msg="fallback weight %d, step %d" % (k, t))
        np.testing.assert_allclose(est_flat.asnumpy(), _flat(est), rtol=RTOL, atol=ATOL,
                                   err_msg="estimate, step %d" % t)
        np.testing.assert_allclose(_flat([e.asnumpy() for e in est_fallback]), _flat(est),
                                   rtol=RTOL, atol=ATOL, err_msg="fallback estimate")
        _assert_local_is_weights(local_flat, weights, "step %d" % t)
        if mode == "adaptive":
            np.testing.assert_allclose(var_flat.asnumpy(), _flat(v), rtol=RTOL, atol=ATOL,
                                       err_msg="var, step %d" % t)
        W_prev, W = W, [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]


@pytest.mark.parametrize("case,error,message", [
    ("without_est", TypeError, "kind 'nag_predict' needs est_flat"),
    ("without_prev", TypeError, "kind 'nag_predict' needs prev_global_flat"),
    ("predict_with_est", TypeError, "kind 'predict' does not use est_flat"),
    ("with_mom", TypeError, "kind 'nag_predict' does not use mom_flat"),
    ("without_decays", ValueError, "kind 'nag_predict' needs prev_decays"),
    ("decays_length", ValueError, "kind 'nag_predict' needs prev_decays"),
    ("predict_with_decays", TypeError, "kind 'predict' does not use prev_decays"),
])
def test_nag_predict_python_side_misuse_is_refused(native, case, error, message):  # noqa: F811
    weights, grads, global_flat, est = _group()
    kwargs = dict(COMMON, lrs=[0.1] * 3, wds=[0.0] * 3, prev_global_flat=global_flat,
                  est_flat=est, prev_decays=[0.0] * 3)
    kind = "nag_predict"
    if case == "without_decays":
        kwargs["prev_decays"] = None
    elif case == "decays_length":
        kwargs["prev_decays"] = [0.0] * 2
    elif case == "predict_with_decays":
        kind, kwargs["est_flat"] = "predict", None
    elif case == "without_est":
        kwargs["est_flat"] = None
    elif case == "without_prev":
        kwargs["prev_global_flat"] = None
    elif case == "predict_with_est":
        kind, kwargs["prev_decays"] = "predict", None
    else:
        kwargs["mom_flat"] = est
    with pytest.raises(error) as caught:
        native.multi_update_(kind, weights, grads, global_flat, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("case,message", [
    ("est_length", "'est_flat' has shape (11,) but must be 1-D of length 12"),
    ("est_is_global", "shares memory with"),
])
def test_nag_predict_operator_misuse_gets_a_clear_error(native, case, message):  # noqa: F811
    import mxnet as mx
    weights, grads, global_flat, est = _group()
    if case == "est_length":
        est = mx.nd.zeros((11,))
    else:
        est = global_flat
    with pytest.raises(mx.base.MXNetError) as caught:
        native.multi_update_("nag_predict", weights, grads, global_flat,
                             prev_global_flat=mx.nd.zeros((12,)), est_flat=est,
                             lrs=[0.1] * 3, wds=[0.0] * 3, prev_decays=[0.0] * 3, **COMMON)
        mx.nd.waitall()
    assert message in _last_extension_error(caught.value)


# ------------------------------------------------------------------------------------------
# The estimate of the round's gradient sum that takes the previous round (docs/predict.md)

def _sgd_kernel(W, grad_sum, mom, **options):
    """mx.nd.sgd_mom_update, MXNet's own SGD kernel (the servers'), on copies: (W', mom')."""
    import mxnet as mx
    weight, state = _nd(W), _nd(mom)
    mx.nd.sgd_mom_update(weight, _nd(grad_sum), state, out=weight, **options)
    return weight.asnumpy(), state.asnumpy()


@pytest.mark.parametrize("optimizer", ["sgd", "nag"])
def test_previous_round_sum_is_recovered(native, optimizer):  # noqa: F811
    """MXNet's own kernel (the servers) runs rounds t-2 and t-1 with known gradient sums and
    rates. A worker at step t whose state is the servers' (SGD: their momentum, the weight
    change W_{t-1} - W_{t-2}; NAG: the exact estimate) and whose estimate of round t's sum is
    the previous round's alone (own_scale 0, prev_scale lr_t / lr_{t-1}) predicts exactly the
    servers' round t with G_t = G_{t-1}, at rate lr_t: the fused operator, the NDArray
    fallback and the NumPy reference, and their state afterwards is the servers' after round
    t-1."""
    import mxnet as mx
    from odsgd.worker.local_update import ndarray_nag_predict_update_, ndarray_predict_update_
    rng = np.random.default_rng(_seed("previous-round", optimizer))
    n = 500
    kernel = _nag_kernel if optimizer == "nag" else _sgd_kernel
    options = dict(wd=0.01, momentum=0.9, rescale_grad=0.5)
    W_a = rng.standard_normal(n).astype(np.float32)
    state_a = (0.1 * rng.standard_normal(n)).astype(np.float32)
    grad_b = (3.0 * rng.standard_normal(n)).astype(np.float32)
    lr_b, lr_t = 0.08, 0.05
    W_b, state_b = kernel(W_a, rng.standard_normal(n).astype(np.float32), state_a, lr=0.1,
                          **options)
    W_t, state_t = kernel(W_b, grad_b, state_b, lr=lr_b, **options)
    expected, expected_state = kernel(W_t, grad_b, state_t, lr=lr_t, **options)

    worker_state = (W_b - W_a) if optimizer == "sgd" else state_b   # what the worker holds
    estimate = dict(own_scale=0.0, prev_scale=lr_t / lr_b)
    args = dict(rescale_grad=0.5, lr=lr_t, momentum=0.9, wd=0.01, lam=0.0, num_workers=2,
                **estimate)
    grad = rng.standard_normal(n).astype(np.float32)   # the worker's own: weight 0 here
    w = (W_t + 0.2 * rng.standard_normal(n)).astype(np.float32)
    est_ref, est_fused, est_fallback = worker_state.copy(), _nd(worker_state), _nd(worker_state)
    fused, fallback = _nd(w), _nd(w)
    kind = "nag_predict" if optimizer == "nag" else "predict"
    step = ref.nag_predict_step if optimizer == "nag" else ref.predict_step
    if optimizer == "nag":
        got = step(w, W_t, W_b, grad, est_ref, np.zeros(n, np.float32),
                   prev_decay=lr_b * 0.01, **args)
        ndarray_nag_predict_update_(fallback, _nd(grad), _nd(W_t), _nd(W_b), est_fallback,
                                    None, prev_decay=lr_b * 0.01, clip_gradient=None,
                                    adaptive=False, beta=0.9, eps=1e-7, **args)
    else:
        got = step(w, W_t, W_b, grad, np.zeros(n, np.float32), est=est_ref,
                   prev_decay=lr_b * 0.01, **args)
        ndarray_predict_update_(fallback, _nd(grad), _nd(W_t), _nd(W_b), None,
                                est=est_fallback, prev_decay=lr_b * 0.01, clip_gradient=None,
                                adaptive=False, beta=0.9, eps=1e-7, **args)
    native.multi_update_(kind, [fused], [_nd(grad)], _nd(W_t), prev_global_flat=_nd(W_b),
                         est_flat=est_fused, lrs=[lr_t], wds=[0.01], prev_decays=[lr_b * 0.01],
                         own_scales=[0.0], prev_scales=[lr_t / lr_b], rescale_grad=0.5,
                         clip_gradient=None, momentum=0.9, lam=0.0, adaptive=False, beta=0.9,
                         eps=1e-7, num_workers=2)
    mx.nd.waitall()
    for name, weight, state in (("reference", got, est_ref),
                                ("fused", fused.asnumpy(), est_fused.asnumpy()),
                                ("fallback", fallback.asnumpy(), est_fallback.asnumpy())):
        np.testing.assert_allclose(weight, expected, rtol=RTOL, atol=ATOL, err_msg=name)
        np.testing.assert_allclose(state, state_t, rtol=RTOL, atol=ATOL, err_msg=name)
    assert np.abs(expected_state - state_t).max() > 1e-3    # round t changed the state


@pytest.mark.parametrize("case,error,message", [
    ("predict_previous_without_est", TypeError,
     "kind 'predict' with prev_scales needs est_flat"),
    ("predict_previous_without_decays", ValueError,
     "kind 'predict' with prev_scales needs prev_decays"),
    ("prev_scales_length", ValueError, "prev_scales needs one number per array; got 2 for 3"),
    ("own_scales_length", ValueError, "own_scales needs one number per array; got 4 for 3"),
    ("sgd_with_own_scales", TypeError, "kind 'sgd' does not use own_scales"),
])
def test_estimate_python_side_misuse_is_refused(native, case, error, message):  # noqa: F811
    weights, grads, global_flat, est = _group()
    kwargs = dict(COMMON, lrs=[0.1] * 3, wds=[0.0] * 3, prev_global_flat=global_flat,
                  est_flat=est, prev_decays=[0.0] * 3, prev_scales=[0.5] * 3)
    kind = "predict"
    if case == "predict_previous_without_est":
        kwargs["est_flat"] = None
    elif case == "predict_previous_without_decays":
        kwargs["prev_decays"] = None
    elif case == "prev_scales_length":
        kwargs["prev_scales"] = [0.5] * 2
    elif case == "own_scales_length":
        kwargs["own_scales"] = [1.0] * 4
    else:
        kind, kwargs = "sgd", dict(COMMON, lrs=[0.1] * 3, wds=[0.0] * 3, mom_flat=est,
                                   own_scales=[1.0] * 3)
    with pytest.raises(error) as caught:
        native.multi_update_(kind, weights, grads, global_flat, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("case,message", [
    ("prev_scales_unread", "attribute 'prev_scales' is only read with previous=1"),
    ("prev_decays_unread", "attribute 'prev_decays' is only read with previous=1"),
    ("prev_scales_missing", "missing attribute 'prev_scales'"),
    ("est_length", "'est_flat' has shape (11,) but must be 1-D of length 12"),
])
def test_estimate_operator_misuse_gets_a_clear_error(native, case, message):  # noqa: F811
    """The predict operator called directly: a list it would not read is refused, one it reads
    is required, and est_flat is checked where it is read (previous=1)."""
    import mxnet as mx
    weights, grads, global_flat, prev = _group()
    est = mx.nd.zeros((11,) if case == "est_length" else (12,))
    attrs = dict(num_arrays=3, lrs=0.1, wds=0, local=0, rescale_grad=1, clip_gradient=-1,
                 momentum=0.9, lam=0, adaptive=0, beta=0.9, eps=1e-7, own_scales=2,
                 previous=0 if case.endswith("unread") else 1)
    if case in ("prev_scales_unread", "est_length"):
        attrs.update(prev_scales=0.5)
    if case != "prev_scales_unread":
        attrs.update(prev_decays=0.0)
    with pytest.raises(mx.base.MXNetError) as caught:
        mx.nd.odsgd_multi_predict_update(*grads, global_flat, prev, prev, mx.nd.zeros((1,)),
                                         est, out=weights, **attrs)
        mx.nd.waitall()
    assert message in _last_extension_error(caught.value)
