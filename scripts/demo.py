"""`make demo`: a local OD-SGD cluster (1 server, 2 workers, started through odsgd.launch)
trains an MLP on scikit-learn's bundled handwritten digits with dist_sync, dist_async and
dist_odsgd in turn, then prints each mode's test accuracy and samples/s.

    python scripts/demo.py [--num-epochs 15] [--workers 2] [--json results/demo.json]
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from odsgd.bench.jobs import run_job  # noqa: E402

MODES = ("dist_sync", "dist_async", "dist_odsgd")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-epochs", type=int, default=15)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="results/demo.json")
    return p.parse_args(argv)


def train(mode, args):
    """Runs one mode's job; returns rank 0's results."""
    with tempfile.TemporaryDirectory() as out:
        result_file = os.path.join(out, "result.json")
        run_job(["odsgd.bench.digits_job", "--kvstore", mode, "--num-epochs", args.num_epochs,
                 "--seed", args.seed, "--json", result_file],
                workers=args.workers, servers=args.servers, timeout=900,
                env={"OMP_NUM_THREADS": "1"},
                show=lambda line: "epoch" in line or "Error" in line)
        with open(result_file) as f:
            return json.load(f)


def main(argv=None):
    args = parse_args(argv)
    print("OD-SGD demo: MLP 64-128-64-10 on scikit-learn digits (1437 train / 360 test), "
          "%d workers x batch 16, %d server(s), %d epochs, global SGD lr 0.05 momentum 0.9"
          % (args.workers, args.servers, args.num_epochs), flush=True)
    results = []
    for mode in MODES:
        print("\n== %s ==" % mode, flush=True)
        tic = time.time()
        result = train(mode, args)
        result["job_seconds"] = time.time() - tic
        results.append(result)
    print("\n%-11s %14s %12s %10s" % ("mode", "test accuracy", "samples/s", "job (s)"))
    for r in results:
        print("%-11s %13.2f%% %12.0f %10.1f" % (r["mode"], 100 * r["final_test_accuracy"],
                                               r["samples_per_sec"], r["job_seconds"]))
    print("\nOn this unshaped loopback with a small model, communication costs almost nothing, "
          "so OD-SGD has little to hide and its per-step work shows in samples/s; on a slow "
          "network it is the fastest mode: `make bench`, docs/benchmarks.md.")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print("\nwrote %s" % args.json)


if __name__ == "__main__":
    main()
