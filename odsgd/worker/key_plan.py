"""Which key group carries each of the user's keys: `KeyPlanner`, the store's plan of its keys.

A user's key (the Trainer's index, or Module's name) is initialised into a key group of its
own (odsgd/worker/key_groups.py). The first call that hands the store several keys at once (a step of
gluon.Trainer or Module, through odsgd/worker/trainer_hook.py) packs their small parameters into
fused groups, identically on every worker (checked collectively); later calls with the same
keys reuse the plan (`StepPlan`).

Why fuse: MXNet's parameter server pays a fixed cost per key and step (a push and a pull
message, an engine operation each, the server's round bookkeeping), about as much as moving
hundreds of kilobytes on loopback. A ResNet has 60 to 160 parameter arrays, most of them small
(BatchNorm gammas and betas, biases). Packing the small ones into a few keys, as Horovod's
tensor fusion and BytePS's partitions do, makes a step's cost follow the bytes, not the count
of arrays. The servers still apply the global optimizer to each parameter on its own, with the
parameter's own index, so the global update is dist_sync's.

A fused group is never larger than MXNet's big-array bound (MXNET_KVSTORE_BIGARRAY_BOUND),
above which MXNet slices a key over the servers: each fused key lies whole on one server,
and the servers share the fused keys as they share any keys. Arrays of at least
`config.fusion_elements` elements (ODSGD_FUSION_ELEMENTS) stay alone in their group (and may be
sliced, as in dist_sync).
"""
import logging
import zlib

import mxnet as mx

from ..common import rates
from .key_groups import KeyGroup, part_bounds, server_keys

LOG = logging.getLogger("odsgd")


def check_dense(arrays, what):
    for array in arrays:
        if getattr(array, "stype", "default") != "default":
            raise TypeError("dist_odsgd supports dense %s only, got stype %r; use "
                            "kvstore='dist_sync' for sparse parameters or gradients"
                            % (what, array.stype))


def plan_fusion(sizes, kinds, limit):
    """Which arrays share a server key: a list of groups, each a list of positions into
    `sizes`, in order. Arrays of `limit` elements or more stay alone; the others are packed in
    order, each group holding arrays of one kind (dtype and context) and at most `limit`
    elements. Every worker computes the same plan from the same model."""
    groups, open_groups = [], {}
    for position, (size, kind) in enumerate(zip(sizes, kinds)):
        if limit <= 0 or size >= limit:
            groups.append([position])
            continue
        group = open_groups.get(kind)
        if group is None or group[1] + size > limit:
            group = [[], 0]
            open_groups[kind] = group
            groups.append(group[0])
        group[0].append(position)
        group[1] += size
    return groups


def plan_signature(groups, sizes):
    """A number that differs between two plans (for the check that every worker has the same):
    24 bits of a CRC of the groups' positions and sizes (the servers keep every value as
    float32, which holds integers of 24 bits exactly)."""
    text = ";".join(",".join("%d:%d" % (p, sizes[p]) for p in group) for group in groups)
    return float(zlib.crc32(text.encode("ascii")) & 0xFFFFFF)


#: MXNet 1.9.1 optimizers (their registered names) whose update of a part of an array is their
#: update of the whole array, element for element: their states are elementwise and they read
#: nothing of the array as a whole but the parameter's update count, which the servers keep
#: per parameter (server_updater.py). Held to dist_sync for each in tests/test_part_exactness.py.
#: Every other optimizer travels whole (`cuts_arrays`): 'lamb', 'lars' and 'lbsgd' read norms
#: of whole arrays (LBSGD also sums gradients outside its state), 'nadam' advances a schedule
#: shared by all arrays at every update call, 'sgld' draws its noise per call, 'groupadagrad'
#: reads the rows of 2-D arrays (which no flat key has: it is refused, `check_flat_arrays`), and
#: an optimizer this list does not name may do any of these.
PART_EXACT_OPTIMIZERS = ("sgd", "ccsgd", "nag", "signum", "ftml", "dcasgd", "adam", "adagrad",
                         "rmsprop", "adadelta", "ftrl", "adamax", "test")
#: optimizers that read the shape of an array, which the store's flat keys do not keep
SHAPE_READING_OPTIMIZERS = ("groupadagrad",)


def registered_name(optimizer):
    """The name MXNet registers `optimizer`'s class under (None for a class of its own that
    is not registered, or a subclass of a registered one)."""
    from mxnet.optimizer import Optimizer
    for name, cls in Optimizer.opt_registry.items():
        if type(optimizer) is cls:
            return name
    return None


def cuts_arrays(optimizer):
    """Whether the store may cut arrays and fused groups of `optimizer` into parts
    (ODSGD_PART_ELEMENTS): only where its update on parts is its update on the whole."""
    return registered_name(optimizer) in PART_EXACT_OPTIMIZERS


def check_flat_arrays(optimizer):
    """ValueError for an optimizer that reads the shapes of arrays: the servers hold every
    key as a flat array (odsgd/worker/key_groups.py)."""
    name = registered_name(optimizer)
    if name in SHAPE_READING_OPTIMIZERS:
        raise ValueError(
            "the global optimizer %s reads the rows of 2-D arrays, but dist_odsgd's servers "
            "hold every parameter as a flat array; use kvstore='dist_sync' for it, or another "
            "optimizer (e.g. 'adagrad')" % type(optimizer).__name__)


def layout_settings(config):
    """[(setting, value)]: what decides the store's server keys besides the model (whose
    shapes and order the workers compare key by key, agreement.check_same_shape): which
    parameters share a key, where an array is cut, how MXNet slices a big key and which server
    holds each key. Every worker must have the same (agreement.check_layout)."""
    from ..common.config import bigarray_bound
    from .environment import num_servers
    return [("ODSGD_PART_ELEMENTS", config.part_elements),
            ("ODSGD_FUSION_ELEMENTS", config.fusion_elements),
            ("MXNET_KVSTORE_BIGARRAY_BOUND", bigarray_bound()),
            ("DMLC_NUM_SERVER", num_servers())]


def init_server_keys(raw, group, value):
    """Initialises the server keys of `group`'s parts with their parts of `value`, a flat
    array (rank 0's is kept): one collective init."""
    raw.init([part.key for part in group.parts], [part.of(value) for part in group.parts])


def pull_parts(raw, group, out):
    """The weights the servers hold for `group` into `out`, a flat buffer of the group (queued
    after every round this worker sent)."""
    for part in group.parts:
        raw.pull(part.key, out=part.of(out))


class StepPlan(object):
    """How one pushpull call's keys map onto key groups: `groups`, [(group, positions in the
    call)], and where each group's multipliers come from."""

    def __init__(self, groups, optimizer):
        self.groups = groups
        # Gluon Parameters may change lr_mult / wd_mult at any time: read them each step.
        # Module's multipliers are fixed by the symbol and the optimizer: read them once.
        self.params = [[optimizer.param_dict.get(i) for i in group.indices]
                       for group, _ in groups]
        self.fixed = [[rates.multipliers(optimizer, i) for i in group.indices]
                      for group, _ in groups]

    def multipliers(self, position):
        params = self.params[position]
        fixed = self.fixed[position]
        return [(p.lr_mult, p.wd_mult) if p is not None else m for p, m in zip(params, fixed)]


class KeyPlanner(object):
    """The user's keys, their key groups and the server keys of one store.

    Parameters
    ----------
    raw : MXNet's dist_sync store underneath (fused groups are initialised on it)
    agreement : odsgd.worker.agreement.WorkerAgreement (the same fusion plan on every worker)
    fusion_elements : int
        Most elements of a fused group; 0 turns fusion off.
    part_elements : int
        Most elements of a server key (ODSGD_PART_ELEMENTS); a group's buffers are cut into
        parts of at most that many (key_groups.py); 0: one key per group. It applies where the
        global optimizer allows (`use_optimizer`).
    """

    def __init__(self, raw, agreement, fusion_elements, part_elements=0):
        self.raw = raw
        self.agreement = agreement
        self.fusion_elements = fusion_elements
        self.configured_part_elements = part_elements
        #: the part size new groups get: configured_part_elements, or 0 for an optimizer
        #: that must see whole arrays
        self.part_elements = part_elements
        self.groups = {}           # user key -> the KeyGroup that holds it now
        self._index = {}           # user key -> its index for the global optimizer
        self._string_keys = 0      # MXNet numbers string keys 0, 1, ... as first initialised
        self._plans = {}           # tuple of keys -> StepPlan
        self._keys_made = 0        # server keys handed out so far
        self._unregistered = []    # groups whose packing the servers do not know yet

    # -- keys ----------------------------------------------------------------------------------
    def index_of_new(self, key):
        """The optimizer index that the new `key` gets (ValueError for a key that is known,
        of another type than the others, or neither a string nor an int >= 0)."""
        if key in self.groups:
            raise ValueError(
                "key %r is already initialised in this dist_odsgd store: a store serves one "
                "gluon.Trainer or Module (two Trainers on one store would share keys 0, 1, ...); "
                "give each Trainer its parameters once, or one Trainer all of them" % (key,))
        if isinstance(key, str):
            index = self._string_keys   # as MXNet numbers string keys; Module's idx2name too
        elif isinstance(key, int) and not isinstance(key, bool) and key >= 0:
            index = key                 # gluon.Trainer's parameter index
        else:
            raise ValueError("dist_odsgd keys are strings or ints >= 0, got %r" % (key,))
        if self._index and isinstance(next(iter(self._index)), str) != isinstance(key, str):
            raise ValueError("key %r: a dist_odsgd store takes int keys (gluon.Trainer) or "
                             "string keys (Module), not both, as MXNet's stores" % (key,))
        return index

    def add_key(self, key, index, value, global_step):
        """A key group of its own for the new `key` (index from index_of_new), with a new
        server key, joining at `global_step`."""
        group = self._new_group([key], [index], [value], global_step)
        if isinstance(key, str):
            self._string_keys += 1
        self._index[key] = index
        self.groups[key] = group
        self._unregistered.append(group)
        return group

    def _new_group(self, keys, indices, templates, global_step):
        """A KeyGroup with new server keys, one per part."""
        total = sum(int(t.size) for t in templates)
        count = len(part_bounds(total, self.part_elements))
        numbers = server_keys(self._keys_made, count)
        self._keys_made += count
        return KeyGroup(numbers, keys, indices, templates, global_step=global_step,
                        part_elements=self.part_elements)

    def use_optimizer(self, optimizer):
        """Before `optimizer` trains: arrays are cut into parts only where its update of the
        parts is its update of the whole (`cuts_arrays`); groups cut already (Module
        initialises its keys before it sets the optimizer) get one whole key each. Collective:
        every worker sets the same optimizer at the same point of its script."""
        check_flat_arrays(optimizer)
        if cuts_arrays(optimizer):
            self.part_elements = self.configured_part_elements
            return
        if self.configured_part_elements and self.part_elements:
            LOG.info("odsgd: the global optimizer %s is not exact on parts of arrays; its "
                     "arrays travel whole (ODSGD_PART_ELEMENTS does not apply)",
                     type(optimizer).__name__)
        self.part_elements = 0
        for group in [g for g in self.holding_groups() if len(g.parts) > 1]:
            self._make_whole(group)

    def _make_whole(self, group):
        """`group`'s parameters on one new server key (W_t, W_{t-1} and local states carried
        over, the server key initialised with W_t); the cut group retires."""
        templates = group.views(group.current)
        whole = self._new_group(group.keys, group.indices, templates, group.global_step)
        for buffer in ("current", "previous", "mom", "var", "local"):
            source = getattr(group, buffer)
            if source is not None:
                target = getattr(whole, buffer)
                if target is None:
                    target = mx.nd.zeros(source.shape, source.context, dtype=source.dtype)
                    setattr(whole, buffer, target)
                source.copyto(target)
        group.retired = True
        self._unregistered.append(whole)
        init_server_keys(self.raw, whole, whole.current)
        for key in whole.keys:
            self.groups[key] = whole
        self._plans.clear()

    def group_of(self, key):
        group = self.groups.get(key)
        if group is None:
            raise ValueError("key %r was never initialised: call kv.init or kv.broadcast "
                             "first" % (key,))
        return group

    def holding_groups(self):
        """The groups that hold keys now (each once)."""
        return list({id(g): g for g in self.groups.values()}.values())

    def active_groups(self):
        """Key groups that are pushed each step (for the step check's probe)."""
        return [g for g in self.holding_groups() if g.pushes > 0 and not g.retired]

    def new_packings(self):
        """{server key: packing} of the parts of the groups the servers do not know yet (then
        known)."""
        packings = {part.key: group.packing(part) for group in self._unregistered
                    for part in group.parts}
        self._unregistered = []
        return packings

    def forget_plans(self):
        """Plans read the optimizer's multipliers: made again after set_optimizer."""
        self._plans.clear()

    # -- plans ---------------------------------------------------------------------------------
    def groups_of(self, keys):
        """The key groups that hold `keys` now (each once, in the keys' order)."""
        return list({id(g): g for g in (self.group_of(k) for k in keys)}.values())

    def check_call(self, keys, values, outs, local):
        """Refuses a call with these keys (ValueError, TypeError naming the fix) before
        anything changes: counts that do not match, keys never initialised, sparse arrays, a
        key of a fused group pushed without the others. Checked once per set of keys."""
        if tuple(keys) in self._plans:
            return
        if len(values) != len(keys) or (outs is not None and len(outs) != len(keys)):
            raise ValueError("pushpull got %d keys but %d gradients and %s outputs"
                             % (len(keys), len(values), len(outs) if outs is not None else 0))
        for grads in values:
            check_dense(grads, "gradients")
        for weights in outs or []:
            check_dense(weights, "weights")
        if self._fuses(keys, local):
            return
        loose = self._loose(keys)
        fused = [k for k in loose if self.groups[k].fused]
        if fused:
            raise ValueError(
                "key %r is pushed together with other keys in one fused server key of "
                "dist_odsgd (gluon.Trainer and Module make one call for all keys); push "
                "those keys together, as %r, or set ODSGD_FUSION_ELEMENTS=0 to give every "
                "key its own" % (fused[0], self.groups[fused[0]].keys))

    def _fuses(self, keys, local):
        """Whether the first call with these keys packs them into fused groups."""
        return len(keys) > 1 and self.fusion_elements > 0 and local is not None

    def _covered(self, keys):
        """The groups all of whose keys are among `keys` (and that hold them still)."""
        position = set(keys)
        return [g for g in self.groups_of(keys)
                if not g.retired and all(k in position for k in g.keys)]

    def _loose(self, keys):
        """The keys whose group holds keys that are not among `keys`."""
        covered = self._covered(keys)
        return [k for k in keys if not any(self.groups[k] is c for c in covered)]

    def plan(self, keys, values, outs, local, global_step):
        """The key groups of a call with these keys (cached; `check_call` first). The first
        call with several keys packs their small parameters into fused keys (collective: every
        worker makes the same calls at the same step). `local`: the store's LocalUpdater, None
        before set_optimizer (nothing is fused then)."""
        plan = self._plans.get(tuple(keys))
        if plan is not None:
            return plan
        self.check_call(keys, values, outs, local)
        if self._fuses(keys, local):
            covered = self._covered(keys)
            fusible = [k for k in keys if not (self.groups[k] in covered
                                               and self.groups[k].fused)]
            self._fuse(fusible, local, global_step)
        position = {k: i for i, k in enumerate(keys)}
        entries = [(group, [position[m] for m in group.keys])
                   for group in self.groups_of(keys)]
        optimizer = local.global_optimizer if local is not None else mx.optimizer.SGD()
        plan = StepPlan(entries, optimizer)
        self._plans[tuple(keys)] = plan
        return plan

    def _fuse(self, keys, local, global_step):
        """Packs `keys` into key groups (plan_fusion): collective. A key already alone in its
        own individual group stays there; the others get fused server keys, initialised with
        the global weights W_t the store holds (equal on every worker), and keep their local
        states. The servers keep each parameter's optimizer state by its index, so it carries
        over."""
        old = [self.groups[k] for k in keys]
        templates = [g.views(g.current)[g.position(k)] for k, g in zip(keys, old)]
        sizes = [int(t.size) for t in templates]
        kinds = [(str(t.dtype), str(t.context)) for t in templates]
        members_of = plan_fusion(sizes, kinds, self.fusion_elements)
        self.agreement.check_same(
            [plan_signature(members_of, sizes)], lambda v: "%d" % v[0],
            lambda mine, theirs: "the workers pack their parameters differently (plan %s here, "
            "%s on rank 0): every worker must build the same model and set the same "
            "ODSGD_FUSION_ELEMENTS and MXNET_KVSTORE_BIGARRAY_BOUND" % (mine, theirs))
        made = False
        for members in members_of:
            if len(members) == 1 and not old[members[0]].fused:
                continue
            self._make_fused_group([keys[p] for p in members], [old[p] for p in members],
                                   [templates[p] for p in members], local, global_step)
            made = True
        if made:
            self._plans.clear()
            LOG.info("odsgd: %d parameters on %d server keys",
                     len(keys), len({id(self.groups[k]) for k in keys}))

    def _make_fused_group(self, member_keys, sources, templates, local, global_step):
        """One new group of `member_keys`, which carries over their W_t, W_{t-1} and local
        states from `sources` (their groups so far, retired now)."""
        group = self._new_group(member_keys, [self._index[k] for k in member_keys], templates,
                                global_step)
        local.prepare(group)
        for buffer in ("current", "previous", "mom", "var", "local"):
            if getattr(group, buffer) is None:
                continue
            targets = group.views(getattr(group, buffer))
            for target, source, key in zip(targets, sources, member_keys):
                flat = getattr(source, buffer)
                if flat is not None:
                    source.views(flat)[source.position(key)].copyto(target)
        for source in sources:
            source.retired = True
        group.global_step = max(s.global_step for s in sources)
        self._unregistered.append(group)
        init_server_keys(self.raw, group, group.current)
        for key in member_keys:
            self.groups[key] = group
