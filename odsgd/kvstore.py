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

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from .agreement import OPTIMIZER_COMMAND, WorkerAgreement, equal_steps  # noqa: F401
from .config import ODSGDConfig
from .environment import check_environment, exit_on_uncaught_exception
from .local_update import LocalUpdater, global_learning_rate
from .overlap import OverlapMeter, metrics_interval
from .server_updater import ServerOptimizer, learning_rate_command

LOG = logging.getLogger("odsgd")


class StoreType(str):
    """The type string 'dist_odsgd'. It also answers True to `'_sync' in t` and
    `'sync' in t`: MXNet's Module scales gradients by the number of workers exactly when
    `'_sync' in kv.type`, and OD-SGD's global update is synchronous (SPEC section 3)."""

    def __contains__(self, part):
        return str.__contains__(self, part) or part in ("_sync", "sync")


def _num_servers():
    return int(os.environ.get("DMLC_NUM_SERVER", "0") or 0)


def _server_pattern(fname):
    return fname.replace("%", "%%") + ".server%d"


class _UpdaterView(object):
    def __init__(self, optimizer):
        self.optimizer = optimizer


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


class DistODSGD(WorkerAgreement, KVStoreBase):
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
        exit_on_uncaught_exception()
        self._buffers = {}
        self._global_optimizer = None
        self._local = None
        self._server_lr = None
        self.overlap = OverlapMeter(metrics_interval())

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
        for k, v in zip(keys, values):
            self._check_same_shape(k, v)
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
        self._check_same_shape(key, value)
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
        if getattr(self, "_control", None) is None:
            # Every job gets the step-count check at exit (and equal_steps): a worker with
            # more or fewer steps than the others fails with the reason instead of hanging.
            # Armed at the first step, when the keys (int or str: MXNet never mixes them)
            # are known and every worker is at the same point (the arming is collective).
            self._arm_step_check()
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
            self.overlap.measure_wait(key, step, grads[0], buffers.current)
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
        scheduler = optimizer.lr_scheduler
        if scheduler is not None and type(scheduler).__module__.split(".")[0] == "gluoncv":
            # The servers unpickle the optimizer while `import mxnet` is still running there;
            # `import gluoncv` fails at that point and the job would hang.
            raise ValueError("the global optimizer's lr_scheduler is GluonCV's %s, which the "
                             "parameter servers cannot unpickle; use mx.lr_scheduler or "
                             "odsgd.training.schedule (GluonCV's schedules made server-safe)"
                             % type(scheduler).__name__)
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
        self._store._send_command_to_servers(OPTIMIZER_COMMAND, learning_rate_command(lr))
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
        """Saves this worker's OD-SGD states to `fname`: local states (momentum, adaptive
        variance), step counts, the last two global weights W_t and W_{t-1}, the global
        optimizer's update count (and the optimizer itself with `dump_optimizer`).

        On rank 0 it also has every server write its global optimizer states (e.g. SGD's
        momentum) and update counts to `fname + '.server<k>'` (k: the server's rank), on the
        servers' own file system. Call it on every worker after the same step, each with its
        own `fname` (the local states differ between workers), e.g.
        `trainer.save_states('ckpt-%d.states' % kv.rank)`; `odsgd.save_checkpoint` does that
        and saves the weights too. Everything pushed so far is applied first."""
        from . import server_updater as servers
        mx.nd.waitall()   # every step this worker pushed is applied; W_t has arrived
        optimizer = self._global_optimizer
        server_states = self.rank == 0 and optimizer is not None
        saved = {"format": 2, "config": self.config.as_dict(), "rank": self.rank,
                 "num_workers": self.num_workers, "num_servers": _num_servers(),
                 "steps": {k: b.step for k, b in self._buffers.items()},
                 "global_weights": {k: (b.current.asnumpy(), b.previous.asnumpy())
                                    for k, b in self._buffers.items()},
                 "local": self._local.get_states() if self._local else None,
                 "num_update": optimizer.num_update if optimizer is not None else None,
                 "server_states": server_states}
        if dump_optimizer:
            saved["optimizer"] = optimizer
        temporary = fname + ".tmp"
        with open(temporary, "wb") as f:
            pickle.dump(saved, f)
        os.replace(temporary, fname)
        if server_states:
            self._store._send_command_to_servers(
                OPTIMIZER_COMMAND, servers.save_states_command(_server_pattern(fname)))

    def load_optimizer_states(self, fname):
        """Loads what save_optimizer_states wrote, after the keys were initialised (Trainer's
        load_states does that first) and before the next step. On rank 0 it also has the
        servers load their global optimizer states from `fname + '.server<k>'`; the job must
        have as many servers as the one that saved. The global weights on the servers come
        from rank 0's parameters when the keys are initialised: load them into the parameters
        first (`odsgd.load_checkpoint` does all of this)."""
        from . import server_updater as servers
        with open(fname, "rb") as f:
            saved = pickle.load(f)
        if saved.get("server_states") and saved.get("num_servers") != _num_servers():
            raise ValueError("%s was saved by a job with %s servers, this job has %d: start it "
                             "with -s %s (each server holds its own part of the states)"
                             % (fname, saved.get("num_servers"), _num_servers(),
                                saved.get("num_servers")))
        if saved.get("rank", self.rank) != self.rank:
            LOG.warning("odsgd: worker %d loads the states that worker %d saved (%s)",
                        self.rank, saved["rank"], fname)
        for key, (current, previous) in saved["global_weights"].items():
            if key not in self._buffers:
                raise ValueError("saved states have key %r, which this store has not "
                                 "initialised" % (key,))
            buffers = self._buffers[key]
            if buffers.current.shape != current.shape:
                raise ValueError("saved states of key %r have shape %s, the parameter has %s"
                                 % (key, current.shape, buffers.current.shape))
        for key, (current, previous) in saved["global_weights"].items():
            buffers = self._buffers[key]
            buffers.current[:] = current
            buffers.previous[:] = previous
            buffers.step = saved["steps"][key]
        if saved.get("local") is not None:
            if self._local is None:
                raise ValueError("call set_optimizer before load_optimizer_states")
            context = next(iter(self._buffers.values())).current.context
            self._local.set_states(saved["local"], context)
        if saved.get("num_update") is not None and self._global_optimizer is not None:
            self._global_optimizer.num_update = saved["num_update"]
        if saved.get("server_states") and self.rank == 0:
            if self._global_optimizer is None:
                raise ValueError("call set_optimizer before load_optimizer_states")
            pattern = _server_pattern(fname)
            missing = [pattern % k for k in range(_num_servers())
                       if not os.path.exists(pattern % k)]
            if missing:
                raise ValueError("the servers' states %s are missing (written beside %s by "
                                 "rank 0's save_optimizer_states)" % (", ".join(missing), fname))
            self._store._send_command_to_servers(
                OPTIMIZER_COMMAND, servers.load_states_command(pattern))

    @property
    def _updater(self):
        """What gluon.Trainer.load_states reads back (`kv._updater.optimizer`): the global
        optimizer, which keeps its settings (only its update count is loaded)."""
        return _UpdaterView(self._global_optimizer)

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


