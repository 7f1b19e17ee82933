"""Developer tools, never shipped: run from the repository root as `python -m
scripts.<folder>.<name>` or through `make`. One folder per purpose:

- `build/`: a docker engine (`ensure-docker.sh`), the DLC stand-in (`build-standin.sh`,
  `standin_lock`, `disk_space`), the package's own wheel backend (`wheel_backend`, pip's build
  backend: nothing else imported), the push to ECR (`push` with `push_policy`)
- `local/`: a SageMaker-like cluster of containers (`cluster`: `make demo`, the docker tests)
  and `docker run` of a script here (`run`: `make run`)
- `simulate/`: the real bootstrap of 2 to 256 simulated hosts (`hosts`, with `host` and `job`:
  `make bench-liveness`)
- `gpu/`: the bare GPU host's check (`check` with `scenarios`, `jobs`, `probe`: `make
  gpu-check`) and the GPU benchmark (`benchmark` with `benchmark_worker`, `benchmark_report`)
- `bench/`: `make bench` (the launch against bare torchrun and the DLC's launcher: `__main__`
  and its parts), the relay (`relay`, `relay_run`, `relay_report`), threads (`threads`), the
  SDK v3 hook's cost (`sdk_hook`)
- `doc_block`: the generated blocks of the docs, which several tools write

Scripts that also run by path import nothing from here but their sibling files: `build/push.py`
(the buildspec; with `push_policy.py`), `gpu/benchmark.py` (inside the image, on a bare GPU host;
with its `benchmark_*` siblings and `doc_block.py` one folder up), `build/wheel_backend.py`
(nothing at all).
"""
