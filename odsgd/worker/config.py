"""`ODSGDConfig`: the validated settings of a DistODSGD store, from its constructor arguments,
the ODSGD_* environment variables (odsgd/common/config.py) and the defaults. Constructor
arguments win over the environment; the environment wins over the defaults."""
import copy
import logging
import math

from ..common.config import (COMPENSATION_MODES, DEFAULT_COMPENSATION, DEFAULTS, EVAL_WEIGHTS,
                             PREDICT_ESTIMATES, _PARAMETER_OF, _VARIABLE_OF, fusion_elements,
                             metrics_interval, part_elements, read_environment)


def _check_rate(name, value, source):
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise TypeError("%s must be a finite number, got %r (%s)" % (name, value, source))
    if value < 0:
        raise ValueError("%s must be >= 0, got %r (%s); OD-SGD's local step moves against the "
                         "gradient, so give a positive value" % (name, value, source))


class ODSGDConfig(object):
    """Validated local-update settings.

    Attributes: local_optimizer (str), local_lr, local_momentum, local_wd (float or None),
    compensation (lam, float), compensation_mode ('constant' or 'adaptive'), warmup_steps
    (int, global steps of plain SSGD first), predict_estimate (one of PREDICT_ESTIMATES; from
    the environment only), eval_weights (one of EVAL_WEIGHTS; from the environment only),
    adaptive_beta, adaptive_eps (floats),
    clip_gradient, lr_scheduler, extra_params (the local optimizer's own arguments);
    local_rule_kind (the class of local rule the name selects, odsgd/worker/local_update.py) and
    built_local_optimizer; fusion_elements, part_elements and metrics_interval (the store's
    machinery).
    """

    def __init__(self, local_optimizer=None, local_optimizer_params=None, compensation=None,
                 compensation_mode=None, warmup_steps=None, environ=None):
        env = read_environment(environ)
        given = {"local_optimizer": local_optimizer, "compensation": compensation,
                 "compensation_mode": compensation_mode, "warmup_steps": warmup_steps}
        source = {}
        values = dict(DEFAULTS)
        for name, value in env.items():
            values[name] = value
            source[name] = "environment"
        for name, value in given.items():
            if value is not None:
                values[name] = value
                source[name] = "argument"

        if local_optimizer_params is not None and not isinstance(local_optimizer_params, dict):
            raise TypeError("local_optimizer_params must be a dict such as "
                            "{'learning_rate': 0.1, 'momentum': 0.0}, got %r"
                            % type(local_optimizer_params).__name__)
        # A copy: the caller's dict is never changed.
        params = dict(local_optimizer_params or {})
        for key, name in (("learning_rate", "local_lr"), ("momentum", "local_momentum"),
                          ("wd", "local_wd")):
            if key in params:
                values[name] = params.pop(key)
                source[name] = "argument"

        self.local_optimizer = str(values["local_optimizer"]).lower()
        self.compensation_mode = str(values["compensation_mode"]).lower()
        self.local_lr = values["local_lr"]
        self.local_momentum = values["local_momentum"]
        self.local_wd = values["local_wd"]
        self.compensation = values["compensation"]
        self.warmup_steps = values["warmup_steps"]
        self.predict_estimate = str(values["predict_estimate"]).lower()
        self.eval_weights = str(values["eval_weights"]).lower()
        self.adaptive_beta = params.pop("beta", values["adaptive_beta"])
        self.adaptive_eps = params.pop("epsilon", values["adaptive_eps"])
        self.clip_gradient = params.pop("clip_gradient", None)
        self.lr_scheduler = params.pop("lr_scheduler", None)
        if self.lr_scheduler is not None and self.local_lr is not None:
            # As MXNet's optimizers do: learning_rate is the schedule's base rate. A copy,
            # since schedules keep their own count and the caller's is not ours to change.
            self.lr_scheduler = copy.copy(self.lr_scheduler)
            self.lr_scheduler.base_lr = self.local_lr
        #: what is left goes to a non-built-in mx.optimizer local optimizer
        self.extra_params = params
        self._source = source
        self._validate()
        #: most elements of a fused key group, and steps between overlap measurements
        self.fusion_elements = fusion_elements(environ)
        self.part_elements = part_elements(environ)
        self.metrics_interval = metrics_interval(environ)

    def compensation_for(self, optimizer_name):
        """(lam, compensation_mode) of the local step with global optimizer `optimizer_name`
        (lowercase class name; None: no per-optimizer default): the given settings, or, where
        lam was not given, DEFAULT_COMPENSATION's entry for that optimizer. A default lam
        belongs to the mode it was measured in: with another mode given and no lam, the
        compensation is off (lam 0), said once in the log."""
        if self.where("compensation") != "default":
            return self.compensation, self.compensation_mode
        lam, mode = DEFAULT_COMPENSATION.get(optimizer_name, (0.0, self.compensation_mode))
        if self.where("compensation_mode") != "default" and self.compensation_mode != mode:
            if lam:
                logging.info("dist_odsgd: compensation_mode=%r given without a lam: the default "
                             "lam=%g with global optimizer %s was measured in %r mode only, so "
                             "the compensation is off; give ODSGD_COMPENSATION (or "
                             "compensation=) for %r mode", self.compensation_mode, lam,
                             optimizer_name, mode, self.compensation_mode)
            return 0.0, self.compensation_mode
        return lam, mode

    def where(self, name):
        """Where setting `name` came from: 'argument', 'environment' or 'default'."""
        return self._source.get(name, "default")

    @staticmethod
    def variable_of(name):
        """The ODSGD_* variable of setting `name` (e.g. 'ODSGD_LOCAL_LR' for 'local_lr')."""
        return _VARIABLE_OF[name]

    @staticmethod
    def parameter_of(name):
        """The local_optimizer_params entry of setting `name` ('learning_rate' for 'local_lr')."""
        return _PARAMETER_OF[name]

    def _validate(self):
        where = self.where
        for name in ("local_lr", "local_momentum", "local_wd", "compensation"):
            _check_rate(name, getattr(self, name), where(name))
        if self.clip_gradient is not None:
            _check_rate("clip_gradient", self.clip_gradient, "argument")
        if not 0.0 <= self.adaptive_beta < 1.0:
            raise ValueError("beta must be in [0, 1), got %r" % self.adaptive_beta)
        if self.adaptive_eps <= 0:
            raise ValueError("epsilon must be > 0, got %r" % self.adaptive_eps)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
            raise TypeError("warmup_steps must be an int, got %r (%s)"
                            % (self.warmup_steps, where("warmup_steps")))
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0, got %d (%s)"
                             % (self.warmup_steps, where("warmup_steps")))
        if self.compensation_mode not in COMPENSATION_MODES:
            raise ValueError("compensation_mode must be one of %s, got %r (%s)"
                             % (COMPENSATION_MODES, self.compensation_mode,
                                where("compensation_mode")))
        if self.predict_estimate not in PREDICT_ESTIMATES:
            raise ValueError("ODSGD_PREDICT_ESTIMATE must be one of %s, got %r; unset it for "
                             "the default %r" % (", ".join(PREDICT_ESTIMATES),
                                                 self.predict_estimate,
                                                 DEFAULTS["predict_estimate"]))
        if self.eval_weights not in EVAL_WEIGHTS:
            raise ValueError("ODSGD_EVAL_WEIGHTS must be one of %s, got %r; unset it for "
                             "the default %r" % (", ".join(EVAL_WEIGHTS), self.eval_weights,
                                                 DEFAULTS["eval_weights"]))
        # The kind of local rule is decided here, once, from its name; the kind checks the
        # settings it takes (odsgd/worker/local_update.py). Imported here: the benchmark drivers read
        # the environment through this module without MXNet.
        from ..worker.local_update import local_rule_kind
        self.local_rule_kind = local_rule_kind(self.local_optimizer, where("local_optimizer"))
        #: the mx.optimizer local optimizer, built once from the settings (None for 'sgd' and
        #: 'predict'); a LocalUpdater steps with its own copy
        self.built_local_optimizer = self.local_rule_kind.check_settings(self)

    def as_dict(self):
        """The settings as plain values (for logs and checkpoints)."""
        return {"local_optimizer": self.local_optimizer, "local_lr": self.local_lr,
                "local_momentum": self.local_momentum, "local_wd": self.local_wd,
                "compensation": self.compensation, "compensation_mode": self.compensation_mode,
                "warmup_steps": self.warmup_steps, "predict_estimate": self.predict_estimate,
                "eval_weights": self.eval_weights,
                "clip_gradient": self.clip_gradient,
                "adaptive_beta": self.adaptive_beta, "adaptive_eps": self.adaptive_eps}
