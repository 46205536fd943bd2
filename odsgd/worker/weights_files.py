"""Weights files of checkpoints: written whole or not at all, and known by their CRC-32."""
import os
import tempfile
import zlib

import mxnet as mx


def save_weights_atomically(path, arrays):
    """mx.nd.save through a temporary file of this call's own, renamed over `path`: a save
    cut short leaves the file before it whole (mx.nd.save writes in place)."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                         prefix=os.path.basename(path) + ".", suffix=".tmp")
    os.close(handle)
    try:
        mx.nd.save(temporary, arrays)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def file_crc32(path):
    """CRC-32 of a file's bytes, read in chunks."""
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc
