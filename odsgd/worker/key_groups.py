"""Keys on the servers and the parameter arrays they carry.

A `KeyGroup` is one key of MXNet's parameter servers. It carries one parameter, or several
small ones packed end to end (a *fused* group). Every buffer of a group is one flat 1-D array
holding its parameters in that order (the group's *packing*), and every push and pull of its
server key uses such arrays, so that MXNet's worker-side buffers for the key keep one shape.

The servers see only keys of the store's own: ints it hands out in the same order on every
worker. A parameter's own key (the Trainer's index, or Module's name) stays on the worker. So
the store's keys never shift what the servers' optimizer looks up: each group's packing, sent
to the servers before its first push (server_updater.py), names each parameter's index for the
global optimizer (Gluon's index; for Module the position of the name among the parameters,
which is how Module's optimizer knows names, lr_mult and wd_mult), and MXNet's rule that one
store never mixes int and string keys holds whatever keys the user has.

A group's flat buffers are cut into *parts* of at most `ODSGD_PART_ELEMENTS` elements
(config.py), each a server key of its own; MXNet places consecutive keys on different servers,
so the parts of a big array spread over the servers. Each round of a part is one
push-with-pull request (`kv.pushpull` on MXNet's store; odsgd/worker/exchange.py): the servers answer
it with the weights that round produced, so a part needs no second key and no fence, and the
link carries one part's gradients in while another part's weights come back.

Which keys share a group is planned in odsgd/worker/key_plan.py.
"""
import mxnet as mx
import numpy as np

#: The store's server keys. MXNet picks a key's server as (key * 9973) % servers in int
#: arithmetic, so keys must keep that product below 2**31.
CONTROL_KEY = 0
SIGNATURE_KEY_BASE = 1
GROUP_KEY_BASE = 50000
KEY_LIMIT = (2 ** 31 - 1) // 9973


def server_keys(first_number, count):
    """`count` server keys from the `first_number`-th (0, 1, ...): consecutive keys, which MXNet
    puts on the servers in turn. ValueError when the store's key range is used up."""
    last = GROUP_KEY_BASE + first_number + count - 1
    if last >= KEY_LIMIT:
        raise ValueError("dist_odsgd ran out of server keys (%d parts of parameter groups and "
                         "re-packings); MXNet's servers take keys below %d; raise "
                         "ODSGD_PART_ELEMENTS" % (first_number + count, KEY_LIMIT))
    return list(range(GROUP_KEY_BASE + first_number, last + 1))


def part_bounds(total, part_elements):
    """[(offset, size)] of the parts of a flat buffer of `total` elements: one part when
    `part_elements` is 0 or at least `total`, else as few parts of at most `part_elements` as
    can be, of equal sizes (to within one element), so that no part lags behind the others."""
    if part_elements <= 0 or total <= part_elements:
        return [(0, total)]
    count = -(-total // part_elements)
    base, extra = divmod(total, count)
    sizes = [base + 1] * extra + [base] * (count - extra)
    offsets = [sum(sizes[:i]) for i in range(count)]
    return list(zip(offsets, sizes))


class Part(object):
    """One server key of a group: elements [offset, offset + size) of its flat buffers, and
    `send`, the array its rounds push from. MXNet's store sends a CPU array itself and writes
    the answer into it before copying it out (`comm_buf_ = merged`); an array of its own (not a
    slice of a group buffer, which would share one engine variable with the other parts) lets
    each part's request run on its own. A GPU group's `send` lies in pinned CPU memory, which
    MXNet treats as a CPU array: it sends from it directly there too.

    `answer` (parts of a group cut in several only): the array MXNet copies the round's answer
    into. The answers then reach the group's flat buffer through one more copy each; those
    copies share the flat buffer's engine variable and run in part order, but only the local
    update waits for them, while the part's next round waits for its own answer alone."""

    def __init__(self, key, offset, size, context, dtype, own_answer=False):
        self.key = key
        self.offset, self.size = offset, size
        send_context = context if context.device_type == "cpu" else mx.cpu_pinned(0)
        self.send = mx.nd.zeros((size,), send_context, dtype=dtype)
        self.answer = mx.nd.zeros((size,), context, dtype=dtype) if own_answer else None
        self._views = {}

    def of(self, flat):
        """This part of a group's flat buffer (a view, cached per buffer: every round asks)."""
        view = self._views.get(id(flat))
        if view is None or view[0] is not flat:
            view = self._views[id(flat)] = (flat, flat[self.offset:self.offset + self.size])
        return view[1]


class KeyGroup(object):
    """The parameters one set of server keys carries, and the worker's buffers for them.

    Attributes
    ----------
    parts : list of Part
        The group's server keys (the store's own), each with its range of the flat buffers.
    server_key : int
        The first of them, which names the group.
    keys : list
        The user's keys of its parameters, in packing order.
    indices : list of int
        Each parameter's index for the global optimizer (the id the servers would give its
        key on its own), which selects its lr_mult / wd_mult and its optimizer states.
    shapes, sizes, offsets : per parameter; offsets into the flat buffers.
    server_step : the global step the servers will give the group's next round (None: not
        told yet; exchange.py, `sync_round_steps`).
    current, previous : W_t and W_{t-1}, the last two global weights; `following` receives
        W_{t+1} while the step's local update reads the other two (`rotate`).
    mom, var : the worker's local states (allocated by LocalUpdater), or None.
    local : with lam != 0, the worker's flat copy of its weights w_t, which the compensation
        term reads and the fused local update rewrites with w_{t+1} (LocalUpdater), or None.
    global_step : the global step of its next push (the step of the job's next step when it is
        made; a key that sits out steps, a frozen layer, catches up when it is pushed again).
    pushes : pushes made through this group.
    """

    def __init__(self, server_keys, keys, indices, templates, global_step=0, part_elements=0):
        first = templates[0]
        self.keys = list(keys)
        self.indices = list(indices)
        self.fused = len(self.keys) > 1
        self.shapes = [tuple(t.shape) for t in templates]
        self.sizes = [int(np.prod(shape)) if shape else 1 for shape in self.shapes]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]).astype(int))
        self.total = int(sum(self.sizes))
        self.context, self.dtype = first.context, first.dtype
        # one int: a group that never meets the servers (LocalUpdater.update, tests)
        keys_given = list(server_keys) if isinstance(server_keys, (tuple, list)) \
            else [server_keys]
        bounds = part_bounds(self.total, part_elements)
        if len(keys_given) == 1 and len(bounds) > 1:
            bounds = [(0, self.total)]
        if len(keys_given) != len(bounds):
            raise ValueError("%d server keys for %d parts" % (len(keys_given), len(bounds)))
        cut = len(bounds) > 1
        self.parts = [Part(key, offset, size, self.context, self.dtype, own_answer=cut)
                      for key, (offset, size) in zip(keys_given, bounds)]
        self.server_key = self.parts[0].key

        def zeros():
            return mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        self.current, self.previous = zeros(), zeros()
        self.following = None        # made by the first OD round (`following_buffer`)
        self.gradients = None        # the step's gradients end to end (`gradient_buffer`)
        self.mom = self.var = self.local = None
        self.scratch = None          # receives user pulls and probe rounds
        self.global_step = global_step
        self.pushes = 0
        self.server_step = None      # global step the servers give its next round (exchange.py)
        self.retired = False         # its parameters moved to another group
        self.native_answers = {}     # ids of arrays -> whether the fused operators take them
        self._views = {}

    def advance(self):
        """After a push: the next one is one global step on."""
        self.global_step += 1
        self.pushes += 1

    def position(self, key):
        return self.keys.index(key)

    def views(self, flat):
        """The parameters' parts of `flat` (one of this group's flat buffers), shaped like the
        parameters; they share its memory. Cached per buffer."""
        views = self._views.get(id(flat))
        if views is None or views[0] is not flat:
            if not self.fused:
                parts = [flat.reshape(self.shapes[0])]
            else:
                parts = [flat[o:o + n].reshape(shape) for o, n, shape
                         in zip(self.offsets, self.sizes, self.shapes)]
            views = (flat, parts)
            self._views[id(flat)] = views
        return views[1]

    def gradient_buffer(self):
        """The flat buffer of the step's gradients end to end: summed over this worker's
        devices where it has several (exchange.summed_gradients), gathered there for a group
        cut into parts otherwise (exchange.fill_parts)."""
        if self.gradients is None:
            self.gradients = mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        return self.gradients

    def following_buffer(self):
        """The buffer that receives W_{t+1}: neither W_t nor W_{t-1}, which the step's local
        update reads, so the round's request can be queued before that update."""
        if self.following is None:
            self.following = mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        return self.following

    def swap(self):
        """After a round into `previous`: it holds W_{t+1} and becomes `current`."""
        self.previous, self.current = self.current, self.previous

    def rotate(self):
        """After a round into `following`: W_{t+1} becomes `current`, W_t `previous`, and the
        buffer of W_{t-1} receives the next round."""
        self.previous, self.current, self.following = \
            self.current, self.following, self.previous

    def scratch_buffer(self):
        if self.scratch is None:
            self.scratch = mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        return self.scratch

    def packing(self, part):
        """Where each parameter lies in `part`, [(optimizer index, offset in the part, size,
        offset in the parameter or -1 when the part holds all of it)], as the servers need it
        (server_updater.py)."""
        entries = []
        end = part.offset + part.size
        for index, offset, size in zip(self.indices, self.offsets, self.sizes):
            begin, stop = max(offset, part.offset), min(offset + size, end)
            if begin >= stop:
                continue
            whole = begin == offset and stop == offset + size
            entries.append((int(index), int(begin - part.offset), int(stop - begin),
                            -1 if whole else int(begin - offset)))
        return entries
