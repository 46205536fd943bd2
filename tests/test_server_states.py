"""The servers' states files (odsgd/server/states.py): the pieces of every server join into
whole parameters, and any other layout's pieces are cut from them, equal to the states a
server of that layout would have kept; what cannot be mapped is a ValueError."""
import pickle

import mxnet as mx
import numpy as np
import pytest

from odsgd.server import states as server_states
from odsgd.server import updater as servers
from odsgd.server.updater import _mxnet_slice_begin

ARRAY = server_states.ARRAY


def momentum_and_variance(values):
    """A state as Adam keeps it, (mean, variance), NumPy leaves."""
    return ((ARRAY, values.copy()), (ARRAY, values * 2))


def pieces_of(values, bounds):
    return [(b, n, momentum_and_variance(values[b:b + n])) for b, n in bounds]


def assert_state(got, values):
    np.testing.assert_array_equal(got[0][1], values)
    np.testing.assert_array_equal(got[1][1], values * 2)


def server_file(rank, pieces, step=30, counts=None):
    return server_states.server_file(pieces, 31, {0: counts or {}}, rank, step)


def test_pieces_of_two_servers_join_whole_and_cut_into_another_layout():
    values = np.arange(10, dtype=np.float32)
    # parameter 7 cut in parts of 4, 3, 3 over two servers; parameter 8 whole on server 1
    files = [server_file(0, {7: pieces_of(values, [(0, 4), (7, 3)])}, counts={7: 31}),
             server_file(1, {7: pieces_of(values, [(4, 3)]),
                             8: [(0, 2, None)]}, counts={7: 31, 8: 12})]
    joined = server_states.join(files, {"ODSGD_PART_ELEMENTS": 4})
    assert joined["layout"] == {"ODSGD_PART_ELEMENTS": 4}
    assert joined["global_step"] == 30
    assert joined["index_update_counts"] == {0: {7: 31, 8: 12}}
    [(first, size, whole)] = joined["parameters"][7]
    assert (first, size) == (0, 10)
    assert_state(whole, values)
    assert joined["parameters"][8] == [(0, 2, None)]
    # parts of 8 (two of 5), and the whole array: cut from the joined state
    for begin, size in [(0, 5), (5, 5), (0, 10), (3, 4)]:
        assert_state(server_states.piece(joined["parameters"][7], begin, size),
                     values[begin:begin + size])


def test_pieces_that_cannot_be_joined_are_kept_and_still_cut():
    """A state that is a number (an optimizer of the user's own) joins nowhere; the same
    pieces load as they are, another layout is a ValueError."""
    pieces = [(0, 4, 0.5), (4, 6, 0.25)]
    assert server_states.join_pieces(pieces) == pieces
    assert server_states.piece(pieces, 4, 6) == 0.25
    with pytest.raises(ValueError, match="not one flat array"):
        server_states.piece(pieces, 0, 10)


def test_a_gap_is_refused():
    values = np.arange(10, dtype=np.float32)
    with pytest.raises(ValueError, match="leave a gap at element 4"):
        server_states.join_pieces(pieces_of(values, [(0, 4), (6, 4)]))
    with pytest.raises(ValueError, match="cover elements up to 4 only"):
        server_states.piece(pieces_of(values, [(0, 4)]), 2, 4)


def test_files_of_different_steps_are_refused():
    files = [server_file(0, {}, step=30), server_file(1, {}, step=20)]
    with pytest.raises(ValueError, match="different steps .20, 30.: a save was cut short"):
        server_states.join(files, {})


@pytest.mark.parametrize("size,servers", [(1000001, 3), (2000000, 2), (7, 4)])
def test_mxnet_slices_of_a_big_key_tile_it(monkeypatch, size, servers):
    """The slices of a big key MXNet gives each server (EncodeDefaultKey's rounding) follow
    each other from 0 to the key's end: a server's piece of such a key is named by where its
    slice begins."""
    from odsgd.server import updater as server_updater
    begins = []
    for rank in range(servers):
        monkeypatch.setattr(server_updater, "_SERVER", [rank, servers])
        begins.append(_mxnet_slice_begin(size))
    ends = begins[1:] + [size]
    sizes = [int(np.floor(size / servers * (r + 1) + 0.5)) -
             int(np.floor(size / servers * r + 0.5)) for r in range(servers)]
    assert begins[0] == 0
    assert [e - b for b, e in zip(begins, ends)] == sizes


def second_of_two_servers(monkeypatch):
    """A ServerOptimizer as server 1 of 2 runs it (unpickled: the commands reach it), with
    no key groups registered yet."""
    for name, value in (("_GROUPS", {}), ("_SERVER", [1, 2]), ("_LOCAL_PARTS", {}),
                        ("_RUNNING", None)):
        monkeypatch.setattr(servers, name, value)
    return pickle.loads(pickle.dumps(servers.ServerOptimizer(
        mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)), 0))


def test_a_server_keeps_only_the_pieces_it_holds_of_a_load(monkeypatch, tmp_path):
    """The servers load a whole-parameter states file for the job's layout (its keys'
    packings registered before): each server cuts the pieces its keys put on it and keeps
    nothing else of the file, where every server used to keep all of it. Server 1 of 2, keys
    50000 and 50001 (parts of parameter 3) and 50002 (parameters 4 and 5 packed): MXNet puts
    key k on server (k * 9973) % 2."""
    running = second_of_two_servers(monkeypatch)
    values = np.arange(20, dtype=np.float32)
    packings = {50000: [(3, 0, 10, 0)], 50001: [(3, 0, 10, 10)],
                50002: [(4, 0, 6, -1), (5, 6, 4, -1)]}
    pickle.loads(servers.group_packings_command(packings).encode("ascii"))
    saved = server_states.join([server_file(0, {
        3: [(0, 20, (ARRAY, values.copy()))], 4: [(0, 6, (ARRAY, values[:6] * 3))],
        5: [(0, 4, (ARRAY, values[:4] * 5))]})], {})
    path = str(tmp_path / "states.servers")
    with open(path, "wb") as f:
        pickle.dump(saved, f)
    held = sorted(k for k in packings if (k * 9973) % 2 == 1)
    assert held == [50001]
    pickle.loads(servers.load_states_command(path, 30, list(packings)).encode("ascii"))
    assert running.loaded == {} and running.loaded_indices == {3, 4, 5}
    assert sorted(running.states) == [(3, 10)]
    np.testing.assert_array_equal(running.states[(3, 10)].asnumpy(), values[10:])


def test_a_parameter_no_key_holds_at_a_load_keeps_its_state(monkeypatch, tmp_path):
    """A parameter in the loaded file that no key of the layout holds at the load (a layer
    frozen then, trained later: its new key may land on any server) keeps its state on every
    server, cut at its first update; the states of parameters held by other servers go."""
    running = second_of_two_servers(monkeypatch)
    values = np.arange(12, dtype=np.float32)
    pickle.loads(servers.group_packings_command({50000: [(3, 0, 4, -1)]}).encode("ascii"))
    assert (50000 * 9973) % 2 == 0               # parameter 3 is server 0's
    saved = server_states.join([server_file(0, {
        3: [(0, 4, (ARRAY, values[:4].copy()))], 7: [(0, 12, (ARRAY, values.copy()))]})], {})
    path = str(tmp_path / "states.servers")
    with open(path, "wb") as f:
        pickle.dump(saved, f)
    pickle.loads(servers.load_states_command(path, 30, [50000]).encode("ascii"))
    assert sorted(running.loaded) == [7] and running.states == {}
    # parameter 7 trained again, fused on a key this server holds: its loaded momentum
    assert (50003 * 9973) % 2 == 1
    pickle.loads(servers.group_packings_command({50003: [(7, 0, 12, -1)]}).encode("ascii"))
    state = running._state(7, mx.nd.zeros((12,)))
    np.testing.assert_array_equal(state.asnumpy(), values)
    def fail(what):                               # a server ends its process there
        raise RuntimeError(what)
    monkeypatch.setattr(servers, "_fail", fail)
    with pytest.raises(RuntimeError, match="not one of them"):
        running._state(3, mx.nd.zeros((4,)))      # server 0's: dropped here
