"""Models with the adapters of other libraries: PEFT's LoRA (what NMT practitioners fine-tune with in the HF
ecosystem) and, without PEFT, a stand-in adapter layer of the same kind (`LowRankAdapted`: it wraps a linear layer,
reads its weight and adds a low-rank path). The fast loop gives `generate()`'s tokens on such models, on their own
layers (the compiled copies cannot copy another library's modules; a warning says so and how to merge); the int8 copy
refuses them, naming them; merged, the model runs its float32 copy again. `LayerFusionSeq2SeqTrainer` trains a PEFT
model as it trains the model itself: the model's own loss with the smoothing, its diagnostics logged, its fusion
weights out of weight decay, the fast loop in evaluation."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    FIRST_TOKEN_ID,
    SOURCES,
    TINY_BACKBONE,
    tiny_model,
    tiny_sources,
    tiny_tokenizer,
)
from test_fast_generation import needs_float32_kernel
from torch import nn

import hf_layerfusion
from hf_layerfusion.inference import (
    fast_generate,
    fast_generation,
    inference_copies,
    prepare_for_inference,
)
from hf_layerfusion.inference.inference_copies import copy_knows
from hf_layerfusion.modeling.attention import MultiHeadAttention
from hf_layerfusion.modeling.layers import TransformerLayer

FAMILIES = sorted(hf_layerfusion.FAMILIES)
SEARCHES = {"greedy": {"num_beams": 1, "max_new_tokens": 8}, "beam": {"num_beams": 3, "max_new_tokens": 8}}


class LowRankAdapted(nn.Module):
    """`base_layer(x) + up(down(x))` computed from `base_layer`'s weight, as PEFT's `lora.Linear` computes it: a
    module of another library around one of the model's linear layers."""

    def __init__(self, base_layer: nn.Linear, rank: int = 2, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.base_layer = base_layer
        self.down = nn.Parameter(torch.randn(rank, base_layer.in_features, generator=generator) * 0.5)
        self.up = nn.Parameter(torch.randn(base_layer.out_features, rank, generator=generator) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.base_layer.weight, self.base_layer.bias) + F.linear(F.linear(x, self.down), self.up)


def adapt_queries_and_values(model) -> list[str]:
    """Every attention's `q_proj` and `v_proj` wrapped in `LowRankAdapted` (where shared, once: PEFT's way too);
    returns the wrapped modules' names."""
    wrapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, MultiHeadAttention):
            for projection in ("q_proj", "v_proj"):
                layer = getattr(module, projection)
                if type(layer) is nn.Linear:
                    setattr(module, projection, LowRankAdapted(layer, seed=len(wrapped)))
                    wrapped.append(f"{name}.{projection}")
    return wrapped


def generated(model, source, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**source, **kwargs)


def test_the_copies_know_torch_and_the_packages_modules_and_no_other_librarys():
    class SharperAttention(MultiHeadAttention):  # a new family's sub-layer: a subclass of the package's
        pass

    for known in (nn.Linear, nn.LayerNorm, nn.ModuleList, TransformerLayer, SharperAttention,
                  type(tiny_model("gtrans"))):
        assert copy_knows(known), known
    assert not copy_knows(LowRankAdapted)
    model = tiny_model("plain_transformer")
    assert inference_copies.modules_the_copy_does_not_know(model) is None
    names = adapt_queries_and_values(model)
    first = next(name for name, module in model.named_modules() if isinstance(module, LowRankAdapted))
    described = inference_copies.modules_the_copy_does_not_know(model)
    assert described == f"test_adapters.LowRankAdapted (`{first}` and {len(names) - 1} more)", described


@needs_float32_kernel
@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("model_type", FAMILIES)
def test_adapted_models_run_the_fast_loop_on_their_own_layers_and_int8_refuses_them(model_type, search, monkeypatch):
    source, settings = tiny_sources(), SEARCHES[search]
    model = tiny_model(model_type)
    assert prepare_for_inference(model) is not model  # the float32 copy, before the adapters
    with torch.no_grad():
        decoder_input_ids = torch.full((source["input_ids"].shape[0], 3), FIRST_TOKEN_ID)
        unadapted = model(**source, decoder_input_ids=decoder_input_ids).logits
        names = adapt_queries_and_values(model)
        adapted = model(**source, decoder_input_ids=decoder_input_ids).logits
    assert names and not torch.allclose(adapted, unadapted)  # the adapters change what the model computes
    warnings = []
    monkeypatch.setattr(inference_copies.inference_copy_logger, "warning_once", warnings.append)
    assert prepare_for_inference(model) is model
    assert len(warnings) == 1 and "test_adapters.LowRankAdapted (`model." in warnings[0]
    assert "merge_and_unload()" in warnings[0]
    tokens = fast_generate(model, **source, fallback=False, **settings)
    expected = generated(model, source, **settings)
    assert tokens.shape == expected.shape and torch.equal(tokens, expected), (expected, tokens)
    with pytest.raises(ValueError, match=rf"int8 inference copy .*: test_adapters\.LowRankAdapted \(`model\..* and {len(names) - 1} more\)"
                       r".* merge adapters into the weights first \(PEFT: `model = model.merge_and_unload\(\)`\)"):
        fast_generate(model, **source, quantization="int8", **settings)


def output_projection_merged(model, adapted: LowRankAdapted):
    """A copy of `model` whose output projection is one plain `nn.Linear` of the adapted weight `W + up down`, the
    adapter merged by hand (the copy's embeddings keep `W`: the projection's tie is cut)."""
    merged = copy.deepcopy(model)
    weight = adapted.base_layer.weight + adapted.up @ adapted.down
    merged.lm_head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        merged.lm_head.weight.copy_(weight)
    return merged


@pytest.mark.parametrize("model_type", FAMILIES)
def test_an_adapter_on_the_output_projection_is_what_every_family_projects_and_trains(model_type):
    """The output projection is called as a module: an adapter around `lm_head` (PEFT's LoRA with `lm_head` among
    its target modules) changes the logits as the hand-merged weight does, and in training (GTrans' multi-level loss
    of Eq. 7 included) its own parameters get the gradients of that merged weight, by the chain rule of
    `W + up down`: `dL/d up = G down^T`, `dL/d down = up^T G`."""
    source = tiny_sources()
    model = tiny_model(model_type)
    adapted = LowRankAdapted(model.lm_head, seed=5)
    model.lm_head = adapted
    reference = output_projection_merged(model, adapted)
    decoder_input_ids = torch.full((source["input_ids"].shape[0], 3), FIRST_TOKEN_ID)
    with torch.no_grad():
        logits = model.eval()(**source, decoder_input_ids=decoder_input_ids).logits
        expected = reference.eval()(**source, decoder_input_ids=decoder_input_ids).logits
        unadapted = output_projection_merged(model, LowRankAdapted(adapted.base_layer, rank=1))
        unadapted.lm_head.weight.copy_(adapted.base_layer.weight)
        assert not torch.allclose(expected, unadapted(**source, decoder_input_ids=decoder_input_ids).logits, atol=1e-3)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    labels = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (source["input_ids"].shape[0], 4),
                           generator=torch.Generator().manual_seed(3))
    loss = model.train()(**source, labels=labels).loss
    expected_loss = reference.train()(**source, labels=labels).loss
    torch.testing.assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    loss.backward()
    expected_loss.backward()
    merged_gradient = reference.lm_head.weight.grad
    assert adapted.up.grad is not None and adapted.down.grad is not None, "the adapter was left out of the loss"
    torch.testing.assert_close(adapted.up.grad, merged_gradient @ adapted.down.detach().T, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(adapted.down.grad, adapted.up.detach().T @ merged_gradient, atol=1e-5, rtol=1e-4)


@needs_float32_kernel
@pytest.mark.filterwarnings("ignore:.*quantiz")  # torch.ao's eager-mode quantization: deprecated, still what users call
@pytest.mark.parametrize("model_type", FAMILIES)
def test_dynamically_quantized_models_translate_on_their_own_layers_and_int8_refuses_them(model_type):
    """`torch.ao.quantization.quantize_dynamic` swaps every linear layer for a quantized module (the Marian reference
    is tests/test_backbone_marian.py): the quantized model's logits are the float model's up to int8 rounding, the
    fast loop runs its own quantized layers with `generate()`'s tokens, and the package's int8 copy refuses it,
    saying to give it the float model."""
    source = tiny_sources()
    model = tiny_model(model_type).eval()
    quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    decoder_input_ids = torch.full((source["input_ids"].shape[0], 3), FIRST_TOKEN_ID)
    with torch.no_grad():
        expected = model(**source, decoder_input_ids=decoder_input_ids).logits
        logits = quantized(**source, decoder_input_ids=decoder_input_ids).logits
    agreement = F.cosine_similarity(logits.flatten(), expected.flatten(), dim=0)
    assert not torch.equal(logits, expected) and agreement > 0.95, agreement  # quantized, and only by rounding
    assert prepare_for_inference(quantized) is quantized
    for settings in SEARCHES.values():
        assert torch.equal(fast_generate(quantized, **source, fallback=False, **settings),
                           generated(quantized, source, **settings)), settings
    with pytest.raises(ValueError, match=r"int8 inference copy .*torch\.ao\.nn\.quantized\.dynamic\.modules\.linear\.Linear "
                                         r".*give it the float model instead"):
        prepare_for_inference(quantized, "int8")


# ------------------------------------------------------------------------------------------------------ PEFT
def lora_model(model_type: str, target_modules: tuple[str, ...] = ("q_proj", "v_proj")):
    """A PEFT LoRA model of the family's tiny model: rank 2 on every `q_proj` and `v_proj` (or `target_modules`),
    random (not PEFT's default start at zero, which would change nothing). PEFT is a test requirement (setup.cfg)."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=2, lora_alpha=4, target_modules=list(target_modules),
                             init_lora_weights=False)
    return peft.get_peft_model(tiny_model(model_type), config).eval()


@needs_float32_kernel
@pytest.mark.parametrize("model_type", FAMILIES)
def test_peft_lora_models_translate_with_the_fast_loop_and_merged_with_the_float32_copy(model_type):
    source = tiny_sources()
    adapted = lora_model(model_type)
    for settings in SEARCHES.values():
        expected = generated(adapted, source, **settings)
        assert torch.equal(fast_generate(adapted, **source, fallback=False, **settings), expected), settings
        with torch.no_grad():
            own_layers = adapted.generate(**source, custom_generate=hf_layerfusion.inference.fast_decoding_loop(
                fallback=False), **settings)
        assert torch.equal(own_layers, expected), settings
    with pytest.raises(ValueError, match=r"int8 inference copy .*peft\.tuners\.lora\.layer\.Linear .*merge_and_unload"):
        prepare_for_inference(adapted, "int8")
    if model_type == "layerwise_coordination":
        return  # its shared layers' adapters do not merge into one weight: the next test
    with torch.no_grad():
        unmerged = adapted(**source, decoder_input_ids=source["input_ids"][:, :4]).logits
    merged = adapted.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(**source, decoder_input_ids=source["input_ids"][:, :4]).logits, unmerged,
                                   atol=1e-5, rtol=1e-5)
    assert prepare_for_inference(merged).prepared_for_inference == "float32"  # the copy again
    for settings in SEARCHES.values():
        assert torch.equal(fast_generate(merged, **source, fallback=False, **settings),
                           generated(merged, source, **settings)), settings


def test_a_peft_lora_on_the_output_projection_trains_in_gtrans_multi_level_loss():
    """PEFT's own LoRA on `lm_head` (the stand-in's test above has the references): GTrans' loss of Eq. 7 reaches
    its parameters, and the adapted logits are not the base model's."""
    adapted = lora_model("gtrans", target_modules=("lm_head",)).train()
    source = tiny_sources()
    labels = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (source["input_ids"].shape[0], 4),
                           generator=torch.Generator().manual_seed(3))
    adapted(**source, labels=labels).loss.backward()
    head_adapters = {name: p.grad for name, p in adapted.named_parameters() if "lm_head.lora_" in name}
    assert len(head_adapters) == 2 and all(g is not None and g.abs().sum() > 0 for g in head_adapters.values())
    with torch.no_grad(), adapted.disable_adapter():
        base = adapted.eval()(**source, labels=labels).logits
    with torch.no_grad():
        assert not torch.allclose(adapted(**source, labels=labels).logits, base, atol=1e-3)


def test_translate_and_the_pipeline_translate_a_peft_model_as_generate_does():
    from transformers import pipeline

    tokenizer, sentences = tiny_tokenizer(), SOURCES
    adapted = lora_model("gtrans")
    expected = hf_layerfusion.translate(adapted, tokenizer, sentences, max_new_tokens=6, fast=False)
    assert hf_layerfusion.translate(adapted, tokenizer, sentences, max_new_tokens=6) == expected
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=adapted, tokenizer=tokenizer)
    assert [output["translation_text"] for output in translator(sentences, max_new_tokens=6)] == expected
    assert any(expected)  # translations, not empty strings, were compared


def test_marian_and_ctranslate2_exports_ask_for_a_peft_models_adapters_merged(tmp_path):
    adapted = lora_model("plain_transformer")
    for export in (lambda: hf_layerfusion.to_marian(adapted),
                   lambda: hf_layerfusion.export_ctranslate2(adapted, tiny_tokenizer(), tmp_path / "ct2")):
        with pytest.raises(ValueError, match=r"a PEFT model around one \(PeftModelForSeq2SeqLM\): merge its adapters "
                                             r"first \(`model = model.merge_and_unload\(\)`\)"):
            export()
    assert not (tmp_path / "ct2").exists()
    merged = adapted.merge_and_unload()
    source = tiny_sources()
    assert torch.equal(generated(hf_layerfusion.to_marian(merged), source, max_new_tokens=6),
                       generated(merged, source, max_new_tokens=6))


def test_peft_merges_shared_layers_adapters_twice_into_their_one_weight():
    """What the README and the layer-wise coordination docstring say about PEFT: with `share_layer_parameters=True`
    encoder layer i and decoder layer i are two modules holding one weight tensor, PEFT gives each module its own
    adapter, and `merge_and_unload()` adds both to that tensor, so the merged model computes something else."""
    adapted = lora_model("layerwise_coordination")
    assert adapted.base_model.model.config.share_layer_parameters
    encoder_query = adapted.base_model.model.model.encoder.layers[0].self_attn.q_proj
    decoder_query = adapted.base_model.model.model.decoder.layers[0].self_attn.q_proj
    assert encoder_query.base_layer.weight is decoder_query.base_layer.weight
    assert encoder_query.lora_A["default"] is not decoder_query.lora_A["default"]
    source = tiny_sources()
    decoder_input_ids = source["input_ids"][:, :4]
    with torch.no_grad():
        unmerged = adapted(**source, decoder_input_ids=decoder_input_ids).logits
        merged = adapted.merge_and_unload()(**source, decoder_input_ids=decoder_input_ids).logits
    assert not torch.allclose(merged, unmerged, atol=1e-3)


def test_the_trainer_trains_a_peft_model_as_it_trains_the_model(tmp_path, monkeypatch):
    import datasets
    from transformers import Seq2SeqTrainingArguments

    source = tiny_sources()
    labels = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (5, 4), generator=torch.Generator().manual_seed(1))
    dataset = datasets.Dataset.from_dict({**{k: v.tolist() for k, v in source.items()}, "labels": labels.tolist()})
    adapted = lora_model("deep_representations")  # a family with training diagnostics
    model = adapted.get_base_model()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=5, per_device_eval_batch_size=2, max_steps=2,
        logging_steps=1, label_smoothing_factor=0.1, weight_decay=0.01, predict_with_generate=True,
        generation_max_length=6, report_to=[], use_cpu=True,
    )
    trainer = hf_layerfusion.LayerFusionSeq2SeqTrainer(model=adapted, args=args, train_dataset=dataset)
    # the smoothing is the model's own loss's (the stock `LabelSmoother` would pop the labels the model needs)
    assert trainer.label_smoother is None and model.config.label_smoothing == 0.1
    # fusion weights (GTrans' gates and psi) out of weight decay, found by tensor under PEFT's longer names; other
    # weights decayed
    gtrans = lora_model("gtrans")
    fusion = {id(gtrans.get_base_model().get_parameter(name)) for name in gtrans.get_base_model().fusion_parameter_names()}
    named = dict(gtrans.named_parameters(remove_duplicate=False))
    decayed = hf_layerfusion.LayerFusionSeq2SeqTrainer(model=gtrans, args=args).get_decay_parameter_names(gtrans)
    assert fusion and not [name for name in decayed if id(named[name]) in fusion]
    assert any(name.endswith("fc1.weight") for name in decayed)
    trainer.train()
    first_log = trainer.state.log_history[0]
    assert "loss" in first_log and "layer_diversity" in first_log and "memory_spread" in first_log, first_log
    # evaluation translates with the fast loop, the tokens of generate()
    searches = []
    greedy = fast_generation.greedy_search
    monkeypatch.setattr(fast_generation, "greedy_search", lambda *a, **k: (searches.append(1), greedy(*a, **k))[1])
    predictions = trainer.predict(dataset).predictions
    assert len(searches) == 3  # 3 batches of at most 2 sentences
    reference = hf_layerfusion.LayerFusionSeq2SeqTrainer(model=adapted, args=args, fast_generation=False)
    assert (predictions == reference.predict(dataset).predictions).all()


def test_a_peft_model_resumed_from_its_finished_checkpoint_takes_its_adapters_and_trains_no_step(tmp_path):
    import datasets
    from transformers import Seq2SeqTrainingArguments

    source = tiny_sources()
    labels = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (5, 4), generator=torch.Generator().manual_seed(1))
    dataset = datasets.Dataset.from_dict({**{k: v.tolist() for k, v in source.items()}, "labels": labels.tolist()})
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=5, max_steps=2, save_steps=2,
                                    learning_rate=1e-2, report_to=[], use_cpu=True)
    trained = lora_model("gtrans")
    hf_layerfusion.LayerFusionSeq2SeqTrainer(model=trained, args=args, train_dataset=dataset).train()
    adapters = {name: tensor for name, tensor in trained.state_dict().items() if "lora_" in name}
    resumed = lora_model("gtrans")  # the same seed's base weights, other adapters
    assert adapters and not all(torch.equal(resumed.state_dict()[name], tensor) for name, tensor in adapters.items())
    trainer = hf_layerfusion.LayerFusionSeq2SeqTrainer(model=resumed, args=args, train_dataset=dataset)
    output = trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert output.metrics["train_steps"] == 0 and trainer.state.global_step == 2
    assert all(torch.equal(resumed.state_dict()[name], tensor) for name, tensor in adapters.items())
    assert all(parameter.requires_grad for name, parameter in resumed.named_parameters() if "lora_" in name)
