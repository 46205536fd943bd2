"""OD-SGD simulated in one process, to study the local rule's effect on the global model step by
step: N workers' LeNets on their shards of Fashion-MNIST, the servers' global optimizer on the
sum of their gradients (MXNet's own optimizer, as dist_sync's servers apply it), and each
worker's next weights made by a rule:

- `sync`: w_{t+1}^i = W_{t+1} (dist_sync);
- `stale`: w_{t+1}^i = W_t (no prediction: one round stale);
- `own`: the store's 'predict' for this optimizer (odsgd.worker.local_update: sgd and nag in
  closed form, any other through `worker_copy` with the worker's own estimate of the state);
- `oracle`: the global optimizer's update on W_t with N g and the servers' true state (what
  'predict' would do with a perfect estimate of the state; the same as `own` for sgd);
- `recovered` (Adam only): the worker's estimate of the servers' Adam state recovered each step
  from the observed global step W_t - W_{t-1} (`recover_adam_sum`), then the prediction with it;
- `exact_sum`: the servers' update itself (the rule with G_hat = G_t and the true state): the
  same points as `sync`, a check of the simulation.

Per rule it records the test accuracy of W every --eval-every steps and the prediction's
error: per step, |w_{t+1}^i - W_{t+1}| / |W_{t+1} - W_t| and the projection of
w_{t+1}^i - W_{t+1} on the step W_{t+1} - W_t (negative: the worker's point lags behind the
servers'), averaged over workers.

    python scripts/od_simulation.py --optimizer adam --lr 0.001 --rules sync,own,oracle \
        --seeds 0,1 --epochs 1 --out runs/od_simulation_adam.json

It runs on one core in a fraction of a real job's time (no processes, no transport) and is
deterministic per seed; the real jobs (`odsgd.bench time-to-accuracy`) remain the studies of
record.
"""
import argparse
import copy
import json
import os
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from odsgd.bench.image_job import make_net  # noqa: E402
from odsgd.bench.jobs import global_optimizer_params  # noqa: E402
from odsgd.training import image_datasets  # noqa: E402
from odsgd.worker.local_update import worker_copy  # noqa: E402

RULES = ("sync", "stale", "own", "oracle", "recovered", "exact_sum")


def recover_adam_sum(step, m, v, own, beta1, beta2):
    """Adam's effective gradient of a round (after rescale, weight decay and clipping) from the
    round's step s = (W_before - W_after) / lr_c and the state (m, v) before it, per element:
    (beta1 m + (1 - beta1) G) / sqrt(beta2 v + (1 - beta2) G^2) = s (epsilon neglected) is a
    quadratic in G; of its roots that give the step's sign, the one nearest `own` (the worker's
    own estimate of that round)."""
    b, e = 1.0 - beta1, 1.0 - beta2
    a, c = beta1 * m, beta2 * v
    A = b * b - e * step * step
    Q = np.maximum(b * b * c + a * a * e - step * step * e * c, 0.0)
    # |A| near 0: the step is Adam's largest (every first step, |s| = (1 - beta1) /
    # sqrt(1 - beta2)), which any G of the step's sign gives: not recoverable, `own` stays
    solvable = np.abs(A) > 1e-3 * b * b
    safe = np.where(solvable, A, 1.0)
    roots = [(-a * b + sign * np.abs(step) * np.sqrt(Q)) / safe for sign in (1.0, -1.0)]
    best = own.copy()
    distance = np.full(own.shape, np.inf)
    for root in roots:
        valid = solvable & ((np.sign(a + b * root) == np.sign(step)) | (step == 0))
        closer = valid & (np.abs(root - own) < distance)
        best = np.where(closer, root, best)
        distance = np.where(closer, np.abs(root - own), distance)
    return best


def flat_norm(arrays):
    return float(np.sqrt(sum(float((a * a).sum().asscalar()) for a in arrays)))


def flat_dot(a, b):
    return float(sum(float((x * y).sum().asscalar()) for x, y in zip(a, b)))


class Simulation(object):
    def __init__(self, args, rule, seed):
        self.args, self.rule, self.N = args, rule, args.workers
        (X, y), (X_test, y_test) = image_datasets.load("fashion-mnist")
        self.X_test = image_datasets.to_float(X_test[:args.test_images])
        self.y_test = y_test[:args.test_images]
        self.shards = []
        for rank in range(self.N):
            Xs, ys = image_datasets.shard(X, y, rank, self.N, args.batch_size)
            self.shards.append((image_datasets.to_float(Xs), ys.astype(np.float32)))
        self.steps_per_epoch = len(self.shards[0][0]) // args.batch_size
        self.nets = []
        for rank in range(self.N + 1):    # the workers' nets and one for evaluating W
            mx.random.seed(seed)
            net = make_net()
            net.initialize(mx.init.Xavier())
            net(mx.nd.zeros((1, 1, 28, 28)))
            self.nets.append(net)
        self.params = [list(net.collect_params().values()) for net in self.nets]
        self.W = [p.data().copy() for p in self.params[0]]
        self.W_prev = [w.copy() for w in self.W]
        self.optimizer = self.make_optimizer()
        self.servers = mx.optimizer.get_updater(self.optimizer)
        self.copies = [mx.optimizer.get_updater(worker_copy(self.optimizer))
                       for _ in range(self.N)]
        self.loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()
        self.rng = np.random.RandomState(seed)

    def make_optimizer(self):
        a = self.args
        params = global_optimizer_params(a.optimizer, a.lr, a.momentum, a.wd,
                                         a.optimizer_params)
        return mx.optimizer.create(a.optimizer, rescale_grad=1.0 / a.batch_size, **params)

    def gradients(self, rank, order, step):
        X, y = self.shards[rank]
        b = self.args.batch_size
        index = order[rank][step * b:(step + 1) * b]
        net = self.nets[rank]
        with mx.autograd.record():
            loss = self.loss(net(mx.nd.array(X[index])), mx.nd.array(y[index]))
        loss.backward()
        return [p.grad().copy() for p in self.params[rank]]

    def predict(self, rank, step, grads, server_states):
        """The worker's w_{t+1} from W_t (self.W) and its gradient of step t."""
        out = [w.copy() for w in self.W]
        opt = self.optimizer
        if self.rule == "stale":
            return out
        if self.rule == "own" and type(opt) in (mx.optimizer.SGD, mx.optimizer.NAG):
            return self.closed_form(grads, out)
        if self.rule == "recovered":
            return self.recovered(rank, step, grads)
        updater = self.copies[rank]
        if self.rule in ("oracle", "exact_sum"):
            updater.states = copy.deepcopy(server_states)
            updater.states_synced = {k: True for k in updater.states}
        twin = updater.optimizer
        twin.rescale_grad = opt.rescale_grad * (1 if self.rule == "exact_sum" else self.N)
        twin.lr, twin.wd = opt.lr, opt.wd
        twin.num_update = opt.begin_num_update + step
        for k in range(len(out)):
            twin._index_update_count[k] = opt.begin_num_update + step
        if self.rule == "exact_sum":
            grads = self.summed
        updater(list(range(len(out))), list(grads), out)
        return out

    def recovered(self, rank, step, grads):
        """Adam with the state recovered from the global steps (numpy, per element)."""
        opt = self.optimizer
        b1, b2, eps = opt.beta1, opt.beta2, opt.epsilon
        if not hasattr(self, "kept"):
            self.kept = [[(np.zeros(w.shape, np.float64), np.zeros(w.shape, np.float64))
                          for w in self.W] for _ in range(self.N)]
            self.own_prev = [[None] * len(self.W) for _ in range(self.N)]

        def rate(k):   # lr_c of the round with update count k (>= 1)
            return opt.lr * np.sqrt(1. - b2 ** k) / (1. - b1 ** k)
        out = []
        for j, (W, Wp, g) in enumerate(zip(self.W, self.W_prev, grads)):
            W, Wp = W.asnumpy().astype(np.float64), Wp.asnumpy().astype(np.float64)
            m, v = self.kept[rank][j]
            if step >= 1:
                s = (Wp - W) / rate(step)
                G = recover_adam_sum(s, m, v, self.own_prev[rank][j], b1, b2)
                m, v = b1 * m + (1 - b1) * G, b2 * v + (1 - b2) * G * G
                self.kept[rank][j] = (m, v)
            own = self.N * opt.rescale_grad * g.asnumpy() + opt.wd * W
            self.own_prev[rank][j] = own
            m1, v1 = b1 * m + (1 - b1) * own, b2 * v + (1 - b2) * own * own
            out.append(mx.nd.array(W - rate(step + 1) * m1 / (np.sqrt(v1) + eps)))
        return out

    def closed_form(self, grads, out):
        """'predict' for sgd and nag as the store computes it (docs/predict.md)."""
        opt = self.optimizer
        mu, lr, wd, r = opt.momentum, opt.lr, opt.wd, opt.rescale_grad
        if type(opt) is mx.optimizer.NAG:
            raise SystemExit("own with nag: use the real jobs (the estimate of NAG's state)")
        return [W + mu * (W - Wp) - lr * (self.N * r * g + wd * W)
                for W, Wp, g in zip(self.W, self.W_prev, grads)]

    def accuracy(self):
        for p, w in zip(self.params[self.N], self.W):
            p.set_data(w)
        correct = 0
        for start in range(0, len(self.X_test), 1000):
            scores = self.nets[self.N](mx.nd.array(self.X_test[start:start + 1000]))
            correct += int((scores.argmax(axis=1).asnumpy()
                            == self.y_test[start:start + 1000]).sum())
        return 100.0 * correct / len(self.X_test)

    def run(self):
        history, errors, lags = [], [], []
        total = int(self.steps_per_epoch * self.args.epochs)
        order = None
        for t in range(total):
            step = t % self.steps_per_epoch
            if step == 0:
                order = [self.rng.permutation(len(self.shards[r][0])) for r in range(self.N)]
            grads = [self.gradients(r, order, step) for r in range(self.N)]
            self.summed = [sum(g[k] for g in grads) for k in range(len(self.W))]
            states = copy.deepcopy(self.servers.states)
            predictions = [self.predict(r, t, grads[r], states) for r in range(self.N)]
            new_W = [w.copy() for w in self.W]
            self.servers(list(range(len(new_W))), list(self.summed), new_W)
            move = [a - b for a, b in zip(new_W, self.W)]
            size = flat_norm(move)
            if size > 0:
                miss = [[p - w for p, w in zip(pred, new_W)] for pred in predictions]
                errors.append(np.mean([flat_norm(m) / size for m in miss]))
                lags.append(np.mean([flat_dot(m, move) / size ** 2 for m in miss]))
            self.W_prev, self.W = self.W, new_W
            targets = [new_W if self.rule == "sync" else p for p in predictions]
            for r in range(self.N):
                for p, w in zip(self.params[r], targets[r]):
                    p.set_data(w)
            if (t + 1) % self.args.eval_every == 0 or t + 1 == total:
                history.append({"step": t + 1, "epoch": (t + 1) / self.steps_per_epoch,
                                "test_accuracy": self.accuracy(),
                                "error": float(np.mean(errors[-self.args.eval_every:])),
                                "lag": float(np.mean(lags[-self.args.eval_every:]))})
                print("  %s step %d: %.2f%%, |miss|/|step| %.3f, lag %.3f" % (
                    self.rule, t + 1, history[-1]["test_accuracy"], history[-1]["error"],
                    history[-1]["lag"]), flush=True)
        return history


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--optimizer-params", default="")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=float, default=1)
    p.add_argument("--eval-every", type=int, default=39)
    p.add_argument("--test-images", type=int, default=2000)
    p.add_argument("--rules", default="sync,own,oracle")
    p.add_argument("--seeds", default="0")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    results = {"command": "python scripts/od_simulation.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "runs": []}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for rule in args.rules.split(","):
            if rule not in RULES:
                p.error("unknown rule %r (%s)" % (rule, ", ".join(RULES)))
            start = time.time()
            history = Simulation(args, rule, seed).run()
            results["runs"].append({"rule": rule, "seed": seed, "history": history,
                                    "seconds": time.time() - start})
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    print("\n| rule | seeds | mean test accuracy % at each evaluation | mean lag |")
    print("|---|---|---|---|")
    for rule in args.rules.split(","):
        runs = [r for r in results["runs"] if r["rule"] == rule]
        curve = np.mean([[h["test_accuracy"] for h in r["history"]] for r in runs], axis=0)
        lag = np.mean([h["lag"] for r in runs for h in r["history"]])
        print("| %s | %d | %s | %.3f |" % (rule, len(runs), " / ".join("%.2f" % a for a in curve),
                                          lag))


if __name__ == "__main__":
    main()
