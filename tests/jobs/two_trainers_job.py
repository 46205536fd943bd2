"""Cluster job of misuse tests: two gluon.Trainers share one dist_odsgd store (the second
Trainer's parameters would take keys 0, 1, ... again; it must fail with the reason), or, with
--second-store, a second dist_odsgd store is made in the same process (it would share the first
store's server keys, and MXNet initialises keys only from its first store): refused, the job
prints the refusal and trains on with the first."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402


def train_one_step(net, trainer):
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, 4))).sum()
    loss.backward()
    trainer.step(2)


def main():
    kv = odsgd.DistODSGD()
    if "--second-store" in sys.argv:
        try:
            mx.kv.create("dist_odsgd")
        except ValueError as refused:
            print("second store refused: %s" % refused, flush=True)
        net = mx.gluon.nn.Dense(3, in_units=4)
        net.initialize()
        train_one_step(net, mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=kv))
        return
    trainers = []
    for _ in range(2):
        net = mx.gluon.nn.Dense(3, in_units=4)
        net.initialize()
        trainers.append((net, mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=kv)))
        train_one_step(*trainers[-1])


if __name__ == "__main__":
    main()
