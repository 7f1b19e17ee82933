#!/usr/bin/env bash
# Stand-in for the DLC's /usr/local/bin/start_with_right_hostname.sh (own implementation,
# behaviour summarised in docs/dlc-base.md). The image runs it as
#   ENTRYPOINT ["bash", "-m", "start_with_right_hostname.sh"]
# like the real DLC. Differences from the real script, on purpose:
#   * no gethostname() LD_PRELOAD shim (the real one compiles changehostname.c with gcc at
#     start-up, baking resourceconfig.json's current_host into it);
#   * no telemetry and no CUDA forward-compat probe (CPU-only stand-in);
#   * `exec` instead of running `train` as a child / `eval "$@"`, so quoting survives and
#     the command becomes the direct child of docker-init or PID 1.
if [ "${1:-}" = "train" ]; then
    shift
    exec train "$@"
fi
if [ "$#" -eq 0 ]; then
    exec /bin/bash
fi
exec "$@"
