"""Job of tests/test_job_key.py: a plain dist_sync job in which one worker (--rogue; ps-lite
gives it any rank) was not given the job's key. It sends the servers a pickled command whose
unpickling runs a shell command that writes OUT/unsigned.txt and installs SGD with learning
rate 100; then the same kind of command, writing OUT/signed.txt and installing SGD with
learning rate 1, signed with the key read from --key-file (what a process that holds the key does). Then every worker pushes ones to key 0
(initialised to zeros) and pulls it, and writes OUT/rank<r>.json: the servers' weights after
the round and whether each file exists. The other worker only takes part in the rounds."""
import argparse
import json
import operator
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from odsgd.common import job_key  # noqa: E402


class Shell(object):
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Rogue(object):
    """Unpickles to an SGD optimizer, running `Shell(command)` on the way."""

    def __init__(self, command, lr):
        self.command, self.lr = command, lr

    def __reduce__(self):
        sgd = mx.optimizer.SGD(learning_rate=self.lr, momentum=0.0, wd=0.0)
        return (operator.itemgetter(1), ([Shell(self.command), sgd],))


def command(path, lr):
    import pickle
    return pickle.dumps(Rogue("echo ran > %s" % path, lr), 0).decode("ascii")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--rogue", action="store_true", help="this worker sends the commands")
    args = p.parse_args()
    unsigned_file = os.path.join(args.out, "unsigned.txt")
    signed_file = os.path.join(args.out, "signed.txt")
    kv = mx.kv.create("dist_sync")
    kv.init(0, mx.nd.zeros(4))
    if args.rogue:
        # this process has no key: the start-up hook's sender passes the body on unsigned
        kv._send_command_to_servers(0, command(unsigned_file, 100.0))
        key = job_key.read_key_file(args.key_file)
        signed = job_key.sign(key, 0, command(signed_file, 1.0), "worker-1", 1,
                              job_key.job_context())
        kv._send_command_to_servers(0, signed.decode("ascii"))
    kv._barrier()   # the other worker pushes after the commands
    kv.push(0, mx.nd.ones(4))
    pulled = mx.nd.zeros(4)
    kv.pull(0, out=pulled)
    result = {"pulled": pulled.asnumpy().tolist(), "unsigned": os.path.exists(unsigned_file),
              "signed": os.path.exists(signed_file)}
    with open(os.path.join(args.out, "rank%d.json" % kv.rank), "w") as f:
        json.dump(result, f)
    print("worker %d done: %s" % (kv.rank, result), flush=True)


if __name__ == "__main__":
    main()
