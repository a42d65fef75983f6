"""The conversion recipe from MindSpore's migration guide, as faithfully as we can write it.

    python benchmarks/recipe.py SRC.pth OUT.ckpt [--resnet]

torch.load the state dict, rename BatchNorm tensors by substring and the rest with a
hand dictionary, wrap each tensor in ``ms.Tensor``, and ``ms.save_checkpoint`` the list.
This is the baseline ms-port is measured against; it checks nothing.
"""

import argparse

import mindspore as ms
import torch

BN = {"running_mean": "moving_mean", "running_var": "moving_variance",
      "weight": "gamma", "bias": "beta"}
RESNET = {"downsample": "down_sample_layer", "fc.": "end_point."}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--resnet", action="store_true", help="apply the ResNet dictionary")
    args = parser.parse_args()
    state = torch.load(args.src, map_location="cpu")
    params = []
    for name, value in state.items():
        if "num_batches_tracked" in name:
            continue
        if args.resnet:
            for old, new in RESNET.items():
                name = name.replace(old, new)
            if ".bn" in name or name.startswith("bn") or "down_sample_layer.1" in name:
                for old, new in BN.items():
                    name = name.replace(old, new)
        params.append({"name": name, "data": ms.Tensor(value.numpy())})
    ms.save_checkpoint(params, args.out)


if __name__ == "__main__":
    main()
