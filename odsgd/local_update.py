"""The worker's local update of OD-SGD (SPEC.md section 2, OD phase), in one place.

`LocalUpdater.update_group` turns (w_t, grad_t, W_t[, W_{t-1}]) into w_{t+1} in place for every
parameter of a key group (odsgd/key_groups.py) at once. It runs one fused C++ operator for the
whole group (kvstore_ext/, odsgd.native.multi_update_) when the library is loaded and takes the
arrays, and the same formulas as NDArray ops per parameter otherwise (another dtype than
float32, no library); both agree to float32 rounding.

Each parameter uses its own rates, as the servers apply them (odsgd/rates.py): the learning
rate times its lr_mult and the weight decay times its wd_mult, for 'predict' and 'sgd' alike
(a frozen layer, lr_mult 0, stays where the servers keep it; biases with wd_mult 0 get no
local weight decay).

'predict' predicts the global optimizer's own step: SGD's from W_t and W_{t-1}, NAG's from
W_t and an estimate of the servers' NAG state that the worker advances from the global weights
and rates it receives (docs/predict.md states both rules).
"""
import logging

import mxnet as mx
import numpy as np

from . import native
from .rates import global_learning_rate

LOG = logging.getLogger("odsgd")


def ndarray_local_update_(weight, grad, global_weight, mom, var, *, rescale_grad, clip_gradient,
                          lr, momentum, wd, lam, adaptive, beta, eps):
    """NDArray fallback of the local SGD step (several passes over memory).

    step = g + wd W + lam c g^2 (W - w);  m = mu m - lr step;  w = W + m."""
    g = grad * rescale_grad
    if clip_gradient is not None and clip_gradient > 0:
        g = mx.nd.clip(g, -clip_gradient, clip_gradient)
    step = g + wd * global_weight if wd else g
    if lam:
        step = step + _compensation(g, var, lam, adaptive, beta, eps) * (global_weight - weight)
    mom[:] = momentum * mom - lr * step
    weight[:] = global_weight + mom


def ndarray_predict_update_(weight, grad, global_weight, prev_global_weight, var, *,
                            rescale_grad, clip_gradient, lr, momentum, wd, lam, adaptive, beta,
                            eps, num_workers):
    """NDArray fallback of the 'predict' step:
    w = W + mu (W - W_prev) - lr (N gc + wd W), gc = g + lam c g^2 (W - w)."""
    g = grad * rescale_grad
    if clip_gradient is not None and clip_gradient > 0:
        g = mx.nd.clip(g, -clip_gradient, clip_gradient)
    if lam:
        g = g + _compensation(g, var, lam, adaptive, beta, eps) * (global_weight - weight)
    update = num_workers * g + wd * global_weight if wd else num_workers * g
    weight[:] = global_weight + momentum * (global_weight - prev_global_weight) - lr * update


def ndarray_nag_predict_update_(weight, grad, global_weight, prev_global_weight, est, var, *,
                                rescale_grad, clip_gradient, lr, momentum, wd, prev_decay, lam,
                                adaptive, beta, eps, num_workers):
    """NDArray fallback of the 'predict' step for the global optimizer NAG (docs/predict.md):
    dW = W - W_prev;  est = (dW + mu est) / (1 + mu) - prev_decay dW;  a = mu est;
    w = (W - a) + (1 + mu) (a - lr (N gc + wd W)),  gc = g + lam c g^2 (W - w)."""
    g = grad * rescale_grad
    if clip_gradient is not None and clip_gradient > 0:
        g = mx.nd.clip(g, -clip_gradient, clip_gradient)
    if lam:
        g = g + _compensation(g, var, lam, adaptive, beta, eps) * (global_weight - weight)
    # 1 + mu as MXNet's nag_mom_update forms it, in float32
    one_plus_mu = float(np.float32(momentum) + np.float32(1.0))
    delta = global_weight - prev_global_weight
    est[:] = (delta + momentum * est) / one_plus_mu - prev_decay * delta
    a = momentum * est
    d = num_workers * g + wd * global_weight if wd else num_workers * g
    weight[:] = (global_weight - a) + one_plus_mu * (a - lr * d)


def _compensation(g, var, lam, adaptive, beta, eps):
    """lam c g^2, with c = 1 or 1 / sqrt(v + eps) after v = beta v + (1 - beta) g^2."""
    g2 = g * g
    if not adaptive:
        return lam * g2
    var[:] = beta * var + (1.0 - beta) * g2
    return lam * g2 / mx.nd.sqrt(var + eps)


def fused_ops_take(group, arrays):
    """True when the fused operators take `arrays` (odsgd.native.accepts), asked once per
    set of arrays of a group: the answer costs C calls per array, and a Trainer hands the
    same arrays every step."""
    key = tuple(map(id, arrays))
    answer = group.native_answers.get(key)
    if answer is None:
        if len(group.native_answers) > 8:   # arrays that change every call: do not grow
            group.native_answers.clear()
        answer = group.native_answers[key] = native.accepts(arrays)
    return answer


class LocalUpdater(object):
    """Local states of one worker and the OD-phase update.

    Parameters
    ----------
    config : odsgd.config.ODSGDConfig
    global_optimizer : mx.optimizer.Optimizer
        The optimizer the servers run (its rescale_grad, lr schedule, momentum and wd are read
        each step, so Trainer's changes are seen).
    num_workers : int
    """

    def __init__(self, config, global_optimizer, num_workers):
        self.config = config
        self.global_optimizer = global_optimizer
        self.num_workers = num_workers
        self._groups = {}        # key -> its KeyGroup for update() (one array, unit tests)
        self._optimizer = None   # an mx.optimizer local optimizer
        self._updater = None
        self._fallback_logged = False
        # 'predict' for the global optimizer NAG: group.mom holds the estimate of the servers'
        # NAG state, advanced from W_{t-1}, W_t and the rates of the round between them
        # (docs/predict.md).
        self.nag_predict = (config.local_optimizer == "predict"
                            and isinstance(global_optimizer, mx.optimizer.NAG))
        self._last_rates = {}    # server key -> (step, lrs, wds) of its last local step
        if config.local_optimizer not in ("sgd", "predict"):
            self._optimizer = config.create_local_optimizer(learning_rate=0.01)
            self._updater = mx.optimizer.get_updater(self._optimizer)

    # -- rates -----------------------------------------------------------------------------
    def local_momentum(self):
        """mu_l: for 'sgd' the configured local momentum, else the global optimizer's (with a
        local momentum of 0 the derived rate below made 'sgd' diverge, docs/convergence.md);
        for another mx.optimizer the momentum it was actually given (its own default when
        none was given, 0 when it has none)."""
        if self.config.local_momentum is not None:
            return self.config.local_momentum
        if self._optimizer is not None:
            return getattr(self._optimizer, "momentum", 0.0) or 0.0
        return getattr(self.global_optimizer, "momentum", 0.0) or 0.0

    def local_learning_rate(self, step):
        """lr_l for global step `step` before the parameter's lr_mult: the local schedule (its
        base rate the local learning_rate when both are given) or rate when given, else derived
        from the global optimizer so that the local steps, with their momentum, move as far as
        the global steps they stand in for: lr_g(step) * N / (1 - mu_g) * (1 - mu_l), which is
        lr_g * N with the default mu_l = mu_g. lr_g follows the global schedule and
        Trainer.set_learning_rate."""
        cfg = self.config
        if cfg.lr_scheduler is not None:
            return cfg.lr_scheduler(step + 1)
        if cfg.local_lr is not None:
            return cfg.local_lr
        mu_g = getattr(self.global_optimizer, "momentum", 0.0) or 0.0
        return (global_learning_rate(self.global_optimizer, step) * self.num_workers
                / (1.0 - mu_g) * (1.0 - self.local_momentum()))

    def rates(self, step, multipliers):
        """(lrs, wds, momentum) of global step `step` for parameters with these
        (lr_mult, wd_mult): the rates the local step uses, one per parameter."""
        if self.config.local_optimizer == "predict":
            opt = self.global_optimizer
            lr, wd = global_learning_rate(opt, step), opt.wd
            momentum = getattr(opt, "momentum", 0.0) or 0.0
        else:
            lr, wd = self.local_learning_rate(step), self.config.local_wd or 0.0
            momentum = self.local_momentum()
        return ([lr * m for m, _ in multipliers], [wd * m for _, m in multipliers], momentum)

    def previous_decays(self, group, step, multipliers):
        """'predict' with NAG: per parameter, lr x wd (multipliers included) of the servers'
        round that produced W_step from W_{step-1}. These are the rates this worker used at its
        own step - 1 of the group when that was a local step (they are the rates it pushed that
        round with: Trainer.set_learning_rate and multiplier changes reach the servers before
        the push), else the global schedule's rates of step - 1 with the parameters' current
        multipliers (the first OD step after a warm-up or a resume; at step 0, W_{-1} = W_0)."""
        last = self._last_rates.get(group.server_key)
        if last is not None and last[0] == step - 1 and len(last[1]) == len(multipliers):
            lrs, wds = last[1], last[2]
        else:
            lrs, wds, _ = self.rates(max(step - 1, 0), multipliers)
        return [lr * wd for lr, wd in zip(lrs, wds)]

    def _common(self):
        cfg = self.config
        return dict(rescale_grad=self.global_optimizer.rescale_grad,
                    clip_gradient=cfg.clip_gradient if cfg.clip_gradient else -1.0,
                    # v only matters where the compensation term does (lam != 0)
                    lam=cfg.compensation,
                    adaptive=bool(cfg.compensation) and cfg.compensation_mode == "adaptive",
                    beta=cfg.adaptive_beta, eps=cfg.adaptive_eps)

    # -- states ----------------------------------------------------------------------------
    def prepare(self, group):
        """Allocates the local states `group` needs: mom for 'sgd' (and, for 'predict' with
        the global optimizer NAG, the estimate of the servers' NAG state), var for the adaptive
        compensation (flat, in the group's layout, zero at first)."""
        cfg = self.config

        def zeros():
            return mx.nd.zeros((group.total,), group.context, dtype=group.dtype)
        if group.mom is None and (cfg.local_optimizer == "sgd" or self.nag_predict):
            group.mom = zeros()
        if group.var is None and cfg.compensation and cfg.compensation_mode == "adaptive":
            group.var = zeros()

    # -- the update ------------------------------------------------------------------------
    def update_group(self, group, step, weights, grads, multipliers, send=None):
        """Writes w_{step+1} into `weights` (which hold w_step on entry), from the group's
        W_step (`group.current`) and W_{step-1} (`group.previous`). For 'predict' with the
        global optimizer NAG it also advances the estimate of the servers' NAG state
        (`group.mom`).

        weights, grads: one NDArray per parameter of the group, in its order and shapes, on the
        group's context; grads are raw (summed over this worker's devices). multipliers: per
        parameter (lr_mult, wd_mult). send: when given, the group's flat send buffer, which
        also receives the raw gradients (the copy the push needs), in the same operator."""
        cfg = self.config
        self.prepare(group)
        if self._optimizer is not None:
            if send is not None:
                for view, grad in zip(group.views(send), grads):
                    grad.copyto(view)
            self._optimizer_update(group, step, weights, grads, multipliers)
            return
        lrs, wds, momentum = self.rates(step, multipliers)
        kind = "nag_predict" if self.nag_predict else cfg.local_optimizer
        prev_decays = None
        if self.nag_predict:
            prev_decays = self.previous_decays(group, step, multipliers)
            self._last_rates[group.server_key] = (step, lrs, wds)
        common = self._common()
        arrays = list(weights) + list(grads) + [group.current, group.previous]
        arrays += [a for a in (group.mom, group.var, send) if a is not None]
        if fused_ops_take(group, arrays):
            native.multi_update_(kind, weights, grads, group.current,
                                 prev_global_flat=group.previous if kind != "sgd" else None,
                                 mom_flat=group.mom if kind == "sgd" else None,
                                 est_flat=group.mom if kind == "nag_predict" else None,
                                 var_flat=group.var, send_flat=send,
                                 lrs=lrs, wds=wds, prev_decays=prev_decays, momentum=momentum,
                                 num_workers=self.num_workers, **common)
            return
        self._log_fallback(weights[0])
        if send is not None:
            for view, grad in zip(group.views(send), grads):
                grad.copyto(view)
        W, W_prev = group.views(group.current), group.views(group.previous)
        moms = group.views(group.mom) if group.mom is not None else [None] * len(weights)
        variances = group.views(group.var) if group.var is not None else [None] * len(weights)
        for i, (weight, grad) in enumerate(zip(weights, grads)):
            if kind == "nag_predict":
                ndarray_nag_predict_update_(weight, grad, W[i], W_prev[i], moms[i],
                                            variances[i], lr=lrs[i], momentum=momentum,
                                            wd=wds[i], prev_decay=prev_decays[i],
                                            num_workers=self.num_workers, **common)
            elif kind == "predict":
                ndarray_predict_update_(weight, grad, W[i], W_prev[i], variances[i],
                                        lr=lrs[i], momentum=momentum, wd=wds[i],
                                        num_workers=self.num_workers, **common)
            else:
                ndarray_local_update_(weight, grad, W[i], moms[i], variances[i], lr=lrs[i],
                                      momentum=momentum, wd=wds[i], **common)

    def _log_fallback(self, weight):
        if not self._fallback_logged:
            self._fallback_logged = True
            LOG.info("odsgd: the local update uses NDArray operations (%s weights on %s%s)",
                     weight.dtype.__name__ if hasattr(weight.dtype, "__name__")
                     else weight.dtype, weight.context,
                     "" if native.is_loaded() else "; the native library is not loaded")

    def _optimizer_update(self, group, step, weights, grads, multipliers):
        """Any other mx.optimizer: applied to a copy of W_t with the worker's gradient, its rate
        and weight decay set each step from the local rate (the global schedule and
        Trainer.set_learning_rate included) and each parameter's multipliers."""
        optimizer = self._optimizer
        optimizer.rescale_grad = self.global_optimizer.rescale_grad
        lr = self.local_learning_rate(step)
        wd = self.config.local_wd or 0.0
        for key, W, weight, grad, (lr_mult, wd_mult) in zip(
                group.keys, group.views(group.current), weights, grads, multipliers):
            optimizer.lr, optimizer.wd = lr * lr_mult, wd * wd_mult
            W.copyto(weight)
            self._updater(key, grad, weight)

    def update(self, key, step, weight, grad, global_weight, prev_global_weight,
               multipliers=(1.0, 1.0)):
        """One parameter on its own (its states kept per key): writes w_{step+1} into
        `weight`. The store uses update_group; this is the same step for one array."""
        from .key_groups import KeyGroup
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = KeyGroup(key, [key], [0], [weight])
        group.current.reshape(weight.shape)[:] = global_weight
        group.previous.reshape(weight.shape)[:] = prev_global_weight
        self.update_group(group, step, [weight], [grad], [multipliers])

    # -- checkpoints -----------------------------------------------------------------------
    def get_states(self, groups):
        """Local states per key as NumPy arrays (picklable), whatever groups hold them: the
        momentum of 'sgd' or the NAG estimate of 'predict' (both in group.mom), v."""
        states = {}
        for group in groups:
            moms = group.views(group.mom) if group.mom is not None else None
            variances = group.views(group.var) if group.var is not None else None
            for i, key in enumerate(group.keys):
                states[key] = (moms[i].asnumpy() if moms else None,
                               variances[i].asnumpy() if variances else None)
        opt_states = self._updater.get_states(dump_optimizer=False) if self._updater else None
        return {"states": states, "optimizer_states": opt_states}

    def set_states(self, saved, groups):
        """Loads get_states' output into the groups that hold the keys now."""
        for group in groups:
            self.prepare(group)
            for i, key in enumerate(group.keys):
                mom, var = saved["states"].get(key, (None, None))
                if mom is not None and group.mom is not None:
                    group.views(group.mom)[i][:] = mom
                if var is not None and group.var is not None:
                    group.views(group.var)[i][:] = var
        if saved.get("optimizer_states") is not None and self._updater is not None:
            self._updater.set_states(saved["optimizer_states"])
