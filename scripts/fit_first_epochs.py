"""fit.py's first epochs under dist_odsgd: MXNet 1.9.1's own
example/image-classification/train_cifar10.py, unmodified, on a RecordIO set of real images.

    python scripts/fit_first_epochs.py --example DIR [--probe] [--networks resnet20,lenet] \
        [--modes "dist_sync;dist_odsgd"] [--seeds 0,1,2,3] [--epochs 4] [--reuse JSON] \
        --out runs/fit_first_epochs.json [--plot docs/fit_first_epochs.png]

DIR is the example folder of MXNet 1.9.1's source (`git archive 1.9.1
example/image-classification` of apache/mxnet); nothing of it is copied or changed. The set:
the first 9,600 Fashion-MNIST training images and the first 2,000 test images (Debian's
dataset-fashion-mnist) as 3x28x28 PNG records, written as data/cifar10_train.rec and
data/cifar10_val.rec of a work folder (the names train_cifar10.py looks for, so it downloads
nothing). A job of train_cifar10.py is deterministic (MXNet seeds its generators the same at
every start, the record iterator shuffles with a fixed seed, and the servers' sum of two
gradients does not depend on their order), so its script takes no seed: what varies a run here
is the order of the training records in the file, the one seed of this study (seed 0: the
images in Fashion-MNIST's order; seed s > 0: numpy's RandomState(s) permutation of them).
Each job runs in the seed's folder through `python -m odsgd.launch -n 2 -s 1 --launcher local`,
one at a time, with train_cifar10.py's defaults but `--network`, `--num-examples` and
`--num-epochs`. A mode is a store type, or
`dist_odsgd:NAME=VALUE,...` for a store with ODSGD_* settings in its environment (e.g.
`dist_odsgd:ODSGD_WARMUP_STEPS=38`). It records fit.py's own `Validation-accuracy` of each worker per epoch (fit.py
scores each worker's half of the validation set). With `--probe` every job runs through
scripts/fit_first_epochs_job.py, which also measures per epoch the accuracy of the global
weights and of each worker's local weights on the whole validation set.

MXNet's own dist_sync hangs at exit in about 1 job of 4 (/work/shared notes; upstream's): a
job whose workers have logged their last epoch and that has not ended within --exit-grace
seconds is ended (its launcher, by pid) and kept, marked `ended_after_last_epoch`.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from odsgd.bench.jobs import _end as end_job  # noqa: E402  (after the path is set)

TRAIN_IMAGES, VAL_IMAGES = 9600, 2000
NETWORKS = {"resnet20": ["--network", "resnet", "--num-layers", "20"],
            "lenet": ["--network", "lenet"]}
VALIDATION = re.compile(r"\[worker (\d+)\].*Epoch\[(\d+)\] Validation-accuracy=([0-9.]+)")
JOB_SCRIPT = os.path.join(REPO, "scripts", "fit_first_epochs_job.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", required=True,
                   help="MXNet 1.9.1's example/image-classification folder")
    p.add_argument("--networks", default="resnet20", help="comma-separated: resnet20, lenet")
    p.add_argument("--modes", default="dist_sync;dist_odsgd",
                   help="';'-separated: a store type, or dist_odsgd:ODSGD_NAME=VALUE,...")
    p.add_argument("--seeds", default="0,1,2,3",
                   help="orders of the training records (0: Fashion-MNIST's own)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--probe", action="store_true",
                   help="also measure the global and the local weights per epoch")
    p.add_argument("--script-arg", action="append", default=[], metavar="ARG",
                   help="one more argument of train_cifar10.py for every job (e.g. "
                   "--script-arg=--lr=0.02)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the jobs, e.g. ODSGD_EVAL_WEIGHTS=local")
    p.add_argument("--reuse", action="append", default=[],
                   help="a results JSON of this script (may be repeated): its runs of the same "
                   "network, mode and seed are taken instead of run again (the jobs are "
                   "deterministic)")
    p.add_argument("--work", help="work folder (default: a temporary one)")
    p.add_argument("--job-timeout", type=int, default=1500)
    p.add_argument("--exit-grace", type=int, default=90)
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--plot", help="PNG of the validation accuracy per epoch")
    return p.parse_args(argv)


def build_recordio(data_dir, seed):
    """Writes cifar10_train/_val .rec and .idx in `data_dir`: Fashion-MNIST as 3x28x28, the
    training images in the order of `seed`."""
    import mxnet as mx
    import numpy as np
    from odsgd.training.image_datasets import FASHION_MNIST_DIR, load_idx_pair
    (X_train, y_train), (X_test, y_test) = load_idx_pair(FASHION_MNIST_DIR)
    os.makedirs(data_dir, exist_ok=True)
    order = np.arange(TRAIN_IMAGES) if seed == 0 else \
        np.random.RandomState(seed).permutation(TRAIN_IMAGES)
    for name, X, y in (("cifar10_train", X_train[order], y_train[order]),
                       ("cifar10_val", X_test[:VAL_IMAGES], y_test[:VAL_IMAGES])):
        base = os.path.join(data_dir, name)
        writer = mx.recordio.MXIndexedRecordIO(base + ".idx", base + ".rec", "w")
        for i, (image, label) in enumerate(zip(X, y)):
            rgb = np.repeat(image.transpose(1, 2, 0), 3, axis=2)   # gray as 3 equal channels
            header = mx.recordio.IRHeader(0, float(label), i, 0)
            writer.write_idx(i, mx.recordio.pack_img(header, rgb, img_fmt=".png"))
        writer.close()


def store_and_settings(mode):
    """('dist_odsgd', {'ODSGD_WARMUP_STEPS': '38'}) of 'dist_odsgd:ODSGD_WARMUP_STEPS=38'."""
    store, _, settings = mode.partition(":")
    pairs = [item.partition("=") for item in settings.split(",") if item]
    return store, {name: value for name, _, value in pairs}


def job_command(args, mode, network, probe_out):
    script = [os.path.join(args.example, "train_cifar10.py")]
    if probe_out is not None:
        script = [JOB_SCRIPT, "--example", args.example, "--out", probe_out, "--"]
    return ([sys.executable, "-m", "odsgd.launch", "--job-timeout", str(args.job_timeout),
             "-n", "2", "-s", "1", "--launcher", "local", sys.executable] + script +
            NETWORKS[network] + ["--kv-store", store_and_settings(mode)[0],
                                 "--num-examples", str(TRAIN_IMAGES),
                                 "--num-epochs", str(args.epochs)] + args.script_arg)


def job_environment(args):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")   # 2 workers on 2 shared cores
    env["PYTHONUNBUFFERED"] = "1"
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def _lines(process):
    """A queue that receives the process's output lines, then None."""
    import queue
    import threading
    lines = queue.Queue()

    def read():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def run_job(command, cwd, env, epochs, grace, log_path):
    """Runs one job; returns {rank: [accuracy per epoch]} of fit.py's validation lines and
    whether it had to be ended after its last epoch. Raises RuntimeError if it fails."""
    import queue
    accuracies, finished_at, ended = {}, None, False
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines = _lines(process)
        try:
            while True:
                try:
                    line = lines.get(timeout=5)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                log.write(line)
                match = VALIDATION.search(line)
                if match:
                    rank, epoch, value = int(match.group(1)), int(match.group(2)), \
                        float(match.group(3))
                    accuracies.setdefault(rank, {})[epoch] = value
                done = len(accuracies) == 2 and all(len(a) == epochs
                                                   for a in accuracies.values())
                finished_at = finished_at or (time.time() if done else None)
                if finished_at and time.time() - finished_at > grace:
                    ended = True      # upstream's dist_sync hang at exit: figures are in
                    break
        finally:
            end_job(process)   # the launcher ends its own job on SIGTERM, else its group
    if not ended and process.returncode != 0:
        raise RuntimeError("job failed (exit %s); log: %s" % (process.returncode, log_path))
    return {rank: [per[e] for e in sorted(per)] for rank, per in accuracies.items()}, ended


def read_probe(folder):
    """{rank: [record per epoch]} from scripts/fit_first_epochs_job.py's files."""
    probes = {}
    for name in sorted(os.listdir(folder)):
        rank = int(name[len("rank"):-len(".jsonl")])
        with open(os.path.join(folder, name)) as f:
            probes[rank] = [json.loads(line) for line in f]
    return probes


def reusable_runs(args):
    """{(network, mode, seed): run} of --reuse's results, where they were measured alike."""
    runs = {}
    for path in args.reuse:
        with open(path) as f:
            saved = json.load(f)
        settings = saved["settings"]
        if settings["epochs"] != args.epochs or settings["probe"] != args.probe or \
                settings["env"] != args.env or \
                settings.get("script_args", []) != args.script_arg:
            raise SystemExit("--reuse %s was measured with other settings (%s); run again "
                             "without it" % (path, settings))
        runs.update(((r["network"], r["mode"], r["seed"]), r) for r in saved["runs"])
    return runs


def run_one(args, work, network, mode, seed):
    folder = os.path.join(work, "seed%d" % seed)
    name = "%s_%s" % (network, mode.replace(":", "_").replace(",", "_").replace("=", ""))
    probe_out = os.path.join(folder, name) if args.probe else None
    env = job_environment(args)
    env.update(store_and_settings(mode)[1])
    tic = time.time()
    fit_accuracy, ended = run_job(job_command(args, mode, network, probe_out), folder, env,
                                  args.epochs, args.exit_grace,
                                  os.path.join(folder, name + ".log"))
    run = {"network": network, "mode": mode, "seed": seed, "fit_validation": fit_accuracy,
           "ended_after_last_epoch": ended, "seconds": round(time.time() - tic, 1)}
    if probe_out is not None:
        run["probe"] = read_probe(probe_out)
    return run


def run_all(args, work):
    runs, reused = [], reusable_runs(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    for seed in seeds:
        build_recordio(os.path.join(work, "seed%d" % seed, "data"), seed)
    for network in args.networks.split(","):
        for seed in seeds:
            for mode in args.modes.split(";"):
                run = reused.get((network, mode, seed)) or run_one(args, work, network, mode,
                                                                   seed)
                runs.append(run)
                print(json.dumps(summary_line(run)), flush=True)
    return runs


def _mean(values):
    return sum(values) / float(len(values))


def per_epoch(by_rank, field=None):
    """[mean over the workers, per epoch] (in %) of {rank: [value or record per epoch]}."""
    ranks = sorted(by_rank)
    epochs = min(len(by_rank[r]) for r in ranks)
    pick = (lambda v: v) if field is None else (lambda v: v[field])
    return [round(100 * _mean([pick(by_rank[r][e]) for r in ranks]), 2) for e in range(epochs)]


def summary_line(run):
    """What one run measured, per epoch, in % (means over the two workers)."""
    line = {"network": run["network"], "mode": run["mode"], "seed": run["seed"],
            "fit": per_epoch(run["fit_validation"]),
            "fit_workers_apart": [round(100 * abs(a - b), 2) for a, b in
                                  zip(*[run["fit_validation"][r] for r in sorted(
                                      run["fit_validation"])])]}
    if "probe" in run:
        line["global"] = per_epoch(run["probe"], "global")
        line["local"] = per_epoch(run["probe"], "local")
        line["local_per_worker"] = {r: [round(100 * v["local"], 2) for v in records]
                                    for r, records in sorted(run["probe"].items())}
    return line


def _spread(values):
    """The sample standard deviation (0 for one value)."""
    mean = _mean(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 \
        if len(values) > 1 else 0.0


def _mean_and_error(curves):
    """Per epoch: (mean, standard error of the mean) over the curves, rounded."""
    return [(round(_mean(values), 2), round(_spread(values) / len(values) ** 0.5, 2))
            for values in zip(*curves)]


def summarise(runs, baseline="dist_sync"):
    """Per network and mode: each curve (fit, global, local) per seed and its mean over the
    seeds; for the other modes also each curve minus the baseline's of the same seed (mean
    and standard error over the seeds): fit.py's against fit.py's, the probe's against the
    probe's whole-set accuracy of the baseline's weights."""
    table = {}
    for run in runs:
        line = summary_line(run)
        entry = table.setdefault(run["network"], {}).setdefault(run["mode"], {"seeds": []})
        entry["seeds"].append(run["seed"])
        for curve in ("fit", "global", "local"):
            if curve in line:
                entry.setdefault(curve + "_per_seed", []).append(line[curve])
    for network, modes in table.items():
        reference = modes.get(baseline)
        for mode, entry in modes.items():
            for curve in ("fit", "global", "local"):
                if curve + "_per_seed" not in entry:
                    continue
                entry[curve] = [m for m, _ in _mean_and_error(entry[curve + "_per_seed"])]
                # how far one run moves with the order of the training records alone
                entry[curve + "_spread_over_seeds"] = [
                    round(_spread(v), 2) for v in zip(*entry[curve + "_per_seed"])]
                if reference is not None and mode != baseline and \
                        reference["seeds"] == entry["seeds"]:
                    theirs = reference[("fit" if curve == "fit" else "global") + "_per_seed"]
                    entry[curve + "_minus_" + baseline] = _mean_and_error([
                        [a - b for a, b in zip(mine, other)] for mine, other in
                        zip(entry[curve + "_per_seed"], theirs)])
    return table


def print_table(table):
    for network, modes in table.items():
        for mode, entry in modes.items():
            for curve in ("fit", "global", "local"):
                if curve in entry:
                    print("%-9s %-11s %-7s %s   (spread over seeds %s)" % (
                        network, mode, curve, "  ".join("%5.2f" % v for v in entry[curve]),
                        " ".join("%.2f" % v for v in entry[curve + "_spread_over_seeds"])))
            for key in sorted(k for k in entry if "_minus_" in k):
                print("%-9s %-11s %-24s %s" % (network, mode, key, "  ".join(
                    "%+5.2f±%.2f" % pair for pair in entry[key])))


#: what the plot draws of a mode: (curve, line style, label)
PLOTTED = {"dist_sync": [("global", "-o", "dist_sync")],
           "dist_odsgd": [("global", "-s", "dist_odsgd, global W"),
                          ("local", ":^", "dist_odsgd, local w_t (mean of the workers)")]}


def plot(table, path):
    """Top: per network, the whole-set validation accuracy per epoch, mean over the seeds
    (bars: standard error); bottom: each seed's dist_sync and dist_odsgd (W), to show how far
    single runs move."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(2, len(table), figsize=(6 * len(table), 8), squeeze=False)
    for column, (network, modes) in enumerate(table.items()):
        top, bottom = axes[0][column], axes[1][column]
        for mode, curves in PLOTTED.items():
            entry = modes.get(mode, {})
            for curve, style, label in curves:
                if curve + "_per_seed" not in entry:
                    continue
                pairs = _mean_and_error(entry[curve + "_per_seed"])
                epochs = range(1, len(pairs) + 1)
                top.errorbar(epochs, [m for m, _ in pairs], yerr=[e for _, e in pairs],
                             fmt=style, capsize=3, label=label)
                if curve == "global":
                    for seed, values in zip(entry["seeds"], entry[curve + "_per_seed"]):
                        bottom.plot(epochs, values, style[1:] + ("-" if mode == "dist_sync"
                                                                 else "--"),
                                    color="C%d" % seed, alpha=0.7,
                                    label="%s seed %d" % (mode, seed))
        top.set_title("%s: validation accuracy, mean of %d seeds" % (
            network, len(modes.get("dist_sync", {}).get("seeds", [])) or 1))
        bottom.set_title("%s: each seed (W; the orders of the training records)" % network)
        for ax in (top, bottom):
            ax.set_xticks(range(1, len(modes["dist_sync"]["fit"]) + 1))
            ax.set_xlabel("epoch")
            ax.set_ylabel("% of the 2,000 validation images")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def portable(arg, example):
    """`arg` as the report records it: no path of this machine (the example folder becomes
    EXAMPLE, other paths outside the repository their file name)."""
    if not arg.startswith(os.sep):
        return arg
    if os.path.abspath(arg) == example:
        return "EXAMPLE"
    inside = os.path.relpath(arg, REPO)
    return os.path.basename(arg) if inside.startswith("..") else inside


def main(argv=None):
    args = parse_args(argv)
    args.example = os.path.abspath(args.example)
    if not os.path.exists(os.path.join(args.example, "train_cifar10.py")):
        raise SystemExit("--example must be MXNet 1.9.1's example/image-classification folder "
                         "(with train_cifar10.py); got %r" % args.example)
    work = args.work or tempfile.mkdtemp(prefix="fit_first_epochs_")
    runs = run_all(args, work)
    table = summarise(runs)
    print_table(table)
    command = [portable(a, args.example) for a in sys.argv]
    report = {"command": " ".join(command),
              "settings": {"train_images": TRAIN_IMAGES, "val_images": VAL_IMAGES,
                           "epochs": args.epochs, "workers": 2, "servers": 1,
                           "seeds": args.seeds,
                           "env": args.env, "script_args": args.script_arg,
                           "probe": args.probe},
              "summary": table, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.plot:
        plot(table, args.plot)
    print("wrote %s%s" % (args.out, " and " + args.plot if args.plot else ""))


if __name__ == "__main__":
    main()
