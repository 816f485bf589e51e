"""Builds the rdmaps Python package with the project's CMake tree.

The extension rdmaps._rdmaps is built by CMake (target rdmaps_python) for the
interpreter running this script, from the repository this folder is in, with
only the library and the package enabled; the result in <build>/python/rdmaps
is what gets installed. Environment:
  RDMAPS_CMAKE_BUILD_DIR  build there (default: a build-pip folder beside this file),
                          e.g. an existing build tree to reuse its objects
  RDMAPS_CMAKE_ARGS       extra cmake arguments (space-separated)
  RDMAPS_JOBS             parallel build jobs (default: the number of cores)
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "include", "rdmaps", "version.h")) as f:
        for line in f:
            if line.startswith("#define RDMAPS_VERSION_STRING"):
                return line.split('"')[1]
    return "0.0.0"


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("RDMAPS_CMAKE_BUILD_DIR", os.path.join(HERE, "build-pip"))
        args = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                "-DRDMAPS_BUILD_PYTHON=ON", "-DRDMAPS_BUILD_TESTS=OFF",
                "-DRDMAPS_BUILD_PERF=OFF", "-DRDMAPS_BUILD_TOOLS=OFF",
                "-DPython3_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        args += os.environ.get("RDMAPS_CMAKE_ARGS", "").split()
        if os.path.exists(os.path.join(build, "CMakeCache.txt")):
            args = [a for a in args if not a.startswith("-G")]
        subprocess.check_call(args)
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
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
