"""`DistODSGD`: the `dist_odsgd` KVStore, One-step Delay SGD over MXNet's own `dist_sync`.

The servers run MXNet's synchronous parameter server unchanged, with the global optimizer
wrapped in `ServerOptimizer`. On a worker, `pushpull(key, grad, out=weight)` at step t:

1. copies the gradient into a send buffer of the store and pushes it (`dist_sync` push);
2. warm-up (t < warmup_steps): pulls W_{t+1} and copies it into `weight`, as `dist_sync`;
   OD phase: computes w_{t+1} from W_t, pulled during the previous step, and the gradient
   (`LocalUpdater`), then pulls W_{t+1} into a buffer of the store for step t+1.

The pull never lands in the gradient or the parameter array, so in MXNet's engine step t+1's
forward and backward depend on step t-1's pull only (through w_{t+1}), never on step t's push
or pull: that communication overlaps step t+1's computation.
"""
import logging
import os
import pickle
import sys

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from .config import ODSGDConfig
from .local_update import LocalUpdater, global_learning_rate
from .server_updater import ServerOptimizer, learning_rate_command

LOG = logging.getLogger("odsgd")

REQUIRED_ENVIRONMENT = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                        "DMLC_NUM_SERVER", "DMLC_NUM_WORKER")
# MXNet's own kController command id: the servers unpickle its body as an optimizer.
_OPTIMIZER_COMMAND = 0


class StoreType(str):
    """The type string 'dist_odsgd'. It also answers True to `'_sync' in t` and
    `'sync' in t`: MXNet's Module scales gradients by the number of workers exactly when
    `'_sync' in kv.type`, and OD-SGD's global update is synchronous (SPEC section 3)."""

    def __contains__(self, part):
        return str.__contains__(self, part) or part in ("_sync", "sync")


def check_environment(environ=None):
    """Raises ValueError naming the launcher when a DMLC_* variable a worker needs is missing
    or malformed (ps-lite would abort or wait forever instead)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in REQUIRED_ENVIRONMENT if not environ.get(name)]
    if missing:
        raise ValueError(
            "dist_odsgd needs a parameter-server job, but %s %s not set. Start the job with "
            "`python -m odsgd.launch -n WORKERS -s SERVERS --launcher local python "
            "train.py ...` (or set the DMLC_* variables by hand)"
            % (", ".join(missing), "is" if len(missing) == 1 else "are"))
    if environ["DMLC_ROLE"] != "worker":
        raise ValueError("dist_odsgd is created on workers only, but DMLC_ROLE=%r"
                         % environ["DMLC_ROLE"])
    for name in ("DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        try:
            value = int(environ[name])
        except ValueError:
            value = -1
        if value < (0 if name == "DMLC_PS_ROOT_PORT" else 1):
            raise ValueError("%s=%r must be a positive integer" % (name, environ[name]))


def _metrics_interval():
    text = os.environ.get("ODSGD_METRICS_INTERVAL", "0").strip() or "0"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError("ODSGD_METRICS_INTERVAL=%r must be an integer >= 0 (steps between "
                         "overlap measurements; 0 turns them off)" % text)
    return value


class OverlapMeter(object):
    """How well the pull of step t-1 hides behind step t's computation.

    Every `interval` global steps (0: never) the store blocks, before each key's local update,
    until W_t has arrived, and adds that wait to the step's total. A wait near 0 means the
    communication was hidden entirely; the benchmark compares it with the measured
    communication time. Sampling only every `interval` steps keeps the cost of blocking (it
    delays queueing the next keys' pushes) off the other steps.

    `summary()`: {'sampled_steps', 'mean_wait_s', 'max_wait_s', 'mean_step_s'}.
    """

    def __init__(self, interval):
        self.interval = interval
        self.waits = {}          # step -> seconds waited, summed over keys
        self._last_step = None
        self._step_times = []    # seconds between consecutive sampled-step starts

    def measure_wait(self, key, step, grad, global_weight):
        if not self.interval or step % self.interval:
            return
        import time
        # Python runs ahead of MXNet's engine: first let the engine reach this step's
        # gradient (untimed), then time only what is left of the wait for W_t.
        grad.wait_to_read()
        tic = time.time()
        global_weight.wait_to_read()
        wait = time.time() - tic
        if step not in self.waits:
            if self._last_step is not None:
                self._step_times.append((tic - self._last_step[1]) / (step - self._last_step[0]))
            self._last_step = (step, tic)
            if self.waits:
                LOG.info("odsgd overlap: step %d waited %.2f ms for the previous pull",
                         max(self.waits), 1e3 * self.waits[max(self.waits)])
        self.waits[step] = self.waits.get(step, 0.0) + wait

    def summary(self):
        waits = list(self.waits.values())
        return {"sampled_steps": len(waits),
                "mean_wait_s": sum(waits) / len(waits) if waits else None,
                "max_wait_s": max(waits) if waits else None,
                "mean_step_s": (sum(self._step_times) / len(self._step_times)
                                if self._step_times else None)}


def _exit_on_uncaught_exception():
    """Makes an uncaught exception end this worker at once with exit code 1.

    Otherwise MXNet's dist store, destroyed at exit, waits in ps-lite's finalize barrier for
    the other workers, which wait for this one: the job hangs (apache/mxnet#9611) instead of
    failing, and the launcher never learns of it."""
    previous = sys.excepthook
    if getattr(previous, "odsgd_fail_fast", False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    hook.odsgd_fail_fast = True
    sys.excepthook = hook


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_dense(arrays, what):
    for array in arrays:
        if getattr(array, "stype", "default") != "default":
            raise TypeError("dist_odsgd supports dense %s only, got stype %r; use "
                            "kvstore='dist_sync' for sparse parameters or gradients"
                            % (what, array.stype))


class _KeyBuffers(object):
    """The store's own arrays for one key.

    `send` receives the gradient to push. MXNet's CPU dist store pulls into the last pushed
    array, so each step's pull writes `send` too, and the copy of the next gradient waits for
    that pull: a worker's push t+1 is ordered after its pull t, hence after the servers
    finished update t. Without this order a fast worker's push t+1 could join the servers'
    round t (they count pushes, not workers). It costs no overlap: step t+1's local update
    waits for pull t in any case, and the backward of step t+1 depends only on pull t-1.

    `current` and `previous` hold the last two global weights W_t and W_{t-1}; they swap
    roles each step, so keeping W_{t-1} costs no copy."""

    def __init__(self, value):
        self.send = mx.nd.zeros(value.shape, value.context, dtype=value.dtype)
        self.current = value.copy()   # W_t
        self.previous = value.copy()  # W_{t-1}
        self.step = 0                 # global steps pushed for this key


class DistODSGD(KVStoreBase):
    """One-step Delay SGD KVStore (SPEC.md). Registered as kvstore type 'dist_odsgd'.

    Parameters
    ----------
    local_optimizer : str, optional
        'predict' (predict the pending global step from the global optimizer), 'sgd' (the
        authors' local SGD with its own rate) or any mx.optimizer name. Env ODSGD_LOCAL_OPTIMIZER.
    local_optimizer_params : dict, optional
        learning_rate, momentum, wd (env ODSGD_LOCAL_LR, _MOMENTUM, _WD), clip_gradient,
        lr_scheduler, beta and epsilon of the adaptive compensation, and, for an mx.optimizer
        local optimizer, its own arguments. Not changed by the store.
    compensation : float, optional
        lam, the delay-compensation strength; 0 turns it off. Env ODSGD_COMPENSATION.
    compensation_mode : {'constant', 'adaptive'}, optional
        Env ODSGD_COMPENSATION_MODE.
    warmup_steps : int, optional
        Global steps of plain synchronous SGD before the local updates start.
        Env ODSGD_WARMUP_STEPS.

    Constructor arguments win over the ODSGD_* environment variables (docs/env.md).
    """

    def __init__(self, local_optimizer=None, local_optimizer_params=None, compensation=None,
                 compensation_mode=None, warmup_steps=None):
        self.config = ODSGDConfig(local_optimizer, local_optimizer_params, compensation,
                                  compensation_mode, warmup_steps)
        check_environment()
        self._store = mx.kv.create("dist_sync")
        _exit_on_uncaught_exception()
        self._buffers = {}
        self._global_optimizer = None
        self._local = None
        self._server_lr = None
        self.overlap = OverlapMeter(_metrics_interval())

    # -- KVStoreBase properties ------------------------------------------------------------
    @property
    def type(self):
        return StoreType("dist_odsgd")

    @property
    def rank(self):
        return self._store.rank

    @property
    def num_workers(self):
        return self._store.num_workers

    @staticmethod
    def is_capable(capability):
        return capability.lower() == KVStoreBase.OPTIMIZER

    # -- initialisation --------------------------------------------------------------------
    def init(self, key, value):
        """Initialises keys with rank 0's values (as dist_sync); W_0 = value."""
        keys, values = _as_list(key), _as_list(value)
        _check_dense(values, "weights")
        self._store.init(key, value)
        for k, v in zip(keys, values):
            self._buffers[k] = _KeyBuffers(v)

    def broadcast(self, key, value, out, priority=0):
        """Rank 0's `value` to every worker's `out` (and to the store's W_0)."""
        if isinstance(key, (list, tuple)):
            for k, v, o in zip(key, value, out):
                self.broadcast(k, v, o, priority)
            return
        outs = _as_list(out)
        _check_dense([value] + outs, "weights")
        self._store.broadcast(key, value, out=outs, priority=priority)
        self._buffers[key] = _KeyBuffers(outs[0])

    # -- communication ---------------------------------------------------------------------
    def push(self, key, value, priority=0):
        """Pushes gradients (summed over `value`'s devices) for one global step, as
        dist_sync. Only `pushpull` makes local OD-SGD updates."""
        for k, grads in self._pairs(key, value):
            self._send(k, grads, priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Newest global weights (every pushed step applied) into `out`."""
        if out is None:
            raise ValueError("pull needs out=, the arrays that receive the global weights")
        _check_dense(_as_list(out) if not isinstance(key, (list, tuple)) else
                     [o for group in out for o in _as_list(group)], "weights")
        self._store.pull(key, out=out, priority=priority, ignore_sparse=ignore_sparse)

    def pushpull(self, key, value, out=None, priority=0):
        """One OD-SGD step for `key`: push the gradient `value` (NDArray or one per device)
        and write the next local weights into `out` (the parameter arrays)."""
        if out is None or out is value:
            raise ValueError(
                "dist_odsgd updates the weights itself and needs pushpull(key, grad, "
                "out=weight): create the Trainer with update_on_kvstore=True (the default) "
                "and do not set MXNET_UPDATE_ON_KVSTORE=0")
        if self._global_optimizer is None:
            raise ValueError("dist_odsgd has no optimizer: call kv.set_optimizer(...) first "
                             "(gluon.Trainer and Module.fit do it when update_on_kvstore=True)")
        self._sync_learning_rate()
        outs = [_as_list(o) for o in out] if isinstance(key, (list, tuple)) else [_as_list(out)]
        for (k, grads), weights in zip(self._pairs(key, value), outs):
            _check_dense(weights, "weights")
            self._step(k, grads, weights, priority)

    def _pairs(self, key, value):
        if isinstance(key, (list, tuple)):
            pairs = [(k, _as_list(v)) for k, v in zip(key, value)]
        else:
            pairs = [(key, _as_list(value))]
        for k, grads in pairs:
            if k not in self._buffers:
                raise ValueError("key %r was never initialised: call kv.init or "
                                 "kv.broadcast first" % (k,))
            _check_dense(grads, "gradients")
        return pairs

    def _send(self, key, grads, priority):
        """Copies (sums) the gradients into this step's send buffer and pushes it."""
        buffers = self._buffers[key]
        send = buffers.send
        if len(grads) == 1:
            grads[0].copyto(send)
        else:
            mx.nd.add_n(*[g.as_in_context(send.context) for g in grads], out=send)
        self._store.push(key, send, priority=priority)
        buffers.step += 1
        return send

    def _step(self, key, grads, weights, priority):
        buffers = self._buffers[key]
        step = buffers.step
        grad = self._send(key, grads, priority)
        if step >= self.config.warmup_steps:
            # W_t is buffers.current, pulled during step t-1 (or W_0).
            self.overlap.measure_wait(key, step, grad, buffers.current)
            self._local.update(key, step, weights[0], grad, buffers.current, buffers.previous)
            buffers.previous, buffers.current = buffers.current, buffers.previous
            self._store.pull(key, out=buffers.current, priority=priority)
        else:
            buffers.previous, buffers.current = buffers.current, buffers.previous
            self._store.pull(key, out=buffers.current, priority=priority)
            buffers.current.copyto(weights[0])
        for weight in weights[1:]:
            weights[0].copyto(weight)
        self._advance_schedule(step)

    # -- optimizer -------------------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """Sends `optimizer` to the servers (wrapped in ServerOptimizer) as the global
        optimizer, and uses its settings for the local updates."""
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError("set_optimizer needs an mx.optimizer.Optimizer, got %r"
                            % type(optimizer).__name__)
        if self.config.local_optimizer == "predict" and \
                type(optimizer) is not mx.optimizer.SGD:
            raise ValueError("local_optimizer='predict' predicts an SGD step and needs the "
                             "global optimizer 'sgd', got %r; use local_optimizer='sgd' "
                             "with another global optimizer" % type(optimizer).__name__)
        self._store.set_optimizer(ServerOptimizer(optimizer))
        self._global_optimizer = optimizer
        self._server_lr = optimizer.lr
        self._local = LocalUpdater(self.config, optimizer, self.num_workers)

    def _sync_learning_rate(self):
        """Sends a learning rate set on the worker (Trainer.set_learning_rate) to the servers,
        which MXNet's dist stores never do (apache/mxnet#15919)."""
        lr = self._global_optimizer.lr
        if lr == self._server_lr or self._global_optimizer.lr_scheduler is not None:
            return
        # Steps already pushed keep the old rate: let them reach the servers first (a rare
        # stall: learning rates change once an epoch or so).
        mx.nd.waitall()
        self._store._send_command_to_servers(_OPTIMIZER_COMMAND, learning_rate_command(lr))
        self._server_lr = lr
        LOG.info("odsgd: learning rate %g sent to the servers", lr)

    def _advance_schedule(self, step):
        # The worker's copy of the optimizer never updates, so its counter would stay at 0;
        # keep it at the global step so that trainer.learning_rate follows the schedule.
        optimizer = self._global_optimizer
        optimizer.num_update = max(optimizer.num_update, step + 1)

    def set_gradient_compression(self, compression_params):
        self._store.set_gradient_compression(compression_params)

    # -- checkpoints -----------------------------------------------------------------------
    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Saves this worker's local OD-SGD states (momentum, adaptive variance, step counts,
        the last two global weights). The servers' global optimizer states are not included."""
        saved = {"config": self.config.as_dict(),
                 "steps": {k: b.step for k, b in self._buffers.items()},
                 "global_weights": {k: (b.current.asnumpy(), b.previous.asnumpy())
                                    for k, b in self._buffers.items()},
                 "local": self._local.get_states() if self._local else None}
        if dump_optimizer:
            saved["optimizer"] = self._global_optimizer
        with open(fname, "wb") as f:
            pickle.dump(saved, f)

    def load_optimizer_states(self, fname):
        """Loads what save_optimizer_states wrote (after init/broadcast of the keys)."""
        with open(fname, "rb") as f:
            saved = pickle.load(f)
        for key, (current, previous) in saved["global_weights"].items():
            if key not in self._buffers:
                raise ValueError("saved states have key %r, which this store has not "
                                 "initialised" % (key,))
            buffers = self._buffers[key]
            buffers.current[:] = current
            buffers.previous[:] = previous
            buffers.step = saved["steps"][key]
        if saved.get("local") is not None:
            if self._local is None:
                raise ValueError("call set_optimizer before load_optimizer_states")
            context = next(iter(self._buffers.values())).current.context
            self._local.set_states(saved["local"], context)

    # -- helpers for users -----------------------------------------------------------------
    def global_learning_rate(self, step):
        return global_learning_rate(self._global_optimizer, step)

    def _barrier(self):
        self._store._barrier()


KVStoreBase.kv_registry["dist_odsgd"] = DistODSGD


def load_global_weights(trainer_or_module):
    """Copies the newest global weights W into the parameters of a gluon.Trainer (or a Module)
    that trains with dist_odsgd, e.g. before evaluation or saving: the worker's own weights
    are one local step away from W. Training may go on afterwards from W."""
    kv = getattr(trainer_or_module, "_kvstore", None)
    if kv is None or not isinstance(kv, DistODSGD):
        raise ValueError("load_global_weights needs a Trainer or Module that has trained with "
                         "kvstore='dist_odsgd' (call it after the first step)")
    if hasattr(trainer_or_module, "_params"):          # gluon.Trainer
        for index, param in enumerate(trainer_or_module._params):
            if param.grad_req != "null":
                kv.pull(index, out=param.list_data())
    else:                                              # Module
        group = trainer_or_module._exec_group
        for name, arrays in zip(group.param_names, group.param_arrays):
            kv.pull(name, out=arrays)
        trainer_or_module._params_dirty = True
    mx.nd.waitall()
