"""Measured against predicted samples/s of several throughput runs in one picture:

    python -m odsgd.bench.prediction_plot results/paper_cluster_*.json \\
        --out results/paper_cluster.png

One group of bars per run and bandwidth (its label: model, N workers + S servers, Gbit/s),
one bar per mode (the median, the line its min-max over repeats), and a black mark at the
rate the step model predicted for it (plan_samples_per_sec; odsgd/bench/step_model.py).
"""
import argparse
import json

from .step_model import MODES


def load_runs(paths):
    """Every run of the JSON files, in order."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.extend(json.load(f)["runs"])
    return runs


def group_label(run):
    """What one group of bars stands for."""
    return "%s\n%dw+%ds, %g Gbit/s" % (run["model"], run["workers"], run["servers"],
                                        run["bandwidth_mbit"] / 1e3)


def grouped(runs):
    """[(label, {mode: run})] in the order the runs came."""
    groups = {}
    for run in runs:
        groups.setdefault(group_label(run), {})[run["mode"]] = run
    return list(groups.items())


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = grouped(runs)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.8 * len(groups)), 4.5))
    width = 0.8 / len(MODES)
    for index, mode in enumerate(MODES):
        xs, medians, low, high, predicted = [], [], [], [], []
        for position, (_, modes) in enumerate(groups):
            run = modes.get(mode)
            if run is None:
                continue
            xs.append(position + (index - (len(MODES) - 1) / 2.0) * width)
            medians.append(run["samples_per_sec"])
            low.append(run["samples_per_sec"] - run["samples_per_sec_min"])
            high.append(run["samples_per_sec_max"] - run["samples_per_sec"])
            predicted.append(run.get("plan_samples_per_sec"))
        if not xs:
            continue
        ax.bar(xs, medians, width, yerr=[low, high], capsize=2, label=mode)
        marks = [(x, p) for x, p in zip(xs, predicted) if p]
        if marks:
            ax.plot([x for x, _ in marks], [p for _, p in marks], "k_", markersize=14,
                    markeredgewidth=2, label="predicted" if index == 0 else None)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([label for label, _ in groups], fontsize=7)
    ax.set_ylabel("samples/s (all workers)")
    ax.set_title("measured (bars: median, min-max of repeats) and predicted (black)",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="odsgd.bench.prediction_plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="JSON files of `odsgd.bench throughput`")
    p.add_argument("--out", required=True, help="the PNG to write")
    args = p.parse_args(argv)
    plot(load_runs(args.json), args.out)
    print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
