"""What the parameter servers run: the global optimizer, wrapped so that the workers can
change its learning rate, save and load its states, and use a control key, while it keeps its
states.

MXNet's servers accept exactly one command from a worker: a pickled optimizer, which replaces
their updater (and with it every optimizer state). `ServerOptimizer` keeps the states itself,
keyed by parameter, so a replacement loses nothing. Each command below pickles to a call that
acts on this server process (changes the rate, writes or reads the states, ...) and hands the
running `ServerOptimizer` back, which the server installs again.

The workers' keys carry one parameter, several packed end to end, or a part of a big one
(odsgd/worker/key_groups.py; each key's packing registered by `group_packings_command`): a round
applies the optimizer to each parameter's piece on its own, with that parameter's index for the
optimizer, so that lr_mult, wd_mult, the schedule count and the optimizer state are each
parameter's, exactly as dist_sync's servers apply them when every parameter has its own key
(the state of a parameter cut into parts is kept per piece, as dist_sync's servers keep theirs
per slice of a big array; saved whole per parameter, odsgd/server/states.py).

Workers send every command through `send_command` (MXNet's optimizer command, the one channel
from a worker to the servers). Besides the parameters, `ServerOptimizer` knows two kinds of
rounds that are not SGD steps:

* rounds of a *control key* (registered by `control_key_command`): the server stores the sum of
  the workers' pushes as it is, which makes the key a small all-reduce (used by
  `DistODSGD.equal_steps` and the step check at exit);
* *probe* rounds (announced by `probe_command`, naming the keys probed): the next completed
  round of each of those keys after the announcement is not applied (a key created later, or
  one not pushed for a while, keeps its next real round). Workers push zeros in it to learn,
  without changing the model, whether another worker is still pushing real steps
  (agreement.py, `_control_round`).

A command that fails on a server (e.g. a checkpoint file it cannot read) ends that server with
exit code 1 and a message, so that `odsgd.launch` ends the job and shows it, instead of a
worker waiting forever.

This module is unpickled on the servers while `import mxnet` is still running there (the server
loop starts inside it), so it imports only `mxnet.optimizer` and `mxnet.ndarray`, which are
ready by then, and odsgd.common.state_files and odsgd.server.states, which need no MXNet.
"""
import gc
import math
import os
import pickle
import sys
import traceback

from mxnet.optimizer import Optimizer

from . import states as server_states
from ..common import job_watch
from ..common.config import bigarray_bound
from ..common.rates import ScheduleAtAnyCount
from ..common.state_files import write_atomically

#: The ServerOptimizer this server process runs (None on workers).
_RUNNING = None
#: Server-side ids of the control keys: their rounds store the sum of the pushes.
_CONTROL_KEYS = set()
#: Server key -> [(optimizer index, offset, size, offset in the parameter or -1 when the key
#: holds all of it)] of the parameters it carries.
_GROUPS = {}
#: Server key -> the global step of its next round (told by the workers,
#: `round_steps_command`), which sets the update count of that round.
_ROUND_STEPS = {}
#: (optimizer index, global step) of a parameter with several parts on this server -> [its
#: update count before that round, taken by the first of its parts to arrive; the parts still
#: to come] (`_pinned_counts`).
_SPLIT_COUNTS = {}
#: optimizer index -> the server keys of this server that carry a part of it (`_local_parts`)
_LOCAL_PARTS = {}
#: (this server's rank, the job's number of servers), once known (`_this_server`)
_SERVER = []
#: Newest probe announced by a worker, and per parameter the probe whose round was skipped.
_PROBING = {}   # server key: the newest probe round announced for it
_PROBED = {}    # server key: the newest probe round taken out of its rounds


class ServerOptimizer(Optimizer):
    """The global optimizer as the servers apply it: `optimizer`'s own update, unchanged, on
    the sum of the workers' gradients (what `dist_sync` does), with states that survive a
    learning-rate change.

    Parameters
    ----------
    optimizer : mx.optimizer.Optimizer
        The Trainer's or Module's optimizer (e.g. SGD with momentum); its rescale_grad, clip,
        wd and lr schedule apply as set. Its update counter counts global steps, since the
        servers update each key once per step.
    """

    def __init__(self, optimizer):
        if not isinstance(optimizer, Optimizer):
            raise TypeError("the global optimizer must be an mx.optimizer.Optimizer, got %r"
                            % type(optimizer).__name__)
        super(ServerOptimizer, self).__init__(
            rescale_grad=optimizer.rescale_grad, learning_rate=optimizer.lr,
            multi_precision=optimizer.multi_precision)
        self.optimizer = optimizer
        # The Updater batches keys into one call when aggregate_num > 0, as for the optimizer.
        self.aggregate_num = optimizer.aggregate_num
        #: (optimizer index, first element) of each piece of a parameter this server holds
        #: (server_states.py) -> the optimizer's state of it, and the piece's size
        self.states = {}
        self.sizes = {}
        #: loaded states not cut into pieces yet, {index: [(first element, size, NumPy
        #: state)]}: a piece's state is cut from them when the piece is first updated (only
        #: where set_states was given no pieces: a process that is no server)
        self.loaded = {}
        #: the parameters of the last states loaded: a piece of one of them that was not cut
        #: at the load is an error, never a fresh state
        self.loaded_indices = frozenset()

    def __setstate__(self, state):
        # Unpickled on a server: this object becomes the one the commands below act on.
        global _RUNNING
        super(ServerOptimizer, self).__setstate__(state)
        if self.optimizer.lr_scheduler is not None:
            self.optimizer.lr_scheduler = ScheduleAtAnyCount(self.optimizer.lr_scheduler)
        _RUNNING = self

    @property
    def learning_rate(self):
        return self.optimizer.learning_rate

    def set_learning_rate(self, lr):
        self.optimizer.set_learning_rate(lr)
        self.lr = lr

    def _set_current_context(self, device_id):
        self.optimizer._set_current_context(device_id)

    def create_state_multi_precision(self, index, weight):
        # MXNet's Updater asks by server key (again after each command). The states belong to
        # the parameters, by their optimizer index, a name space of its own: _update_group.
        if index in _CONTROL_KEYS or index in _GROUPS:
            return None
        return self._state(index, weight)

    def _state(self, index, weight, begin=0):
        """The optimizer state of the piece of parameter `index` from element `begin` on that
        `weight` (flat) holds: loaded, made, or as it is."""
        key = (index, begin)
        if key not in self.states:
            size = int(weight.size)
            if index in self.loaded:
                self._cut_loaded(self.loaded, index, begin, size)
            elif index in self.loaded_indices:
                _fail("the optimizer state of elements %d to %d of parameter %d: the loaded "
                      "states were cut for the pieces this server held at the load, and this "
                      "is not one of them" % (begin, begin + size, index))
            else:
                self.states[key] = self.optimizer.create_state_multi_precision(index, weight)
                self.sizes[key] = size
        return self.states[key]

    def _cut_loaded(self, parameters, index, begin, size):
        """The state of elements [begin, begin + size) of parameter `index`, cut from the loaded
        `parameters` into self.states."""
        try:
            state = _from_numpy(server_states.piece(parameters[index], begin, size))
        except ValueError:
            _fail("restoring the optimizer state of elements %d to %d of parameter %d "
                  "from the loaded states" % (begin, begin + size, index))
        self.states[(index, begin)] = state
        self.sizes[(index, begin)] = size

    def create_state(self, index, weight):
        return self.create_state_multi_precision(index, weight)

    def update(self, index, weight, grad, state):
        self._update(self.optimizer.update, index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._update(self.optimizer.update_multi_precision, index, weight, grad, state)

    def _update(self, apply, index, weight, grad, state):
        """`apply` on the parameters among `index` (one key, or a list when MXNet's Updater
        aggregates), after control-key and probe rounds are taken out and fused keys are
        split into their parameters."""
        # MXNet's server sums the last push into `grad` on its engine and frees that push's
        # message when its handler returns, waiting only for `weight`. A round that does not
        # read `grad` (a probe round) would leave the sum reading freed memory.
        for merged in (grad if isinstance(grad, (list, tuple)) else [grad]):
            merged.wait_to_read()
        if not isinstance(index, (list, tuple)):
            if not _round_handled(index, weight, grad):
                if index in _GROUPS:
                    self._group_round(apply, index, weight, grad)
                else:
                    apply(index, weight, grad, state)
            return
        kept = [i for i, key in enumerate(index) if not _round_handled(key, weight[i], grad[i])]
        plain = [i for i in kept if index[i] not in _GROUPS]
        if plain:
            apply([index[i] for i in plain], [weight[i] for i in plain],
                  [grad[i] for i in plain], [state[i] for i in plain])
        for i in kept:
            if index[i] in _GROUPS:
                self._group_round(apply, index[i], weight[i], grad[i])

    def _group_round(self, apply, key, weight, grad):
        """One round of a group key at the update count dist_sync's servers have in that
        round. Rounds of different keys may arrive in any order (odsgd/worker/exchange.py); dist_sync
        applies every key's round t before any round t+1, so its count in round t is
        begin_num_update + t + 1 for every key that trains every step. `_update_count` then
        only raises it to the parameter's own count, which is never higher."""
        packing = _GROUPS[key]
        step = _ROUND_STEPS.get(key)
        if step is None:
            self._update_group(apply, packing, weight, grad)
            return
        _ROUND_STEPS[key] = step + 1
        self.optimizer.num_update = self.optimizer.begin_num_update + step + 1
        restore = _pinned_counts(self.optimizer, packing, step)
        self._update_group(apply, packing, weight, grad)
        counts = self.optimizer._index_update_count
        for index, count in restore.items():
            counts[index] = max(counts[index], count)

    def _update_group(self, apply, packing, weight, grad):
        """The optimizer on each parameter of a fused key: its part of the flat weight and
        gradient (views, so the update writes the key's weight), its own index and state. The
        parameters go in batches of the optimizer's aggregate_num, as MXNet's Updater batches
        keys; the optimizer's batched and single kernels compute the same per element."""
        if len(packing) == 1:
            # One parameter: the whole array, a part of it (key_groups.py), or the slice of it
            # this server holds when MXNet slices a big array over the servers (as
            # dist_sync's servers update their slice).
            index, _, size, part_of = packing[0]
            begin = max(part_of, 0)
            if int(weight.size) != size:
                begin += _mxnet_slice_begin(size)
            apply(index, weight, grad, self._state(index, weight, begin))
            return
        indices = [index for index, _, _, _ in packing]
        weights = [weight[o:o + n] for _, o, n, _ in packing]
        grads = [grad[o:o + n] for _, o, n, _ in packing]
        states = [self._state(i, w, max(p[3], 0)) for i, w, p in zip(indices, weights, packing)]
        batch = max(1, self.aggregate_num or 1)
        for start in range(0, len(indices), batch):
            part = slice(start, start + batch)
            if batch == 1:
                apply(indices[start], weights[start], grads[start], states[start])
            else:
                apply(indices[part], weights[part], grads[part], states[part])

    # -- checkpoints -----------------------------------------------------------------------
    def get_states(self, global_step):
        """This server's states file (server_states.server_file) after `global_step` steps:
        its pieces' states (NumPy) and the global optimizer's update counts (which its
        learning-rate schedule reads)."""
        optimizer = self.optimizer
        pieces = {}
        for (index, begin), state in self.states.items():
            pieces.setdefault(index, []).append((begin, self.sizes[(index, begin)],
                                                 _to_numpy(state)))
        counts = {device: dict(c) for device, c in
                  getattr(optimizer, "_all_index_update_counts",
                          {0: optimizer._index_update_count}).items()}
        rank, _ = _this_server()
        return server_states.server_file(pieces, optimizer.num_update, counts, rank,
                                         global_step)

    def set_states(self, saved, pieces=None, laid_out=()):
        """Loads a whole-parameter states file (server_states.join). `pieces`: [(index, first
        element, size)], the pieces this server holds in the job's layout (`_held_pieces`):
        their states are cut now. `laid_out`: the indices that layout puts on any server;
        their states held elsewhere are dropped. The rest of the file (parameters that no key
        of the layout holds yet, e.g. a layer frozen at the load and trained later, whose
        key may land on any server) is kept and cut when first updated, as is the whole file
        where `pieces` is None (a process that is no server)."""
        self.states, self.sizes = {}, {}
        parameters = dict(saved["parameters"])
        self.loaded_indices = frozenset(parameters)
        if pieces is None:
            self.loaded = parameters
        else:
            self.loaded = {i: state for i, state in parameters.items() if i not in laid_out}
            for index, begin, size in pieces:
                if index in parameters:
                    self._cut_loaded(parameters, index, begin, size)
        optimizer = self.optimizer
        optimizer.num_update = saved["num_update"]
        counts = {device: dict(c) for device, c in saved["index_update_counts"].items()}
        if hasattr(optimizer, "_all_index_update_counts"):
            optimizer._all_index_update_counts = counts
            optimizer._index_update_count = counts.setdefault(0, {})
        else:
            optimizer._index_update_count = counts.get(0, {})


def _this_server():
    """(rank, number of servers) of this server process; (0, 1) in a process that is no
    server (the tests drive a ServerOptimizer in-process: every key is its own there)."""
    if not _SERVER:
        try:
            _SERVER.extend((_server_rank(), int(os.environ.get("DMLC_NUM_SERVER", "1"))))
        except RuntimeError:
            _SERVER.extend((0, 1))
    return _SERVER[0], _SERVER[1]


def _mxnet_slice_begin(size):
    """The first element of the slice of a key of `size` elements that MXNet gives this
    server when it slices the key over the servers (src/kvstore/kvstore_dist.h,
    EncodeDefaultKey: server i holds [round(size / S * i), round(size / S * (i + 1))), with C's
    round, half away from zero)."""
    rank, count = _this_server()
    return _mxnet_slice(size, rank, count)[0]


def _mxnet_slice(size, rank, count):
    """[begin, end) of server `rank`'s slice of a key of `size` elements (see
    _mxnet_slice_begin)."""
    return (int(math.floor(float(size) / count * rank + 0.5)),
            int(math.floor(float(size) / count * (rank + 1) + 0.5)))


def _held_pieces(keys):
    """[(optimizer index, first element, size)] of the pieces of parameters that the server
    keys `keys` (registered by group_packings_command) put on this server."""
    rank, count = _this_server()
    pieces = []
    for key in keys:
        packing = _GROUPS.get(key)
        if packing is None:
            continue
        if len(packing) == 1 and packing[0][2] >= bigarray_bound():
            index, _, size, part_of = packing[0]
            begin, end = _mxnet_slice(size, rank, count)
            pieces.append((index, max(part_of, 0) + begin, end - begin))
        elif _holds_key(key):
            pieces.extend((index, max(part_of, 0), size) for index, _, size, part_of in packing)
    return pieces


def _laid_out(keys):
    """The optimizer indices that the server keys `keys` put on any server."""
    return frozenset(p[0] for key in keys for p in _GROUPS.get(key, ()))


def _holds_key(key):
    """Whether this server holds server key `key` (below MXNet's big-array bound, which every
    part is: config.part_elements): MXNet puts key k on server (k * 9973) % S
    (EncodeDefaultKey)."""
    rank, count = _this_server()
    return (key * 9973) % count == rank


def _pinned_counts(optimizer, packing, step):
    """Before round `step` of a key: the update count of each parameter that has several parts
    on this server, set to what it was before that round, so that its parts together count
    the round once, as dist_sync's servers count a parameter once per round (the first part
    to arrive counts it; the others count it again from the same start). Returns {index:
    count to keep at least} for after the round: the count a later round of another part may
    have reached. An entry is dropped when the last of the parameter's parts here has
    arrived, whatever the other parameters' steps are."""
    counts = optimizer._index_update_count
    restore = {}
    for index, _, _, part_of in packing:
        if part_of < 0:
            continue
        parts = _local_parts(index)
        if parts < 2:
            continue
        entry = _SPLIT_COUNTS.get((index, step))
        now = counts.get(index, optimizer.begin_num_update)
        if entry is None:
            _SPLIT_COUNTS[(index, step)] = [now, parts - 1]
            continue
        counts[index] = entry[0]
        restore[index] = now
        entry[1] -= 1
        if entry[1] == 0:
            del _SPLIT_COUNTS[(index, step)]
    return restore


def _local_parts(index):
    """How many server keys of this server carry a part of parameter `index` (counted once
    per registration of packings)."""
    if not _LOCAL_PARTS:
        for key, packing in _GROUPS.items():
            if _holds_key(key):
                for entry in packing:
                    if entry[3] >= 0:
                        _LOCAL_PARTS[entry[0]] = _LOCAL_PARTS.get(entry[0], 0) + 1
        _LOCAL_PARTS[None] = 0   # counted
    return _LOCAL_PARTS.get(index, 0)


def _round_handled(key, weight, grad):
    """True when the round of `key` is a control-key round (the sum is stored) or the probe
    round of a parameter (nothing is applied)."""
    if key in _CONTROL_KEYS:
        weight[:] = grad
        return True
    if _PROBED.get(key, 0) < _PROBING.get(key, 0):
        _PROBED[key] = _PROBING[key]
        return True
    return False


def _to_numpy(value):
    """A state with NumPy arrays for MXNet's (server_states.ARRAY leaves), picklable."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    if hasattr(value, "asnumpy"):
        return (server_states.ARRAY, value.asnumpy())
    return value


def _from_numpy(value):
    """The state `_to_numpy` made, with MXNet arrays again."""
    from mxnet import ndarray
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 2 and value[0] == server_states.ARRAY:
        return ndarray.array(value[1], dtype=value[1].dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_from_numpy(v) for v in value)
    return value


class _StoreSum(Optimizer):
    """What a server does without an optimizer (it stores the sum of the pushes), for a command
    that arrives before the first kv.set_optimizer."""

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        if isinstance(index, (list, tuple)):
            for w, g in zip(weight, grad):
                w[:] = g
        else:
            weight[:] = grad

    update_multi_precision = update


def _installed():
    """The optimizer a command hands back to the server, which installs it (again)."""
    return _RUNNING if _RUNNING is not None else _StoreSum()


def _fail(what):
    """Ends this server with a message: a failed command must not leave the job waiting."""
    sys.stderr.write("odsgd server: %s failed:\n%s" % (what, traceback.format_exc()))
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def _server_rank():
    """This server's ps-lite rank (which part of each sliced array it holds)."""
    server_module = sys.modules.get("mxnet.kvstore.kvstore_server")
    server_class = getattr(server_module, "KVStoreServer", None)
    for obj in gc.get_objects():
        if server_class is not None and isinstance(obj, server_class):
            return obj.kvstore.rank
    raise RuntimeError("no KVStoreServer in this process: not a parameter server")


# -- commands ------------------------------------------------------------------------------
#: MXNet's own kController command id: a server unpickles the body of such a command and
#: installs the result as its optimizer (MXNet 1.9.1, python/mxnet/kvstore/kvstore_server.py,
#: `KVStoreServer._controller`, `cmd_id == 0`; the worker side is `KVStore.set_optimizer`).
OPTIMIZER_COMMAND = 0


def send_command(raw, body):
    """Sends `body` (one of the *_command bodies below) to every server of `raw`, MXNet's
    dist store: the store's one channel to the servers besides pushes and pulls. It uses
    MXNet's private `KVStore._send_command_to_servers` (python/mxnet/kvstore/kvstore.py),
    the call MXNet's own set_optimizer makes."""
    raw._send_command_to_servers(OPTIMIZER_COMMAND, body)


class _Command(object):
    """Pickles to `function(*args)`, which runs on each server when it unpickles the command
    and returns the optimizer the server installs."""

    def __init__(self, function, *args):
        self.function = function
        self.args = args

    def __reduce__(self):
        return (self.function, self.args)


def _command(function, *args):
    # A str, as MXNet's set_optimizer sends it (pickle protocol 0 is ASCII).
    return pickle.dumps(_Command(function, *args), 0).decode("ascii")


def _apply_learning_rate(lr):
    """Runs on a server when a learning-rate command is unpickled; returns the running
    optimizer, which the server then installs again (states kept, see ServerOptimizer)."""
    if _RUNNING is None:
        raise RuntimeError("odsgd: learning-rate command before the optimizer reached this "
                           "server; call kv.set_optimizer first")
    _RUNNING.set_learning_rate(lr)
    return _RUNNING


def learning_rate_command(lr):
    """The body of the command that sets the servers' learning rate to `lr`."""
    return _command(_apply_learning_rate, float(lr))


def _register_packings(packings):
    for key, packing in packings.items():
        _GROUPS[key] = [tuple(int(x) for x in entry) for entry in packing]
    _LOCAL_PARTS.clear()
    return _installed()


def group_packings_command(packings):
    """The body of the command that tells the servers which parameters their keys carry,
    {server key: [(optimizer index, offset, size, offset in the parameter or -1), ...]}
    (odsgd/worker/key_groups.py, `KeyGroup.packing`)."""
    return _command(_register_packings,
                    {int(key): [tuple(int(x) for x in e) for e in packing]
                     for key, packing in packings.items()})


def _set_round_steps(steps):
    _ROUND_STEPS.update(steps)
    return _installed()


def round_steps_command(steps):
    """The body of the command that tells the servers the global step of each key's next
    round, {server key: step} (keys registered by group_packings_command before)."""
    return _command(_set_round_steps, {int(key): int(step) for key, step in steps.items()})


def _apply_multipliers(multipliers):
    if _RUNNING is None:
        raise RuntimeError("odsgd: multipliers command before the optimizer reached this "
                           "server; call kv.set_optimizer first")
    for index, (lr_mult, wd_mult) in multipliers.items():
        _RUNNING.optimizer.lr_mult[index] = lr_mult
        _RUNNING.optimizer.wd_mult[index] = wd_mult
    return _RUNNING


def multipliers_command(multipliers):
    """The body of the command that gives the servers' optimizer per-index multipliers,
    {index: (lr_mult, wd_mult)}: Gluon's Parameter.lr_mult / wd_mult, which the pickled
    optimizer loses on its way (MXNet drops its param_dict, see odsgd/common/rates.py)."""
    return _command(_apply_multipliers, {int(i): (float(a), float(b))
                                         for i, (a, b) in multipliers.items()})


def _register_control_key(key):
    _CONTROL_KEYS.add(key)
    return _installed()


def control_key_command(key):
    """The body of the command that makes `key` (the server-side int id) a control key."""
    return _command(_register_control_key, int(key))


def _start_probe(probe, keys):
    for key in keys:   # every worker announces the same round: taken once
        _PROBING[key] = max(_PROBING.get(key, 0), probe)
    return _installed()


def probe_command(probe, keys):
    """The body of the command that announces probe round number `probe` (1, 2, ...) of the
    server keys `keys`: the next completed round of each of them is not applied."""
    return _command(_start_probe, int(probe), [int(k) for k in keys])


def _watch_workers(workers):
    job_watch.watch_job(workers, "server %d" % _this_server()[0])
    return _installed()


def watch_workers_command(workers):
    """The body of the command that has every server watch the workers, {rank: (address,
    port, token)}, and end when they have all ended (odsgd/common/job_watch.py)."""
    return _command(_watch_workers, {int(r): (str(h), int(p), [float(t) for t in token])
                                     for r, (h, p, token) in workers.items()})


def server_states_path(pattern, rank):
    """File of server `rank` for a pattern with one %d (e.g. 'ckpt.states.server%d')."""
    return pattern % rank


def _on_states_file(what, act):
    """Runs `act()` and hands the running optimizer back; any failure ends this server with a
    message naming `what`."""
    try:
        if _RUNNING is None:
            raise RuntimeError("no optimizer on this server: call kv.set_optimizer first")
        act()
    except Exception:  # noqa: BLE001 - reported, then the server ends
        _fail(what)
    return _RUNNING


def _save_states(pattern, global_step):
    rank, _ = _this_server()
    path = server_states_path(pattern, rank)
    return _on_states_file(
        "server rank %d, saving the optimizer states to %s" % (rank, path),
        lambda: write_atomically(path, _RUNNING.get_states(global_step)))


def save_states_command(pattern, global_step):
    """The body of the command that makes every server write the states of the pieces it
    holds to `pattern % server_rank` (server_states.server_file), as of `global_step` steps."""
    return _command(_save_states, str(pattern), int(global_step))


def _load_states(path, global_step, keys):
    def load():
        saved = server_states.read(path, "the servers' states file")
        if saved["global_step"] != global_step:
            raise ValueError("%s holds the servers' states after step %d, but the worker "
                             "states after step %d: a save was cut short; load an earlier "
                             "checkpoint" % (path, saved["global_step"], global_step))
        _RUNNING.set_states(saved, _held_pieces(keys), _laid_out(keys))
    rank, _ = _this_server()
    return _on_states_file("server rank %d, loading the optimizer states from %s"
                           % (rank, path), load)


def load_states_command(path, global_step, keys):
    """The body of the command that makes every server load the whole-parameter states file
    `path` (server_states.join), saved after `global_step` steps (checked): each server
    keeps the states of the pieces that the server keys `keys` (the job's layout, their
    packings registered before) put on it, drops those they put on other servers, and keeps
    the parameters that no key holds yet (ServerOptimizer.set_states)."""
    return _command(_load_states, str(path), int(global_step), [int(k) for k in keys])
