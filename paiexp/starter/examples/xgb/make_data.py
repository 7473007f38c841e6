"""Regenerate data/train.csv and data/test.csv from scikit-learn's bundled breast-cancer set.

python examples/xgb/make_data.py
"""

from __future__ import annotations

from pathlib import Path

from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

frame = load_breast_cancer(as_frame=True).frame  # 569 rows, 30 features, column "target"
train, test = train_test_split(frame, test_size=0.2, random_state=0, stratify=frame["target"])
out = Path(__file__).parent / "data"
out.mkdir(exist_ok=True)
train.to_csv(out / "train.csv", index=False, float_format="%.6g")
test.to_csv(out / "test.csv", index=False, float_format="%.6g")
