"""Frozen-feature evaluation: DINO's weighted k-NN and a linear probe (both with scikit-learn)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch.utils.data import DataLoader


@torch.no_grad()
def extract_features(model: torch.nn.Module, loader: DataLoader, device: torch.device | str = "cpu",
                     bf16: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pooled pre-logits features (the representation DINO evaluates) and labels of a whole loader."""
    model.eval().to(device)
    feats, labels = [], []
    for images, targets in loader:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            out = model.forward_head(model.forward_features(images.to(device)), pre_logits=True)
        feats.append(out.float().cpu())
        labels.append(targets)
    return torch.cat(feats).numpy(), torch.cat(labels).numpy()


def knn_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                 k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 (%) of DINO's weighted k-NN: cosine similarity, the k nearest vote with weight exp(sim / T)."""
    knn = KNeighborsClassifier(n_neighbors=min(k, len(train_x)), metric="cosine", algorithm="brute",
                               weights=lambda distance: np.exp((1.0 - distance) / temperature))
    knn.fit(train_x, train_y)
    return float((knn.predict(test_x) == test_y).mean() * 100)


def linear_probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                          max_iter: int = 1000) -> float:
    """Top-1 (%) of a multinomial logistic regression on standardised frozen features."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))
    probe.fit(train_x, train_y)
    return float((probe.predict(test_x) == test_y).mean() * 100)
