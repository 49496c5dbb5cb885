"""hf_layerfusion: layer-fusion encoder-decoder models for NMT, as Hugging Face Transformers models.

`import hf_layerfusion` registers every family of `FAMILIES` (`hf_layerfusion.registry`) with AutoConfig, AutoModel
and AutoModelForSeq2SeqLM, and the translation pipeline with transformers' pipeline registry.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .callbacks import FusionWeightsCallback, LayerGradientNormCallback, TimeBudgetCallback
from .checkpoint_averaging import average_checkpoints, average_last_checkpoints
from .configuration_backbone import LayerFusionConfig
from .conversion import from_marian
from .data import (
    builtin_number_corpus,
    load_json_lines_translation,
    load_parallel_text,
    load_translation_dataset,
    preprocess_translation,
)
from .evaluation import compute_translation_metrics, corpus_bleu, load_bleu_metric
from .hub import generate_remote_code, push_to_hub
from .model_card import write_model_card
from .pipeline import PIPELINE_TASK, LayerFusionTranslationPipeline
from .tokenization import train_joint_tokenizer
from .trainer import LayerFusionSeq2SeqTrainer
from .translation import translate
from .xlmr import from_xlmr, load_xlmr_tokenizer
from .modeling_backbone import LayerFusionForConditionalGeneration, LayerFusionModel, LayerFusionPreTrainedModel
from . import models  # noqa: F401  (imports every family module; each registers itself in FAMILIES)
from .registry import FAMILIES

# every family's classes under their own names (`hf_layerfusion.GTransConfig`), and with the Auto classes
_family_classes = {cls.__name__: cls for family in FAMILIES.values() for cls in family}
globals().update(_family_classes)
for _family in FAMILIES.values():
    AutoConfig.register(_family.config.model_type, _family.config, exist_ok=True)
    AutoModel.register(_family.config, _family.model, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_family.config, _family.for_conditional_generation, exist_ok=True)

# `pipeline("layerfusion-translation", model=...)`; transformers 5 refuses to resolve the task name "translation"
PIPELINE_REGISTRY.register_pipeline(
    PIPELINE_TASK, pipeline_class=LayerFusionTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__version__ = "0.1.0"

__all__ = [
    "FusionWeightsCallback",
    "LayerFusionSeq2SeqTrainer",
    "LayerGradientNormCallback",
    "TimeBudgetCallback",
    "average_checkpoints",
    "average_last_checkpoints",
    "FAMILIES",
    "LayerFusionConfig",
    "LayerFusionForConditionalGeneration",
    "LayerFusionModel",
    "LayerFusionPreTrainedModel",
    "builtin_number_corpus",
    "compute_translation_metrics",
    "corpus_bleu",
    "from_marian",
    "from_xlmr",
    "load_bleu_metric",
    "load_json_lines_translation",
    "load_parallel_text",
    "load_xlmr_tokenizer",
    "load_translation_dataset",
    "preprocess_translation",
    "train_joint_tokenizer",
    "translate",
    "write_model_card",
    "LayerFusionTranslationPipeline",
    "generate_remote_code",
    "push_to_hub",
    *_family_classes,
]
