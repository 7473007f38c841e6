"""One step of PAI's CustomJob workflow example: a random forest on the breast-cancer data.

Hyperparameters arrive as flags (``python train.py $PAI_USER_ARGS``), the data through the
``train`` and ``test`` input channels. The test accuracy is written as PAI's output parameter
``/ml/output/output_parameters/test-accuracy`` (``PAI_OUTPUT_OUTPUT_PARAMETERS``), which the
workflow's next step is chosen on; the model goes to the ``model`` output channel.
"""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pandas as pd
from sklearn.ensemble import RandomForestClassifier


def load_channel(channel: str) -> tuple[pd.DataFrame, pd.Series]:
    """A channel is a CSV file or a directory holding one; column ``target`` is the label."""
    path = Path(os.environ[f"PAI_INPUT_{channel.upper()}"])
    if path.is_dir():
        path = sorted(path.glob("*.csv"))[0]
    frame = pd.read_csv(path)
    return frame.drop(columns=["target"]), frame["target"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_estimators", type=int, default=100)
    parser.add_argument("--max_depth", type=int, default=0, help="0: unlimited")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    features, labels = load_channel("train")
    test_features, test_labels = load_channel("test")
    forest = RandomForestClassifier(
        n_estimators=args.n_estimators, max_depth=args.max_depth or None, random_state=args.seed
    )
    forest.fit(features, labels)
    accuracy = float((forest.predict(test_features) == test_labels.to_numpy()).mean())
    print(f"test-accuracy={accuracy:.6f}", flush=True)

    parameters = Path(os.environ.get("PAI_OUTPUT_OUTPUT_PARAMETERS", "output_parameters"))
    parameters.mkdir(parents=True, exist_ok=True)
    (parameters / "test-accuracy").write_text(f"{accuracy}\n")
    model_dir = Path(os.environ.get("PAI_OUTPUT_MODEL", "model"))
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "forest.pkl").write_bytes(pickle.dumps(forest))


if __name__ == "__main__":
    main()
