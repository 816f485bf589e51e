"""Builds the rdmaps Python package with the project's CMake tree.

The extension rdmaps._rdmaps is built by CMake (target rdmaps_python) for the
interpreter running this script, from the repository this folder is in, with
only the library and the package enabled; the result in <build>/python/rdmaps
is what gets installed. Environment:
  RDMAPS_CMAKE_BUILD_DIR  build there (default: a build-pip folder beside this file).
                          A tree configured already (scripts/dev.sh build) is built
                          as it is configured, only the package's target: its
                          Python3_EXECUTABLE must be this interpreter (or the one
                          a venv of it runs)
  RDMAPS_CMAKE_ARGS       extra cmake arguments (space-separated); given, they
                          reconfigure an existing tree with them
  RDMAPS_JOBS             parallel build jobs (default: the number of cores)
setuptools' own build files go into that build folder too, so that an
install leaves this source folder as it was.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get("RDMAPS_CMAKE_BUILD_DIR", os.path.join(HERE, "build-pip")))
SETUPTOOLS_DIR = os.path.join(BUILD, "setuptools")
os.makedirs(SETUPTOOLS_DIR, exist_ok=True)


def version():
    with open(os.path.join(ROOT, "include", "rdmaps", "version.h")) as f:
        for line in f:
            if line.startswith("#define RDMAPS_VERSION_STRING"):
                return line.split('"')[1]
    return "0.0.0"


def cached_python(build):
    """Python3_EXECUTABLE of the configured tree `build`, or None."""
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("Python3_EXECUTABLE:"):
                return line.split("=", 1)[1].strip()
    return None


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = BUILD
        extra = os.environ.get("RDMAPS_CMAKE_ARGS", "").split()
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                    "-DRDMAPS_BUILD_PYTHON=ON", "-DRDMAPS_BUILD_TESTS=OFF",
                    "-DRDMAPS_BUILD_PERF=OFF", "-DRDMAPS_BUILD_TOOLS=OFF",
                    "-DPython3_EXECUTABLE=" + sys.executable]
            if shutil.which("ninja"):
                args += ["-G", "Ninja"]
            if shutil.which("ccache"):
                args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            subprocess.check_call(args + extra)
        else:
            if extra:
                subprocess.check_call(["cmake", "-S", ROOT, "-B", build] + extra)
            # The extension is built for the tree's interpreter; a venv's
            # python is a link to the interpreter it was made from.
            want = cached_python(build)
            if want and os.path.realpath(want) != os.path.realpath(sys.executable):
                sys.exit(f"rdmaps setup.py: {build} builds for {want}, this is {sys.executable}; "
                         f"use that interpreter, or another RDMAPS_CMAKE_BUILD_DIR")
        subprocess.check_call(["cmake", "--build", build, "--target", "rdmaps_python", "-j",
                               os.environ.get("RDMAPS_JOBS", str(os.cpu_count() or 1))])
        built = os.path.join(build, "python", "rdmaps")
        dest = os.path.join(self.build_lib, "rdmaps")
        os.makedirs(dest, exist_ok=True)
        for name in os.listdir(built):
            if name.startswith("_rdmaps") and name.endswith(".so"):
                shutil.copy2(os.path.join(built, name), self.get_ext_fullpath(ext.name))


setup(
    name="rdmaps",
    version=version(),
    description="Parameter server over one-sided RDMA: Python and PyTorch bindings",
    packages=["rdmaps"],
    package_data={"rdmaps": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("rdmaps._rdmaps", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    # Keep the source folder clean: setuptools' build files and egg-info
    # go beside the CMake build.
    options={"build": {"build_base": SETUPTOOLS_DIR}, "egg_info": {"egg_base": SETUPTOOLS_DIR}},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
