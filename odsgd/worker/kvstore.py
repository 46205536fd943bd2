"""`DistODSGD`: the `dist_odsgd` KVStore, One-step Delay SGD over MXNet's own `dist_sync`.

The servers run MXNet's synchronous parameter server unchanged, with the global optimizer
wrapped in `ServerOptimizer`. A step hands the store the gradients of every parameter at once:
`pushpull([k1, k2, ...], [grads...], out=[weights...])`, which is what gluon.Trainer and
Module do through odsgd/worker/trainer_hook.py (one call per step instead of one per parameter).
For each key group (odsgd/worker/key_groups.py: small parameters share one server key) at step t:

1. warm-up (t < warmup_steps): pushes the gradients, pulls W_{t+1} and copies it into the
   weights, as `dist_sync`;
2. OD phase: sends the gradients in a round whose answer, W_{t+1}, lands in a buffer of its
   own, and computes w_{t+1} of every parameter of the group in one operator from W_t, the
   answer of the previous step's round, and the gradients (`LocalUpdater`).

Each round goes through odsgd/worker/exchange.py: one push-with-pull request per part of the group,
which leaves as soon as the gradient is there and the servers applied the part's own round of
step t-1, without waiting for other parts or groups, and is answered with W_{t+1}; so the link
carries gradients in and global weights out at the same time. The answer never lands in a
gradient or a parameter array, so in MXNet's engine step t+1's forward and backward depend on
step t-1's round only (through w_{t+1}), never on step t's: that communication overlaps step
t+1's computation.
"""
import copy

import mxnet as mx
from mxnet.kvstore import KVStoreBase

from . import eval_weights, trace as timeline, states as worker_states
from ..common import job_key, rates
from ..server import updater as servers
from .agreement import WorkerAgreement
from .config import ODSGDConfig
from .environment import check_environment, exit_on_uncaught_exception
from .exchange import RoundExchange, scatter, summed_gradients
from .failed_step import FailedStep
from .failure_alarm import FailureAlarm
from .key_plan import KeyPlanner, check_dense, init_server_keys, layout_settings, pull_parts
from .local_update import LocalUpdater
from .overlap import OverlapMeter
from .server_settings import ServerSettings


class StoreType(str):
    """The type string 'dist_odsgd'. It also answers True to `'_sync' in t` and
    `'sync' in t`: MXNet's Module scales gradients by the number of workers exactly when
    `'_sync' in kv.type`, and OD-SGD's global update is synchronous (docs/spec.md, section 6)."""

    def __contains__(self, part):
        return str.__contains__(self, part) or part in ("_sync", "sync")


class _UpdaterView(object):
    def __init__(self, optimizer):
        self.optimizer = optimizer


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class DistODSGD(KVStoreBase):
    """One-step Delay SGD KVStore (docs/spec.md). Registered as kvstore type 'dist_odsgd'.

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

    Constructor arguments win over the ODSGD_* environment variables (docs/env.md). Making
    the store is collective: every worker of the job makes one, and they check then that they
    lay out the servers' keys alike (key_plan.layout_settings).

    The methods take MXNet's `priority` argument and leave it unused: MXNet orders a store's
    requests by it within one engine queue, while this store queues each part's round as soon
    as its gradient is gathered (odsgd/worker/exchange.py).

    One store per process: a second is refused (it would share the first one's server keys).
    """
    _made_in_this_process = False

    def __init__(self, local_optimizer=None, local_optimizer_params=None, compensation=None,
                 compensation_mode=None, warmup_steps=None):
        self.config = ODSGDConfig(local_optimizer, local_optimizer_params, compensation,
                                  compensation_mode, warmup_steps)
        self.overlap = OverlapMeter(self.config.metrics_interval)
        check_environment()
        if DistODSGD._made_in_this_process:
            raise ValueError(
                "dist_odsgd: this process already has a dist_odsgd store; a second one would "
                "use the same server keys as the first, and MXNet initialises keys from its "
                "first store only. Make one store and pass that store (kvstore=kv) to every "
                "Trainer or Module of the process")
        #: MXNet's own dist_sync store underneath
        self.raw = mx.kv.create("dist_sync")
        # every command to the servers signed with the job's key (the start-up hook does it
        # too, where it runs)
        job_key.sign_commands_of(type(self.raw))
        DistODSGD._made_in_this_process = True
        exit_on_uncaught_exception()
        timeline.start_if_asked(self.rank)   # ODSGD_TIMELINE: a trace of this worker
        self.exchange = RoundExchange(self.raw)
        #: what the servers were told (packings, learning rate, multipliers)
        self.settings = ServerSettings(self.raw)
        #: global steps made (pushes of the newest key group)
        self.global_step = 0
        self.global_optimizer = None
        #: the LocalUpdater (made by set_optimizer)
        self.local = None
        #: the first step that failed part way (odsgd/worker/failed_step.py)
        self.failed_step = FailedStep()
        #: the weights file of the checkpoint being saved (odsgd/worker/checkpoint.py), recorded with
        #: the states
        self.weights_file = None
        self.agreement = WorkerAgreement(self)
        self.agreement.check_layout(layout_settings(self.config))
        # a worker that ends without finishing ends the job, whatever launched it
        alarm = FailureAlarm(self.agreement.gather, self.rank, self.raw)
        self.failed_step.on_failure = alarm.raise_alarm
        self.agreement.after_exit_check = alarm.finished
        #: the user's keys and their key groups (odsgd/worker/key_plan.py)
        self.planner = KeyPlanner(self.raw, self.agreement, self.config.fusion_elements,
                                  self.config.part_elements)

    # -- KVStoreBase properties ------------------------------------------------------------
    @property
    def type(self):
        return StoreType("dist_odsgd")

    @property
    def rank(self):
        return self.raw.rank

    @property
    def num_workers(self):
        return self.raw.num_workers

    @staticmethod
    def is_capable(capability):
        return capability.lower() == KVStoreBase.OPTIMIZER

    # -- initialisation --------------------------------------------------------------------
    def init(self, key, value):
        """Initialises keys with rank 0's values, as dist_sync; W_0 = rank 0's value on every
        worker."""
        self.failed_step.check("init")
        for k, v in zip(_as_list(key), _as_list(value)):
            self._new_key(k, v)

    def broadcast(self, key, value, out, priority=0):
        """Rank 0's `value` to every worker's `out` (and to the store's W_0)."""
        if isinstance(key, (list, tuple)):
            for k, v, o in zip(key, value, out):
                self.broadcast(k, v, o, priority)
            return
        self.failed_step.check("broadcast")
        outs = _as_list(out)
        check_dense(outs, "weights")
        group = self._new_key(key, value)
        initial = group.views(group.current)[0]
        for o in outs:
            initial.copyto(o)

    def _new_key(self, key, value):
        """One collective init: the shape check, rank 0's value to the servers (as a flat
        array, the shape every later push and pull of the key uses), and W_0 pulled back."""
        check_dense([value], "weights")
        index = self.planner.index_of_new(key)
        self.agreement.check_same_shape(key, value)
        group = self.planner.add_key(key, index, value, self.global_step)
        init_server_keys(self.raw, group, value.reshape((-1,)))
        pull_parts(self.raw, group, group.current)
        group.current.copyto(group.previous)
        # Gluon's Trainer broadcasts in its first step, after backward: MXNet's engine does not
        # order this pull before the gradient push that follows (other arrays), and a late
        # pull would answer with W_1. One wait per key at init keeps W_0 exact.
        group.previous.wait_to_read()
        return group

    # -- communication ---------------------------------------------------------------------
    def push(self, key, value, priority=0):
        """Pushes gradients (summed over `value`'s devices) for one global step, as
        dist_sync, and brings the store's global weights up to date. Only pushpull makes local
        OD-SGD updates."""
        self.failed_step.check("push")
        keys, values = (key, value) if isinstance(key, (list, tuple)) else ([key], [value])
        keys, values = list(keys), [_as_list(v) for v in values]
        self.planner.check_call(keys, values, None, self.local)   # refusals change nothing
        with self.failed_step.guard(self.global_step, lambda: self.planner.groups_of(keys)):
            plan = self.planner.plan(keys, values, None, self.local, self.global_step)
            self.settings.before_push(self.planner)
            self.exchange.sync_round_steps([group for group, _ in plan.groups])
            for group, positions in plan.groups:
                self.exchange.synchronous_round(
                    group, summed_gradients(group, [values[p] for p in positions]))
                group.advance()
                self.global_step = max(self.global_step, group.global_step)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Newest global weights (every pushed step applied) into `out`."""
        self.failed_step.check("pull")
        if out is None:
            raise ValueError("pull needs out=, the arrays that receive the global weights")
        keys, outs = (key, out) if isinstance(key, (list, tuple)) else ([key], [out])
        outs = [_as_list(o) for o in outs]
        check_dense([o for group in outs for o in group], "weights")
        pulled = {}
        for k, targets in zip(keys, outs):
            group = self.planner.group_of(k)
            if id(group) not in pulled:
                scratch = group.scratch_buffer()
                pull_parts(self.raw, group, scratch)
                pulled[id(group)] = scratch
            view = group.views(pulled[id(group)])[group.position(k)]
            for target in targets:
                view.copyto(target)

    def pushpull(self, key, value, out=None, priority=0):
        """One OD-SGD step: push the gradients `value` and write the next local weights into
        `out` (the parameter arrays). `key` is one key (value: an NDArray or one per device)
        or a list of keys (value, out: one entry per key): a list makes the step of all of them
        at once, which is how gluon.Trainer and Module call it (odsgd/worker/trainer_hook.py).

        A call refused before it changes anything (misuse) raises and leaves the store as it
        was; an exception after the step's first round was sent makes every later call raise
        (odsgd/worker/failed_step.py)."""
        self.failed_step.check("pushpull")
        if out is None or out is value:
            raise ValueError(
                "dist_odsgd updates the weights itself and needs pushpull(key, grad, "
                "out=weight): create the Trainer with update_on_kvstore=True (the default) "
                "and do not set MXNET_UPDATE_ON_KVSTORE=0")
        if self.global_optimizer is None:
            raise ValueError("dist_odsgd has no optimizer: call kv.set_optimizer(...) first "
                             "(gluon.Trainer and Module.fit do it when update_on_kvstore=True)")
        if isinstance(key, (list, tuple)):
            keys, values, outs = list(key), [_as_list(v) for v in value], \
                [_as_list(o) for o in out]
        else:
            keys, values, outs = [key], [_as_list(value)], [_as_list(out)]
        self.planner.check_call(keys, values, outs, self.local)   # refusals change nothing
        # One call is one global step of all its keys: a key that was not pushed for a while
        # (a frozen layer trained again) takes the step of the others.
        step = max(group.global_step for group in self.planner.groups_of(keys))
        with self.failed_step.guard(step, lambda: self.planner.groups_of(keys)):
            plan = self.planner.plan(keys, values, outs, self.local, self.global_step)
            self.settings.before_step(self.planner, plan, self.global_optimizer)
            for group, _ in plan.groups:
                group.global_step = step
            self.exchange.sync_round_steps([group for group, _ in plan.groups])
            for position, (group, positions) in enumerate(plan.groups):
                self._step(group, [values[p] for p in positions], [outs[p] for p in positions],
                           plan.multipliers(position))
        self.global_optimizer.num_update = max(
            self.global_optimizer.num_update,
            rates.schedule_count(self.global_optimizer, self.global_step - 1))

    def active_groups(self):
        """Key groups that are pushed each step (for the step check's probe)."""
        return self.planner.active_groups()

    def _holding_groups(self):
        return self.planner.holding_groups()

    # -- one step of one group -------------------------------------------------------------
    def _step(self, group, grads, weights, multipliers):
        step = group.global_step
        gradients = summed_gradients(group, grads)
        if step >= self.config.warmup_steps:
            # W_{t+1} lands in the third buffer: the local update reads W_t (group.current,
            # the answer of step t-1's round, or W_0) and W_{t-1} (group.previous).
            self.exchange.gradient_round(group, gradients, group.following_buffer())
            self.overlap.measure_wait(group.server_key, step, gradients[0], group.current)
            self.local.update_group(group, step, [w[0] for w in weights], gradients,
                                     multipliers)
            group.rotate()
        else:
            self.exchange.synchronous_round(group, gradients)
            scatter(group, group.current, [w[0] for w in weights])
        for per_device in weights:
            for weight in per_device[1:]:
                per_device[0].copyto(weight)
        group.advance()
        self.global_step = max(self.global_step, group.global_step)

    # -- optimizer -------------------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """Sends `optimizer` to the servers (wrapped in ServerOptimizer) as the global
        optimizer, and uses its settings for the local updates."""
        self.failed_step.check("set_optimizer")
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError("set_optimizer needs an mx.optimizer.Optimizer, got %r"
                            % type(optimizer).__name__)
        local = LocalUpdater(self.config, optimizer, self.num_workers)   # may refuse it
        self.planner.use_optimizer(optimizer)
        self.raw.set_optimizer(servers.ServerOptimizer(_server_safe(optimizer)))
        self.global_optimizer = optimizer
        self.settings.optimizer_sent(optimizer)
        self.planner.forget_plans()
        self.local = local

    def set_gradient_compression(self, compression_params):
        """Refused (type 'none' aside): see COMPRESSION_REFUSED."""
        if dict(compression_params or {}).get("type", "none") != "none":
            raise ValueError(COMPRESSION_REFUSED % (compression_params,))

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Refused: dist_odsgd keeps dense weights only (as kv.init refuses sparse ones)."""
        raise TypeError("dist_odsgd supports dense weights only, got row_sparse_pull; use "
                        "kvstore='dist_sync' for sparse parameters or gradients")

    # -- checkpoints (odsgd/worker/states.py) ---------------------------------------------
    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Saves this worker's OD-SGD states to `fname` (one entry per worker rank) and, from
        rank 0, the servers' whole-parameter states to `fname + '.servers'`; every worker,
        after the same step (worker_states.save). `odsgd.save_checkpoint` saves the weights
        too."""
        self.failed_step.check("save_optimizer_states")
        worker_states.save(self, fname, dump_optimizer)

    def load_optimizer_states(self, fname):
        """Loads what save_optimizer_states wrote, after the keys were initialised and before
        the next step; collective (worker_states.load). The servers' global weights come
        from rank 0's parameters: `odsgd.load_checkpoint` loads everything in order."""
        self.failed_step.check("load_optimizer_states")
        worker_states.load(self, fname)

    @property
    def _updater(self):
        """What gluon.Trainer.load_states reads back (`kv._updater.optimizer`): the global
        optimizer, which keeps its settings (only its update count is loaded)."""
        return _UpdaterView(self.global_optimizer)

    # -- collective checks and helpers for users -------------------------------------------
    def equal_steps(self, local_batches):
        """The number of steps every worker makes this epoch: the smallest `local_batches`
        over the workers (collective; see the module function equal_steps). It also checks
        that every worker made the same number of steps so far (docs/reliability.md)."""
        self.failed_step.check("equal_steps")
        return self.agreement.fewest_batches(local_batches)

    def _barrier(self):
        self.failed_step.check("_barrier")
        self.raw._barrier()


KVStoreBase.kv_registry["dist_odsgd"] = DistODSGD
#: the name users import it by (odsgd/worker/kvstore.py aliases this module), in reprs and errors
DistODSGD.__module__ = "odsgd.kvstore"

#: Why gradient compression is refused: MXNet 1.9's dist store compresses every push of the
#: store once it is set, and this store's collective checks (step counts, shapes, the fusion
#: plan; odsgd/worker/agreement.py) travel as exact float64 values through the same servers, which
#: 2-bit quantisation would destroy. ps-lite has one node per process: no second store.
COMPRESSION_REFUSED = (
    "dist_odsgd does not support gradient compression (%r): MXNet compresses every push of a "
    "store, and dist_odsgd's collective checks (equal step counts, shapes) send exact values "
    "through the same servers; train without it (drop the option, e.g. --gc-type). MXNet "
    "1.9.1's own dist_sync and dist_async refuse it too wherever gluon.Trainer or Module.fit "
    "push ('Compression not supported with PushPull'): only a loop of its own kv.push and "
    "kv.pull calls compresses there")


def _server_safe(optimizer):
    """`optimizer`, or a copy of it for the servers whose lr_scheduler gives the same rates
    and unpickles there: the servers unpickle the optimizer while `import mxnet` is still
    running, where GluonCV's schedulers (LRSequential, LRScheduler) cannot be imported, and
    the job would hang (odsgd/server/schedules.py translates them). The worker keeps its own."""
    from ..server.schedules import server_safe
    scheduler = server_safe(optimizer.lr_scheduler)
    if scheduler is optimizer.lr_scheduler:
        return optimizer
    sent = copy.copy(optimizer)   # pickled at once by set_optimizer
    sent.lr_scheduler = scheduler
    return sent


def store_of(trainer_or_module, what):
    """The DistODSGD store of a gluon.Trainer (made now if the Trainer has only its name), a
    Module after init_optimizer, or the store itself; ValueError naming `what` otherwise."""
    owner = trainer_or_module
    if isinstance(owner, DistODSGD):
        return owner
    if isinstance(owner, mx.gluon.Trainer):
        kv = owner._kvstore if owner._kv_initialized else owner._kvstore_params["kvstore"]
        if isinstance(kv, str) and kv.lower() == "dist_odsgd":
            # Made here, not by the Trainer: the Trainer sets the optimizer's rescale_grad
            # from its first step's batch size before it initialises the store.
            kv = mx.kv.create(kv)
            owner._kvstore_params["kvstore"] = kv
    else:
        kv = getattr(owner, "_kvstore", None)
    if not isinstance(kv, DistODSGD):
        raise ValueError("%s needs a Trainer or Module that trains with kvstore='dist_odsgd' "
                         "(a Module after init_optimizer), or the DistODSGD store; got %r"
                         % (what, type(trainer_or_module).__name__))
    return kv


def equal_steps(trainer_or_module, local_batches):
    """The number of steps every worker makes this epoch: the smallest `local_batches` over
    the workers (see DistODSGD.equal_steps). Call it on every worker at the start of every
    epoch and make exactly that many steps:

        n = odsgd.equal_steps(trainer, len(train_data))
        for batch, _ in zip(train_data, range(n)): ...

    `trainer_or_module`: a gluon.Trainer with kvstore='dist_odsgd' (before its first step
    too), a Module after init_optimizer, or the DistODSGD store itself."""
    return store_of(trainer_or_module, "equal_steps").equal_steps(local_batches)


def load_global_weights(trainer_or_module):
    """Copies the newest global weights W into the parameters of a gluon.Trainer (or a Module)
    that trains with dist_odsgd, e.g. before evaluation or saving: the worker's own weights
    are one local step away from W. Training may go on afterwards from W."""
    kv = getattr(trainer_or_module, "_kvstore", None)
    if kv is None or not isinstance(kv, DistODSGD):
        raise ValueError("load_global_weights needs a Trainer or Module that has trained with "
                         "kvstore='dist_odsgd' (call it after the first step)")
    if hasattr(trainer_or_module, "_params"):          # gluon.Trainer
        pairs = [(index, param.list_data()) for index, param
                 in enumerate(trainer_or_module._params)
                 if param.grad_req != "null" and index in kv.planner.groups]
    else:                                              # Module
        group = trainer_or_module._exec_group
        pairs = list(zip(group.param_names, group.param_arrays))
        trainer_or_module._params_dirty = True
    if pairs:
        kv.pull([k for k, _ in pairs], out=[o for _, o in pairs])
    # and the w_t an evaluation may have set aside is not put back (odsgd/worker/eval_weights.py)
    eval_weights.shown_weights(kv).forget()
    mx.nd.waitall()
