"""Arrays in MXNet's MKL-DNN layout, made writable by the library operators.

MXNet's CPU wheel (built with MKL-DNN) lets an inference-mode forward of a convolution
reorder the weight array itself into an MKL-DNN memory layout, so that later inference
calls need no reorder (mkldnn_convolution.cc: `MKLDNNDataReorderAsync`); the next
training-mode forward reorders it back, asynchronously. MXNet's extension-library
dispatcher (c_api.cc, `CustomFComputeDispatcher`) reorders *inputs* in that layout into a
temporary copy, but an *output* in that layout fails inside the engine with "We can't
generate TBlob for MKLDNN data" - unless the engine has dropped the layout first. It does
that for an output that is not also an input of the call (request kWriteTo): when it runs
the operator, before the dispatcher (imperative_utils.h `PushFComputeEx` calls
`InvalidateOutputs`, mkldnn_base-inl.h, which forgets the array's MKL-DNN memory
descriptor without reordering: the operator overwrites every element). An output that is
also an input (kWriteInplace) keeps its layout and fails.

So the local updates, which pass the weights as outputs only for every lam (the old weights
w_t, which only the compensation term reads, come from the caller's flat copy of them,
`local_flat`; odsgd.native.ops), need nothing from this module: the layout is dropped in the
engine's order, when the operator runs, so no reorder queued before or after the call can
make it fail, and the caller waits for nothing. Nor does gather_, which only reads its
arrays: the dispatcher copies an input in an MKL-DNN layout into the default layout inside
the engine (`Reorder2Default`, into a new array), which is how that flat copy is first made.
The one call whose written arrays are inputs too, scatter_ (which takes them as inputs for
their shapes), puts them into the default layout first, with `to_default_layout` below.

MXNet 1.9 has no Python call for that, but its C API `MXNDArrayGetData` does it: for an
array in an MKL-DNN layout it pushes `Reorder2DefaultAsync` and waits for it, leaving the
same NDArray (same memory, same engine variable) in the default layout; for any other array
it only returns the data pointer. Waiting for the array's pending writes first
(`MXNDArrayWaitToRead`) makes that check also see a reorder that is queued but has not run
yet. That wait is for the array's last writer, and it holds up the caller's thread
meanwhile. An inference forward that is
still queued when the operator is pushed does no harm: it queues its reorder when it runs,
behind the operator, and MXNet's reorder skips an array that was written after it was
queued. What is left is a window of microseconds: an inference forward that starts running
on the engine between this check and the push of the operator. Then the operator fails
inside the engine, with the message above, on this array.

A failure recorded on an array by an earlier asynchronous operator is raised here, in the
caller's thread, by the wait. (Where no wait is made, as in the local updates, the engine
passes such a failure on to the operator's outputs and it is raised at the next wait on any
of them or on what was computed from them.)
"""
import ctypes

_mkldnn = None      # MXNet build has MKL-DNN (None: not asked yet)
_calls = None       # (MXNDArrayWaitToRead, MXNDArrayGetData, check_call, pointer holder)


def _mkldnn_build():
    global _mkldnn, _calls
    if _mkldnn is None:
        import mxnet as mx
        from mxnet.base import _LIB, check_call
        _calls = (_LIB.MXNDArrayWaitToRead, _LIB.MXNDArrayGetData, check_call,
                  ctypes.c_void_p())
        _mkldnn = bool(mx.runtime.Features().is_enabled("MKLDNN"))
    return _mkldnn


def to_default_layout(arrays, context):
    """Puts every array of `arrays` (NDArrays of one `context`) that MXNet holds in an MKL-DNN
    layout back into the default layout, in place; a no-op on GPU contexts and on MXNet
    builds without MKL-DNN. Two C calls per array, no copy unless an array was reordered.

    Raises MXNetError when an earlier operator that wrote one of the arrays failed."""
    if context.device_type != "cpu" or not _mkldnn_build():
        return
    wait_to_read, get_data, check_call, pointer = _calls
    holder = ctypes.byref(pointer)
    for array in arrays:
        handle = array.handle
        check_call(wait_to_read(handle))
        check_call(get_data(handle, holder))
