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

Each group has two server keys on the same server, and the rounds of even and odd global
steps alternate between them (`round_of`). A pull from MXNet's servers returns whatever the
key holds when the request arrives; with one key, a pull of W_{t+1} that left late (the
pushes of step t+1 go out without waiting for it, odsgd/exchange.py) could be answered with
W_{t+2}. With two, round t+1 writes the other key, and this key is written again only by
round t+2, which needs this worker's push of step t+2, which needs w_{t+2}, which needs the
pull: so the pull of round t always returns W_{t+1}. The servers start each round from the
newer of the two (server_updater.py), so the global update is dist_sync's.

Which keys share a group is planned in odsgd/key_plan.py.
"""
import mxnet as mx
import numpy as np

#: The store's server keys. MXNet picks a key's server as (key * 9973) % servers in int
#: arithmetic, so keys must keep that product below 2**31.
CONTROL_KEY = 0
SIGNATURE_KEY_BASE = 1
GROUP_KEY_BASE = 50000
KEY_LIMIT = (2 ** 31 - 1) // 9973


def server_key_pair(number, num_servers):
    """The two server keys of the `number`-th group (0, 1, ...), on the same server: MXNet
    puts key k on server (k * 9973) % S, so keys S * stride apart share it. ValueError when
    the store's key range is used up."""
    stride = (KEY_LIMIT - GROUP_KEY_BASE) // (2 * num_servers)
    if number >= num_servers * stride:
        raise ValueError("dist_odsgd ran out of server keys (%d parameter groups and "
                         "re-packings); MXNet's servers take keys below %d"
                         % (number, KEY_LIMIT))
    first = GROUP_KEY_BASE + number
    return first, first + num_servers * stride


class KeyGroup(object):
    """One server key and the parameters it carries.

    Attributes
    ----------
    server_keys : (int, int)
        The two keys MXNet's servers know it by (the store's own, on the same server): the
        rounds of even global steps go to the first, odd ones to the second (see below).
    server_key : int
        The first of them, which names the group.
    keys : list
        The user's keys of its parameters, in packing order.
    indices : list of int
        Each parameter's index for the global optimizer (the id the servers would give its
        key on its own), which selects its lr_mult / wd_mult and its optimizer states.
    shapes, sizes, offsets : per parameter; offsets into the flat buffers.
    sends : the buffers the group pushes from, one per server key (MXNet's CPU store sends
        from the pushed array and pulls into it); on the CPU, where MXNet sends from.
    token : one element written when the group's last push was answered (exchange.py).
    server_step : the global step the servers will give the group's next round (None: not
        told yet; exchange.py, `sync_round_steps`).
    current, previous : W_t and W_{t-1}, the last two global weights; swapped each step.
    mom, var : the worker's local states (allocated by LocalUpdater), or None.
    first_step : the global step at which the group was made; `first_step + step` is the
        global step of its next push.
    step : pushes made through this group.
    """

    def __init__(self, server_keys, keys, indices, templates, first_step=0):
        first = templates[0]
        # one int: a group that never meets the servers (LocalUpdater.update, tests)
        self.server_keys = tuple(server_keys) if isinstance(server_keys, (tuple, list)) \
            else (server_keys, server_keys)
        self.server_key = self.server_keys[0]
        self.keys = list(keys)
        self.indices = list(indices)
        self.fused = len(self.keys) > 1
        self.shapes = [tuple(t.shape) for t in templates]
        self.sizes = [int(np.prod(shape)) if shape else 1 for shape in self.shapes]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]).astype(int))
        self.total = int(sum(self.sizes))
        self.context, self.dtype = first.context, first.dtype

        def zeros():
            return mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        self.current, self.previous = zeros(), zeros()
        # MXNet sends from and pulls into the pushed array itself only on the CPU (on a GPU
        # it copies through one buffer of its own per key, which would order each push after
        # the previous pull again).
        send_context = self.context if self.context.device_type == "cpu" else mx.cpu_pinned(0)
        self.sends = [mx.nd.zeros((self.total,), send_context, dtype=self.dtype)
                      for _ in range(2)]
        self.token = mx.nd.zeros((1,), send_context, dtype=self.dtype)
        self._heads = {}
        self.summed = None           # the gradients summed over devices (several devices)
        self.mom = self.var = None
        self.scratch = None          # receives user pulls and probe rounds
        self.first_step = first_step
        self.step = 0
        self.server_step = None      # global step the servers give its next round (exchange.py)
        self.retired = False         # its parameters moved to another group
        self.native_answers = {}     # ids of arrays -> whether the fused operators take them
        self._views = {}

    @property
    def global_step(self):
        """Global step of this group's next push."""
        return self.first_step + self.step

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

    def round_of(self, step):
        """(server key, send buffer) of the round of global step `step`."""
        return self.server_keys[step % 2], self.sends[step % 2]

    def newest_key(self):
        """The server key that holds the newest global weights (both hold W_0 at first)."""
        return self.server_keys[(self.global_step - 1) % 2] if self.step else self.server_key

    def head(self, buffer):
        """The first element of a send buffer, a view (cached): writing it makes an engine
        operation that orders against the push and the pull of that buffer."""
        head = self._heads.get(id(buffer))
        if head is None:
            head = self._heads[id(buffer)] = buffer[0:1]
        return head

    def summed_buffer(self):
        if self.summed is None:
            self.summed = mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        return self.summed

    def swap(self):
        """After a pull into `previous`: it holds W_{t+1} and becomes `current`."""
        self.previous, self.current = self.current, self.previous

    def scratch_buffer(self):
        if self.scratch is None:
            self.scratch = mx.nd.zeros((self.total,), self.context, dtype=self.dtype)
        return self.scratch

    def packing(self):
        """Where each parameter lies in the flat buffers, [(optimizer index, offset, size)], as
        the servers need it (server_updater.py)."""
        return [(int(i), int(o), int(n)) for i, o, n in zip(self.indices, self.offsets,
                                                           self.sizes)]
