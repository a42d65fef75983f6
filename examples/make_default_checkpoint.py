"""Build the bundled default input: a torchvision ResNet50 with seeded random weights.

    python examples/make_default_checkpoint.py [OUT.pth] [--arch NAME] [--seed N]

No download: the weights come from torchvision's own initialisation, seeded, with
BatchNorm statistics estimated on a few seeded batches, as training does — so rounding
is what a trained network's is, and a wrong mapping shows in verify.
"""

from __future__ import annotations

import argparse

from ms_port.testing import save_reference_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default="demo/resnet50.pth")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = save_reference_checkpoint(args.arch, args.output, seed=args.seed, bn_from_data=True)
    print(f"wrote {path} ({args.arch}, seed {args.seed})")


if __name__ == "__main__":
    main()
