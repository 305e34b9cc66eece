"""Shared test setup: ``tests/`` importable (``naive``, ``op_cases`` ...), one intra-op thread, and
the markers every test file uses (import them: ``from conftest import needs_gcc, needs_qemu``).

Markers:

* ``needs_gcc``        - skipped without a host ``gcc``;
* ``needs_arm_gcc``    - skipped without ``arm-none-eabi-gcc``;
* ``needs_qemu``       - skipped without ``arm-none-eabi-gcc`` and ``qemu-system-arm``;
* ``needs_cmsis_nn``   - skipped unless ``CMSIS_NN_PATH`` names a CMSIS-NN source tree (and gcc exists);
* ``needs_cmake``      - skipped without ``cmake`` and ``make``;
* ``@pytest.mark.slow`` - a test that takes more than ~10 s; it still runs in ``make test`` (CI), and
  ``pytest -m "not slow"`` leaves it out for a quick local run.

Order independence: ``make test`` runs the suite on two workers (pytest-xdist) in a random order
(pytest-randomly; the seed is printed at the end, ``--randomly-seed=N`` repeats the order).  Every test starts from
the same global state: :func:`pytest_runtest_setup` seeds ``torch``, ``random`` and ``numpy``
before any of the test's fixtures is built (module-scoped fixtures included), so a test that draws
from the global generators gets the same numbers whatever ran before it, on whichever worker.
Tests write only below ``tmp_path`` / ``tmp_path_factory`` (one base directory per worker).
"""
import os
import random
import shutil
import sys
import tempfile

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

# Small models run faster on one intra-op thread than on two contended ones; the QEMU and C
# builds the suite starts use the other core.
import torch  # noqa: E402

torch.set_num_threads(1)

GCC = shutil.which("gcc")
ARM_GCC = shutil.which("arm-none-eabi-gcc")
QEMU = shutil.which("qemu-system-arm")
CMSIS_NN_PATH = os.environ.get("CMSIS_NN_PATH") or None

needs_gcc = pytest.mark.skipif(GCC is None, reason="needs gcc")
needs_arm_gcc = pytest.mark.skipif(ARM_GCC is None, reason="needs arm-none-eabi-gcc")
needs_qemu = pytest.mark.skipif(ARM_GCC is None or QEMU is None, reason="needs arm-none-eabi-gcc and qemu-system-arm")
needs_cmsis_nn = pytest.mark.skipif(not CMSIS_NN_PATH or GCC is None,
                                    reason="set CMSIS_NN_PATH to a CMSIS-NN source tree (and install gcc)")
# the host builds of generated C in the tests (the zoo's, the idioms', the generated add / pool
# models): -O0 and corten_gen.h's blocks as plain `static inline` (on the cores they are always
# inlined, so the compiler specialises each for its layer): the same C, compiled 5-15x faster
# (ds-cnn's M4 path: 7.9 s -> 0.5 s of gcc).  The layer tests of test_generated_kernels build it as
# the cores do (-O2, always inlined) on the host, and the QEMU runs build at -O2 for the cores.
HOST_CFLAGS = ("-O0", "-DCG_INLINE=static inline")
# the zoo's 224x224 models: tests whose subject does not depend on the model's size leave them out
# (each costs ~10 s a compile); the tests of every zoo model on the host and QEMU keep them
ZOO_224 = ("mv2", "mv3-small")

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("make") is None,
                                 reason="needs cmake and make")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Seed the global generators before the item's fixtures are set up (tryfirst: ahead of
    pytest's own setup, which builds the fixtures).  pytest-randomly, when installed, reseeds
    ``random`` and ``numpy`` with its run seed afterwards; ``torch`` is ours alone."""
    torch.manual_seed(0)
    random.seed(0)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return
    numpy.random.seed(0)


def pytest_collection_modifyitems(config, items):
    """The ``slow`` tests first, each group in the order pytest-randomly shuffled it (its wrapper
    reorders before this hook; the sort is stable): the run ends on short tests, so at the end
    neither xdist worker waits long for the other's last test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_terminal_summary(terminalreporter, config):
    """Print pytest-randomly's seed even under ``-q`` (its own header line is hidden there)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"random test order: --randomly-seed={seed} repeats it")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~10 s (still part of `make test`; deselect with "
                                       "-m 'not slow' for a quick local run)")
    if not os.environ.get("PYTEST_XDIST_WORKER") and SHARED_DIR_ENV not in os.environ:
        # the controller, before it starts the workers: they inherit the variable
        config._corten_shared_dir = tempfile.mkdtemp(prefix="corten-tests-shared-")
        os.environ[SHARED_DIR_ENV] = config._corten_shared_dir


def pytest_unconfigure(config):
    shared = getattr(config, "_corten_shared_dir", None)
    if shared:
        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(SHARED_DIR_ENV, None)


SHARED_DIR_ENV = "CORTEN_TEST_SHARED_DIR"  # one directory per test run, shared by the xdist workers


def shared_program(key: str, build):
    """The program ``build()`` compiles, compiled once per test run for all workers: the first
    worker to ask compiles and saves it (``Program.save``) under the run's shared directory while
    holding a lock on its key; every caller, that one included, gets ``corten.load`` of the saved
    directory, so a test sees the same (loaded) program on whichever worker it runs.  (The zoo's
    programs take 5-30 s each to compile and are used by tests on both workers.)  Without the
    shared directory (the test run's controller did not set it) or for a program that cannot be
    saved, ``build()``'s own program."""
    import fcntl

    import corten
    from corten.errors import CortenError

    root = os.environ.get(SHARED_DIR_ENV)
    if not root:
        return build()
    path = os.path.join(root, key)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(path, "manifest.json")):
            prog = build()
            try:
                prog.save(path)
            except CortenError:
                return prog
        return corten.load(path)


_DURATIONS = os.environ.get("CORTEN_TEST_DURATIONS")  # a file: one "seconds<TAB>test id" line per test phase


def pytest_runtest_logreport(report):
    """With ``CORTEN_TEST_DURATIONS=FILE``, append each test phase's duration to FILE (for finding where
    the suite's time goes: ``sort -rn FILE``, or summed per file)."""
    if _DURATIONS and report.duration > 0.05 and not os.environ.get("PYTEST_XDIST_WORKER"):  # (the controller's copy)
        with open(_DURATIONS, "a") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.nodeid}\n")
