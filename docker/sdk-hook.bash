# shellcheck shell=bash
# container-entry's hook for SageMaker SDK v3's own start (ModelTrainer with source_code).
#
# That start replaces the image's entrypoint with
#   /bin/bash -c "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && .../sm_train.sh"
# as PID 1. The image installs this file as /etc/container-entry/pid1 and sets BASH_ENV so that
# only a bash that is PID 1 and runs `-c` reads it (docker/Dockerfile); it hands a command that names the SDK's drivers to
# `container-entry sagemaker-sdk`, which decides whether our launcher takes the job over or the
# SDK's start runs as it is, and says which in one line. Any other command runs untouched.
case $BASH_EXECUTION_STRING in
*sm_drivers* | *sm_train*)
    # PID 1 drops a signal it has no handler for: one that comes before the exec is noted here
    # and handed on (the exec'd `env` then holds the stop signals until Python takes them)
    trap '_container_entry_stop=SIGTERM' TERM
    trap '_container_entry_stop=SIGINT' INT
    trap '_container_entry_stop=SIGHUP' HUP
    if command -v container-entry >/dev/null 2>&1; then
        exec env --block-signal=INT,TERM,HUP container-entry sagemaker-sdk \
            "${_container_entry_stop-}" "$0" -c "$BASH_EXECUTION_STRING"
    fi
    trap - TERM INT HUP
    echo "[container-entry] container-entry is not on PATH: the SageMaker SDK's own start runs, without container-entry's launcher" >&2
    ;;
esac
