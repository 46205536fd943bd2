"""Accelerator-paced workers of the throughput benchmark: a worker whose forward and backward
are a wait of an accelerator's step time, and whose exchange is real.

The worker trains a ParameterDict of a model's trained arrays (odsgd/bench/model_shapes.py)
with a gluon.Trainer, so that every step goes through Trainer.step into the store as a real
model's would (with dist_odsgd: one pushpull of every array, odsgd/worker/trainer_hook.py); servers,
local update and network are the real ones. The gradients are random values written once:
nothing in the exchange depends on their values.

The byte scale K divides every array's element count by K (at least 1 element, the number of
arrays kept) and the link's rate by K (the benchmark), so that a step's bytes and their time
on the link shrink together and the ratio of computation to communication stays the
cluster's. The store's size settings (fusion, parts, MXNet's big-array bound) are divided by
K as well, so that the scaled model travels in the same keys and messages as the full one.
"""
import time

from ..common import config as store_config
from .model_shapes import scaled_shapes

#: the store's settings in elements, which the byte scale divides (see the module docstring)
SCALED_SETTINGS = {"ODSGD_FUSION_ELEMENTS": store_config.fusion_elements,
                   "ODSGD_PART_ELEMENTS": store_config.part_elements}


def scaled_store_environment(byte_scale, environ=None):
    """The environment variables that give the store, at byte scale `byte_scale`, the keys
    and messages it has at scale 1 (each setting divided by the scale, at least 1; 0, "off",
    stays 0); {} at scale 1. `environ`: where the settings at scale 1 come from (default the
    process's)."""
    if byte_scale == 1:
        return {}
    bound = max(2, store_config.bigarray_bound(environ) // byte_scale)
    scaled = {"MXNET_KVSTORE_BIGARRAY_BOUND": str(bound)}
    for variable, read in SCALED_SETTINGS.items():
        value = read(environ)
        scaled[variable] = str(max(1, value // byte_scale) if value else 0)
    return scaled


def paced_parameters(model, byte_scale, seed=0):
    """A ParameterDict of `model`'s trained arrays at `byte_scale`, initialised, each gradient
    filled once with fixed random values and marked as written by a backward pass (what
    Trainer.step checks). Named p000, p001, ... so that the Trainer's order (by name) is the
    model's."""
    import mxnet as mx
    import numpy as np
    params = mx.gluon.ParameterDict()
    for index, shape in enumerate(scaled_shapes(model, byte_scale)):
        params.get("p%03d" % index, shape=shape, init=mx.init.Uniform(0.05))
    params.initialize(ctx=mx.cpu())
    rng = np.random.RandomState(seed)
    for param in params.values():
        param.grad()[:] = rng.normal(0.0, 1e-3, param.shape).astype(np.float32)
        # A dist store's Trainer never resets this flag (its update happens on the store),
        # so once is enough.
        param.data()._fresh_grad = True
    return params


def wait_for_weights(weights):
    """Waits until every array of `weights` is written (what a step's forward waits for);
    returns the seconds waited. A step's `settle` in the throughput benchmark."""
    tic = time.perf_counter()
    for weight in weights:
        weight.wait_to_read()
    return time.perf_counter() - tic


#: the phases of a paced step, in order (paced_step records each step's seconds in them)
PHASES = ("wait_weights", "compute", "issue")


def paced_step(params, compute_seconds, trainer=None, batch_size=1):
    """A function that runs one paced step: wait until the weights the last step made are
    there (a forward reads them), wait `compute_seconds` less the time the last Trainer.step
    call took (on an accelerator the framework issues the step's exchange while the backward
    pass runs, so that time overlaps the computation; here the wait and the call take turns
    on one thread), then `trainer.step(batch_size)` where a Trainer is given.

    The function's `phases` list gets one (wait_weights, compute, issue) tuple of seconds per
    step (PHASES): where a step's time goes on the worker, the first being the time the
    exchange kept it from starting its computation. Its `settle()` waits for the weights as a
    step's start does (the benchmark's window edges and progress lines,
    throughput_job.timed); that wait counts in the next step's wait_weights, so that the
    records add up to the steps' time."""
    weights = [param.data() for param in params.values()]
    issued = [0.0]
    settled = [0.0]
    phases = []

    def settle():
        settled[0] += wait_for_weights(weights)

    def step():
        waited = wait_for_weights(weights)
        ready = time.perf_counter()
        time.sleep(max(0.0, compute_seconds - issued[0]))
        computed = time.perf_counter()
        if trainer is not None:
            trainer.step(batch_size)
            issued[0] = time.perf_counter() - computed
        phases.append((settled[0] + waited, computed - ready,
                       issued[0] if trainer is not None else 0.0))
        settled[0] = 0.0
    step.phases = phases
    step.settle = settle
    return step


def phase_means(phases):
    """{phase: mean seconds} of paced steps' (wait_weights, compute, issue) records; {} for
    none."""
    if not phases:
        return {}
    return {name: sum(p[i] for p in phases) / len(phases) for i, name in enumerate(PHASES)}


def phases_line(phases):
    """One line of where the paced workers' steps went (measure_mode's `paced_phases`)."""
    return ("paced workers per step: %.1f ms waiting for weights (longest worker %.1f), "
            "%.1f ms computing, %.1f ms issuing the exchange"
            % (1e3 * phases["wait_weights"], 1e3 * phases["wait_weights_max"],
               1e3 * phases["compute"], 1e3 * phases["issue"]))
