"""The models a training job can run; see ``registry`` (importing this imports no TensorFlow)."""

from tf_grpc_bench.models.registry import (
    KERAS_FLAVOURS,
    ModelSpec,
    VariableInfo,
    available_models,
    build_model,
    check_input_size,
    import_keras,
    model_spec,
    trainable_parameter_count,
    variable_infos,
)

__all__ = [
    "KERAS_FLAVOURS",
    "ModelSpec",
    "VariableInfo",
    "available_models",
    "build_model",
    "check_input_size",
    "import_keras",
    "model_spec",
    "trainable_parameter_count",
    "variable_infos",
]
