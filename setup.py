"""odsgd: One-step Delay SGD (OD-SGD) for Apache MXNet 1.9, as a KVStore plugin.

The native operators in kvstore_ext/ are compiled against the headers of the MXNet wheel
that is installed in the same environment, so `make install` builds them after MXNet is in
place (`python -m odsgd.native build`); a plain `pip install` without them still works and
falls back to NDArray ops.
"""
import os
import sys
import sysconfig

from setuptools import find_packages, setup

# odsgd-autoload.pth goes into site-packages, so that in this environment kvstore type
# 'dist_odsgd' is OD-SGD even where the training script does not import odsgd (odsgd_autoload.py).
SITE_PACKAGES = os.path.relpath(sysconfig.get_path("purelib"), sys.prefix)

setup(
    name="odsgd",
    version="0.1.0",
    description="One-step Delay SGD (OD-SGD) KVStore plugin for Apache MXNet",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["odsgd", "odsgd.*"]),
    py_modules=["odsgd_autoload"],
    data_files=[(SITE_PACKAGES, ["odsgd-autoload.pth"])],
    package_data={"odsgd": ["lib/*.so", "lib/*.json"]},
    install_requires=["mxnet>=1.9,<2", "numpy<1.24"],
    extras_require={"models": ["gluoncv"], "test": ["pytest", "pytest-timeout", "scikit-learn"]},
    entry_points={
        "console_scripts": [
            "odsgd-launch=odsgd.cluster.launch:main",
            "odsgd-bench=odsgd.bench:main",
        ]
    },
)
