"""Job of tests/test_state_files.py: both workers call trainer.save_states with the SAME path
after every step, as GluonCV's scripts do, `--saves` times; local 'sgd' makes each worker's
local momentum its own (the workers' gradients differ). Then each worker writes its in-memory
local momentum to OUT/rank<r>.npz, loads the shared file back through trainer.load_states and
writes what the store then holds to OUT/loaded<r>.npz."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import odsgd  # noqa: E402
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import quadratic_problem as problem  # noqa: E402


def local_momentum(kv):
    """{key: m^i} as the store holds it now."""
    return {"key%d" % key: group.views(group.mom)[i].asnumpy()
            for group in kv._holding_groups() for i, key in enumerate(group.keys)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--saves", type=int, default=30)
    args = p.parse_args()
    kv = odsgd.DistODSGD(local_optimizer="sgd", warmup_steps=1,
                         local_optimizer_params={"learning_rate": 0.05, "momentum": 0.9})
    net = problem.gluon_net()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd",
                               {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3}, kvstore=kv)
    path = os.path.join(args.out, "shared.states")
    for step in range(args.saves):
        problem.gluon_step(net, trainer, kv.rank, step)
        trainer.save_states(path)
    np.savez(os.path.join(args.out, "rank%d.npz" % kv.rank), **local_momentum(kv))
    kv._barrier()   # both workers' last saves are in the file
    for group in kv._holding_groups():
        group.mom[:] = 0   # what is loaded below must come from the file
    trainer.load_states(path)
    np.savez(os.path.join(args.out, "loaded%d.npz" % kv.rank), **local_momentum(kv))
    print("worker %d saved %d times to one path" % (kv.rank, args.saves), flush=True)


if __name__ == "__main__":
    main()
