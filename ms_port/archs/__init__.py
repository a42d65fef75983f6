"""Built-in architectures and the registry that holds them."""

from .registry import Arch, get_arch, list_archs, register_arch

__all__ = ["Arch", "get_arch", "list_archs", "register_arch"]
