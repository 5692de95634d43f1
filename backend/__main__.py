"""Command line: `python -m backend make-tiny-models DIR` and `python -m backend device-info`."""

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
    args = parser.parse_args(argv)

    if args.command == "make-tiny-models":
        from .tiny_models import FAMILIES, build_all

        for name, path in build_all(args.dir, args.families or FAMILIES).items():
            print(f"{name}: {path}")
    elif args.command == "device-info":
        from dataclasses import asdict

        from .controller.devices import detect

        print(json.dumps(asdict(detect()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
