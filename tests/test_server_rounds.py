"""The servers' rounds arriving out of step order (odsgd/worker/exchange.py sends each key's round as
soon as that key allows) still give dist_sync's global update, with a schedule boundary between
them: held to MXNet's own SGD applied in dist_sync's order, parameter by parameter.

The servers' ServerOptimizer runs here in-process, driven by MXNet's own Updater as a server
drives it, with the packings and round steps the workers send (server_updater.py)."""
import pickle

import mxnet as mx
import numpy as np
import pytest

from odsgd.server import updater as servers

#: parameter index -> number of elements
SIZES = {0: 3, 1: 5, 2: 8}
#: server key -> its packing: key 101 carries parameters 0 and 1 whole (a fused group); keys
#: 102 and 103 carry the two halves of parameter 2 (a group cut into parts)
PACKINGS = {101: [(0, 0, 3, -1), (1, 3, 5, -1)],
            102: [(2, 0, 4, 0)],
            103: [(2, 0, 4, 4)]}
STEPS = 7
#: the order in which the rounds (key, step) reach the server: each key in its own step order
#: (a worker sends a key's round t+1 after its round t is applied), the keys up to two steps
#: apart, across the schedule's boundary (the rate drops after update 4)
ARRIVALS = [(101, 0), (101, 1), (102, 0), (101, 2), (103, 0), (102, 1), (102, 2), (103, 1),
            (101, 3), (103, 2), (102, 3), (102, 4), (101, 4), (103, 3), (101, 5), (103, 4),
            (102, 5), (103, 5), (101, 6), (102, 6), (103, 6)]


def make_optimizer(begin_num_update):
    schedule = mx.lr_scheduler.MultiFactorScheduler(step=[begin_num_update + 4], factor=0.1,
                                                    base_lr=0.1)
    optimizer = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5,
                                 lr_scheduler=schedule, begin_num_update=begin_num_update)
    optimizer.set_lr_mult({1: 0.5})
    optimizer.set_wd_mult({0: 0.0})
    return optimizer


def gradient(index, step):
    return np.random.RandomState(1000 * index + step).randn(SIZES[index]).astype(np.float32)


def initial(index):
    return np.random.RandomState(7 + index).randn(SIZES[index]).astype(np.float32)


def dist_sync_weights(optimizer, indices=tuple(SIZES)):
    """`optimizer` as dist_sync's servers apply it: every parameter its own key, every key's
    round t before any round t+1."""
    updater = mx.optimizer.get_updater(optimizer)
    weights = {i: mx.nd.array(initial(i)) for i in indices}
    for step in range(STEPS):
        for index in indices:
            updater(index, mx.nd.array(gradient(index, step)), weights[index])
    return {i: w.asnumpy() for i, w in weights.items()}


def key_arrays(packings):
    """The servers' stored arrays and the rounds' gradients of each key, from the packings."""
    def piece(values, entry):
        index, _, size, part_of = entry
        start = max(part_of, 0)
        return values(index)[start:start + size]
    weights = {key: mx.nd.array(np.concatenate([piece(initial, e) for e in packing]))
               for key, packing in packings.items()}

    def grad(key, step):
        return mx.nd.array(np.concatenate([piece(lambda i: gradient(i, step), e)
                                           for e in packings[key]]))
    return weights, grad


def parameters_of(weights, packings):
    """Each parameter's weights, put together from the keys' arrays."""
    out = {}
    for key, packing in packings.items():
        stored = weights[key].asnumpy()
        for index, offset, size, part_of in packing:
            start = max(part_of, 0)
            out.setdefault(index, np.zeros(SIZES[index], np.float32))
            out[index][start:start + size] = stored[offset:offset + size]
    return out


@pytest.fixture
def server(monkeypatch):
    """A fresh server process's module state."""
    for name in ("_GROUPS", "_ROUND_STEPS", "_SPLIT_COUNTS", "_PROBING", "_PROBED",
                 "_LOCAL_PARTS"):
        monkeypatch.setattr(servers, name, {})
    monkeypatch.setattr(servers, "_SERVER", [0, 1])
    monkeypatch.setattr(servers, "_CONTROL_KEYS", set())
    monkeypatch.setattr(servers, "_RUNNING", None)
    return servers


def run_server(server, optimizer, packings=PACKINGS, arrivals=ARRIVALS, tell_steps=True):
    """The rounds of `arrivals` through a ServerOptimizer of `optimizer` as a server unpickles
    it, with the keys of `packings`."""
    running = pickle.loads(pickle.dumps(server.ServerOptimizer(optimizer)))
    pickle.loads(server.group_packings_command(packings).encode("ascii"))
    if tell_steps:
        pickle.loads(server.round_steps_command({key: 0 for key in packings})
                     .encode("ascii"))
    updater = mx.optimizer.get_updater(running)
    weights, grad = key_arrays(packings)
    for key, step in arrivals:
        updater(key, grad(key, step), weights[key])
    return parameters_of(weights, packings)


@pytest.mark.parametrize("begin_num_update", [0, 7])
def test_rounds_out_of_order_across_a_schedule_boundary_are_dist_syncs(server,
                                                                       begin_num_update):
    expected = dist_sync_weights(make_optimizer(begin_num_update))
    got = run_server(server, make_optimizer(begin_num_update))
    for index in SIZES:
        np.testing.assert_allclose(got[index], expected[index], rtol=1e-6, atol=1e-7)


def test_the_order_matters_without_the_round_steps(server):
    """The same arrivals without the round steps told (each round at the optimizer's own
    count): the rates of the rounds near the boundary differ, so the check above can fail."""
    expected = dist_sync_weights(make_optimizer(0))
    got = run_server(server, make_optimizer(0), tell_steps=False)
    assert any(not np.allclose(got[i], expected[i], rtol=1e-6, atol=1e-7) for i in SIZES)


def test_arrivals_keep_each_keys_step_order():
    """The schedule of arrivals above is one a worker can produce."""
    for key in PACKINGS:
        assert [s for k, s in ARRIVALS if k == key] == list(range(STEPS))


def test_a_cut_parameter_counts_its_round_once_whatever_other_keys_steps(server):
    """Keys of separate calls drift apart in step (a key of a layer that sat out steps): the
    fused key 101 is at step 9 while parameter 2's parts are at step 0. Its second part must
    still count the round it shares with the first (the entry of a cut parameter is dropped
    when its last part arrived, not by another key's step)."""
    optimizer = make_optimizer(0)
    running = pickle.loads(pickle.dumps(server.ServerOptimizer(optimizer)))
    pickle.loads(server.group_packings_command(PACKINGS).encode("ascii"))
    pickle.loads(server.round_steps_command({101: 9, 102: 0, 103: 0}).encode("ascii"))
    updater = mx.optimizer.get_updater(running)
    weights, grad = key_arrays(PACKINGS)
    for key, step in [(102, 0), (101, 9), (103, 0)]:
        updater(key, grad(key, step), weights[key])
    assert running.optimizer._index_update_count[2] == 1
    assert server._SPLIT_COUNTS == {}
