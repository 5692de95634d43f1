"""The family registry (backend/families): each family module names things that exist, so adding a
family is adding its module, its configs and its fixtures, and nothing else has to know it."""

from __future__ import annotations

import pytest

from backend import families
from backend import tiny_models as tiny
from backend.families import CONFIGS, FAMILIES, PIPELINES, config_dir, text_encoders, vaes
from backend.protocol.spec import read_json

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("family_id", sorted(FAMILIES))
def test_each_family_names_its_configs_parts_and_pipelines(family_id):
    family = FAMILIES[family_id]
    assert family.id == family_id and family.pipelines
    for configs in family.all_configs:
        folder = config_dir(configs.folder)
        index = read_json(folder / "model_index.json")
        assert index["_class_name"] in {p.class_name for p in family.pipelines}, configs.folder
        assert (folder / family.denoiser / "config.json").is_file()
        assert configs is not family.experts or (folder / f"{family.denoiser}_2" / "config.json").is_file()
        assert (folder / "vae" / "config.json").is_file()
        for slot in configs.text_encoders:
            assert index[slot.component][0] == "transformers", (configs.folder, slot.component)
            assert (folder / slot.component / "config.json").is_file(), (configs.folder, slot.component)
            assert slot.kind in text_encoders.KINDS
    assert family.vae in vaes.KINDS
    assert all(PIPELINES[p.class_name].family == family_id for p in family.pipelines)


def test_every_configs_folder_belongs_to_one_family():
    folders = [c.folder for f in FAMILIES.values() for c in f.all_configs] + [
        e for f in FAMILIES.values() for e in f.extra_configs]
    assert sorted(folders) == sorted(CONFIGS)


def test_recognition_keys_tell_every_family_apart():
    """A file holding exactly one family's recognition keys is that family's, whatever the registry's order."""
    for family in FAMILIES.values():
        shapes = dict.fromkeys(family.denoiser_keys, (1, 1))
        assert families.recognise(shapes) is family
        assert [f.id for f in FAMILIES.values() if f.recognises(shapes)] == [family.id]


def test_messages_name_the_families_in_order():
    assert families.names() == (
        "FLUX.1, FLUX.2, SD3/SD3.5, SDXL, Qwen-Image, Qwen-Image 2.1, Z-Image, Krea 2, Ideogram 4 or Wan")


def test_every_family_has_a_tiny_pipeline(tiny_models):
    """Its fixture: a tiny random-weight pipeline (backend/tiny_models.py) of one of its pipeline classes."""
    classes = [read_json(tiny_models / f"tiny-{name}" / "model_index.json")["_class_name"] for name in tiny.FAMILIES]
    assert sorted(PIPELINES[c].family for c in classes) == sorted(FAMILIES)
