"""What a family module fills in, and the shape arithmetic its size readers share.

A family (FLUX.1, SDXL, ...) is one module of this package holding one `ModelFamily`: how its diffusers
pipelines run (`Pipeline`, one per pipeline class: what the worker and the layouts read through
`PipelineSpec.family`), and how artists' files of it are recognised and described (keys, size reader, text
encoders, VAE, the configs of its published models in its folder). No torch: both processes read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Embeddings:
    """How ComfyUI's CONDITIONING for this pipeline (CLIP Text Encode with the family's text encoders) maps onto
    its `prompt_embeds` and `pooled_prompt_embeds`: the same tensors in the same layout, checked by width and
    padded with zeros to the text length the pack's own text path gives (what compiled mode compiles for)."""

    encoders: str  # how ComfyUI loads the text encoders that make it, for messages
    # the denoiser's config -> (width of prompt_embeds, width of pooled_prompt_embeds)
    widths: Callable[[dict], tuple[int, int]]
    length: int  # tokens of the pack's own text path: shorter conditionings are padded to it
    chunks: int = 1  # longer ones are padded to a multiple of `length`, up to this many (SDXL's 77-token chunks)
    guidance: bool = False  # FluxGuidance's value is the pipeline's guidance (FLUX.1's embedded guidance)


@dataclass(frozen=True)
class ControlNets:
    """One kind of ControlNet a pipeline takes in diffusers (Apply ControlNet): its model class, the wrapper that
    runs several, and the pipeline classes that drive it (made from the loaded pipeline with from_pipe)."""

    model: str  # diffusers' ControlNet class ("FluxControlNetModel"): what a file or folder is recognised as
    multi: str  # the class that runs several of them in one call ("FluxMultiControlNetModel"); "": one per call
    text2img: str  # the pipeline for text to image ("FluxControlNetPipeline")
    img2img: str | None = None  # ... for image to image; None: diffusers has none with this ControlNet
    inpaint: str | None = None  # ... for inpainting; None: diffusers has none with this ControlNet
    image_arg: str = "control_image"  # the text-to-image call's argument for the control image (SDXL: image)
    # Union ControlNets (one model, several kinds of control): the mode names by index (the control_mode that
    # selects each). A model of this kind is a union one when its config says so (num_mode / num_control_type).
    modes: tuple[str, ...] = ()
    mode_key: str = ""  # its config key holding the number of modes ("num_mode"); "" when every model has modes
    mode_lists: bool = False  # the call takes one list of images and modes per ControlNet (SDXL union)
    no_modes: str = ""  # why a model of this kind takes no union mode, where its name says union (Z-Image's)
    steps_window: bool = True  # the pipelines take control_guidance_start/end (Z-Image's: every step, always)
    # the pipeline draws the control image's latents from torch's global RNG, not the call's generator (SD3): the
    # worker seeds it with the image's seed for the call, so the same seed gives the same image
    global_rng: bool = False
    # Single files in diffusers' layout (how these ControlNets are published): the keys every file of the kind
    # holds, keys it never holds, and its config from the file's shapes and the pipeline's denoiser config (and,
    # where the config hangs on whether a tensor is all zeros, the `zero_keys` that are: Z-Image 2.0 and 2.1)
    keys: tuple[str, ...] = ()
    absent_keys: tuple[str, ...] = ()
    config: Callable[..., dict] | None = None
    zero_keys: tuple[str, ...] = ()
    single_file: bool = False  # the worker reads its files with diffusers' from_single_file (its converter)
    # Inpainting (with `inpaint`): (ControlNet config, denoiser config) -> why this one cannot ("" when it can);
    # and whether the pipeline makes the whole image from noise (Sample's denoise 1 only)
    cannot_inpaint: Callable[[dict, dict], str] | None = None
    inpaint_from_noise: bool = False

    def recognises(self, shapes: Shapes) -> bool:
        return all(k in shapes for k in self.keys) and not any(k in shapes for k in self.absent_keys)


@dataclass(frozen=True)
class Modular:
    """A diffusers modular pipeline (`diffusers.modular_pipelines`) in place of a DiffusionPipeline class: the
    worker builds it from these blocks and the folder's index (backend/worker/modular.py), and calls it with the
    same request mapping as every other pipeline."""

    blocks: str  # its blocks class in diffusers.modular_pipelines ("Flux3DistilledAutoBlocks")
    index: str = "modular_model_index.json"  # the folder's index file (what Load TPU Pipeline recognises)
    workflow: str = ""  # the blocks' workflow it runs (MiniMax H3: "t2va", "fl2va", "ref2va"); "": the blocks whole
    # sub-blocks left out: the prompt upsampler (FLUX 3's is a 9B Qwen3.5 that the folder need not hold)
    without: tuple[str, ...] = ()
    # the state values the call returns: the pixels first ("images", or a video's "videos"), then any "audio"
    outputs: tuple[str, ...] = ("images",)
    # guidance is the guider component's guidance_scale (the call takes no guidance argument); False: none
    guider: bool = False
    # the weighted components its workflow loads, where the folder holds more (MiniMax H3's t2va leaves out
    # `transformer_ref`, ref2va's transformer): what offload 'auto' counts. (): every one the index lists
    components: tuple[str, ...] = ()
    # The blocks' workflow of each of the pack's tasks beyond text (worker/images.py: "start", Sample Video's first
    # or last frame; "reference", its reference images). With tasks the blocks run whole (they pick the workflow on
    # the call's inputs, as diffusers' auto blocks do), loaded with `workflow`'s components; another task's
    # components (MiniMax H3's transformer_ref for ref2va) load the first time a request runs it.
    tasks: tuple[tuple[str, str], ...] = ()
    # the last sub-block, which decodes, where it refuses output_type "latent" (MiniMax H3's "decode"): a call
    # that asks for latents runs without it
    decode: str = ""
    # the blocks' class of one reference image, in diffusers.modular_pipelines ("minimax_h3.MiniMaxH3ImageReference")
    image_reference: str = ""
    # ... whose sides may differ by at most this factor (MiniMax H3's blocks raise a bare ValueError beyond 4:1);
    # 0: any
    reference_aspect: float = 0.0
    # the blocks' class of one reference sound (MiniMax H3's ref2va: "minimax_h3.MiniMaxH3AudioReference", the
    # prompt's <Audio 1>, ...): Sample Video's reference_audio, at most `audio_references` of them, beside reference
    # images, read for `fps`-frame-a-second videos (the rest is cut); "": reference_audio is refused
    audio_reference: str = ""
    audio_references: int = 0
    fps: float = 0.0


@dataclass(frozen=True)
class Pipeline:
    """How one diffusers pipeline class of a family runs: what differs between the classes we support."""

    class_name: str  # diffusers' pipeline class ("FluxPipeline")
    name: str  # what messages call it ("FLUX.1")
    size_multiple_of_vae: int  # latent packing/patching on top of the VAE's downscale
    guidance_arg: str  # the __call__ argument our "guidance" maps to
    tp_plan: bool  # diffusers ships a tensor-parallel plan for its transformer
    repeated_blocks: bool = True  # the denoiser lists _repeated_blocks (compile_repeated_blocks works)
    cfg_doubles_batch: bool = False  # CFG runs the denoiser once on a doubled batch (a compiled shape)
    # How CFG runs the denoiser twice per step, which CFG Parallel splits over two ranks: "batch" (one call on a
    # doubled [uncond, cond] batch), "branches" (a "cond" and an "uncond" call), "models" (a conditional and an
    # unconditional denoiser, two models, every step: Ideogram 4; CFG Parallel does not split these yet), "" (one
    # pass: guidance-distilled)
    cfg_passes: str = ""
    cp_plan: bool = False  # diffusers ships a context-parallel plan (_cp_plan) for its transformer
    # The family module (families/<id>/<module>.py, torch, worker only) whose PLANS replace diffusers' _cp_plan,
    # by denoiser class, where diffusers' does not fit the model (LTX-2: "cp"; parallel.planned_cp_config); "":
    # diffusers' own
    cp_plan_module: str = ""
    # Context Parallel's ring attention is refused: the split prompt carries a padding mask, which diffusers' ring
    # applies to every rank's keys as if it were their own (LTX-2's connectors' mask; Qwen-Image's: variable_text)
    cp_masked_text: bool = False
    # What Context Parallel splits over its ranks, each part evenly (TorchTPU's all-to-all takes equal splits
    # only): the prompt at its padded length (unless variable_text: padded in the worker), and the sequences
    # (frames, image or video tokens, the sound's latents for frames / frame_rate seconds: 0 without sound) ->
    # {what: tokens} gives (None: the image or video tokens alone). A video with sound declares its audio there:
    # {"video": v, "audio": a} split apart (LTX-2), or {"video and audio": v + a} packed in one sequence; the
    # checks follow the declaration, with no code of its own (controller/cp_sizes.py).
    text_tokens: int = 512
    cp_tokens: Callable[[int, int, int], Mapping[str, int]] | None = None
    # The sequences of cp_tokens that the plan leaves whole on every rank where they do not split evenly, instead
    # of refusing the size (LTX-2's "audio": its sound at 25 fps has as many latents as the frames, always odd;
    # its cp.py's whole_sound), which the Sample's notes say
    cp_whole_if_uneven: tuple[str, ...] = ()
    # The transformer argument whose first dimension is the one sequence diffusers' plan splits, where the
    # transformer packs its inputs into one: MiniMax H3 packs the prompt's, the images', the sound's and the video's
    # rows, described by "position_ids" [rows, 3]. Its length follows the prompt, so the worker checks that it
    # splits evenly before diffusers does (parallel.check_even_split), naming the fix.
    cp_packed: str = ""
    variable_text: bool = False  # the text length follows the prompt (Qwen-Image)
    # What an input image on Sample means (diffusers pipelines made from the loaded one with from_pipe):
    img2img: str | None = None  # the image-to-image pipeline class; None: the image is a reference instead
    inpaint: str | None = None  # the inpainting pipeline class; None: this model cannot inpaint
    references: bool = False  # the loaded pipeline itself takes reference images (`image=`)
    needs_image: bool = False  # it cannot make an image without one (edit models)
    needs_mask: bool = False  # it repaints the masked part of the image and nothing else (FLUX.1 Fill)
    control_image: bool = False  # Sample's image is its control image (`control_image=`: FLUX.1 Depth and Canny)
    image_note: str = ""  # what the pipeline itself does to Sample's image, said next to Sample
    cfg_above: float = 1.0  # the pipeline runs CFG when its guidance is above this (Z-Image: any guidance above 0)
    # the denoiser takes the prompt at its own length and pads it inside to a multiple of this (Z-Image: 32,
    # diffusers' SEQ_MULTI_OF): compiled whole, every prompt length would be a new graph; its repeated blocks see
    # the padded length. 0: the prompt reaches the denoiser at a fixed or padded length
    prompt_step: int = 0
    # why torch.compile cannot trace its whole denoiser into one graph (Qwen-Image 2.1's rotary embedding reads the
    # image mask into Python lists): compiled mode compiles its repeated blocks instead, and says this. "": it can
    whole_denoiser_untraceable: str = ""
    # with variable_text: compiled mode pads the prompt to 128-token buckets with an attention mask, which gives the
    # same pixels (Qwen-Image); False where padding moves the image's rotary positions (Qwen-Image 2.1 counts the
    # text tokens before the image's): the prompt then runs at its own length, and each new length compiles
    padded_text_exact: bool = True
    # why compiled mode cannot run it at all (MiniMax H3: shapes that follow the prompt and the step); "": it can
    compile_refused: str = ""
    # How it drives its scheduler (Sample's sampler and scheduler: protocol/samplers.py); its image-to-image and
    # inpainting pipelines do the same. sigmas: whether it hands set_timesteps sigmas of its own ("always",
    # "unless flow sigmas", "never"); seeded_steps: it hands scheduler.step the call's generators, so a
    # stochastic sampler follows the seed.
    sigmas: str = "never"
    seeded_steps: bool = False
    # its call takes `sigmas=`, a schedule of the artist's own (Sampling Options' sigmas: Qwen-Image 2.1 Turbo's
    # ManualSigmas), which also sets the step count
    sigmas_arg: bool = False
    # those sigmas run as given, as ComfyUI's ManualSigmas runs them: its scheduler's dynamic shift and
    # shift_terminal switched off for them (LTX-2's shift by the token count would warp a distilled schedule)
    sigmas_as_given: bool = False
    # The step caches (spec.STEP_CACHES) that suit it: diffusers' hooks know its blocks and the pipeline runs its
    # denoiser under cache contexts; MagCache also needs the model's magnitude ratios (diffusers ships FLUX.1's)
    step_caches: tuple[str, ...] = ()
    # The modules whose outputs TaylorSeer extrapolates between its full steps (regular expressions on module names,
    # diffusers' `cache_identifiers`); () = diffusers' default, each block's attention
    taylorseer_modules: tuple[str, ...] = ()
    # why the step caches it lacks do not apply (said when one is asked for): diffusers' hook, or its pipeline's
    # call, that does not fit this model
    no_step_cache: str = ""
    # A video pipeline (num_frames in, .frames out): its frame count is 1 + a multiple of this (the VAE's temporal
    # compression, Wan: 4). 0: it makes images.
    frame_step: int = 0
    # ... counted from this many frames (MiniMax H3's 17-frame chunks: 17n + 5), within this range ((1, 0): any)
    frame_first: int = 1
    frames_range: tuple[int, int] = (1, 0)
    # the fewest steps its scheduler takes (MiniMax H3's: 2; diffusers raises a bare ValueError below)
    min_steps: int = 1
    # the fewest multiples of the size factor a side takes (LTX-2's: 2, its video VAE's decoder pads by reflection,
    # which torch refuses on a latent 1 pixel wide)
    min_size_multiples: int = 1
    # A video pipeline that takes Sample Video's start image as the first frame of each video (image to video:
    # `image=`, a PIL image); with needs_image it makes no video without one.
    start_image: bool = False
    # ... and its end image as the last frame (`last_image=`, a PIL image: MiniMax H3's fl2va), and at most this many
    # reference images (`references=`: MiniMax H3's ref2va, 9); 0: none
    end_image: bool = False
    video_references: int = 0
    # A text-to-video pipeline whose models also take a start image when their model_index sets `start_image_if`
    # (Wan 2.2 TI2V 5B: expand_timesteps; "": all of them, LTX-2): such a video runs on `start_image_via`, made
    # with from_pipe
    start_image_via: str = ""
    start_image_if: str = ""
    # A video pipeline that makes sound with its video (`.audio` [B, channels, samples] beside `.frames`): the
    # components the sound needs (LTX-2: audio_vae, vocoder; a folder without one is refused), and where its sample
    # rate is read ("component.config_key"). (): no sound (Sample Video's AUDIO output is None).
    sound: tuple[str, ...] = ()
    sound_rate: str = ""
    # It takes Sample Video's upscale_model: the family module that runs the two-stage call with an x2 latent
    # upsampler (LTX-2: "two_stage", families/ltx2/two_stage.py); "": refused
    latent_upscale: str = ""
    # A video pipeline with sound that also takes Sample Video's AUDIO and keeps it as the video's sound (image +
    # audio to video): the diffusers pipeline that runs it, made with from_pipe (LTX-2: LTX2ConditionPipeline,
    # the start image as its frame-0 condition), and the family module that encodes it (`<module>.py` in the
    # family's folder, torch, worker only: waveform -> the audio VAE's latents). "": AUDIO is refused.
    audio_via: str = ""
    audio_module: str = ""
    audio_min_steps: int = 1  # the fewest steps audio_via takes (LTX2ConditionPipeline: 2, below it an IndexError)
    # the __call__ argument that takes Sample Video's frame rate (LTX-2: frame_rate, which sets the sound's length
    # and the positions of the video tokens in time); "": the model has a fixed rate (Wan: 16 fps), none is passed
    frame_rate_arg: str = ""
    # further __call__ arguments that take Sample's guidance too, or Sample Video's audio_guidance where it is
    # given (LTX-2's audio_guidance_scale: its `or` would turn 0 into the video's guidance anyway), and fixed ones the pack passes: guidance the pack does not
    # expose, switched off (LTX-2's STG, modality isolation, rescale), so that guidance 1 is one pass per step;
    # Ideogram 4's guidance_schedule=None, so that its guidance_scale applies at every step, whatever the steps
    guidance_also: tuple[str, ...] = ()
    call_args: tuple[tuple[str, object], ...] = ()
    controlnets: tuple[ControlNets, ...] = ()  # the ControlNet kinds it takes (Apply ControlNet)
    # ComfyUI's LATENT of this model packs p×p latent pixels into channels (FLUX.2: 2, 128 channels at 1/16 of
    # the image); 1: one latent pixel per VAE latent pixel, as the VAE gives them
    latent_patch: int = 1
    # How Sample's positive/negative CONDITIONING maps onto the pipeline (None: it takes none; refused)
    embeddings: Embeddings | None = None
    # How ComfyUI's templates encode its prompt: (CLIPLoader type, encode node), e.g. ("krea2", "CLIPTextEncode");
    # the refusal of a CONDITIONING says whether the running ComfyUI has them (0.3.75 has no Qwen3-VL encoder)
    comfy_encoder: tuple[str, str] = ()
    # FLUX.1 Redux (Apply Redux): the call takes the prompt_embeds and pooled_prompt_embeds diffusers'
    # FluxPriorReduxPipeline makes from reference images
    redux: bool = False
    # Sampling Options' true_cfg_scale: a true CFG scale of its own beside the embedded guidance (FLUX.1, Kontext)
    true_cfg: bool = False
    # its true CFG calls the denoiser for the prompt, then the negative prompt, each step, without naming the two
    # calls (no cache_context; diffusers 0.42.1's Kontext): CFG Parallel tells them apart by their order
    unnamed_branches: bool = False
    # the model_index key that, when true, marks a guidance-distilled model: one pass per step (FLUX.2 [klein])
    distilled_key: str = ""
    # its image-to-image and inpainting pipelines round num_inference_steps x strength down (SDXL's), not up
    strength_floor: bool = False
    # how the loaded pipeline takes Sample's reference images (with `references`): "list" (every one), "one"
    # (the first: Qwen-Image-Edit), "kontext" (the first, resized to a Kontext resolution)
    reference_mode: str = "list"
    # ComfyUI sampler names its diffusers pipeline fails with although their scheduler takes its sigmas (diffusers
    # 0.42.1: UniPC on flow sigmas raises in Z-Image's and Ideogram 4's set_timesteps): refused by name
    unfit_samplers: tuple[str, ...] = ()
    # its images carry an alpha channel (Qwen-Image 2.1's VAE decodes RGBA): ComfyUI's IMAGE has three channels,
    # so the worker drops the fourth
    alpha: bool = False
    # why Sample's image cannot go to it (diffusers' pipeline takes none and has no image-to-image one), said when
    # one is connected; "" where images go somewhere (img2img, references, a control image)
    no_image: str = ""
    # the most reference images its pipeline takes where the model's makers state one (FLUX 3: diffusers' blocks,
    # "at most 10"); 0: none stated
    max_references: int = 0
    # The kind of pipeline `tpu-check` runs a step of its own for (tpu_check.KIND_STEPS: "video with sound",
    # "modular pipeline", "quantized file", ...), with the family's first tiny model; "": "video" where it makes
    # videos, else "image" (what tpu-check's main steps run)
    check_kind: str = ""
    # a diffusers modular pipeline (class_name is its ModularPipeline class); None: a DiffusionPipeline class
    modular: Modular | None = None
    family: str = ""  # the id of the family module it belongs to (the registry fills it in)


@dataclass(frozen=True)
class TextSlot:
    """One text encoder of a published pipeline: the component it becomes, and the kind of file it reads
    (a key of text_encoders.KINDS)."""

    component: str  # "text_encoder_2"
    kind: str  # "t5"
    optional: bool = False  # the pipeline runs without it (SD3 without T5)


@dataclass(frozen=True)
class Configs:
    """The configs of one published model of the family: a folder of its configs/ and its text encoders,
    in the pipeline's order."""

    folder: str
    text_encoders: tuple[TextSlot, ...]
    name: str = ""  # what messages call this model where the family has several ("FLUX.2 [klein]")
    vae_hint: str = ""  # what artists call its VAE file where it is not the family's (Wan 2.2 5B's)


@dataclass(frozen=True)
class Pair:
    """Two denoisers of one shape that always run together, each from a file of its own (Ideogram 4's conditional
    and unconditional transformers, as ComfyUI's template loads them with two UNETLoaders): the first in the
    loader's diffusion_model, the second in diffusion_model_2. Their keys are the same, so which is which is told
    where the file names say (`marker`, in the second's name only) and by their bytes (one file twice)."""

    component: str  # the second's pipeline component ("unconditional_transformer")
    first: str  # what messages call the first ("the conditional transformer")
    second: str  # ... and the second ("the unconditional transformer")
    marker: str  # the word only the second's file name carries ("unconditional")
    hint: str  # the second's file as the templates name it ("ideogram4_unconditional_*.safetensors")


@dataclass(frozen=True)
class ModelFamily:
    """One family: its pipelines, and what its artists' files (ComfyUI's folders) hold and how they load."""

    id: str  # "flux1": the loader layout of its denoiser files and the key of the registry
    name: str  # what messages about files call it ("SD3/SD3.5")
    pipelines: tuple[Pipeline, ...]  # the text-to-image one first, then edit pipelines
    configs: tuple[Configs, ...]  # the published models; several where the text encoder decides (FLUX.2)
    denoiser_keys: tuple[str, ...]  # keys every denoiser file of the family holds (under its prefix)
    width_key: str  # the denoiser's first layer: its input channels are shape[1]
    width_agrees: tuple[str, int]  # (key, dim): a size of another layer that equals width_key's shape[0]
    # (denoiser shapes, published denoiser config, text encoders chosen: kind -> shapes) -> config sizes
    sizes: Callable[[Shapes, dict, Mapping[str, Shapes]], dict]
    # (denoiser shapes, text kinds chosen) -> the width of the features each text encoder kind must give
    text_widths: Callable[[Shapes, frozenset[str]], dict[str, int]]
    vae: str  # the VAE kind it decodes with (a key of vaes.KINDS)
    vae_hint: str  # what artists call its VAE file
    absent_keys: tuple[str, ...] = ()  # keys its files never hold (tells it from a family with the same keys)
    # (kind, layers): the fewest decoder layers a text encoder kind must have, where the pipeline reads the hidden
    # states of fixed layers (FLUX 3: hidden_states[32]); a file of the width but fewer layers would fail mid-run
    text_layers: tuple[tuple[str, int], ...] = ()
    # the denoiser's last layer: its shape[0] is the output channels, which differ from the input channels where
    # the input carries a condition too (FLUX.1 Fill: masked image and mask; Depth, Canny: the control image)
    out_key: str = ""
    denoiser: str = "transformer"  # the denoiser's component name
    # (file name) -> the component a denoiser file loads as, where its name tells (MiniMax H3's ref2va file:
    # `transformer_ref`); None: `denoiser`
    denoiser_for: Callable[[str], str] | None = None
    # (file name by component of the files, whether the request has reference images) -> why its files cannot run
    # the request, "" where they can (MiniMax H3's fl2va and ref2va files each run their own tasks); None: any
    files_task: Callable[[Mapping[str, str], bool], str] | None = None
    # denoiser channels per VAE latent channel in the layer latent_channels reads (out_key's output, else
    # width_key's input; 2x2 packed latents: 4)
    latent_packing: int = 4
    single_file: bool = False  # diffusers' pipeline loader reads its all-in-one checkpoints
    files: bool = True  # its artists' files load (False: they are recognised, and refused naming the way that works)
    files_refused: str = ""  # why they do not load (files=False), said in the refusal
    # its sound's VAE from files (Load TPU Pipeline's audio_vae input): (VAE kind of families/vaes.py, what artists
    # call the file); (): it makes no sound, or reads none from files
    audio_vae: tuple[str, str] = ()
    # (denoiser shapes, CLIP-L shapes, CLIP-G shapes) -> None when the CLIP pair fits, else the width it reads
    clip_pair: Callable[[Shapes, Shapes, Shapes], int | None] | None = None
    # (denoiser shapes, text kinds chosen) -> the published model the files are (default: the first configs)
    configs_for: Callable[[Shapes, frozenset[str]], Configs] | None = None
    # (denoiser shapes, key prefix, quant, file name) -> how the worker reads the denoiser file (default: id)
    denoiser_layout: Callable[[Shapes, str, str, str], str] | None = None
    # the published models of two experts (Wan 2.2 A14B: high noise, then low noise) that a second diffusion
    # model makes, by the folder of the configs the first file has alone (what configs_for says); the second
    # becomes `<denoiser>_2`. A configs that maps to itself is only ever a pair. Empty: one denoiser each
    experts: Mapping[str, Configs] = field(default_factory=dict)
    pair: Pair | None = None  # its two denoisers that always run together (Ideogram 4), from two files
    # (denoiser sizes, file name, configs, the loader's flux_kontext choice) -> (config overrides by component,
    # "" for model_index: its _class_name where the files make another pipeline; notes)
    variant: Callable[[dict, str, Configs, str], tuple[dict[str, dict], tuple[str, ...]]] | None = None
    # configs folders for models that run beside its pipelines (FLUX.1 Redux's image encoder, image
    # embedder and image processor)
    extra_configs: tuple[str, ...] = ()
    # where it stands in lists and in recognition (the first family whose keys a file holds is the one)
    order: int = 100
    # the tiny random-weight pipelines its folder's tiny.py builds, by name (the test folders are tiny-<name>;
    # "flux" for FLUX.1: saved workflows name tiny-flux)
    tiny: tuple[str, ...] = ()
    # The components its pipeline needs beyond the denoiser, the VAE and the text encoders, read from the chosen
    # files (LTX-2's text connectors, audio VAE and vocoder, in its checkpoint): (a file's shapes, every key; the
    # published config of a component by name; the denoiser's shapes as "denoiser" and the text encoders' by kind)
    # -> {component: (key prefix, loader layout, config sizes)} of those the file holds; ValueError says what does
    # not fit. `file_parts_hint` names the files that hold them, by configs folder (a published model's), for the
    # refusal when no chosen file does.
    file_parts: Callable[[Shapes, Callable[[str], dict], Mapping[str, Shapes]], dict[str, tuple[str, str, dict]]] | None = None
    file_parts_needed: tuple[str, ...] = ()
    file_parts_hint: Mapping[str, str] = field(default_factory=dict)
    # the Load TPU Pipeline (ComfyUI files) input that chooses among its variants where the file cannot tell
    # ("flux_kontext": whether a FLUX.1 [dev]-shaped file is Kontext); "" where it has none
    variant_input: str = ""

    def recognises(self, shapes: Shapes) -> bool:
        return all(k in shapes for k in self.denoiser_keys) and not any(k in shapes for k in self.absent_keys)

    @property
    def all_configs(self) -> tuple[Configs, ...]:
        """Every published model of the family: the one-file ones, then the two-expert one."""
        return (*self.configs, *(c for c in dict.fromkeys(self.experts.values()) if c not in self.configs))

    def published(self, shapes: Shapes, kinds: frozenset[str]) -> Configs:
        return self.configs_for(shapes, kinds) if self.configs_for else self.configs[0]

    def text_kinds(self) -> tuple[str, ...]:
        """Every text encoder kind any of its published models reads, in order."""
        return tuple(dict.fromkeys(s.kind for c in self.configs for s in c.text_encoders))

    def layout(self, shapes: Shapes, prefix: str, quant: str, file_name: str) -> str:
        return self.denoiser_layout(shapes, prefix, quant, file_name) if self.denoiser_layout else self.id

    def latent_channels(self, shapes: Shapes) -> int:
        """The VAE latent channels this denoiser makes (and reads, beside any condition it reads too)."""
        if self.out_key:
            return shapes[self.out_key][0] // self.latent_packing
        return shapes[self.width_key][1] // self.latent_packing


def unread(*args: object) -> dict:
    """The size reader and text widths of a family whose artists' files do not load yet (`files=False`): they
    are recognised and refused before anything reads their sizes."""
    raise NotImplementedError("this family's files are recognised and refused; their sizes are not read")


# ---- shape arithmetic shared by the size readers


def count(shapes: Shapes, prefix: str) -> int:
    """How many numbered blocks (`prefix`0., `prefix`1., ...) the shapes hold."""
    found = {k[len(prefix):].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    return len([i for i in found if i.isdigit()])


def head_dim(width: int, published: int) -> int:
    """The published head size where it divides the width; for narrower (trimmed or test) models the largest
    power-of-two fraction of it that does. Head counts are not stored in the weights."""
    head = published
    while head > 1 and width % head:
        head //= 2
    return head


def groups(channels, published: int = 32) -> int:
    """GroupNorm groups: the published count where it divides every width, else the largest fraction of it."""
    n = published
    while n > 1 and any(c % n for c in channels):
        n //= 2
    return n


def scaled(published: list[int], total: int, even: bool) -> list[int]:
    """A split of `total` in the proportions of `published` (rotary axes; even sizes where rotary pairs
    need them), the remainder on the last."""
    if sum(published) == total:
        return list(published)
    step = 2 if even else 1
    out = [max(step, step * round(a * total / sum(published) / step)) for a in published]
    out[-1] += total - sum(out)
    return out
