"""Causal language modelling on a text file, written the way Hugging Face's example scripts are
(run_clm-style): HfArgumentParser over dataclasses + TrainingArguments, `datasets`' text loader,
tokenize and group into blocks, Trainer, save_model. Nothing here knows about devices or DDP.

    python hf_clm_style.py --model_name_or_path DIR --train_file train.txt \
        --do_train True --output_dir /opt/ml/model --num_train_epochs 2

On SageMaker the model+tokenizer folder arrives as a `model` channel (/opt/ml/input/data/model)
and the text as a `train` channel. Nothing is downloaded: --model_name_or_path must be a folder.
"""

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain

import datasets
import evaluate
import torch
import transformers
from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils.versions import require_version

require_version("datasets>=2.14.0", "the text loader and map() used here")

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        metadata={"help": "A local folder with the model (config + weights) and its tokenizer."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer folder, if not the model's."}
    )


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "Training text file (.txt)."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Evaluation text file (.txt), for --do_eval."}
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training block (default: the tokenizer's max length)."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Truncate the training blocks to this many."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization."}
    )

    def __post_init__(self):
        for name in ("train_file", "validation_file"):
            path = getattr(self, name)
            if path is not None and not path.endswith(".txt"):
                raise ValueError(f"--{name} must be a .txt file, got {path}")


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()

    # One line per process, as HF's examples log it, plus the global rank and world size.
    logger.warning(
        f"Process rank: {training_args.process_index}, "
        f"local rank: {training_args.local_process_index}, "
        f"device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
        f"distributed training: {training_args.parallel_mode.value == 'distributed'}, "
        f"world size: {training_args.world_size}, 16-bits training: {training_args.fp16}"
    )
    logger.info(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"datasets {datasets.__version__}, evaluate {evaluate.__version__}"
    )
    logger.info(f"Training/evaluation parameters {training_args}")

    last_checkpoint = None
    if training_args.do_train and os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info(f"Checkpoint detected, resuming training at {last_checkpoint}.")

    set_seed(training_args.seed)

    data_files = {}
    if data_args.train_file is not None:
        data_files["train"] = data_args.train_file
    if data_args.validation_file is not None:
        data_files["validation"] = data_args.validation_file
    if not data_files:
        raise ValueError("Need --train_file and/or --validation_file.")
    raw_datasets = load_dataset("text", data_files=data_files)

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path
    )
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > embedding_size:
        model.resize_token_embeddings(len(tokenizer))

    split = "train" if training_args.do_train else "validation"
    column_names = list(raw_datasets[split].features)
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(
            tokenize_function,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            remove_columns=column_names,
            desc="Running tokenizer on dataset",
        )

    max_length = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    block_size = min(data_args.block_size or max_length, max_length)

    def group_texts(examples):
        """Concatenate all texts and cut them into blocks of block_size (the rest is dropped)."""
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated[next(iter(examples))])
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(
            group_texts,
            batched=True,
            num_proc=data_args.preprocessing_num_workers,
            desc=f"Grouping texts in chunks of {block_size}",
        )

    train_dataset = eval_dataset = None
    if training_args.do_train:
        train_dataset = lm_datasets["train"]
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(data_args.max_train_samples))
    if training_args.do_eval:
        if "validation" not in lm_datasets:
            raise ValueError("--do_eval requires --validation_file")
        eval_dataset = lm_datasets["validation"]

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # the model and the tokenizer, to output_dir
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        if losses:
            logger.info(
                f"train loss: first {losses[0]:.4f}, last {losses[-1]:.4f} "
                f"({len(losses)} logged steps of {trainer.state.global_step})"
            )

    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        try:
            metrics["perplexity"] = math.exp(metrics["eval_loss"])
        except OverflowError:
            metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
