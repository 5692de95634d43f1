"""The zimage family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen_text_common, qwen_tokenizer, vae_kl

# Z-Image shapes per size; "small" is sized like small FLUX.1 (its VAE decoder supplies most of the time).
_ZIMAGE_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"dim": 32, "heads": 2, "axes": [4, 6, 6], "vae": (8, 16, 16, 16)},
    "small": {"dim": 96, "heads": 4, "axes": [4, 10, 10], "vae": (112, 32, 16, 16)},
}


def _zimage(seed: Seeder, size: str) -> Any:
    """Z-Image-Turbo-like: one single-stream transformer (noise and context refiners, then joint layers), the
    Qwen3 text encoder (its second-to-last hidden state), FLUX.1's 16-channel VAE layout (here 4 channels)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    shape = _ZIMAGE_SIZES[size]
    tok = qwen_tokenizer()
    hidden, latent = 32, 4
    text_config = Qwen3Config(
        **qwen_text_common(len(tok), hidden),
        num_hidden_layers=2,
        head_dim=16,
        tie_word_embeddings=True,
        use_cache=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    transformer = seed(
        "transformer",
        lambda: ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=latent,
            dim=shape["dim"],
            n_layers=2,
            n_refiner_layers=1,
            n_heads=shape["heads"],
            n_kv_heads=shape["heads"],
            cap_feat_dim=hidden,
            axes_dims=shape["axes"],  # sums to the head width, as the published [32, 48, 48] to 128
            axes_lens=[1024, 512, 512],
        ),
    )
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
        vae=vae_kl(
            seed,
            latent,
            shape["vae"],
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=seed("text_encoder", lambda: Qwen3Model(text_config)),
        tokenizer=tok,
        transformer=transformer,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"zimage": _zimage}
SIZES: tuple[str, ...] = ("tiny", "small")


# Its tiny ControlNets (Apply ControlNet) by name: (diffusers class, changes to the config taken from the
# tiny pipeline's denoiser); tiny_models.build_tiny_controlnet builds them
CONTROLNETS: dict[str, tuple[str, dict[str, Any]]] = {
    # Z-Image-Turbo-Fun-Controlnet-Union 2.1 (control refiner blocks; reads image and mask too: 2 × 4 + 1 channels)
    # and 1.0 (plain refiner blocks, the control image only); control layers evenly over the transformer's 2
    "zimage": ("ZImageControlNetModel", {"control_layers_places": [0, 1], "control_refiner_layers_places": [0],
                                                   "add_control_noise_refiner": "control_noise_refiner",
                                                   "control_in_dim": 9}),
    "zimage-1.0": ("ZImageControlNetModel", {"control_layers_places": [0], "control_refiner_layers_places": [],
                                                       "add_control_noise_refiner": None, "control_in_dim": 4}),
}
