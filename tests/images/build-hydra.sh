#!/usr/bin/env bash
# The hydra variant of the test image, for Hydra apps whose multirun jobs run in containers
# (hydra/launcher=paiexp with backend=docker): the xgb image of build.sh (built first if
# missing) with Hydra, OmegaConf, cloudpickle (a task function shipped by value) and Optuna
# (hydra-optuna-sweeper's example apps import it, as their images would have it) at the
# host's test versions, installed from wheels built or downloaded on the host (Debian packages
# no Hydra; pip inside a chroot or container has no working TLS), in a chroot of its file
# system, imported into the local Docker engine as paiexp-test/bookworm-hydra:<hash of the
# scripts>. Never paiexp: a job's code must run without it. Built once per machine (an image
# with that tag already there is kept). Prints the tag. Needs root, docker and python3 with venv.
#
#   bash tests/images/build-hydra.sh
set -euo pipefail

WHEELS="hydra-core==1.3.8 omegaconf==2.3.1 cloudpickle==3.1.3 PyYAML==6.0.2 packaging==24.2
  optuna==5.0.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 MarkupSafe==3.0.4 colorlog==6.12.0
  tqdm==4.70.1 typing_extensions==4.16.0"  # Optuna's numpy: Debian's, in the xgb image
SDISTS="antlr4-python3-runtime==4.9.3"  # Hydra's parser runtime: PyPI has no wheel of it
here=$(dirname "${BASH_SOURCE[0]}")
TAG=paiexp-test/bookworm-hydra:$(cat "$here/build.sh" "$here/import.sh" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
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
# The image's Python is bookworm's 3.11: wheels for CPython 3.11 on x86_64 Linux, fetched (or
# built, for a pure-Python sdist) by a pip of the host's own.
python3 -m venv "$work/venv" >&2
"$work/venv/bin/pip" download -q --no-deps --only-binary=:all: --dest "$rootfs/tmp/wheels" \
  --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 $WHEELS >&2
"$work/venv/bin/pip" wheel -q --no-deps --wheel-dir "$rootfs/tmp/wheels" $SDISTS >&2
chroot "$rootfs" python3 -m pip install -q --no-index --find-links /tmp/wheels \
  --break-system-packages --root-user-action=ignore hydra-core cloudpickle optuna >&2
rm -rf "$rootfs/tmp/wheels"
chroot "$rootfs" python3 -c 'import hydra, cloudpickle, omegaconf, optuna' >&2
if chroot "$rootfs" python3 -c 'import paiexp' 2>/dev/null; then
  echo "the hydra test image must not have paiexp" >&2
  exit 1
fi
import_rootfs "$rootfs" "$TAG"
echo "built $TAG in $((SECONDS - started)) s" >&2
echo "$TAG"
