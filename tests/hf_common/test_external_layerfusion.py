"""transformers' own common model test mixins (ModelTesterMixin, GenerationTesterMixin, ConfigTester,
PipelineTesterMixin) applied to EVERY family of `hf_layerfusion.FAMILIES`.

This file is not collected by the project's own pytest run (tests/conftest.py ignores this folder): the HF mixins
import `tests.…` from transformers' test tree, which the project's `tests` package would shadow. It runs in a
scratch copy of `../shared/hf-common-tests` (see that folder's README), which `tests/test_hf_common_tests.py`
builds and runs as part of the project's test command. By hand:

    d=$(mktemp -d) && cp -r ../shared/hf-common-tests/. "$d" && chmod -R u+w "$d"
    mkdir -p "$d/src" && ln -s "$(python -c 'import transformers, os; print(os.path.dirname(transformers.__file__))')" "$d/src/transformers"
    mkdir -p "$d/external" && cp tests/hf_common/test_external_layerfusion.py "$d/external/"
    cp -r tests/tiny_configs "$d/external/"
    cd "$d" && HF_HUB_OFFLINE=1 RUN_PIPELINE_TESTS=0 python -m pytest -p no:cacheprovider -q -rfEs --timeout=600 external/

One test class per registered family, built with the family's tiny test config (`tiny_configs/<model_type>.json`,
copied next to this file from tests/tiny_configs): the config keywords that make it valid (and its fusion active)
at the testers' tiny size, 2 encoder + 2 decoder layers (the mixins use `num_hidden_layers` for both stacks and
want it <= 2).

Where a family deliberately differs from what a common test assumes, `DESIGN_CHOICES` names a mixin class whose
override of that test says why in its docstring and runs an equivalent check of the family's own contract
(never a bare skip).
"""

import contextlib
import copy
import json
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from transformers import is_torch_available, set_seed
from transformers.testing_utils import (
    require_torch,
    set_config_for_less_flaky_test,
    set_model_for_less_flaky_test,
    torch_device,
)

# --- the HF common test mixins (extracted test tree; its root must be on sys.path) -------------------------
from tests.generation.test_utils import GenerationTesterMixin
from tests.test_configuration_common import ConfigTester
from tests.test_modeling_common import ModelTesterMixin, ids_tensor
from tests.test_pipeline_mixin import PipelineTesterMixin


if is_torch_available():
    import torch
    import torch.nn.functional as F

    # --- models under test (external package) --------------------------------------------------------------
    import hf_layerfusion  # registers the Auto classes
    from hf_layerfusion.compat import output_cache

    FAMILIES = dict(hf_layerfusion.FAMILIES)
else:
    FAMILIES = {}


def register_names_for_test_dispatch():
    """Make the external classes visible to the NAME-based dispatch inside the HF mixins.

    `AutoModel*.register()` only fills the lazy mappings' `_extra_content`; many common tests instead look
    `model_class.__name__` up in the static `*_MAPPING_NAMES` tables (e.g. `_prepare_for_class` adds `labels`
    only for names in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, `test_training` skips head-less classes only
    if their name is in MODEL_MAPPING_NAMES, ...). The static tables are only consulted by the Auto classes for
    model types present in CONFIG_MAPPING_NAMES, so adding external types here is inert outside the suite.
    """
    from transformers.models.auto import modeling_auto

    for model_type, (_config, base, lm) in FAMILIES.items():
        modeling_auto.MODEL_MAPPING_NAMES[model_type] = base.__name__
        modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES[model_type] = lm.__name__


if is_torch_available():
    register_names_for_test_dispatch()


class LayerFusionModelTester:
    """Mirrors tests/models/marian/test_modeling_marian.py::MarianModelTester.

    Field names are part of the contract: the mixins read batch_size, seq_length, vocab_size, hidden_size,
    num_hidden_layers, num_attention_heads, is_training straight off the tester.
    """

    def __init__(
        self,
        parent,
        config_class,
        base_model_class,
        lm_model_class,
        extra_config_kwargs=None,
        batch_size=13,
        seq_length=7,
        is_training=True,
        use_labels=False,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_decoder_layers=2,
        num_attention_heads=4,
        intermediate_size=4,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=100,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=0,
        decoder_start_token_id=3,
        attn_implementation=None,
    ):
        self.parent = parent
        self.attn_implementation = attn_implementation
        self.config_class = config_class
        self.base_model_class = base_model_class
        self.lm_model_class = lm_model_class
        self.extra_config_kwargs = dict(extra_config_kwargs or {})
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.use_labels = use_labels
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_decoder_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function=self.hidden_act,
            dropout=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            **({"attn_implementation": self.attn_implementation} if self.attn_implementation else {}),
            **self.extra_config_kwargs,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        config = self.get_config()
        attention_mask = input_ids.ne(config.pad_token_id)
        inputs_dict = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": attention_mask,
            "decoder_attention_mask": attention_mask,
        }
        return config, inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()

    # model-specific checks (copied in spirit from MarianModelTester) ----------------------------------------
    def create_and_check_decoder_model_past_large_inputs(self, config, inputs_dict, with_encoder_states=False):
        base = self.base_model_class(config=config).to(torch_device).eval()
        model = base.get_decoder()
        input_ids = inputs_dict["input_ids"]
        attention_mask = inputs_dict["attention_mask"]
        extra = {}
        if with_encoder_states:
            encoder_outputs = base.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
            extra["encoder_hidden_states"] = encoder_outputs.last_hidden_state
            extra["encoder_attention_mask"] = attention_mask
            if encoder_outputs.layer_memories is not None:  # families giving each decoder layer its own memory
                extra["encoder_layer_memories"] = encoder_outputs.layer_memories
        outputs = model(input_ids, attention_mask=attention_mask, use_cache=True, **extra)
        # (Marian's harness unpacks `output, past_key_values = outputs.to_tuple()`; the hf_layerfusion decoder
        # output carries an extra `group_features` field, so read the two fields by name; the cache's name is the
        # installed transformers release's.)
        past_key_values = output_cache(outputs)
        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_attn_mask = ids_tensor((self.batch_size, 3), 2)
        next_input_ids = torch.cat([input_ids, next_tokens], dim=-1)
        next_attention_mask = torch.cat([attention_mask, next_attn_mask], dim=-1)
        out_no_past = model(next_input_ids, attention_mask=next_attention_mask, **extra)["last_hidden_state"]
        out_past = model(
            next_tokens, attention_mask=next_attention_mask, past_key_values=past_key_values, **extra
        )["last_hidden_state"]
        idx = ids_tensor((1,), out_past.shape[-1]).item()
        self.parent.assertEqual(out_past.shape[1], next_tokens.shape[1])
        self.parent.assertTrue(torch.allclose(out_past[:, :, idx], out_no_past[:, -3:, idx], atol=1e-3))

    def check_encoder_decoder_model_standalone(self, config, inputs_dict):
        model = self.base_model_class(config=config).to(torch_device).eval()
        outputs = model(**inputs_dict)
        with tempfile.TemporaryDirectory() as tmpdirname:
            encoder = model.get_encoder()
            encoder.save_pretrained(tmpdirname)
            encoder = type(encoder).from_pretrained(tmpdirname).to(torch_device)
        encoder_outputs = encoder(inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"])
        self.parent.assertLess((encoder_outputs[0] - outputs.encoder_last_hidden_state).abs().max().item(), 1e-3)
        with tempfile.TemporaryDirectory() as tmpdirname:
            decoder = model.get_decoder()
            decoder.save_pretrained(tmpdirname)
            decoder = type(decoder).from_pretrained(tmpdirname).to(torch_device)
        dec2 = decoder(
            input_ids=inputs_dict["decoder_input_ids"],
            attention_mask=inputs_dict["decoder_attention_mask"],
            encoder_hidden_states=outputs.encoder_last_hidden_state,
            encoder_attention_mask=inputs_dict["attention_mask"],
            encoder_layer_memories=encoder_outputs.layer_memories,
        )[0]
        self.parent.assertLess((dec2 - outputs.last_hidden_state).abs().max().item(), 1e-3)


class BackboneDesignChoices:
    """Where the shared backbone (every family) deliberately differs from what a common test assumes. Each override
    says why and runs an equivalent check."""

    @contextlib.contextmanager
    def eager_attention(self):
        """Models built by the common test inside this block use eager attention."""
        self.model_tester.attn_implementation = "eager"
        try:
            yield
        finally:
            self.model_tester.attn_implementation = None

    # -- output_attentions needs a kernel that returns the weights ------------------------------------------
    def test_model_outputs_equivalence(self):
        """hf_layerfusion refuses `output_attentions=True` under a kernel that returns no weights (sdpa, flash) with
        a ValueError saying to use eager (transformers warns and returns None for each layer); the common test asks
        for attentions on the default sdpa model. Equivalent check: the same test (tuple == dict outputs, with
        hidden states and attentions, return_dict=False at every level) on eager models, plus
        `test_output_attentions_refused_without_weights`."""
        with self.eager_attention():
            super().test_model_outputs_equivalence()

    def test_capture_outputs_decorator(self):
        """See `test_model_outputs_equivalence`: the common test asks for attentions on the default sdpa model.
        Equivalent check: the same test (no chained `capture_outputs`, every output returned) on eager models."""
        with self.eager_attention():
            super().test_capture_outputs_decorator()

    def test_eager_matches_sdpa_inference_24_fp32_pad_left_output_attentions(self):
        """The common test passes `output_attentions=True` to an sdpa model, which hf_layerfusion refuses (see
        `test_model_outputs_equivalence`). Equivalent check, at least as strict as the common test's fp32 case: the
        common test's inputs (7 rows, the last one left-padded by 2 in the decoder mask; here in the source mask too)
        and LayerNorm eps of 1; the sdpa model refuses `output_attentions` by name; the eager model, asked for them,
        returns one map per layer, the encoder maps giving padded source keys no weight; and its hidden states (both
        stacks, every layer) and logits equal the sdpa model's at the common test's fp32 tolerances (atol 1e-6,
        rtol 1e-4) in every row (the common test accepts 80% of the rows), the padded positions left out as there."""
        batch_size, padding = 7, 2
        for model_class in self.all_model_classes:
            set_seed(42)
            config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
            set_config_for_less_flaky_test(config)
            sdpa_model = model_class(copy.deepcopy(config)).eval()
            sdpa_model.set_attn_implementation("sdpa")
            eager_model = copy.deepcopy(sdpa_model)
            eager_model.set_attn_implementation("eager")
            for model in (sdpa_model, eager_model):
                set_model_for_less_flaky_test(model)
            mask = torch.ones(batch_size, self.model_tester.seq_length, dtype=torch.long, device=torch_device)
            mask[-1, :padding] = 0  # left padding, as the common test pads
            inputs = {
                "input_ids": inputs_dict["input_ids"][:batch_size],
                "attention_mask": mask,
                "decoder_input_ids": inputs_dict["decoder_input_ids"][:batch_size],
                "decoder_attention_mask": mask,
            }
            with torch.no_grad():
                with self.assertRaisesRegex(ValueError, "attn_implementation='eager'"):
                    sdpa_model(**inputs, output_attentions=True)
                reference = sdpa_model(**inputs, output_hidden_states=True)
                outputs = eager_model(**inputs, output_hidden_states=True, output_attentions=True)
            self.assertEqual(len(outputs.encoder_attentions), self.model_tester.num_hidden_layers)
            self.assertTrue(all(a is not None for a in outputs.encoder_attentions + outputs.decoder_attentions))
            for attention in outputs.encoder_attentions:
                self.assertEqual(attention[-1, :, :, :padding].abs().max().item(), 0.0)
            compared = [*zip(outputs.encoder_hidden_states, reference.encoder_hidden_states, strict=True)]
            compared += [*zip(outputs.decoder_hidden_states, reference.decoder_hidden_states, strict=True)]
            if getattr(outputs, "logits", None) is not None:
                compared.append((outputs.logits, reference.logits))
            real = mask.bool()[..., None]
            for index, (ours, theirs) in enumerate(compared):
                for row in range(batch_size):
                    torch.testing.assert_close(
                        ours[row] * real[row], theirs[row] * real[row], atol=1e-6, rtol=1e-4,
                        msg=lambda m, index=index, row=row: f"{model_class.__name__} output {index}, row {row}: {m}",
                    )

    def test_output_attentions_refused_without_weights(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        model = self.all_model_classes[0](config).eval()
        model.set_attn_implementation("sdpa")
        with self.assertRaisesRegex(ValueError, "output_attentions=True needs attn_implementation='eager'"):
            model(**inputs_dict, output_attentions=True)

    # -- the base model's extra output field ------------------------------------------------------------------
    def test_attention_outputs(self):
        """The base model's output has one field more than `Seq2SeqModelOutput`: `group_features`, the decoder
        readout's features the LM head projects (top layer, fused groups, aggregation root...), so the common test's
        count of output fields is one short for the base class. Equivalent check: the common test with the base
        model's `group_features` removed from its output after checking here that it is a non-empty tuple of
        (batch, target length, d_model) tensors."""
        _config_class, base_class, lm_class = FAMILIES[self.model_type]
        base_forward, lm_forward = base_class.forward, lm_class.forward
        test = self
        inside_lm = []  # the LM head reads `group_features` from the base model: keep them for its nested call

        def lm_forward_keeping_group_features(model, *args, **kwargs):
            inside_lm.append(model)
            try:
                return lm_forward(model, *args, **kwargs)
            finally:
                inside_lm.pop()

        def base_forward_without_group_features(model, *args, **kwargs):
            outputs = base_forward(model, *args, **kwargs)
            if inside_lm:
                return outputs
            features = outputs.group_features
            test.assertIsInstance(features, tuple)
            test.assertGreater(len(features), 0)
            for feature in features:
                test.assertEqual(feature.shape, outputs.last_hidden_state.shape)
            return type(outputs)(**{key: value for key, value in outputs.items() if key != "group_features"})

        with (
            mock.patch.object(base_class, "forward", base_forward_without_group_features),
            mock.patch.object(lm_class, "forward", lm_forward_keeping_group_features),
        ):
            super().test_attention_outputs()

    # -- one shared embedding matrix ----------------------------------------------------------------------------
    def check_embeddings_tied_by_design(self):
        """`tie_word_embeddings=False` is refused by name when the config is built and again when a model is built
        from a config changed afterwards; a model's encoder, decoder and output embeddings are one tensor, which
        survives save/load and resizing (the output bias follows the vocabulary)."""
        config_class = FAMILIES[self.model_type][0]
        with self.assertRaisesRegex(ValueError, "tie_word_embeddings"):
            LayerFusionModelTester(
                self, *FAMILIES[self.model_type], {**self.model_tester.extra_config_kwargs, "tie_word_embeddings": False}
            ).get_config()
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        self.assertIsInstance(config, config_class)
        untied = copy.deepcopy(config)
        untied.tie_word_embeddings = False
        for model_class in self.all_model_classes:
            with self.assertRaisesRegex(ValueError, "tie_word_embeddings"):
                model_class(untied)
        lm_class = FAMILIES[self.model_type][2]
        model = lm_class(config).eval()

        def shared_tensors(model):
            return {
                model.get_input_embeddings().weight.data_ptr(),
                model.get_output_embeddings().weight.data_ptr(),
                model.get_encoder().embed_tokens.weight.data_ptr(),
                model.get_decoder().embed_tokens.weight.data_ptr(),
            }

        self.assertEqual(len(shared_tensors(model)), 1)
        with tempfile.TemporaryDirectory() as directory:
            model.save_pretrained(directory)
            reloaded, info = lm_class.from_pretrained(directory, output_loading_info=True)
        self.assertEqual(info["missing_keys"], set())
        self.assertEqual(len(shared_tensors(reloaded)), 1)
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, reloaded.state_dict()[key], msg=key)
        new_vocab_size = config.vocab_size + 10
        model.resize_token_embeddings(new_vocab_size)
        self.assertEqual(model.config.vocab_size, new_vocab_size)
        self.assertEqual(len(shared_tensors(model)), 1)
        self.assertEqual(model.get_output_embeddings().weight.shape[0], new_vocab_size)
        self.assertEqual(model.final_logits_bias.shape, (1, new_vocab_size))
        inputs_dict = dict(inputs_dict, input_ids=inputs_dict["input_ids"].clone())
        inputs_dict["input_ids"][:, 0] = new_vocab_size - 1  # a new token
        with torch.no_grad():
            self.assertEqual(model(**inputs_dict).logits.shape[-1], new_vocab_size)

    def test_load_save_without_tied_weights(self):
        """hf_layerfusion shares one embedding matrix between encoder, decoder and output projection (the joint
        vocabulary of the papers and of Marian); the common test saves and reloads an untied model. Equivalent check:
        `check_embeddings_tied_by_design`."""
        self.check_embeddings_tied_by_design()

    def test_resize_embeddings_untied(self):
        """Resizes an untied model, which hf_layerfusion cannot build (see `test_load_save_without_tied_weights`).
        Equivalent check: `check_embeddings_tied_by_design` (resizing keeps the tie and resizes the output bias)."""
        self.check_embeddings_tied_by_design()

    def test_resize_embeddings_untied_no_reinit_on_post_init(self):
        """As `test_resize_embeddings_untied`. Equivalent check: `check_embeddings_tied_by_design`."""
        self.check_embeddings_tied_by_design()


class _LayerFusionCommonTests(BackboneDesignChoices, ModelTesterMixin, GenerationTesterMixin, PipelineTesterMixin):
    """Shared body; the concrete unittest.TestCase subclass of each family is generated below."""

    model_type = None
    tester_kwargs = {}
    is_encoder_decoder = True
    test_missing_keys = False  # same as Marian: tied/shared embeddings are reported as missing
    # test_can_init_all_missing_weights is skipped unless the config's source file starts with
    # "# Copyright <year>=2023>" -- force it on: `_init_weights` must initialise every param/buffer.
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        config_class, base, lm = FAMILIES[self.model_type]
        self.model_tester = LayerFusionModelTester(self, config_class, base, lm, **self.tester_kwargs)
        self.config_tester = ConfigTester(self, config_class=config_class)

    def test_tester_config_is_the_tiny_config(self):
        """The testers build the family's own config class with its tiny test config (tests/tiny_configs)."""
        config = self.model_tester.get_config()
        self.assertIs(type(config), FAMILIES[self.model_type][0])
        tiny = tiny_config_overrides(self.model_type)
        self.assertEqual({key: getattr(config, key) for key in tiny}, tiny)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_auto_registration(self):
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

        config_class, base, lm = FAMILIES[self.model_type]
        config = self.model_tester.get_config()
        self.assertIs(type(AutoConfig.for_model(config.model_type)), config_class)
        self.assertIsInstance(AutoModelForSeq2SeqLM.from_config(config), lm)
        self.assertIsInstance(AutoModel.from_config(config), base)
        with tempfile.TemporaryDirectory() as tmp:
            lm(config).save_pretrained(tmp)
            self.assertIsInstance(AutoModelForSeq2SeqLM.from_pretrained(tmp), lm)

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as tmpdirname:
                model.save_pretrained(tmpdirname)
                _, info = model_class.from_pretrained(tmpdirname, output_loading_info=True)
            self.assertEqual(info["missing_keys"], set())

    def test_decoder_model_past_with_large_inputs(self):
        # Marian-faithful: decoder run standalone WITHOUT encoder states (cross-attention is skipped)
        self.model_tester.create_and_check_decoder_model_past_large_inputs(*self.model_tester.prepare_config_and_inputs())

    def test_decoder_model_past_with_large_inputs_and_encoder_states(self):
        # same cache check, with encoder memory passed (the way generate() uses the decoder)
        self.model_tester.create_and_check_decoder_model_past_large_inputs(
            *self.model_tester.prepare_config_and_inputs(), with_encoder_states=True
        )

    def test_encoder_decoder_model_standalone(self):
        self.model_tester.check_encoder_decoder_model_standalone(
            *self.model_tester.prepare_config_and_inputs_for_common()
        )


# --------------------------------------------------------------------------------------------------------------
# Deliberate differences of a family, each an override with its reason and an equivalent check.


class GTransDesignChoices:
    """GTrans (Yang et al.): with several decoder groups the training loss is Eq. 7, the psi-weighted sum of each
    group's cross entropy, not the cross entropy of `logits` (which are log P of the Eq. 5 mixture)."""

    def test_encoder_decoder_loss_no_double_shift(self):
        """Common test: the gradient of the reported loss w.r.t. `output.logits` must be that of CE(logits, labels),
        not that of CE against the labels shifted once more, and a guard requires those two gradients to differ (else
        the comparison is vacuous). GTrans' loss is Eq. 7, computed from the group logits, so it is no function of the
        mixture `logits` (that gradient is None). Equivalent check, gradients and guard kept, taken w.r.t. the decoder
        layer outputs (which every group's logits are computed from): the reported loss has the gradient of
        sum_k psi_k CE(group k's log-probs, labels) with labels aligned to the logits (decoder_input_ids = labels
        shifted right), not that of the same sum against labels shifted once more, and those two differ. The loss
        value and the Eq. 5 mixture are checked too."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        config = copy.deepcopy(config)
        config.use_cache = False
        set_seed(42)
        labels = torch.randint(3, config.vocab_size, (self.model_tester.batch_size, self.model_tester.seq_length))
        decoder_input_ids = labels.roll(shifts=1, dims=1)
        decoder_input_ids[:, 0] = config.decoder_start_token_id
        model = FAMILIES[self.model_type][2](config).to(torch_device).eval()
        # no torch.no_grad(): the oracle differentiates the losses
        output = model(
            input_ids=inputs_dict["input_ids"],
            attention_mask=inputs_dict["attention_mask"],
            decoder_input_ids=decoder_input_ids,
            labels=labels,
            return_group_log_probs=True,
            output_hidden_states=True,
        )
        num_groups, vocab = output.group_log_probs.shape[0], output.group_log_probs.shape[-1]
        self.assertGreater(num_groups, 1, "the tiny GTrans config must have several decoder groups")
        psi = output.group_weights
        self.assertTrue(torch.allclose(psi.sum(), torch.tensor(1.0)))
        aligned = sum(
            psi[k] * F.nll_loss(output.group_log_probs[k].reshape(-1, vocab), labels.reshape(-1))
            for k in range(num_groups)
        )
        shifted = sum(
            psi[k] * F.nll_loss(output.group_log_probs[k, :, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1))
            for k in range(num_groups)
        )
        layer_outputs = output.decoder_hidden_states[1:]

        def gradient(loss):
            grads = torch.autograd.grad(loss, layer_outputs, retain_graph=True, allow_unused=True)
            self.assertTrue(all(g is not None for g in grads), "a loss does not depend on the decoder layers")
            return torch.cat([g.flatten() for g in grads])

        grad_reported, grad_aligned, grad_shifted = gradient(output.loss), gradient(aligned), gradient(shifted)
        self.assertFalse(torch.allclose(grad_aligned, grad_shifted), "aligned and shifted gradients agree (vacuous)")
        self.assertTrue(torch.allclose(grad_reported, grad_aligned), "the loss is not Eq. 7 against `labels`")
        self.assertFalse(torch.allclose(grad_reported, grad_shifted), "the loss shifts `labels` a second time")
        torch.testing.assert_close(output.loss, aligned)
        # and the mixture logits are log sum_k psi_k softmax_k (Eq. 5)
        mixture = torch.logsumexp(output.group_log_probs + psi.log()[:, None, None, None], dim=0)
        torch.testing.assert_close(output.logits, mixture, rtol=1e-4, atol=1e-5)

    def test_resize_tokens_embeddings(self):
        """The common test runs the resized models in training mode without `labels`, which GTrans refuses: its
        loss (Eq. 7) needs the labels, and a loss computed outside on the mixture `logits` is not Eq. 7 (opt-in
        through `config.allow_external_loss`). Equivalent check: the same common test on models in eval mode, and
        that a training-mode forward without labels is refused naming `labels` and the opt-in."""
        self.model_tester.is_training = False  # the common test then calls model.eval()
        try:
            super().test_resize_tokens_embeddings()
        finally:
            self.model_tester.is_training = True
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        model = FAMILIES[self.model_type][2](config).train()
        with self.assertRaisesRegex(ValueError, "without `labels`.*allow_external_loss"):
            model(**inputs_dict)
        config.allow_external_loss = True
        self.assertIsNotNone(FAMILIES[self.model_type][2](config).train()(**inputs_dict).logits)


class LayerwiseCoordinationDesignChoices:
    """Layer-wise coordination (He et al. 2018): the decoder has no cross-attention. Its one mixed attention (Eq. 3)
    attends over [source states ; target prefix] with one softmax, so each decoder attention map has
    `source length + target length` keys and `cross_attentions` is empty; and the decoder cannot run without the
    encoder's states (the source half of its keys)."""

    def check_mixed_attention_map(self, attention, source_mask, query_positions):
        """One softmax over [source ; target]: rows sum to 1, padded source keys and future target keys get 0."""
        source_length = source_mask.shape[-1]
        torch.testing.assert_close(attention.sum(-1), torch.ones_like(attention.sum(-1)))
        padded = ~source_mask.bool()[:, None, None, :].expand_as(attention[..., :source_length])
        self.assertEqual(attention[..., :source_length][padded].abs().max().item() if padded.any() else 0.0, 0.0)
        target_keys = torch.arange(attention.shape[-1] - source_length, device=attention.device)
        future = target_keys[None, :] > query_positions[:, None]
        self.assertEqual(attention[..., source_length:][..., future].abs().max().item() if future.any() else 0.0, 0.0)

    def test_attention_outputs(self):
        """The common test expects decoder maps of `target length` keys and one cross-attention map per layer.
        Equivalent check (eager models, `output_attentions` as a keyword and in the config): one encoder map
        (heads, source, source) per layer; one decoder map per layer of shape (heads, target, source + target) that is
        one softmax with padded source keys and future target keys at 0; `cross_attentions` empty."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        tester = self.model_tester
        inputs_dict = dict(inputs_dict, attention_mask=inputs_dict["attention_mask"].clone())
        inputs_dict["attention_mask"][0, :2] = False  # some source padding to check the mask on
        for model_class in self.all_model_classes:
            for via_config in (False, True):
                model_config = copy.deepcopy(config)
                model_config.output_attentions = via_config
                model = model_class._from_config(model_config, attn_implementation="eager").to(torch_device).eval()
                with torch.no_grad():
                    outputs = model(**inputs_dict, **({} if via_config else {"output_attentions": True}))
                self.assertEqual(len(outputs.encoder_attentions), tester.num_hidden_layers)
                for attention in outputs.encoder_attentions:
                    self.assertEqual(
                        tuple(attention.shape),
                        (tester.batch_size, tester.num_attention_heads, tester.seq_length, tester.seq_length),
                    )
                self.assertEqual(len(outputs.decoder_attentions), tester.num_decoder_layers)
                for attention in outputs.decoder_attentions:
                    self.assertEqual(
                        tuple(attention.shape),
                        (tester.batch_size, tester.num_attention_heads, tester.seq_length, 2 * tester.seq_length),
                    )
                    self.check_mixed_attention_map(
                        attention, inputs_dict["attention_mask"], torch.arange(tester.seq_length, device=torch_device)
                    )
                self.assertEqual(outputs.cross_attentions, ())

    def test_retain_grad_hidden_states_attentions(self):
        """The common test retains the gradient of `cross_attentions[0]`, which a mixed-attention decoder does not
        have. Equivalent check: gradients reach the first encoder and decoder hidden states and the first encoder and
        (mixed) decoder attention maps."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
        model = self.all_model_classes[0]._from_config(config, attn_implementation="eager").to(torch_device)
        outputs = model(**inputs_dict, output_hidden_states=True, output_attentions=True)
        retained = [
            outputs.encoder_hidden_states[0],
            outputs.decoder_hidden_states[0],
            outputs.encoder_attentions[0],
            outputs.decoder_attentions[0],
        ]
        for tensor in retained:
            tensor.retain_grad()
        outputs[0].flatten()[0].backward()
        for tensor in retained:
            self.assertIsNotNone(tensor.grad)

    def _check_attentions_for_generate(
        self, batch_size, attentions, prompt_length, output_length, config, decoder_past_key_values
    ):
        """generate()'s decoder maps carry the source keys first (Eq. 3). Equivalent check: every map is one softmax
        over `source length + target keys`, then the common check on its target part. Under assisted generation
        transformers itself cuts every decoder map to its first `target length` keys (`_split_model_outputs` assumes
        self-attention maps), which the common check sees as it is (see `assisted_generation_cuts_attention_maps`)."""
        source_length = self.model_tester.seq_length
        # the first step's maps: source keys then target keys, or cut to the first `prompt_length` keys
        if attentions[0][0].shape[-1] <= source_length:
            self.assertTrue(self.assisted_generation_cuts_attention_maps, "decoder maps without the source keys")
            return super()._check_attentions_for_generate(
                batch_size, attentions, prompt_length, output_length, config, decoder_past_key_values
            )
        target_parts = []
        for step_attentions in attentions:
            for attention in step_attentions:
                self.assertGreater(attention.shape[-1], source_length)
                torch.testing.assert_close(attention.sum(-1), torch.ones_like(attention.sum(-1)))
            target_parts.append(tuple(attention[..., source_length:] for attention in step_attentions))
        super()._check_attentions_for_generate(
            batch_size, tuple(target_parts), prompt_length, output_length, config, decoder_past_key_values
        )

    # -- assisted generation ----------------------------------------------------------------------------------------
    assisted_generation_cuts_attention_maps = False

    @contextlib.contextmanager
    def assisted_generation(self):
        self.assisted_generation_cuts_attention_maps = True
        try:
            yield
        finally:
            self.assisted_generation_cuts_attention_maps = False

    def test_assisted_decoding_matches_greedy_search_0_random(self):
        """Known transformers limitation, documented in the family's docstring: assisted generation splits the decoder
        maps of the accepted tokens with `_split_model_outputs`, which keeps the first `target length` keys of each
        map -- for a mixed-attention map, source keys. Equivalent check: the common test unchanged (assisted ==
        greedy sequences, scores, logits, hidden states) with the maps' shapes as transformers returns them."""
        with self.assisted_generation():
            super().test_assisted_decoding_matches_greedy_search_0_random()

    def test_assisted_decoding_matches_greedy_search_1_same(self):
        """See `test_assisted_decoding_matches_greedy_search_0_random`."""
        with self.assisted_generation():
            super().test_assisted_decoding_matches_greedy_search_1_same()

    def test_assisted_decoding_sample(self):
        """See `test_assisted_decoding_matches_greedy_search_0_random`."""
        with self.assisted_generation():
            super().test_assisted_decoding_sample()

    def test_decoder_model_past_with_large_inputs(self):
        """Marian's test runs the decoder without encoder states; the mixed attention needs them (its source keys) and
        says so by name. The cache check itself runs with them in
        `test_decoder_model_past_with_large_inputs_and_encoder_states`."""
        with self.assertRaisesRegex(ValueError, "mixed attention.*encoder_hidden_states"):
            super().test_decoder_model_past_with_large_inputs()


# the families that deliberately differ from what some common test assumes: the mixin of their overrides
DESIGN_CHOICES = {
    "gtrans": GTransDesignChoices,
    "layerwise_coordination": LayerwiseCoordinationDesignChoices,
}
TINY_CONFIGS = Path(__file__).resolve().parent / "tiny_configs"


def tiny_config_overrides(model_type: str) -> dict:
    """The family's tiny test config (tests/tiny_configs/<model_type>.json, copied next to this file)."""
    return json.loads((TINY_CONFIGS / f"{model_type}.json").read_text(encoding="utf-8"))["config"]


def _class_name(model_type: str) -> str:
    return FAMILIES[model_type][0].__name__.removesuffix("Config") + "ModelTest"


def _make_test_class(model_type: str):
    design_choices = DESIGN_CHOICES.get(model_type)
    _config_class, base, lm = FAMILIES[model_type]
    bases = ((design_choices,) if design_choices else ()) + (_LayerFusionCommonTests, unittest.TestCase)
    body = {
        "model_type": model_type,
        "all_model_classes": (base, lm),
        "pipeline_model_mapping": {"feature-extraction": base},
        "tester_kwargs": {"extra_config_kwargs": tiny_config_overrides(model_type)},
        "__module__": __name__,
    }
    return require_torch(type(_class_name(model_type), bases, body))


for _model_type in FAMILIES:
    globals()[_class_name(_model_type)] = _make_test_class(_model_type)


if os.environ.get("LAYERFUSION_ASYM") == "1" and "gtrans" in FAMILIES:  # opt-in: breaks the mixins' equal-depth assumption

    @require_torch
    class GTransAsymmetricModelTest(GTransDesignChoices, _LayerFusionCommonTests, unittest.TestCase):
        """2 encoder layers (T_e=1, 2 groups) + 4 decoder layers (T_d=2, 2 groups of 2 layers)."""

        model_type = "gtrans"
        all_model_classes = FAMILIES["gtrans"][1:]
        pipeline_model_mapping = {"feature-extraction": FAMILIES["gtrans"][1]}
        tester_kwargs = {
            "num_decoder_layers": 4,
            "extra_config_kwargs": {"encoder_group_size": 1, "decoder_group_size": 2},
        }
