#!/usr/bin/env bash
# Build the offline stand-in of the Hugging Face PyTorch training DLC.
#
#   scripts/build-standin.sh [IMAGE_TAG]      (default: container-entry/dlc-standin:latest)
#
# Works without any container registry:
#   1. base image container-entry/debian-bookworm:latest from debootstrap + docker import
#      (skipped when the image exists);
#   2. wheels for docker/standin/requirements.txt built on the host with `python3 -m pip wheel`
#      into build/standin-wheels/wheels (skipped when they match the requirements already);
#   3. docker build of docker/standin/Dockerfile with build/standin-wheels/ as context.
# Idempotent: re-running only redoes what changed (docker's layer cache covers step 3).
#
# Environment knobs:
#   STANDIN_BASE_IMAGE   base image name      (default container-entry/debian-bookworm:latest)
#   STANDIN_MIRROR       debootstrap mirror   (default: debootstrap's own default)
#   STANDIN_PIP_ARGS     extra `pip wheel` arguments, e.g.
#                        "--extra-index-url https://download.pytorch.org/whl/cpu"
#   STANDIN_FORCE_WHEELS=1  rebuild the wheel dir from scratch
#   PYTHON               host interpreter for `pip wheel` (default python3; must be 3.11)
set -euo pipefail

IMAGE_TAG="${1:-container-entry/dlc-standin:latest}"
BASE_IMAGE="${STANDIN_BASE_IMAGE:-container-entry/debian-bookworm:latest}"
PYTHON="${PYTHON:-python3}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STANDIN_DIR="$REPO_ROOT/docker/standin"
REQS="$STANDIN_DIR/requirements.txt"
CONTEXT_DIR="$REPO_ROOT/build/standin-wheels"
WHEEL_DIR="$CONTEXT_DIR/wheels"
STAMP="$CONTEXT_DIR/.requirements.sha256"
LOG_DIR="$REPO_ROOT/build/logs"
mkdir -p "$LOG_DIR"

START=$SECONDS
log() { printf '[build-standin %4ds] %s\n' "$((SECONDS - START))" "$*"; }
die() { printf '[build-standin] ERROR: %s\n' "$*" >&2; exit 1; }
# run_logged LOGFILE REGEX CMD...: full output to LOGFILE, lines matching REGEX to the terminal.
run_logged() {
    local logfile=$1 regex=$2 rc
    shift 2
    set +e +o pipefail
    "$@" 2>&1 | tee "$logfile" | { grep -E --line-buffered "$regex" || true; } | sed -u -E 's/^(.{0,150}).*/    \1/'
    rc=${PIPESTATUS[0]}
    set -e -o pipefail
    if [ "$rc" != 0 ]; then tail -25 "$logfile" | sed 's/^/    | /' >&2; fi
    return "$rc"
}

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "docker engine not reachable (is dockerd running?)"
[ -f "$REQS" ] || die "missing $REQS"

# ---------------------------------------------------------------- 1. base image
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "1/3 base image $BASE_IMAGE exists, skipping debootstrap"
else
    command -v debootstrap >/dev/null || die "debootstrap not installed (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    ROOTFS="$(mktemp -d /tmp/standin-rootfs.XXXXXX)"
    cleanup_rootfs() { rm -rf --one-file-system "$ROOTFS"; }
    trap cleanup_rootfs EXIT
    log "1/3 debootstrap bookworm (minbase) into $ROOTFS ${STANDIN_MIRROR:+from $STANDIN_MIRROR}"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,procps,iproute2 \
        bookworm "$ROOTFS" ${STANDIN_MIRROR:+"$STANDIN_MIRROR"} \
        > "$LOG_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$LOG_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $LOG_DIR/debootstrap.log)"; }
    # Slim the rootfs a little: apt lists and caches are useless without a mirror inside.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb
    log "1/3 importing rootfs as $BASE_IMAGE"
    tar -C "$ROOTFS" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        - "$BASE_IMAGE" >/dev/null
    cleanup_rootfs
    trap - EXIT
    log "1/3 base image ready"
fi

# ---------------------------------------------------------------- 2. wheels
mkdir -p "$WHEEL_DIR"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$PYTHON is not Python 3.11 (Debian bookworm's python3 is 3.11; wheels must match)"
REQ_SUM="$( { sha256sum "$REQS" | cut -d' ' -f1; echo "${STANDIN_PIP_ARGS:-}"; } | sha256sum | cut -d' ' -f1)"
if [ "${STANDIN_FORCE_WHEELS:-0}" = 1 ]; then
    log "2/3 STANDIN_FORCE_WHEELS=1: emptying $WHEEL_DIR"
    rm -f "$WHEEL_DIR"/*.whl "$STAMP"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_SUM" ] && [ -n "$(find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' -print -quit)" ]; then
    log "2/3 wheels up to date in ${WHEEL_DIR#"$REPO_ROOT"/} ($(find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' | wc -l) files), skipping pip wheel"
else
    log "2/3 building wheels with $("$PYTHON" -m pip --version | cut -d' ' -f1-2) into ${WHEEL_DIR#"$REPO_ROOT"/}"
    # --find-links on the wheel dir: wheels already there are reused, not downloaded again.
    # shellcheck disable=SC2086
    run_logged "$LOG_DIR/pip-wheel.log" '^(Saved|Building wheel|ERROR)' \
        "$PYTHON" -m pip wheel --disable-pip-version-check --progress-bar off \
        --wheel-dir "$WHEEL_DIR" --find-links "$WHEEL_DIR" \
        -r "$REQS" ${STANDIN_PIP_ARGS:-} \
        || die "pip wheel failed (log: $LOG_DIR/pip-wheel.log)"
    echo "$REQ_SUM" > "$STAMP.tmp"
    STAMP_PENDING=1
fi

# Never ship a CUDA torch: those wheels pull multi-GB nvidia-* / triton wheels.
CUDA_WHEELS="$(find "$WHEEL_DIR" -maxdepth 1 \( -iname 'nvidia_*' -o -iname 'triton-*' -o -iname 'cuda_*' \) -printf '%f\n')"
if [ -n "$CUDA_WHEELS" ]; then
    rm -f "$STAMP" "$STAMP.tmp"
    die "CUDA wheels found (a CUDA torch was resolved): $(echo "$CUDA_WHEELS" | head -3 | tr '\n' ' ')...
       Remove them, then point pip at a CPU torch (e.g. STANDIN_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu')."
fi
TORCH_WHEEL="$(find "$WHEEL_DIR" -maxdepth 1 -name 'torch-*.whl' -printf '%f\n' | head -1)"
log "2/3 torch wheel: ${TORCH_WHEEL:-<none>}"

# Check every wheel's tags against the base image's own interpreter (bookworm python3.11).
log "2/3 checking wheel tags against $BASE_IMAGE's python3"
find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' -printf '%f\n' | docker run --rm -i --network none "$BASE_IMAGE" python3 -c '
import sys
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import parse_wheel_filename
supported = set(sys_tags())
bad = [n for n in (l.strip() for l in sys.stdin) if n and not (parse_wheel_filename(n)[3] & supported)]
print("    python %s: %s" % (sys.version.split()[0], "all wheels installable" if not bad else "NOT installable: " + " ".join(bad)))
sys.exit(1 if bad else 0)
' || { rm -f "$STAMP" "$STAMP.tmp"; die "some wheels do not fit the base image's Python"; }
if [ "${STAMP_PENDING:-0}" = 1 ]; then mv "$STAMP.tmp" "$STAMP"; fi

# ---------------------------------------------------------------- 3. image
# Stage the small files next to the wheels so the context is just this directory.
cp "$REQS" "$CONTEXT_DIR/requirements.txt"
cp "$STANDIN_DIR/entrypoint.sh" "$CONTEXT_DIR/entrypoint.sh"
log "3/3 docker build $IMAGE_TAG (context ${CONTEXT_DIR#"$REPO_ROOT"/}, $(du -sh "$CONTEXT_DIR" | cut -f1))"
run_logged "$LOG_DIR/docker-build.log" '^(Step |Successfully|ERROR|The command)|Using cache' \
    docker build --build-arg "STANDIN_BASE=$BASE_IMAGE" \
    -f "$STANDIN_DIR/Dockerfile" -t "$IMAGE_TAG" "$CONTEXT_DIR" \
    || die "docker build failed (log: $LOG_DIR/docker-build.log)"

log "3/3 smoke test"
docker run --rm --network none "$IMAGE_TAG" python -c '
import torch, transformers, accelerate, sagemaker_training, sagemaker_pytorch_container, shutil, sys
assert shutil.which("train"), "train console script missing"
print("    python %s torch %s transformers %s accelerate %s, train at %s"
      % (sys.version.split()[0], torch.__version__, transformers.__version__, accelerate.__version__, shutil.which("train")))
' || die "smoke test failed"
SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE_TAG")"
log "done: $IMAGE_TAG ($((SIZE / 1000000)) MB)"
