"""torchvision's ResNets into ms-port's built-in MindSpore ResNets."""
