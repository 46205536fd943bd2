"""What every worker of a job must agree on, checked collectively through the store: the same
parameter shapes (before a key is initialised), the same fusion plan, and the same number of
steps (the equal-steps rule: `equal_steps` at each epoch, and a check at exit). Without these
checks ps-lite aborts a worker, or the job waits forever (docs/reliability.md).

`WorkerAgreement` is given the DistODSGD store it checks for; it uses the store's MXNet dist
store (`raw`), `rank`, `num_workers`, its global step count and its active key groups. The
keys it creates are server keys of the store's own range (odsgd/worker/key_groups.py), which never
shift what the servers' optimizer looks up.
"""
import atexit
import os
import sys
import threading
import time
import zlib

import mxnet as mx
import numpy as np

from ..common import config
from ..server import updater as servers
from . import failure_alarm
from .key_groups import CONTROL_KEY, GROUP_KEY_BASE, SIGNATURE_KEY_BASE

# The control key: a (num_workers, _COLUMNS) table, one row per rank. The servers keep
# every value as float32, exact for integers below 2**24 (step counts, batch counts).
_COLUMNS = 4
_PRESENT, _KIND, _STEPS, _VALUE = range(_COLUMNS)
_EPOCH, _EXIT = 1, 2
_DOING = {_EPOCH: "starts an epoch", _EXIT: "is exiting"}
#: the rule and the fix, in every step-count error
_EQUAL_STEPS_RULE = ("Every worker must make the same number of steps per epoch: call n = "
                     "odsgd.equal_steps(trainer, len(local_batches)) at the start of each "
                     "epoch and make exactly n steps")
#: seconds a probe round may complete before the control round does (message latency only)
_PROBE_WINDOW = 10.0

# Signatures (check_same): float64 [key, ndim, dtype code, dims..., 0 padding].
_SIGNATURE_SLOTS = 3 + 8
_DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool")
_SIGNATURE_LIMIT = GROUP_KEY_BASE - SIGNATURE_KEY_BASE


def key_number(key):
    """A number for a user's key, exact in float64: an int key itself, 24 bits of a CRC of a
    string key's name."""
    if isinstance(key, str):
        return float(zlib.crc32(key.encode("utf-8")) & 0xFFFFFF)
    return float(key)


def shape_signature(key, value):
    """The key, shape and dtype of a parameter as a float64 vector (check_same)."""
    shape = tuple(value.shape)
    dtype = np.dtype(value.dtype).name
    signature = np.zeros(_SIGNATURE_SLOTS, dtype="float64")
    signature[0] = key_number(key)
    signature[1] = len(shape)
    signature[2] = _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 99
    signature[3:3 + min(len(shape), 8)] = shape[:8]
    return signature


def describe_shape_signature(signature):
    ndim, code = int(signature[1]), int(signature[2])
    dtype = _DTYPES[code - 1] if 0 < code <= len(_DTYPES) else "another dtype"
    return "%s %s (key id %d)" % (tuple(int(d) for d in signature[3:3 + min(ndim, 8)]), dtype,
                                  int(signature[0]))


def describe_values(column):
    """'4 on ranks 0, 2; 8 on rank 1': the values of one setting over the workers."""
    ranks = {}
    for rank, value in enumerate(column):
        ranks.setdefault(value, []).append(rank)
    return "; ".join("%d on rank%s %s" % (value, "s" if len(r) > 1 else "",
                                            ", ".join(str(x) for x in r))
                     for value, r in sorted(ranks.items(), key=lambda item: item[1][0]))


def _zeros(group):
    """A probe round's data: zeros in every part's send array."""
    for part in group.parts:
        part.send[:] = 0


class StepCountError(ValueError):
    """The workers made different numbers of steps."""


class WorkerAgreement(object):
    """Collective checks of one DistODSGD store (see the module's docstring). Made when the
    store is made, on every worker: it creates the control key and registers the exit check
    then, so that a worker that never makes a step takes part in them too."""

    def __init__(self, store):
        self.store = store
        self.raw = store.raw
        self._signatures = 0
        self._probe = 0
        self._scratch = {}
        self._done_at_exit = False
        #: called when the exit check passed: this worker finished (failure_alarm.py)
        self.after_exit_check = None
        servers.send_command(self.raw, servers.control_key_command(CONTROL_KEY))
        shape = (store.num_workers, _COLUMNS)
        self.raw.init(CONTROL_KEY, mx.nd.zeros(shape, dtype="float64"))
        self._send = mx.nd.zeros(shape, dtype="float64")
        self._recv = mx.nd.zeros(shape, dtype="float64")
        atexit.register(self._check_steps_at_exit)

    # -- same model on every worker --------------------------------------------------------
    def _signature_key(self):
        """A fresh key of the store's signature range, or None when it is used up."""
        if self._signatures >= _SIGNATURE_LIMIT:
            return None
        self._signatures += 1
        return SIGNATURE_KEY_BASE + self._signatures - 1

    def gather(self, row):
        """Collective: every worker's float64 vector `row` (the same length on each), as a
        table with one row per rank. An all-gather through a fresh control key of the store's
        own: each worker pushes its row in its place and zeros elsewhere, the servers store the
        sum (server_updater.py, control keys)."""
        key = self._signature_key()
        row = np.asarray(row, dtype="float64")
        shape = (self.store.num_workers, len(row))
        servers.send_command(self.raw, servers.control_key_command(key))
        self.raw.init(key, mx.nd.zeros(shape, dtype="float64"))   # a barrier: all registered
        mine = np.zeros(shape, dtype="float64")
        mine[self.store.rank] = row
        table = mx.nd.zeros(shape, dtype="float64")
        self.raw.push(key, mx.nd.array(mine, dtype="float64"))
        self.raw.pull(key, out=table)
        return table.asnumpy()

    def check_layout(self, settings):
        """Collective, when the store is made: every worker has the same `settings`, [(name,
        int value)], the inputs of the servers' key layout (key_plan.layout_settings). A
        difference is a ValueError on every worker, naming the settings, their values and the
        ranks; ps-lite would abort a worker or a server instead, or the servers would mix
        parameters."""
        table = self.gather([value for _, value in settings])
        differ = [(name, table[:, i].astype(int)) for i, (name, _) in enumerate(settings)
                  if len(set(table[:, i])) > 1]
        if differ:
            raise ValueError(
                "dist_odsgd: the workers would lay out the servers' keys differently: %s. These "
                "settings decide which server holds which parameter: give every worker the same "
                "values (set them in the environment of the launch command, e.g. `%s=%d python "
                "-m odsgd.launch ...`, not per host)"
                % ("; ".join("%s is %s" % (name, describe_values(column))
                             for name, column in differ), differ[0][0], differ[0][1][0]))

    def check_same(self, mine, describe, what):
        """Collective: compares this worker's float64 vector `mine` with rank 0's, which rank 0
        publishes through a fresh key of the store's own (one init, which is a barrier, and one
        pull). Raises ValueError `what(mine_text, rank0_text)` on a difference."""
        key = self._signature_key()
        if key is None:
            return    # more keys than the signature range holds: checked the first ones
        mine = np.asarray(mine, dtype="float64")
        self.raw.init(key, mx.nd.array(mine, dtype="float64"))
        theirs = mx.nd.zeros(mine.shape, dtype="float64")
        self.raw.pull(key, out=theirs)
        theirs = theirs.asnumpy()
        if not (theirs == mine).all():
            raise ValueError(what(describe(mine), describe(theirs)))

    def check_same_shape(self, key, value):
        """Before `key` is initialised: ValueError naming the key when this worker's array
        differs in shape or dtype from rank 0's, which initialises the servers. Without it
        ps-lite aborts the worker in the first pull ("Check failed: vals->size() ==
        total_val")."""
        rank = self.store.rank
        self.check_same(
            shape_signature(key, value), describe_shape_signature,
            lambda mine, theirs: "parameter shapes differ between workers: key %r is %s on "
            "worker %d but %s on rank 0; every worker must build the same model and "
            "initialise its parameters in the same order" % (key, mine, rank, theirs))

    # -- equal step counts -----------------------------------------------------------------
    def fewest_batches(self, local_batches):
        """Collective: the smallest `local_batches` over the workers, which is the number of
        steps every worker makes this epoch (DistODSGD.equal_steps)."""
        if isinstance(local_batches, bool) or not isinstance(local_batches, int) or \
                local_batches < 0:
            raise ValueError("equal_steps needs this worker's number of batches, an int >= 0, "
                             "got %r" % (local_batches,))
        table = self._control_round(_EPOCH, local_batches)
        return int(min(row[_VALUE] for row in table))

    def _probe_groups(self):
        """The key groups whose rounds another worker may be waiting in."""
        if self.store.global_optimizer is None:
            return []   # zeros pushed without the server optimizer would be stored as weights
        return self.store.active_groups()

    def _control_round(self, kind, value, wait=None):
        """One all-reduce of (kind, steps made, value) over the workers, through the control
        key; returns the table (one row per rank) when every worker is at the same point.

        A worker that is further on cannot join the round: it waits for this worker's next
        push. So each worker first pushes its control row and then a *probe*: zeros for every
        parameter key, in a round the servers do not apply. When the others are here too, both
        rounds complete together. When the parameters' round completes but the control round
        does not within _PROBE_WINDOW seconds, another worker pushed a real step instead:
        the step counts differ, and this raises StepCountError instead of hanging. `wait`:
        seconds after which a control round that has not completed raises StepCountError
        (None: no limit)."""
        rank = self.store.rank
        mx.nd.waitall()   # this worker's pushes are all applied: the next round is the probe
        steps = self.store.global_step
        groups = self._probe_groups()
        if groups:
            self._probe += 1
            servers.send_command(self.raw, servers.probe_command(
                self._probe, [part.key for g in groups for part in g.parts]))
        self._send[:] = 0
        self._send[rank] = mx.nd.array([1, kind, steps, value], dtype="float64")
        self.raw.push(CONTROL_KEY, self._send)
        self.raw.pull(CONTROL_KEY, out=self._recv)
        scratches = []
        exchange = self.store.exchange
        for group in groups:
            scratch = group.scratch_buffer()
            exchange.round(group, group.global_step, _zeros, scratch, counted=False)
            scratches.append(scratch)

        done = {"control": threading.Event(), "probe": threading.Event()}

        def finish(arrays, event):
            for array in arrays:
                array.wait_to_read()
            event.set()
        for name, arrays in (("control", [self._recv]), ("probe", scratches)):
            threading.Thread(target=finish, args=(arrays, done[name]), daemon=True).start()
        started = time.time()
        probe_done_at = None
        while not done["control"].wait(0.05):
            if probe_done_at is None and groups and done["probe"].is_set():
                probe_done_at = time.time()
            if probe_done_at is not None and time.time() - probe_done_at > _PROBE_WINDOW:
                raise StepCountError(
                    "dist_odsgd: worker %d has made %d steps and %s, but another worker has "
                    "pushed step %d: the workers made different numbers of steps (e.g. shards "
                    "of different length). %s"
                    % (rank, steps, _DOING[kind], steps + 1, _EQUAL_STEPS_RULE))
            if wait is not None and time.time() - started > wait:
                raise StepCountError(
                    "dist_odsgd: worker %d has made %d steps and %s, and the other workers have "
                    "not come to the same point within %.0f s: they are waiting for this "
                    "worker's steps (a worker with an empty shard, or a loop that stopped "
                    "early). %s" % (rank, steps, _DOING[kind], wait, _EQUAL_STEPS_RULE))
        table = self._recv.asnumpy()
        if not all(table[:, _PRESENT] == 1) or len(set(table[:, _KIND])) > 1 or \
                len(set(table[:, _STEPS])) > 1:
            raise StepCountError(
                "dist_odsgd: the workers made different numbers of steps: %s. %s"
                % ("; ".join("worker %d made %d steps and %s" % (r, row[_STEPS], _DOING.get(
                    int(row[_KIND]), "?")) for r, row in enumerate(table)), _EQUAL_STEPS_RULE))
        # The probe's pushes and pulls may still be queued: finish them here, since MXNet's
        # exit handler drops queued engine work and the job would hang at exit.
        mx.nd.waitall()
        return table

    def _check_steps_at_exit(self):
        """At interpreter exit: every worker must have made the same number of steps;
        otherwise end with exit code 1 and the reason, where MXNet would wait in ps-lite's
        finalize barrier forever.

        A worker that made no step and holds no parameter key cannot probe: the others,
        if they made steps, wait in a barrier or a round for it and never reach their exit.
        It waits ODSGD_EXIT_WAIT seconds for them (config.exit_wait_seconds), then ends
        with the reason."""
        if self._done_at_exit:
            return
        self._done_at_exit = True
        if self.store.failed_step.failed:
            # The other workers wait for this worker's rounds of the failed step: no collective
            # can complete; end, so that the launcher ends the job.
            self._end_worker(self.store.failed_step.describe())
        idle = self.store.global_step == 0 and not self._probe_groups()
        try:
            self._control_round(_EXIT, 0, wait=config.exit_wait_seconds() if idle else None)
        except Exception as error:  # noqa: BLE001 - reported, then the worker ends
            self._end_worker(error)
        if self.after_exit_check is not None:
            self.after_exit_check()

    @staticmethod
    def _end_worker(reason):
        """Ends this worker with exit code 1 and `reason` on stderr (and to the job)."""
        failure_alarm.announce_failure(reason)
        sys.stderr.write("%s\n" % reason)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
