"""Cluster job of the misuse tests: the workers build different models (rank 0's Dense has 5
inputs, the others 6). The job must end with an error that says the shapes differ."""
import argparse

import odsgd
import mxnet as mx


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tag", default="", help="ignored; makes the command line unique")
    p.parse_args()
    kv = odsgd.DistODSGD(warmup_steps=0)
    in_units = 5 if kv.rank == 0 else 6
    net = mx.gluon.nn.Dense(3, in_units=in_units)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, in_units))).sum()
    loss.backward()
    trainer.step(2)
    print("weight", net.weight.data().asnumpy().sum(), flush=True)


if __name__ == "__main__":
    main()
