"""The worker's local update of OD-SGD (docs/spec.md, section 4), in one place.

The local update rule is decided once: its kind from the `local_optimizer` name when the
store is made (`local_rule_kind`, which also checks the settings that kind takes), the rule
itself when the global optimizer is set (`LocalRule.create`). One class per rule:

    LocalSGDRule      'sgd'                              the authors' local SGD, own rates
    PredictSGDRule    'predict', global optimizer SGD    W + mu (W - W_prev) - lr (G_hat + wd W)
    PredictNAGRule    'predict', global optimizer NAG    NAG's update from an estimate of the
                                                         servers' state (docs/predict.md)

where G_hat, the estimate of the sum of the workers' gradients of the round, is chosen by
ODSGD_PREDICT_ESTIMATE (`PredictRule.estimate_scales`): own_scale gc, plus prev_scale times
the servers' previous round recovered from the global weights for 'previous'.
    MXOptimizerRule   any other mx.optimizer name        that optimizer on a copy of W_t

Each knows the flat states it keeps per key group (`buffers`: `mom` is the momentum of 'sgd',
the NAG estimate of 'predict' and, for the SGD 'predict' with the 'previous' estimate, the last
change of the global weights; `var` the adaptive compensation's v; `local`, with lam != 0, a flat copy
of w_t gathered from the parameters at every step, which the compensation term reads: the
fused operator writes the weights without reading them, so it never waits for them), its rates, and how it
runs on a whole key group (odsgd/worker/key_groups.py): one fused C++ operator
(`odsgd.native.multi_update_`) when the library is loaded and takes the arrays, the same
formulas as NDArray ops per parameter otherwise (another dtype than float32, no library);
both agree to float32 rounding. `UpdateParams` carries one call's hyper-parameters.

Each parameter uses its own rates, as the servers apply them (odsgd/common/rates.py): the learning
rate times its lr_mult and the weight decay times its wd_mult, for 'predict' and 'sgd' alike
(a frozen layer, lr_mult 0, stays where the servers keep it; biases with wd_mult 0 get no
local weight decay).

`LocalUpdater` holds one worker's rule and runs it on key groups.
"""
import copy
import dataclasses
import logging
import math
from typing import List, Optional

import mxnet as mx
import numpy as np

from .. import native
from ..common.rates import global_learning_rate, schedule_count

LOG = logging.getLogger("odsgd")


# -- the formulas as NDArray ops (the fallback of the fused operator) ---------------------------
def ndarray_local_update_(weight, grad, global_weight, mom, var, *, rescale_grad, clip_gradient,
                          lr, momentum, wd, lam, adaptive, beta, eps):
    """NDArray fallback of the local SGD step (several passes over memory).

    step = g + wd W + lam c g^2 (W - w);  m = mu m - lr step;  w = W + m."""
    g = _rescaled(grad, rescale_grad, clip_gradient)
    step = g + wd * global_weight if wd else g
    if lam:
        step = step + _compensation(g, var, lam, adaptive, beta, eps) * (global_weight - weight)
    mom[:] = momentum * mom - lr * step
    weight[:] = global_weight + mom


def ndarray_predict_update_(weight, grad, global_weight, prev_global_weight, var, *,
                            rescale_grad, clip_gradient, lr, momentum, wd, lam, adaptive, beta,
                            eps, num_workers, own_scale=None, prev_scale=None, est=None,
                            prev_decay=0.0):
    """NDArray fallback of the 'predict' step:
    w = W + mu (W - W_prev) - lr (s_own gc + wd W), gc = g + lam c g^2 (W - w), s_own = N
    unless own_scale is given; with prev_scale also - prev_scale P, P = mu est - dW -
    prev_decay W_prev (the servers' lr_{t-1} G_{t-1}), est = dW (multi_update_'s 'predict')."""
    g = _compensated(weight, grad, global_weight, var, rescale_grad, clip_gradient, lam,
                     adaptive, beta, eps)
    own = num_workers if own_scale is None else own_scale
    update = own * g + wd * global_weight if wd else own * g
    delta = global_weight - prev_global_weight
    new_weight = global_weight + momentum * delta - lr * update
    if prev_scale is not None:
        previous_sum = momentum * est - delta - prev_decay * prev_global_weight
        est[:] = delta
        new_weight = new_weight - prev_scale * previous_sum
    weight[:] = new_weight


def ndarray_nag_predict_update_(weight, grad, global_weight, prev_global_weight, est, var, *,
                                rescale_grad, clip_gradient, lr, momentum, wd, prev_decay, lam,
                                adaptive, beta, eps, num_workers, own_scale=None,
                                prev_scale=None):
    """NDArray fallback of the 'predict' step for the global optimizer NAG (docs/predict.md):
    dW = W - W_prev;  est = (dW + mu est) / (1 + mu) - prev_decay dW;  a = mu est;
    w = (W - a) + (1 + mu) (a - lr (s_own gc + wd W) [- prev_scale P]),
    gc = g + lam c g^2 (W - w), s_own = N unless own_scale is given, and with prev_scale
    P = mu est_before - est - prev_decay W (the servers' lr_{t-1} G_{t-1})."""
    g = _compensated(weight, grad, global_weight, var, rescale_grad, clip_gradient, lam,
                     adaptive, beta, eps)
    # 1 + mu as MXNet's nag_mom_update forms it, in float32
    one_plus_mu = float(np.float32(momentum) + np.float32(1.0))
    delta = global_weight - prev_global_weight
    est_before = est.copy() if prev_scale is not None else None
    est[:] = (delta + momentum * est) / one_plus_mu - prev_decay * delta
    a = momentum * est
    own = num_workers if own_scale is None else own_scale
    d = own * g + wd * global_weight if wd else own * g
    bracket = a - lr * d
    if prev_scale is not None:
        bracket = bracket - prev_scale * (momentum * est_before - est
                                          - prev_decay * global_weight)
    weight[:] = (global_weight - a) + one_plus_mu * bracket


def _rescaled(grad, rescale_grad, clip_gradient):
    """g = r * grad, clipped to [-clip, clip] when clip_gradient > 0."""
    g = grad * rescale_grad
    if clip_gradient is not None and clip_gradient > 0:
        g = mx.nd.clip(g, -clip_gradient, clip_gradient)
    return g


def _compensated(weight, grad, global_weight, var, rescale_grad, clip_gradient, lam, adaptive,
                 beta, eps):
    """gc = g + lam c g^2 (W - w): the delay-compensated gradient of 'predict'."""
    g = _rescaled(grad, rescale_grad, clip_gradient)
    if lam:
        g = g + _compensation(g, var, lam, adaptive, beta, eps) * (global_weight - weight)
    return g


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


# -- one call's hyper-parameters ---------------------------------------------------------------
@dataclasses.dataclass
class UpdateParams:
    """The hyper-parameters of one local step of a key group: `UpdateParams` of
    kvstore_ext/local_update_kernels.h, with lr, wd, prev_decay, own_scale and prev_scale one
    per array (its `ParamsOf`). clip_gradient <= 0 means no clipping; `adaptive` selects
    c = 1 / sqrt(v + eps) (only where lam != 0). The predicts' estimate of the round's gradient
    sum: own_scales (None: num_workers) and prev_scales (None: no previous round)."""
    rescale_grad: float
    clip_gradient: float
    momentum: float
    lam: float
    adaptive: bool
    beta: float
    eps: float
    num_workers: int
    lrs: List[float]
    wds: List[float]
    prev_decays: Optional[List[float]] = None
    own_scales: Optional[List[float]] = None
    prev_scales: Optional[List[float]] = None

    def shared(self):
        """The arguments every array of the call shares, as the fused operator and the
        NDArray fallbacks take them."""
        return dict(rescale_grad=self.rescale_grad, clip_gradient=self.clip_gradient,
                    momentum=self.momentum, lam=self.lam, adaptive=self.adaptive,
                    beta=self.beta, eps=self.eps)


# -- the rules, one class each ------------------------------------------------------------------
class LocalRule(object):
    """One local update rule (see the module's docstring), made for one global optimizer.

    Class attributes: `kind`, the fused operator's kind (None: no fused operator);
    `buffers`, the KeyGroup flat states it keeps (zero at first; `local` is filled from the
    parameters before it is read, `local_weights`).
    """
    kind = None
    buffers = ()
    #: whether the global optimizer's default compensation applies where none was given
    #: (config.DEFAULT_COMPENSATION; only 'predict' was measured with it)
    default_compensation = False

    def __init__(self, config, global_optimizer, num_workers):
        self.config = config
        self.global_optimizer = global_optimizer
        self.num_workers = num_workers
        self._fallback_logged = False
        #: lam and its mode for this global optimizer (the settings, or its default)
        self.lam, self.compensation_mode = config.compensation_for(
            type(global_optimizer).__name__.lower() if self.default_compensation else None)
        if self.lam and config.where("compensation") == "default":
            logging.info("dist_odsgd: delay compensation lam=%g (%s), the default with global "
                         "optimizer %s (docs/convergence.md); ODSGD_COMPENSATION=0 turns it "
                         "off", self.lam, self.compensation_mode,
                         type(global_optimizer).__name__)
        if self.lam:
            self.buffers = self.buffers + ("local",)
        if self.lam and self.compensation_mode == "adaptive":
            self.buffers = self.buffers + ("var",)

    @classmethod
    def check_settings(cls, config):
        """Checks the settings this kind of rule takes (ValueError naming the fix); returns
        what it built from them (the mx.optimizer of MXOptimizerRule, else None)."""
        return None

    @classmethod
    def create(cls, config, global_optimizer, num_workers):
        """The rule of this kind for `global_optimizer`."""
        return cls(config, global_optimizer, num_workers)

    # -- rates ---------------------------------------------------------------------------------
    def base_rates(self, step):
        """(lr, wd, momentum) of global step `step` before the parameters' multipliers."""
        raise NotImplementedError

    def rates(self, step, multipliers):
        """(lrs, wds, momentum) of global step `step` for parameters with these
        (lr_mult, wd_mult): the rates the local step uses, one per parameter."""
        lr, wd, momentum = self.base_rates(step)
        return ([lr * m for m, _ in multipliers], [wd * m for _, m in multipliers], momentum)

    def params(self, group, step, multipliers):
        """The UpdateParams of this step of `group`."""
        cfg = self.config
        lrs, wds, momentum = self.rates(step, multipliers)
        return UpdateParams(rescale_grad=self.global_optimizer.rescale_grad,
                            clip_gradient=cfg.clip_gradient if cfg.clip_gradient else -1.0,
                            momentum=momentum, lam=self.lam,
                            # v only matters where the compensation term does (lam != 0)
                            adaptive=bool(self.lam) and self.compensation_mode == "adaptive",
                            beta=cfg.adaptive_beta, eps=cfg.adaptive_eps,
                            num_workers=self.num_workers, lrs=lrs, wds=wds)

    # -- the step ------------------------------------------------------------------------------
    def update_group(self, group, step, weights, grads, multipliers):
        """w_{step+1} into `weights` (see LocalUpdater.update_group), fused where the
        operator takes the arrays, else as NDArray ops."""
        params = self.params(group, step, multipliers)
        arrays = list(weights) + list(grads) + [group.current, group.previous]
        arrays += [a for a in (group.mom, group.var, group.local) if a is not None]
        if fused_ops_take(group, arrays):
            native.multi_update_(self.kind, weights, grads, group.current,
                                 var_flat=group.var, local_flat=self.local_weights(group, weights),
                                 lrs=params.lrs, wds=params.wds, prev_decays=params.prev_decays,
                                 own_scales=params.own_scales, prev_scales=params.prev_scales,
                                 num_workers=params.num_workers, **self.fused_states(group),
                                 **params.shared())
            return
        self._log_fallback(weights[0])
        W, W_prev = group.views(group.current), group.views(group.previous)
        moms = group.views(group.mom) if group.mom is not None else [None] * len(weights)
        variances = group.views(group.var) if group.var is not None else [None] * len(weights)
        for i, (weight, grad) in enumerate(zip(weights, grads)):
            self.fallback(i, weight, grad, W[i], W_prev[i], moms[i], variances[i], params)

    def fused_states(self, group):
        """The flat states multi_update_ takes for this kind, by its argument names."""
        raise NotImplementedError

    def local_weights(self, group, weights):
        """`group.local` holding w_t, the values of `weights` (None where lam = 0: the step
        does not read w_t), gathered from them at every step: one gather_, which MXNet's
        engine orders after the weights' pending writes and which reads an MKL-DNN layout
        through a copy, so the Python thread waits for nothing.

        Every step, not once: the parameters are the user's arrays, and whatever wrote them
        since the last step (Module.set_params, load_optimizer_states with weights loaded
        beside it, an EMA or a weight constraint written in place) is what the gradient was
        taken at; the compensation term must read that, and no hook sees every write."""
        if group.local is None:
            return None
        native.gather_(weights, group.local)
        return group.local

    def fallback(self, i, weight, grad, W, W_prev, mom, var, params):
        """The NDArray step of array `i` of the group."""
        raise NotImplementedError

    def _log_fallback(self, weight):
        if not self._fallback_logged:
            self._fallback_logged = True
            LOG.info("odsgd: the local update uses NDArray operations (%s weights on %s%s)",
                     weight.dtype.__name__ if hasattr(weight.dtype, "__name__")
                     else weight.dtype, weight.context,
                     "" if native.is_loaded() else "; the native library is not loaded")

    # -- states beyond the group's flat buffers ------------------------------------------------
    def get_extra_states(self):
        return None

    def set_extra_states(self, saved):
        pass


class _OwnRatesRule(LocalRule):
    """A local optimizer with rates of its own ('sgd' and mx.optimizer names)."""

    def default_momentum(self):
        raise NotImplementedError

    def local_momentum(self):
        """mu_l: the configured local momentum, else `default_momentum()`."""
        if self.config.local_momentum is not None:
            return self.config.local_momentum
        return self.default_momentum()

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

    def base_rates(self, step):
        return self.local_learning_rate(step), self.config.local_wd or 0.0, self.local_momentum()


class LocalSGDRule(_OwnRatesRule):
    """'sgd': step = g + wd_l W + lam c g^2 (W - w); m = mu_l m - lr_l step; w = W + m."""
    kind = "sgd"
    buffers = ("mom",)

    @classmethod
    def check_settings(cls, config):
        if config.extra_params:
            raise ValueError("local_optimizer='sgd' does not take %s; it takes learning_rate, "
                             "momentum, wd, clip_gradient, lr_scheduler, beta, epsilon"
                             % ", ".join(sorted(config.extra_params)))

    def default_momentum(self):
        """The global optimizer's momentum (with a local momentum of 0 the derived rate made
        'sgd' diverge, docs/convergence.md)."""
        return getattr(self.global_optimizer, "momentum", 0.0) or 0.0

    def fused_states(self, group):
        return dict(prev_global_flat=None, mom_flat=group.mom, est_flat=None)

    def fallback(self, i, weight, grad, W, W_prev, mom, var, params):
        ndarray_local_update_(weight, grad, W, mom, var, lr=params.lrs[i], wd=params.wds[i],
                              **params.shared())


class PredictRule(LocalRule):
    """'predict': the worker predicts the global update that has not arrived, with the global
    optimizer's own rates for each parameter (PredictSGDRule, PredictNAGRule), and an estimate
    G_hat of the round's gradient sum chosen by ODSGD_PREDICT_ESTIMATE (`estimate_scales`).

    `reads_state`: the rule keeps the worker's copy of the servers' optimizer state after the
    round that produced W_t in group.mom (NAG: always; SGD: for the 'previous' estimate), and
    so needs lr x wd of that round (`previous_decays`)."""
    reads_state = False
    default_compensation = True

    def __init__(self, config, global_optimizer, num_workers):
        super(PredictRule, self).__init__(config, global_optimizer, num_workers)
        self.estimate = config.predict_estimate
        self._last_rates = {}    # parameter key -> (step, lr, wd) of its last local step

    @classmethod
    def check_settings(cls, config):
        where = config.where
        rates = ("local_lr", "local_momentum", "local_wd")
        given = [name for name in rates if where(name) == "argument"]
        refused = sorted(config.parameter_of(name) for name in given) + \
            sorted(config.extra_params)
        if config.lr_scheduler is not None:
            refused.append("lr_scheduler")
        if refused:
            raise ValueError("local_optimizer='predict' takes its rates from the global "
                             "optimizer; remove %s from local_optimizer_params (only "
                             "clip_gradient is allowed)" % ", ".join(refused))
        from_environment = sorted(config.variable_of(name) for name in rates
                                  if where(name) == "environment")
        if from_environment:
            one = len(from_environment) == 1
            raise ValueError("local_optimizer='predict' takes its rates from the global "
                             "optimizer, but %s %s set; unset %s or use "
                             "ODSGD_LOCAL_OPTIMIZER=sgd"
                             % (", ".join(from_environment), "is" if one else "are",
                                "it" if one else "them"))

    @classmethod
    def create(cls, config, global_optimizer, num_workers):
        """PredictNAGRule for the global optimizer NAG, PredictSGDRule for SGD (exact types:
        their subclasses may change the update), PredictOptimizerRule for any other optimizer
        (docs/spec.md, section 4)."""
        if type(global_optimizer) is mx.optimizer.NAG:
            return PredictNAGRule(config, global_optimizer, num_workers)
        if type(global_optimizer) in (mx.optimizer.SGD, mx.optimizer.ccSGD):
            return PredictSGDRule(config, global_optimizer, num_workers)
        if type(global_optimizer) is mx.optimizer.Adam and not global_optimizer.multi_precision:
            return PredictAdamRule(config, global_optimizer, num_workers)
        return PredictOptimizerRule(config, global_optimizer, num_workers)

    def base_rates(self, step):
        opt = self.global_optimizer
        return (global_learning_rate(opt, step), opt.wd,
                getattr(opt, "momentum", 0.0) or 0.0)

    def params(self, group, step, multipliers):
        params = super(PredictRule, self).params(group, step, multipliers)
        previous = self.previous_rates(group, step)
        for key, lr, wd in zip(group.keys, params.lrs, params.wds):
            self._last_rates[key] = (step, lr, wd)
        if self.reads_state:
            params.prev_decays = self.previous_decays(step, multipliers, previous)
        params.own_scales, params.prev_scales = self.estimate_scales(params.lrs, previous,
                                                                     params.momentum)
        return params

    def previous_rates(self, group, step):
        """Per parameter of the group, (lr, wd) (multipliers included) of the servers' round
        that produced W_step from W_{step-1}, where this worker knows them: the rates it used
        at its own local step step - 1 of that parameter (they are the rates it pushed that
        round with: Trainer.set_learning_rate and multiplier changes reach the servers before
        the push); None where that step was not a local step of the parameter (step 0, the
        first OD step after a warm-up, a parameter that starts training late: then its states
        were not advanced by that round either), or where they are not known (a resume from
        states saved without them)."""
        previous = []
        for key in group.keys:
            last = self._last_rates.get(key)
            previous.append(last[1:] if last is not None and last[0] == step - 1 else None)
        return previous

    def previous_decays(self, step, multipliers, previous):
        """Per parameter, lr x wd of the servers' round that produced W_step: from
        `previous_rates`, else the global schedule's rates of step - 1 with the parameters'
        current multipliers (at step 0, W_{-1} = W_0, so nothing depends on it)."""
        scheduled = None
        decays = []
        for k, known in enumerate(previous):
            if known is None:
                if scheduled is None:
                    scheduled = self.rates(max(step - 1, 0), multipliers)
                known = (scheduled[0][k], scheduled[1][k])
            decays.append(known[0] * known[1])
        return decays

    def estimate_scales(self, lrs, previous, momentum):
        """(own_scales, prev_scales): G_hat = own_scale gc + the previous round's sum G_{t-1}
        with weight prev_scale / (lr_t / lr_{t-1}), per parameter (docs/predict.md).

        'own': N gc. 'shrunk': N gc / (1 + mu) (NAG moves W by (1 + mu) lr per unit of the
        sum, SGD by lr). 'previous': gc + (N - 1) / N G_{t-1}, where the kernel recovers
        lr_{t-1} G_{t-1} and the prediction needs lr_t G_{t-1}, hence the ratio of the rates;
        where the previous round is not known (`previous_rates` None) or its rate was 0 (the
        servers' weights then carry no trace of G_{t-1}), N gc, as if G_{t-1} were N gc."""
        n = self.num_workers
        if self.estimate == "own":
            return [float(n)] * len(lrs), None
        if self.estimate == "shrunk":
            return [n / (1.0 + momentum)] * len(lrs), None
        own, prev = [], []
        for lr, known in zip(lrs, previous):
            if known is None or known[0] == 0:
                own.append(float(n))
                prev.append(0.0)
            else:
                own.append(1.0)
                prev.append((n - 1) / n * lr / known[0])
        return own, prev

    # -- states beyond the group's flat buffers ------------------------------------------------
    def get_extra_states(self):
        """The rates of each parameter's last local step (`previous_rates`), so that a resumed
        worker knows the round before its first step as the one that saved them did."""
        return {"last_rates": dict(self._last_rates)}

    def set_extra_states(self, saved):
        if isinstance(saved, dict) and "last_rates" in saved:   # else another rule's states
            self._last_rates = dict(saved["last_rates"])

    def fallback_estimate(self, i, params):
        """The estimate's arguments of the NDArray fallbacks for array i."""
        return dict(own_scale=params.own_scales[i],
                    prev_scale=params.prev_scales[i] if params.prev_scales is not None
                    else None)


class PredictSGDRule(PredictRule):
    """'predict' (global optimizer SGD): w = W + mu (W - W_prev) - lr (G_hat + wd W). For the
    'previous' estimate group.mom holds the servers' momentum after the round that produced
    W_t (W_t - W_{t-1}), from which the kernel recovers that round's sum."""
    kind = "predict"

    def __init__(self, config, global_optimizer, num_workers):
        super(PredictSGDRule, self).__init__(config, global_optimizer, num_workers)
        self.reads_state = self.estimate == "previous"
        if self.reads_state:
            self.buffers = self.buffers + ("mom",)

    def fused_states(self, group):
        return dict(prev_global_flat=group.previous, mom_flat=None,
                    est_flat=group.mom if self.reads_state else None)

    def fallback(self, i, weight, grad, W, W_prev, mom, var, params):
        state = dict(est=mom, prev_decay=params.prev_decays[i]) if self.reads_state else {}
        ndarray_predict_update_(weight, grad, W, W_prev, var, lr=params.lrs[i],
                                wd=params.wds[i], num_workers=params.num_workers,
                                **self.fallback_estimate(i, params), **state, **params.shared())


class PredictNAGRule(PredictRule):
    """'predict' (global optimizer NAG): group.mom holds the estimate of the servers' NAG
    state, advanced from W_{t-1}, W_t and the rates of the round between them
    (docs/predict.md)."""
    kind = "nag_predict"
    buffers = ("mom",)
    reads_state = True

    def fused_states(self, group):
        return dict(prev_global_flat=group.previous, mom_flat=None, est_flat=group.mom)

    def fallback(self, i, weight, grad, W, W_prev, mom, var, params):
        ndarray_nag_predict_update_(weight, grad, W, W_prev, mom, var, lr=params.lrs[i],
                                    wd=params.wds[i], prev_decay=params.prev_decays[i],
                                    num_workers=params.num_workers,
                                    **self.fallback_estimate(i, params), **params.shared())


class NoiselessSGLD(mx.optimizer.SGLD):
    """SGLD's step without its noise: w = W - lr / 2 (g + wd W). What 'predict' predicts of
    a global SGLD step, whose Gaussian noise, drawn on the servers, no worker can know: the
    mean of the step."""

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = mx.nd.clip(grad, -self.clip_gradient, self.clip_gradient)
        weight[:] += -lr / 2 * (grad + wd * weight)


#: optimizer attributes a worker's copy of the global optimizer does not take: the rates come
#: per step and per parameter from the rules' `rates` (schedule, Trainer.set_learning_rate and
#: multipliers as the servers apply them), the counts are set per step, and Gluon's parameters
#: and Module's symbol are the user's (never copied)
_NOT_COPIED = ("param_dict", "lr_scheduler", "lr_mult", "wd_mult", "idx2name", "sym_info",
               "_all_index_update_counts", "_index_update_count")


def worker_copy(optimizer, cls=None):
    """A copy of the global `optimizer` for the worker's prediction: its class (or `cls`) and
    every hyper-parameter, with no schedule, multipliers, parameters or counts of its own."""
    kept = {name: value for name, value in vars(optimizer).items() if name not in _NOT_COPIED}
    twin = object.__new__(cls or type(optimizer))
    twin.__dict__.update(copy.deepcopy(kept))
    twin.param_dict, twin.lr_scheduler, twin.idx2name = {}, None, {}
    twin.lr_mult, twin.wd_mult = {}, {}
    twin.sym_info = ()
    twin._all_index_update_counts = {0: {}}
    twin._index_update_count = twin._all_index_update_counts[0]
    return twin


def predictable(optimizer):
    """Whether 'predict' can apply `optimizer`'s own update on a worker: it has an `update` of
    its own (a user's class may define none). SGLD, whose update is random, is handled before
    this is asked (NoiselessSGLD)."""
    return type(optimizer).update is not mx.optimizer.Optimizer.update


def master_copy_index(optimizer):
    """Where a float16 weight's float32 master copy sits in the state tuple of `optimizer`'s
    multi_precision: first with the base class's create_state_multi_precision, last in the
    classes that make their own (MXNet's SGD, ccSGD, NAG and LARS: (state, master copy))."""
    own = type(optimizer).create_state_multi_precision
    return 0 if own is mx.optimizer.Optimizer.create_state_multi_precision else -1


def start_from(updater, key, current, weight):
    """Sets `weight` to W_t (`current`) before an mx.optimizer Updater steps it: and, for a
    float16 weight under multi_precision, its float32 master copy, which the step reads."""
    current.copyto(weight)
    state = updater.states.get(key)
    if isinstance(state, tuple) and updater.optimizer.multi_precision and \
            weight.dtype == np.float16:
        current.astype(np.float32).copyto(state[master_copy_index(updater.optimizer)])


class PredictOptimizerRule(PredictRule):
    """'predict' for any global optimizer other than SGD and NAG (Adam, RMSProp, AdaGrad,
    LAMB, ...; docs/predict.md, "Any other global optimizer"): the global optimizer's own
    update applied to W_t with G_hat = N g, through a copy of it on the worker (same class and
    hyper-parameters) whose state, one per parameter, is the worker's estimate of the servers'
    state, advanced by each prediction. Per step the copy takes the servers' rate of the
    round, each parameter's multipliers, the global rescale_grad times N, and the servers'
    update count (Adam's bias correction reads it).

    An optimizer without an update of its own gets no prediction: w_{t+1} = W_t (the gradient
    of step t+1 is then taken at the newest global weights, one round stale), said once in
    the log."""
    buffers = ()
    default_compensation = False

    def __init__(self, config, global_optimizer, num_workers):
        super(PredictOptimizerRule, self).__init__(config, global_optimizer, num_workers)
        name = type(global_optimizer).__name__
        if self.lam:
            raise ValueError("the delay compensation (compensation=%g) is defined for the "
                             "global optimizers sgd and nag; with global optimizer %s set "
                             "compensation=0 (ODSGD_COMPENSATION=0)" % (self.lam, name))
        self.optimizer = None
        if isinstance(global_optimizer, mx.optimizer.SGLD):
            self.optimizer = worker_copy(global_optimizer, NoiselessSGLD)
        elif predictable(global_optimizer):
            self.optimizer = worker_copy(global_optimizer)
        else:
            LOG.warning("dist_odsgd: global optimizer %s has no update() of its own to "
                        "predict with: each worker takes its gradients at the newest global "
                        "weights W_t (one round stale)", name)
        self.updater = mx.optimizer.get_updater(self.optimizer) if self.optimizer else None

    def update_group(self, group, step, weights, grads, multipliers):
        W = group.views(group.current)
        if self.updater is None:
            for current, weight in zip(W, weights):
                current.copyto(weight)
            return
        opt, glob = self.optimizer, self.global_optimizer
        lrs, wds, _ = self.rates(step, multipliers)
        opt.lr, opt.wd = 1.0, 1.0
        opt.rescale_grad = glob.rescale_grad * self.num_workers
        opt._set_current_context(group.context.device_id)
        count = schedule_count(glob, step) - 1   # the update counts it to the servers' count
        opt.num_update = count
        for key, lr, wd, current, weight in zip(group.keys, lrs, wds, W, weights):
            opt.lr_mult[key], opt.wd_mult[key] = lr, wd
            opt._index_update_count[key] = count
            start_from(self.updater, key, current, weight)
        self.updater(list(group.keys), list(grads), list(weights))

    def get_extra_states(self):
        return self.updater.get_states(dump_optimizer=False) if self.updater else None

    def set_extra_states(self, saved):
        if self.updater is not None and isinstance(saved, bytes):   # else another rule's
            self.updater.set_states(saved)


def recover_adam_sum(F, step, m, v, own, beta1, beta2):
    """Adam's effective gradient of a round (rescaled, weight decay added, clipped: what its
    m and v took in) from the round's step s = (W_before - W_after) / lr_c, where lr_c is the
    round's rate with the bias correction, and the state (m, v) before the round; elementwise,
    with `F` mx.nd (or numpy). With epsilon neglected,
        (beta1 m + (1 - beta1) G) / sqrt(beta2 v + (1 - beta2) G^2) = s
    is a quadratic in G, A G^2 + 2 a b G + (a^2 - s^2 c) = 0 with a = beta1 m, b = 1 - beta1,
    c = beta2 v, A = b^2 - (1 - beta2) s^2. Of its roots that give the step's sign, the one
    nearest `own` (the worker's own estimate of that round). Where A is near 0 the step is
    Adam's largest, which every G of its sign gives (any first step): `own` stays there, and
    where no root fits (rounding)."""
    b, e = 1.0 - beta1, 1.0 - beta2
    a, c = beta1 * m, beta2 * v
    s2 = step * step
    A = b * b - e * s2
    solvable = F.abs(A) > 1e-3 * b * b
    safe = F.where(solvable, A, F.ones_like(A))
    spread = F.abs(step) * F.sqrt(F.maximum(b * b * c + a * a * e - s2 * e * c, 0.0))
    best, distance = own.copy(), F.ones_like(own) * 3e38
    for root in ((spread - a * b) / safe, (-spread - a * b) / safe):
        fits = solvable * ((F.sign(a + b * root) == F.sign(step)) + (step == 0) > 0)
        closer = fits * (F.abs(root - own) < distance)
        best = F.where(closer, root, best)
        distance = F.where(closer, F.abs(root - own), distance)
    return best


class PredictAdamRule(PredictOptimizerRule):
    """'predict' for a global Adam (exactly mx.optimizer.Adam, float32 weights; another dtype
    goes through PredictOptimizerRule's path), with the worker's estimate of the servers'
    Adam state recovered from the global steps it observes (docs/predict.md, "Adam"): per
    parameter, group.mom and group.var hold m and v before the round being predicted, and
    the rule keeps its own estimate of the last round's effective gradient (`own`, flat per
    group) to pick the root of the recovery. Each step: recover round t-1's gradient from
    W_t - W_{t-1} (where that round was this worker's previous local step and its rate was not
    0; with rate 0 the own estimate stands in), advance m and v by it, then predict with
    G_hat = N g on temporaries."""

    def __init__(self, config, global_optimizer, num_workers):
        super(PredictAdamRule, self).__init__(config, global_optimizer, num_workers)
        self.buffers = ("mom", "var")
        self._own = {}             # group key tuple -> views of its flat own estimate
        self._own_saved = {}       # parameter key -> NumPy own estimate (from set_extra_states)

    def own_views(self, group):
        """Per parameter of the group, its own estimate of the last round (a view of a flat
        buffer made at the group's first step, filled from loaded states where present)."""
        views = self._own.get(tuple(group.keys))
        if views is None:
            flat = mx.nd.zeros((group.total,), group.context, dtype=group.dtype)
            views = self._own[tuple(group.keys)] = group.views(flat)
            for key, view in zip(group.keys, views):
                if key in self._own_saved:
                    view[:] = self._own_saved.pop(key)
        return views

    def update_group(self, group, step, weights, grads, multipliers):
        if group.dtype != np.float32:
            super(PredictAdamRule, self).update_group(group, step, weights, grads, multipliers)
            return
        opt = self.global_optimizer
        b1, b2 = opt.beta1, opt.beta2
        lrs, wds, _ = self.rates(step, multipliers)
        previous = self.previous_rates(group, step)

        def corrected(lr, at_step):
            count = schedule_count(opt, at_step)
            return lr * math.sqrt(1. - b2 ** count) / (1. - b1 ** count)
        scale = opt.rescale_grad * self.num_workers
        # the one-pass operator where the library takes the arrays (CPU: it has no CUDA kernel)
        fused = group.context.device_type == "cpu" and fused_ops_take(
            group, list(weights) + list(grads) + [group.current, group.previous, group.mom,
                                                  group.var])
        if not fused:
            self._log_fallback(weights[0])
        for key, W, W_prev, m, v, own, weight, grad, lr, wd, known in zip(
                group.keys, group.views(group.current), group.views(group.previous),
                group.views(group.mom), group.views(group.var), self.own_views(group),
                weights, grads, lrs, wds, previous):
            self._last_rates[key] = (step, lr, wd)
            if fused:
                advance = 0 if known is None else 2 if known[0] > 0 else 1
                native.adam_predict_(
                    W, W_prev, grad, m, v, own, weight, advance=advance,
                    rate_prev=corrected(known[0], step - 1) if advance == 2 else 0.0,
                    rate=corrected(lr, step), wd=wd, scale=scale,
                    clip_gradient=opt.clip_gradient, beta1=b1, beta2=b2, epsilon=opt.epsilon)
                continue
            if known is not None:        # round t-1 was this worker's previous local step
                G = own
                if known[0] > 0:
                    G = recover_adam_sum(mx.nd, (W_prev - W) / corrected(known[0], step - 1),
                                         m, v, own, b1, b2)
                m[:] = b1 * m + (1. - b1) * G
                v[:] = b2 * v + (1. - b2) * G * G
            g = grad * scale + wd * W if wd else grad * scale
            if opt.clip_gradient:
                g = mx.nd.clip(g, -opt.clip_gradient, opt.clip_gradient)
            own[:] = g
            weight[:] = W - corrected(lr, step) * (b1 * m + (1. - b1) * g) / (
                mx.nd.sqrt(b2 * v + (1. - b2) * g * g) + opt.epsilon)

    def get_extra_states(self):
        own = {key: view.asnumpy() for keys, views in self._own.items()
               for key, view in zip(keys, views)}
        return {"last_rates": dict(self._last_rates), "own": {**self._own_saved, **own},
                "updater": super(PredictAdamRule, self).get_extra_states()}

    def set_extra_states(self, saved):
        if not isinstance(saved, dict) or "own" not in saved:   # another rule's states
            return
        self._last_rates = dict(saved["last_rates"])
        self._own_saved = dict(saved["own"])
        self._own = {}
        if saved.get("updater") is not None:
            super(PredictAdamRule, self).set_extra_states(saved["updater"])


class MXOptimizerRule(_OwnRatesRule):
    """Any other mx.optimizer: applied to a copy of W_t with the worker's gradient, its rate
    and weight decay set each step from the local rate (the global schedule and
    Trainer.set_learning_rate included) and each parameter's multipliers; its states are kept
    per key by an mx.optimizer Updater."""

    def __init__(self, config, global_optimizer, num_workers):
        super(MXOptimizerRule, self).__init__(config, global_optimizer, num_workers)
        # A copy of the one built from the settings: each set_optimizer starts it afresh
        # (states and update counts), as a new global optimizer does on the servers.
        self.optimizer = copy.deepcopy(config.built_local_optimizer)
        self.updater = mx.optimizer.get_updater(self.optimizer)

    @classmethod
    def check_settings(cls, config):
        """Refuses compensation and builds the optimizer from local_optimizer_params: its own
        arguments, learning_rate, wd, clip_gradient, and momentum only when one was given. Its
        rate is set each step, so it gets no schedule of its own. Arguments it does not take
        are a ValueError here, when the store is made, not at the first local step."""
        if config.compensation:
            raise ValueError("compensation=%r needs local_optimizer 'sgd' or 'predict'; with "
                             "local optimizer %r set compensation=0"
                             % (config.compensation, config.local_optimizer))
        kwargs = dict(config.extra_params)
        kwargs.update(learning_rate=config.local_lr or 0.01, rescale_grad=1.0,
                      wd=config.local_wd or 0.0, clip_gradient=config.clip_gradient)
        if config.local_momentum is not None:
            kwargs["momentum"] = config.local_momentum
        try:
            return mx.optimizer.create(config.local_optimizer, **kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError("local optimizer %r does not take these arguments (%s): %s; give "
                             "local_optimizer_params that mx.optimizer.create(%r, ...) accepts"
                             % (config.local_optimizer, ", ".join(sorted(kwargs)), error,
                                config.local_optimizer)) from None

    def default_momentum(self):
        """The momentum the optimizer was actually given (its own default when none was
        given, 0 when it has none)."""
        return getattr(self.optimizer, "momentum", 0.0) or 0.0

    def update_group(self, group, step, weights, grads, multipliers):
        optimizer = self.optimizer
        optimizer.rescale_grad = self.global_optimizer.rescale_grad
        lr = self.local_learning_rate(step)
        wd = self.config.local_wd or 0.0
        for key, W, weight, grad, (lr_mult, wd_mult) in zip(
                group.keys, group.views(group.current), weights, grads, multipliers):
            optimizer.lr, optimizer.wd = lr * lr_mult, wd * wd_mult
            start_from(self.updater, key, W, weight)
            self.updater(key, grad, weight)

    def get_extra_states(self):
        return self.updater.get_states(dump_optimizer=False)

    def set_extra_states(self, saved):
        if isinstance(saved, dict):     # a 'predict' rule's rates (states saved with another
            return                      # local optimizer): nothing of this optimizer's
        self.updater.set_states(saved)


def local_rule_kind(name, source="argument"):
    """The kind of local rule that `local_optimizer=name` selects: LocalSGDRule ('sgd'),
    PredictRule ('predict'; its `create` picks the SGD or NAG variant) or MXOptimizerRule (an
    mx.optimizer name). ValueError for another name; `source` says where it was given."""
    if name == "sgd":
        return LocalSGDRule
    if name == "predict":
        return PredictRule
    if name not in mx.optimizer.Optimizer.opt_registry:
        raise ValueError("unknown local optimizer %r (%s); use 'predict', 'sgd' or an "
                         "mx.optimizer name such as 'adam'" % (name, source))
    return MXOptimizerRule


# -- one worker's local update ---------------------------------------------------------------
class LocalUpdater(object):
    """Local states of one worker and the OD-phase update.

    Parameters
    ----------
    config : odsgd.common.config.ODSGDConfig
    global_optimizer : mx.optimizer.Optimizer
        The optimizer the servers run (its rescale_grad, lr schedule, momentum and wd are read
        each step, so Trainer's changes are seen).
    num_workers : int
    """

    def __init__(self, config, global_optimizer, num_workers):
        self.config = config
        self.global_optimizer = global_optimizer
        self.num_workers = num_workers
        #: the local update rule, chosen here once (a LocalRule)
        self.rule = config.local_rule_kind.create(config, global_optimizer, num_workers)
        self._groups = {}        # key -> its KeyGroup for update() (one array, unit tests)

    @property
    def nag_predict(self):
        """True for 'predict' with the global optimizer NAG."""
        return isinstance(self.rule, PredictNAGRule)

    def local_learning_rate(self, step):
        """The local rate lr_l of global step `step` ('sgd' and mx.optimizer local steps)."""
        return self.rule.local_learning_rate(step)

    def prepare(self, group):
        """Allocates the flat states the step keeps in `group` (zero at first; `local`, with
        lam != 0, is filled from the parameters at the group's first local update)."""
        for name in self.rule.buffers:
            if getattr(group, name) is None:
                setattr(group, name, mx.nd.zeros((group.total,), group.context,
                                                 dtype=group.dtype))

    def update_group(self, group, step, weights, grads, multipliers):
        """Writes w_{step+1} into `weights` (which hold w_step on entry), from the group's
        W_step (`group.current`) and W_{step-1} (`group.previous`). For 'predict' with the
        global optimizer NAG it also advances the estimate of the servers' NAG state, with SGD
        and the 'previous' estimate the copy of the servers' momentum (`group.mom`).

        weights, grads: one NDArray per parameter of the group, in its order and shapes, on the
        group's context; grads are raw (summed over this worker's devices). multipliers: per
        parameter (lr_mult, wd_mult)."""
        self.prepare(group)
        self.rule.update_group(group, step, weights, grads, multipliers)

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
        momentum of 'sgd', the NAG estimate of 'predict' or the SGD 'predict''s last change of
        the global weights (all in group.mom), v."""
        states = {}
        for group in groups:
            moms = group.views(group.mom) if group.mom is not None else None
            variances = group.views(group.var) if group.var is not None else None
            for i, key in enumerate(group.keys):
                states[key] = (moms[i].asnumpy() if moms else None,
                               variances[i].asnumpy() if variances else None)
        return {"states": states, "optimizer_states": self.rule.get_extra_states()}

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
        if saved.get("optimizer_states") is not None:
            self.rule.set_extra_states(saved["optimizer_states"])
