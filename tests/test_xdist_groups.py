"""The suite's xdist scheme (tests/xdist_groups.py) in a pytest run of its own: the tests of the shared server
run on one xdist worker, each module's other tests on one, and the longest unit starts first. xdist's own
loadgroup stopped grouping without an error when pytest changed its node ids: this would notice it here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.workers

TESTS = Path(__file__).resolve().parent


def test_shared_server_tests_and_each_module_run_on_one_xdist_worker_longest_first(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    minutes(n): long\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys

        import pytest

        sys.path.insert(0, {str(TESTS)!r})
        from xdist_groups import pytest_configure_node, pytest_xdist_make_scheduler, write_units


        @pytest.hookimpl(wrapper=True)
        def pytest_collection_modifyitems(config, items):
            result = yield
            write_units(config, items)
            return result


        @pytest.fixture(scope="session")
        def server():
            return "one per xdist worker"
    """))
    for module in ("a", "b"):
        (tmp_path / f"test_{module}.py").write_text("".join(
            f"def test_server_{i}(server): pass\ndef test_own_{i}(): pass\n" for i in range(4)))
    (tmp_path / "test_long.py").write_text("import pytest\n\n@pytest.mark.minutes(5)\ndef test_long(): pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's xdist worker
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist",
                          "loadgroup"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", out.stdout)
    assert len(ran) == 17, out.stdout
    where = dict((test, worker) for worker, test in ran)
    assert len({w for t, w in where.items() if "::test_server_" in t}) == 1, where
    for module in ("a", "b"):
        assert len({w for t, w in where.items() if t.startswith(f"test_{module}.py::test_own_")}) == 1, where
    firsts = {worker: test for worker, test in reversed(ran)}  # each worker's first test
    assert "test_long.py::test_long" in firsts.values(), ran
