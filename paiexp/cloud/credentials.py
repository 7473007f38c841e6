"""Alibaba Cloud credentials: the environment first, then the SDK's default chain.

Never read from a config file of paiexp's and never logged: only the AccessKey ID's last four
characters ever appear in a message.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from paiexp.errors import UserError

ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"


def credential_client() -> Any:
    """An ``alibabacloud_credentials`` client; UserError when no credentials can be found."""
    from alibabacloud_credentials.client import Client
    from alibabacloud_credentials.exceptions import CredentialException
    from alibabacloud_credentials.models import Config

    key_id, secret = os.environ.get(ACCESS_KEY_ID), os.environ.get(ACCESS_KEY_SECRET)
    token = os.environ.get(SECURITY_TOKEN)
    if key_id and secret:  # the common case: no provider chain (it probes ECS metadata)
        config = Config(
            type="sts" if token else "access_key",
            access_key_id=key_id,
            access_key_secret=secret,
            security_token=token,
        )
        return Client(config)
    # The chain logs every provider that finds nothing, with tracebacks: our one line says it.
    logging.getLogger("credentials").setLevel(logging.CRITICAL)
    try:
        client = Client()
        client.get_credential()
    except CredentialException:
        raise UserError(
            f"no Alibaba Cloud credentials: set {ACCESS_KEY_ID} and {ACCESS_KEY_SECRET} "
            f"(and {SECURITY_TOKEN} for STS), or configure the Alibaba Cloud CLI profile"
        ) from None
    return client


def describe_key(client: Any) -> str:
    """``AccessKey ...abcd``: enough to tell keys apart, never enough to use one."""
    key_id = client.get_credential().access_key_id or ""
    return f"AccessKey ...{key_id[-4:]}" if key_id else "the configured credentials"
