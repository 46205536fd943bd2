"""Python faces of the library operators: the multi-array local updates (one array is a
group of one), gather and scatter, and `accepts` (which arrays they take).

Every call goes straight to MXNet's C API (`MXImperativeInvokeEx`, the function behind every
`mx.nd.<op>`), with the operator handle looked up once and the attribute strings cached, so
that a multi-array call costs one dispatch plus building the list of array handles,
whatever the number of arrays. mxnet is imported inside the functions only.

Layouts (odsgd.native.layout): the updates pass the weights as outputs only, for every lam
(the old weights w_t, which only the compensation term reads, come from `local_flat`, the
caller's flat copy of them, which the same pass overwrites with w_{t+1}), and MXNet's engine
drops an MKL-DNN layout of such an output before the operator runs, so an update waits for
nothing. gather_ reads any layout (MXNet's dispatcher copies an input in an MKL-DNN layout
into the default one, inside the engine). scatter_, whose arrays are inputs too (for their
shapes), first puts them into the default layout with `layout.to_default_layout`, which waits
for their pending writes.
"""
import ctypes

from . import layout, loader

_op_handles = {}     # operator name -> op handle (ctypes.c_void_p)
_placeholders = {}   # (device_type, device_id) -> 1-element float32 array for unused inputs
_attr_cache = {}     # attribute values (tuple) -> (count, keys array, values array)
_ATTR_CACHE_SIZE = 64
_c = None            # ctypes pieces of MXNet's C API, bound on first use


def _c_api():
    global _c
    if _c is None:
        from mxnet.base import _LIB, NDArrayHandle, check_call
        _c = (_LIB, NDArrayHandle, check_call)
    return _c


def _op_handle(name):
    handle = _op_handles.get(name)
    if handle is None:
        loader.operator(name)          # RuntimeError naming the build when not loaded
        lib, _, check_call = _c_api()
        handle = ctypes.c_void_p()
        check_call(lib.NNGetOpHandle(ctypes.c_char_p(name.encode()), ctypes.byref(handle)))
        _op_handles[name] = handle
    return handle


def _number(x):
    # repr() of a Python float round-trips exactly, so the operator's float32 constants equal
    # np.float32(x) of the same values.
    return repr(float(x))


def _rate_list(values):
    """One number when all are equal (the operator applies it to every array), else all of
    them, comma-separated: the common case costs the same for any number of arrays."""
    first = values[0]
    if values.count(first) == len(values):
        return _number(first)
    return ",".join(map(_number, values))


def _attributes(items):
    """(count, char** keys, char** values) for `items`, a tuple of (key, value string)
    pairs, cached: hyper-parameters repeat from step to step."""
    cached = _attr_cache.get(items)
    if cached is None:
        if len(_attr_cache) >= _ATTR_CACHE_SIZE:
            _attr_cache.clear()
        keys = (ctypes.c_char_p * len(items))(*[k.encode() for k, _ in items])
        values = (ctypes.c_char_p * len(items))(*[v.encode() for _, v in items])
        cached = (len(items), keys, values)
        _attr_cache[items] = cached
    return cached


def _invoke(name, inputs, outputs, items):
    """Runs operator `name` on `inputs` (NDArray handles), writing into NDArrays `outputs`."""
    lib, ndarray_handle, check_call = _c_api()
    count, keys, values = _attributes(items)
    in_handles = (ndarray_handle * len(inputs))(*inputs)
    out_handles = (ndarray_handle * len(outputs))(*[a.handle for a in outputs])
    out_pointer = ctypes.cast(out_handles, ctypes.POINTER(ndarray_handle))
    num_outputs = ctypes.c_int(len(outputs))
    out_stypes = ctypes.POINTER(ctypes.c_int)()
    check_call(lib.MXImperativeInvokeEx(_op_handle(name), ctypes.c_int(len(inputs)),
                                        in_handles, ctypes.byref(num_outputs),
                                        ctypes.byref(out_pointer), ctypes.c_int(count), keys,
                                        values, ctypes.byref(out_stypes)))


def _placeholder(context):
    """A shared 1-element float32 array of `context`, passed where an operator input is not
    used (var outside adaptive mode). The operators neither read it nor declare it written,
    so sharing it creates no dependency between calls."""
    key = (context.device_type, context.device_id)
    array = _placeholders.get(key)
    if array is None:
        import mxnet as mx
        array = mx.nd.zeros((1,), ctx=context, dtype="float32")
        _placeholders[key] = array
    return array


def _common_items(rescale_grad, clip_gradient, momentum, lam, adaptive, beta, eps, local):
    """The shared attribute items of an update; `local`: the call reads w_t from local_flat
    (and writes w_{t+1} there)."""
    return (("rescale_grad", _number(rescale_grad)),
            ("clip_gradient", _number(clip_gradient if clip_gradient is not None else -1.0)),
            ("momentum", _number(momentum)), ("lam", _number(lam)),
            ("adaptive", "1" if adaptive else "0"), ("beta", _number(beta)),
            ("eps", _number(eps)), ("local", "1" if local else "0"))


# ------------------------------------------------------------------------------------------
# Which arrays the operators take

def accepts(arrays):
    """True when all of `arrays` (NDArrays) can go to the fused operators together.

    That is: the library is loaded, they share one context that it supports (CPU, or GPU
    when it was built with its CUDA kernels), and every one is float32 with default
    (dense) storage. Arrays in an MKL-DNN layout are accepted (see the module's docstring).
    For anything else (float16 weights, the float16 weights of a multi_precision setup,
    float64, sparse arrays, mixed contexts) it returns False and the caller uses the NDArray
    fallback, which computes the same formulas in the arrays' own dtype.

    Costs a few C calls per array: call it once when a group of parameters is formed and
    keep the answer (an NDArray's dtype, storage and context never change)."""
    if not arrays or not loader.is_loaded():
        return False
    context = arrays[0].context
    if not loader.supports(context):
        return False
    import numpy as np
    return all(a.context == context and a.dtype == np.float32 and a.stype == "default"
               for a in arrays)


# ------------------------------------------------------------------------------------------
# One array: the multi-array operators with P = 1

def local_update_(weight, grad, global_weight, mom, var, *, rescale_grad, clip_gradient, lr,
                  momentum, wd, lam, adaptive, beta, eps):
    """The local SGD step of OD-SGD (docs/spec.md, section 4), fused, in place, on one array: the
    multi-array operator with P = 1 (`multi_update_('sgd', [weight], ...)`).

    Per element, in float32, in one pass over memory::

        g    = clip(rescale_grad * grad, -clip_gradient, clip_gradient)   # clip if > 0
        v    = beta * v + (1 - beta) * g * g;  c = 1 / sqrt(v + eps)      # adaptive
        c    = 1                                                          # otherwise
        step = g + wd * W + lam * c * g * g * (W - w)
        mom  = momentum * mom - lr * step
        w    = W + mom

    Parameters
    ----------
    weight : NDArray, float32, any shape S
        w_t on entry, w_{t+1} on return (updated in place). May be in an MKL-DNN layout: the
        operator only writes it; with lam != 0 w_t is first copied into a flat array
        (`gather_`, which reads any layout), which the operator reads as `local_flat`.
    grad : NDArray, float32, shape S
        The worker's raw gradient grad_t (before rescale_grad).
    global_weight : NDArray, float32, S.size elements
        W_t, the newest global weights the worker holds. Read only.
    mom : NDArray, float32, S.size elements
        The worker's momentum m for this key (starts at 0); updated in place.
    var : NDArray, float32, S.size elements, or None
        The adaptive mode's v (starts at 0); updated in place when `adaptive`. When not
        adaptive it is never touched: None (or any float32 array) will do.
    rescale_grad : float
        r, multiplies grad (what Trainer.step(batch_size) sets: 1 / batch_size).
    clip_gradient : float or None
        Bound of the rescaled gradient; None or <= 0 turns clipping off.
    lr, momentum, wd : float
        The local optimizer's learning rate (after its schedule), momentum mu_l, weight decay.
    lam : float
        Compensation strength; 0 turns the compensation term off.
    adaptive : bool
        True: c = 1 / sqrt(v + eps) ('adaptive' mode); False: c = 1 ('constant').
    beta, eps : float
        Decay of v and the term added under the square root (read only when adaptive).

    Returns
    -------
    NDArray
        `weight` itself.

    global_weight, mom and var are passed as flat views (same memory) of themselves, so any
    shape with the weight's number of elements will do. All arrays share one context and
    must not overlap in memory (global_weight may be any read-only array). Raises MXNetError
    for other dtypes or sizes, naming the array as `multi_update_` does; requires `load()`.
    """
    return _one_array("sgd", "local_update_", weight, grad, (global_weight, mom), var, adaptive,
                      lam, _rate_items([lr], [wd]), dict(
                          rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                          momentum=momentum, beta=beta, eps=eps))


def predict_update_(weight, grad, global_weight, prev_global_weight, var, *, rescale_grad,
                    clip_gradient, lr, momentum, wd, lam, adaptive, beta, eps, num_workers):
    """The 'predict' local step of OD-SGD (docs/spec.md, section 4), fused, in place, on one array:
    the multi-array operator with P = 1 (`multi_update_('predict', [weight], ...)`).

    Predicts the global SGD update that has not arrived yet. Per element, in float32::

        g, c as in `local_update_` (v updated first when adaptive)
        gc = g + lam * c * g * g * (W - w)
        w  = W + momentum * (W - W_prev) - lr * (num_workers * gc + wd * W)

    Parameters
    ----------
    weight : NDArray, float32, any shape S
        w_t on entry, w_{t+1} on return (any layout, as in local_update_).
    grad : NDArray, float32, shape S
        The worker's raw gradient grad_t.
    global_weight : NDArray, float32, S.size elements
        W_t, the newest global weights. Read only.
    prev_global_weight : NDArray, float32, S.size elements
        W_{t-1}; pass global_weight itself when no earlier global weights exist. Read only.
    var : NDArray, float32, S.size elements, or None
        v of the adaptive mode, updated in place when `adaptive`; None allowed otherwise.
    rescale_grad, clip_gradient, lam, adaptive, beta, eps
        As in `local_update_`.
    lr, momentum, wd : float
        The *global* optimizer's (SGD) current learning rate, momentum mu and weight decay.
    num_workers : int
        N, the number of workers whose gradients the global update sums (>= 1): the
        prediction's estimate of that sum is N * gc.

    Returns
    -------
    NDArray
        `weight` itself.
    """
    rates = _rate_items([lr], [wd]) + _estimate_items(
        "predict", 1, _own_scales(None, num_workers, 1, "predict_update_"), None, None)
    return _one_array("predict", "predict_update_", weight, grad,
                      (global_weight, prev_global_weight), var, adaptive, lam, rates, dict(
                          rescale_grad=rescale_grad, clip_gradient=clip_gradient,
                          momentum=momentum, beta=beta, eps=eps))


def _one_array(kind, caller, weight, grad, states, var, adaptive, lam, rates, hyper):
    """The operator of `kind` with P = 1; returns `weight`. `states` (W and mom or W_prev,
    any shapes) and var (when adaptive; else unused, and never reshaped) are passed as flat
    views of themselves; `rates` are the per-array attribute items, `hyper` the shared
    hyper-parameters but lam and adaptive. With lam != 0 local_flat is a flat copy of the
    weight made here (the caller keeps none). The predict's est_flat is unused here (no
    previous round): the placeholder."""
    context = weight.context
    var = _var_or_placeholder(var, context, adaptive, caller, "var")
    local = _flat_copy(weight) if float(lam) != 0.0 else _placeholder(context)
    views = _flat_views(states + (var,) if adaptive else states)
    flats = (views if adaptive else views + [var.handle]) + [local.handle]
    if kind == "predict":
        flats = flats + [_placeholder(context).handle]
    common = _common_items(lam=lam, adaptive=adaptive, local=float(lam) != 0.0, **hyper)
    try:
        _update(kind, [weight], [grad], flats, rates, common)
    finally:
        _free(views)
    return weight


def _flat_copy(array):
    """A new 1-D float32 array holding `array` (any layout) flattened: gather_ of it alone."""
    import mxnet as mx
    return gather_([array], mx.nd.empty((array.size,), ctx=array.context, dtype="float32"))


_FLAT = (ctypes.c_int64 * 1)(-1)


def _flat_views(arrays):
    """Handles of 1-D views of `arrays`, as the multi-array operators take the states: same
    memory and same MXNet engine variable, so writes through a view reach the array and are
    ordered with its other users. MXNet 1.9.1's C API directly (include/mxnet/c_api.h:
    MXNDArrayReshape64, what NDArray.reshape calls, and MXNDArrayFree in _free): an NDArray
    object per view, with NDArray.reshape's own checks, cost a third of a small update."""
    lib, ndarray_handle, check_call = _c_api()
    views = []
    try:
        for array in arrays:
            views.append(ndarray_handle())
            check_call(lib.MXNDArrayReshape64(array.handle, 1, _FLAT, False,
                                              ctypes.byref(views[-1])))
    except Exception:
        _free(views[:-1])
        raise
    return views


def _free(handles):
    """Frees view handles from _flat_views. An operator already pushed with them keeps its
    own references to the arrays (MXNet's engine copies the NDArrays it runs on)."""
    lib, _, check_call = _c_api()
    for handle in handles:
        check_call(lib.MXNDArrayFree(handle))


def _var_or_placeholder(var, context, adaptive, caller, name):
    if var is not None:
        return var
    if adaptive:
        raise TypeError("odsgd.native.%s: %s is required when adaptive is true (an array "
                        "holding v, laid out like the weights)" % (caller, name))
    return _placeholder(context)


# ------------------------------------------------------------------------------------------
# Multi-array operators

def multi_update_(kind, weights, grads, global_flat, *, prev_global_flat=None, mom_flat=None,
                  var_flat=None, local_flat=None, est_flat=None, lrs, wds, prev_decays=None,
                  own_scales=None, prev_scales=None, rescale_grad, clip_gradient, momentum,
                  lam, adaptive, beta, eps, num_workers=1):
    """The local step of OD-SGD (docs/spec.md, section 4) on P arrays at once: one operator call.

    The per-element math is `local_update_`'s (kind 'sgd') or `predict_update_`'s (kind
    'predict'; both are this function with P = 1), array k with lr = lrs[k] and wd = wds[k].
    Kind 'nag_predict' is the 'predict' step for the global optimizer NAG (docs/predict.md),
    per element in float32::

        g, c, gc as in `predict_update_` (v updated first when adaptive)
        dW  = W - W_prev
        m   = est;  est = (dW + momentum * est) / (1 + momentum) - prev_decay * dW
        a   = momentum * est;  d = own_scale * gc + wd * W
        w   = (W - a) + (1 + momentum) * (a - lr * d)

    with 1 + momentum formed in float32 (as MXNet's nag_mom_update does).

    The predicts estimate the sum of the workers' gradients of the round by own_scale * gc
    (own_scales[k]; default num_workers, the estimate N * gc). With `prev_scales` the estimate
    also takes the previous round's sum G_{t-1} (docs/predict.md, "The estimate of the
    gradient sum"), recovered from the worker's copy of the servers' state::

        'predict':      P = momentum * est - dW - prev_decay * W_prev;  est = dW
                        w = W + momentum * dW - lr * (own_scale * gc + wd * W) - prev_scale * P
        'nag_predict':  P = momentum * m - est - prev_decay * W   (est after its update)
                        w = (W - a) + (1 + momentum) * (a - lr * d - prev_scale * P)

    P is lr_{t-1} * G_{t-1} of the servers' round that produced W from W_prev (exact when est
    is the servers' state), so prev_scale is the weight of G_{t-1} times lr_t / lr_{t-1}.

    The flat layout: array k of n_k elements occupies [off_k, off_k + n_k) of a 1-D float32
    array of length N = n_0 + ... + n_{P-1} (off_0 = 0, arrays in the order given, each
    flattened in C order), as `gather_` writes it.

    Parameters
    ----------
    kind : {'sgd', 'predict', 'nag_predict'}
    weights : list of P NDArrays, float32, any shapes, one context
        Receive w_{t+1}. Outputs only, never read, for every lam (any layout: see the
        module's docstring), so the call does not wait for their pending writes.
    grads : list of P NDArrays, float32, shaped like the weights
        Raw gradients (before rescale_grad). Read only.
    global_flat : NDArray, float32, (N,)
        W_t of the P arrays, flat layout. Read only.
    prev_global_flat : NDArray, float32, (N,)
        'predict' and 'nag_predict' only (required): W_{t-1}, flat layout; may be
        global_flat itself when no earlier global weights exist. Read only.
    mom_flat : NDArray, float32, (N,)
        'sgd' only (required): the momentum m, flat layout; updated in place.
    var_flat : NDArray, float32, (N,), or None
        v of the adaptive mode, flat layout, updated in place; required when `adaptive`.
    local_flat : NDArray, float32, (N,), or None
        w_t of the P arrays, flat layout (the caller's own copy of the weights, e.g. made
        once with `gather_`), which the compensation term reads; the same pass writes
        w_{t+1} into it as into the weights, so it stays their copy. Required when lam != 0;
        with lam = 0 it is kept up to date when given, and unused otherwise (the term is 0).
    est_flat : NDArray, float32, (N,)
        The worker's copy of the servers' optimizer state after the round that produced W,
        flat layout, updated in place: 'nag_predict' (required) the estimate of the NAG
        state (starts at 0); 'predict' with prev_scales (required, else refused) the last
        change of the global weights, SGD's momentum.
    lrs, wds : sequences of P floats
        Per-array learning rate and weight decay ('sgd': the local optimizer's; 'predict':
        the global optimizer's lr x lr_mult and wd x wd_mult, as the servers apply them).
    prev_decays : sequence of P floats
        Where est_flat is used (required there, refused elsewhere): per array, lr x wd
        (multipliers included) of the servers' round that produced W from W_prev.
    own_scales : sequence of P floats, or None
        The predicts: the weight of the worker's gc in the estimate of the round's gradient
        sum; None: num_workers for every array.
    prev_scales : sequence of P floats, or None
        The predicts: the weight of P above (0 for an array whose previous round is not
        known); None: the estimate does not use the previous round.
    rescale_grad, clip_gradient, momentum, lam, adaptive, beta, eps
        As in `local_update_` (momentum: the local mu_l for 'sgd', the global mu for
        'predict' and 'nag_predict').
    num_workers : int
        'predict' and 'nag_predict': N, the number of workers (>= 1).

    Returns
    -------
    list
        `weights` itself.

    Raises
    ------
    ValueError, TypeError
        A wrong kind, P = 0, lists of different lengths, a required flat array or list
        missing (local_flat with lam != 0) or one given that the call does not use.
        MXNetError (raised here, synchronously): a dtype other than float32, shapes that do
        not match, a flat array of the wrong length. Arrays whose memory overlaps are refused
        when the operator runs (raised at the next wait on a written array).
    """
    num = _check_arrays(kind, weights, grads, lrs, wds)
    aux = _check_aux(kind, prev_global_flat, mom_flat)
    previous = prev_scales is not None
    uses_est = kind == "nag_predict" or (kind == "predict" and previous)
    _check_est(kind, uses_est, est_flat, prev_decays, num)
    rates = _rate_items(lrs, wds)
    if kind == "sgd":
        for name, value in (("est_flat", est_flat), ("prev_decays", prev_decays),
                            ("own_scales", own_scales), ("prev_scales", prev_scales)):
            if value is not None:
                raise TypeError("odsgd.native.multi_update_: kind 'sgd' does not use %s; pass "
                                "None" % name)
    else:
        own = _own_scales(own_scales, num_workers, num, "multi_update_")
        rates += _estimate_items(kind, num, own, prev_scales, prev_decays if uses_est else None)
    if local_flat is None and float(lam) != 0.0:
        raise TypeError("odsgd.native.multi_update_: lam=%r reads the old weights w_t, and the "
                        "weights are outputs only: pass local_flat (w_t, flat layout, e.g. "
                        "made once with gather_)" % (lam,))
    context = global_flat.context
    var_flat = _var_or_placeholder(var_flat, context, adaptive, "multi_update_", "var_flat")
    local = local_flat if local_flat is not None else _placeholder(context)
    flats = [global_flat.handle, aux.handle, var_flat.handle, local.handle]
    if kind != "sgd":
        flats.append((est_flat if uses_est else _placeholder(context)).handle)
    return _update(kind, weights, grads, flats, rates, _common_items(
        rescale_grad, clip_gradient, momentum, lam, adaptive, beta, eps,
        local=local_flat is not None))


def _check_arrays(kind, weights, grads, lrs, wds):
    """P, after checking the kind and that every per-array list has P entries."""
    if kind not in ("sgd", "predict", "nag_predict"):
        raise ValueError("odsgd.native.multi_update_: kind must be 'sgd' or 'predict' (or "
                         "'nag_predict': 'predict' for the global optimizer NAG), got %r"
                         % (kind,))
    num = len(weights)
    if num == 0:
        raise ValueError("odsgd.native.multi_update_: no arrays (P = 0); call it with at "
                         "least one weight")
    if not len(grads) == len(lrs) == len(wds) == num:
        raise ValueError("odsgd.native.multi_update_: weights, grads, lrs and wds must have "
                         "one entry per array; got %d, %d, %d, %d"
                         % (num, len(grads), len(lrs), len(wds)))
    return num


def _check_aux(kind, prev_global_flat, mom_flat):
    """The kind's second flat input: mom_flat ('sgd') or prev_global_flat (the predicts)."""
    if kind == "sgd":
        aux, unused = mom_flat, ("prev_global_flat", prev_global_flat)
        if mom_flat is None:
            raise TypeError("odsgd.native.multi_update_: kind 'sgd' needs mom_flat (the "
                            "momentum, flat layout)")
    else:
        aux, unused = prev_global_flat, ("mom_flat", mom_flat)
        if prev_global_flat is None:
            raise TypeError("odsgd.native.multi_update_: kind %r needs "
                            "prev_global_flat (W_{t-1}, flat layout; global_flat itself at "
                            "the first step)" % (kind,))
    if unused[1] is not None:
        raise TypeError("odsgd.native.multi_update_: kind %r does not use %s; pass None"
                        % (kind, unused[0]))
    return aux


def _check_est(kind, uses_est, est_flat, prev_decays, num):
    """est_flat and prev_decays are required where the call uses them, refused elsewhere."""
    why = "the estimate of the servers' NAG state" if kind == "nag_predict" else \
        "the last change of the global weights"
    if uses_est and est_flat is None:
        raise TypeError("odsgd.native.multi_update_: kind %r%s needs est_flat (%s, flat "
                        "layout)" % (kind, " with prev_scales" if kind == "predict" else "", why))
    if uses_est and (prev_decays is None or len(prev_decays) != num):
        raise ValueError("odsgd.native.multi_update_: kind %r%s needs prev_decays, one number "
                         "per array; got %s" % (kind, " with prev_scales" if kind == "predict"
                                                else "", "none" if prev_decays is None
                                                else len(prev_decays)))
    if not uses_est and kind != "sgd":
        for name, value in (("est_flat", est_flat), ("prev_decays", prev_decays)):
            if value is not None:
                raise TypeError("odsgd.native.multi_update_: kind %r does not use %s without "
                                "prev_scales; pass None" % (kind, name))


def _own_scales(own_scales, num_workers, num, caller):
    """own_scales as given (P numbers), else num_workers for every array (the estimate N gc)."""
    if own_scales is not None:
        if len(own_scales) != num:
            raise ValueError("odsgd.native.%s: own_scales needs one number per array; got %d "
                             "for %d arrays" % (caller, len(own_scales), num))
        return list(own_scales)
    if isinstance(num_workers, bool) or int(num_workers) != num_workers or num_workers < 1:
        raise ValueError("odsgd.native.%s: num_workers must be an integer >= 1, got %r"
                         % (caller, num_workers))
    return [float(num_workers)] * num


def _estimate_items(kind, num, own_scales, prev_scales, prev_decays):
    """The predicts' attribute items of the estimate of the round's gradient sum."""
    items = (("own_scales", _rate_list(list(own_scales))),
             ("previous", "1" if prev_scales is not None else "0"))
    if prev_scales is not None:
        if len(prev_scales) != num:
            raise ValueError("odsgd.native.multi_update_: prev_scales needs one number per "
                             "array; got %d for %d arrays" % (len(prev_scales), num))
        items += (("prev_scales", _rate_list(list(prev_scales))),)
    if prev_decays is not None:
        items += (("prev_decays", _rate_list(list(prev_decays))),)
    return items


def _rate_items(lrs, wds):
    return (("lrs", _rate_list(list(lrs))), ("wds", _rate_list(list(wds))))


def _update(kind, weights, grads, flats, rates, common):
    """Runs the operator of `kind` on checked arguments: `flats` are the handles of its flat
    inputs in order, `rates` the per-array attributes, `common` _common_items(...). The
    weights are outputs only: no layout check, no wait (MXNet drops an MKL-DNN layout of an
    output that is not also an input before the operator runs)."""
    items = (("num_arrays", str(len(weights))),) + rates + common
    _invoke(_MULTI_OPERATORS[kind], [a.handle for a in grads] + flats, weights, items)
    return weights


_MULTI_OPERATORS = {"sgd": "odsgd_multi_local_update", "predict": "odsgd_multi_predict_update",
                    "nag_predict": "odsgd_multi_nag_predict_update"}


def gather_(arrays, flat):
    """flat = the concatenation of `arrays`, each flattened in C order (the flat layout of
    `multi_update_`), in one operator call. Waits for nothing: MXNet's dispatcher reads an
    array in an MKL-DNN layout through a default-layout copy inside the engine.

    Parameters
    ----------
    arrays : list of P >= 1 NDArrays, float32, any shapes (any layout), one context. Read
        only.
    flat : NDArray, float32, (N,), N = the sum of their sizes; written.

    Returns `flat`. MXNetError for other dtypes or a wrong length."""
    if not arrays:
        raise ValueError("odsgd.native.gather_: no arrays; pass at least one")
    _invoke("odsgd_gather", [a.handle for a in arrays], (flat,),
            (("num_arrays", str(len(arrays))),))
    return flat


def scatter_(flat, arrays):
    """arrays[k][:] = flat[off_k:off_k+n_k].reshape(shape_k) for every k (the inverse of
    `gather_`), in one operator call.

    Parameters
    ----------
    flat : NDArray, float32, (N,). Read only.
    arrays : list of P >= 1 NDArrays, float32, any shapes (any layout), one context; written.

    Returns `arrays`. MXNetError for other dtypes or a wrong length."""
    if not arrays:
        raise ValueError("odsgd.native.scatter_: no arrays; pass at least one")
    layout.to_default_layout(arrays, flat.context)
    _invoke("odsgd_scatter", [flat.handle] + [a.handle for a in arrays], arrays,
            (("num_arrays", str(len(arrays))),))
    return arrays


def adam_predict_(W, W_prev, grad, m, v, own, weight, *, advance, rate_prev, rate, wd, scale,
                  clip_gradient, beta1, beta2, epsilon):
    """'predict' for a global Adam on one parameter in one pass (docs/predict.md, "Adam: the
    state recovered from the global steps"; the NumPy reference is
    tests/od_reference.py::adam_predict_step): advance m and v (before the round) by nothing
    (advance=0), by `own` (1) or by the gradient recovered from W_prev - W at rate_prev (2),
    then own = clip(scale * grad + wd * W) and weight = W - rate * m1 / (sqrt(v1) + epsilon).
    CPU, float32; every array holds the parameter's elements (any shapes and layouts).
    `weight` is an output only: no layout check, no wait (as `_update`). Returns `weight`."""
    items = (("advance", str(int(advance))), ("rate_prev", _number(rate_prev)),
             ("rate", _number(rate)), ("wd", _number(wd)), ("scale", _number(scale)),
             ("clip_gradient", _number(clip_gradient or -1.0)), ("beta1", _number(beta1)),
             ("beta2", _number(beta2)), ("epsilon", _number(epsilon)))
    _invoke("odsgd_adam_predict", [a.handle for a in (W, W_prev, grad, m, v, own)], (weight,),
            items)
    return weight
