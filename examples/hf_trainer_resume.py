"""HF Trainer that checkpoints to /opt/ml/checkpoints and resumes from the newest checkpoint.

SageMaker syncs /opt/ml/checkpoints with S3 when checkpointing is configured, so the same
script resumes after a Spot interruption (a new job) or, with
`container_entry_max_restarts`, after torchrun restarts a failed worker group (same job).
The bootstrap exports the directory as SM_CHECKPOINT_DIR.

    --max-steps N --save-steps K [--step-sleep S]   (S slows steps down, for the restart test)
"""

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from hf_trainer_tiny import TINY, VOCAB, JsonlDataset, load_examples
from safetensors.torch import save_model
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

WEIGHTS = "model.safetensors"  # what the Trainer resumes the model from


def _restore_cpu_index(storage, location):
    """CPU DDP only: transformers maps the optimizer state to the Trainer's device, which is
    `cpu:0` under Accelerate's multi-CPU mode, and torch before 2.10 restores only the tag
    `cpu` ("don't know how to restore data location ... (tagged with cpu:0)"). GPU jobs
    (`cuda:N`) never need this."""
    if location.startswith("cpu:"):
        return storage
    return None


torch.serialization.register_package(99, lambda _obj: None, _restore_cpu_index)


class SlowSteps(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


class WeightsOnEveryNode(TrainerCallback):
    """Completes each host's checkpoint with the model weights.

    With save_on_each_node the Trainer writes optimizer, scheduler and state on every host, but
    transformers 5 writes the weights on global rank 0 only, so the other hosts could not
    resume from their own /opt/ml/checkpoints. DDP keeps every replica identical, so the local
    main process writes its own copy (atomically: a half-written file is never taken).
    """

    def on_save(self, args, state, control, model=None, **kwargs):
        if args.local_process_index != 0 or args.process_index == 0 or model is None:
            return
        directory = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        target = os.path.join(directory, WEIGHTS)
        if os.path.isdir(directory) and not os.path.exists(target):
            save_model(model, target + ".tmp")
            os.replace(target + ".tmp", target)


def newest_complete_checkpoint(root):
    """The newest checkpoint-N holding both weights and trainer state; a job killed in the
    middle of a save leaves a partial directory that must not be resumed from."""
    names = os.listdir(root) if os.path.isdir(root) else []
    found = [m for m in (re.fullmatch(r"checkpoint-(\d+)", n) for n in names) if m]
    for match in sorted(found, key=lambda m: int(m.group(1)), reverse=True):
        path = os.path.join(root, match.group(0))
        if all(os.path.isfile(os.path.join(path, f)) for f in (WEIGHTS, "trainer_state.json")):
            return path
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args, _ = parser.parse_known_args()

    checkpoints = os.environ.get("SM_CHECKPOINT_DIR", "/opt/ml/checkpoints")
    last = newest_complete_checkpoint(checkpoints)
    training_args = TrainingArguments(
        output_dir=checkpoints,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_strategy="steps",
        # every SageMaker host has its own /opt/ml/checkpoints: each keeps a copy to resume from
        save_on_each_node=True,
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
    )
    config = AutoConfig.for_model("bert", vocab_size=VOCAB, num_labels=2, **TINY["bert"])
    model = AutoModelForSequenceClassification.from_config(config)
    rows, _ = load_examples()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=JsonlDataset(rows),
        callbacks=[SlowSteps(args.step_sleep), WeightsOnEveryNode()],
    )
    resumed_from = trainer_state_step(last)
    print(
        f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}: resuming from "
        f"{last or 'scratch'} (step {resumed_from})",
        flush=True,
    )
    trainer.train(resume_from_checkpoint=last)
    record = {
        "rank": training_args.process_index,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "resumed_from_step": resumed_from,
        "global_step": trainer.state.global_step,
    }
    out = os.environ.get("SM_OUTPUT_DATA_DIR", ".")
    with open(os.path.join(out, f"resume-rank-{record['rank']}.json"), "w") as handle:
        json.dump(record, handle)
    trainer.save_model(os.environ.get("SM_MODEL_DIR", os.path.join(out, "model")))


def trainer_state_step(checkpoint):
    if not checkpoint:
        return 0
    with open(os.path.join(checkpoint, "trainer_state.json")) as handle:
        return json.load(handle)["global_step"]


if __name__ == "__main__":
    main()
