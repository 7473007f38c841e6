# Sourced by build.sh and build-torch.sh: import_rootfs ROOTFS TAG makes a Debian file system
# small (no package caches, lists, documentation, locales or test suites) and imports it into
# the local Docker engine as TAG.
import_rootfs() {
  local rootfs=$1 tag=$2
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/tmp/* "$rootfs"/etc/resolv.conf
  find "$rootfs"/usr/lib/python3/dist-packages -depth -type d -name tests -exec rm -rf {} +
  tar -C "$rootfs" --numeric-owner -c . \
    | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >&2
}
