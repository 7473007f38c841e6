"""XGBoost on the breast-cancer data, reporting only through MLflow: a script written for
MLflow, not for paiexp, run unchanged.

``mlflow.xgboost.autolog()`` logs its params, per-round curves (``train-logloss``,
``test-auc``, ...), its datasets and its model; one ``mlflow.log_metric`` call adds the final
``test_auc``. Under paiexp the run the script starts is its job's run (a sweep's trial: its
child run), on every backend: nothing to configure, no stray ``mlruns/``.

Under the PAI training-job contract: hyperparameters as flags (``$PAI_USER_ARGS``), the data
from the ``train`` and ``test`` input channels. Needs MLflow (``requirements.txt``) and XGBoost
(the image's, as examples/xgb).
"""

from __future__ import annotations

import argparse
import os

import mlflow
import pandas as pd
import xgboost as xgb


def matrix(channel: str) -> xgb.DMatrix:
    """An input channel's CSV file (or the first one in its directory), labels in ``target``."""
    path = os.environ[f"PAI_INPUT_{channel.upper()}"]
    if os.path.isdir(path):
        path = os.path.join(path, min(f for f in os.listdir(path) if f.endswith(".csv")))
    frame = pd.read_csv(path)
    return xgb.DMatrix(frame.drop(columns=["target"]), label=frame["target"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_depth", type=int, default=4)
    parser.add_argument("--eta", type=float, default=0.3)
    parser.add_argument("--num_boost_round", type=int, default=50)
    args = parser.parse_args()
    mlflow.xgboost.autolog()  # before the data is read: its datasets are logged too
    train, test = matrix("train"), matrix("test")
    with mlflow.start_run():
        params = {"objective": "binary:logistic", "max_depth": args.max_depth, "eta": args.eta}
        booster = xgb.train(
            {**params, "eval_metric": ["logloss", "auc"]},
            train,
            num_boost_round=args.num_boost_round,
            evals=[(train, "train"), (test, "test")],
            verbose_eval=False,
        )
        evaluation = booster.eval(test, "test")  # "[0]\ttest-logloss:0.1\ttest-auc:0.99"
        mlflow.log_metric("test_auc", float(evaluation.split("test-auc:")[1]))


if __name__ == "__main__":
    main()
