"""`RoundExchange`: the pushes and pulls of the store's key groups over MXNet's dist store,
each push sent as soon as its own key allows, so that a step's pushes travel on the link while
the global weights of earlier rounds come back the other way.

Four facts of MXNet 1.9.1's dist store (`src/kvstore/kvstore_dist*.h`) shape it:

* The sync server merges pushes by count, not by round: a worker's push of round t+1 of a key
  that arrives before another worker's push of round t of that key joins round t. So a push
  of round t+1 may leave only after round t *of its own key* is applied on the servers. Other
  keys do not matter: the servers merge each key on its own.
* The server answers a push only after its round is applied. In the engine a push is an
  operation that reads the pushed array until that answer: an operation that writes the array
  runs exactly when the round is applied, one transfer before the pulled weights could arrive.
* On a CPU context the store sends the pushed array itself and pulls into it (its
  `comm_buf_`), then copies the pull into `out`. A group that pushed from one buffer could
  write the next step's gradient only after the pull.
* A server applies a key's round when its pushes are in, whatever the other keys are doing,
  so the rounds of different keys may be applied out of step order. The servers' optimizer
  reads its schedule at an update count; `sync_round_steps` tells the servers the global step
  of each group's next round, and they set the count of each round to what dist_sync has in
  that round (server_updater.py), so the rates do not depend on that order.

So every group pushes from two buffers, one for each of its two server keys (`KeyGroup.sends`;
the keys alternate by step, key_groups.py). After each push the exchange queues a *fence*: a
write of the first element of the pushed buffer (it waits for the answer) and a copy of it into
the group's token, both queued before the pull, so that the pull, which writes the same buffer,
waits for the fence and not the other way round. The group's next push first copies its token
into the other buffer, which orders that push after the group's previous round and nothing
else: the pull of W_{t+1}, the local update from W_t and the pushes of other groups stay free to
run while it is on the link. A worker that is ahead waits in the engine, not in Python.
"""
import mxnet as mx

from . import native
from . import server_updater as servers
from .local_update import fused_ops_take


class RoundExchange(object):
    """Pushes and pulls of key groups (odsgd/key_groups.py) in rounds, on `raw`, MXNet's
    dist_sync store."""

    def __init__(self, raw):
        self.raw = raw

    def push(self, group, step, fill, counted=True, priority=0):
        """Pushes round `step` (a global step) of `group`: `fill(buffer)` writes the data into
        the send buffer of the round's server key, ordered after the group's previous round;
        then the push and its fence. `counted`: a round the servers apply (not a probe)."""
        key, buffer = group.round_of(step)
        head = group.head(buffer)
        group.token.copyto(head)        # waits for the fence of the group's previous push
        fill(buffer)
        self.raw.push(key, buffer, priority=priority)
        head += 0                       # a write: runs when the server answered the push
        head.copyto(group.token)
        if counted:
            group.server_step = step + 1

    def pull(self, group, out, step=None, priority=0):
        """The global weights of `group` after the round of global step `step` (default: the
        newest) into `out`, a flat buffer of the group. MXNet pulls into the buffer last
        pushed to that key and copies."""
        key = group.newest_key() if step is None else group.round_of(step)[0]
        self.raw.pull(key, out=out, priority=priority)

    def sync_round_steps(self, groups):
        """Tells the servers the global step of the next round of each of `groups` where they
        do not know it yet: a new group, a group whose key was not pushed for a while (a frozen
        layer trained again), states loaded from a checkpoint."""
        stale = [g for g in groups if g.server_step != g.global_step]
        if not stale:
            return
        if any(g.server_step is not None for g in stale):
            # Rounds already pushed keep the steps they were pushed with: let them reach the
            # servers first (rare: a layer unfrozen, a checkpoint loaded).
            mx.nd.waitall()
        servers.send_command(self.raw, servers.round_steps_command(
            {g.server_key: g.global_step for g in stale}))
        for group in stale:
            group.server_step = group.global_step

    # -- one group's round ---------------------------------------------------------------------
    def push_gradients(self, group, gradients):
        """Pushes `gradients` (one raw array per parameter) as the group's next round."""
        self.push(group, group.global_step, lambda buffer: gather(gradients, group, buffer))

    def pull_next(self, group):
        """W_{t+1} (after the group's round of this step) into its older buffer, which becomes
        its newest."""
        self.pull(group, group.previous, step=group.global_step)
        group.swap()

    def synchronous_round(self, group, gradients):
        """Warm-up steps and plain pushes: push, then pull W_{t+1} into the group's
        buffers."""
        self.push_gradients(group, gradients)
        self.pull_next(group)


def summed_gradients(group, grads):
    """The raw gradient of each parameter on the group's context: the arrays themselves with
    one device, else their sum in the group's buffer for it."""
    if all(len(g) == 1 for g in grads):
        return [g[0] for g in grads]
    views = group.views(group.summed_buffer())
    for view, per_device in zip(views, grads):
        mx.nd.add_n(*[g.as_in_context(group.context) for g in per_device], out=view)
    return views


def gather(grads, group, flat):
    """flat = the gradients end to end (the group's packing): one operator where the library
    takes the arrays, else one copy per parameter."""
    arrays = list(grads) + [flat]
    if fused_ops_take(group, arrays):
        native.gather_(list(grads), flat)
        return
    for grad, view in zip(grads, group.views(flat)):
        grad.copyto(view)


def scatter(group, flat, weights):
    """weights = their parts of `flat`: one operator, else one copy per parameter."""
    arrays = list(weights) + [flat]
    if fused_ops_take(group, arrays):
        native.scatter_(flat, list(weights))
        return
    for view, weight in zip(group.views(flat), weights):
        view.copyto(weight)
