"""Our launch checks against TorchTPU's own, on fake TPU hosts: the real torch_tpu 0.2.0 with only its PCI scan
faked (tests/fake_tpu). For every Shard TP × Data Parallel choice the nodes allow, on v5e, v6e, v5p and v7x hosts
of several sizes, single or one host of a slice: what we accept TorchTPU launches, and what it refuses we refuse
first, with our message.

Two child processes in the TPU venv (tests/fake_tpu/agree.py): TorchTPU's `set_tpu_launch_env(n)` for n = 1..9
on each host, and the controller as ComfyUI's process runs it (its TorchTPU child processes see the same fake).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from backend.families import FAMILIES, PIPELINES

pytestmark = [pytest.mark.workers,
              pytest.mark.skipif(not os.environ.get("TPU_VENV"), reason="TPU_VENV (venv with torch-tpu) not set")]

ROOT = Path(__file__).resolve().parent.parent
AGREE = ROOT / "tests" / "fake_tpu" / "agree.py"
HOSTS = [("v5e", 1), ("v5e", 4), ("v5e", 8), ("v6e", 1), ("v6e", 4), ("v6e", 8), ("v5p", 4), ("v7x", 1), ("v7x", 2),
         ("v7x", 4)]
HEADS = 24  # the fake FLUX.1's attention heads (agree.fake_model)
LAUNCH = ("v7x", 1, 2)  # asked through the controller's own child process, on a pod host with a local group


def _or_list(values) -> str:
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _start(mode: str, cases: list) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([f"{os.environ['TPU_VENV']}/bin/python", str(AGREE), mode, json.dumps(cases)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=480)
    assert proc.returncode == 0, err[-4000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def rules() -> tuple[dict, dict]:
    """(TorchTPU's: (gen, chips) → {n: ok}, devices; ours: (gen, chips, pod, local) → result), run side by side."""
    ours_cases = [{"gen": g, "chips": c, "pod": pod, "local": local,
                   "launch": LAUNCH[2] if (g, c, pod, local) == (*LAUNCH[:2], True, True) else 0}
                  for g, c in HOSTS for pod, local in ((False, False), (True, False), (True, True))]
    theirs_proc, ours_proc = _start("torch_tpu", [list(h) for h in HOSTS]), _start("ours", ours_cases)
    theirs = {(r["gen"], r["chips"]): r for r in _lines(theirs_proc)}
    ours = {(r["gen"], r["chips"], r["pod"], r["local"]): r for r in _lines(ours_proc)}
    assert set(theirs) == set(HOSTS) and len(ours) == len(ours_cases)
    return theirs, ours


def _launchable(theirs: dict, host: tuple[str, int]) -> set[int]:
    """Worker counts TorchTPU launches on this host and that fit its devices (TorchTPU does not check that)."""
    r = theirs[host]
    return {int(n) for n, res in r["results"].items() if res["ok"] and int(n) <= r["devices"]}


@pytest.mark.parametrize("local", [False, True], ids=["single host", "pod host, local group"])
def test_we_accept_exactly_what_torch_tpu_launches_and_refuse_the_rest_first(rules, local):
    theirs, ours = rules
    for host in HOSTS:
        result = ours[(*host, local, local)]
        launchable = _launchable(theirs, host)
        assert launchable, f"{host}: TorchTPU launches nothing here?"
        assert result["info"]["sizes"] == sorted(launchable), host
        accepted = {c["world"] for c in result["combos"] if c["ok"]}
        assert accepted == launchable, f"{host}: we accept {sorted(accepted)}, TorchTPU launches {sorted(launchable)}"
        for c in result["combos"]:
            tp, dp = c["tp"], c["dp"]
            if c["ok"] or not c["error"]:
                continue
            assert "No TPU topology found" not in c["error"], c  # refused by us, before TorchTPU could
            if tp in (0, None) or dp in (0, None):
                continue
            if tp * dp not in launchable and HEADS % tp == 0:  # refused for the host: it says which and how
                assert "this host has" in c["error"] and "; use " in c["error"], c
                if tp * dp <= theirs[host]["devices"] and tp <= theirs[host]["devices"]:
                    assert f"{_or_list(sorted(launchable))} worker processes" in c["error"], c


@pytest.mark.parametrize("host", HOSTS, ids=[f"{g}-{c}" for g, c in HOSTS])
def test_every_explicit_layout_is_accepted_iff_torch_tpu_launches_it(rules, host):
    """Explicit choices (no node = 1): accepted iff TorchTPU launches tp × dp workers here and tp divides the
    heads; the only substitution is the v7x default (nothing sharded, no Data Parallel node: Data Parallel over
    one chip)."""
    theirs, ours = rules
    launchable = _launchable(theirs, host)
    for c in ours[(*host, False, False)]["combos"]:
        if 0 in (c["tp"], c["dp"]):
            continue
        tp, dp = c["tp"] or 1, c["dp"] or 1
        if tp == 1 and c["dp"] is None and 1 not in launchable:  # Shard TP degree 1 shards nothing
            assert c["ok"] and (c["tp_degree"], c["replicas"]) == (1, min(launchable)), c
            continue
        expected = tp * dp in launchable and HEADS % tp == 0
        assert c["ok"] == expected, c
        if expected:
            assert (c["tp_degree"], c["replicas"], c["world"]) == (tp, dp, tp * dp), c
            assert c["load_in_turn"] == (dp > 1), "replicas load one after another"


def test_one_v7x_chip_runs_data_parallel_2_by_default_and_says_why(rules):
    theirs, ours = rules
    result = ours[("v7x", 1, False, False)]
    assert theirs[("v7x", 1)]["devices"] == 2
    assert (result["info"]["chips"], result["info"]["devices"], result["info"]["memory_gib"]) == (1, 2, 96.0)
    default = next(c for c in result["combos"] if c["tp"] is None and c["dp"] is None)
    assert (default["ok"], default["tp_degree"], default["replicas"]) == (True, 1, 2)
    assert any("Data Parallel 2" in note and "launches no group of 1" in note for note in result["info"]["notes"])
    one = next(c for c in result["combos"] if c["tp"] is None and c["dp"] == 1)
    assert not one["ok"] and one["step"] == "replicate" and "use replicas 2" in one["error"], one
    five = next(c for c in ours[("v7x", 2, False, False)]["combos"] if c["tp"] is None and c["dp"] == 5)
    assert "2 TPU v7 chips (4 devices)" in five["error"], "messages keep chips and devices apart"


def test_a_pod_host_is_refused_at_once_unless_a_local_group_is_asked_for(rules):
    _, ours = rules
    for host in HOSTS:
        result = ours[(*host, True, False)]
        assert result["combos"] and all(not c["ok"] and c["step"] == "load" for c in result["combos"]), host
        error = result["combos"][0]["error"]
        assert "multi-host slice" in error and "COMFYUI_TPU_LOCAL_GROUP=1" in error and "single-host" in error
        assert "COMFYUI_TPU_HOSTS" in error and "python -m backend join" in error
        local = ours[(*host, True, True)]
        single = ours[(*host, False, False)]
        assert [c["ok"] for c in local["combos"]] == [c["ok"] for c in single["combos"]], host


def test_a_local_group_on_a_pod_host_gets_a_single_host_launch_environment(rules):
    """The controller's own TorchTPU child, with the pod variables in ComfyUI's environment: they are taken out
    of the workers' environment, so TorchTPU lays out this host alone (localhost ports, no NNODES)."""
    _, ours = rules
    env = ours[(*LAUNCH[:2], True, True)]["launch_env"]
    assert env.get("TORCH_TPU_TOPOLOGY") == "1,1,1,2", env
    addresses = env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert len(addresses) == LAUNCH[2] and all(a.startswith("localhost:") for a in addresses), env
    assert "NNODES" not in env and "NODE_RANK" not in env


def test_every_tpu_group_gets_its_own_handshake_port_and_tier2_cache_in_every_rank(rules):
    """Two groups on one pretend VM, started by our launcher: every rank's environment carries its group's
    handshake port, which TorchTPU's own handshake code reads (not its default 36423, which a second group
    could not bind), and its group's tier-2 compile cache name, one per user and group."""
    _, ours = rules
    result = ours[(*LAUNCH[:2], True, True)]
    groups = result["groups"]
    assert [[r["rank"] for r in ranks] for ranks in groups] == [list(range(LAUNCH[2]))] * 2, groups
    ports = [{r["handshake_port"] for r in ranks} for ranks in groups]
    names = [{r["tier2"] for r in ranks} for ranks in groups]
    assert all(len(p) == 1 for p in ports) and ports[0] != ports[1] and 36423 not in ports[0] | ports[1], ports
    assert all(len(n) == 1 for n in names) and names[0] != names[1], names
    assert all(name.startswith(f"comfyui-tpu-{os.getuid()}-") for name in names[0] | names[1]), names
    assert result["launch_env"]["TORCH_TPU_INTERNAL_HANDSHAKE_PORT"] == str(groups[0][0]["handshake_port"])


# ---- every family of the registry, on a v6e-8 and a v7x-8 host (v7x-8: 4 chips, 8 devices)

FAMILY_HOSTS = [("v6e", 8), ("v7x", 4)]


@pytest.fixture(scope="module")
def family_layouts() -> tuple[dict, dict]:
    """(TorchTPU's rules on these hosts; (family, gen, chips) → our controller's answer for every layout node ×
    degree × Data Parallel, both orders (tests/fake_tpu/agree.py families), for every family in the registry)."""
    cases = [{"gen": g, "chips": c, "family": f} for f in sorted(FAMILIES) for g, c in FAMILY_HOSTS]
    theirs_proc, ours_proc = _start("torch_tpu", [list(h) for h in FAMILY_HOSTS]), _start("families", cases)
    theirs = {(r["gen"], r["chips"]): r for r in _lines(theirs_proc)}
    found = {(r["family"], r["gen"], r["chips"]): r for r in _lines(ours_proc)}
    assert len(found) == len(cases) and set(theirs) == set(FAMILY_HOSTS)
    return theirs, found


def _expected(class_name: str, heads: int | None, layout: str, degree: int, world: int, launchable: set[int]) -> bool:
    """What the declaration allows (backend/families) on a host that launches `launchable` worker counts."""
    p = PIPELINES[class_name]
    if world not in launchable:
        return False
    if layout == "cfg":  # two passes of one denoiser (Ideogram 4's two models, a modular guider: not yet)
        return p.cfg_passes in ("batch", "branches") and not (p.modular and p.modular.guider)
    if layout == "tp":
        return p.tp_plan and (heads is None or heads % degree == 0)  # no plan: refused at any degree
    if layout == "cp":
        return degree == 1 or (p.cp_plan and (heads is None or heads % degree == 0)
                               and (p.variable_text or p.text_tokens % degree == 0))
    return True


@pytest.mark.parametrize("host", FAMILY_HOSTS, ids=["v6e-8", "v7x-8"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_gets_only_layouts_torch_tpu_launches_and_every_layout_its_declaration_allows(
        family_layouts, family, host):
    """For the family's first published model (its configs, no weights) on the real TorchTPU launch helper's
    topology table: every layout node its declaration allows (Data Parallel; CFG Parallel with two passes; Shard
    TP with a tp_plan; Context Parallel with a cp_plan), at every degree × Data Parallel: what we accept is a group
    TorchTPU launches and splits what the model allows, in one order of the nodes at least; everything else is
    refused by our checks (a ParallelError naming the input) before any worker starts, never by TorchTPU."""
    theirs, ours = family_layouts
    launchable = _launchable(theirs, host)
    result = ours[(family, *host)]
    assert result["sizes"] == sorted(launchable)
    by_layout: dict[tuple, list[dict]] = {}
    for c in result["combos"]:
        by_layout.setdefault((c["layout"], c["degree"], c["dp"]), []).append(c)
        if c["ok"]:
            assert c["world"] in launchable, c
            assert c["world"] == c["tp"] * c["cp"] * c["cfg"] * c["replicas"], c
        else:
            assert "No TPU topology found" not in c["error"] and c["error"].split(":")[0] in (
                "ParallelError", "TPUError"), c
            assert c["error"].split(": ", 1)[1].split(":")[0] in ("degree", "replicas", "pipeline", "offload",
                                                                  "mode"), c
    for (layout, degree, dp), combos in by_layout.items():
        ranks = degree if layout in ("tp", "cp") else 2 if layout == "cfg" else 1
        world = ranks * (dp or 1)
        if dp is None and world == 1 and 1 not in launchable:  # no Data Parallel node: the v7x default
            world = min(launchable)
        want = _expected(result["class_name"], result["heads"], layout, degree, world, launchable)
        assert any(c["ok"] for c in combos) == want, (layout, degree, dp, combos)
