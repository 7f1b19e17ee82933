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
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_trainer_tiny import TINY, VOCAB, JsonlDataset, load_examples
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint


class SlowSteps(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args, _ = parser.parse_known_args()

    checkpoints = os.environ.get("SM_CHECKPOINT_DIR", "/opt/ml/checkpoints")
    last = get_last_checkpoint(checkpoints) if os.path.isdir(checkpoints) else None
    training_args = TrainingArguments(
        output_dir=checkpoints,
        max_steps=args.max_steps,
        save_steps=args.save_steps,
        save_strategy="steps",
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
        callbacks=[SlowSteps(args.step_sleep)],
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
