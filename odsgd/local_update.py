"""The worker's local update of OD-SGD (SPEC.md section 2, OD phase), in one place.

`LocalUpdater.update` turns (w_t, grad_t, W_t[, W_{t-1}]) into w_{t+1} in place. It runs the
fused C++ operator (kvstore_ext/, see odsgd.native) when the library is loaded and the same
formula as plain NDArray ops otherwise; both agree to float32 rounding.
"""
import logging

import mxnet as mx

from . import native

LOG = logging.getLogger("odsgd")


def global_learning_rate(optimizer, step):
    """The learning rate the servers use for global update `step` (0-based).

    MXNet's optimizers count the update before reading the rate, so update t runs with
    lr_scheduler(t + 1)."""
    if optimizer.lr_scheduler is not None:
        return optimizer.lr_scheduler(step + 1)
    return optimizer.lr


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


def _compensation(g, var, lam, adaptive, beta, eps):
    """lam c g^2, with c = 1 or 1 / sqrt(v + eps) after v = beta v + (1 - beta) g^2."""
    g2 = g * g
    if not adaptive:
        return lam * g2
    var[:] = beta * var + (1.0 - beta) * g2
    return lam * g2 / mx.nd.sqrt(var + eps)


class LocalUpdater(object):
    """Per-key local states of one worker and the OD-phase update.

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
        self.states = {}        # key -> (mom, var) NDArrays, shaped like the weight
        self._optimizer = None  # an mx.optimizer local optimizer, made on first use
        self._updater = None
        self._saved_optimizer_states = None

    # -- rates -----------------------------------------------------------------------------
    def local_momentum(self):
        """mu_l: the configured local momentum, else the global optimizer's (with a local
        momentum of 0 the derived rate below made 'sgd' diverge, docs/convergence.md)."""
        if self.config.local_momentum is not None:
            return self.config.local_momentum
        return getattr(self.global_optimizer, "momentum", 0.0) or 0.0

    def local_learning_rate(self, step):
        """lr_l for global step `step`: the local schedule or rate when given, else derived
        from the global optimizer so that the local steps, with their momentum, move as far
        as the global steps they stand in for: lr_g * N / (1 - mu_g) * (1 - mu_l), which is
        lr_g * N with the default mu_l = mu_g."""
        cfg = self.config
        if cfg.lr_scheduler is not None:
            return cfg.lr_scheduler(step + 1)
        if cfg.local_lr is not None:
            return cfg.local_lr
        mu_g = getattr(self.global_optimizer, "momentum", 0.0) or 0.0
        return (global_learning_rate(self.global_optimizer, step) * self.num_workers
                / (1.0 - mu_g) * (1.0 - self.local_momentum()))

    def _common(self):
        cfg = self.config
        return dict(rescale_grad=self.global_optimizer.rescale_grad,
                    clip_gradient=cfg.clip_gradient if cfg.clip_gradient else -1.0,
                    # v only matters where the compensation term does (lam != 0)
                    lam=cfg.compensation,
                    adaptive=bool(cfg.compensation) and cfg.compensation_mode == "adaptive",
                    beta=cfg.adaptive_beta, eps=cfg.adaptive_eps)

    # -- the update ------------------------------------------------------------------------
    def update(self, key, step, weight, grad, global_weight, prev_global_weight):
        """Writes w_{step+1} into `weight` (which holds w_step on entry).

        weight, grad, global_weight (W_step), prev_global_weight (W_{step-1}): NDArrays of one
        shape and context; grad is the raw gradient summed over this worker's devices."""
        cfg = self.config
        if cfg.local_optimizer not in ("sgd", "predict"):
            self._optimizer_update(key, step, weight, grad, global_weight)
            return
        mom, var = self._state(key, weight)
        if cfg.local_optimizer == "predict":
            opt = self.global_optimizer
            args = dict(self._common(), lr=global_learning_rate(opt, step),
                        momentum=getattr(opt, "momentum", 0.0) or 0.0, wd=opt.wd,
                        num_workers=self.num_workers)
            if native.supports(weight.context):
                native.predict_update_(weight, grad, global_weight, prev_global_weight, var,
                                       **args)
            else:
                ndarray_predict_update_(weight, grad, global_weight, prev_global_weight, var,
                                        **args)
            return
        args = dict(self._common(), lr=self.local_learning_rate(step),
                    momentum=self.local_momentum(), wd=cfg.local_wd or 0.0)
        if native.supports(weight.context):
            native.local_update_(weight, grad, global_weight, mom, var, **args)
        else:
            ndarray_local_update_(weight, grad, global_weight, mom, var, **args)

    def _state(self, key, weight):
        """(mom, var) of `key`: mom for 'sgd', var for adaptive compensation, else None."""
        state = self.states.get(key)
        if state is None:
            cfg = self.config

            def zeros(needed):
                return (mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype)
                        if needed else None)
            state = (zeros(cfg.local_optimizer == "sgd"),
                     zeros(cfg.compensation_mode == "adaptive" and cfg.compensation))
            self.states[key] = state
        return state

    def _optimizer_update(self, key, step, weight, grad, global_weight):
        """Any other mx.optimizer: applied to a copy of W_t with the worker's gradient."""
        if self._optimizer is None:
            cfg = self.config
            kwargs = dict(cfg.extra_params)
            kwargs.update(learning_rate=self.local_learning_rate(step),
                          rescale_grad=self.global_optimizer.rescale_grad,
                          wd=cfg.local_wd or 0.0, clip_gradient=cfg.clip_gradient,
                          lr_scheduler=cfg.lr_scheduler)
            if cfg.local_momentum:
                kwargs["momentum"] = cfg.local_momentum
            self._optimizer = mx.optimizer.create(cfg.local_optimizer, **kwargs)
            self._updater = mx.optimizer.get_updater(self._optimizer)
            if self._saved_optimizer_states is not None:
                self._updater.set_states(self._saved_optimizer_states)
        global_weight.copyto(weight)
        self._updater(key, grad, weight)

    # -- checkpoints -----------------------------------------------------------------------
    def get_states(self):
        """Local states as NumPy arrays (picklable)."""
        states = {key: tuple(None if a is None else a.asnumpy() for a in pair)
                  for key, pair in self.states.items()}
        opt_states = self._updater.get_states(dump_optimizer=False) if self._updater else None
        return {"states": states, "optimizer_states": opt_states}

    def set_states(self, saved, context):
        self.states = {key: tuple(None if a is None else mx.nd.array(a, ctx=context,
                                                                      dtype=a.dtype)
                                  for a in pair)
                       for key, pair in saved["states"].items()}
        self._saved_optimizer_states = saved.get("optimizer_states")
