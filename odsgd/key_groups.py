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


class KeyGroup(object):
    """One server key and the parameters it carries.

    Attributes
    ----------
    server_key : int
        The key MXNet's servers know it by (one of the store's own).
    keys : list
        The user's keys of its parameters, in packing order.
    indices : list of int
        Each parameter's index for the global optimizer (the id the servers would give its
        key on its own), which selects its lr_mult / wd_mult and its optimizer states.
    shapes, sizes, offsets : per parameter; offsets into the flat buffers.
    send : the gradient pushed (MXNet's CPU store also pulls into it, see kvstore.py).
    current, previous : W_t and W_{t-1}, the last two global weights; swapped each step.
    mom, var : the worker's local states (allocated by LocalUpdater), or None.
    first_step : the global step at which the group was made; `first_step + step` is the
        global step of its next push.
    step : pushes made through this group.
    """

    def __init__(self, server_key, keys, indices, templates, first_step=0):
        first = templates[0]
        self.server_key = server_key
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
        self.send, self.current, self.previous = zeros(), zeros(), zeros()
        self.mom = self.var = None
        self.scratch = None          # receives user pulls and probe rounds
        self.first_step = first_step
        self.step = 0
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
