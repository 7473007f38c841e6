"""A fake OpenPAI cluster for backend=openpai's tests: its rest-server over real HTTP, each
job's task role instances real Docker containers of the test image."""

from .server import OpenPaiServer

__all__ = ["OpenPaiServer"]
