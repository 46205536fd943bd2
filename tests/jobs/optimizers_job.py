"""Cluster job of the optimizer tests: one store, every global optimizer in turn, each on keys
of its own, with the store's defaults (kv.create(KVSTORE)). For each optimizer the worker
sets it, initialises its two keys with the quadratic problem's weights, trains STEPS steps of
pushpull and pulls the final global weights. Each rank writes OUT/rank<r>.npz: per optimizer
the weights the worker computed its gradients on at every step (`<name>_points_<k>`, k = 0
weight, 1 bias) and the final global weights (`<name>_global_<k>`). Started through
odsgd.launch."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402,F401  (registers dist_odsgd)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import quadratic_problem as problem  # noqa: E402

#: name -> its arguments beside learning_rate, wd and rescale_grad (MXNet 1.9.1's defaults
#: otherwise; DCASGD breaks with momentum > 0, NOTES of the project's docs/predict.md)
OPTIMIZERS = {"adam": {}, "rmsprop": {}, "rmsprop_centered": {"centered": True},
              "adagrad": {}, "adadelta": {}, "adamax": {}, "nadam": {}, "ftrl": {},
              "ftml": {}, "signum": {}, "lamb": {}, "lars": {"momentum": 0.9}, "lbsgd": {},
              "dcasgd": {}, "sgld": {}}


def create(name, lr, wd):
    """The optimizer `name` of OPTIMIZERS ('rmsprop_centered': RMSProp(centered=True))."""
    return mx.optimizer.create(name.split("_")[0], learning_rate=lr, wd=wd,
                               rescale_grad=1.0 / problem.BATCH, **OPTIMIZERS[name])


def train(kv, name, first_key, steps, lr, wd):
    kv.set_optimizer(create(name, lr, wd))
    keys = [first_key, first_key + 1]
    weight, bias = problem.initial_weights()
    kv.init(keys, [mx.nd.array(weight), mx.nd.array(bias)])
    arrays = [mx.nd.zeros(weight.shape), mx.nd.zeros(bias.shape)]
    kv.pull(keys, out=arrays)
    points = [[], []]
    for step in range(steps):
        values = [a.asnumpy() for a in arrays]
        for k in range(2):
            points[k].append(values[k])
        grads = problem.gradients(values[0], values[1], *problem.batch(kv.rank, step))
        kv.pushpull(keys, [mx.nd.array(g) for g in grads], out=arrays)
    kv.pull(keys, out=arrays)
    result = {"%s_points_%d" % (name, k): np.array(points[k]) for k in range(2)}
    result.update({"%s_global_%d" % (name, k): arrays[k].asnumpy() for k in range(2)})
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvstore", default="dist_odsgd")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    kv = mx.kv.create(args.kvstore)
    results = {}
    for j, name in enumerate(OPTIMIZERS):
        results.update(train(kv, name, 10 * (j + 1), args.steps, args.lr, args.wd))
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), type=str(kv.type), **results)


if __name__ == "__main__":
    main()
