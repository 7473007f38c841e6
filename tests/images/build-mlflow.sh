#!/usr/bin/env bash
# The mlflow variant of the test image, for scripts that make their own MLflow calls in
# containers (backend=docker, the PAI emulator): the xgb image of build.sh (built first if
# missing) with Debian's python3-sklearn (MLflow's xgboost autolog patches its scikit-learn
# API too) and mlflow-skinny with its dependencies, installed from wheels downloaded on the
# host (Debian packages no MLflow; pip inside a chroot or container has no working TLS), in a
# chroot of its file system, imported into the local Docker engine as
# paiexp-test/bookworm-mlflow:<hash of the scripts>. Built once per machine (an image with
# that tag already there is kept). Prints the tag. Needs root, docker and python3 with venv.
#
#   bash tests/images/build-mlflow.sh     # PAIEXP_DEBIAN_MIRROR overrides debootstrap's mirror
set -euo pipefail

MLFLOW_VERSION=3.17.2
here=$(dirname "${BASH_SOURCE[0]}")
TAG=paiexp-test/bookworm-mlflow:$(cat "$here/build.sh" "$here/import.sh" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
source "$here/import.sh"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"
  exit 0
fi
base=$(bash "$here/build.sh")
started=$SECONDS
work=$(mktemp -d /var/tmp/paiexp-rootfs.XXXXXX)
rootfs=$work/rootfs
container=$(docker create "$base" /bin/true)
trap 'rm -rf "$work"; docker rm -f "$container" >/dev/null 2>&1 || true' EXIT
mkdir "$rootfs"
docker export "$container" | tar -C "$rootfs" -x
# debootstrap left the archive it used in sources.list, unless the environment names one.
if [ -n "${PAIEXP_DEBIAN_MIRROR:-}" ]; then
  echo "deb $PAIEXP_DEBIAN_MIRROR bookworm main" >"$rootfs/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" apt-get update -q >&2
chroot "$rootfs" apt-get install -y -q --no-install-recommends python3-sklearn >&2
# The image's Python is bookworm's 3.11: wheels for CPython 3.11 on x86_64 Linux, fetched by
# a pip of the host's own.
python3 -m venv "$work/venv" >&2
"$work/venv/bin/pip" download -q --only-binary=:all: --dest "$rootfs/tmp/wheels" \
  --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "mlflow-skinny==$MLFLOW_VERSION" >&2
chroot "$rootfs" python3 -m pip install -q --no-index --find-links /tmp/wheels \
  --break-system-packages --root-user-action=ignore "mlflow-skinny==$MLFLOW_VERSION" >&2
chroot "$rootfs" python3 -c 'import mlflow.xgboost, sklearn' >&2
import_rootfs "$rootfs" "$TAG"
echo "built $TAG in $((SECONDS - started)) s" >&2
echo "$TAG"
