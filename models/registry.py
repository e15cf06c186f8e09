"""The models a training job can run: the paper's four CNNs and a tiny one for tests.

| name        | definition                                   | default input | minimum | classes |
|-------------|----------------------------------------------|---------------|---------|---------|
| resnet50    | ``keras.applications.ResNet50``              | 224           | 32      | 1000    |
| inceptionv3 | ``keras.applications.InceptionV3``           | 299           | 75      | 1000    |
| vgg16       | ``keras.applications.VGG16`` (see below)     | 224           | 32      | 1000    |
| alexnet     | ours, tf_cnn_benchmarks' layers (alexnet.py) | 227           | 67      | 1000    |
| tiny        | ours, every size category (tiny.py)          | 32            | 8       | 10      |

Traffic follows the variables, not the image: ResNet-50 and Inception-v3 end in
global pooling, so their variables do not depend on the input size.  VGG-16 and
AlexNet flatten their last feature map into the first fully connected layer; to
keep their variables (and so their traffic) those of the full-size model at any
input, that feature map is resized to the full-size one (7x7 and 6x6) before
flattening.  At the default input the resize is skipped and VGG-16 is exactly
Keras' ``VGG16(include_top=True)``.

Every model is built with ``weights=None`` (random initialisation; nothing is
downloaded) and returns logits (no softmax).  A builder takes the Keras module
to use: ``keras`` (Keras 3, TF2 strategies) or ``tf_keras`` (Keras 2, needed by
TF1 graph mode).  This module imports neither until a model is built, so the
registry's facts (names, sizes) are available without TensorFlow.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tf_grpc_bench.errors import ConfigError

#: Keras flavours a model can be built with.
KERAS_FLAVOURS = ("keras", "tf_keras")

Builder = Callable[[ModuleType, tuple[int, int, int], int], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Facts about one model of the registry.

    Sizes are the side of a square RGB image in pixels.
    """

    name: str
    description: str
    default_input_size: int
    minimum_input_size: int
    default_classes: int
    builder: Builder

    def __post_init__(self) -> None:
        if not 1 <= self.minimum_input_size <= self.default_input_size:
            raise ValueError(
                f"model {self.name}: need 1 <= minimum_input_size <= default_input_size, got "
                f"{self.minimum_input_size} and {self.default_input_size}"
            )
        if self.default_classes < 1:
            raise ValueError(f"model {self.name}: default_classes must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class VariableInfo:
    """One model variable as it crosses the wire: name, shape, dtype, bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    size_bytes: int
    trainable: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.size_bytes,
            "trainable": self.trainable,
        }


def _build_resnet50(keras: ModuleType, input_shape: tuple[int, int, int], classes: int) -> Any:
    return keras.applications.ResNet50(
        weights=None, input_shape=input_shape, classes=classes, classifier_activation=None
    )


def _build_inceptionv3(keras: ModuleType, input_shape: tuple[int, int, int], classes: int) -> Any:
    return keras.applications.InceptionV3(
        weights=None, input_shape=input_shape, classes=classes, classifier_activation=None
    )


def _build_vgg16(keras: ModuleType, input_shape: tuple[int, int, int], classes: int) -> Any:
    from tf_grpc_bench.models.heads import full_size_feature_map

    if input_shape[:2] == (224, 224):
        return keras.applications.VGG16(
            weights=None, input_shape=input_shape, classes=classes, classifier_activation=None
        )
    # Keras' convolutional base, then Keras' own classifier head (same layer
    # names and sizes) fed a 7x7 feature map whatever the input size.
    base = keras.applications.VGG16(weights=None, include_top=False, input_shape=input_shape)
    layers = keras.layers
    features = full_size_feature_map(keras, base.output, side=7)
    x = layers.Flatten(name="flatten")(features)
    x = layers.Dense(4096, activation="relu", name="fc1")(x)
    x = layers.Dense(4096, activation="relu", name="fc2")(x)
    logits = layers.Dense(classes, name="predictions")(x)
    return keras.Model(base.input, logits, name="vgg16")


def _build_alexnet(keras: ModuleType, input_shape: tuple[int, int, int], classes: int) -> Any:
    from tf_grpc_bench.models.alexnet import build_alexnet

    return build_alexnet(keras, input_shape=input_shape, classes=classes)


def _build_tiny(keras: ModuleType, input_shape: tuple[int, int, int], classes: int) -> Any:
    from tf_grpc_bench.models.tiny import build_tiny

    return build_tiny(keras, input_shape=input_shape, classes=classes)


_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="resnet50",
            description="ResNet-50 (He et al. 2016), keras.applications.ResNet50",
            default_input_size=224,
            minimum_input_size=32,
            default_classes=1000,
            builder=_build_resnet50,
        ),
        ModelSpec(
            name="inceptionv3",
            description="Inception-v3 (Szegedy et al. 2016), keras.applications.InceptionV3",
            default_input_size=299,
            minimum_input_size=75,
            default_classes=1000,
            builder=_build_inceptionv3,
        ),
        ModelSpec(
            name="vgg16",
            description="VGG-16 (Simonyan and Zisserman 2015), keras.applications.VGG16",
            default_input_size=224,
            minimum_input_size=32,
            default_classes=1000,
            builder=_build_vgg16,
        ),
        ModelSpec(
            name="alexnet",
            description="AlexNet (Krizhevsky et al. 2012), single tower as in tf_cnn_benchmarks",
            default_input_size=227,
            minimum_input_size=67,
            default_classes=1000,
            builder=_build_alexnet,
        ),
        ModelSpec(
            name="tiny",
            description="two convolutions and three dense layers; variables of every size class",
            default_input_size=32,
            minimum_input_size=8,
            default_classes=10,
            builder=_build_tiny,
        ),
    )
}


def available_models() -> tuple[str, ...]:
    """Names of the models ``build_model`` knows, in a stable order."""
    return tuple(_MODELS)


def model_spec(name: str) -> ModelSpec:
    """The registry entry of ``name``; ConfigError naming the known models if unknown."""
    try:
        return _MODELS[name]
    except KeyError:
        known = ", ".join(_MODELS)
        raise ConfigError(f"unknown model {name!r}; known models: {known}") from None


def check_input_size(name: str, input_size: int) -> None:
    """ConfigError unless ``input_size`` (image side, pixels) is valid for model ``name``."""
    spec = model_spec(name)
    if input_size < spec.minimum_input_size:
        raise ConfigError(
            f"input size {input_size} is too small for model {name}: "
            f"its minimum is {spec.minimum_input_size}x{spec.minimum_input_size}"
        )


def import_keras(flavour: str) -> ModuleType:
    """Import and return the Keras module of ``flavour`` ("keras" or "tf_keras")."""
    if flavour not in KERAS_FLAVOURS:
        raise ConfigError(f"unknown Keras flavour {flavour!r}; expected one of {KERAS_FLAVOURS}")
    try:
        return importlib.import_module(flavour)
    except ImportError as error:
        raise ConfigError(
            f"Keras flavour {flavour} is not installed ({error}); install tf-grpc-bench[profiler]"
        ) from None


def build_model(
    name: str,
    *,
    keras_module: ModuleType,
    input_shape: tuple[int, int, int] | None = None,
    classes: int | None = None,
) -> Any:
    """Build model ``name`` with ``keras_module`` (``keras`` or ``tf_keras``).

    ``input_shape`` is (height, width, channels), default the model's default
    square input with 3 channels; ``classes`` defaults to the model's default.
    Returns an uncompiled Keras model that outputs logits.  Variables are
    created in the caller's current device and distribution-strategy scope.
    """
    spec = model_spec(name)
    shape = input_shape or (spec.default_input_size, spec.default_input_size, 3)
    if len(shape) != 3 or shape[2] != 3:
        raise ConfigError(f"input shape {shape} for model {name}: expected (height, width, 3)")
    check_input_size(name, min(shape[0], shape[1]))
    count = spec.default_classes if classes is None else classes
    if count < 1:
        raise ConfigError(f"classes must be >= 1, got {count}")
    return spec.builder(keras_module, (int(shape[0]), int(shape[1]), 3), count)


def variable_infos(model: Any) -> tuple[VariableInfo, ...]:
    """Every variable of a built model (trainable first), with its size in bytes."""
    infos = []
    for trainable, variables in (
        (True, model.trainable_weights),
        (False, model.non_trainable_weights),
    ):
        for variable in variables:
            shape = tuple(int(d) for d in variable.shape)
            dtype = _dtype_name(variable.dtype)
            itemsize = _ITEMSIZE.get(dtype, 4)
            infos.append(
                VariableInfo(
                    name=str(getattr(variable, "path", None) or variable.name),
                    shape=shape,
                    dtype=dtype,
                    size_bytes=math.prod(shape) * itemsize,
                    trainable=trainable,
                )
            )
    return tuple(infos)


def trainable_parameter_count(
    name: str,
    *,
    input_shape: tuple[int, int, int] | None = None,
    classes: int | None = None,
    keras_flavour: str = "keras",
) -> int:
    """Number of trainable scalars of model ``name`` (builds it once on the CPU)."""
    model = build_model(
        name, keras_module=import_keras(keras_flavour), input_shape=input_shape, classes=classes
    )
    return sum(math.prod(info.shape) for info in variable_infos(model) if info.trainable)


_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}


def _dtype_name(dtype: Any) -> str:
    # Keras 3 gives a string, tf_keras a tf.DType.
    return str(getattr(dtype, "name", dtype))
