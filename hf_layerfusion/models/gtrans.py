"""GTrans, the Group-Transformer (Yang et al., "GTrans: Grouping and Fusing Transformer Layers for Neural
Machine Translation"; equations numbered as in `shared/papers/gtrans.txt`).

Encoder layers form groups of `encoder_group_size` T_e; the last state of each group is fused into the memory
every cross-attention reads (Eq. 1-2). Decoder layers form groups of `decoder_group_size` T_d; each group's
states are fused (Eq. 3-4) and predict their own softmax; the output distribution is the psi-weighted mixture of
the group softmaxes (Eq. 5-6), trained with the psi-weighted sum of the group cross entropies (Eq. 7).

Choices where the paper is silent (tested in tests/test_gtrans.py and tests/test_gtrans_study_knobs.py; the audit
against the paper is docs/gtrans_study.md):
- every fusion weight `w` starts at `fusion_weight_init` = 0: sigma(w) = 1/2 for each fused state and psi uniform
  over groups. Under Eq. 2's LayerNorm equal gates cancel, so at the encoder only their ratios matter; Eq. 4 has
  no LayerNorm, so sigma(0) = 1/2 scales each decoder group feature (and its logits) by 1/2 at the start;
- no dropout on the fused states unless `fused_state_dropout` > 0 (then on the fused memory of Eq. 2 and on each
  decoder group feature of Eq. 4);
- the fusion weights are excluded from the optimizer's weight decay (`decay_fusion_weights`, a backbone key, read
  by `LayerFusionSeq2SeqTrainer`); with weight decay they would be pulled back to sigma = 1/2 and uniform psi;
- mixing a subset of groups (Table VI, `decoder_groups`) renormalises psi over that subset (Eq. 6 restricted);
- label smoothing, when set, is applied to every group's cross entropy inside Eq. 7;
- in training, when labels are given and gradients are on, `logits` (the mixture) is not computed: Eq. 7 is
  computed on the non-pad positions only by `weighted_group_cross_entropy`, which projects one chunk of tokens
  of one group at a time and computes its gradients in the same pass, so memory stays at one chunk's
  `tokens x vocab` instead of N copies of `batch x length x vocab`, at the matmul cost of plain autograd.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import initialization as init
from transformers.generation import GenerationMixin

from ..modeling.configuration import LayerFusionConfig
from ..modeling.extension_points import DecoderReadout, EncoderReadout, FusionParameters, TopLayerReadout
from ..modeling.fused_cross_entropy import weighted_group_cross_entropy
from ..modeling.input_checks import check_decoder_groups
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel, token_cross_entropy
from ..modeling.outputs import HeadOutput
from ..modeling.registry import register_family


@strict
class GTransConfig(LayerFusionConfig):
    r"""
    GTrans configuration: the backbone keys of `LayerFusionConfig` plus

    Args:
        encoder_group_size: T_e, encoder layers per group; M = ceil(encoder_layers / T_e) groups (Eq. 2).
        decoder_group_size: T_d, decoder layers per group; N = ceil(decoder_layers / T_d) groups (Eq. 3-4).
        encoder_fusion: fuse encoder groups (Eq. 2); False feeds cross-attention the top layer (Table VIII).
        decoder_fusion: group fusion and probability mixture (Eq. 4-7); False predicts from the top layer.
        probability_temperature: tau of Eq. 6; `None` means sqrt(d_model), the paper's value. With Adam, dividing
            w^{dp} by tau is the same as a tau times smaller learning rate for the logits of psi.
        fusion_weight_init: initial value of every fusion weight w^e, w^{dr}, w^{dp} (the paper does not say;
            0 gives sigma = 1/2 and uniform psi).
        fused_state_dropout: dropout probability on the fused encoder memory (Eq. 2) and on every decoder group
            feature (Eq. 4) in training (the paper does not say; 0 = none).
        allow_external_loss: let a training-mode forward without `labels` return the mixture logits for a loss
            computed outside the model. Off by default because that is what `Seq2SeqTrainer` does when
            `label_smoothing_factor > 0`, which would silently train on the mixture instead of Eq. 7.

    `GTransConfig.from_preset("opus100")` gives the OPUS-100 setting (12/6 layers, d 768, FFN 3072, 12 heads,
    T_e = 3, T_d = 2), `"iwslt"` and `"multi30k"` the small ones.
    """

    model_type = "gtrans"

    encoder_group_size: int = 3
    decoder_group_size: int = 2
    encoder_fusion: bool = True
    decoder_fusion: bool = True
    probability_temperature: float | None = None
    fusion_weight_init: float | int = 0.0
    fused_state_dropout: float | int = 0.0
    allow_external_loss: bool = False

    def check_consistency(self) -> None:
        super().check_consistency()
        for size_name, layers_name, fused in (
            ("encoder_group_size", "encoder_layers", self.encoder_fusion),
            ("decoder_group_size", "decoder_layers", self.decoder_fusion),
        ):
            size, layers = getattr(self, size_name), getattr(self, layers_name)
            # a stack without fusion forms no groups, so its group size is free (e.g. a 2-layer Marian model)
            if size < 1 or (fused and size > layers):
                raise ValueError(f"`{size_name}` must lie in [1, {layers_name}={layers}], got {size}.")
        if self.probability_temperature is not None and self.probability_temperature <= 0:
            raise ValueError(f"`probability_temperature` must be positive, got {self.probability_temperature}.")
        if not 0.0 <= self.fused_state_dropout < 1.0:
            raise ValueError(f"`fused_state_dropout` must lie in [0, 1), got {self.fused_state_dropout}.")

    @property
    def num_encoder_groups(self) -> int:
        return math.ceil(self.encoder_layers / self.encoder_group_size)

    @property
    def num_decoder_groups(self) -> int:
        return math.ceil(self.decoder_layers / self.decoder_group_size) if self.decoder_fusion else 1


class GTransEncoderFusion(EncoderReadout, FusionParameters):
    """Eq. 1-2: `h^{ef} = LN(1/M * sum_{i=1..M} sigma(w_i^e) h_{alpha_i})`, alpha_i = min(i T_e, L_e)."""

    def __init__(self, config: GTransConfig):
        super().__init__()
        num_groups = config.num_encoder_groups
        # alpha_i: indices into the states [s_0 (embeddings), s_1, .., s_L]
        self.group_last_layers = [min(i * config.encoder_group_size, config.encoder_layers) for i in range(1, num_groups + 1)]
        self.initial_weight = float(config.fusion_weight_init)
        self.weight = nn.Parameter(torch.full((num_groups,), self.initial_weight))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = float(config.fused_state_dropout)

    def init_fusion_weights(self):
        init.constant_(self.weight, self.initial_weight)

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """sigma(w_i^e) of each encoder group (Eq. 2; GTrans Fig. 8 plots these)."""
        return {"encoder_group_gate": torch.sigmoid(self.weight)}

    def memory(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        gates = torch.sigmoid(self.weight).to(states[0].dtype)
        fused = sum(gate * states[alpha] for gate, alpha in zip(gates, self.group_last_layers))
        return F.dropout(self.layer_norm(fused / len(self.group_last_layers)), self.dropout, self.training)


class GTransDecoderFusion(DecoderReadout, FusionParameters):
    """Eq. 3-4: group k fuses its layers `h_k^{df} = sum_{i in group k} sigma(w_i^{dr}) h_i`; also holds the
    probability-fusion weights `w^{dp}` of Eq. 5-6."""

    def __init__(self, config: GTransConfig):
        super().__init__()
        self.group_size = config.decoder_group_size
        self.num_layers = config.decoder_layers
        self.num_groups = config.num_decoder_groups
        self.temperature = config.probability_temperature or math.sqrt(config.d_model)
        self.initial_weight = float(config.fusion_weight_init)
        self.layer_weight = nn.Parameter(torch.full((config.decoder_layers,), self.initial_weight))  # w^{dr}
        self.group_weight = nn.Parameter(torch.full((self.num_groups,), self.initial_weight))  # w^{dp}
        self.dropout = float(config.fused_state_dropout)

    def init_fusion_weights(self):
        init.constant_(self.layer_weight, self.initial_weight)
        init.constant_(self.group_weight, self.initial_weight)

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """sigma(w^{dr}) per decoder layer (Eq. 4, Fig. 8) and psi per decoder group (Eq. 6, Fig. 9)."""
        return {
            "decoder_layer_gate": torch.sigmoid(self.layer_weight),
            "decoder_group_psi": self.log_mixture_weights(range(1, self.num_groups + 1)).exp(),
        }

    def group_layers(self, group: int) -> range:
        """0-based layer indices of 1-based group k: layers (k-1)T_d+1 .. min(k T_d, L_d) of the paper."""
        return range((group - 1) * self.group_size, min(group * self.group_size, self.num_layers))

    def num_layers_needed(self, groups: Sequence[int], num_layers: int) -> int:
        return self.group_layers(max(groups)).stop

    def group_features(self, states: Sequence[torch.Tensor], groups: Sequence[int]) -> tuple[torch.Tensor, ...]:
        gates = torch.sigmoid(self.layer_weight).to(states[0].dtype)
        # states[i + 1] is the output of 0-based layer i (states[0] is the embedding output)
        return tuple(
            F.dropout(sum(gates[i] * states[i + 1] for i in self.group_layers(k)), self.dropout, self.training)
            for k in groups
        )  # Eq. 4

    def log_mixture_weights(self, groups: Sequence[int]) -> torch.Tensor:
        """Eq. 6, log psi over the mixed groups: log_softmax(w^{dp} / tau) restricted to `groups`."""
        index = torch.tensor([k - 1 for k in groups], device=self.group_weight.device)
        return F.log_softmax(self.group_weight.index_select(0, index).float() / self.temperature, dim=0)


class GTransModel(LayerFusionModel):
    config_class = GTransConfig

    def build_readout(self, config: GTransConfig, is_decoder: bool) -> EncoderReadout | DecoderReadout:
        if is_decoder:
            return GTransDecoderFusion(config) if config.decoder_fusion else TopLayerReadout()
        return GTransEncoderFusion(config) if config.encoder_fusion else TopLayerReadout()


@register_family
class GTransForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    """GTrans with the probability-fusion output (Eq. 5-7). With several output groups, `logits` are `log P(y|x)`
    of the mixture, so greedy, beam search and sampling score hypotheses by the true mixture distribution. With a
    single group (decoder fusion off, or one entry in `decoder_groups`) they are that group's raw vocabulary scores,
    as in any HF model; generation normalises both the same way.

    Eq. 5 in probability space, log sum_i psi_i softmax(h_i^{df} W_o), is the backbone's declared output mixture
    (`mix_output_groups`, `extension_points.probability_mixture`), and the group logits come from
    `project_output_groups`: the inference copies run both as compiled kernels (`set_output_kernels`), so GTrans
    declares nothing else to be fast."""

    config_class = GTransConfig
    model_class = GTransModel

    def output_head(self, group_features, groups, labels, num_items_in_batch, return_group_log_probs) -> HeadOutput:
        if len(group_features) == 1:  # decoder fusion off, or one group mixed: a single softmax
            return super().output_head(group_features, groups, labels, num_items_in_batch, return_group_log_probs)
        if self.training and labels is None and torch.is_grad_enabled() and not self.config.allow_external_loss:
            raise ValueError(
                "GTrans was called in training mode without `labels`: its multi-level loss (Eq. 7) needs them. "
                "Seq2SeqTrainer strips labels when `label_smoothing_factor > 0` and would train on the mixture "
                "instead: use `hf_layerfusion.LayerFusionSeq2SeqTrainer` (or set `model.config.label_smoothing` "
                "and leave `label_smoothing_factor=0`). To compute your own loss on the mixture logits, set "
                "`model.config.allow_external_loss = True`."
            )
        log_psi = self.model.decoder.readout.log_mixture_weights(check_decoder_groups(groups, self.config.num_decoder_groups))
        psi = log_psi.exp()
        logits = group_log_probs = None
        # the memory-aware loss multiplies by `lm_head.weight` itself, so it runs only where that weight is the whole
        # projection: an adapter on the head (PEFT's LoRA) or a quantized head projects through its own module
        head_is_its_weight = type(self.lm_head) is nn.Linear
        if (self.training and labels is not None and torch.is_grad_enabled() and not return_group_log_probs
                and head_is_its_weight):
            # memory-aware Eq. 7: only non-pad positions are projected (the loss ignores the others), chunk by
            # chunk, with the gradients computed in the same pass so that no group's logits are kept
            keep = labels.ne(-100)
            loss = weighted_group_cross_entropy(
                torch.stack([f[keep] for f in group_features]),
                self.lm_head.weight,
                self.final_logits_bias[0].to(group_features[0].dtype),
                psi,
                labels[keep],
                self.config.label_smoothing,
                num_items_in_batch,
            )  # Eq. 7
        else:
            group_logits = self.project_output_groups(group_features).float()  # h_i^{df} W_o for every group
            logits = self.mix_output_groups(group_logits, psi)  # Eq. 5
            if return_group_log_probs:
                group_log_probs = F.log_softmax(group_logits, dim=-1)
            loss = None
            if labels is not None:
                group_ce = torch.stack(
                    [token_cross_entropy(g, labels, self.config.label_smoothing, num_items_in_batch) for g in group_logits]
                )
                loss = (psi * group_ce).sum()  # Eq. 7
        return HeadOutput(loss, logits, group_log_probs, psi if return_group_log_probs else None)

    def generate(self, inputs=None, generation_config=None, decoder_groups: Sequence[int] | None = None, **kwargs):
        """`generate()` that may mix a subset of decoder groups (paper Table VI: mixing groups 3..6 of 6 is close
        to mixing all). `decoder_groups` are 1-based; psi is renormalised over them, and decoder layers above the
        highest kept group are not computed."""
        if decoder_groups is not None:
            kwargs["decoder_groups"] = check_decoder_groups(decoder_groups, self.config.num_decoder_groups)
        return super().generate(inputs, generation_config, **kwargs)
