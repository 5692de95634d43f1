"""Artists' own model files, as ComfyUI keeps them (checkpoints, diffusion models, text encoders, VAEs), by job:
`headers` reads a file's header (never a tensor), `recognise` tells what it holds, `listing` lists and resolves
ComfyUI's folders, `assemble` checks the chosen files make one pipeline and describes it. What differs between
families lives in backend/families. Controller side: never imports torch.
"""
