"""Command line: `python -m backend make-tiny-models DIR`, `device-info`, `tpu-check` (run every step on this
host's chips and print a report for a bug report), and for several hosts `make-secret` and `join HOST0[:PORT]`
(run on every host of a slice but the one with ComfyUI)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backend", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny-models", help="build tiny random-weight pipelines (offline) into DIR")
    tiny.add_argument("dir")
    tiny.add_argument("--families", nargs="*", default=None, help="subset of families (default: all)")
    sub.add_parser("device-info", help="print the detected device (never starts a TPU runtime)")
    check = sub.add_parser("tpu-check", help="run every step on this host's chips (a tiny model) and print a "
                                              "report to paste into a bug report; exit 1 when a step fails")
    check.add_argument("--device", default="auto", choices=("auto", "tpu", "cuda", "cpu"))
    check.add_argument("--models", help="folder for the tiny model (default: a temporary folder)")
    check.add_argument("--compile-backend", help="torch.compile backend (default: tpu on TPU, inductor on CUDA, "
                                                 "aot_eager on the CPU)")
    check.add_argument("--out", help="also write the report to this file")
    secret = sub.add_parser("make-secret", help="write a new cluster secret file (readable by its owner only)")
    secret.add_argument("path", nargs="?", default=None, help="default: $COMFYUI_TPU_CLUSTER_SECRET or "
                        "~/.config/comfyui-tpu/cluster-secret")
    join = sub.add_parser("join", help="join this host's chips to the worker groups of the ComfyUI on HOST0")
    join.add_argument("controller", help="host 0's address as the other hosts reach it, HOST[:PORT] (port 29470)")
    join.add_argument("--secret-file", default=None, help="the cluster secret (default: as make-secret)")
    join.add_argument("--device", default="auto", choices=("auto", "tpu", "cuda", "cpu"))
    join.add_argument("--procs", type=int, default=None, help="worker processes on this host (default: its chips, "
                      "or $COMFYUI_TPU_PROCS_PER_HOST; 1 on a CPU host)")
    args = parser.parse_args(argv)

    if args.command == "make-secret":
        from pathlib import Path

        from .controller import hosts

        path = Path(args.path).expanduser() if args.path else hosts.cluster_from_env().secret_file
        print(hosts.make_secret(path))
        return 0
    if args.command == "join":
        from .controller import host_agent

        return host_agent.main(args.controller, args.secret_file, args.device, args.procs)

    if args.command == "make-tiny-models":
        from .tiny_models import FAMILIES, MORE, build_all

        for name, path in build_all(args.dir, args.families or FAMILIES + MORE).items():
            print(f"{name}: {path}")
    elif args.command == "device-info":
        from dataclasses import asdict

        from .controller.devices import detect

        print(json.dumps(asdict(detect()), indent=1))
    elif args.command == "tpu-check":
        from .tpu_check import main as tpu_check

        return tpu_check(args.device, args.models, args.compile_backend, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
