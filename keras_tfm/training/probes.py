"""Frozen features scored as self-supervised models are scored: a linear probe (scikit-learn's logistic regression
on standardized features) and a cosine k-NN classifier (as the DINOv2 paper scores features), each fitted on the
training features and scored on the test features. scikit-learn does both well; nothing here is written by hand."""

from __future__ import annotations

import numpy as np


def probe_scores(train: np.ndarray, test: np.ndarray, train_labels: np.ndarray, test_labels: np.ndarray,
                 k: int = 20) -> dict:  # fmt: skip
    """Test accuracy of a logistic-regression probe (`linear_probe`) and of cosine k-NN (`knn`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train)
    probe = LogisticRegression(max_iter=2000).fit(scaler.transform(train), train_labels)
    knn = KNeighborsClassifier(n_neighbors=k, metric="cosine").fit(train, train_labels)
    return {"linear_probe": float(probe.score(scaler.transform(test), test_labels)),
            "knn": float(knn.score(test, test_labels))}  # fmt: skip
