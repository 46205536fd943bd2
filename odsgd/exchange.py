"""`RoundExchange`: the pushes and pulls of the store's key groups over MXNet's dist store,
each push sent as soon as its round allows, so that a step's pushes travel on the link while
the previous step's global weights come back the other way.

Three facts of MXNet 1.9.1's dist store (`src/kvstore/kvstore_dist*.h`) shape it:

* The sync server merges pushes by count, not by round: a worker's push of step t+1 that
  arrives before another worker's push of step t joins round t. So a push of step t+1 may
  leave only after round t of its key is applied on the servers.
* The server answers a push only after its round is applied. In the engine a push is an
  operation that reads the pushed array until that answer: an operation that writes the array
  runs exactly when round t is applied, one transfer before the pulled weights could arrive.
* On a CPU context the store sends the pushed array itself and pulls into it (its
  `comm_buf_`), then copies the pull into `out`. A group that pushed from one buffer could
  write the next step's gradient only after the pull.

So every group pushes from two buffers, one for each of its two server keys (`KeyGroup.sends`;
the keys alternate by step, key_groups.py), and after each push the
exchange queues a *fence*: a write of the first element of the pushed buffer (waits for the
answer) and a copy of it into the group's token, queued before the pull so that the pull, which
writes the same buffer, waits for the fence and not the other way round. The next step's push
of any group first copies a token that combines the tokens of every push of the previous step
into its buffer, which orders it after every round of that step: the servers apply the rounds
of all keys step by step, as dist_sync's do, so the global optimizer's update count (its
learning-rate schedule) reads as there. The pull of W_{t+1} and the local update from W_t
stay free to run while the pushes of step t+1 are on the link.

Pushes of a step are never overtaken, whatever the speed of the workers; a worker that is
ahead waits in the engine, not in Python.
"""
import mxnet as mx


class RoundExchange(object):
    """Pushes and pulls of key groups (odsgd/key_groups.py) in rounds, on `raw`, MXNet's
    dist_sync store."""

    def __init__(self, raw):
        self.raw = raw
        self._tokens = {}     # global step -> tokens of the groups pushed at that step
        self._combined = {}   # global step -> (token of all of them, how many it combines)

    def push(self, group, step, fill, priority=0):
        """Pushes global step `step` of `group`: `fill(buffer)` writes the data (the summed
        gradients, or zeros) into the send buffer of the step's server key, which is ordered
        after every round of step - 1; then the push and its fence."""
        key, buffer = group.round_of(step)
        after = self._all_applied(step - 1)
        if after is not None:
            after.copyto(group.head(buffer))
        fill(buffer)
        self.raw.push(key, buffer, priority=priority)
        head = group.head(buffer)
        head += 0                       # a write: runs when the server answered the push
        head.copyto(group.token)
        self._tokens.setdefault(step, []).append(group.token)
        for old in [s for s in self._tokens if s < step - 2]:
            del self._tokens[old]
            self._combined.pop(old, None)

    def pull(self, group, out, step=None, priority=0):
        """The global weights of `group` after the round of global step `step` (default: the
        newest) into `out`, a flat buffer of the group. MXNet pulls into the buffer last
        pushed to that key and copies."""
        key = group.newest_key() if step is None else group.round_of(step)[0]
        self.raw.pull(key, out=out, priority=priority)

    def _all_applied(self, step):
        """A token written when every round pushed at `step` was applied (None: none)."""
        tokens = self._tokens.get(step)
        if not tokens:
            return None
        combined = self._combined.get(step)
        if combined is None or combined[1] != len(tokens):
            # add_n reads every token: it runs after every fence of the step.
            combined = (mx.nd.add_n(*tokens), len(tokens))
            self._combined[step] = combined
        return combined[0]
