"""What the cluster jobs write, read back and compared: every worker's OUT/rank<r>.npz."""
import os

import numpy as np


def load_ranks(folder, workers=2):
    """[{name: array} of rank r's rank<r>.npz in `folder`] for r in range(workers)."""
    return [dict(np.load(os.path.join(str(folder), "rank%d.npz" % r))) for r in range(workers)]


def assert_same_weights(runs, references):
    """Every rank's arrays of `runs` equal those of `references`, bit for bit, under the same
    names."""
    for rank, (run, reference) in enumerate(zip(runs, references)):
        assert sorted(run) == sorted(reference)
        for name in reference:
            np.testing.assert_array_equal(run[name], reference[name],
                                          err_msg="rank %d, %s" % (rank, name))
