"""Builds the C ABI (crates/prepare-c) with cargo and ships it inside the `prepare` package.

The Python code loads the library with ctypes, so the wheel does not depend on the Python
version: it is tagged py3-none-<platform>. PREPARE_WHEEL_PROFILE=debug builds the library
without optimisation (CI, where only the error paths run); the default is release.
"""

import os

from setuptools import setup
from setuptools_rust import Binding, RustExtension, Strip

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools older than 70.1
    from wheel.bdist_wheel import bdist_wheel


class AnyPythonWheel(bdist_wheel):
    """A wheel for every Python 3 on this platform: the library is not a Python extension."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


profile = os.environ.get("PREPARE_WHEEL_PROFILE", "release")
if profile not in ("release", "debug"):
    raise SystemExit(f"PREPARE_WHEEL_PROFILE={profile!r}: use release or debug")

setup(
    rust_extensions=[
        RustExtension(
            "prepare._prepare_c",
            path=os.path.join("..", "crates", "prepare-c", "Cargo.toml"),
            binding=Binding.NoBinding,
            args=["--locked"],
            debug=profile == "debug",
            strip=Strip.Debug if profile == "debug" else Strip.No,
            py_limited_api=False,
        )
    ],
    cmdclass={"bdist_wheel": AnyPythonWheel},
)
