"""The controller: what runs in ComfyUI's own process.

It describes pipelines (models, files/, components) and plans how they run (capacity, layouts, offload,
compile_plan, sampling_options, loras; resolve checks the whole once per request), finds the device without
starting any runtime (devices), starts and talks to the worker group (launcher, link, group, hosts, warm_start),
keeps the last Sample's timings (latency), and offers all of it to the nodes by job (pipelines, sampling,
speed, workers; api re-exports them, the nodes' one entry point). It
never imports torch's device runtime (TorchTPU) or diffusers at import time, and never loads weights; a test
holds it to that.
"""
