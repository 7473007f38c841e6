"""An XGBoost training app written for Hydra alone, as a research repo's would be: nothing of
paiexp in it, but its config's one line that selects paiexp's sweeper.

    python train.py                        # one training here, as Hydra runs any app
    python train.py -m                     # the sweep of conf/config.yaml: each trial a paiexp
                                           # job, pruned on its validation loss, in MLflow
    python train.py -m hydra.sweeper.backend=docker hydra.sweeper.job.image=IMAGE
    python train.py -m hydra/sweeper=basic hydra/launcher=paiexp 'model.max_depth=3,6'

The data are the xgb example's: ``data.train``/``data.test``, PAI's input channels where a
job has them (``PAI_INPUT_TRAIN``), else the files beside. It prints XGBoost's per-round
``validation-logloss`` and returns the test AUC, the sweep's objective.
"""

from __future__ import annotations

import hydra
import numpy as np
import pandas as pd
import xgboost as xgb
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    features = pd.read_csv(cfg.data.train)
    labels = features.pop("target")
    test_features = pd.read_csv(cfg.data.test)
    test_labels = test_features.pop("target")
    is_validation = np.random.default_rng(cfg.seed).random(len(features)) < 0.2
    history: dict[str, dict[str, list[float]]] = {}
    xgb.train(
        {
            "objective": "binary:logistic",
            "eval_metric": ["logloss", "auc"],
            "max_depth": cfg.model.max_depth,
            "eta": cfg.model.learning_rate,
            "subsample": cfg.model.subsample,
            "seed": cfg.seed,
        },
        xgb.DMatrix(features[~is_validation], label=labels[~is_validation]),
        num_boost_round=cfg.model.n_estimators,
        evals=[
            (xgb.DMatrix(features[is_validation], label=labels[is_validation]), "validation"),
            (xgb.DMatrix(test_features, label=test_labels), "test"),
        ],
        evals_result=history,
        verbose_eval=True,
    )
    test_auc = history["test"]["auc"][-1]
    print(f"test-auc={test_auc:.6f}", flush=True)
    return test_auc


if __name__ == "__main__":
    train()
