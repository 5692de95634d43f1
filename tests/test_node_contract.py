"""Saved workflows store widget values by position: a shipped node's inputs never move or disappear.

tests/node_inputs.json is the contract. A new node is added to it; a new input goes last (after the
optional ones) with a default. Reordering, renaming or removing an input fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

CONTRACT = Path(__file__).with_name("node_inputs.json")
OUR_CATEGORY = "TPU"


def _ordered_inputs(info: dict) -> list[str]:
    order = info["input_order"]  # sections without inputs (e.g. no optional ones) are absent
    return list(order.get("required", [])) + list(order.get("optional", []))


def test_shipped_node_inputs_keep_their_order(server):
    object_info = server.get("/object_info").json()
    ours = {name: info for name, info in object_info.items() if info.get("category") == OUR_CATEGORY}
    contract = json.loads(CONTRACT.read_text())
    assert set(contract) <= set(ours), f"shipped nodes are missing: {sorted(set(contract) - set(ours))}"
    for name, info in ours.items():
        assert name in contract, f"new node {name}: add its inputs to {CONTRACT.name} when it ships"
        current, shipped = _ordered_inputs(info), contract[name]
        assert current[: len(shipped)] == shipped, (
            f"{name}: inputs were {shipped}, now {current}. Keep shipped inputs in place; add new ones last.")
