"""Test-only: with FAKE_TPU_ROOT set, TorchTPU's hardware module and our own PCI scan in this process read
that fake host.

Put this folder on a child process's PYTHONPATH (the controller's TorchTPU child processes in the tests, or a
whole ComfyUI server on a pretend host). It re-roots `torch_tpu._internal.utils.hardware` the moment that module
is imported — before torch_tpu's autoload (`_loader.load()`) scans the bus — so everything downstream sees the
fake chips; and it points our scan's SYS_ROOT (backend/controller/devices.py, under whatever package name
ComfyUI gives the pack) at the same tree. Nothing here starts a runtime.
"""

import importlib.abc
import importlib.util
import os
import sys

_ROOT = os.environ.get("FAKE_TPU_ROOT")
_TARGET = "torch_tpu._internal.utils.hardware"
_OUR_SCAN = "backend.controller.devices"


def _reroot(module):
    if module.__name__ == _TARGET:
        from hosts import reroot  # this folder is on the path

        reroot(module, _ROOT)
    else:
        module.SYS_ROOT = _ROOT


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET and not (fullname == _OUR_SCAN or fullname.endswith("." + _OUR_SCAN)):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            _reroot(module)

        spec.loader.exec_module = exec_module
        return spec


if _ROOT:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    sys.meta_path.insert(0, _Finder())
