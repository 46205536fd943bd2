"""The small Gluon MLP shared by the cluster jobs that train one (long_run_job.py, layout_job.py,
eval_paths_job.py, store_checkpoint_job.py): its network, data that depends only on the rank
and the step, and the writer of every worker's weights to OUT/rank<r>.npz.

Each job gives its own sizes, seed, data stride and multipliers: the same values give the same
arrays, bit for bit."""
import argparse
import os

import numpy as np
import mxnet as mx


class MLP:
    """A job's MLP, Dense(hidden, relu) -> Dense(classes), and its data: batches of batch_size
    rows of in_units, seeded by rank_stride * rank + step."""

    def __init__(self, in_units, hidden, classes, batch_size, rank_stride=100):
        self.in_units, self.hidden, self.classes = in_units, hidden, classes
        self.batch_size, self.rank_stride = batch_size, rank_stride

    def network(self, seed, hybrid=False, first_bias_lr_mult=None, no_bias_decay=False):
        """The network, Xavier-initialized after mx.random.seed(seed). first_bias_lr_mult: the
        first bias's lr_mult; no_bias_decay: every bias's wd_mult 0."""
        net = mx.gluon.nn.HybridSequential() if hybrid else mx.gluon.nn.Sequential()
        net.add(mx.gluon.nn.Dense(self.hidden, in_units=self.in_units, activation="relu"),
                mx.gluon.nn.Dense(self.classes, in_units=self.hidden))
        mx.random.seed(seed)
        net.initialize(mx.init.Xavier())
        params = list(net.collect_params().values())
        if first_bias_lr_mult is not None:
            params[1].lr_mult = first_bias_lr_mult
        if no_bias_decay:
            for param in params:
                if param.name.endswith("bias"):
                    param.wd_mult = 0.0
        return net

    def batch(self, rank, step):
        """(data (batch_size, in_units), labels (batch_size,)) of worker `rank` at `step`."""
        rng = np.random.RandomState(self.rank_stride * rank + step)
        return (mx.nd.array(rng.randn(self.batch_size, self.in_units).astype(np.float32)),
                mx.nd.array(rng.randint(0, self.classes, self.batch_size).astype(np.float32)))


def arguments(steps):
    """The parser of a job's options, with those every job has: --out (required), --steps."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=steps)
    return p


def named_weights(net, prefix=""):
    """{prefix + name: the parameter's array} of every parameter of `net`, as NumPy."""
    return {prefix + p.name: p.data().asnumpy() for p in net.collect_params().values()}


def write_weights(out, rank, net, load_global=None, **more):
    """Writes OUT/rank<rank>.npz: the parameters of `net` as they are ('w:<name>'), then, with
    load_global (a call that puts the global weights W in them), W ('W:<name>'), and `more`."""
    saved = named_weights(net, "w:")
    if load_global is not None:
        load_global()
        saved.update(named_weights(net, "W:"))
    saved.update(more)
    np.savez(os.path.join(str(out), "rank%d.npz" % rank), **saved)
