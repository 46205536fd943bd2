"""The multi-array operators (odsgd.native.multi_update_, gather_, scatter_) against the NumPy
reference tests/od_reference.py, array by array, and their layout handling.

Tolerance as in test_fused_op.py (its docstring gives the reasoning): rtol 1e-5, atol 1e-6;
the send buffer is a copy and must be exact.
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


def _split(flat, shapes):
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[offset:offset + n].reshape(shape))
        offset += n
    return out


def _last_extension_error(err):
    lines = [line for line in str(err).splitlines() if line.strip().startswith("[")]
    return lines[-1] if lines else str(err)


OPTIONS = list(itertools.product(["sgd", "predict"], ["constant", "adaptive"], [False, True],
                                 [False, True]))


@pytest.mark.parametrize("kind,mode,clip,with_send", OPTIONS)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_multi_update_matches_reference(native, group, kind, mode, clip, with_send):  # noqa: F811
    """Every array k with its own lr and wd, states carried over STEPS steps, against the
    single-array reference formulas of SPEC.md section 2."""
    shapes = GROUPS[group]
    P = len(shapes)
    rng = np.random.default_rng(_seed(group, kind, mode, clip, with_send))
    lrs = [float(x) for x in rng.uniform(0.01, 0.2, P)]
    wds = [float(x) for x in rng.choice([0.0, 0.01, 0.05], P)]
    common = dict(rescale_grad=0.5, clip_gradient=0.8 if clip else None, momentum=0.9,
                  lam=0.5, beta=0.9, eps=1e-7)
    W = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    w = [(a + 0.3 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]
    W_prev = [a.copy() for a in W]
    m = [np.zeros(s, np.float32) for s in shapes]
    v = [np.zeros(s, np.float32) for s in shapes]
    weights = [_nd(a) for a in w]
    mom_flat = _nd(np.zeros(sum(a.size for a in w), np.float32))
    var_flat = _nd(_flat(v)) if mode == "adaptive" else None
    for t in range(STEPS):
        grads_np = [(2.0 * rng.standard_normal(s)).astype(np.float32) for s in shapes]
        send = _nd(np.full(mom_flat.shape, -7.0, np.float32)) if with_send else None
        for k in range(P):
            if kind == "sgd":
                w[k] = ref.local_sgd_step(w[k], W[k], grads_np[k], m[k], v[k], lr=lrs[k],
                                          wd=wds[k], mode=mode, **common)
            else:
                w[k] = ref.predict_step(w[k], W[k], W_prev[k], grads_np[k], v[k], lr=lrs[k],
                                        wd=wds[k], num_workers=3, mode=mode, **common)
        global_flat = _nd(_flat(W))
        flats = dict(mom_flat=mom_flat) if kind == "sgd" else dict(
            prev_global_flat=_nd(_flat(W_prev)), num_workers=3)
        returned = native.multi_update_(kind, weights, [_nd(g) for g in grads_np], global_flat,
                                        var_flat=var_flat, send_flat=send, lrs=lrs, wds=wds,
                                        adaptive=mode == "adaptive", **flats, **common)
        assert returned is weights
        for k in range(P):
            np.testing.assert_allclose(weights[k].asnumpy(), w[k], rtol=RTOL, atol=ATOL,
                                       err_msg="weight %d, step %d" % (k, t))
        if kind == "sgd":
            np.testing.assert_allclose(mom_flat.asnumpy(), _flat(m), rtol=RTOL, atol=ATOL,
                                       err_msg="mom, step %d" % t)
        if mode == "adaptive":
            np.testing.assert_allclose(var_flat.asnumpy(), _flat(v), rtol=RTOL, atol=ATOL,
                                       err_msg="var, step %d" % t)
        if with_send:
            np.testing.assert_array_equal(send.asnumpy(), _flat(grads_np))
        W_prev, W = W, [(a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32) for a in W]


def test_multi_update_equals_single_array_calls(native):  # noqa: F811
    """One multi-array call and P single-array calls give the same bits."""
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
                         lrs=lrs, wds=[0.0] * len(w), **common)
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
    else:
        kwargs["adaptive"] = True
    with pytest.raises(error) as caught:
        native.multi_update_(kind, weights, grads, global_flat, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("case,message", [
    ("float16", "only float32"),
    ("grad_shape", "grads[1] has shape (5,) but weights[1] has shape (4,)"),
    ("flat_length", "'global_flat' has shape (11,) but must be 1-D of length 12"),
    ("mom_is_global", "shares memory with"),
    ("weight_in_send", "shares memory with"),
])
def test_operator_misuse_gets_a_clear_error(native, case, message):  # noqa: F811
    import mxnet as mx
    weights, grads, global_flat, mom = _group()
    send = None
    if case == "float16":
        weights, grads, _, _ = _group(dtype="float16")
    elif case == "grad_shape":
        grads[1] = mx.nd.ones((5,))
    elif case == "flat_length":
        global_flat = mx.nd.zeros((11,))
    elif case == "mom_is_global":
        mom = global_flat
    else:
        send = mx.nd.zeros((12,))
        weights[2] = send[4:8]
    with pytest.raises(mx.base.MXNetError) as caught:
        native.multi_update_("sgd", weights, grads, global_flat, mom_flat=mom, send_flat=send,
                             lrs=[0.1] * 3, wds=[0.0] * 3, **COMMON)
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
        send = mx.nd.array(np.zeros(7, np.float32))
        native.multi_update_("sgd", weights, [mx.nd.array(a) for a in g], mx.nd.array(_flat(W)),
                             mom_flat=mom, send_flat=send, lrs=[0.1] * 4, wds=[0.0] * 4,
                             **COMMON)
        for k in (0, 3):
            m = np.zeros(shapes[k], np.float32)
            expected = ref.local_sgd_step(w[k], W[k], g[k], m, np.zeros_like(m), lr=0.1, wd=0.0,
                                          **{a: b for a, b in COMMON.items()
                                             if a != "adaptive"})
            np.testing.assert_allclose(weights[k].asnumpy(), expected, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(send.asnumpy(), _flat(g))
        assert weights[1].shape == (0,) and weights[2].shape == (2, 0)


# ------------------------------------------------------------------------------------------
# MKL-DNN layouts

def _conv_net_after_inference(seed):
    """A conv net whose conv weights MXNet's CPU build holds in an MKL-DNN layout after an
    inference-mode forward (the training network evaluated between epochs)."""
    import mxnet as mx
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, in_channels=3), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Conv2D(8, 3, in_channels=8), mx.gluon.nn.Flatten(),
            mx.gluon.nn.Dense(4, in_units=8 * 4 * 4))
    net.initialize(mx.init.Xavier())
    net(mx.nd.ones((2, 3, 8, 8))).asnumpy()
    mx.nd.waitall()
    return [p.data() for p in net.collect_params().values()]


def _mkldnn_build():
    import mxnet as mx
    return mx.runtime.Features().is_enabled("MKLDNN")


@pytest.mark.skipif(not _mkldnn_build(), reason="needs MXNet's CPU build with MKL-DNN")
def test_weights_in_mkldnn_layout_go_through_the_ops(native):  # noqa: F811
    """Two identical nets after an inference forward. Net A proves the layout: the raw
    operator, called without the wrappers' reorder, fails on its conv weight with MXNet's
    MKL-DNN message. Net B's arrays go through multi_update_ (and scatter_) and must equal
    the NDArray fallback of odsgd.local_update on copies of the same values."""
    import mxnet as mx
    from odsgd.local_update import ndarray_local_update_

    probe = _conv_net_after_inference(seed=4)[0]
    mom = mx.nd.zeros(probe.shape)
    with pytest.raises(mx.base.MXNetError, match="MKLDNN"):
        mx.nd.odsgd_local_update(probe, mx.nd.zeros(probe.shape), mx.nd.zeros(probe.shape),
                                 mom, mom, out=probe, rescale_grad=1, clip_gradient=-1, lr=0.1,
                                 momentum=0.9, wd=0, lam=0, adaptive=0, beta=0.9, eps=1e-7)
        mx.nd.waitall()

    weights = _conv_net_after_inference(seed=4)
    values = [w.asnumpy() for w in weights]     # asnumpy reads any layout
    rng = np.random.default_rng(6)
    grads = [rng.standard_normal(v.shape).astype(np.float32) for v in values]
    globals_ = [(v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32) for v in values]
    args = dict(rescale_grad=0.5, clip_gradient=None, momentum=0.9, lam=0.3, adaptive=False,
                beta=0.9, eps=1e-7)
    lrs = [0.05 + 0.01 * k for k in range(len(weights))]
    mom_flat = mx.nd.zeros((sum(v.size for v in values),))
    native.multi_update_("sgd", weights, [_nd(g) for g in grads], _nd(_flat(globals_)),
                         mom_flat=mom_flat, lrs=lrs, wds=[0.01] * len(weights), **args)
    mx.nd.waitall()
    for k, weight in enumerate(weights):
        expected, mom = _nd(values[k]), mx.nd.zeros(values[k].shape)
        ndarray_local_update_(expected, _nd(grads[k]), _nd(globals_[k]), mom, None, lr=lrs[k],
                              wd=0.01, **args)
        np.testing.assert_allclose(weight.asnumpy(), expected.asnumpy(), rtol=RTOL, atol=ATOL,
                                   err_msg="array %d" % k)

    # scatter_ writes arrays too: a fresh net's MKL-DNN-layout weights receive the values.
    targets = _conv_net_after_inference(seed=5)
    native.scatter_(_nd(_flat(values)), targets)
    for target, value in zip(targets, values):
        np.testing.assert_array_equal(target.asnumpy(), value)


def _failing_call(native, weights, grads, global_flat, send):
    """A call that the engine refuses when it runs it: mom_flat overlaps send_flat."""
    native.multi_update_("sgd", weights, grads, global_flat, mom_flat=send, send_flat=send,
                         lrs=[0.1] * 3, wds=[0.0] * 3, **COMMON)


def test_a_failure_inside_the_operator_surfaces_at_the_next_call(native):  # noqa: F811
    """An error found when the engine runs the operator lands on its outputs, and MXNet 1.9
    raises it once, at the first wait on any of them: the next call on the same weights
    raises it in the caller's thread (before it pushes anything); a read of send_flat raises
    it as well (it is an output, so a push of it cannot go out with stale data)."""
    import mxnet as mx
    weights, grads, global_flat, _ = _group()
    _failing_call(native, weights, grads, global_flat, mx.nd.zeros((12,)))
    with pytest.raises(mx.base.MXNetError) as caught:
        native.multi_update_("sgd", weights, grads, global_flat, mom_flat=mx.nd.zeros((12,)),
                             lrs=[0.1] * 3, wds=[0.0] * 3, **COMMON)
    assert "shares memory with" in _last_extension_error(caught.value)

    weights, grads, global_flat, _ = _group()
    send = mx.nd.zeros((12,))
    _failing_call(native, weights, grads, global_flat, send)
    with pytest.raises(mx.base.MXNetError) as caught:
        send.asnumpy()
    assert "shares memory with" in _last_extension_error(caught.value)
