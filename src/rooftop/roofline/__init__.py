"""The roofline analyzer: FLOPs and bytes of every op of a step, and the time a device needs for them."""

from rooftop.roofline.api import predict, resolve_hardware, resolve_model
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import Op, SeqShape, StepShape, parameter_count, step_ops
from rooftop.roofline.precision import Precision, precision
from rooftop.roofline.predict import DoesNotFitError, Prediction, analyze

__all__ = [
    "predict",
    "analyze",
    "resolve_model",
    "resolve_hardware",
    "Hardware",
    "Op",
    "SeqShape",
    "StepShape",
    "step_ops",
    "parameter_count",
    "Precision",
    "precision",
    "Prediction",
    "DoesNotFitError",
]
