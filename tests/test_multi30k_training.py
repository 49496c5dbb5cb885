"""Training on real data: the loss of every family falls on a Multi30k en->de batch, and GTrans trains under
`Seq2SeqTrainer` (with the guard against the Trainer's label smoother)."""

import itertools

import pytest
import torch
from helpers import tiny_config_overrides
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

import hf_layerfusion
from hf_layerfusion.training.tokenization import train_joint_tokenizer

MODEL_SIZES = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
# GTrans under the Trainer: 3 encoder layers in groups of 2, 4 decoder layers in 2 groups of 2
GTRANS = dict(encoder_layers=3, decoder_layers=4, encoder_group_size=2, decoder_group_size=2)


def build_model(model_type, vocab_size, **overrides):
    """A model of `model_type` at `MODEL_SIZES` with its tiny test config (tests/tiny_configs) and `overrides`."""
    family = hf_layerfusion.FAMILIES[model_type]
    config = family.config(**{**MODEL_SIZES, **tiny_config_overrides(model_type), **overrides}, vocab_size=vocab_size)
    return family.for_conditional_generation(config)


def read_pairs(directory, count):
    with open(directory / "train.en", encoding="utf-8") as en, open(directory / "train.de", encoding="utf-8") as de:
        return [
            (source.strip(), target.strip()) for source, target in itertools.islice(zip(en, de, strict=True), count)
        ]


@pytest.mark.parametrize("family", sorted(hf_layerfusion.FAMILIES))
def test_loss_decreases_on_multi30k(family, multi30k_dir):
    pairs = read_pairs(multi30k_dir, 32)
    sources, targets = zip(*pairs, strict=True)
    tokenizer = train_joint_tokenizer(sources + targets, vocab_size=300, model="bpe")
    batch = tokenizer(list(sources), text_target=list(targets), padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)

    model = build_model(family, len(tokenizer), label_smoothing=0.1).train()
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (model.config.pad_token_id, model.config.eos_token_id)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # untrained: about log(vocab) (~5.7); 50 full-batch steps on 32 pairs bring it below half (GTrans with one layer
    # per decoder group, whose gates halve each group feature at the start, is the slowest: ~2.9 after 40 steps)
    assert abs(losses[0] - torch.log(torch.tensor(float(len(tokenizer))))) < 1.0
    assert losses[-1] < 0.5 * losses[0], losses


TOY_PAIRS = [
    ("a dog runs", "ein hund rennt"),
    ("a cat sleeps", "eine katze schläft"),
    ("two dogs run", "zwei hunde rennen"),
    ("a man sings a song", "ein mann singt ein lied"),
    ("the woman reads", "die frau liest"),
    ("children play outside", "kinder spielen draußen"),
    ("a boy jumps", "ein junge springt"),
    ("the girl smiles", "das mädchen lächelt"),
]


def toy_tokenizer():
    return train_joint_tokenizer([sentence for pair in TOY_PAIRS for sentence in pair], vocab_size=48, model="bpe")


def toy_trainer(tmp_path, model, tokenizer, label_smoothing_factor):
    features = [tokenizer(source, text_target=target) for source, target in TOY_PAIRS]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-3,
        label_smoothing_factor=label_smoothing_factor,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
    )
    return Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=features,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
    )


def test_seq2seq_trainer_label_smoother_is_refused(tmp_path):
    tokenizer = toy_tokenizer()
    model = build_model("gtrans", len(tokenizer), **GTRANS)
    trainer = toy_trainer(tmp_path, model, tokenizer, label_smoothing_factor=0.1)
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        trainer.train()


def test_seq2seq_trainer_with_model_label_smoothing(tmp_path):
    tokenizer = toy_tokenizer()
    model = build_model("gtrans", len(tokenizer), **GTRANS, label_smoothing=0.1)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    trainer = toy_trainer(tmp_path, model, tokenizer, label_smoothing_factor=0.0)
    trainer.train()
    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    changed = {name for name, param in model.named_parameters() if not torch.equal(param.detach(), before[name])}
    assert {
        "model.encoder.readout.weight",
        "model.decoder.readout.layer_weight",
        "model.decoder.readout.group_weight",
    } <= changed


def test_training_mode_without_labels_is_refused(tmp_path):
    tokenizer = toy_tokenizer()
    model = build_model("gtrans", len(tokenizer), **GTRANS).train()
    batch = tokenizer(["a dog runs"], text_target=["ein hund rennt"], return_tensors="pt")
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch.pop("labels"))
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        model(**batch, decoder_input_ids=decoder_input_ids)
    model.config.allow_external_loss = True
    logits = model(**batch, decoder_input_ids=decoder_input_ids).logits
    assert logits.shape == (1, decoder_input_ids.shape[1], len(tokenizer))
