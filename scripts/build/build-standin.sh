#!/usr/bin/env bash
# Build the offline stand-in of the Hugging Face PyTorch training DLC
# (huggingface-pytorch-training:2.9.0-transformers5.3.0-gpu-py312-cu130-ubuntu22.04): CPython
# 3.12 under /usr/local, torch 2.9.0 and the HF layer's pins (docker/standin/requirements.txt).
#
#   scripts/build/build-standin.sh [IMAGE_TAG]      (default: container-entry/dlc-standin:latest)
#
# Works without any container registry:
#   1. base image container-entry/debian-bookworm:latest from debootstrap + docker import
#      (skipped when the image exists);
#   2. a host CPython 3.12 install tree (pyenv's, by default) staged into build/standin/python
#      for the image's /usr/local (skipped when the source tree is unchanged);
#   3. wheels for docker/standin/requirements.txt, under the lock docker/standin/constraints.txt,
#      built/downloaded on the host with that same Python into build/standin/wheels (skipped
#      when they match both already; linked from the machine's cache, ~/.cache/container-entry,
#      when another checkout built that set), then every wheel checked: pinned by the lock at
#      its version (scripts/build/standin_lock.py), and its tags against that Python in the base
#      image;
#   4. docker build of docker/standin/Dockerfile with build/standin/ as context (skipped when
#      the image carries the fingerprint of exactly these inputs; docker's layer cache covers
#      partial changes), after a check that docker's disk has room for it;
#   5. smoke test: versions, `pip check`, a 2-process gloo all_reduce under torch.distributed.run
#      in a container without network (skipped for an image that passed it before, in this
#      checkout or another on this machine).
# Idempotent: re-running only redoes what changed.
#
# Environment knobs:
#   STANDIN_PYTHON       host CPython 3.12 interpreter to stage and to build wheels with
#                        (default: the newest 3.12.* in pyenv's versions folder, found through
#                        pyenv, PYENV_ROOT, the home folder or python3's own install, else python3.12 on
#                        PATH); it must be a self-contained install with its own prefix
#   STANDIN_BASE_IMAGE   base image name      (default container-entry/debian-bookworm:latest)
#   STANDIN_MIRROR       debootstrap mirror   (default: debootstrap's own default)
#   STANDIN_PIP_ARGS     extra `pip wheel` arguments, e.g. "--index-url https://mirror/simple"
#   STANDIN_FORCE_WHEELS=1  rebuild the wheel dir from scratch
#   STANDIN_UNLOCKED=1      resolve without the lock and skip its check (to update pins, then
#                           `python3 -m scripts.build.standin_lock write --wheels build/standin/wheels`)
#   STANDIN_FORCE_BUILD=1   run docker build even when the image's fingerprint matches
#   STANDIN_FORCE_SMOKE=1   rerun the smoke test on an image that passed it before
#   STANDIN_KEEP_STAGE=1    keep the first build stage's image (~12 GB) for faster rebuilds
set -euo pipefail

IMAGE_TAG="${1:-container-entry/dlc-standin:latest}"
BASE_IMAGE="${STANDIN_BASE_IMAGE:-container-entry/debian-bookworm:latest}"
PYV=3.12                       # the DLC's Python (3.12.10 there)
FINGERPRINT_LABEL=com.container-entry.standin.inputs

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STANDIN_DIR="$REPO_ROOT/docker/standin"
REQS="$STANDIN_DIR/requirements.txt"
LOCK="$STANDIN_DIR/constraints.txt"
CONTEXT_DIR="$REPO_ROOT/build/standin"
PY_STAGE="$CONTEXT_DIR/python"
PY_STAMP="$CONTEXT_DIR/.python.stamp"
WHEEL_DIR="$CONTEXT_DIR/wheels"
STAMP="$CONTEXT_DIR/.requirements.sha256"
LOG_DIR="$REPO_ROOT/build/logs"
# the machine's cache, shared by its checkouts (the wheel set per lock, the smoke test's result
# per image); empty without a home folder: then nothing is cached
MACHINE_CACHE="${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}"
MACHINE_CACHE="${MACHINE_CACHE:+$MACHINE_CACHE/container-entry}"
mkdir -p "$LOG_DIR" "$CONTEXT_DIR"
# One run at a time per checkout: make targets and test sessions may start this concurrently.
if command -v flock >/dev/null; then
    exec 9> "$REPO_ROOT/build/.standin.lock"
    flock 9
fi

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
sha() { sha256sum | cut -d' ' -f1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "docker engine not reachable (is dockerd running?)"
[ -f "$REQS" ] || die "missing $REQS"
[ -f "$LOCK" ] || die "missing $LOCK"

# ---------------------------------------------------------------- host Python 3.12
# The image's /usr/local Python is a copy of a host install tree, and the wheels are built with
# it, so both must be one CPython 3.12 with its own prefix (pyenv, or ./configure --prefix=...).
find_python() {
    local dirs=() dir real cand
    if [ -n "${STANDIN_PYTHON:-}" ]; then
        echo "$STANDIN_PYTHON"
        return
    fi
    # pyenv's versions folder, found without relying on PATH or HOME (CI runners start with a
    # bare PATH): pyenv itself, PYENV_ROOT, this user's home, and the folder holding the
    # interpreter that runs python3 when that is one of several side-by-side installs.
    if command -v pyenv >/dev/null 2>&1 && dir="$(pyenv root 2>/dev/null)"; then dirs+=("$dir/versions"); fi
    [ -n "${PYENV_ROOT:-}" ] && dirs+=("$PYENV_ROOT/versions")
    [ -n "${HOME:-}" ] && dirs+=("$HOME/.pyenv/versions")
    dir="$(getent passwd "$(id -un)" 2>/dev/null | cut -d: -f6)" && [ -n "$dir" ] && dirs+=("$dir/.pyenv/versions")
    for cand in python3 python; do
        real="$(command -v "$cand" 2>/dev/null)" || continue
        real="$("$real" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" || continue
        dirs+=("$(dirname "$real")")
    done
    for dir in "${dirs[@]}"; do
        cand="$(find "$dir" -mindepth 1 -maxdepth 1 -name "$PYV.*" 2>/dev/null | sort -V \
            | while read -r d; do [ -x "$d/bin/python$PYV" ] && echo "$d/bin/python$PYV"; done | tail -1)"
        if [ -n "$cand" ]; then echo "$cand"; return; fi
    done
    # A pyenv shim on PATH exists even when it cannot run, hence the trial run.
    if command -v "python$PYV" >/dev/null 2>&1 && "python$PYV" -c '' >/dev/null 2>&1; then
        command -v "python$PYV"
    fi
}
HOST_PY="$(find_python)"
[ -n "$HOST_PY" ] || die "no CPython $PYV found: install one with its own prefix (e.g. \`pyenv install $PYV\`, built with --enable-shared) or set STANDIN_PYTHON=/path/to/bin/python$PYV"
PY_INFO="$("$HOST_PY" -c 'import sys, platform; print(sys.base_prefix, platform.python_version(), "%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
    || die "$HOST_PY does not run"
read -r PY_PREFIX PY_VERSION PY_MINOR <<< "$PY_INFO"
[ "$PY_MINOR" = "$PYV" ] || die "$HOST_PY is Python $PY_VERSION, not $PYV (the DLC's Python is 3.12)"
case "$PY_PREFIX" in
    /usr | /usr/local | /) die "$HOST_PY lives in the system prefix $PY_PREFIX: it cannot be staged as a tree; use a pyenv (or ./configure --prefix) build via STANDIN_PYTHON" ;;
esac
[ -x "$PY_PREFIX/bin/python$PYV" ] && [ -d "$PY_PREFIX/lib/python$PYV/lib-dynload" ] && [ -d "$PY_PREFIX/lib/python$PYV/ensurepip" ] \
    || die "$PY_PREFIX is not a complete CPython $PYV install tree (bin/python$PYV, lib/python$PYV/{lib-dynload,ensurepip})"
HOST_PY="$PY_PREFIX/bin/python$PYV"     # the real binary, not a shim
"$HOST_PY" -m pip --version >/dev/null 2>&1 || die "$HOST_PY has no pip (run \`$HOST_PY -m ensurepip\`)"

# ---------------------------------------------------------------- 1. base image
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "1/5 base image $BASE_IMAGE exists, skipping debootstrap"
else
    command -v debootstrap >/dev/null || die "debootstrap not installed (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    ROOTFS="$(mktemp -d /tmp/standin-rootfs.XXXXXX)"
    cleanup_rootfs() { rm -rf --one-file-system "$ROOTFS"; }
    trap cleanup_rootfs EXIT
    log "1/5 debootstrap bookworm (minbase) into $ROOTFS ${STANDIN_MIRROR:+from $STANDIN_MIRROR}"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,procps,iproute2 \
        bookworm "$ROOTFS" ${STANDIN_MIRROR:+"$STANDIN_MIRROR"} \
        > "$LOG_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$LOG_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $LOG_DIR/debootstrap.log)"; }
    # Slim the rootfs a little: apt lists and caches are useless without a mirror inside.
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb
    log "1/5 importing rootfs as $BASE_IMAGE"
    tar -C "$ROOTFS" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        - "$BASE_IMAGE" >/dev/null
    cleanup_rootfs
    trap - EXIT
    log "1/5 base image ready"
fi

# ---------------------------------------------------------------- 2. Python tree
# Staged: bin, include, lib of the prefix, minus site-packages contents, test suites, idle,
# tkinter/turtledemo, byte-code, pip scripts (ensurepip writes new ones in the image), the
# static libpython and man pages. Text files naming the host prefix (_sysconfigdata, the
# config Makefile, python3.12-config, *.pc, script shebangs) are rewritten to /usr/local.
PY_EXCLUDES=(
    "./lib/python$PYV/site-packages/*" "./lib/python$PYV/test" "./lib/python$PYV/idlelib"
    "./lib/python$PYV/tkinter" "./lib/python$PYV/turtledemo" "./lib/python$PYV/lib-dynload/_tkinter.*"
    "./lib/python$PYV/config-$PYV-*/libpython$PYV.a" "*/__pycache__" "./bin/idle*" "./bin/pip*" "./share"
)
PY_SUM="$( { echo "$PY_PREFIX ${PY_EXCLUDES[*]}"; \
    find "$PY_PREFIX" \( -path "$PY_PREFIX/lib/python$PYV/site-packages" -o -name __pycache__ \) -prune \
        -o -printf '%P %s %T@\n' | sort; } | sha)"
if [ -f "$PY_STAMP" ] && [ "$(cat "$PY_STAMP")" = "$PY_SUM" ] && [ -x "$PY_STAGE/bin/python$PYV" ]; then
    log "2/5 Python $PY_VERSION tree up to date in ${PY_STAGE#"$REPO_ROOT"/}"
else
    log "2/5 staging Python $PY_VERSION from $PY_PREFIX into ${PY_STAGE#"$REPO_ROOT"/}"
    rm -rf "$PY_STAGE" "$PY_STAMP"
    mkdir -p "$PY_STAGE"
    tar -C "$PY_PREFIX" "${PY_EXCLUDES[@]/#/--exclude=}" -cf - . | tar -C "$PY_STAGE" -xf -
    grep -rlIF --null "$PY_PREFIX" "$PY_STAGE" | xargs -0 -r sed -i "s|$PY_PREFIX|/usr/local|g"
    echo "$PY_SUM" > "$PY_STAMP"
    log "2/5 staged $(du -sh "$PY_STAGE" | cut -f1)"
fi

# ---------------------------------------------------------------- 3. wheels
# The requirements without comments and blank lines: editing a comment rebuilds nothing.
mkdir -p "$WHEEL_DIR"
REQS_USED="$CONTEXT_DIR/requirements.txt"
grep -v -E '^[[:space:]]*(#|$)' "$REQS" > "$REQS_USED" || die "no requirements in $REQS"
LOCK_ARGS=(-c "$LOCK")
if [ "${STANDIN_UNLOCKED:-0}" = 1 ]; then
    log "3/5 STANDIN_UNLOCKED=1: resolving without ${LOCK#"$REPO_ROOT"/}"
    LOCK_ARGS=()
fi
REQ_SUM="$( { sha256sum "$REQS_USED" | cut -d' ' -f1; echo "$PY_VERSION ${STANDIN_PIP_ARGS:-}"; \
    if [ ${#LOCK_ARGS[@]} = 0 ]; then echo unlocked; else sha256sum < "$LOCK"; fi; } | sha)"
if [ "${STANDIN_FORCE_WHEELS:-0}" = 1 ]; then
    log "3/5 STANDIN_FORCE_WHEELS=1: emptying $WHEEL_DIR"
    rm -f "$WHEEL_DIR"/*.whl "$STAMP"
fi
# The machine's cache keeps the checked wheel set of each lock: a fresh clone links it in (a
# second) instead of `pip wheel` unpacking 4 GB again (some 45 s); the checks below still run.
WHEEL_CACHE="${MACHINE_CACHE:+$MACHINE_CACHE/standin-wheels-${REQ_SUM:0:16}}"
if ! [ -f "$STAMP" ] && [ "${STANDIN_FORCE_WHEELS:-0}" != 1 ] && [ -n "$WHEEL_CACHE" ] \
    && [ "$(cat "$WHEEL_CACHE/.stamp" 2>/dev/null)" = "$REQ_SUM" ]; then
    rm -f "$WHEEL_DIR"/*.whl
    cp -l "$WHEEL_CACHE"/*.whl "$WHEEL_DIR"/ 2>/dev/null || cp "$WHEEL_CACHE"/*.whl "$WHEEL_DIR"/
    echo "$REQ_SUM" > "$STAMP"
    log "3/5 wheels linked from the machine's cache ${WHEEL_CACHE}"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REQ_SUM" ] && [ -n "$(find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' -print -quit)" ]; then
    log "3/5 wheels up to date in ${WHEEL_DIR#"$REPO_ROOT"/} ($(find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' | wc -l) files), skipping pip wheel"
else
    # A fresh dir: the wheel set is exactly what the requirements resolve to (pip's own HTTP
    # and wheel caches make a re-run cheap). sdists (sagemaker-training, inotify_simple, ...)
    # are built here, since the base image has no compiler and the container no index.
    rm -f "$WHEEL_DIR"/*.whl "$STAMP"
    log "3/5 building wheels with $("$HOST_PY" -m pip --version | cut -d' ' -f1-2) (Python $PY_VERSION) into ${WHEEL_DIR#"$REPO_ROOT"/}"
    # shellcheck disable=SC2086
    run_logged "$LOG_DIR/pip-wheel.log" '^(Saved|Building wheel|ERROR)' \
        "$HOST_PY" -m pip wheel --disable-pip-version-check --progress-bar off \
        --wheel-dir "$WHEEL_DIR" -r "$REQS_USED" "${LOCK_ARGS[@]}" ${STANDIN_PIP_ARGS:-} \
        || die "pip wheel failed (log: $LOG_DIR/pip-wheel.log)"
    echo "$REQ_SUM" > "$STAMP.tmp"
    STAMP_PENDING=1
fi
# Every wheel pinned at its version: a fresh clone gets the very wheels, so the very image, that
# another checkout built (a release in between once made them rebuild it in turn).
if [ ${#LOCK_ARGS[@]} != 0 ]; then
    problem="$(cd "$REPO_ROOT" && "$HOST_PY" -m scripts.build.standin_lock check --wheels "$WHEEL_DIR" --lock "$LOCK" 2>&1)" \
        || { rm -f "$STAMP" "$STAMP.tmp"; die "$problem"; }
fi
TORCH_WHEEL="$(find "$WHEEL_DIR" -maxdepth 1 -name 'torch-*.whl' -printf '%f\n' | head -1)"
log "3/5 torch wheel: ${TORCH_WHEEL:-<none>}, $(du -sh "$WHEEL_DIR" | cut -f1) of wheels"

# Check every wheel's tags against the staged interpreter running in the base image (its glibc
# decides the manylinux tags), with the packaging module of the tree's bundled pip wheel.
log "3/5 checking wheel tags against Python $PY_VERSION in $BASE_IMAGE"
find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' -printf '%f\n' | docker run --rm -i --network none \
    -v "$PY_STAGE:/opt/standin-python:ro" -e LD_LIBRARY_PATH=/opt/standin-python/lib \
    "$BASE_IMAGE" "/opt/standin-python/bin/python$PYV" -c '
import glob, sys
sys.path[:0] = glob.glob("/opt/standin-python/lib/python3.*/ensurepip/_bundled/pip-*.whl")
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import parse_wheel_filename
supported = set(sys_tags())
bad = [n for n in (l.strip() for l in sys.stdin) if n and not (parse_wheel_filename(n)[3] & supported)]
print("    python %s: %s" % (sys.version.split()[0], "all wheels installable" if not bad else "NOT installable: " + " ".join(bad)))
sys.exit(1 if bad else 0)
' || { rm -f "$STAMP" "$STAMP.tmp"; die "some wheels do not fit the image's Python"; }
if [ "${STAMP_PENDING:-0}" = 1 ]; then mv "$STAMP.tmp" "$STAMP"; fi
# Checked: the machine's cache gets them for the next clone (whole or not at all).
if [ -n "$WHEEL_CACHE" ] && [ "$(cat "$WHEEL_CACHE/.stamp" 2>/dev/null)" != "$REQ_SUM" ] \
    && [ ${#LOCK_ARGS[@]} != 0 ] && mkdir -p "$MACHINE_CACHE" 2>/dev/null; then
    rm -rf "$WHEEL_CACHE.partial" "$WHEEL_CACHE"
    if mkdir "$WHEEL_CACHE.partial" \
        && { cp -l "$WHEEL_DIR"/*.whl "$WHEEL_CACHE.partial"/ 2>/dev/null \
             || cp "$WHEEL_DIR"/*.whl "$WHEEL_CACHE.partial"/; } \
        && echo "$REQ_SUM" > "$WHEEL_CACHE.partial/.stamp" \
        && mv "$WHEEL_CACHE.partial" "$WHEEL_CACHE"; then
        log "3/5 wheels kept in the machine's cache $WHEEL_CACHE"
    else
        rm -rf "$WHEEL_CACHE.partial"
    fi
fi

# ---------------------------------------------------------------- 4. image
# Stage the small files next to the wheels so the context is just this directory.
cp "$STANDIN_DIR/entrypoint.sh" "$CONTEXT_DIR/entrypoint.sh"
# The legacy builder sends the whole ~4 GB context on every build, even a fully cached one:
# skip it when the image was built from exactly these inputs.
FINGERPRINT="$( { cat "$STANDIN_DIR/Dockerfile" "$REQS_USED" "$STANDIN_DIR/entrypoint.sh" "$PY_STAMP" "$STAMP"; \
    find "$WHEEL_DIR" -maxdepth 1 -name '*.whl' -printf '%f %s\n' | sort; \
    docker image inspect -f '{{.Id}}' "$BASE_IMAGE"; } | sha)"
if [ "${STANDIN_FORCE_BUILD:-0}" != 1 ] \
    && [ "$(docker image inspect -f "{{ index .Config.Labels \"$FINGERPRINT_LABEL\" }}" "$IMAGE_TAG" 2>/dev/null)" = "$FINGERPRINT" ]; then
    log "4/5 $IMAGE_TAG is up to date (fingerprint ${FINGERPRINT:0:12}), skipping docker build"
else
    # The build's peak (the first stage's ~12 GB image beside the new 8 GB one) is known to be
    # coming only here, where the fingerprint differs: one line now, not ENOSPC minutes later.
    problem="$(cd "$REPO_ROOT" && "$HOST_PY" -m scripts.build.disk_space --for standin-image 2>&1)" || die "$problem"
    log "4/5 docker build $IMAGE_TAG (context ${CONTEXT_DIR#"$REPO_ROOT"/}, $(du -sh "$CONTEXT_DIR" | cut -f1))"
    run_logged "$LOG_DIR/docker-build.log" '^(Step |Successfully|ERROR|The command)|Using cache' \
        docker build --build-arg "STANDIN_BASE=$BASE_IMAGE" --label "$FINGERPRINT_LABEL=$FINGERPRINT" \
        -f "$STANDIN_DIR/Dockerfile" -t "$IMAGE_TAG" "$CONTEXT_DIR" \
        || die "docker build failed (log: $LOG_DIR/docker-build.log)"
    # The first stage's image holds the wheels and a second copy of what they install: ~12 GB
    # of disk that only a rebuild after an edit would reuse (STANDIN_KEEP_STAGE=1 keeps it).
    if [ "${STANDIN_KEEP_STAGE:-0}" != 1 ]; then
        docker image prune -f --filter "label=com.container-entry.standin.stage=usrlocal" >/dev/null
    fi
fi

# ---------------------------------------------------------------- 5. smoke test
# One container, no network, through the image's own ENTRYPOINT: interpreter and versions,
# pip check, then a real 2-process gloo all_reduce under torch.distributed.run on loopback.
# It takes ~20 s (imports); an image that already passed this very test is not tested again
# (build/logs/smoke.ok holds its id; STANDIN_FORCE_SMOKE=1 reruns it).
SMOKE_PY='
import sys
if sys.argv[1:] == ["versions"]:
    import shutil, sysconfig
    from importlib.metadata import version
    import accelerate, datasets, evaluate, torch, transformers
    import pandas, pyarrow, scipy, sagemaker_pytorch_container, sagemaker_training  # noqa: F401
    where = {c: shutil.which(c) for c in ("python3", "python", "pip", "train")}
    assert sys.prefix == sys.base_prefix == "/usr/local", (sys.prefix, sys.base_prefix)
    assert where == {c: "/usr/local/bin/" + c for c in where}, where
    assert sysconfig.get_paths()["purelib"] == "/usr/local/lib/python3.12/site-packages"
    print("    python %s (%s) torch %s transformers %s accelerate %s datasets %s evaluate %s"
          % (sys.version.split()[0], sys.executable, torch.__version__, transformers.__version__,
             accelerate.__version__, datasets.__version__, evaluate.__version__))
    print("    " + " ".join("%s %s" % (d, version(d)) for d in (
        "huggingface_hub", "numpy", "pyarrow", "fsspec", "dill", "multiprocess", "sagemaker-training",
        "sagemaker-pytorch-training", "pip", "setuptools", "wheel")))
    sys.exit(0)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
print("    rank %d/%d: gloo all_reduce -> %g" % (rank, world, t.item()))
dist.destroy_process_group()
'
# shellcheck disable=SC2016
SMOKE_SH='
set -e
cat > /tmp/smoke.py
python3 /tmp/smoke.py versions
check="$(python3 -m pip check 2>&1)" || { echo "$check"; exit 1; }
echo "    pip check: $check"
python3 -m torch.distributed.run --nproc-per-node 2 /tmp/smoke.py > /tmp/ddp.log 2>&1 \
    || { cat /tmp/ddp.log; exit 1; }
grep "gloo all_reduce" /tmp/ddp.log | sort
'
# (scripts/build/disk_space.py reads it too: this checkout has the stand-in it names)
SMOKE_OK="$LOG_DIR/smoke.ok"
SMOKE_LOG="$LOG_DIR/smoke.log"
SMOKE_KEY="$(docker image inspect -f '{{.Id}}' "$IMAGE_TAG") $(printf '%s%s' "$SMOKE_PY" "$SMOKE_SH" | sha)"
# another checkout on this machine smoke-tested this very image: its result, kept in the cache
SMOKE_CACHE="${MACHINE_CACHE:+$MACHINE_CACHE/standin-smoke-$(printf '%s' "$SMOKE_KEY" | sha | cut -c1-16)}"
if [ "${STANDIN_FORCE_SMOKE:-0}" != 1 ] && ! [ -f "$SMOKE_OK" ] && [ -n "$SMOKE_CACHE" ] \
    && [ "$(cat "$SMOKE_CACHE.ok" 2>/dev/null)" = "$SMOKE_KEY" ] && [ -f "$SMOKE_CACHE.log" ]; then
    cp "$SMOKE_CACHE.log" "$SMOKE_LOG"
    cp "$SMOKE_CACHE.ok" "$SMOKE_OK"
fi
if [ "${STANDIN_FORCE_SMOKE:-0}" != 1 ] && [ -f "$SMOKE_OK" ] && [ "$(cat "$SMOKE_OK")" = "$SMOKE_KEY" ]; then
    log "5/5 smoke test passed before on this image; its output (${SMOKE_LOG#"$REPO_ROOT"/}):"
    cat "$SMOKE_LOG"
else
    log "5/5 smoke test"
    rm -f "$SMOKE_OK"
    set +e +o pipefail
    # (bash -m without a tty prints two job-control lines: the DLC's ENTRYPOINT does the same)
    printf '%s' "$SMOKE_PY" | docker run --rm -i --network none "$IMAGE_TAG" bash -c "$SMOKE_SH" 2>&1 \
        | grep -v -e '^bash: cannot set terminal process group' -e '^bash: no job control in this shell' \
        | tee "$SMOKE_LOG"
    rc=${PIPESTATUS[1]}
    set -e -o pipefail
    [ "$rc" = 0 ] || die "smoke test failed (exit $rc)"
    echo "$SMOKE_KEY" > "$SMOKE_OK"
fi
if [ -n "$SMOKE_CACHE" ] && [ "$(cat "$SMOKE_CACHE.ok" 2>/dev/null)" != "$SMOKE_KEY" ] \
    && mkdir -p "$MACHINE_CACHE" 2>/dev/null; then
    { cp "$SMOKE_LOG" "$SMOKE_CACHE.log" && cp "$SMOKE_OK" "$SMOKE_CACHE.ok"; } || rm -f "$SMOKE_CACHE.ok"
fi
SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE_TAG")"
log "done: $IMAGE_TAG ($((SIZE / 1000000)) MB)"
