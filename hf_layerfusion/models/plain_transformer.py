"""The plain Transformer (Vaswani et al. 2017): the backbone with no fusion, top layer in, top layer out.

It is the baseline every paper compares against and is weight-for-weight equal to `MarianMTModel`
(see `hf_layerfusion.from_marian`).
"""

from huggingface_hub.dataclasses import strict
from transformers.generation import GenerationMixin

from ..modeling.configuration import LayerFusionConfig
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from ..modeling.registry import register_family


@strict
class PlainTransformerConfig(LayerFusionConfig):
    """Backbone configuration with no fusion knob; see `LayerFusionConfig`."""

    model_type = "plain_transformer"


class PlainTransformerModel(LayerFusionModel):
    config_class = PlainTransformerConfig


@register_family
class PlainTransformerForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    config_class = PlainTransformerConfig
    model_class = PlainTransformerModel
