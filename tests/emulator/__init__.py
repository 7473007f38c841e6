"""Local stand-ins for the Alibaba Cloud services paiexp talks to: OSS and the PAI control plane."""

from .emulator import Emulator

__all__ = ["Emulator"]
