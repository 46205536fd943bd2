"""A small deterministic least-squares problem shared by the cluster jobs and the NumPy
simulation: worker `rank` at step `t` sees its own batch (X, Y) and the loss
0.5 * sum((X W^T + b - Y)^2), whose gradients are written here in closed form."""
import numpy as np

IN_UNITS, OUT_UNITS, BATCH = 5, 3, 4


def initial_weights(seed=7):
    """(weight (OUT, IN), bias (OUT,)), float32."""
    rng = np.random.RandomState(seed)
    return (rng.uniform(-0.5, 0.5, (OUT_UNITS, IN_UNITS)).astype(np.float32),
            rng.uniform(-0.5, 0.5, (OUT_UNITS,)).astype(np.float32))


def batch(rank, step):
    """(X (BATCH, IN), Y (BATCH, OUT)) of worker `rank` at step `step`, float32."""
    rng = np.random.RandomState(1000 + 100 * rank + step)
    X = rng.uniform(-1, 1, (BATCH, IN_UNITS)).astype(np.float32)
    Y = rng.uniform(-1, 1, (BATCH, OUT_UNITS)).astype(np.float32)
    return X, Y


def gradients(weight, bias, X, Y):
    """Closed-form gradients of 0.5 * sum((X W^T + b - Y)^2): (dW, db)."""
    residual = (X @ weight.T + bias - Y).astype(np.float32)
    return (residual.T @ X).astype(np.float32), residual.sum(axis=0).astype(np.float32)


def gluon_net(contexts=None):
    """The problem's model for the Gluon jobs: Dense(OUT) on IN inputs holding
    initial_weights()."""
    import mxnet as mx
    net = mx.gluon.nn.Dense(OUT_UNITS, in_units=IN_UNITS)
    net.initialize(ctx=contexts)
    weight, bias = initial_weights()
    net.weight.set_data(mx.nd.array(weight))
    net.bias.set_data(mx.nd.array(bias))
    return net


def gluon_step(net, trainer, rank, step):
    """One training step of worker `rank` on batch(rank, step); returns the loss (an NDArray:
    reading it blocks on the previous pull, as a training loop that logs its loss does)."""
    import mxnet as mx
    X, Y = batch(rank, step)
    with mx.autograd.record():
        loss = 0.5 * ((net(mx.nd.array(X)) - mx.nd.array(Y)) ** 2).sum()
    loss.backward()
    trainer.step(BATCH)
    return loss
