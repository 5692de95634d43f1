"""The collectives the pack's groups run under `tpu_dist`, against what TorchTPU 0.2.0 implements, and the even
splits its all-to-all needs in every Context Parallel layout the pack allows, for every family in the registry.

What TorchTPU implements is read from the installed torch_tpu in $TPU_VENV: the methods of its C++ process group
(`torch_tpu::ProcessGroupTpu::<name>`, mangled in its glue library; issue 35 notes §5). A torch.distributed call
the pack (or diffusers' context-parallel code it runs) makes must land on one of them; a new call must be named
here first, so a `reduce` or a coalesced collective (absent in TorchTPU) cannot slip in.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from backend.families import FAMILIES, PIPELINES
from backend.protocol.errors import ParallelError
from backend.protocol.spec import PipelineSpec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
# torch.distributed's functions -> the c10d Backend method each one reaches (torch's ProcessGroup.hpp); the
# functional collectives (funcol, diffusers' context parallel) -> the method their op reaches.
DIST = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "broadcast", "reduce": "reduce", "reduce_scatter": "reduce_scatter",
        "all_to_all": "alltoall", "all_to_all_single": "alltoall_base",
        "barrier": "barrier", "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv",
        "all_reduce_coalesced": "allreduce_coalesced", "all_gather_coalesced": "allgather_coalesced",
        "monitored_barrier": "monitoredBarrier"}
FUNCOL = {"all_gather_tensor": "_allgather_base", "all_to_all_single": "alltoall_base", "all_reduce": "allreduce",
          "reduce_scatter_tensor": "_reduce_scatter_base"}
# diffusers' ring attention calls permute_tensor in its backward pass only (attention_dispatch.py): never at inference
BACKWARD_ONLY = {"permute_tensor"}
NOT_COLLECTIVE = {"init_process_group", "destroy_process_group", "is_initialized", "get_rank", "get_world_size",
                  "new_group", "FileStore", "ReduceOp", "get_backend"}


def _torch_tpu_methods() -> set[str]:
    """The ProcessGroupTpu methods in the installed torch_tpu's glue library (its mangled C++ names)."""
    venv = os.environ.get("TPU_VENV")
    if not venv:
        pytest.skip("TPU_VENV (venv with torch-tpu) not set")
    libs = sorted(Path(venv).glob("lib/python*/site-packages/torch_tpu/csrc/common/glue_*/libpywrap_*_common.so"))
    assert libs, f"no torch_tpu glue library under {venv}"
    found = set()
    for m in re.finditer(rb"15ProcessGroupTpu(\d+)([A-Za-z_][A-Za-z0-9_]*)", libs[0].read_bytes()):
        n, name = int(m.group(1)), m.group(2).decode()
        if len(name) >= n:
            found.add(name[:n])
    return found


def _calls(text: str, prefix: str) -> set[str]:
    return set(re.findall(rf"\b{prefix}\.([A-Za-z_]+)\s*\(", text))


def test_the_table_reads_torch_tpu_as_the_notes_found_it():
    """The reading itself: what issue 35's notes list as present, and absent."""
    methods = _torch_tpu_methods()
    assert {"allreduce", "allgather", "_allgather_base", "broadcast", "alltoall_base", "barrier"} <= methods
    assert not {"reduce", "allreduce_coalesced", "allgather_coalesced", "monitoredBarrier"} & methods


def test_the_pack_and_diffusers_context_parallel_use_only_collectives_torch_tpu_implements():
    import diffusers

    methods = _torch_tpu_methods()
    pack = "\n".join(p.read_text() for p in sorted((ROOT / "backend" / "worker").glob("*.py")))
    d = Path(diffusers.__file__).parent
    theirs = "\n".join((d / f).read_text() for f in ("hooks/context_parallel.py", "models/attention_dispatch.py"))
    dist_calls, funcol_calls = _calls(pack + theirs, "dist") - NOT_COLLECTIVE, _calls(pack + theirs, "funcol")
    assert {"all_reduce", "all_gather", "barrier"} <= dist_calls, "the grep finds the pack's own collectives"
    unknown = (dist_calls - set(DIST)) | (funcol_calls - set(FUNCOL) - BACKWARD_ONLY)
    assert not unknown, f"new torch.distributed calls {sorted(unknown)}: name the TorchTPU method each one reaches"
    missing = {f: DIST[f] for f in dist_calls if DIST[f] not in methods}
    missing |= {f"funcol.{f}": FUNCOL[f] for f in funcol_calls - BACKWARD_ONLY if FUNCOL[f] not in methods}
    assert not missing, f"collectives TorchTPU 0.2.0 does not implement: {missing}"


# ---- even splits: every Context Parallel layout the pack allows, for every family's declaration

def _spec(pipeline_class: str, degree: int) -> PipelineSpec:
    p = PIPELINES[pipeline_class]
    return PipelineSpec(model_path="/models/x", class_name=pipeline_class, size_factor=p.size_multiple_of_vae * 8,
                        cp_degree=degree, kind="tpu")


CP_PIPELINES = sorted(c for c, p in PIPELINES.items() if p.cp_plan)
SIDES = range(256, 1280 + 1, 16)


@pytest.mark.parametrize("family_id", sorted(FAMILIES))
def test_every_context_parallel_size_the_pack_allows_splits_evenly(family_id):
    """For each pipeline of the family with a context-parallel plan, each degree 2..8 and every size (and video
    frame count) on a grid: accepted exactly when every sequence the declaration says must split (image or video
    tokens, audio unless left whole where uneven, the padded prompt) divides the degree; refused naming
    width/height (or the degree) otherwise."""
    from backend.controller import cp_sizes

    classes = [c for c in CP_PIPELINES if PIPELINES[c].family == family_id]
    if not classes:
        assert not any(p.cp_plan for p in FAMILIES[family_id].pipelines)
        return
    for class_name in classes:
        p = PIPELINES[class_name]
        frames = [1 + p.frame_step * k for k in range(0, 12)] if p.frame_step else [0]
        for degree in range(2, 9):
            spec = _spec(class_name, degree)
            for side in SIDES:
                for n in frames:
                    parts = cp_sizes.must_split(spec, side, side + 16, n)
                    even = all(t % degree == 0 for t in parts.values())
                    try:
                        cp_sizes.check_cp_size(spec, side, side + 16, n)
                        accepted = True
                    except ParallelError as e:
                        accepted = False
                        assert str(e).startswith("width/height:") and f"degree {degree}" in str(e), e
                    assert accepted == even, (class_name, degree, side, n, parts)


def test_a_video_with_sound_declares_its_audio_tokens_and_the_checks_follow(monkeypatch):
    """A family that declares audio in its split sequence (split apart, or packed after the video's) gets the
    same check with no code of its own, and audio it leaves whole where uneven (cp_whole_if_uneven) is accepted
    with a note: stand-in declarations on the first video pipeline with a plan."""
    from backend.controller import cp_sizes

    video = next(c for c in CP_PIPELINES if PIPELINES[c].frame_step)
    frames = 1 + 2 * PIPELINES[video].frame_step  # odd: 3 audio tokens a frame make an odd count
    spec = _spec(video, 2)
    size = 16 * spec.size_factor  # 256 tokens a latent frame: the video's split is even
    latent = 3 * 256
    monkeypatch.setitem(PIPELINES, video, replace(PIPELINES[video], cp_whole_if_uneven=(),
                                                  cp_tokens=lambda n, v, a: {"video": v, "audio": 2 * n}))
    cp_sizes.check_cp_size(spec, size, size, frames)
    assert cp_sizes.cp_sequence(spec, size, size, frames) == {"video": latent, "audio": 2 * frames}
    assert cp_sizes.note(spec, size, size, frames) is None
    monkeypatch.setitem(PIPELINES, video, replace(PIPELINES[video], cp_whole_if_uneven=(),
                                                  cp_tokens=lambda n, v, a: {"video": v, "audio": 3 * n}))
    with pytest.raises(ParallelError, match=rf"frames: {frames} frames at 24 fps make a sound of {3 * frames} "
                                            r"audio latents .*degree 2 cannot split evenly; use another frame "
                                            "count or frame rate"):
        cp_sizes.check_cp_size(spec, size, size, frames)
    monkeypatch.setitem(PIPELINES, video, replace(PIPELINES[video], cp_whole_if_uneven=("audio",),
                                                  cp_tokens=lambda n, v, a: {"video": v, "audio": 3 * n}))
    cp_sizes.check_cp_size(spec, size, size, frames)  # left whole on every rank, said in the Sample's notes
    assert f"make {3 * frames} audio latents, which 2 ranks cannot split evenly, so the sound runs whole" in \
        cp_sizes.note(spec, size, size, frames)
    monkeypatch.setitem(PIPELINES, video, replace(PIPELINES[video], cp_whole_if_uneven=(), cp_tokens=lambda n, v, a: {
        "video and audio": v + 3 * n}))
    with pytest.raises(ParallelError, match=rf"makes {latent + 3 * frames} video and audio tokens.*degree 2"):
        cp_sizes.check_cp_size(spec, size, size, frames)


@pytest.mark.parametrize("family_id", sorted(FAMILIES))
def test_the_padded_prompt_splits_evenly_in_every_context_parallel_degree_the_pack_allows(family_id):
    """The prompt at its declared padded length (`text_tokens`) is split too: a degree that does not divide it is
    refused, for every family whose prompt is not padded in the worker."""
    from types import SimpleNamespace

    from backend.controller import layouts

    for p in FAMILIES[family_id].pipelines:
        if not p.cp_plan:
            continue
        for degree in range(2, 9):
            try:
                layouts.check_cp(_spec(p.class_name, degree), SimpleNamespace(heads=None))
                accepted = True
            except ParallelError as e:
                accepted = False
                assert f"pads its prompt to {p.text_tokens} tokens" in str(e), e
            assert accepted == (p.variable_text or p.text_tokens % degree == 0), (p.class_name, degree)


def test_the_workers_split_check_reads_tokens_not_a_video_latents_channels():
    """The worker's last check before diffusers splits (parallel.check_even_split) counts tokens where the
    transformer takes them ([batch, tokens, width]); a video latent's second axis is its channels (Wan: 16), whose
    tokens the controller counted from the declaration, so a degree that does not divide 16 is not refused there."""
    import torch

    from backend.worker import parallel

    model = torch.nn.Module()
    model.forward = lambda **kwargs: None
    parallel.check_even_split(model, 3)
    model(hidden_states=torch.zeros(1, 16, 2, 3, 3), encoder_hidden_states=torch.zeros(1, 6, 4))
    with pytest.raises(ParallelError, match=r"cannot split 7 image tokens .*multiple of 3"):
        model(hidden_states=torch.zeros(1, 7, 4))
    with pytest.raises(ParallelError, match=r"cannot split 8 text tokens"):
        model(hidden_states=torch.zeros(1, 6, 4), encoder_hidden_states=torch.zeros(1, 8, 4))
