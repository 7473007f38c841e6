"""Official PAI training images (AIWorkspace ListImages), for picking a job's ``image``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paiexp.backends.pai_api import PAGE_SIZE, PaiApi
from paiexp.errors import UserError

CHIP_TYPES = ("CPU", "GPU")
# What listing images needs: the AIWorkspace client and Alibaba Cloud credentials.
SDK_MODULES = (
    "alibabacloud_aiworkspace20210204",
    "alibabacloud_tea_openapi",
    "alibabacloud_credentials",
)


def require_sdk() -> None:
    """A one-line UserError, not a traceback, when the ``[pai]`` extra is not installed."""
    import importlib

    missing = []
    for module in SDK_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise UserError(f"paiexp images needs {', '.join(missing)}: pip install 'paiexp[pai]'")


@dataclass(frozen=True)
class Image:
    uri: str
    name: str
    framework: str
    python: str
    chip: str


def official_images(api: PaiApi, framework: str | None, chip: str | None) -> list[Image]:
    """Official training images (supported by DLC), optionally of one framework and chip type.

    The chip type is filtered by the service; the framework by label value or name,
    case-insensitively, so ``xgboost`` finds ``XGBoost 1.6.0`` images.
    """
    labels = ["system.official=true", "system.supported.dlc=true"]
    if chip:
        labels.append(f"system.chipType={chip}")
    images: list[Image] = []
    page = 1
    while True:
        batch, total = api.list_images(",".join(labels), None, page)
        images.extend(_image(item) for item in batch)
        if not batch or page * PAGE_SIZE >= total:
            break
        page += 1
    if framework:
        wanted = framework.lower()
        images = [i for i in images if wanted in i.framework.lower() or wanted in i.name.lower()]
    return sorted(images, key=lambda i: (i.framework.lower(), i.chip, i.uri))


def _image(item: dict[str, Any]) -> Image:
    labels = {label.get("Key"): label.get("Value", "") for label in item.get("Labels") or []}
    return Image(
        uri=str(item.get("ImageUri") or ""),
        name=str(item.get("Name") or ""),
        framework=str(labels.get("system.framework") or ""),
        python=str(labels.get("system.pythonVersion") or ""),
        chip=str(labels.get("system.chipType") or ""),
    )
