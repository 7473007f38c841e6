"""Logistic regression by minibatch SGD on the breast-cancer data, its curves written only as
TensorBoard scalars (no metric line is printed): what most deep-learning code does.

Under the PAI training-job contract: hyperparameters as flags (``$PAI_USER_ARGS``), data from
the ``train`` input channel, scalars to the ``tensorboard`` output channel
(``$PAI_OUTPUT_TENSORBOARD``), Keras' layout: ``train/`` and ``validation/`` writers, each with
its ``loss``; ``validation/accuracy`` too. The writer is PyTorch's ``SummaryWriter`` where
torch is installed, else tensorboardX's, else TensorBoard's own (which paiexp installs).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--l2", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def summary_writer(directory: str) -> Any:
    """A writer with ``add_scalar(tag, value, step)`` and ``close()``, from what is installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            from tensorboard.summary import Writer as SummaryWriter
    return SummaryWriter(directory)


def load(channel: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(os.environ[f"PAI_INPUT_{channel.upper()}"])
    if path.is_dir():
        path = sorted(path.glob("*.csv"))[0]
    frame = pd.read_csv(path)
    features = frame.drop(columns=["target"]).to_numpy(dtype=float)
    return features, frame["target"].to_numpy(dtype=float)


def log_loss(weights: np.ndarray, features: np.ndarray, labels: np.ndarray) -> float:
    chances = 1.0 / (1.0 + np.exp(-features @ weights))
    chances = np.clip(chances, 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(chances) + (1 - labels) * np.log(1 - chances)))


def main() -> None:
    args = parse_args()
    features, labels = load("train")
    features = (features - features.mean(axis=0)) / (features.std(axis=0) + 1e-9)
    features = np.hstack([features, np.ones((len(features), 1))])  # the bias
    rng = np.random.default_rng(args.seed)
    held_out = rng.random(len(features)) < 0.2
    train_x, train_y = features[~held_out], labels[~held_out]
    valid_x, valid_y = features[held_out], labels[held_out]

    channel = os.environ.get("PAI_OUTPUT_TENSORBOARD", "tensorboard")
    train_log = summary_writer(os.path.join(channel, "train"))
    validation_log = summary_writer(os.path.join(channel, "validation"))
    weights = np.zeros(features.shape[1])
    for epoch in range(args.epochs):
        for _batch in range(0, len(train_x), args.batch_size):
            batch = rng.permutation(len(train_x))[: args.batch_size]
            x, y = train_x[batch], train_y[batch]
            chances = 1.0 / (1.0 + np.exp(-x @ weights))
            gradient = x.T @ (chances - y) / len(batch) + args.l2 * weights
            weights -= args.learning_rate * gradient
        accuracy = float(np.mean((valid_x @ weights > 0) == (valid_y == 1)))
        train_log.add_scalar("loss", log_loss(weights, train_x, train_y), epoch)
        validation_log.add_scalar("loss", log_loss(weights, valid_x, valid_y), epoch)
        validation_log.add_scalar("accuracy", accuracy, epoch)
    train_log.close()
    validation_log.close()

    model_dir = Path(os.environ.get("PAI_OUTPUT_MODEL", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "weights.json").write_text(json.dumps(weights.tolist()))


if __name__ == "__main__":
    main()
