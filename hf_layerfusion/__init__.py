"""hf_layerfusion: layer-fusion encoder-decoder models for NMT, as Hugging Face Transformers models.

`import hf_layerfusion` registers every family with AutoConfig, AutoModel and AutoModelForSeq2SeqLM.
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
from .fast_generation import fast_generate, prepare_for_inference
from .hub import generate_remote_code, push_to_hub
from .model_card import write_model_card
from .pipeline import PIPELINE_TASK, LayerFusionTranslationPipeline
from .tokenization import train_joint_tokenizer
from .trainer import LayerFusionSeq2SeqTrainer
from .translation import translate
from .xlmr import from_xlmr, load_xlmr_tokenizer
from .modeling_backbone import LayerFusionForConditionalGeneration, LayerFusionModel, LayerFusionPreTrainedModel
from .models.deep_representations import (
    DeepRepresentationsConfig,
    DeepRepresentationsForConditionalGeneration,
    DeepRepresentationsModel,
)
from .models.gtrans import GTransConfig, GTransForConditionalGeneration, GTransModel
from .models.layerwise_coordination import (
    LayerwiseCoordinationConfig,
    LayerwiseCoordinationForConditionalGeneration,
    LayerwiseCoordinationModel,
)
from .models.re_transformer import ReTransformerConfig, ReTransformerForConditionalGeneration, ReTransformerModel
from .models.plain_transformer import (
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
    PlainTransformerModel,
)
from .models.rtal import RTALConfig, RTALForConditionalGeneration, RTALModel

FAMILIES = {
    "plain_transformer": (PlainTransformerConfig, PlainTransformerModel, PlainTransformerForConditionalGeneration),
    "gtrans": (GTransConfig, GTransModel, GTransForConditionalGeneration),
    "layerwise_coordination": (
        LayerwiseCoordinationConfig,
        LayerwiseCoordinationModel,
        LayerwiseCoordinationForConditionalGeneration,
    ),
    "deep_representations": (
        DeepRepresentationsConfig,
        DeepRepresentationsModel,
        DeepRepresentationsForConditionalGeneration,
    ),
    "re_transformer": (ReTransformerConfig, ReTransformerModel, ReTransformerForConditionalGeneration),
    "rtal": (RTALConfig, RTALModel, RTALForConditionalGeneration),
}

for _model_type, (_config, _model, _lm) in FAMILIES.items():
    AutoConfig.register(_model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_config, _lm, exist_ok=True)

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
    "GTransConfig",
    "GTransForConditionalGeneration",
    "GTransModel",
    "LayerwiseCoordinationConfig",
    "LayerwiseCoordinationForConditionalGeneration",
    "LayerwiseCoordinationModel",
    "DeepRepresentationsConfig",
    "DeepRepresentationsForConditionalGeneration",
    "DeepRepresentationsModel",
    "ReTransformerConfig",
    "ReTransformerForConditionalGeneration",
    "ReTransformerModel",
    "LayerFusionConfig",
    "LayerFusionForConditionalGeneration",
    "LayerFusionModel",
    "LayerFusionPreTrainedModel",
    "PlainTransformerConfig",
    "PlainTransformerForConditionalGeneration",
    "PlainTransformerModel",
    "RTALConfig",
    "RTALForConditionalGeneration",
    "RTALModel",
    "builtin_number_corpus",
    "compute_translation_metrics",
    "corpus_bleu",
    "fast_generate",
    "from_marian",
    "from_xlmr",
    "load_bleu_metric",
    "load_json_lines_translation",
    "load_parallel_text",
    "load_xlmr_tokenizer",
    "load_translation_dataset",
    "prepare_for_inference",
    "preprocess_translation",
    "train_joint_tokenizer",
    "translate",
    "write_model_card",
    "LayerFusionTranslationPipeline",
    "generate_remote_code",
    "push_to_hub",
]
