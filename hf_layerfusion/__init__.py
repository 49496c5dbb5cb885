"""hf_layerfusion: layer-fusion encoder-decoder models for NMT, as Hugging Face Transformers models.

The package, from the bottom up (each layer imports only from the ones below it):

- `file_checks`: checks of the paths, files and launches a user gives;
- `modeling/`: the shared backbone (configuration, embeddings, attention, layers, stacks, model, losses), its
  extension points, the family registry and the converters from Marian and XLM-R checkpoints;
- `models/`: the families, one module each, every one registered where it is defined;
- `inference/`: the fast decoding loop (`fast_generate`) and the float32 / int8 inference copies
  (`prepare_for_inference`);
- `translation/`: `translate()`, the target-language tags, the checked loading of a saved tokenizer, BLEU;
- `training/` (needs the `train` extra): data, tokenizers, the trainer and its callbacks, BLEU as trainer metrics,
  multilingual training, checkpoint averaging;
- `hub/`: the self-contained Hub code of saved models, model cards, the translation pipeline (beside `training/`:
  neither imports from the other).

Importing the package registers every family of `FAMILIES` with AutoConfig, AutoModel and AutoModelForSeq2SeqLM,
makes every saved model write its Hub code, and registers the translation pipeline with transformers. The names of
`training/` are imported when first used (`hf_layerfusion.LayerFusionSeq2SeqTrainer`), so that a user who only
translates imports the package without the `train` extra.
"""

import importlib

from transformers.utils.versions import require_version

from .version import TORCH_HINT, TORCH_REQUIREMENT, TRANSFORMERS_HINT, TRANSFORMERS_REQUIREMENT, __version__

# first: a transformers or torch release outside the supported range fails here, naming it, not later with an
# unrelated error
require_version(TRANSFORMERS_REQUIREMENT, TRANSFORMERS_HINT)
require_version(TORCH_REQUIREMENT, TORCH_HINT)

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM  # noqa: E402
from transformers.pipelines import PIPELINE_REGISTRY

from . import models  # noqa: F401  (imports every family module; each registers itself in FAMILIES)
from .hub.model_card import write_model_card
from .hub.pipeline import PIPELINE_TASK, LayerFusionTranslationPipeline
from .hub.remote_code import generate_remote_code, push_to_hub, write_remote_code
from .inference import export_ctranslate2, fast_generate, prepare_for_inference
from .modeling.configuration import LayerFusionConfig
from .modeling.conversion import from_marian, to_marian
from .modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from .modeling.pretrained import LayerFusionPreTrainedModel
from .modeling.registry import FAMILIES
from .modeling.xlmr import from_xlmr, load_xlmr_tokenizer
from .translation.bleu import corpus_bleu
from .translation.translate import translate

# every family's classes under their own names (`hf_layerfusion.GTransConfig`), and with the Auto classes
_family_classes = {cls.__name__: cls for family in FAMILIES.values() for cls in family}
globals().update(_family_classes)
for _family in FAMILIES.values():
    AutoConfig.register(_family.config.model_type, _family.config, exist_ok=True)
    AutoModel.register(_family.config, _family.model, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_family.config, _family.for_conditional_generation, exist_ok=True)

# every config of the package writes the Hub code when saved (the classes of that code leave this unset: transformers'
# `_auto_class` machinery copies their own file instead)
LayerFusionConfig.hub_code_writer = write_remote_code

# `pipeline("layerfusion-translation", model=...)`; transformers 5 refuses to resolve the task name "translation"
PIPELINE_REGISTRY.register_pipeline(
    PIPELINE_TASK, pipeline_class=LayerFusionTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

# name -> module of `training/` that defines it (imported by `__getattr__` on first use)
TRAINING_NAMES = {
    "FusionWeightsCallback": "callbacks",
    "LayerGradientNormCallback": "callbacks",
    "TimeBudgetCallback": "callbacks",
    "average_checkpoints": "checkpoint_averaging",
    "average_last_checkpoints": "checkpoint_averaging",
    "builtin_number_corpus": "data",
    "load_json_lines_translation": "data",
    "load_parallel_text": "data",
    "load_translation_dataset": "data",
    "preprocess_translation": "data",
    "compute_translation_metrics": "evaluation",
    "load_bleu_metric": "evaluation",
    "train_joint_tokenizer": "tokenization",
    "LayerFusionSeq2SeqTrainer": "trainer",
}


def __getattr__(name: str):
    if name not in TRAINING_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".training.{TRAINING_NAMES[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *TRAINING_NAMES})


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
    "export_ctranslate2",
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
    "to_marian",
    "train_joint_tokenizer",
    "translate",
    "write_model_card",
    "LayerFusionTranslationPipeline",
    "generate_remote_code",
    "push_to_hub",
    "__version__",
    *_family_classes,
]
