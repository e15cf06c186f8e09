"""Layers shared by the model definitions."""

from __future__ import annotations

from types import ModuleType
from typing import Any


def full_size_feature_map(keras: ModuleType, features: Any, *, side: int) -> Any:
    """``features`` resized (nearest neighbour) to ``side`` x ``side`` if it is not already.

    A flattening classifier head sized for a full-size input then has the same
    variables at any input size; that keeps a model's traffic faithful while
    small images keep the computation cheap.
    """
    height, width = int(features.shape[1]), int(features.shape[2])
    if (height, width) == (side, side):
        return features
    return keras.layers.Resizing(side, side, interpolation="nearest", name="full_size_features")(
        features
    )
