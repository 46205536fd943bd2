"""Cluster job of the throughput benchmark: trains a model on synthetic data for a number of
steps and writes this worker's samples/s (and, for dist_odsgd, its overlap meter) as JSON.

Modes: `--kvstore dist_sync|dist_async|dist_odsgd` trains; `--measure compute` times one
step of forward/backward alone (no kvstore, run as a single process); `--measure comm` times
push + pull of every parameter with no computation (a dist_sync job).
"""
import argparse
import json
import os
import time

import odsgd  # registers dist_odsgd; on servers it loads only the server side
import mxnet as mx
import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", help="mlp, resnet18_v1, resnet50_v1 (GluonCV)")
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--mlp-hidden", type=int, default=1024, help="hidden units of 'mlp'")
    p.add_argument("--kvstore", default="dist_odsgd")
    p.add_argument("--measure", choices=["train", "compute", "comm"], default="train")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--skip", type=int, default=8, help="untimed steps first")
    p.add_argument("--out", required=True, help="folder for rank<r>.json")
    return p.parse_args(argv)


MLP_IN, CLASSES = 1024, 10


def mlp_parameter_count(hidden):
    """Parameters of the benchmark MLP 1024-hidden-hidden-10 (2,109,450 for hidden=1024)."""
    return MLP_IN * hidden + hidden + hidden * hidden + hidden + hidden * CLASSES + CLASSES


def build_model(name, image_size, mlp_hidden=1024):
    """(net, input shape without batch, classes). 'mlp': 1024-hidden-hidden-10."""
    if name == "mlp":
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Dense(mlp_hidden, activation="relu", in_units=MLP_IN),
                mx.gluon.nn.Dense(mlp_hidden, activation="relu", in_units=mlp_hidden),
                mx.gluon.nn.Dense(CLASSES, in_units=mlp_hidden))
        shape, classes = (MLP_IN,), CLASSES
    else:
        from gluoncv.model_zoo import get_model
        net = get_model(name, classes=1000)
        shape, classes = (3, image_size, image_size), 1000
    net.initialize(mx.init.Xavier(magnitude=2))
    net.hybridize(static_alloc=True, static_shape=True)
    return net, shape, classes


def synthetic_batch(shape, classes, batch_size):
    rng = np.random.RandomState(0)
    data = mx.nd.array(rng.uniform(-1, 1, (batch_size,) + shape))
    label = mx.nd.array(rng.randint(0, classes, batch_size))
    return data, label


def timed(step, skip, steps):
    """Seconds per step of `step()` over `steps` steps after `skip` untimed ones."""
    for _ in range(skip):
        step()
    mx.nd.waitall()
    tic = time.time()
    for _ in range(steps):
        step()
    mx.nd.waitall()
    return (time.time() - tic) / steps


def model_step(args, trainer_for=None):
    """(net, step): the model with one synthetic batch, and a function that runs one step's
    forward and backward, then `trainer.step` when `trainer_for(net)` gives a Trainer."""
    net, shape, classes = build_model(args.model, args.image_size, args.mlp_hidden)
    net(mx.nd.zeros((1,) + shape))
    trainer = trainer_for(net) if trainer_for else None
    data, label = synthetic_batch(shape, classes, args.batch_size)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        if trainer is not None:
            trainer.step(args.batch_size)
    return net, step


def measure_compute(args):
    _, step = model_step(args)
    return {"t_comp": timed(step, args.skip, args.steps)}, 0


def measure_comm(args):
    kv = mx.kv.create("dist_sync")
    net, _ = model_step(args)
    params = [p for p in net.collect_params().values() if p.grad_req != "null"]
    weights = [p.data() for p in params]
    grads = [mx.nd.zeros_like(w) for w in weights]
    for i, w in enumerate(weights):
        kv.init(i, w)

    def step():
        for i, (g, w) in enumerate(zip(grads, weights)):
            kv.push(i, g, priority=-i)
            kv.pull(i, out=w, priority=-i)
    return {"t_comm": timed(step, 2, max(3, args.steps // 3))}, kv.rank


def measure_training(args):
    kv = mx.kv.create(args.kvstore)
    _, step = model_step(args, lambda net: mx.gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv))
    seconds = timed(step, args.skip, args.steps)
    result = {"seconds_per_step": seconds, "samples_per_sec": args.batch_size / seconds}
    if isinstance(kv, odsgd.DistODSGD):
        result["overlap"] = kv.overlap.summary()
    return result, kv.rank


def main(argv=None):
    args = parse_args(argv)
    measure = {"train": measure_training, "compute": measure_compute,
               "comm": measure_comm}[args.measure]
    result, rank = measure(args)
    with open(os.path.join(args.out, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
