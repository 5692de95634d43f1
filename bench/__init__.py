"""Benchmarks of ComfyUI-TPU against plain diffusers (bash bench/run.sh; see bench/run.py and bench/README.md)."""
