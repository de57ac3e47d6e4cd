# Sourced by the packaging scripts: podman and buildah with their state under
# target/containers (never /etc/containers), vfs storage (no overlay mounts needed), runc
# (crun fails on hybrid cgroups) and open-file and process limits this kind's hard limits
# allow (podman asks for more by default and the container fails to start).
containers_root="$(pwd)/target/containers"
mkdir -p "$containers_root"
cat > "$containers_root/storage.conf" <<CONF
[storage]
driver = "vfs"
runroot = "$containers_root/run"
graphroot = "$containers_root/storage"
CONF
cat > "$containers_root/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_STORAGE_CONF="$containers_root/storage.conf"
export CONTAINERS_CONF="$containers_root/containers.conf"

# The Debian mirror apt uses here, for mmdebstrap (a base image cannot be pulled).
debian_mirror() {
    local uri
    uri="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    if [ -z "$uri" ]; then
        uri="$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    fi
    echo "${uri:?no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list}"
}

# Imports a root file system made by mmdebstrap as image $1 unless it exists with the same
# recipe ($2: a string whose change rebuilds it); the rest are mmdebstrap's arguments.
debian_base() {
    local image="$1" recipe="$2"
    shift 2
    local stamp
    stamp="$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"
    if [ "$(podman image inspect --format '{{index .Labels "herald.base.recipe"}}' "$image" 2>/dev/null)" = "$stamp" ]; then
        return
    fi
    local tar="$containers_root/base-$stamp.tar"
    echo "making $image from Debian packages (mmdebstrap)" >&2
    mmdebstrap --quiet --mode=root "$@" bookworm "$tar" "$(debian_mirror)"
    podman import --quiet --change "LABEL herald.base.recipe=$stamp" "$tar" "$image" >/dev/null
    rm -f "$tar"
}
