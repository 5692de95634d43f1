"""What the controller (ComfyUI's process) and the workers (one process per chip) share, and nothing else:
the pipeline descriptions (`spec`), the messages (`messages`), every COMFYUI_TPU_* setting (`settings`), the
errors that cross the link (`errors`), and how arrays travel (`handoff`). Pure Python and numpy: no torch, no diffusers.
"""
