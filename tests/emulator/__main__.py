"""``python -m emulator`` (cwd ``tests/``): serve OSS + PAI until SIGTERM or SIGINT.

Prints one JSON line with the endpoints, bucket, workspace and credentials, then blocks.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path

from .common import Credentials, FaultPlan
from .emulator import Emulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator", description=__doc__)
    parser.add_argument("--root", type=Path, help="state directory (default: a new temp dir)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--pai-port", type=int, default=0)
    parser.add_argument("--oss-port", type=int, default=0)
    parser.add_argument("--bucket", default="paiexp-test")
    parser.add_argument("--region", default="cn-hangzhou")
    parser.add_argument("--workspace-id", default="ws-emulator")
    parser.add_argument("--phase-seconds", type=float, default=0.05)
    parser.add_argument("--access-key-id", default=Credentials.access_key_id)
    parser.add_argument("--access-key-secret", default=Credentials.access_key_secret)
    parser.add_argument("--security-token")
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--image-allow", help="regex of extra image URIs jobs may use")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="URI=TAG",
        help="run jobs of PAI image URI (or 'default': any) in the local Docker image TAG; "
        "repeatable (without it, jobs run as host processes)",
    )
    args = parser.parse_args(argv)
    local_images = {}
    for pair in args.image:
        uri, sep, tag = pair.partition("=")
        if not sep or not uri or not tag:
            parser.error(f"--image {pair!r}: expected URI=TAG or default=TAG")
        local_images[uri] = tag

    credentials = Credentials(args.access_key_id, args.access_key_secret, args.security_token)
    emulator = Emulator(
        args.root or Path(tempfile.mkdtemp(prefix="paiexp-emulator-")),
        credentials=credentials,
        faults=FaultPlan(rate=args.fault_rate, seed=args.fault_seed),
        phase_seconds=args.phase_seconds,
        bucket=args.bucket,
        region=args.region,
        workspace_id=args.workspace_id,
        host=args.host,
        pai_port=args.pai_port,
        oss_port=args.oss_port,
        image_allow=args.image_allow,
        local_images=local_images or None,
    )
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    with emulator:
        info = {
            "pai_endpoint": emulator.pai_endpoint,
            "oss_endpoint": emulator.oss_endpoint,
            "bucket": emulator.bucket,
            "region": emulator.region,
            "workspace_id": emulator.workspace_id,
            "access_key_id": credentials.access_key_id,
            "access_key_secret": credentials.access_key_secret,
            "security_token": credentials.security_token,
            "root": str(emulator.root),
        }
        print(json.dumps(info), flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
