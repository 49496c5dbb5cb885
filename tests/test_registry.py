"""The family registry is complete and consistent: every family a module under hf_layerfusion/models/ defines is
registered, and every registered family has what adding one takes (docs/adding_a_family.md): its module, its
model-card template and its tiny test config; the registry refuses families that do not fit together."""

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from helpers import TINY_CONFIGS_DIR, tiny_config, tiny_config_overrides
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import hf_layerfusion
from hf_layerfusion import models
from hf_layerfusion.hub.model_card import TEMPLATE_DIR, family_sections
from hf_layerfusion.modeling.configuration import LayerFusionConfig
from hf_layerfusion.modeling.model import (
    LayerFusionForConditionalGeneration,
    LayerFusionModel,
)
from hf_layerfusion.modeling.registry import FAMILIES, register_family

FAMILY_BASES = (LayerFusionConfig, LayerFusionModel, LayerFusionForConditionalGeneration)


def family_modules() -> list[str]:
    return sorted(f"{models.__name__}.{module.name}" for module in pkgutil.iter_modules(models.__path__))


def test_every_family_class_defined_under_models_is_registered():
    """A config, model or conditional-generation class defined in a module under models/ belongs to a registered
    family (a family without `@register_family` would load with no Auto class, no Hub code and no tests)."""
    registered = {cls for family in FAMILIES.values() for cls in family}
    for module_name in family_modules():
        module = importlib.import_module(module_name)
        defined = [
            cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module_name and issubclass(cls, FAMILY_BASES)
        ]
        assert defined, f"{module_name} defines no family"
        unregistered = sorted(cls.__name__ for cls in defined if cls not in registered)
        assert not unregistered, (
            f"{module_name} defines {unregistered}, which no registered family holds: decorate the family's "
            "...ForConditionalGeneration class with @register_family (hf_layerfusion.modeling.registry)."
        )


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_registered_family_has_its_module_card_template_and_tiny_config(model_type):
    """What adding a family takes besides its module (docs/adding_a_family.md), every missing piece named at once."""
    family = FAMILIES[model_type]
    assert family.config.model_type == model_type
    modules = {cls.__module__ for cls in family}
    assert len(modules) == 1 and modules <= set(family_modules()), f"{model_type}: one module under models/ ({modules})"
    template, tiny = TEMPLATE_DIR / f"{model_type}.md", TINY_CONFIGS_DIR / f"{model_type}.json"
    missing = []
    if not template.is_file():
        missing.append(f"its model-card template {template} (sections: description, limits, paper, citation)")
    if not tiny.is_file():
        missing.append(f'its tiny test config {tiny} ({{"why": ..., "config": {{...}}}}, valid at 2 + 2 layers)')
    assert not missing, f"family {model_type!r} lacks " + " and ".join(missing)
    family_sections(model_type)  # its sections are all there
    config = tiny_config(model_type)  # valid at the tiny size
    assert {key: getattr(config, key) for key in tiny_config_overrides(model_type)} == tiny_config_overrides(model_type)


@pytest.mark.parametrize("folder, suffix", [(TEMPLATE_DIR, ".md"), (TINY_CONFIGS_DIR, ".json")])
def test_every_template_and_tiny_config_names_a_registered_family(folder, suffix):
    """No card template or tiny test config is left behind by a renamed or removed family (`_base.md` is the part of
    every card)."""
    names = {path.stem for path in Path(folder).glob(f"*{suffix}")} - {"_base"}
    orphans = sorted(names - set(FAMILIES))
    assert not orphans, f"{folder} holds {[name + suffix for name in orphans]}, of no registered family"


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_registered_family_is_public_and_known_to_the_auto_classes(model_type):
    family = FAMILIES[model_type]
    assert hf_layerfusion.FAMILIES is FAMILIES
    for cls in family:
        assert getattr(hf_layerfusion, cls.__name__) is cls and cls.__name__ in hf_layerfusion.__all__
    config = AutoConfig.for_model(model_type)
    assert type(config) is family.config
    assert AutoModel._model_mapping[family.config] is family.model
    assert AutoModelForSeq2SeqLM._model_mapping[family.config] is family.for_conditional_generation


def test_register_family_refuses_classes_that_do_not_fit_together():
    gtrans, plain = FAMILIES["gtrans"], FAMILIES["plain_transformer"]

    class Mismatched(LayerFusionForConditionalGeneration):
        config_class = gtrans.config
        model_class = plain.model

    with pytest.raises(TypeError, match="model_class PlainTransformerModel has config_class PlainTransformerConfig"):
        register_family(Mismatched)

    class Duplicate(LayerFusionForConditionalGeneration):
        config_class = gtrans.config
        model_class = gtrans.model

    with pytest.raises(ValueError, match="model_type 'gtrans' .* is already the family of GTransConfig"):
        register_family(Duplicate)
    assert FAMILIES["gtrans"] == gtrans
    assert register_family(gtrans.for_conditional_generation) is gtrans.for_conditional_generation  # idempotent


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_backbone_benchmark_measures_every_registered_family(model_type):
    from study import bench_backbone

    measured = {spec.model_type for name, spec in bench_backbone.MODELS.items() if name in bench_backbone.available_models()}
    assert model_type in measured
