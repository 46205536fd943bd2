"""`python -m odsgd.native build|check-cuda|check-gpu`: compiles the fused operators, checks
that their CUDA kernels compile, runs them on a GPU (see odsgd/native/build.py, gpu_check.py)."""
import sys

from odsgd.native.build import main

sys.exit(main())
