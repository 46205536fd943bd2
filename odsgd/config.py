"""The local-update settings of a DistODSGD store: constructor arguments, ODSGD_* environment
variables and their validation, in one place.

Constructor arguments win over the environment; the environment wins over the defaults.
Every environment variable is listed in docs/env.md.
"""
import copy
import math
import os

#: Local optimizers with the OD-SGD rules of SPEC section 2 built in; any other
#: `mx.optimizer` name applies that optimizer to a copy of the global weights.
BUILTIN_LOCAL_OPTIMIZERS = ("sgd", "predict")
COMPENSATION_MODES = ("constant", "adaptive")

DEFAULTS = {
    "local_optimizer": "predict",
    "local_lr": None,          # None: derived from the global optimizer (docs/env.md)
    "local_momentum": None,    # None: the global optimizer's momentum (docs/convergence.md)
    "local_wd": 0.0,
    "compensation": 0.0,
    "compensation_mode": "constant",
    "warmup_steps": 0,         # no measurable gain with 'predict' (docs/convergence.md)
    "adaptive_beta": 0.95,     # the authors' adaptive variant: v = beta v + (1 - beta) g^2
    "adaptive_eps": 1e-7,
}

#: environment variable -> (setting, parser)
ENVIRONMENT = {
    "ODSGD_LOCAL_OPTIMIZER": ("local_optimizer", str),
    "ODSGD_LOCAL_LR": ("local_lr", float),
    "ODSGD_LOCAL_MOMENTUM": ("local_momentum", float),
    "ODSGD_LOCAL_WD": ("local_wd", float),
    "ODSGD_COMPENSATION": ("compensation", float),
    "ODSGD_COMPENSATION_MODE": ("compensation_mode", str),
    "ODSGD_WARMUP_STEPS": ("warmup_steps", int),
}


_VARIABLE_OF = {name: variable for variable, (name, _parse) in ENVIRONMENT.items()}
_PARAMETER_OF = {"local_lr": "learning_rate", "local_momentum": "momentum", "local_wd": "wd"}


def read_environment(environ=None):
    """Returns the settings given by ODSGD_* variables, parsed; a bad value is a ValueError
    that names the variable."""
    environ = os.environ if environ is None else environ
    settings = {}
    for variable, (name, parse) in ENVIRONMENT.items():
        text = environ.get(variable)
        if text is None or text.strip() == "":
            continue
        try:
            settings[name] = parse(text.strip())
        except ValueError:
            raise ValueError("%s=%r is not a valid %s; unset it or give e.g. %s=%r"
                             % (variable, text, parse.__name__, variable,
                                DEFAULTS[name] if DEFAULTS[name] is not None else 0.1)) from None
    return settings


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

    Attributes: local_optimizer (str), local_optimizer_params (dict, a copy), local_lr,
    local_momentum, local_wd (float or None), compensation (lam, float), compensation_mode
    ('constant' or 'adaptive'), warmup_steps (int, global steps of plain SSGD first),
    adaptive_beta, adaptive_eps (floats).
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
        self._validate(source)

    def _validate(self, source):
        def where(name):
            return source.get(name, "default")

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
        if self.local_optimizer not in BUILTIN_LOCAL_OPTIMIZERS:
            import mxnet as mx  # the registry of optimizers; workers only
            if self.local_optimizer not in mx.optimizer.Optimizer.opt_registry:
                raise ValueError("unknown local optimizer %r (%s); use 'predict', 'sgd' or an "
                                 "mx.optimizer name such as 'adam'"
                                 % (self.local_optimizer, where("local_optimizer")))
            if self.compensation:
                raise ValueError("compensation=%r needs local_optimizer 'sgd' or 'predict'; with "
                                 "local optimizer %r set compensation=0"
                                 % (self.compensation, self.local_optimizer))
            self.create_local_optimizer(learning_rate=self.local_lr or 0.01)
        if self.local_optimizer == "predict":
            given = [name for name in ("local_lr", "local_momentum", "local_wd")
                     if where(name) == "argument"]
            refused = sorted(_PARAMETER_OF[name] for name in given) + sorted(self.extra_params)
            if self.lr_scheduler is not None:
                refused.append("lr_scheduler")
            if refused:
                raise ValueError("local_optimizer='predict' takes its rates from the global "
                                 "optimizer; remove %s from local_optimizer_params (only "
                                 "clip_gradient is allowed)" % ", ".join(refused))
            from_environment = sorted(_VARIABLE_OF[name] for name in
                                      ("local_lr", "local_momentum", "local_wd")
                                      if where(name) == "environment")
            if from_environment:
                raise ValueError("local_optimizer='predict' takes its rates from the global "
                                 "optimizer, but %s %s set; unset %s or use "
                                 "ODSGD_LOCAL_OPTIMIZER=sgd"
                                 % (", ".join(from_environment),
                                    "is" if len(from_environment) == 1 else "are",
                                    "it" if len(from_environment) == 1 else "them"))
        elif self.local_optimizer == "sgd" and self.extra_params:
            raise ValueError("local_optimizer='sgd' does not take %s; it takes learning_rate, "
                             "momentum, wd, clip_gradient, lr_scheduler, beta, epsilon"
                             % ", ".join(sorted(self.extra_params)))

    def create_local_optimizer(self, learning_rate, rescale_grad=1.0):
        """A new instance of a local optimizer other than 'sgd' or 'predict', with the
        arguments it is given: its own ones, learning_rate, wd, clip_gradient, and momentum
        only when one was given. Its rate is set each step (LocalUpdater), so it gets no
        schedule of its own. Arguments the optimizer does not take are a ValueError here, when
        the store is made, not at the first local step."""
        import mxnet as mx
        kwargs = dict(self.extra_params)
        kwargs.update(learning_rate=learning_rate, rescale_grad=rescale_grad,
                      wd=self.local_wd or 0.0, clip_gradient=self.clip_gradient)
        if self.local_momentum is not None:
            kwargs["momentum"] = self.local_momentum
        try:
            return mx.optimizer.create(self.local_optimizer, **kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError("local optimizer %r does not take these arguments (%s): %s; give "
                             "local_optimizer_params that mx.optimizer.create(%r, ...) accepts"
                             % (self.local_optimizer, ", ".join(sorted(kwargs)), error,
                                self.local_optimizer)) from None

    def as_dict(self):
        """The settings as plain values (for logs and checkpoints)."""
        return {"local_optimizer": self.local_optimizer, "local_lr": self.local_lr,
                "local_momentum": self.local_momentum, "local_wd": self.local_wd,
                "compensation": self.compensation, "compensation_mode": self.compensation_mode,
                "warmup_steps": self.warmup_steps, "clip_gradient": self.clip_gradient,
                "adaptive_beta": self.adaptive_beta, "adaptive_eps": self.adaptive_eps}
