"""Command line: `python -m backend make-tiny-models DIR`, `python -m backend device-info` and
`python -m backend tpu-check` (run every step on this host's chips and print a report for a bug report)."""

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
    args = parser.parse_args(argv)

    if args.command == "make-tiny-models":
        from .tiny_models import FAMILIES, build_all

        for name, path in build_all(args.dir, args.families or FAMILIES).items():
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
