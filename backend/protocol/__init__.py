"""What the controller (ComfyUI's process) and the workers (one process per chip) share, and nothing else:
the pipeline descriptions (`spec`), the messages and environment names (`messages`), the errors that cross
the link (`errors`), and how arrays travel (`handoff`). Pure Python and numpy: no torch, no diffusers.
"""
