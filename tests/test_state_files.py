"""Optimizer-state files that several processes write at once (odsgd/common/state_files.py): workers
that save to one path, many times, never fail and never overwrite each other's states; each
loads its own back."""
import os
import pickle
import threading

import numpy as np

from cluster import run_job
from odsgd.common import state_files


def test_two_workers_saving_to_one_path_keep_their_own_states(tmp_path):
    output = run_job("shared_states_job.py", ["--out", tmp_path, "--saves", 30], workers=2,
                     servers=1, timeout=180)
    assert output.count("saved 30 times to one path") == 2, output[-3000:]
    saved = {r: dict(np.load(tmp_path / ("rank%d.npz" % r))) for r in (0, 1)}
    loaded = {r: dict(np.load(tmp_path / ("loaded%d.npz" % r))) for r in (0, 1)}
    # the workers' local momenta differ (the test could see one overwrite the other)
    assert any(not np.array_equal(saved[0][k], saved[1][k]) for k in saved[0])
    with open(tmp_path / "shared.states", "rb") as f:
        entries = pickle.load(f)["workers"]
    assert sorted(entries) == [0, 1]
    for rank in (0, 1):
        assert entries[rank]["rank"] == rank
        on_file = {"key%d" % key: mom for key, (mom, _var)
                   in entries[rank]["local"]["states"].items()}
        for key, mom in saved[rank].items():
            np.testing.assert_array_equal(on_file[key], mom)
            np.testing.assert_array_equal(loaded[rank][key], mom)   # each loads its own
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert leftovers == []


def test_concurrent_writers_of_one_file_all_land(tmp_path):
    """8 threads x 25 saves of different ranks into one path: no error, every rank's last
    save is in the file, and a reader always sees a whole file."""
    path = str(tmp_path / "one.states")
    errors, seen = [], []

    def writer(rank):
        try:
            for n in range(25):
                state_files.save_worker_states(path, {"rank": rank, "num_workers": 8, "n": n})
                seen.append(state_files.load_worker_states(path, rank)["n"])
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(rank,)) for rank in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with open(path, "rb") as f:
        entries = pickle.load(f)["workers"]
    assert {rank: entry["n"] for rank, entry in entries.items()} == {r: 24 for r in range(8)}
    assert len(seen) == 200
    assert [p for p in os.listdir(tmp_path) if p != "one.states"] == []


def test_a_job_of_another_shape_replaces_the_entries(tmp_path):
    path = str(tmp_path / "s.states")
    state_files.save_worker_states(path, {"rank": 1, "num_workers": 2, "n": 1})
    state_files.save_worker_states(path, {"rank": 0, "num_workers": 1, "n": 2})
    with open(path, "rb") as f:
        assert sorted(pickle.load(f)["workers"]) == [0]
