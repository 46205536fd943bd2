"""Job of the launcher tests: every process (scheduler, server, worker) first writes its role
and the variables named by --names to OUT/<role>-<pid>.json, then imports mxnet. On a
scheduler or a server that import runs the ps-lite node until the job ends and never returns,
so the record has to come first. Workers then do one push and pull on dist_sync (the job
works end to end; with --sgd the servers first get SGD at rate 1 through MXNet's
set_optimizer, so that the pulled weights are 0 - 1 * num_workers), print `worker <rank> ready,
pulled <value>`, and with --hold wait until that file exists, which keeps every job port open
while a test looks at them."""
import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="folder for the records")
    p.add_argument("--names", default="", help="comma-separated variables to record")
    p.add_argument("--hold", help="workers wait until this file exists before they exit")
    p.add_argument("--hold-timeout", type=float, default=60.0)
    p.add_argument("--sgd", action="store_true", help="the servers apply SGD at rate 1")
    return p.parse_args(argv)


def record(out, names):
    """Writes {'role', 'pid', 'env': {name: value or None}}; renamed into place whole, so a
    reader never sees half a file."""
    role = os.environ.get("DMLC_ROLE", "none")
    seen = {"role": role, "pid": os.getpid(),
            "env": {name: os.environ.get(name) for name in names}}
    path = os.path.join(out, "%s-%d.json" % (role, os.getpid()))
    with open(path + ".part", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".part", path)


def read_records(out):
    """{role: [{name: value or None}, ...]} of the records in `out` (for the tests)."""
    found = {}
    for entry in sorted(os.listdir(out)):
        if entry.endswith(".json"):
            with open(os.path.join(out, entry)) as f:
                seen = json.load(f)
            found.setdefault(seen["role"], []).append(seen["env"])
    return found


def hold(path, timeout):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit("roles_job: %s did not appear within %g s" % (path, timeout))
        time.sleep(0.1)


def main():
    args = parse_args()
    record(args.out, [n for n in args.names.split(",") if n])
    import mxnet as mx   # a scheduler or server serves the job here and exits at its end
    kv = mx.kv.create("dist_sync")
    kv.init(0, mx.nd.zeros(4))
    if args.sgd:
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0))
    kv.push(0, mx.nd.ones(4))
    pulled = mx.nd.zeros(4)
    kv.pull(0, out=pulled)
    pulled.wait_to_read()
    print("worker %d ready, pulled %g" % (kv.rank, pulled.asnumpy()[0]), flush=True)
    if args.hold:
        hold(args.hold, args.hold_timeout)


if __name__ == "__main__":
    main()
