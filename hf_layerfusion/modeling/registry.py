"""The one registry of the families.

A family registers itself where it is defined, fairseq-style: its module under `hf_layerfusion/models/` decorates
its conditional-generation class with `@register_family`, which records the family's three classes (config, bare
model, model with the LM head) under its `model_type`. `hf_layerfusion/models/` imports every module it holds, so
a new module there is registered without being listed anywhere. Everything that needs the list of families reads
`FAMILIES`: the Auto-class registration and the package's public names (`hf_layerfusion.GTransConfig`), the Hub code
generator, the model-card template lookup, the checks of a `model_type` argument, the scripts, the benchmarks and the
tests.
"""

from __future__ import annotations

from typing import NamedTuple


class Family(NamedTuple):
    """A family's classes, as `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` load them."""

    config: type
    model: type
    for_conditional_generation: type


# model_type -> Family, in the order the family modules were imported
FAMILIES: dict[str, Family] = {}


def register_family(lm_class: type) -> type:
    """Class decorator of a family's `...ForConditionalGeneration`: registers it with its `config_class` and
    `model_class` under `config_class.model_type`. Refuses classes that do not fit together and a `model_type` that
    another family already has."""
    config_class, model_class = lm_class.config_class, lm_class.model_class
    if model_class.config_class is not config_class:
        raise TypeError(
            f"{lm_class.__name__}.model_class {model_class.__name__} has config_class "
            f"{model_class.config_class.__name__}, not {config_class.__name__}: a family's classes share one config."
        )
    family = Family(config_class, model_class, lm_class)
    registered = FAMILIES.setdefault(config_class.model_type, family)
    if registered != family:
        raise ValueError(
            f"model_type {config_class.model_type!r} of {config_class.__name__} is already the family of "
            f"{registered.config.__name__} ({registered.config.__module__}); give the new family a model_type of its own."
        )
    return lm_class


def family_of(config) -> Family | None:
    """The family whose config class `config` is an instance of (the most derived one), or None."""
    for klass in type(config).__mro__:
        for family in FAMILIES.values():
            if family.config is klass:
                return family
    return None


def check_model_type(model_type, what: str = "model_type") -> str:
    """`model_type` if it is a registered family, else a `ValueError` listing only this package's families."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ValueError(f"Unknown {what} {model_type!r}; hf_layerfusion families: {sorted(FAMILIES)}.")
    return model_type
