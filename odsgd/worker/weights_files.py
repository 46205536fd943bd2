"""Files of checkpoints: their names, weights files written whole or not at all, and known by
their CRC-32."""
import zlib

import mxnet as mx

from ..common.state_files import replace_atomically


def checkpoint_files(prefix, rank):
    """(weights file, states file) of worker `rank`: the names both kinds of checkpoint use
    (odsgd/worker/checkpoint.py, odsgd/worker/mxnet_store_checkpoint.py)."""
    return "%s-worker%d.params" % (prefix, rank), "%s-worker%d.states" % (prefix, rank)


def save_weights_atomically(path, arrays):
    """mx.nd.save through a temporary file of this call's own, renamed over `path`: a save
    cut short leaves the file before it whole (mx.nd.save writes in place)."""
    replace_atomically(path, lambda temporary: mx.nd.save(temporary, arrays))


def file_crc32(path):
    """CRC-32 of a file's bytes, read in chunks."""
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc
