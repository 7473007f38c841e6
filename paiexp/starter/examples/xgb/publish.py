"""Publish a trained model: the ``model`` input channel (a directory holding ``model.json``,
as train.py writes it) is checked on the test data, then written with a model card to this
job's ``model`` output channel, whose URI its MLflow run records.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import xgboost as xgb
from train import auc, load_channel


def main() -> None:
    source = Path(os.environ["PAI_INPUT_MODEL"])
    model_file = source / "model.json" if source.is_dir() else source
    booster = xgb.Booster()
    booster.load_model(str(model_file))
    features, labels = load_channel("test")
    test_auc = auc(labels.to_numpy(), booster.predict(xgb.DMatrix(features)))
    print(f"test-auc={test_auc:.6f}", flush=True)

    target = Path(os.environ.get("PAI_OUTPUT_MODEL", "published"))
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, target / "model.json")
    params = model_file.with_name("params.json")
    card = {
        "test_auc": test_auc,
        "params": json.loads(params.read_text()) if params.is_file() else None,
    }
    (target / "model_card.json").write_text(json.dumps(card, indent=2))
    print(f"published {model_file.name} to {target}", flush=True)


if __name__ == "__main__":
    main()
