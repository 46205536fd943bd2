"""The quadratic job (jobs/quadratic_job.py) run as a real cluster, and an independent NumPy
simulation of docs/spec.md, section 4 on the same problem (jobs/quadratic_problem.py), with the
per-parameter rates the servers apply (lr_mult, wd_mult), schedules and parameters that start
training late."""
import numpy as np

import od_reference as ref
from odsgd.common.config import DEFAULT_COMPENSATION, DEFAULTS
from cluster import run_job
from jobs import quadratic_problem as problem

RTOL, ATOL = 2e-5, 2e-6   # float32 rounding over a dozen steps of O(1) values


def run(tmp_path, workers=2, servers=1, env=None, **options):
    """Runs the quadratic job; returns each rank's saved arrays."""
    args = ["--out", tmp_path]
    for name, value in options.items():
        args += ["--" + name.replace("_", "-"), value]
    run_job("quadratic_job.py", args, workers=workers, servers=servers, env=env)
    return [dict(np.load(tmp_path / ("rank%d.npz" % r))) for r in range(workers)]


def simulate(workers, steps, lr, momentum=0.0, wd=0.0, rescale=1.0 / problem.BATCH,
             warmup_steps=0, local_optimizer="predict", local_lr=None, local_momentum=0.0,
             local_wd=0.0, compensation=None, compensation_mode=None, clip=None,
             lr_at=None, lr_mults=(1.0, 1.0), wd_mults=(1.0, 1.0), lr_mults_at=None,
             trained_from=(0, 0), initial=None, optimizer="sgd", global_history=None,
             estimate=None):
    """NumPy simulation of OD-SGD on the quadratic problem. Returns per worker the local
    (weight, bias) after each step, and the final global (weight, bias).

    Parameter k (0: weight, 1: bias) uses lr * lr_mults[k] and wd * wd_mults[k] in the global
    update and in the local step ('predict': the global rates; 'sgd': local_lr and local_wd
    times the same multipliers). `lr_at(t)`: the global rate of step t; `lr_mults_at(t)`: the
    multipliers of step t when they change. Parameter k is trained from step trained_from[k]
    on; before that neither the servers nor the workers change it.

    optimizer 'nag': the servers run MXNet 1.9.1's NAG (ref.global_nag_step) and 'predict'
    is its NAG rule (ref.nag_predict_step): each worker's estimate of the servers' state
    starts at 0 and is advanced at each of its OD steps with lr x wd of the servers' previous
    round. global_history: a list that receives the global (weight, bias) after every step.

    estimate: 'predict''s estimate of the round's gradient sum (ODSGD_PREDICT_ESTIMATE; None:
    the store's default), see `estimate_scales`. For 'previous' every worker keeps, per
    parameter, its copy of the servers' state (SGD: the last weight change, from 0 at its
    first OD step; NAG: the estimate above) and takes the previous round's sum where its
    previous step of that parameter was an OD step whose rate was not 0.

    compensation, compensation_mode: lam and its mode; None: the store's defaults, which for
    'predict' depend on the global optimizer (NAG's measured default, config.py)."""
    lr_at = lr_at or (lambda t: lr)
    lr_mults_at = lr_mults_at or (lambda t: lr_mults)
    estimate = estimate or DEFAULTS["predict_estimate"]
    # lam and its mode where none is given: the store's (config.DEFAULT_COMPENSATION applies
    # to 'predict' with that global optimizer, as ODSGDConfig.compensation_for decides)
    lam, mode = DEFAULT_COMPENSATION.get(optimizer, (0.0, "constant")) \
        if local_optimizer == "predict" and compensation is None else (0.0, "constant")
    if compensation is None and compensation_mode not in (None, mode):
        lam = 0.0   # a default lam belongs to the mode it was measured in
    compensation = lam if compensation is None else compensation
    compensation_mode = compensation_mode or mode
    W = [a.copy() for a in (initial or problem.initial_weights())]
    W_prev = [a.copy() for a in W]
    mom_global = [np.zeros_like(a) for a in W]
    local = [[a.copy() for a in W] for _ in range(workers)]
    m = [[np.zeros_like(a) for a in W] for _ in range(workers)]
    est = [[np.zeros_like(a) for a in W] for _ in range(workers)]
    v = [[np.zeros_like(a) for a in W] for _ in range(workers)]
    history = [[[], []] for _ in range(workers)]
    # the adaptive families' states: the servers', and each worker's estimate of them
    families = ref.ADAPTIVE_STEPS.get(optimizer, (None, ()))[1]
    state_global = [[np.zeros_like(a) for _ in families] for a in W]
    state_local = [[[np.zeros_like(a) for _ in families] for a in W] for _ in range(workers)]
    own = [[[np.zeros_like(a)] for a in W] for _ in range(workers)]
    for t in range(steps):
        grads = [problem.gradients(local[i][0], local[i][1], *problem.batch(i, t))
                 for i in range(workers)]
        lr_mult = lr_mults_at(t)
        trained = [t >= trained_from[k] for k in range(2)]
        if optimizer in ref.ADAPTIVE_STEPS:
            new_W = [adaptive_step(optimizer, W[k], sum(g[k] for g in grads), state_global[k],
                                   rescale, lr_at(t) * lr_mult[k], wd * wd_mults[k], t)
                     if trained[k] else W[k] for k in range(2)]
        else:
            global_step = ref.global_nag_step if optimizer == "nag" else ref.global_sgd_step
            new_W = [global_step(W[k], sum(g[k] for g in grads), mom_global[k],
                                 rescale_grad=rescale, lr=lr_at(t) * lr_mult[k],
                                 momentum=momentum, wd=wd * wd_mults[k])
                     if trained[k] else W[k] for k in range(2)]
        # lr x wd of the round that produced W (the first round's at t = 0: W_prev = W then)
        prev_decays = [lr_at(max(t - 1, 0)) * lr_mults_at(max(t - 1, 0))[k] * wd * wd_mults[k]
                       for k in range(2)]
        scales = [estimate_scales(estimate, workers, momentum, lr_at(t) * lr_mult[k],
                                  lr_at(t - 1) * lr_mults_at(t - 1)[k]
                                  if t >= 1 and t - 1 >= max(warmup_steps, trained_from[k])
                                  else None) for k in range(2)]
        for i in range(workers):
            for k in range(2):
                if not trained[k]:
                    pass
                elif t < warmup_steps:
                    local[i][k] = new_W[k].copy()
                elif local_optimizer == "predict" and optimizer == "adam":
                    # the state recovered from the global steps, where round t - 1 was this
                    # worker's previous local step of the parameter (docs/predict.md)
                    known = t >= 1 and t - 1 >= max(warmup_steps, trained_from[k])
                    local[i][k] = ref.adam_predict_step(
                        W[k], W_prev[k], grads[i][k], state_local[i][k], own[i][k],
                        num_workers=workers, rescale_grad=rescale, lr=lr_at(t) * lr_mult[k],
                        wd=wd * wd_mults[k], t=t + 1,
                        previous_lr=lr_at(t - 1) * lr_mults_at(t - 1)[k] if known else None)
                elif local_optimizer == "predict" and optimizer in ref.ADAPTIVE_STEPS:
                    local[i][k] = adaptive_step(optimizer, W[k], workers * grads[i][k],
                                                state_local[i][k], rescale,
                                                lr_at(t) * lr_mult[k], wd * wd_mults[k], t)
                elif local_optimizer == "predict" and optimizer == "nag":
                    local[i][k] = ref.nag_predict_step(
                        local[i][k], W[k], W_prev[k], grads[i][k], est[i][k], v[i][k],
                        rescale_grad=rescale, lr=lr_at(t) * lr_mult[k], momentum=momentum,
                        wd=wd * wd_mults[k], prev_decay=prev_decays[k], lam=compensation,
                        num_workers=workers, mode=compensation_mode, clip_gradient=clip,
                        **scales[k])
                elif local_optimizer == "predict":
                    state = dict(est=est[i][k], prev_decay=prev_decays[k]) \
                        if estimate == "previous" else {}
                    local[i][k] = ref.predict_step(
                        local[i][k], W[k], W_prev[k], grads[i][k], v[i][k],
                        rescale_grad=rescale, lr=lr_at(t) * lr_mult[k], momentum=momentum,
                        wd=wd * wd_mults[k], lam=compensation, num_workers=workers,
                        mode=compensation_mode, clip_gradient=clip, **scales[k], **state)
                else:
                    local[i][k] = ref.local_sgd_step(
                        local[i][k], W[k], grads[i][k], m[i][k], v[i][k],
                        rescale_grad=rescale, lr=local_lr * lr_mult[k], momentum=local_momentum,
                        wd=local_wd * wd_mults[k], lam=compensation, mode=compensation_mode,
                        clip_gradient=clip)
                history[i][k].append(local[i][k].copy())
        W_prev = [W[k] if trained[k] else W_prev[k] for k in range(2)]
        W = new_W
        if global_history is not None:
            global_history.append([a.copy() for a in W])
    return history, W


def adaptive_step(family, W, grad_sum, state, rescale, lr, wd, t):
    """One step of an adaptive family (Adam, RMSProp, AdaGrad) with MXNet's defaults, at the
    update count t + 1 of a parameter that trains from the first step."""
    rates = dict(rescale_grad=rescale, lr=lr, wd=wd)
    if family == "adam":
        rates["t"] = t + 1
    return ref.ADAPTIVE_STEPS[family][0](W, grad_sum, state, **rates)


def estimate_scales(estimate, workers, momentum, lr, previous_lr):
    """own_scale and prev_scale of ref.predict_step / nag_predict_step for one parameter, as
    docs/predict.md states them: 'own' N gc; 'shrunk' N gc / (1 + mu); 'previous'
    gc + (N - 1) / N G_{t-1}, whose lr_{t-1} G_{t-1} the step recovers, hence the weight
    (N - 1) / N lr_t / lr_{t-1}; N gc where the previous round is not known (previous_lr None:
    the worker's previous step of the parameter was no OD step) or its rate was 0."""
    if estimate == "own":
        return dict(own_scale=workers)
    if estimate == "shrunk":
        return dict(own_scale=workers / (1.0 + momentum))
    if previous_lr is None or previous_lr == 0:
        return dict(own_scale=workers, prev_scale=0.0)
    return dict(own_scale=1.0, prev_scale=(workers - 1) / workers * lr / previous_lr)


def assert_matches(results, history, W, rtol=RTOL, atol=ATOL):
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result["local_weight"], np.array(history[rank][0]),
                                   rtol=rtol, atol=atol, err_msg="worker %d weight" % rank)
        np.testing.assert_allclose(result["local_bias"], np.array(history[rank][1]),
                                   rtol=rtol, atol=atol, err_msg="worker %d bias" % rank)
        np.testing.assert_allclose(result["global_weight"], W[0], rtol=rtol, atol=atol)
        np.testing.assert_allclose(result["global_bias"], W[1], rtol=rtol, atol=atol)


def assert_global_steps(results, global_history, rtol=RTOL, atol=ATOL):
    """Each rank's global weights after every step (quadratic_job --record-global 1) equal
    the simulation's."""
    for rank, result in enumerate(results):
        assert len(result["global_weight_steps"]) == len(global_history)
        for t, (weight, bias) in enumerate(global_history):
            np.testing.assert_allclose(result["global_weight_steps"][t], weight, rtol=rtol,
                                       atol=atol, err_msg="worker %d, W_%d weight" % (rank, t + 1))
            np.testing.assert_allclose(result["global_bias_steps"][t], bias, rtol=rtol,
                                       atol=atol, err_msg="worker %d, W_%d bias" % (rank, t + 1))
