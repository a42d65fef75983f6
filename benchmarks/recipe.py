"""The baseline: MindSpore's migration-guide recipe for a PyTorch checkpoint, as written there.

    python benchmarks/recipe.py SRC.pth OUT.ckpt [--resnet]

MindSpore's FAQ ("How do I load a pre-trained PyTorch model for fine-tuning on
MindSpore?", https://www.mindspore.cn/docs/en/r2.2/faq/usage_migrate_3rd.html) and its
migration guide's weight-conversion example do this: ``torch.load`` the ``.pth``, loop
over the state dict, rename what differs (BatchNorm parameters, picked by the substrings
``bn`` and ``downsample.1``, through a ``gamma``/``beta``/``moving_mean``/
``moving_variance`` dictionary; a hand dictionary for the rest), wrap each tensor as
``ms.Tensor(value.numpy())`` into a list of ``{"name", "data"}``, and
``ms.save_checkpoint`` the list. The guide's longer variant also builds the MindSpore
network to compare shapes; this one does not (cheaper for the recipe).

``--resnet`` applies the ResNet dictionary (``downsample`` -> ``down_sample_layer``,
``fc`` -> ``end_point``) and the BatchNorm renames; without it names are kept (the
synthetic cases). Nothing is checked. This file is the baseline ms-port is measured
against, so it stays as plain as the guide's code.
"""

import argparse

import mindspore as ms
import torch

BN_PT2MS = {"weight": "gamma", "bias": "beta",
            "running_mean": "moving_mean", "running_var": "moving_variance"}
RESNET = {"downsample": "down_sample_layer", "fc": "end_point"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--resnet", action="store_true",
                        help="apply the BatchNorm renames and the ResNet dictionary")
    args = parser.parse_args()

    par_dict = torch.load(args.src, map_location="cpu")
    params_list = []
    for name in par_dict:
        parameter = par_dict[name]
        if "num_batches_tracked" in name:  # MindSpore's BatchNorm has no step counter
            continue
        if args.resnet:
            parts = name.split(".")
            if "bn" in name or "downsample.1" in name:  # the guide's BatchNorm test
                parts[-1] = BN_PT2MS[parts[-1]]
            name = ".".join(RESNET.get(p, p) for p in parts)
        params_list.append({"name": name, "data": ms.Tensor(parameter.numpy())})
    ms.save_checkpoint(params_list, args.out)


if __name__ == "__main__":
    main()
