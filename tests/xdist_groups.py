"""How the suite shares the machine's cores (pytest-xdist; scripts/test.sh runs `-n auto --dist loadgroup`).

Work units: the tests that use the one shared ComfyUI server or the browser on it (fixtures `server`, `ui`)
form one unit, so one xdist worker starts that server and that browser; every module's other tests form one unit
each, so a module's fixtures (worker groups, references, servers of its own) are built on one xdist worker. A test
marked `xdist_group("name")` joins that unit instead. Units start longest first (estimated from the tiers, or a
test's `minutes` marker), so that a long one never starts last.

xdist 3.8's own `loadgroup` cannot do this with pytest 9.2: it renames the tests' node ids, which pytest 9.2 no
longer lets a plugin do (pytest-dev/pytest-xdist#1386), and its controller never sees fixtures. So the xdist workers
write each test's unit and cost to a file during collection, and the controller's scheduler reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# the fixtures of the shared server and browser, and the unit of the tests that use them
SHARED_SERVER = {"server", "ui"}
SHARED_UNIT = "comfyui"
# rough seconds per test of each tier on 2 busy cores, for the order in which units start
TIER_SECONDS = {"unit": 0.5, "pipelines": 3.0, "workers": 10.0, "server": 15.0, "frontend": 8.0, "soak": 120.0}
_KEY = "comfyui_tpu_units"  # the xdist worker input naming the folder of the units' files


def unit_of(item: pytest.Item) -> str:
    """The work unit of a test (see the module's docstring)."""
    if (mark := item.get_closest_marker("xdist_group")) is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if SHARED_SERVER & set(item.fixturenames):
        return SHARED_UNIT
    return item.nodeid.split("::", 1)[0]


def seconds_of(item: pytest.Item) -> float:
    """About how long a test takes: its `minutes` marker, else its tier's typical time."""
    if (mark := item.get_closest_marker("minutes")) is not None:
        return 60.0 * float(mark.args[0])
    return max((TIER_SECONDS[m.name] for m in item.iter_markers() if m.name in TIER_SECONDS), default=1.0)


def write_units(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: writes each collected test's unit and each unit's cost for the controller."""
    folder = getattr(config, "workerinput", {}).get(_KEY)
    if not folder:
        return
    units = {item.nodeid: unit_of(item) for item in items}
    costs: dict[str, float] = {}
    for item in items:
        costs[units[item.nodeid]] = costs.get(units[item.nodeid], 0.0) + seconds_of(item)
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"units": units, "costs": costs}))
    os.replace(path.with_suffix(".tmp"), path)


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: absent with -p no:xdist
def pytest_configure_node(node) -> None:
    """Controller: tells each xdist worker where to write its units."""
    config = node.config
    if not hasattr(config, "_comfyui_tpu_units"):
        config._comfyui_tpu_units = tempfile.mkdtemp(prefix="comfyui-tpu-xdist-")
        config.add_cleanup(lambda: shutil.rmtree(config._comfyui_tpu_units, ignore_errors=True))
    node.workerinput[_KEY] = config._comfyui_tpu_units


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: the units above, longest first (other --dist modes: xdist's own)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """xdist's scope scheduling (one unit runs whole on one worker) with the units the workers wrote."""

        units: dict[str, str] | None = None
        costs: dict[str, float] = {}

        def _read(self) -> None:
            files = sorted(Path(config._comfyui_tpu_units).glob("*.json"))
            if not files:
                raise RuntimeError(f"no xdist worker wrote its test units into {config._comfyui_tpu_units}")
            data = json.loads(files[0].read_text())
            self.units, self.costs = data["units"], data["costs"]

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                self._read()
            return self.units.get(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            longest = max(self.workqueue, key=lambda unit: self.costs.get(unit, 0.0))
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return UnitScheduling(config, log)
