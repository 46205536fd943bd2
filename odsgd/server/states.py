"""The servers' optimizer states on disk, whole per parameter, whatever the key layout.

The servers keep the global optimizer's state of a parameter in *pieces*: a piece is the part
of the parameter one server key carries there (the whole parameter, a part of it cut by
ODSGD_PART_ELEMENTS, or the slice of it MXNet gives that server when it slices a big key), and
is named by (optimizer index, first element). Which pieces exist depends on the layout (the
part size, the fusion size, MXNet's big-array bound, the number of servers). To save, each
server writes its pieces (`server_file`) and rank 0 joins every server's file into one file
of whole parameters (`join`), with the layout recorded beside them. To load, every server reads
that file and cuts from it the pieces its keys need now (`piece`), so a job resumes with
another part size, fusion size or number of servers and the same optimizer state.

A state is what MXNet's optimizer keeps for one array: None, an array, or tuples of those (SGD's
momentum, Adam's mean and variance, a multi-precision weight and its state). On the servers
every array is flat, so each array of a piece's state has the piece's elements, in order:
pieces join by concatenation and are cut by slicing. A state that holds anything else (a
number, a 2-D array) is kept as it is where it need not be joined or cut, and is a ValueError
where it must be.

Imports no MXNet: the servers use it while `import mxnet` is still running there
(server_updater.py), and its arrays are NumPy's.
"""
import pickle

import numpy as np

#: version of the files written here
FORMAT = 2
#: how a state's arrays look in the files: ("ndarray", numpy array)
ARRAY = "ndarray"


def _is_array(leaf):
    return isinstance(leaf, tuple) and len(leaf) == 2 and leaf[0] == ARRAY


def _map(function, states):
    """function(leaves) over the same leaf of each of `states` (same nesting), rebuilt."""
    first = states[0]
    if first is None or _is_array(first):
        return function(states)
    if isinstance(first, (tuple, list)) and all(isinstance(s, type(first)) and
                                                len(s) == len(first) for s in states):
        return type(first)(_map(function, [s[i] for s in states]) for i in range(len(first)))
    return function(states)


def _joined(sizes):
    def join(leaves):
        if all(leaf is None for leaf in leaves):
            return None
        if not all(_is_array(leaf) and leaf[1].ndim == 1 and len(leaf[1]) == n
                   for leaf, n in zip(leaves, sizes)):
            raise ValueError("a state that is not one flat array per piece (%r)"
                             % (type(leaves[0]).__name__,))
        return (ARRAY, np.concatenate([leaf[1] for leaf in leaves]))
    return join


def _cut(offset, size, whole):
    def cut(leaves):
        leaf = leaves[0]
        if leaf is None:
            return None
        if not (_is_array(leaf) and leaf[1].ndim == 1 and len(leaf[1]) == whole):
            raise ValueError("a state that is not one flat array (%r)" % (type(leaf).__name__,))
        return (ARRAY, leaf[1][offset:offset + size].copy())
    return cut


def _tile(pieces, begin, size):
    """The pieces [(first, size, state)] that cover elements [begin, begin + size) of a
    parameter, each with the range of it that lies there; ValueError where they leave a gap."""
    covering, at = [], begin
    for first, n, state in sorted(pieces, key=lambda p: p[0]):
        if first + n <= at or first >= begin + size:
            continue
        if first > at:
            break
        covering.append((first, n, state, at - first, min(first + n, begin + size) - at))
        at = min(first + n, begin + size)
    if at < begin + size:
        raise ValueError("the saved states cover elements up to %d only" % at)
    return covering


def piece(pieces, begin, size):
    """The state of elements [begin, begin + size) of a parameter whose saved state is
    `pieces`, [(first element, size, state)] (NumPy leaves)."""
    for first, n, state in pieces:
        if first == begin and n == size:
            return state
    covering = _tile(pieces, begin, size)
    cuts = [_map(_cut(offset, length, n), [state])
            for _, n, state, offset, length in covering]
    if len(cuts) == 1:
        return cuts[0]
    return _map(_joined([length for *_, length in covering]), cuts)


def join_pieces(pieces):
    """One parameter's pieces, [(first, size, state)], joined into [(0, total, whole state)]
    where they cover it from element 0 without a gap and their states join; as they are
    (sorted) where a state cannot be joined. ValueError for a gap or an overlap."""
    pieces = sorted(pieces, key=lambda p: p[0])
    at = 0
    for first, n, _ in pieces:
        if first != at:
            raise ValueError("pieces of the state %s at element %d"
                             % ("overlap" if first < at else "leave a gap", at))
        at += n
    if len(pieces) == 1:
        return pieces
    try:
        whole = _map(_joined([n for _, n, _ in pieces]), [state for *_, state in pieces])
    except ValueError:
        return pieces
    return [(0, at, whole)]


def merge_counts(files):
    """The update counts of the servers' files, per device and index: the largest (each
    server counts the rounds of the parameters it holds, once per round)."""
    counts = {}
    for saved in files:
        for device, per_index in saved["index_update_counts"].items():
            merged = counts.setdefault(device, {})
            for index, count in per_index.items():
                merged[index] = max(merged.get(index, count), count)
    return counts


def join(files, layout):
    """The whole-parameter states file (a dict) from every server's `server_file` dict."""
    pieces = {}
    for saved in files:
        for index, own in saved["pieces"].items():
            pieces.setdefault(index, []).extend(own)
    steps = {saved["global_step"] for saved in files}
    if len(steps) > 1:
        raise ValueError("the servers' states files are of different steps (%s): a save was "
                         "cut short" % ", ".join(str(s) for s in sorted(steps)))
    return {"format": FORMAT, "global_step": steps.pop(), "layout": dict(layout),
            "parameters": {index: join_pieces(own) for index, own in pieces.items()},
            "num_update": max(saved["num_update"] for saved in files),
            "index_update_counts": merge_counts(files)}


def server_file(pieces, num_update, counts, server_rank, global_step):
    """One server's states file (a dict): `pieces`, {index: [(first, size, state)]}."""
    return {"format": FORMAT, "server_rank": server_rank, "global_step": global_step,
            "pieces": pieces, "num_update": num_update, "index_update_counts": counts}


def read(path, what):
    """A states file of this module's format; ValueError naming `what` otherwise."""
    with open(path, "rb") as f:
        saved = pickle.load(f)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError("%s %s has format %r; this version reads format %d (save the "
                         "checkpoint again with this version)"
                         % (what, path, saved.get("format") if isinstance(saved, dict)
                            else None, FORMAT))
    return saved
