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


#: seconds a worker waits for the scheduler at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT to listen,
#: and for what listens there to greet as a ZeroMQ peer does at once
SCHEDULER_WAIT_SECONDS = 120.0
SCHEDULER_GREETING_SECONDS = 5.0
# What a ZeroMQ peer (ps-lite's scheduler) sends first on a new connection (ZMTP signature).
_ZMTP_SIGNATURE_START = b"\xff"


def check_environment(environ=None, probe_scheduler=True):
    """Raises ValueError naming the launcher when a DMLC_* variable a worker needs is missing
    or malformed, or when no ps-lite scheduler answers at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT
    within SCHEDULER_WAIT_SECONDS (ps-lite would abort or wait forever instead)."""
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
        if value < 1 or (name == "DMLC_PS_ROOT_PORT" and value > 65535):
            raise ValueError("%s=%r must be a positive integer%s" % (
                name, environ[name], " (a TCP port, 1-65535)" if name == "DMLC_PS_ROOT_PORT"
                else ""))
    if probe_scheduler:
        _check_scheduler(environ["DMLC_PS_ROOT_URI"], int(environ["DMLC_PS_ROOT_PORT"]),
                         SCHEDULER_WAIT_SECONDS)


def _check_scheduler(host, port, wait):
    """Connects to the scheduler's port once, as ps-lite will: ValueError when the host does
    not resolve, when nothing listens there for `wait` seconds, or when what listens is not a
    ZeroMQ peer (another program holds the port). ps-lite itself would wait forever."""
    import socket
    import time
    where = "DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT = %s:%d" % (host, port)
    try:
        socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError("%s: the host does not resolve (%s)" % (where, error)) from None
    deadline = time.time() + wait
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as connection:
                connection.settimeout(SCHEDULER_GREETING_SECONDS)
                try:
                    first = connection.recv(1)
                except socket.timeout:
                    first = b""
            if first == _ZMTP_SIGNATURE_START:
                return
            raise ValueError("%s: what listens there is not a ps-lite scheduler (another "
                             "program holds the port?); start the job with `python -m "
                             "odsgd.launch`, which picks a free port" % where)
        except OSError as error:   # refused, unreachable, timed out: not listening yet
            if time.time() > deadline:
                raise ValueError("%s: no scheduler listens there after %.0f s (%s); check the "
                                 "address, or start the job with `python -m odsgd.launch`"
                                 % (where, wait, error)) from None
            time.sleep(0.5)


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
        # gradient (untimed; the caller's gradient array, not the send buffer, whose copy
        # itself waits for the previous pull), then time only what is left of the wait.
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


# The step check's control key: a (num_workers, _COLUMNS) float64 table, one row per rank.
_CONTROL_INT_KEY = 99991          # int-key stores (gluon); 99991 * 9973 < 2**31 (ps-lite)
_CONTROL_STR_KEY = "__odsgd_control__"
_COLUMNS = 4
_PRESENT, _KIND, _STEPS, _VALUE = range(_COLUMNS)
_EPOCH, _EXIT = 1, 2
_DOING = {_EPOCH: "starts an epoch", _EXIT: "is exiting"}
#: seconds a probe round may complete before the control round does (message latency only)
_PROBE_WINDOW = 10.0


# Shape signatures (_check_same_shape): float64 [ndim, dtype code, dims..., 0 padding].
_SIGNATURE_SLOTS = 2 + 8
_SIGNATURE_INT_BASE = 100000      # int key k -> 100000 + k (k < 115000, ps-lite's key bound)
_SIGNATURE_STR_PREFIX = "__odsgd_shape__"
_DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool")


def _signature_key(key):
    if isinstance(key, str):
        return _SIGNATURE_STR_PREFIX + key
    if 0 <= key < 115000:
        return _SIGNATURE_INT_BASE + key
    return None


def _signature(value):
    import numpy as np
    shape = tuple(value.shape)
    dtype = np.dtype(value.dtype).name
    signature = np.zeros(_SIGNATURE_SLOTS, dtype="float64")
    signature[0] = len(shape)
    signature[1] = _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 99
    signature[2:2 + min(len(shape), 8)] = shape[:8]
    return signature


def _describe_signature(signature):
    ndim, code = int(signature[0]), int(signature[1])
    dtype = _DTYPES[code - 1] if 0 < code <= len(_DTYPES) else "another dtype"
    return "%s %s" % (tuple(int(d) for d in signature[2:2 + min(ndim, 8)]), dtype)


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
                _OPTIMIZER_COMMAND, servers.save_states_command(_server_pattern(fname)))

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
                _OPTIMIZER_COMMAND, servers.load_states_command(pattern))

    @property
    def _updater(self):
        """What gluon.Trainer.load_states reads back (`kv._updater.optimizer`): the global
        optimizer, which keeps its settings (only its update count is loaded)."""
        return _UpdaterView(self._global_optimizer)

    # -- same model on every worker --------------------------------------------------------
    def _check_same_shape(self, key, value):
        """Collective, before `key` is initialised: raises ValueError naming the key when this
        worker's array differs in shape or dtype from rank 0's, which initialises the
        servers. Without it ps-lite aborts the worker in the first pull ("Check failed:
        vals->size() == total_val"). Rank 0 publishes its signature through a small key of
        its own (one init, which is a barrier, and one pull per key, once)."""
        signature_key = _signature_key(key)
        if signature_key is None:
            return
        mine = _signature(value)
        self._store.init(signature_key, mx.nd.array(mine, dtype="float64"))
        if isinstance(signature_key, str):   # numbered by MXNet too (see _arm_step_check)
            self._string_keys_of_odsgd = getattr(self, "_string_keys_of_odsgd", 0) + 1
        theirs = mx.nd.zeros(mine.shape, dtype="float64")
        self._store.pull(signature_key, out=theirs)
        theirs = theirs.asnumpy()
        if not (theirs == mine).all():
            raise ValueError(
                "parameter shapes differ between workers: key %r is %s on worker %d but %s on "
                "rank 0; every worker must build the same model"
                % (key, _describe_signature(mine), self.rank, _describe_signature(theirs)))

    # -- equal step counts -----------------------------------------------------------------
    def equal_steps(self, local_batches):
        """Returns the number of steps every worker makes this epoch: the smallest
        `local_batches` over the workers. A collective call: every worker calls it at the
        start of every epoch and then makes exactly that many steps (pushpull per key),
        dropping its extra batches. `odsgd.equal_steps(trainer, n)` calls it for a Trainer.

        It also checks that every worker has made the same number of steps so far, and from
        its first call on, checks the same at exit: a worker that makes more or fewer steps
        than the others ends with a ValueError naming the rule instead of leaving the job
        waiting for its pushes forever (docs/reliability.md)."""
        if isinstance(local_batches, bool) or not isinstance(local_batches, int) or \
                local_batches < 0:
            raise ValueError("equal_steps needs this worker's number of batches, an int >= 0, "
                             "got %r" % (local_batches,))
        self._arm_step_check()
        table = self._control_round(_EPOCH, local_batches)
        return int(min(row[_VALUE] for row in table))

    def _local_steps(self):
        return max([b.step for b in self._buffers.values()] or [0])

    def _arm_step_check(self, string_keys=None):
        """Makes the control key (a collective init, once) and registers the exit check.
        `string_keys`: whether the store's keys are strings (Module) or ints (gluon); None:
        read from the keys initialised so far."""
        if getattr(self, "_control", None) is not None:
            return
        from . import server_updater as servers
        user_keys = list(self._buffers)
        if string_keys is None:
            if not user_keys:
                raise ValueError("equal_steps needs to know the store's keys: pass the "
                                 "gluon.Trainer or Module (odsgd.equal_steps(trainer, n)), or "
                                 "call it after kv.init")
            string_keys = isinstance(user_keys[0], str)
        if string_keys:
            # MXNet numbers string keys in the order they are initialised, from 0: the
            # parameters' and the shape checks' keys come first.
            key = _CONTROL_STR_KEY
            server_id = len(user_keys) + getattr(self, "_string_keys_of_odsgd", 0)
        else:
            key = server_id = _CONTROL_INT_KEY
        if key in self._buffers:
            raise ValueError("key %r is reserved by dist_odsgd's step check" % (key,))
        self._store._send_command_to_servers(_OPTIMIZER_COMMAND,
                                             servers.control_key_command(server_id))
        shape = (self.num_workers, _COLUMNS)
        self._store.init(key, mx.nd.zeros(shape, dtype="float64"))
        self._control = {"key": key, "send": mx.nd.zeros(shape, dtype="float64"),
                         "recv": mx.nd.zeros(shape, dtype="float64"), "probe": 0,
                         "scratch": {}}
        import atexit
        atexit.register(self._check_steps_at_exit)

    def _control_round(self, kind, value):
        """One all-reduce of (kind, steps made, value) over the workers, through the control
        key; returns the table (one row per rank) when every worker is at the same point.

        A worker that is further on cannot join the round: it waits for this worker's next
        push. So each worker first pushes its control row and then a *probe*: zeros for every
        parameter, in a round the servers do not apply. When the others are here too, both
        rounds complete together. When the parameters' round completes but the control round
        does not within _PROBE_WINDOW seconds, another worker pushed a real step instead:
        the step counts differ, and this raises ValueError instead of hanging."""
        import threading
        import time
        from . import server_updater as servers
        control = self._control
        mx.nd.waitall()   # this worker's pushes are all applied: the next round is the probe
        steps = self._local_steps()
        # Zeros pushed without the server optimizer would be stored as the weights.
        keys = list(self._buffers) if self._global_optimizer is not None else []
        for key in keys:
            if key not in control["scratch"]:
                control["scratch"][key] = self._buffers[key].current.copy()
        if keys:
            control["probe"] += 1
            self._store._send_command_to_servers(_OPTIMIZER_COMMAND,
                                                 servers.probe_command(control["probe"]))
        row = control["send"]
        row[:] = 0
        row[self.rank] = mx.nd.array([1, kind, steps, value], dtype="float64")
        self._store.push(control["key"], row)
        self._store.pull(control["key"], out=control["recv"])
        for key in keys:
            send = self._buffers[key].send
            send[:] = 0
            self._store.push(key, send)
            self._store.pull(key, out=control["scratch"][key])

        done = {"control": threading.Event(), "probe": threading.Event()}

        def wait(arrays, event):
            for array in arrays:
                array.wait_to_read()
            event.set()
        for name, arrays in (("control", [control["recv"]]),
                             ("probe", [control["scratch"][k] for k in keys])):
            threading.Thread(target=wait, args=(arrays, done[name]), daemon=True).start()
        probe_done_at = None
        while not done["control"].wait(0.05):
            if probe_done_at is None and done["probe"].is_set():
                probe_done_at = time.time()
            if probe_done_at is not None and time.time() - probe_done_at > _PROBE_WINDOW:
                raise ValueError(
                    "dist_odsgd: worker %d has made %d steps and %s, but another worker has "
                    "pushed step %d: the workers made different numbers of steps (e.g. shards "
                    "of different length). Every worker must make the same number of steps per "
                    "epoch: call n = odsgd.equal_steps(trainer, len(local_batches)) at the start "
                    "of each epoch and make exactly n steps"
                    % (self.rank, steps, _DOING[kind], steps + 1))
        table = control["recv"].asnumpy()
        if not all(table[:, _PRESENT] == 1) or len(set(table[:, _KIND])) > 1 or \
                len(set(table[:, _STEPS])) > 1:
            raise ValueError(
                "dist_odsgd: the workers made different numbers of steps: %s. Every worker "
                "must make the same number of steps per epoch: call n = "
                "odsgd.equal_steps(trainer, len(local_batches)) at the start of each epoch and "
                "make exactly n steps"
                % "; ".join("worker %d made %d steps and %s" % (rank, r[_STEPS], _DOING.get(
                    int(r[_KIND]), "?")) for rank, r in enumerate(table)))
        return table

    def _check_steps_at_exit(self):
        """At interpreter exit (after equal_steps armed it): every worker must have made the
        same number of steps; otherwise end with exit code 1 and the reason, where MXNet would
        wait in ps-lite's finalize barrier forever."""
        try:
            self._control_round(_EXIT, 0)
        except Exception as error:  # noqa: BLE001 - reported, then the worker ends
            sys.stderr.write("%s\n" % error)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(1)

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


def equal_steps(trainer_or_module, local_batches):
    """The number of steps every worker makes this epoch: the smallest `local_batches` over
    the workers (see DistODSGD.equal_steps). Call it on every worker at the start of every
    epoch and make exactly that many steps:

        n = odsgd.equal_steps(trainer, len(train_data))
        for batch, _ in zip(train_data, range(n)): ...

    `trainer_or_module`: a gluon.Trainer with kvstore='dist_odsgd' (before its first step
    too), a Module after init_optimizer, or the DistODSGD store itself."""
    owner = trainer_or_module
    if isinstance(owner, DistODSGD):
        return owner.equal_steps(local_batches)
    if isinstance(owner, mx.gluon.Trainer):
        kv = owner._kvstore if owner._kv_initialized else owner._kvstore_params["kvstore"]
        if isinstance(kv, str) and kv.lower() == "dist_odsgd":
            # Created here, not by the Trainer: the Trainer sets the optimizer's rescale_grad
            # from its first step's batch size before it initialises the store.
            kv = mx.kv.create(kv)
            owner._kvstore_params["kvstore"] = kv
        string_keys = False
    else:                                                      # Module
        kv = getattr(owner, "_kvstore", None)
        string_keys = True
    if not isinstance(kv, DistODSGD):
        raise ValueError("equal_steps needs a Trainer or Module that trains with "
                         "kvstore='dist_odsgd' (a Module after init_optimizer), or the "
                         "DistODSGD store; got %r" % type(trainer_or_module).__name__)
    kv._arm_step_check(string_keys)
    return kv.equal_steps(local_batches)
