#!/usr/bin/env bash
# Builds the two container images, vm-dhcp-controller and vm-dhcp-agent, without a daemon.
#
# Each image holds one static, stripped binary (target x86_64-unknown-linux-musl, cargo profile
# `image`) and the LICENSE on an empty base (images/<name>/Containerfile), built with buildah
# into a private storage directory that is removed on exit, and written as an OCI archive that
# `ctr images import` and `podman load` accept. Reproducible: the same commit and Rust toolchain
# give the same digests (paths remapped in the binaries; file and creation times set to the
# commit's time, SOURCE_DATE_EPOCH).
#
# Usage: scripts/build-images.sh [--tag TAG] [--repository-prefix PREFIX] [--out DIR] [--rebuild]
#                               [--binaries-only]
#   --tag TAG                 image tag (default: the chart's appVersion, chart/Chart.yaml)
#   --repository-prefix P     images are P/vm-dhcp-controller and P/vm-dhcp-agent
#                             (default: ghcr.io/vmdhcp, the chart's default repositories)
#   --out DIR                 where the archives go (default: <cargo target dir>/images)
#   --rebuild                 recompile the workspace's own crates first, so that a second build
#                             shows the binaries, not only the images, come out the same
#   --binaries-only           build the two binaries as the images hold them and print their
#                             directory, no images (the DHCP load benchmarks measure the image's
#                             agent this way; buildah is not needed)
# Prints one line per image (reference, manifest digest, sizes, archive) and writes the same as
# tab-separated values to DIR/images.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

TARGET=x86_64-unknown-linux-musl
PROFILE=image
IMAGES=(vm-dhcp-controller vm-dhcp-agent)
declare -A PACKAGE=([vm-dhcp-controller]=vmdhcp-controller [vm-dhcp-agent]=vmdhcp-agent)

log() { printf '[build-images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

tag="" prefix="ghcr.io/vmdhcp" out="" rebuild=0 binaries_only=0
while (($#)); do
  case "$1" in
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --repository-prefix) prefix="${2:?--repository-prefix needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    --binaries-only) binaries_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

# --- What the build needs; each missing piece says how to get it.
missing=()
command -v cargo >/dev/null 2>&1 || missing+=("cargo (Rust: https://rustup.rs, or scripts/install-deps.sh)")
command -v musl-gcc >/dev/null 2>&1 || missing+=("musl-gcc (apt-get install musl-tools)")
((binaries_only)) || command -v buildah >/dev/null 2>&1 || missing+=("buildah (apt-get install buildah)")
command -v python3 >/dev/null 2>&1 || missing+=("python3 (apt-get install python3)")
command -v git >/dev/null 2>&1 || missing+=("git (apt-get install git)")
if command -v rustc >/dev/null 2>&1 \
   && [ ! -d "$(rustc --print sysroot)/lib/rustlib/$TARGET/lib" ]; then
  missing+=("the Rust target $TARGET (rustup target add $TARGET)")
fi
if ((${#missing[@]})); then
  log "missing: "; printf '  - %s\n' "${missing[@]}" >&2
  die "install the above (scripts/install-deps.sh installs all of it) and run again"
fi

[ -n "$tag" ] || tag="$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"]*\)"\{0,1\}[[:space:]]*$/\1/p' chart/Chart.yaml)"
[ -n "$tag" ] || die "no --tag given and no appVersion in chart/Chart.yaml"
target_dir="$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
out="${out:-$target_dir/images}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# A failed build must not leave the previous build's list behind for the tests to find.
rm -f "$out/images.tsv"

# --- Inputs that end up in the images: the commit, its time (SOURCE_DATE_EPOCH, default the
# commit's), the toolchain.
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  revision="$revision-dirty"
fi
# Not exported: cc-rs reruns build scripts (ring's) whenever it changes, and the binaries do not
# depend on it; only the image's file and creation times do.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
source_url="$(sed -n 's/^repository[[:space:]]*=[[:space:]]*"\(.*\)"/\1/p' Cargo.toml | head -n1)"
rustc_version="$(rustc --version)"

# --- The binaries. Paths of the checkout, of the target directory (generated code is included
# from OUT_DIR there, wherever CARGO_TARGET_DIR points) and of the cargo home are remapped, so
# the binaries do not depend on where they were built (the last matching prefix wins: the
# default target/ gets the same name either way). RUSTFLAGS from the caller would replace
# these, so unset.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS SOURCE_DATE_EPOCH
export CC_x86_64_unknown_linux_musl=musl-gcc
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="--remap-path-prefix=$root=/vmdhcp --remap-path-prefix=$target_dir=/vmdhcp/target --remap-path-prefix=$cargo_home=/cargo"
cargo_args=(--locked --profile "$PROFILE" --target "$TARGET")
for name in "${IMAGES[@]}"; do cargo_args+=(-p "${PACKAGE[$name]}" --bin "$name"); done
started=$SECONDS
if ((rebuild)); then
  log "cleaning the workspace crates' $PROFILE/$TARGET artifacts (--rebuild)"
  cargo clean --profile "$PROFILE" --target "$TARGET" \
    -p vmdhcp-proto -p vmdhcp-core -p vmdhcp-leader -p vmdhcp-telemetry \
    -p vmdhcp-controller -p vmdhcp-agent >&2 \
    || die "${IMAGES[*]}: cargo clean failed"
fi
log "cargo build ${cargo_args[*]}"
cargo build "${cargo_args[@]}" >&2 \
  || die "${IMAGES[*]}: building the static binaries (cargo build ${cargo_args[*]}) failed; see above"
bin_dir="$target_dir/$TARGET/$PROFILE"
log "binaries ready in $((SECONDS - started)) s"
if ((binaries_only)); then echo "$bin_dir"; exit 0; fi

# --- The images, in a buildah storage of our own, removed on every exit path.
work="$(mktemp -d "${TMPDIR:-/tmp}/vmdhcp-images.XXXXXX")"
cleanup() {
  # Nothing is mounted with vfs and COPY-only builds; unmount anyway should a killed run leave one.
  grep -o " $work/[^ ]*" /proc/self/mounts 2>/dev/null | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
buildah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)

# step IMAGE WHAT COMMAND...: runs COMMAND; on failure names the image and the step, with its output.
step() {
  local image="$1" what="$2"; shift 2
  local steplog="$work/step.log"
  if ! "$@" >"$steplog" 2>&1; then
    log "error: $image: $what failed:"
    tail -n 40 "$steplog" >&2
    exit 1
  fi
}

: >"$work/images.tsv"
for name in "${IMAGES[@]}"; do
  ref="$prefix/$name:$tag"
  ctx="$work/context-$name"
  mkdir -p "$ctx"
  [ -x "$bin_dir/$name" ] || die "$name: $bin_dir/$name missing after cargo build"
  # Fixed modes and times: the layer must not depend on the checkout's umask or file times.
  install -m 0755 "$bin_dir/$name" "$ctx/$name"
  install -m 0644 LICENSE "$ctx/LICENSE"
  touch -d "@$epoch" "$ctx/$name" "$ctx/LICENSE"
  archive="$out/$name-$tag.oci.tar"
  rm -f "$archive"
  step "$name" "buildah build (images/$name/Containerfile)" \
    "${buildah[@]}" build --isolation chroot --platform linux/amd64 --pull=false \
      --timestamp "$epoch" \
      --build-arg "VERSION=$tag" --build-arg "REVISION=$revision" \
      --build-arg "SOURCE=$source_url" --build-arg "RUSTC=$rustc_version" \
      -f "$root/images/$name/Containerfile" -t "$ref" "$ctx"
  step "$name" "buildah push to oci-archive:$archive" \
    "${buildah[@]}" push --digestfile "$work/$name.digest" "$ref" "oci-archive:$archive:$ref"
  binary_sha="$(sha256sum "$ctx/$name" | cut -d' ' -f1)"
  # Sizes from the archive itself: what a registry transfers (config + compressed layers) and
  # what the image takes unpacked (uncompressed layers).
  step "$name" "reading the archive" python3 - "$archive" "$work/$name.sizes" <<'PY'
import gzip, json, sys, tarfile
archive, dest = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as tar:
    blob = lambda d: tar.extractfile("blobs/" + d.replace(":", "/")).read()
    index = json.loads(tar.extractfile("index.json").read())
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    compressed = manifest["config"]["size"] + sum(l["size"] for l in manifest["layers"])
    unpacked = sum(len(gzip.decompress(blob(l["digest"])) if l["mediaType"].endswith("gzip") else blob(l["digest"])) for l in manifest["layers"])
    open(dest, "w").write(f"{index['manifests'][0]['digest']}\t{compressed}\t{unpacked}\n")
PY
  IFS=$'\t' read -r digest compressed unpacked <"$work/$name.sizes"
  [ "$digest" = "$(cat "$work/$name.digest")" ] \
    || die "$name: the archive's manifest $digest is not the pushed digest $(cat "$work/$name.digest")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$ref" "$digest" "$compressed" "$unpacked" \
    "$binary_sha" "$archive" >>"$work/images.tsv"
done
cp "$work/images.tsv" "$out/images.tsv"

mb() { awk -v b="$1" 'BEGIN { printf "%.1f MB", b / 1000000 }'; }
while IFS=$'\t' read -r name ref digest compressed unpacked _ archive; do
  printf '%s\n  digest %s\n  size %s compressed, %s unpacked\n  archive %s\n' \
    "$ref" "$digest" "$(mb "$compressed")" "$(mb "$unpacked")" "$archive"
done <"$out/images.tsv"
log "done in $((SECONDS - started)) s (revision $revision, SOURCE_DATE_EPOCH $epoch, $rustc_version)"
