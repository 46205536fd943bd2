"""What the parameter servers run: the global optimizer, wrapped so that the workers can
change its learning rate while it keeps its states.

MXNet's servers accept exactly one command from a worker: a pickled optimizer, which replaces
their updater (and with it every optimizer state). `ServerOptimizer` keeps the states itself,
keyed by parameter, so a replacement loses nothing; `learning_rate_command` pickles to a call
that changes the rate of the server's running `ServerOptimizer` and hands that same object back.

This module is unpickled on the servers while `import mxnet` is still running there (the server
loop starts inside it), so it imports only `mxnet.optimizer`, which is ready by then.
"""
import pickle

from mxnet.optimizer import Optimizer

#: The ServerOptimizer this server process runs (None on workers).
_RUNNING = None


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
        self.states = {}

    def __setstate__(self, state):
        # Unpickled on a server: this object becomes the one the commands below act on.
        global _RUNNING
        super(ServerOptimizer, self).__setstate__(state)
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
        # A new Updater (after a command) asks again: give back the state it had.
        if index not in self.states:
            self.states[index] = self.optimizer.create_state_multi_precision(index, weight)
        return self.states[index]

    def create_state(self, index, weight):
        return self.create_state_multi_precision(index, weight)

    def update(self, index, weight, grad, state):
        self.optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self.optimizer.update_multi_precision(index, weight, grad, state)


def _apply_learning_rate(lr):
    """Runs on a server when a learning-rate command is unpickled; returns the running
    optimizer, which the server then installs again (states kept, see ServerOptimizer)."""
    if _RUNNING is None:
        raise RuntimeError("odsgd: learning-rate command before the optimizer reached this "
                           "server; call kv.set_optimizer first")
    _RUNNING.set_learning_rate(lr)
    return _RUNNING


class _LearningRateCommand(object):
    def __init__(self, lr):
        self.lr = float(lr)

    def __reduce__(self):
        return (_apply_learning_rate, (self.lr,))


def learning_rate_command(lr):
    """The body of the command that sets the servers' learning rate to `lr` (a str, as
    MXNet's set_optimizer sends: pickle protocol 0 is ASCII)."""
    return pickle.dumps(_LearningRateCommand(lr), 0).decode("ascii")
