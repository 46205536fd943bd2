"""`python -m odsgd.native build|check-cuda|check-gpu`: compiles the fused operators, checks
that their CUDA kernels compile, runs them on a GPU (see odsgd/native/cli.py)."""
import sys

from odsgd.native.cli import main

sys.exit(main())
