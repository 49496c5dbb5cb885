"""Configuration shared by every hf_layerfusion family.

`LayerFusionConfig` holds the knobs of the shared encoder-decoder backbone (the Transformer of Vaswani et al.
as implemented by Marian/fairseq). Every family's config subclasses it and adds only its fusion knobs. Key names
follow `MarianConfig` so that a Marian checkpoint's config maps onto it one to one.

Every key is checked against its declared type when a config is built and again when a model is built from it
(`check_types`): a switch declared `bool` accepts only `True` / `False` (not `"false"`, `0` or `None`), a number is
never a bool, and a float knob is finite. One check for every family, since the annotations are read here (they are
strings: this module, the family modules and the generated Hub code use `from __future__ import annotations`, which
turns off the type checks of `@strict`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import sys
import types
import typing
from typing import ClassVar

import torch
from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from ..compat import CACHE_NAME, default_generation_parameters
from .presets import BACKBONE_PRESETS

ACTIVATIONS = ("relu", "gelu", "gelu_new", "swish", "silu", "tanh")
# Keys that are not fields of the config but that transformers itself passes to a config's constructor (read by
# `PreTrainedConfig.__post_init__`, written into config.json by `to_dict`, or kept on configs for other libraries).
# Any other unknown keyword is a misspelling and refused by name.
TRANSFORMERS_CONFIG_KEYS = frozenset(
    {
        "model_type",
        "name_or_path",
        "_name_or_path",
        "_commit_hash",
        "torch_dtype",
        "num_labels",
        "output_attentions",
        "attn_implementation",
        "experts_implementation",
        "_attn_implementation_internal",
        "_experts_implementation_internal",
        "per_layer_config",
        "auto_map",
        "custom_pipelines",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "sep_token_id",
        "quantization_config",
        "transformers_version",
        "architectures",
    }
)
# Attributes that transformers sets on a built config, so that a config.json of the family saved afterwards holds
# them: accepted there, never as keywords (`rms_norm_eps=` must not pass for a knob of this package).
SAVED_TRANSFORMERS_ATTRIBUTES = frozenset(
    {
        "fusion_config",  # from_pretrained(..., fusion_config=...)
        # other models' names of the LayerNorm epsilon, set on every config by transformers' test utilities
        # (`transformers.testing_utils.set_config_for_less_flaky_test`)
        "rms_norm_eps",
        "post_norm_eps",
        "norm_eps",
        "norm_epsilon",
        "layer_norm_epsilon",
        "batch_norm_eps",
    }
)
# transformers' own switches, the defaults of every forward call: checked like the package's keys (`return_dict="no"`
# is truthy, and `output_hidden_states="no"` fails deep inside transformers naming nothing)
TRANSFORMERS_SWITCHES = {name: bool | None for name in ("return_dict", "output_hidden_states", "output_attentions")}
# the special token ids of the config, checked against `vocab_size`; the generation ones are read from a config.json
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
GENERATION_TOKEN_ID_KEYS = ("forced_bos_token_id", "forced_eos_token_id")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
# `embedding_init`: N(0, init_std) as Marian / transformers, or N(0, d_model^-1/2) as fairseq and THUMT
EMBEDDING_INITS = ("init_std", "rsqrt_d_model")
# the models compute in float32 (or lower): a float knob beyond its range is infinite there, one below its smallest
# normal number a zero or a denormal (`probability_temperature=1e-46` divides by 0, `layer_norm_eps=1e-46` is no eps)
FLOAT32 = torch.finfo(torch.float32)


@functools.cache
def declared_field_types(config_class: type) -> dict[str, object]:
    """The declared type of every config key this package defines (in `LayerFusionConfig` and its subclasses), with
    string annotations evaluated in the namespace of the module that declares them (as `typing.get_type_hints`
    does, which cannot be used on the whole class: transformers' own annotations name modules it does not import),
    and of transformers' switches (`TRANSFORMERS_SWITCHES`)."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    declared = dict(TRANSFORMERS_SWITCHES)
    for klass in reversed(config_class.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, LayerFusionConfig)):
            continue
        namespace = vars(sys.modules[klass.__module__])
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if name in fields:
                declared[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
    return declared


def value_has_type(value, declared) -> bool:
    """Whether `value` is of the declared type: bools only for `bool` (not for `int` / `float`), ints also for
    `float`, unions and `list[...]` element by element."""
    if typing.get_origin(declared) in (typing.Union, types.UnionType):
        return any(value_has_type(value, member) for member in typing.get_args(declared))
    if typing.get_origin(declared) is list:
        (item,) = typing.get_args(declared)
        return isinstance(value, list) and all(value_has_type(element, item) for element in value)
    if declared is type(None):
        return value is None
    if declared is bool:
        return value is True or value is False
    if isinstance(value, bool):
        return False
    if declared is float:
        return isinstance(value, (int, float))
    return isinstance(value, declared)


def check_value_type(name: str, value, declared) -> None:
    """Raise a `ValueError` naming key `name` if `value` is not of its declared type, or is a number that float32
    cannot hold (NaN, infinite, beyond its range, or nonzero below its smallest normal number)."""
    if declared is bool and not value_has_type(value, bool):
        raise ValueError(f"`{name}` is a switch and must be True or False, got {value!r}.")
    if not value_has_type(value, declared):
        described = getattr(declared, "__name__", str(declared))
        raise ValueError(f"`{name}` must be of type {described}, got {value!r} ({type(value).__name__}).")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value and not FLOAT32.tiny <= abs(value) <= FLOAT32.max:
        in_float32 = "infinite" if abs(value) > FLOAT32.max else "zero or denormal"
        raise ValueError(
            f"`{name}` must be 0 or of magnitude in [{FLOAT32.tiny:.4g}, {FLOAT32.max:.4g}]: the models compute in "
            f"float32, where {value!r} is {in_float32}."
        )


def families_with_key(key: str) -> list[str]:
    """The `model_type` of every family config (subclass of `LayerFusionConfig`, the Hub code's own included) that has
    `key` as a field, sorted."""
    found, pending = set(), [LayerFusionConfig]
    while pending:
        klass = pending.pop()
        pending.extend(klass.__subclasses__())
        if klass is not LayerFusionConfig and key in {field.name for field in dataclasses.fields(klass)}:
            found.add(klass.model_type)
    return sorted(found)


@strict
class LayerFusionConfig(PreTrainedConfig):
    r"""
    Backbone configuration (no fusion). Every family config inherits these keys.

    Args:
        vocab_size: size of the joint source/target vocabulary (the embeddings are shared by encoder, decoder
            and, with `tie_word_embeddings`, the output projection).
        d_model, encoder_layers, decoder_layers, encoder_attention_heads, decoder_attention_heads,
        encoder_ffn_dim, decoder_ffn_dim: Transformer dimensions, as in `MarianConfig`.
        max_position_embeddings: length of the position table; longer inputs are rejected with a `ValueError`.
        position_embedding_type: `"sinusoidal"` (Marian/fairseq: fixed table, positions start at 0) or
            `"learned"` (RoBERTa/XLM-R: learned table, positions start at `pad_token_id + 1` and pads keep the
            padding position; the table then has `max_position_embeddings + pad_token_id + 1` rows).
        layernorm_embedding: LayerNorm on the embedding sum (XLM-R has one, Marian does not).
        normalize_before: pre-norm layers (LayerNorm before each sub-layer, plus a final LayerNorm on each stack).
            Post-norm is the default, as in GTrans and Dou et al. (deep representations) and in Marian; RTAL trained
            with tensor2tensor's `transformer_base`, which is pre-norm (its `"rtal_paper"` preset sets True).
        activation_function: activation of the feed-forward sub-layers.
        scale_embedding: multiply token embeddings by sqrt(d_model) (Marian: True, XLM-R: False).
        dropout, attention_dropout, activation_dropout: dropout probabilities.
        layer_norm_eps: epsilon of every LayerNorm (1e-5 as Marian; XLM-R uses 1e-5 too).
        label_smoothing: label smoothing of the training loss, applied by the model itself (per decoder group
            where a family predicts from several groups). Set it here rather than through
            `Seq2SeqTrainingArguments.label_smoothing_factor` (see `hf_layerfusion.LayerFusionSeq2SeqTrainer`).
        decay_fusion_weights: apply the optimizer's weight decay (`Seq2SeqTrainingArguments.weight_decay`) to the
            fusion weights too (the parameters held by the readouts that report `fusion_weights()`). Off by default:
            like LayerNorm gains (which transformers never decays) they are scales, and decay would pull them towards
            0 (GTrans: sigma = 1/2, uniform psi), a prior no paper states; read by
            `hf_layerfusion.LayerFusionSeq2SeqTrainer`. Only matters with `weight_decay > 0` (transformers' default
            is 0).
        init_std: standard deviation of the normal initialisation of linear weights, and of embeddings with
            `embedding_init="init_std"`.
        embedding_init: initialisation of every embedding table (tokens, learned positions, a family's learned
            embeddings such as layer-wise coordination's language embeddings): `"init_std"` (default) N(0, init_std),
            Marian's and transformers' 0.02; `"rsqrt_d_model"` N(0, d_model^-1/2), fairseq's and THUMT's, which
            with `scale_embedding` gives token embeddings of variance 1 per dimension, the scale of the sinusoidal
            positions. The padding row starts at zero either way.
        decoder_start_token_id: the first decoder input. Left unset (None) it is the id of the family's start
            token, the special token named by the class attribute `decoder_start_token`: `eos_token_id` (Marian's
            and fairseq's `</s>`) for every family but layer-wise coordination (`bos_token_id`, the paper's SOS), so
            that a tool which sets only the tokenizer's pad / bos / eos ids starts each family as its paper does.
            With several end tokens (`eos_token_id` a list) it is the first of them.
    """

    model_type = "layerfusion_backbone"
    keys_to_ignore_at_inference = [CACHE_NAME]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 32000
    max_position_embeddings: int = 512
    position_embedding_type: str = "sinusoidal"
    layernorm_embedding: bool = False
    encoder_layers: int = 6
    encoder_ffn_dim: int = 2048
    encoder_attention_heads: int = 8
    decoder_layers: int = 6
    decoder_ffn_dim: int = 2048
    decoder_attention_heads: int = 8
    d_model: int = 512
    activation_function: str = "relu"
    normalize_before: bool = False
    scale_embedding: bool = True
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    layer_norm_eps: float = 1e-5
    label_smoothing: float | int = 0.0
    decay_fusion_weights: bool = False
    init_std: float = 0.02
    embedding_init: str = "init_std"
    use_cache: bool = True
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = None

    # the special token an unset `decoder_start_token_id` takes the id of (the family's start token)
    decoder_start_token: ClassVar[str] = "eos_token_id"

    def __post_init__(self, **kwargs):
        self.check_keywords(kwargs)
        # generation keys of a config.json (`forced_eos_token_id`) are dropped by transformers' __post_init__ but
        # become the generation config of a model loaded from that file: checked here, while they are still seen
        self.check_token_ids({name: kwargs[name] for name in GENERATION_TOKEN_ID_KEYS if name in kwargs})
        # a config.json of another family loaded into this one (a plain checkpoint as deep representations) carries
        # that family's `model_type`; kept, it would shadow the class's and name the wrong family on this config
        kwargs.pop("model_type", None)
        if self.decoder_start_token_id is None:
            start = getattr(self, self.decoder_start_token)
            if isinstance(start, (list, tuple)) and not start:
                raise ValueError(
                    f"`{self.decoder_start_token}` is an empty list: give a token id (or a list of them)."
                )
            # several end tokens (`eos_token_id=[2, 11]`, as generation configs allow): the first is the start
            self.decoder_start_token_id = start[0] if isinstance(start, (list, tuple)) and start else start
        super().__post_init__(**kwargs)
        self.check_consistency()

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        cls.check_model_type_of_auto_map(config_dict)
        if config_dict.get("model_type") == cls.model_type:
            config_dict = cls.upgrade_saved_config(config_dict)
        loaded = super().from_dict(config_dict, **kwargs)
        # transformers sets the keywords (`from_pretrained(path, dropout=5.0)`) after the constructor's checks
        (loaded[0] if isinstance(loaded, tuple) else loaded).check_consistency()
        return loaded

    @classmethod
    def check_model_type_of_auto_map(cls, config_dict: dict) -> None:
        """Refuse a saved config whose `auto_map` names this class for AutoConfig while its `model_type` names
        another family: one of the two was edited after saving. The Hub code loads the class `auto_map` names, and
        would run the weights as that family whatever `model_type` says; the package, which picks the class by
        `model_type`, refuses the other family's keys (`check_keywords`). Both refuse the file, naming the two."""
        saved_model_type = config_dict.get("model_type")
        auto_config = (config_dict.get("auto_map") or {}).get("AutoConfig")
        if saved_model_type in (None, cls.model_type) or not isinstance(auto_config, str):
            return
        if auto_config.rsplit(".", 1)[-1] == cls.__name__:  # `modeling_layerfusion.GTransConfig`, `repo--...`
            raise ValueError(
                f"This config.json has model_type {saved_model_type!r}, but its auto_map names {cls.__name__} "
                f"(model_type {cls.model_type!r}): one of the two was changed after saving (the package writes them "
                f"together, from the model's family). Put the family's model_type back ({cls.model_type!r}): its "
                "weights need that family's model."
            )

    @classmethod
    def upgrade_saved_config(cls, config_dict: dict) -> dict:
        """A saved config.json of this family (`from_pretrained`) with the keys added since it was written set to
        what the checkpoint was built with. Families whose new keys change what an old checkpoint meant override
        this; by default a missing key takes its default."""
        return config_dict

    # Set when hf_layerfusion is imported (`hf_layerfusion.hub.remote_code.write_remote_code`): writes the
    # self-contained Hub code and `auto_map` next to config.json. Left unset in that Hub code, whose classes re-save
    # their own file through transformers' `_auto_class` machinery.
    hub_code_writer = None

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        if self.hub_code_writer is not None:
            self.hub_code_writer(save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @classmethod
    def check_keywords(cls, kwargs: dict) -> None:
        """Refuse a keyword that is neither a field of this config, an alias of `attribute_map`, a generation
        parameter of old configs, nor a key transformers passes itself: `encoder_grup_size=2` must not be stored as
        an unused attribute while the model silently uses the default. This holds for a config.json of this family
        too (a misspelt `decoder_fusoin` there would be kept as an attribute the model never reads). A config.json of
        another family loads only if every key of it is a key of this family (a plain Transformer checkpoint as
        GTrans, whose fusion weights then start fresh), not the other way round (GTrans' group keys would be
        dropped)."""
        allowed = TRANSFORMERS_CONFIG_KEYS | set(cls.attribute_map) | set(default_generation_parameters())
        unknown = sorted(key for key in kwargs if key not in allowed)
        if not unknown:
            return
        saved_model_type = kwargs.get("model_type")
        if saved_model_type is not None:
            # a config.json (only saved configs carry `model_type`) may hold what transformers set before saving
            unknown = [key for key in unknown if key not in SAVED_TRANSFORMERS_ATTRIBUTES]
            if not unknown:
                return
        if saved_model_type is not None and saved_model_type != cls.model_type:
            raise ValueError(
                f"This is a {saved_model_type!r} config with keys {unknown} that {cls.__name__} (model_type "
                f"{cls.model_type!r}) does not have. Load it with its own family (AutoConfig / AutoModelForSeq2SeqLM "
                "once hf_layerfusion is imported)."
            )
        where = " in this config.json" if saved_model_type is not None else ""
        owners = {key: families_with_key(key) for key in unknown}
        other_family = {key: families for key, families in owners.items() if families}
        if other_family:
            # a config.json of another family whose `model_type` was edited, or a knob given to the wrong family
            raise TypeError(
                f"{cls.__name__} (model_type {cls.model_type!r}) got key(s) of other families{where}: "
                + ", ".join(f"{key!r} ({', '.join(families)})" for key, families in other_family.items())
                + ". Build the config of the family that has them; for a config.json whose `model_type` was changed, "
                "put the family's model_type back (its weights need that family's model)."
            )
        fields = sorted(field.name for field in dataclasses.fields(cls))
        hints = "".join(
            f"; {key!r}: did you mean {match[0]!r}?"
            for key in unknown
            if (match := difflib.get_close_matches(key, fields + sorted(cls.attribute_map), n=1))
        )
        fix = "; correct or delete the key in the file" if where else ""
        raise TypeError(f"{cls.__name__} got unknown keyword(s) {unknown}{where}{hints}{fix}. Its keys: {fields}.")

    def check_types(self) -> None:
        """Raise a `ValueError` naming the first key whose value is not of its declared type (a switch that is not
        `True` / `False`, a bool given for a number) or a float knob that is NaN or infinite."""
        for name, declared in declared_field_types(type(self)).items():
            # transformers' switches are not set yet where a family checks before its `__post_init__` (Re-Transformer)
            value = getattr(self, name, None) if name in TRANSFORMERS_SWITCHES else getattr(self, name)
            check_value_type(name, value, declared)

    def __setattr__(self, name, value):
        # a key set after the config was built (`model.config.allow_external_loss = "no"`, a keyword of
        # `from_pretrained`) gets the type check of the constructor: a model reads some keys only when it runs
        declared = declared_field_types(type(self)).get(self.attribute_map.get(name, name))
        if declared is not None:
            check_value_type(name, value, declared)
        super().__setattr__(name, value)

    def check_token_ids(self, token_ids: dict) -> None:
        """Raise a `ValueError` naming the first token id (`{key: id, list of ids or None}`) outside [0, vocab_size):
        an id beyond the embedding table fails only at the first forward pass or generation, naming no key."""
        for name, value in token_ids.items():
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is None:
                    continue
                if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                    raise ValueError(
                        f"`{name}` ({value!r}) must be a token id in [0, vocab_size={self.vocab_size}): the id of a "
                        "token of the tokenizer (`tokenizer.convert_tokens_to_ids`), or `vocab_size` raised to cover it."
                    )

    def check_consistency(self) -> None:
        """Raise a `ValueError` naming the first inconsistent value. Families extend this."""
        self.check_types()
        if self.is_encoder_decoder is not True:  # generate() would run the model as a decoder-only one
            raise ValueError(f"`is_encoder_decoder` must be True (every hf_layerfusion family is an encoder-decoder), "
                             f"got {self.is_encoder_decoder!r}.")
        for name in (
            "vocab_size",
            "max_position_embeddings",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_model",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        for heads_name in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, heads_name)
            if self.d_model % heads:
                raise ValueError(f"`d_model` ({self.d_model}) must be divisible by `{heads_name}` ({heads}).")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"Unknown `activation_function` {self.activation_function!r}; choose one of {ACTIVATIONS}."
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"Unknown `position_embedding_type` {self.position_embedding_type!r}; "
                f"choose one of {POSITION_EMBEDDING_TYPES}."
            )
        if self.embedding_init not in EMBEDDING_INITS:
            raise ValueError(f"Unknown `embedding_init` {self.embedding_init!r}; choose one of {EMBEDDING_INITS}.")
        if self.position_embedding_type == "learned" and self.pad_token_id is None:
            raise ValueError("`position_embedding_type='learned'` needs `pad_token_id` (RoBERTa-style offset).")
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must lie in [0, 1), got {getattr(self, name)}.")
        for name in ("layer_norm_eps", "init_std"):
            # 0 or below: LayerNorm divides by sqrt(var + eps) (NaN for a constant input), normal_() refuses std < 0
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be a positive number, got {getattr(self, name)!r}.")
        self.check_token_ids({name: getattr(self, name) for name in TOKEN_ID_KEYS})
        if not self.tie_word_embeddings:
            raise ValueError(
                "`tie_word_embeddings=False` is not supported: hf_layerfusion shares one embedding matrix between "
                "encoder, decoder and output projection (the joint-vocabulary setting of the papers and of Marian)."
            )
        if self.decoder_start_token_id is None:
            raise ValueError(
                f"`decoder_start_token_id` must be set: the decoder input is the labels shifted right (unset it is "
                f"`{self.decoder_start_token}`, None here)."
            )

    # named settings of one family (e.g. Re-Transformer-2), found by `from_preset` next to the backbone sizes
    family_presets: ClassVar[dict[str, dict]] = {}

    @classmethod
    def from_preset(cls, name: str, **overrides):
        """A config of this family with a named backbone size (`BACKBONE_PRESETS`), e.g. `"opus100"`, or a named
        setting of the family (`family_presets`)."""
        presets = {**BACKBONE_PRESETS, **cls.family_presets}
        if name not in presets:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(presets)}.")
        return cls(**{**presets[name], **overrides})

    @property
    def encoder_layer_layouts(self) -> list[str]:
        """Sub-layers of each encoder layer (`s` self-attention, `f` feed-forward); families may change them."""
        return ["sf"] * self.encoder_layers

    @property
    def decoder_layer_layouts(self) -> list[str]:
        """Sub-layers of each decoder layer (`s` self-attention, `c` cross-attention, `f` feed-forward)."""
        return ["scf"] * self.decoder_layers

    @property
    def decoder_cache_layers(self) -> int:
        """KV-cache slots the decoder uses (one per attention sub-layer of a kind; families whose attention keeps
        more keys/values per sub-layer override this). Generation allocates this many cache layers."""
        layouts = self.decoder_layer_layouts
        return max(sum(layout.count("s") for layout in layouts), sum(layout.count("c") for layout in layouts))

    def get_text_config(self, decoder=None, encoder=None):
        text_config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder:
            # caches (dynamic and static) are sized from the decoder text config's `num_hidden_layers`; families
            # whose decoder layers keep more than one self-attention slot need more than `decoder_layers`. The
            # returned view has the `decoder_*` keys renamed away (transformers' flat encoder-decoder handling), and
            # `DynamicCache(config=view)` asks the view again: it answers with the count it was given.
            cache_layers = self.__dict__.get("_decoder_view_cache_layers") or self.decoder_cache_layers
            text_config.num_hidden_layers = text_config._decoder_view_cache_layers = cache_layers
        return text_config

    @property
    def num_decoder_groups(self) -> int:
        """Output groups the decoder predicts from (`decoder_groups` selects among them); 1 unless a family's decoder
        readout has several (GTrans)."""
        return 1

    @classmethod
    def adapt_marian_checkpoint(cls, backbone: dict, overrides: dict, state_dict: dict) -> tuple[dict, dict, list[str]]:
        """`from_marian` hook: the config keywords of the converted model, the part of the Marian checkpoint (backbone
        names) it loads, and the checkpoint keys it leaves out. Default: the backbone keys with the overrides, the
        whole checkpoint; a family whose layer layouts may have no place for some sub-layers picks what fits."""
        return {**backbone, **overrides}, state_dict, []

    @property
    def uses_position_embeddings(self) -> bool:
        """Whether the stacks add position embeddings to the token embeddings (a family's ablation may drop them)."""
        return True

    @property
    def position_offset(self) -> int:
        """First position index (0 for sinusoidal tables, `pad_token_id + 1` for RoBERTa-style learned ones)."""
        return self.pad_token_id + 1 if self.position_embedding_type == "learned" else 0
