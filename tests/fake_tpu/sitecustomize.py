"""Test-only: with FAKE_TPU_ROOT set, TorchTPU's hardware module in this process reads that fake host.

Put this folder on a child process's PYTHONPATH (the controller's TorchTPU child processes in the tests). It
re-roots `torch_tpu._internal.utils.hardware` the moment that module is imported — before torch_tpu's autoload
(`_loader.load()`) scans the bus — so everything downstream sees the fake chips. Nothing here starts a runtime.
"""

import importlib.abc
import importlib.util
import os
import sys

_ROOT = os.environ.get("FAKE_TPU_ROOT")
_TARGET = "torch_tpu._internal.utils.hardware"


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        original = spec.loader.exec_module

        def exec_module(module):
            from hosts import reroot  # this folder is on the path

            original(module)
            reroot(module, _ROOT)

        spec.loader.exec_module = exec_module
        return spec


if _ROOT:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    sys.meta_path.insert(0, _Finder())
