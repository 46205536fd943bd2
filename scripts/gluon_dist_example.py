"""MXNet's own Gluon distributed example on this machine: example/distributed_training/
cifar10_dist.py of MXNet 1.9.1 (model-zoo ResNet-18 v1, `gluon.Trainer(..., 'adam',
{'learning_rate': .001}, kvstore=store)`, a per-rank split of the training set, several
contexts through `split_and_load`), run per store type and compared by epoch.

    python scripts/gluon_dist_example.py --example FILE [--modes "dist_sync;dist_odsgd"] \
        [--runs 0,1] [--train-images 12288] [--test-images 5000] --out runs/gluon_example.json

FILE is that script (`git show 1.9.1:example/distributed_training/cifar10_dist.py` of
apache/mxnet); it is not copied. Each job runs it as it is, but for these textual changes,
each checked to apply exactly once and listed in the JSON:

- the store's name: `kv.create('dist')` becomes `kv.create('<mode>')`;
- what the machine needs: CPU contexts for its GPUs (`mx.gpu(i)` -> `mx.cpu(i)`, 4 -> 2 per
  machine, so each worker still splits its batch over several contexts), and real images
  offline: `gluon.data.vision.CIFAR10` -> Fashion-MNIST (Debian's dataset-fashion-mnist) in
  CIFAR's shape (28x28 padded to 32x32, grey repeated over 3 channels, uint8 HWC), the first
  `--train-images` training and `--test-images` test images, and the sampler's hard-coded
  50000 -> `--train-images`. With 2 workers and 2 contexts of 64 images each, 12,288 images
  are 24 full batches per worker: `Trainer.step` raises on a batch of another size (MXNet
  1.9.1's `_check_and_rescale_grad`), in dist_sync too.

The example shuffles its part with Python's `random` unseeded: run r seeds it with r (both
modes of a run see the same orders). Jobs run one at a time through `python -m odsgd.launch -n 2
-s 1 --launcher local`; the script's own `Epoch %d: Test_acc %f` lines (every worker scores the
whole test set with its parameters) are recorded per worker. The table gives, per mode, the
mean over runs and workers of each epoch's accuracy and of the last two epochs.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCH_LINE = re.compile(r"\[worker (\d+)\].*Epoch (\d+): Test_acc ([0-9.]+)")
CONTEXTS = 2

#: (what the example says, what the job runs): each must occur exactly once
def substitutions(mode, train_images):
    return [
        ("kv.create('dist')", "kv.create(%r)" % mode),
        ("gpus_per_machine = 4", "gpus_per_machine = %d" % CONTEXTS),
        ("ctx = [mx.gpu(i) for i in range(gpus_per_machine)]",
         "ctx = [mx.cpu(i) for i in range(gpus_per_machine)]"),
        ("gluon.data.vision.CIFAR10(train=True, transform=transform)",
         "FashionAsCifar(train=True, transform=transform)"),
        ("gluon.data.vision.CIFAR10(train=False, transform=transform)",
         "FashionAsCifar(train=False, transform=transform)"),
        ("SplitSampler(50000,", "SplitSampler(%d," % train_images),
    ]


#: prepended to the example: the data set class it is given instead of CIFAR10
PRELUDE = '''
import random as _random
import numpy as _np
import mxnet as _mx
from odsgd.training import image_datasets as _images

_random.seed(int(__import__("os").environ["EXAMPLE_RUN"]))


class FashionAsCifar(_mx.gluon.data.Dataset):
    """Fashion-MNIST in CIFAR-10's shape: 32x32x3 uint8 HWC images, int labels."""

    def __init__(self, train=True, transform=None):
        (X, y), (X_test, y_test) = _images.load("fashion-mnist")
        X, y = (X, y) if train else (X_test, y_test)
        count = int(__import__("os").environ["EXAMPLE_%s_IMAGES" % ("TRAIN" if train else "TEST")])
        X = X[:count].reshape(-1, 28, 28)
        padded = _np.zeros((len(X), 32, 32, 3), _np.uint8)
        padded[:, 2:30, 2:30, :] = X[:, :, :, None]
        self._data, self._label, self._transform = padded, y[:count].astype(_np.int32), transform

    def __getitem__(self, idx):
        data, label = _mx.nd.array(self._data[idx], dtype=_np.uint8), self._label[idx]
        return self._transform(data, label) if self._transform else (data, label)

    def __len__(self):
        return len(self._label)

'''


def job_script(example, mode, train_images, folder):
    """The example with the substitutions applied, written into `folder`; its path."""
    with open(example) as f:
        source = f.read()
    for before, after in substitutions(mode, train_images):
        count = source.count(before)
        if count != 1:
            sys.exit("%s: %r occurs %d times (expected once): not MXNet 1.9.1's "
                     "cifar10_dist.py" % (example, before, count))
        source = source.replace(before, after)
    # after the example's __future__ import, which must stay first
    head, sep, rest = source.partition("from __future__ import print_function\n")
    path = os.path.join(folder, "cifar10_dist_%s.py" % mode)
    with open(path, "w") as f:
        f.write(head + sep + PRELUDE + rest)
    return path


def run_job(script, run, args):
    env = dict(os.environ, EXAMPLE_RUN=str(run), EXAMPLE_TRAIN_IMAGES=str(args.train_images),
               EXAMPLE_TEST_IMAGES=str(args.test_images), OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "odsgd.launch", "--job-timeout", str(args.job_timeout),
               "-n", "2", "-s", "1", "--launcher", "local", sys.executable, script]
    start = time.time()
    done = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    accuracy = {}
    for worker, epoch, value in EPOCH_LINE.findall(done.stdout):
        accuracy.setdefault(int(worker), {})[int(epoch)] = 100 * float(value)
    record = {"run": run, "exit_code": done.returncode, "seconds": time.time() - start,
              "accuracy": {w: [a[e] for e in sorted(a)] for w, a in sorted(accuracy.items())}}
    if done.returncode != 0:
        record["output_tail"] = done.stdout[-3000:]
    return record


def summary(records, epochs):
    """Per mode: the mean over runs and workers of each epoch and of the last two epochs."""
    table = {}
    for mode, runs in records.items():
        curves = [c for r in runs if r["exit_code"] == 0 for c in r["accuracy"].values()
                  if len(c) == epochs]
        if not curves:
            continue
        by_epoch = [sum(c[e] for c in curves) / len(curves) for e in range(epochs)]
        last_two = [(c[-1] + c[-2]) / 2 for c in curves]
        table[mode] = {"by_epoch": by_epoch, "last_two_mean": sum(last_two) / len(last_two),
                       "last_two_per_curve": last_two, "curves": len(curves)}
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", required=True, help="MXNet 1.9.1's cifar10_dist.py")
    p.add_argument("--modes", default="dist_sync;dist_odsgd")
    p.add_argument("--runs", default="0,1", help="seeds of the example's shuffles")
    p.add_argument("--train-images", type=int, default=12288)
    p.add_argument("--test-images", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=5, help="the example's (not changed)")
    p.add_argument("--job-timeout", type=int, default=2400)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(";") if m]
    folder = os.path.splitext(args.out)[0] + "_scripts"
    os.makedirs(folder, exist_ok=True)
    scripts = {mode: job_script(args.example, mode, args.train_images, folder) for mode in modes}
    records = {mode: [] for mode in modes}
    for run in [int(r) for r in args.runs.split(",")]:
        for mode in (modes if run % 2 == 0 else modes[::-1]):
            print("run %d, %s ..." % (run, mode), flush=True)
            record = run_job(scripts[mode], run, args)
            records[mode].append(record)
            print("  exit %d, %.0f s, accuracy per worker: %s" % (
                record["exit_code"], record["seconds"],
                {w: ["%.2f" % a for a in c] for w, c in record["accuracy"].items()}), flush=True)
            result = {"command": "python scripts/gluon_dist_example.py " + " ".join(
                          sys.argv[1:] if argv is None else argv),
                      "substitutions": substitutions("<mode>", args.train_images),
                      "train_images": args.train_images, "test_images": args.test_images,
                      "records": records, "summary": summary(records, args.epochs)}
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    print("\n| mode | test accuracy % by epoch (mean of runs x workers) | mean of the last two |")
    print("|---|---|---|")
    for mode, row in result["summary"].items():
        print("| %s | %s | %.2f (per curve %s) |" % (
            mode, " / ".join("%.2f" % a for a in row["by_epoch"]), row["last_two_mean"],
            ", ".join("%.2f" % a for a in row["last_two_per_curve"])))


if __name__ == "__main__":
    main()
