"""Network and runtime defaults for the workers: pure, from facts the environment read.

Every value here is only a default: the plan drops any variable the user already set, and
shows each one it adds with its reason.
"""

from __future__ import annotations

from container_entry.cluster import Topology

# What an unmodified HF Trainer / Accelerate script needs to run as DDP on a host with no GPU
# (docs/cpu-ddp.md): transformers passes cpu=True to accelerate's PartialState only then, and
# PartialState then builds a MULTI_CPU (gloo) state from torchrun's WORLD_SIZE.
CPU_DDP_ENV = {"ACCELERATE_USE_CPU": "true"}


def fabric_env(
    *,
    topology: Topology,
    gpu_count: int,
    efa_devices: tuple[str, ...],
    interfaces: tuple[str, ...] | None,
    cpu_count: int,
    workers_per_host: int,
    run_dir: str,
) -> dict[str, tuple[str, str]]:
    """name -> (value, reason) for interconnect, host identity, threads and NCCL diagnostics."""
    env: dict[str, tuple[str, str]] = {}
    interface = topology.network_interface
    if interface and (interfaces is None or interface in interfaces):
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env[name] = (interface, "interface named by resourceconfig.json")
    # else: SDK v3 local mode names 'ethwe', which its containers lack; NCCL and gloo would
    # fail on it, so they are left to pick the interface themselves
    threads = max(1, cpu_count // max(1, workers_per_host))
    env["OMP_NUM_THREADS"] = (
        str(threads),
        f"{cpu_count} cores / {workers_per_host} workers (torchrun would force 1)",
    )
    if gpu_count:
        env["NCCL_HOSTID"] = (
            topology.current_host,
            "host identity for NCCL: ranks on different hosts are never taken for one host "
            "(replaces the DLC's LD_PRELOAD gethostname shim)",
        )
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = ("1", "NCCL watchdog: a hung collective fails")
        env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = ("2000", "NCCL flight recorder on")
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = ("1", "flight recorder dump when a collective hangs")
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = (
            f"{run_dir}/nccl_trace_rank_",
            "flight recorder dumps kept with the job's output",
        )
    else:
        for name, value in CPU_DDP_ENV.items():
            env[name] = (value, "no GPU: HF Trainer/Accelerate run DDP on gloo")
    if efa_devices:
        reason = f"EFA devices present: {', '.join(efa_devices)}"
        env["FI_PROVIDER"] = ("efa", reason)
        env["NCCL_PROTO"] = ("simple", reason + " (as the SageMaker toolkit sets for EFA)")
        env["FI_EFA_FORK_SAFE"] = ("1", reason + " (DataLoader workers fork)")
    return env
