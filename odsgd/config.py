"""The settings of a DistODSGD store: constructor arguments, ODSGD_* environment variables
and their validation, in one place. No other module of the store reads ODSGD_* variables
(odsgd.launch reads its own launcher settings, odsgd.native its build and library path).

Constructor arguments win over the environment; the environment wins over the defaults.
Every environment variable is listed in docs/env.md.
"""
import copy
import logging
import math
import os

COMPENSATION_MODES = ("constant", "adaptive")
#: what 'predict' puts in place of the sum of the workers' gradients of the round it predicts
#: (docs/predict.md, "The estimate of the gradient sum"): 'own' N gc, 'previous'
#: gc + (N-1)/N G_{t-1}, 'shrunk' N gc / (1 + mu). The default, 'own', was the most accurate
#: against dist_sync with SGD and NAG, 2 and 8 workers (NAG with 2: over six seeds, not on
#: every three; docs/convergence.md, "The estimate of the gradient sum"), and is the only one
#: whose workers' points average to W_{t+1} exactly.
PREDICT_ESTIMATES = ("own", "previous", "shrunk")
#: the delay compensation (lam, compensation_mode) of 'predict' per global optimizer where
#: neither `compensation` nor ODSGD_COMPENSATION is given: measured against dist_sync on
#: Fashion-MNIST, full length (docs/convergence.md, "Delay compensation with NAG"): with NAG,
#: adaptive lam = 4 closes most of the gap the 'own' estimate leaves (six seeds); SGD, already
#: level with dist_sync at lam = 0, keeps it for now (lam = 4 was above lam = 0 on each of
#: three seeds, +0.12 on average: a candidate for SGD's default after six seeds and 8 workers).
DEFAULT_COMPENSATION = {"nag": (4.0, "adaptive")}
#: what the parameter arrays show an inference forward between training steps
#: (odsgd/eval_weights.py): the servers' W, or the worker's own w_t
EVAL_WEIGHTS = ("global", "local")

DEFAULTS = {
    "local_optimizer": "predict",
    "local_lr": None,          # None: derived from the global optimizer (docs/env.md)
    "local_momentum": None,    # None: the global optimizer's momentum (docs/convergence.md)
    "local_wd": 0.0,
    "compensation": 0.0,
    "compensation_mode": "constant",
    "warmup_steps": 0,         # no measurable gain with 'predict' (docs/convergence.md)
    "predict_estimate": "own",
    "adaptive_beta": 0.95,     # the authors' adaptive variant: v = beta v + (1 - beta) g^2
    "adaptive_eps": 1e-7,
    # what an inference forward between steps sees: the global model (docs/convergence.md,
    # "MXNet's own scripts": fit.py's first epochs)
    "eval_weights": "global",
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
    "ODSGD_PREDICT_ESTIMATE": ("predict_estimate", str),
    "ODSGD_EVAL_WEIGHTS": ("eval_weights", str),
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

    Attributes: local_optimizer (str), local_lr, local_momentum, local_wd (float or None),
    compensation (lam, float), compensation_mode ('constant' or 'adaptive'), warmup_steps
    (int, global steps of plain SSGD first), predict_estimate (one of PREDICT_ESTIMATES; from
    the environment only), eval_weights (one of EVAL_WEIGHTS; from the environment only),
    adaptive_beta, adaptive_eps (floats),
    clip_gradient, lr_scheduler, extra_params (the local optimizer's own arguments);
    local_rule_kind (the class of local rule the name selects, odsgd/local_update.py) and
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
        # settings it takes (odsgd/local_update.py). Imported here: the benchmark drivers read
        # the environment through this module without MXNet.
        from .local_update import local_rule_kind
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


# -- settings of the store's machinery (not of the local step) -------------------------------
_DEFAULT_BIGARRAY_BOUND = 1000 * 1000


def bigarray_bound(environ=None):
    """MXNet's MXNET_KVSTORE_BIGARRAY_BOUND: arrays larger than this are sliced over the
    servers."""
    environ = os.environ if environ is None else environ
    return int(environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", _DEFAULT_BIGARRAY_BOUND))


def _count(environ, variable, default, meaning):
    """An integer >= 0 from `variable`, or `default` where it is unset or empty."""
    text = (environ.get(variable) or "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError("%s=%r must be an integer >= 0 (%s)" % (variable, text, meaning))
    return value


#: Default of ODSGD_EXIT_WAIT, in seconds.
DEFAULT_EXIT_WAIT = 30.0


def exit_wait_seconds(environ=None):
    """Seconds a job's processes get to end by themselves (ODSGD_EXIT_WAIT, default
    DEFAULT_EXIT_WAIT): odsgd.launch waits this long after the scheduler finished, or after
    every worker exited while the scheduler still waits, before it ends the rest; a worker
    that made no step waits this long at exit for the others. Read by both, so one value
    holds for the whole job (the local launcher's processes inherit it)."""
    environ = os.environ if environ is None else environ
    text = (environ.get("ODSGD_EXIT_WAIT") or "").strip()
    if not text:
        return DEFAULT_EXIT_WAIT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or math.isinf(value):
        raise ValueError("ODSGD_EXIT_WAIT=%r must be a number of seconds > 0 (default %g)"
                         % (text, DEFAULT_EXIT_WAIT))
    return value


#: Default of ODSGD_FUSION_ELEMENTS: small enough that a model's small parameters make several
#: keys, not one, so that one key's pull travels while another's push does (measured in
#: docs/design.md, "Why not pack them all into one key").
DEFAULT_FUSION_ELEMENTS = 65536


def fusion_elements(environ=None):
    """Most elements of a fused key group (ODSGD_FUSION_ELEMENTS; 0 turns fusion off; default
    DEFAULT_FUSION_ELEMENTS). Always below MXNet's big-array bound, so that a fused key is
    never sliced over the servers."""
    environ = os.environ if environ is None else environ
    limit = bigarray_bound(environ) - 1
    value = _count(environ, "ODSGD_FUSION_ELEMENTS", min(DEFAULT_FUSION_ELEMENTS, limit),
                   "most elements of a fused key; 0 turns fusion off")
    return min(value, limit)


#: Default of ODSGD_PART_ELEMENTS (1 MiB of float32): a big array travels as several requests,
#: so that one part's weights come back while another part's gradients go out, and a step's
#: requests spread over the servers (docs/design.md, "The exchange").
DEFAULT_PART_ELEMENTS = 262144


def part_elements(environ=None):
    """Most elements of one server key (ODSGD_PART_ELEMENTS; 0: one key per group; default
    DEFAULT_PART_ELEMENTS). Always below MXNet's big-array bound, so that MXNet never slices a
    part over the servers (the parts spread over them instead)."""
    environ = os.environ if environ is None else environ
    limit = bigarray_bound(environ) - 1
    value = _count(environ, "ODSGD_PART_ELEMENTS", min(DEFAULT_PART_ELEMENTS, limit),
                   "most elements of one server key; 0 gives each key group one key")
    return min(value, limit)


def metrics_interval(environ=None):
    """Global steps between overlap measurements (ODSGD_METRICS_INTERVAL; 0: none)."""
    environ = os.environ if environ is None else environ
    return _count(environ, "ODSGD_METRICS_INTERVAL", 0,
                  "steps between overlap measurements; 0 turns them off")


def timeline_path(environ=None):
    """Where a worker writes its profiler trace (ODSGD_TIMELINE, odsgd/timeline.py), or None
    when unset or empty: then nothing is recorded."""
    environ = os.environ if environ is None else environ
    return (environ.get("ODSGD_TIMELINE") or "").strip() or None
