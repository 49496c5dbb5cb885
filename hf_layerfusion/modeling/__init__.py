"""The one shared encoder-decoder backbone of hf_layerfusion.

Attention, layers, embeddings, positions, cache handling and the LM head live here once, in modules that import only
from the ones listed before them:

- `configuration` (`LayerFusionConfig`, every backbone knob, checked) and `presets` (named backbone sizes);
- `input_checks` (the models' tensor and argument checks) and `registry` (the families: `register_family`,
  `FAMILIES`);
- `extension_points` (what a family may replace: readouts, connections, sub-layers, fusion parameters);
- `embeddings`, `attention` (multi-head attention through transformers' attention interface), `layers` (a layer of
  residual sub-layers given by a layout string, the decoder's cache slots);
- `outputs`, `pretrained` (the base class: initialisation, checked saving and loading), `stacks` (the encoder and
  decoder), `fused_cross_entropy` and `model` (`LayerFusionModel`, `LayerFusionForConditionalGeneration`);
- `conversion` and `xlmr`: any family from a Marian or XLM-R checkpoint.

A family changes the Transformer only through these extension points (`LayerFusionModel` builds the stacks through
its builders; `hf_layerfusion.modeling.extension_points` has their base classes):

- **layer layout** (`config.encoder_layer_layouts` / `config.decoder_layer_layouts`): the sub-layers of each layer,
  `s` self-attention, `c` cross-attention, `f` feed-forward (plain: encoder `sf`, decoder `scf`);
- **sub-layer modules** (`LayerFusionModel.build_sublayer`): what each `s` / `c` / `f` is; an attention sub-layer
  reads what it needs from the `LayerContext` (its input, the stack's lower states, the encoder memory, masks,
  cache), which is how a family changes *what attention reads*;
- **connection** (`LayerFusionModel.build_connection`): the state of layer l, i.e. what layer l+1 receives, from
  layer l's output and the states below it (plain: the output itself);
- **readouts** (`LayerFusionModel.build_readout`): the encoder readout turns the states `[s_0 .. s_L]` (s_0 =
  embeddings) into the memory cross-attention reads (plain: `s_L`), optionally one memory per decoder layer
  (`layer_memories`); the decoder readout turns them into one feature per output group (plain: `(s_L,)`);
- **output head** (`LayerFusionForConditionalGeneration.output_head`): `(f_1 .. f_N) -> logits, loss`, and the loss
  hook `extra_loss`, a family's term of the training objective.

With the plain choices the backbone computes exactly what `MarianMTModel` computes (tested weight for weight).
"""
