"""One worker of scripts/fit_first_epochs.py's probed runs: MXNet's own train_cifar10.py,
unmodified, run with a probe that measures after every epoch which model lags.

    python scripts/fit_first_epochs_job.py --example DIR --out OUT -- <train_cifar10.py args>

runs DIR/train_cifar10.py as its own __main__, with one addition through fit.fit's
documented `batch_end_callback` keyword: at the last batch of each epoch (after its update,
before fit.py's own checkpoint and score) the probe evaluates the whole validation set
(each worker all of it, not fit.py's half) with the training Module itself, twice:

* `local`: the worker's own parameter arrays (under dist_odsgd its local weights w_t);
* `global`: the servers' newest weights W, shown by odsgd/worker/eval_weights.py as an inference
  forward sees them with ODSGD_EVAL_WEIGHTS=global.

Both with the worker's own BatchNorm running statistics (Module never synchronises them).
Under dist_sync the two are the same weights. It also times the swap (W pulled in with w_t
set aside, and w_t put back) and writes OUT/rank<r>.jsonl, one line per epoch. Afterwards
the arrays hold what ODSGD_EVAL_WEIGHTS says, as fit.py's own score expects; the extra
inference pass changes no weight, but it may change the rounding of a conv net's later steps
(ResNet-20's figures moved by up to a point, dist_sync's too: docs/convergence.md), so probed
runs are compared with probed runs.
"""
import argparse
import json
import os
import runpy
import sys
import time

import mxnet as mx
import numpy as np

import odsgd  # noqa: F401  (dist_odsgd; installs the hooks that show W)
from odsgd.worker import eval_weights


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", required=True,
                   help="MXNet 1.9.1's example/image-classification folder")
    p.add_argument("--out", required=True, help="folder for rank<r>.jsonl")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="-- then train_cifar10.py's arguments")
    args = p.parse_args(argv)
    if args.script_args[:1] == ["--"]:
        args.script_args = args.script_args[1:]
    return args


def validation_set(path, rgb_mean, rgb_std):
    """(images (n, 3, h, w) float32, normalised as fit.py's ImageRecordIter does, labels)."""
    reader = mx.recordio.MXRecordIO(path, "r")
    images, labels = [], []
    while True:
        record = reader.read()
        if record is None:
            break
        header, image = mx.recordio.unpack_img(record, iscolor=1)
        images.append(image[:, :, ::-1].transpose(2, 0, 1))   # BGR HWC -> RGB CHW
        labels.append(float(header.label))
    reader.close()
    mean = np.array(rgb_mean, np.float32).reshape(3, 1, 1)
    std = np.array(rgb_std, np.float32).reshape(3, 1, 1)
    return (np.stack(images).astype(np.float32) - mean) / std, np.array(labels)


def accuracy(module, images, labels, batch_size):
    """Share of `images` the module classifies right, in inference forwards of its bound
    batch size (the last batch padded, its padding not counted)."""
    right = 0
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        padded = np.zeros((batch_size,) + images.shape[1:], np.float32)
        padded[:len(batch)] = batch
        module.forward(mx.io.DataBatch([mx.nd.array(padded)]), is_train=False)
        predicted = module.get_outputs()[0].asnumpy()[:len(batch)].argmax(axis=1)
        right += int((predicted == labels[start:start + len(batch)]).sum())
    return right / float(len(images))


class EpochProbe(object):
    """fit.fit's batch_end_callback: the probe at the last batch of every epoch."""

    def __init__(self, args, out):
        self.images, self.labels = validation_set(
            args.data_val, [float(v) for v in args.rgb_mean.split(",")],
            [float(v) for v in args.rgb_std.split(",")])
        self.batch_size, self.out = args.batch_size, out

    def __call__(self, param):
        if not param.locals.get("end_of_batch"):
            return
        module = param.locals["self"]
        kv = module._kvstore
        record = {"epoch": param.epoch, "rank": kv.rank, "kvstore": kv.type}
        if hasattr(kv, "config"):          # dist_odsgd
            record.update(self.both_models(module, kv))
        else:
            record["local"] = record["global"] = self.evaluate(module, record, "eval")
        with open(os.path.join(self.out, "rank%d.jsonl" % kv.rank), "a") as f:
            f.write(json.dumps(record) + "\n")

    def evaluate(self, module, record, name):
        tic = time.time()
        value = accuracy(module, self.images, self.labels, self.batch_size)
        record[name + "_seconds"] = time.time() - tic
        return value

    def both_models(self, module, kv):
        shown, mode, record = eval_weights.shown_weights(kv), kv.config.eval_weights, {}
        mx.nd.waitall()
        try:
            kv.config.eval_weights = eval_weights.LOCAL
            record["local"] = self.evaluate(module, record, "local_eval")
            kv.config.eval_weights = eval_weights.GLOBAL
            tic = time.time()
            shown.show_global()
            mx.nd.waitall()
            record["show_global_seconds"] = time.time() - tic
            record["global"] = self.evaluate(module, record, "global_eval")
            tic = time.time()
            shown.restore_local()
            mx.nd.waitall()
            record["restore_local_seconds"] = time.time() - tic
            record["aside_bytes"] = sum(a.size * a.dtype(0).itemsize for a in shown.aside)
        finally:
            kv.config.eval_weights = mode
        return record


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    sys.path.insert(0, os.path.abspath(args.example))
    from common import fit   # the example's own common/fit.py

    original_fit = fit.fit

    def fit_with_probe(script_args, network, data_loader, **kwargs):
        callbacks = kwargs.pop("batch_end_callback", [])
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        return original_fit(script_args, network, data_loader,
                            batch_end_callback=callbacks + [EpochProbe(script_args, args.out)],
                            **kwargs)

    fit.fit = fit_with_probe
    sys.argv = [os.path.join(args.example, "train_cifar10.py")] + args.script_args
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
