"""The model registry: the paper's four models and the tiny one, built with Keras.

The tests that build a model import TensorFlow and are marked ``tensorflow``."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tf_grpc_bench.errors import ConfigError
from tf_grpc_bench.models import (
    available_models,
    build_model,
    import_keras,
    model_spec,
    trainable_parameter_count,
    variable_infos,
)
from tf_grpc_bench.sizes import SizeCategory, classify


def _total(model) -> int:  # type: ignore[no-untyped-def]
    return sum(math.prod(info.shape) for info in variable_infos(model))


def test_registry_lists_the_papers_four_models_and_the_tiny_one() -> None:
    assert set(available_models()) == {"resnet50", "inceptionv3", "vgg16", "alexnet", "tiny"}


def test_unknown_model_is_a_config_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'lenet'.*resnet50.*alexnet.*tiny"):
        model_spec("lenet")


@pytest.mark.tensorflow
def test_input_below_the_models_minimum_is_a_config_error() -> None:
    keras = import_keras("keras")
    with pytest.raises(ConfigError, match=r"inceptionv3.*75x75"):
        build_model("inceptionv3", keras_module=keras, input_shape=(32, 32, 3))


def test_unknown_keras_flavour_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="keras2"):
        import_keras("keras2")


def test_importing_the_registry_does_not_import_tensorflow() -> None:
    code = (
        "import sys, tf_grpc_bench.models as m; m.available_models(); "
        "sys.exit(1 if 'tensorflow' in sys.modules or 'keras' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("name", "keras_function", "published_total", "published_trainable"),
    [
        ("resnet50", "ResNet50", 25_636_712, 25_583_592),
        ("inceptionv3", "InceptionV3", 23_851_784, None),
        ("vgg16", "VGG16", 138_357_544, 138_357_544),
    ],
)
def test_keras_models_at_a_small_input_have_the_full_size_models_variables(
    name: str, keras_function: str, published_total: int, published_trainable: int | None
) -> None:
    keras = import_keras("keras")
    spec = model_spec(name)
    small = spec.minimum_input_size
    ours = build_model(name, keras_module=keras, input_shape=(small, small, 3), classes=1000)
    full = spec.default_input_size
    reference = getattr(keras.applications, keras_function)(
        weights=None, input_shape=(full, full, 3), classes=1000
    )
    assert _total(ours) == reference.count_params() == published_total
    assert [(v.shape, v.trainable) for v in variable_infos(ours)] == [
        (v.shape, v.trainable) for v in variable_infos(reference)
    ]
    trainable = sum(math.prod(v.shape) for v in variable_infos(ours) if v.trainable)
    assert trainable == sum(math.prod(v.shape) for v in reference.trainable_weights)
    if published_trainable is not None:
        assert trainable == published_trainable


@pytest.mark.tensorflow
def test_alexnet_has_tf_cnn_benchmarks_layers_at_any_input_size() -> None:
    keras = import_keras("keras")
    convolutions = [(11, 3, 64), (5, 64, 192), (3, 192, 384), (3, 384, 384), (3, 384, 256)]
    dense = [(6 * 6 * 256, 4096), (4096, 4096), (4096, 1000)]
    expected = sum(k * k * i * o + o for k, i, o in convolutions) + sum(i * o + o for i, o in dense)
    small = build_model("alexnet", keras_module=keras, input_shape=(67, 67, 3))
    full = build_model("alexnet", keras_module=keras, input_shape=(227, 227, 3))
    assert _total(small) == _total(full) == expected == full.count_params()
    assert [v.shape for v in variable_infos(small)] == [v.shape for v in variable_infos(full)]
    assert tuple(full.output.shape) == (None, 1000)


@pytest.mark.tensorflow
def test_tiny_model_has_variables_in_every_size_category() -> None:
    model = build_model("tiny", keras_module=import_keras("keras"))
    categories = {classify(v.size_bytes) for v in variable_infos(model)}
    assert categories == set(SizeCategory)
    assert all(v.trainable for v in variable_infos(model))
    assert tuple(model.output.shape) == (None, model_spec("tiny").default_classes)


@pytest.mark.tensorflow
def test_tf_keras_builds_the_same_variables_as_keras() -> None:
    for name, size in (("tiny", 16), ("resnet50", 32)):
        shapes = {}
        for flavour in ("keras", "tf_keras"):
            model = build_model(
                name, keras_module=import_keras(flavour), input_shape=(size, size, 3)
            )
            shapes[flavour] = [(v.shape, v.dtype, v.trainable) for v in variable_infos(model)]
        assert shapes["keras"] == shapes["tf_keras"]


@pytest.mark.tensorflow
def test_trainable_parameter_count_follows_the_number_of_classes() -> None:
    ten = trainable_parameter_count("tiny", classes=10)
    eleven = trainable_parameter_count("tiny", classes=11)
    assert eleven - ten == 512 + 1
