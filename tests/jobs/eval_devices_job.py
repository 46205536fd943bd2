"""Cluster job of tests/test_eval_devices.py: the global weights W shown to an evaluation
(odsgd/worker/eval_weights.py) when every parameter lives on several devices.

The network, data and user's values are those of tests/jobs/eval_paths_job.py (an MLP
20 -> 30 -> 5 on dist_odsgd, global SGD with momentum 0.9 and wd 1e-4); here the parameters
live on --devices CPU contexts (cpu(0), cpu(1), ...: separate contexts in MXNet's CPU build),
each batch is split across them, the first layer's weight has lr_mult 0.5 and the last
layer's bias wd_mult 2. --case:

  plain  nothing besides training
  write  after step --at, the parameters named in WRITTEN are set, on every device, to values
         of the user's own (in place, as p.set_data would: set_data itself refuses a Trainer
         whose dist store updates, "Cannot reset distributed KVStore")
  ema    after step --at, an evaluation (W shown on every device), then the same writes
  eval   after step --at, an evaluation and nothing else

Right after the writes (or the evaluation) a recorded forward puts w_t back where the user
wrote nothing; every device's array of every parameter is saved then (`after:<name>@<dev>`),
and after the last step (`w:<name>@<dev>`, and W as odsgd.load_global_weights gives it,
`W:<name>@<dev>`) to OUT/rank<r>.npz."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402
from eval_paths_job import mlp, users_values  # noqa: E402

#: the parameters the 'write' and 'ema' cases set (the others get w_t back)
WRITTEN = ("dense0_weight", "dense1_bias")


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--case", default="plain", choices=["plain", "write", "ema", "eval"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--at", type=int, default=6)
    return p.parse_args()


def short(param):
    """The parameter's name without a prefix of the network's ('dense0_weight')."""
    return "_".join(param.name.split("_")[-2:])


def arrays(net, prefix):
    return {"%s:%s@%d" % (prefix, short(p), device): array.asnumpy()
            for p in net.collect_params().values()
            for device, array in enumerate(p.list_data())}


def main():
    args = parse_args()
    contexts = [mx.cpu(i) for i in range(args.devices)]
    kv = odsgd.DistODSGD()
    net = mlp.network(seed=5)   # eval_paths_job's network and initial weights
    net.collect_params().reset_ctx(contexts)
    params = {short(p): p for p in net.collect_params().values()}
    params["dense0_weight"].lr_mult = 0.5
    params["dense1_bias"].wd_mult = 2.0
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}, kvstore=kv)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    saved = {}
    for step in range(args.steps):
        data, label = mlp.batch(kv.rank, step)
        datas = mx.gluon.utils.split_and_load(data, contexts)
        labels = mx.gluon.utils.split_and_load(label, contexts)
        with mx.autograd.record():
            losses = [loss_fn(net(x), y) for x, y in zip(datas, labels)]
        mx.autograd.backward(losses)
        trainer.step(mlp.batch_size)
        if step + 1 == args.at:
            if args.case in ("ema", "eval"):
                net(mlp.batch(0, 903)[0].as_in_context(contexts[-1])).wait_to_read()  # W shown
            if args.case in ("ema", "write"):
                for name in WRITTEN:   # what p.set_data writes (which refuses a dist store)
                    for array in params[name].list_data():
                        array[:] = users_values(params[name])
            with mx.autograd.record():   # a training forward: w_t back where nothing was set
                net(datas[0])
            saved.update(arrays(net, "after"))
    mx.nd.waitall()
    saved.update(arrays(net, "w"))
    odsgd.load_global_weights(trainer)
    saved.update(arrays(net, "W"))
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), **saved)


if __name__ == "__main__":
    main()
