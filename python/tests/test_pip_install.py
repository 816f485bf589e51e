"""`pip install ./python` with Debian's pip, setuptools and wheel only (no index).

Into a venv that sees Debian's packages (numpy, torch, pip), as
docs/python.md says; setup.py builds the package's CMake target in this build tree
(RDMAPS_CMAKE_BUILD_DIR: a configured tree is reused as it is, so the test
costs no rebuild). Then a fresh interpreter of the venv, without the build
tree on its path, imports rdmaps from the venv and runs a small local
cluster; and the source folder is left as it was.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BUILD_DIR

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/

USE_INSTALLED = textwrap.dedent("""
    import os, sys
    import numpy as np
    import rdmaps
    assert rdmaps.__file__.startswith(sys.prefix), (rdmaps.__file__, sys.prefix)
    here = os.path.dirname(rdmaps.__file__)
    names = set(os.listdir(here))
    assert {"__init__.py", "__init__.pyi", "_rdmaps.pyi", "py.typed", "torch.py"} <= names, names
    assert any(n.startswith("_rdmaps") and n.endswith(".so") for n in names), names
    table = rdmaps.Table(0, "w", rows=100, dim=8, init=rdmaps.Initializer("constant", value=1.0),
                         optimizer=rdmaps.Optimizer("sgd", lr=1.0))
    with rdmaps.local_cluster([table], servers=2, workers=1) as cluster, \\
            cluster.connect() as client:
        client.push("w", slice(0, 100), np.full((100, 8), 0.25, np.float32))
        out = client.pull("w", slice(0, 100))
        assert (out == 0.75).all(), out
        client.clock()
    print("installed rdmaps", rdmaps.__version__, "works", flush=True)
""")


def listing(top):
    out = set()
    for root, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out.update(os.path.relpath(os.path.join(root, f), top) for f in files)
    return out


@pytest.mark.skipif(not BUILD_DIR, reason="needs RDMAPS_BUILD_DIR (run by ctest)")
def test_pip_install_into_a_venv_and_run_a_local_cluster(tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.fail("Debian's pip is missing: apt-get install python3-pip python3-venv "
                    "python3-setuptools python3-wheel (scripts/dev.sh deps)")
    venv = tmp_path / "venv"
    # --without-pip: the venv runs Debian's pip from the system site (and
    # skips ensurepip's 20 s); pip installs into the venv it runs in.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    before = listing(SOURCE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(RDMAPS_CMAKE_BUILD_DIR=BUILD_DIR, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONDONTWRITEBYTECODE="1")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-build-isolation", "--no-index", SOURCE],
        capture_output=True, text=True, env=env, timeout=240)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    assert "Successfully installed rdmaps" in install.stdout, install.stdout[-2000:]
    assert listing(SOURCE) == before, sorted(listing(SOURCE) ^ before)

    run = subprocess.run([python, "-c", USE_INSTALLED], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.startswith("installed rdmaps "), run.stdout
