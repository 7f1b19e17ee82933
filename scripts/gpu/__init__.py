"""A bare GPU host: the check (`make gpu-check`) and the GPU benchmark."""
