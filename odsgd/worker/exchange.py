"""`RoundExchange`: the rounds of the store's key groups over MXNet's dist store, each part of a
group one push-with-pull request, sent as soon as its own key allows, so that the link carries
a step's gradients in one direction while global weights come back in the other.

Four facts of MXNet 1.9.1's dist store (`src/kvstore/kvstore_dist*.h`) shape it:

* The sync server merges pushes by count, not by round: a worker's push of round t+1 of a key
  that arrives before another worker's push of round t of that key joins round t. So a push
  of round t+1 may leave only after round t *of its own key* is applied on the servers. Other
  keys do not matter: the servers merge each key on its own.
* A push-with-pull request (`kv.pushpull`, `PushPullDefault`) is answered once its round is
  applied, with the weights that round produced. So its answer is always its own round's
  W_{t+1}, however late it travels, and a key needs no second key to keep rounds apart.
* On a CPU context the store sends the pushed array itself, writes the answer into it and
  then copies it into `out` (`comm_buf_ = merged`). Writing the next round's gradients into
  that array (the part's `send`) therefore waits in MXNet's engine for this round's answer:
  that is the per-key order of the first fact, kept by the engine, not by Python. Each part
  has an array of its own, so the parts of a group travel independently.
* A server applies a key's round when its pushes are in, whatever the other keys are doing,
  so the rounds of different keys may be applied out of step order. The servers' optimizer
  reads its schedule at an update count; `sync_round_steps` tells the servers the global step
  of each key's next round, and they set the count of each round to what dist_sync has in
  that round (server_updater.py), so the rates do not depend on that order.

The answer lands in a buffer that the step's local update does not read (`KeyGroup.following`,
three buffers in rotation), so a group's request is queued before its local update and leaves
as soon as the gradient is gathered.
"""
import mxnet as mx

from .. import native
from ..server import updater as servers
from .local_update import fused_ops_take


class RoundExchange(object):
    """Rounds of key groups (odsgd/worker/key_groups.py) on `raw`, MXNet's dist_sync store."""

    def __init__(self, raw):
        self.raw = raw

    def round(self, group, step, fill, out, counted=True):
        """Round `step` (a global step) of `group`: `fill(group)` writes the data into the
        send arrays of its parts, then one push-with-pull request per part brings the weights
        of that round into `out`, a flat buffer of the group. `counted`: a round the servers
        apply (not a probe)."""
        fill(group)
        for part in group.parts:
            if part.answer is None:
                self.raw.pushpull(part.key, part.send, out=part.of(out))
            else:
                # The answer's own array, then the group's buffer: the copies into slices of
                # one buffer run in part order (one engine variable), and the part's next
                # fill must not wait for them (Part's docstring). Not one library gather of
                # all answers: MXNet runs a worker's library operators in issue order, so the
                # step's local update would wait for this round (docs/design.md).
                self.raw.pushpull(part.key, part.send, out=part.answer)
                part.answer.copyto(part.of(out))
        if counted:
            group.server_step = step + 1

    def sync_round_steps(self, groups):
        """Tells the servers the global step of the next round of each of `groups` where they
        do not know it yet: a new group, a group whose key was not pushed for a while (a frozen
        layer trained again), states loaded from a checkpoint."""
        stale = [g for g in groups if g.server_step != g.global_step]
        if not stale:
            return
        if any(g.server_step is not None for g in stale):
            # Rounds already sent keep the steps they were sent with: let them reach the
            # servers first (rare: a layer unfrozen, a checkpoint loaded).
            mx.nd.waitall()
        servers.send_command(self.raw, servers.round_steps_command(
            {part.key: g.global_step for g in stale for part in g.parts}))
        for group in stale:
            group.server_step = group.global_step

    # -- one group's round ---------------------------------------------------------------------
    def gradient_round(self, group, gradients, out):
        """The group's next round with `gradients` (one raw array per parameter); its weights
        into `out`."""
        self.round(group, group.global_step, lambda g: fill_parts(g, gradients), out)

    def synchronous_round(self, group, gradients):
        """Warm-up steps and plain pushes: the round's W_{t+1} becomes the group's newest."""
        self.gradient_round(group, gradients, group.previous)
        group.swap()


def fill_parts(group, gradients):
    """The parts' send arrays = their parts of the gradients laid end to end (the group's
    packing): gathered straight into the send array where the group has one part, else taken
    from the gradient itself (one parameter) or the group's flat buffer of them, part by
    part."""
    if len(group.parts) == 1:
        gather(gradients, group, group.parts[0].send)
        return
    if len(gradients) == 1:
        # the gradient array itself (not cached by Part.of, which keeps group buffers)
        flat = gradients[0].reshape((-1,))
        for part in group.parts:
            flat[part.offset:part.offset + part.size].copyto(part.send)
        return
    if group.gradients is not None and gradients[0] is group.views(group.gradients)[0]:
        flat = group.gradients          # summed over devices there already
    else:
        flat = group.gradient_buffer()
        gather(gradients, group, flat)
    for part in group.parts:
        part.of(flat).copyto(part.send)


def summed_gradients(group, grads):
    """The raw gradient of each parameter on the group's context: the arrays themselves with
    one device, else their sum in the group's buffer for it."""
    if all(len(g) == 1 for g in grads):
        return [g[0] for g in grads]
    views = group.views(group.gradient_buffer())
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
