#!/usr/bin/env bash
# The torch variant of the test image, for the DDP example in containers (backend=docker,
# the PAI emulator): the xgb image of build.sh (built first if missing) with Debian's
# python3-torch (PyTorch 1.13, torchrun) added in a chroot of its file system, imported into
# the local Docker engine as paiexp-test/bookworm-torch:<hash of both scripts>. No registry:
# the packages come from Debian's archive, on the host's network. Built once per machine
# (an image with that tag already there is kept). Prints the tag. Needs root and docker.
#
#   bash tests/images/build-torch.sh      # PAIEXP_DEBIAN_MIRROR overrides debootstrap's mirror
set -euo pipefail

here=$(dirname "${BASH_SOURCE[0]}")
TAG=paiexp-test/bookworm-torch:$(cat "$here/build.sh" "$here/import.sh" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
source "$here/import.sh"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi
base=$(bash "$here/build.sh")
started=$SECONDS
rootfs=$(mktemp -d /var/tmp/paiexp-rootfs.XXXXXX)
container=$(docker create "$base" /bin/true)
trap 'rm -rf "$rootfs"; docker rm -f "$container" >/dev/null 2>&1 || true' EXIT
docker export "$container" | tar -C "$rootfs" -x
# debootstrap left the archive it used in sources.list, unless the environment names one.
if [ -n "${PAIEXP_DEBIAN_MIRROR:-}" ]; then
  echo "deb $PAIEXP_DEBIAN_MIRROR bookworm main" >"$rootfs/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" apt-get update -q >&2
chroot "$rootfs" apt-get install -y -q --no-install-recommends python3-torch >&2
import_rootfs "$rootfs" "$TAG"
echo "built $TAG in $((SECONDS - started)) s" >&2
echo "$TAG"
