"""The base class of every model of the package: configuration class, supported attention implementations,
weight initialisation, checked saving and loading."""

from __future__ import annotations

import os

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_utils import PreTrainedModel

from ..file_checks import check_save_directory, check_weight_files, checkpoint_model_type
from .configuration import LayerFusionConfig
from .embeddings import SinusoidalPositionalEmbedding
from .extension_points import FusionParameters


class CheckedSaveLoadMixin:
    """Put before `PreTrainedModel` in the bases of the package's models:

    - `save_pretrained` onto an existing file raises (transformers logs one line and saves nothing);
    - `from_pretrained` of a local checkpoint of another family (its config.json's `model_type`) whose weights do not
      all fit the model raises, naming the weights that would be dropped (e.g. GTrans fusion weights loaded under a
      plain Transformer's `config=`), instead of printing a load report. Missing weights stay allowed (a plain
      Transformer checkpoint loads as GTrans with fresh fusion weights), and so do the head weights a base model
      leaves out of a checkpoint of its own family.
    """

    def save_pretrained(self, save_directory, *args, **kwargs):
        check_save_directory(save_directory)
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        check_weight_files(pretrained_model_name_or_path)  # a damaged weight file is named before transformers reads it
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        saved = (
            checkpoint_model_type(pretrained_model_name_or_path)
            if isinstance(pretrained_model_name_or_path, (str, os.PathLike))
            else None
        )
        unexpected = sorted(info.get("unexpected_keys", ()))
        if saved is not None and saved != model.config.model_type and unexpected:
            raise ValueError(
                f"{os.fspath(pretrained_model_name_or_path)!r} holds a {saved!r} checkpoint; loaded as "
                f"{model.config.model_type!r} ({type(model).__name__}) its weights {unexpected[:8]}"
                f"{' ...' if len(unexpected) > 8 else ''} would be dropped. Load it with its own family "
                "(AutoModelForSeq2SeqLM without `config=`)."
            )
        return (model, info) if want_info else model


class LayerFusionPreTrainedModel(CheckedSaveLoadMixin, PreTrainedModel):
    config: LayerFusionConfig
    config_class = LayerFusionConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    # the training loss is normalised by `num_items_in_batch` when the Trainer passes it
    accepts_loss_kwargs = True

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, nn.Embedding) and self.config.embedding_init == "rsqrt_d_model":
            # fairseq's `Embedding()`: N(0, d^-1/2), the padding row zero (skipped for weights loaded from a checkpoint)
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)
        if isinstance(module, SinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight(*module.weight.shape, dtype=module.weight.dtype))
        if isinstance(module, FusionParameters):
            # family modules own their fusion parameters and say how the paper initialises them
            module.init_fusion_weights()

    def fusion_parameter_names(self) -> list[str]:
        """Names (as `named_parameters()` gives them) of the fusion weights: the parameters held directly by the
        `FusionParameters` modules (gates, mixing weights, scales; their LayerNorms and feed-forward layers are
        sub-modules, not counted). `LayerFusionSeq2SeqTrainer` keeps them out of weight decay unless
        `config.decay_fusion_weights`."""
        return [
            f"{module_name}.{name}" if module_name else name
            for module_name, module in self.named_modules()
            if isinstance(module, FusionParameters)
            for name, _ in module.named_parameters(recurse=False)
        ]
