"""What every worker of a job must agree on, checked collectively through the store:
the same parameter shapes (before a key is initialised) and the same number of steps (the
equal-steps rule: `equal_steps` at each epoch, and a check at exit). Without these checks
ps-lite aborts a worker, or the job waits forever (docs/reliability.md).

`WorkerAgreement` is a mixin of DistODSGD: it uses the store's `_store` (MXNet's dist store),
`_buffers`, `_global_optimizer`, `rank` and `num_workers`."""
import atexit
import os
import sys
import threading
import time

import mxnet as mx
import numpy as np

from . import server_updater as servers

# MXNet's own kController command id: the servers unpickle its body as an optimizer.
OPTIMIZER_COMMAND = 0

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


class WorkerAgreement(object):
    """Collective checks of DistODSGD (see the module's docstring)."""

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
        self._store._send_command_to_servers(OPTIMIZER_COMMAND,
                                             servers.control_key_command(server_id))
        shape = (self.num_workers, _COLUMNS)
        self._store.init(key, mx.nd.zeros(shape, dtype="float64"))
        self._control = {"key": key, "send": mx.nd.zeros(shape, dtype="float64"),
                         "recv": mx.nd.zeros(shape, dtype="float64"), "probe": 0,
                         "scratch": {}}
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
            self._store._send_command_to_servers(OPTIMIZER_COMMAND,
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
        # The probe's pushes and pulls may still be queued: finish them here, since MXNet's
        # exit handler drops queued engine work and the job would hang at exit.
        mx.nd.waitall()
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


def equal_steps(trainer_or_module, local_batches):
    """The number of steps every worker makes this epoch: the smallest `local_batches` over
    the workers (see DistODSGD.equal_steps). Call it on every worker at the start of every
    epoch and make exactly that many steps:

        n = odsgd.equal_steps(trainer, len(train_data))
        for batch, _ in zip(train_data, range(n)): ...

    `trainer_or_module`: a gluon.Trainer with kvstore='dist_odsgd' (before its first step
    too), a Module after init_optimizer, or the DistODSGD store itself."""
    from .kvstore import DistODSGD   # the store imports this module
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
