"""SageMaker training bootstrap: DDP through torchrun by default, on any instance type."""

__version__ = "0.1.0"
