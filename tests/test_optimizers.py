"""Every global optimizer MXNet 1.9.1 ships trains on dist_odsgd with the store's defaults
('predict' with that optimizer's own update, docs/predict.md), and the servers' update is
still dist_sync's: the final global weights equal MXNet's own optimizer applied, step after
step, to the sum of the gradients the workers pushed (computed here in NumPy at the points
each worker recorded). The same replay holds plain dist_sync's run (the replay is what
dist_sync's servers do). SGLD draws its noise on the servers: its run is checked to train,
not to equal a replay. Nadam keeps one momentum schedule for all keys, advanced at every
key's update, so its servers' result depends on the order in which a round's keys arrive,
under dist_sync too: its replay takes the order per step that matches."""
import itertools

import mxnet as mx
import numpy as np
import pytest

from cluster import run_job
from jobs import optimizers_job as job
from jobs import quadratic_problem as problem

pytestmark = pytest.mark.timeout(300)
WORKERS, STEPS = 2, 4


def run(tmp_path, kvstore):
    out = tmp_path / kvstore
    out.mkdir()
    run_job("optimizers_job.py", ["--kvstore", kvstore, "--steps", STEPS, "--out", out],
            workers=WORKERS)
    return [dict(np.load(out / ("rank%d.npz" % r))) for r in range(WORKERS)]


def replay(results, name, orders=((0, 1),) * STEPS):
    """The servers' final weights of `name`: MXNet's optimizer on the sum of the gradients
    at the recorded points, per step, keys as the job gives them, in `orders[step]`."""
    optimizer = job.create(name, 0.02, 0.01)
    updater = mx.optimizer.get_updater(optimizer)
    W = [mx.nd.array(a) for a in problem.initial_weights()]
    for step in range(STEPS):
        grads = [problem.gradients(r["%s_points_0" % name][step], r["%s_points_1" % name][step],
                                   *problem.batch(rank, step))
                 for rank, r in enumerate(results)]
        for k in orders[step]:
            updater(k, mx.nd.array(sum(g[k] for g in grads)), W[k])
    return [a.asnumpy() for a in W]


def matches(results, name, expected):
    return all(np.allclose(result["%s_global_%d" % (name, k)], expected[k], rtol=2e-5,
                           atol=2e-6) for result in results for k in range(2))


def assert_replayed(results, kvstore):
    for name in job.OPTIMIZERS:
        for rank, result in enumerate(results):
            for k in range(2):
                final = result["%s_global_%d" % (name, k)]
                assert np.isfinite(final).all(), (kvstore, name)
                initial = problem.initial_weights()[k]
                assert np.abs(final - initial).max() > 0, (kvstore, name, "did not train")
        if name == "sgld":
            continue
        if name == "nadam":
            assert any(matches(results, name, replay(results, name, orders))
                       for orders in itertools.product([(0, 1), (1, 0)], repeat=STEPS)), \
                (kvstore, name, "no order of the keys replays the run")
            continue
        expected = replay(results, name)
        for rank, result in enumerate(results):
            for k in range(2):
                np.testing.assert_allclose(result["%s_global_%d" % (name, k)], expected[k],
                                           rtol=2e-5, atol=2e-6,
                                           err_msg="%s rank %d key %d" % (name, rank, k))


def test_every_optimizer_trains_with_the_global_update_of_dist_sync(tmp_path):
    sync = run(tmp_path, "dist_sync")
    assert_replayed(sync, "dist_sync")
    od = run(tmp_path, "dist_odsgd")
    assert str(od[0]["type"]) == "dist_odsgd"
    assert_replayed(od, "dist_odsgd")
    for name in job.OPTIMIZERS:
        # a local step was taken: from step 1 on the workers' points differ (each predicts
        # with its own gradient), where dist_sync's workers all hold W_t
        points = [r["%s_points_0" % name][1:] for r in od]
        assert np.abs(points[0] - points[1]).max() > 0, name
        same = [r["%s_points_0" % name] for r in sync]
        np.testing.assert_array_equal(same[0], same[1])
