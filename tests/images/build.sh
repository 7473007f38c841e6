#!/usr/bin/env bash
# The test image of backend=docker, built without any registry: a minimal Debian bookworm
# (debootstrap) with Python 3.11, XGBoost 1.7, pandas, pip and tensorboardX (the TensorBoard
# writer of the test jobs: Debian has none, so its pure-Python wheel is downloaded on the host
# and unpacked into the image, beside Debian's protobuf), imported into the local Docker
# engine as paiexp-test/bookworm-xgb:<hash of this script>. Built once per machine: an image
# with that tag already there is kept. Prints the tag. Needs root, debootstrap and docker.
#
#   bash tests/images/build.sh            # PAIEXP_DEBIAN_MIRROR overrides debootstrap's mirror
set -euo pipefail

PACKAGES="python-is-python3 python3-pip python3-numpy python3-pandas python3-xgboost python3-protobuf"
WHEELS="tensorboardX==2.6.2.2"  # its generated code needs protobuf >= 3.20: bookworm has 3.21
SUITE=bookworm
here=$(dirname "${BASH_SOURCE[0]}")
TAG=paiexp-test/bookworm-xgb:$(cat "${BASH_SOURCE[0]}" "$here/import.sh" | sha256sum | cut -c1-12)
source "$here/import.sh"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi
command -v debootstrap >/dev/null || {
  echo "build.sh needs debootstrap: apt-get install -y debootstrap" >&2
  exit 1
}

rootfs=$(mktemp -d /var/tmp/paiexp-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
started=$SECONDS
# debootstrap's own default mirror unless the environment names one.
debootstrap --variant=minbase --include=python3 "$SUITE" "$rootfs" ${PAIEXP_DEBIAN_MIRROR:+"$PAIEXP_DEBIAN_MIRROR"} >&2
# bookworm's python3-scipy (an xgboost dependency) depends on python3-pythran, a compiler
# that needs none of it at run time but pulls in ~450 MB of C++ toolchain: a stand-in
# package satisfies that dependency.
stub="$rootfs/tmp/pythran-stub"
mkdir -p "$stub/DEBIAN"
printf '%s\n' "Package: python3-pythran" "Version: 99:0-paiexp" "Architecture: all" \
  "Maintainer: paiexp" "Description: stand-in: scipy needs no pythran at run time" \
  >"$stub/DEBIAN/control"
dpkg-deb --build "$stub" "$rootfs/tmp/pythran-stub.deb" >&2
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" dpkg -i /tmp/pythran-stub.deb >&2
chroot "$rootfs" apt-get install -y -q --no-install-recommends $PACKAGES >&2
wheels=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" $WHEELS >&2
for wheel in "$wheels"/*.whl; do
  python3 -m zipfile -e "$wheel" "$rootfs/usr/lib/python3/dist-packages"
done
rm -rf "$wheels"
import_rootfs "$rootfs" "$TAG"
echo "built $TAG in $((SECONDS - started)) s" >&2
echo "$TAG"
