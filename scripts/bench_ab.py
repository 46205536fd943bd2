"""Before and after: the throughput benchmark of two checkouts of odsgd, interleaved.

    python scripts/bench_ab.py --before ../odsgd-before --repeats 3 --out runs/ab_mlp2000 -- \
        --topology hosts --model mlp --batch-size 128 --bandwidth-mbit 2000 --steps 30 --skip 8

runs `python -m odsgd.bench throughput --repeats 1 <args>` once per repeat in the checkout
given by --before (another commit's worktree, with its native library built: `python -m
odsgd.native build` there) and once in this one, alternately, so that drift on a shared
machine hits both alike; then prints per mode the samples/s of each side (median, min-max)
and after / before (the ratio of the medians, and the range of the per-repeat ratios). Each
run's JSON is kept under --out; the summary is --out/summary.json."""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="checkout of the commit to compare with")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True, help="folder for the runs' JSON and the summary")
    p.add_argument("bench", nargs=argparse.REMAINDER,
                   help="-- then the options of odsgd.bench throughput")
    args = p.parse_args(argv)
    if args.bench[:1] == ["--"]:
        args.bench = args.bench[1:]
    if not os.path.isdir(os.path.join(args.before, "odsgd")):
        p.error("--before %s is not a checkout of odsgd" % args.before)
    return args


def run_once(checkout, json_path, bench):
    environment = dict(os.environ, PYTHONPATH=checkout)
    command = [sys.executable, "-m", "odsgd.bench", "throughput", "--repeats", "1",
               "--json", json_path] + bench
    subprocess.run(command, cwd=checkout, env=environment, check=True)
    with open(json_path) as f:
        return {run["mode"]: run["samples_per_sec"] for run in json.load(f)["runs"]}


def summary(rates):
    """{mode: {side: [median, min, max], 'ratio': median after / median before, 'ratios':
    [min, max] of the per-repeat ratios}}."""
    out = {}
    for mode in rates["after"][0]:
        sides = {side: [r[mode] for r in rates[side]] for side in ("before", "after")}
        entry = {side: [statistics.median(v), min(v), max(v)] for side, v in sides.items()}
        per_repeat = [a / b for a, b in zip(sides["after"], sides["before"])]
        entry["ratio"] = entry["after"][0] / entry["before"][0]
        entry["ratios"] = [min(per_repeat), max(per_repeat)]
        out[mode] = entry
    return out


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rates = {"before": [], "after": []}
    for repeat in range(args.repeats):
        for side, checkout in (("before", args.before), ("after", HERE)):
            path = os.path.abspath(os.path.join(args.out, "%s%d.json" % (side, repeat)))
            print("== repeat %d, %s (%s)" % (repeat + 1, side, checkout), flush=True)
            rates[side].append(run_once(checkout, path, args.bench))
    result = summary(rates)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"bench": args.bench, "repeats": args.repeats, "modes": result}, f, indent=1)
    for mode, entry in result.items():
        print("%-11s before %.1f (%.1f-%.1f)  after %.1f (%.1f-%.1f)  after/before %.3f "
              "(per repeat %.3f-%.3f)" % ((mode,) + tuple(entry["before"]) +
                                          tuple(entry["after"]) + (entry["ratio"],) +
                                          tuple(entry["ratios"])))


if __name__ == "__main__":
    main()
