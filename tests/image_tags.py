"""The tags the build scripts of tests/images give their images: the one computation the tests
and the benchmarks share (a copy of it would go stale when a script starts hashing another)."""

from __future__ import annotations

import hashlib
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"


def image_tag(repository: str, *scripts: str) -> str:
    """The tag a build script gives its image: the hash of ``scripts``, in the order it
    reads them (it changes whenever one of them does)."""
    digest = hashlib.sha256(b"".join((IMAGES / name).read_bytes() for name in scripts))
    return f"{repository}:{digest.hexdigest()[:12]}"


def docker_image_tag() -> str:
    """The tag build.sh gives the image."""
    return image_tag("paiexp-test/bookworm-xgb", "build.sh", "import.sh")


def torch_image_tag() -> str:
    """The tag build-torch.sh gives its image."""
    return image_tag("paiexp-test/bookworm-torch", "build.sh", "import.sh", "build-torch.sh")


def mlflow_image_tag() -> str:
    """The tag build-mlflow.sh gives its image."""
    return image_tag("paiexp-test/bookworm-mlflow", "build.sh", "import.sh", "build-mlflow.sh")


def hydra_image_tag() -> str:
    """The tag build-hydra.sh gives its image."""
    return image_tag("paiexp-test/bookworm-hydra", "build.sh", "import.sh", "build-hydra.sh")
