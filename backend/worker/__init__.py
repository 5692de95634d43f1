"""The worker: one process per chip, started by the controller's launcher (`python -m backend.worker`).

It binds its device, joins torch.distributed, then serves the controller's requests over its channel:
loading (loading), running pipelines in an execution mode (runtime), compiling (compiler, compile_cache),
and tensor parallelism (parallel). TorchTPU is imported only here (device). It never imports the controller.
"""
