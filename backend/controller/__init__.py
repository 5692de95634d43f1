"""The controller: what runs in ComfyUI's own process.

It describes and checks pipelines (models, plans), finds the device without starting any runtime (devices),
starts and talks to the worker group (launcher, link, group), and offers all of it to the nodes (api). It
never imports torch's device runtime (TorchTPU) or diffusers at import time, and never loads weights; a test
holds it to that.
"""
