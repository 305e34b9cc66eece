"""The main job (``make demo``): compile the built-in MobileNetV2 (224x224, width 1.0) for
Cortex-M55 and run it on an emulated Cortex-M55 (QEMU mps3-an547), proving the C matches the
Python reference byte for byte.

    python -m corten.demo [--model mv2] [--target cortex-m55] [--out build/mv2]
"""
from __future__ import annotations

import argparse
import sys

from corten import cli


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m corten.demo", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mv2")
    p.add_argument("--target", default="cortex-m55")
    p.add_argument("--out", default="build/mv2")
    args = p.parse_args(argv)
    print(f"== corten compile {args.model} --target {args.target} --out {args.out} --emit-c", flush=True)
    rc = cli.main(["compile", args.model, "--target", args.target, "--out", args.out, "--emit-c"])
    if rc:
        return rc
    print(f"\n== corten run {args.out} --on qemu", flush=True)
    return cli.main(["run", args.out, "--on", "qemu"])


if __name__ == "__main__":
    sys.exit(main())
