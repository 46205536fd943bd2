"""The ODSGD_* environment variables, in one place for every side: what each means, its
default and how it parses (the store's settings, validated with its constructor arguments in
odsgd/worker/config.py), and the settings of the store's machinery that the workers, the
servers, the launcher and the benchmarks read (fusion and part sizes, MXNet's big-array bound,
ODSGD_EXIT_WAIT, ODSGD_TIMELINE, ...). No other module reads ODSGD_* variables (the launcher
reads its own, odsgd.native its build and library path). Imports no MXNet.

Every environment variable is listed in docs/env.md.
"""
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
#: (odsgd/worker/eval_weights.py): the servers' W, or the worker's own w_t
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
    """Where a worker writes its profiler trace (ODSGD_TIMELINE, odsgd/worker/trace.py), or None
    when unset or empty: then nothing is recorded."""
    environ = os.environ if environ is None else environ
    return (environ.get("ODSGD_TIMELINE") or "").strip() or None
