"""Cluster job of the misuse tests (tests/test_misuse.py): inside a real job, each worker
makes the mistakes that need a parameter-server job, one after the other, and writes to
OUT/rank<r>.json what each one raised ("TypeName: message", or null if nothing was raised).

The cases run in an order that keeps the store usable: none of them pushes a step."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402


def raised(action):
    try:
        action()
    except Exception as error:  # noqa: BLE001 - what was raised is the result
        return "%s: %s" % (type(error).__name__, error)
    return None


def dense_net(in_units=5):
    net = mx.gluon.nn.Dense(3, in_units=in_units)
    net.initialize()
    return net


def backward(net, in_units=5):
    with mx.autograd.record():
        loss = net(mx.nd.ones((2, in_units))).sum()
    loss.backward()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    kv = odsgd.DistODSGD(local_optimizer="predict", warmup_steps=0)
    results = {}

    weight = mx.nd.ones((4, 3))
    kv.init(500, weight)
    results["pushpull_without_optimizer"] = raised(
        lambda: kv.pushpull(500, mx.nd.ones((4, 3)), out=weight))
    results["sparse_weight"] = raised(
        lambda: kv.init(501, mx.nd.sparse.zeros("row_sparse", (4, 3))))
    results["sparse_gradient"] = raised(
        lambda: kv.push(500, mx.nd.sparse.zeros("row_sparse", (4, 3))))

    def sparse_gradient_trainer():
        embedding = mx.gluon.nn.Embedding(10, 4, sparse_grad=True)
        embedding.initialize()
        trainer = mx.gluon.Trainer(embedding.collect_params(), "sgd", kvstore=kv)
        with mx.autograd.record():
            loss = embedding(mx.nd.array([1, 2])).sum()
        loss.backward()
        trainer.step(2)
    results["sparse_gradient_trainer"] = raised(sparse_gradient_trainer)

    results["equal_steps_negative"] = raised(lambda: odsgd.equal_steps(kv, -1))
    results["gradient_compression"] = raised(
        lambda: kv.set_gradient_compression({"type": "2bit", "threshold": 0.5}))
    results["no_gradient_compression"] = raised(
        lambda: kv.set_gradient_compression({"type": "none"}))
    results["row_sparse_pull"] = raised(
        lambda: kv.row_sparse_pull(500, out=mx.nd.sparse.zeros("row_sparse", (4, 3)),
                                   row_ids=mx.nd.array([0, 1])))

    # Rank 0 has a (3, 5) array, the others (3, 6): the others must get the error.
    shape = (3, 5) if kv.rank == 0 else (3, 6)
    results["shape_check"] = raised(lambda: kv.agreement.check_same_shape(600, mx.nd.zeros(shape)))

    def update_on_kvstore_false():
        net = dense_net()
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=kv,
                                   update_on_kvstore=False)
        backward(net)
        trainer.step(2)
    results["update_on_kvstore_false"] = raised(update_on_kvstore_false)

    with open(os.path.join(args.out, "rank%d.json" % kv.rank), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
