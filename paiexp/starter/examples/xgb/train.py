"""Train an XGBoost classifier on the breast-cancer data, under the PAI training-job contract.

Hyperparameters arrive as command-line flags (``python train.py $PAI_USER_ARGS``), the data
through the ``train`` and ``test`` input channels (``PAI_INPUT_TRAIN``, ``PAI_INPUT_TEST``),
and the model goes to the ``model`` output channel (``PAI_OUTPUT_MODEL``). The same script
runs unchanged on PAI, in a PAI-like container, and under paiexp's local backend.

It prints XGBoost's per-round evaluation (``[12]\tvalidation-logloss:0.21``) and, at the end,
``test-auc=0.987``: the lines the job config's metric_definitions read.
Works with XGBoost 1.7 (Debian bookworm) as well as 3.x.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import xgboost as xgb


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_depth", type=int, default=6)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--n_estimators", type=int, default=100)
    parser.add_argument("--subsample", type=float, default=1.0)
    parser.add_argument("--colsample_bytree", type=float, default=1.0)
    parser.add_argument("--min_child_weight", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.0)
    parser.add_argument("--reg_lambda", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--validation_fraction", type=float, default=0.2)
    return parser.parse_args()


def load_channel(channel: str) -> tuple[pd.DataFrame, pd.Series]:
    """A channel is a CSV file or a directory holding one; column ``target`` is the label."""
    path = Path(os.environ[f"PAI_INPUT_{channel.upper()}"])
    if path.is_dir():
        path = sorted(path.glob("*.csv"))[0]
    frame = pd.read_csv(path)
    return frame.drop(columns=["target"]), frame["target"]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    for end in range(1, len(scores) + 1):
        if end == len(scores) or sorted_scores[end] != sorted_scores[start]:
            ranks[order[start:end]] = (start + end + 1) / 2.0
            start = end
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def main() -> None:
    args = parse_args()
    features, labels = load_channel("train")
    test_features, test_labels = load_channel("test")

    rng = np.random.default_rng(args.seed)
    is_validation = rng.random(len(features)) < args.validation_fraction
    train = xgb.DMatrix(features[~is_validation], label=labels[~is_validation])
    validation = xgb.DMatrix(features[is_validation], label=labels[is_validation])
    test = xgb.DMatrix(test_features, label=test_labels)

    params = {
        "objective": "binary:logistic",
        "eval_metric": "logloss",
        "max_depth": args.max_depth,
        "eta": args.learning_rate,
        "subsample": args.subsample,
        "colsample_bytree": args.colsample_bytree,
        "min_child_weight": args.min_child_weight,
        "gamma": args.gamma,
        "lambda": args.reg_lambda,
        "seed": args.seed,
    }
    booster = xgb.train(
        params,
        train,
        num_boost_round=args.n_estimators,
        evals=[(validation, "validation")],
        verbose_eval=True,
    )
    test_auc = auc(test_labels.to_numpy(), booster.predict(test))
    print(f"test-auc={test_auc:.6f}", flush=True)

    model_dir = Path(os.environ.get("PAI_OUTPUT_MODEL", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(model_dir / "model.json"))
    (model_dir / "params.json").write_text(json.dumps(vars(args), indent=2))


if __name__ == "__main__":
    main()
