"""The command line `python -m odsgd.native build|check-cuda|check-gpu` (see __main__.py).

It sits above the two modules it dispatches to: build (build, check-cuda) and gpu_check
(check-gpu, which builds its driver with build.build_gpu_check_driver). Like them, it imports
no mxnet at module level: check-gpu runs where MXNet is not installed.
"""
import argparse
import sys

from .build import NativeBuildError, build, check_cuda
from .gpu_check import check_gpu


def main(argv=None):
    """`python -m odsgd.native build|check-cuda|check-gpu ...`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m odsgd.native",
                                     description="Build the fused OD-SGD operators "
                                                 "(kvstore_ext/) against the installed MXNet.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="compile odsgd/lib/libodsgd_ext.so")
    build_parser.add_argument("--cuda", choices=("auto", "on", "off"), default="auto",
                              help="compile the CUDA kernels: auto (when nvcc is on PATH and "
                                   "MXNet is a CUDA build), on, off (default: auto)")
    build_parser.add_argument("--quiet", action="store_true", help="print errors only")
    check_parser = commands.add_parser("check-cuda", help="compile and link the CUDA kernels "
                                       "in a scratch folder (no GPU needed, installs nothing)")
    check_parser.add_argument("--nvcc", help="nvcc to use (default: nvcc on PATH)")
    check_parser.add_argument("--mxnet-include", metavar="DIR",
                              help="MXNet include folder to build against (default: the "
                                   "installed MXNet's)")
    check_parser.add_argument("--quiet", action="store_true", help="print errors only")
    gpu_parser = commands.add_parser("check-gpu", help="run the CUDA kernels on this machine's "
                                     "GPU against a NumPy reference and time them (no MXNet "
                                     "needed); one line and exit 0 without a GPU or nvcc")
    gpu_parser.add_argument("--nvcc", help="nvcc to use (default: .venv/cuda's, else nvcc on "
                                           "PATH, else /usr/local/cuda/bin/nvcc)")
    gpu_parser.add_argument("--repeats", type=int, default=20,
                            help="timed calls per kernel (default 20)")
    gpu_parser.add_argument("--quiet", action="store_true",
                            help="no compiler commands, only the results")
    args = parser.parse_args(argv)
    if args.command == "check-gpu":
        return check_gpu(nvcc=args.nvcc, repeats=args.repeats, verbose=not args.quiet)
    try:
        if args.command == "build":
            build(cuda=args.cuda, verbose=not args.quiet)
        else:
            check_cuda(nvcc=args.nvcc, include_dir=args.mxnet_include, verbose=not args.quiet)
    except NativeBuildError as err:
        print("odsgd.native: %s failed: %s" % (args.command, err), file=sys.stderr)
        return 1
    return 0
