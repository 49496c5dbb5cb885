"""Joint source/target subword tokenizers: unigram vocabularies trained by SentencePiece, BPE ones by `tokenizers`,
both served as `tokenizers` fast tokenizers.

The models of this package share one vocabulary between encoder and decoder (Marian/fairseq style), with the
special-token ids of their default configs: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3.
"""

import io
import os
from collections.abc import Iterable

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

# Order fixes the ids: bos 0, pad 1, eos 2 (the configs' defaults) and unk 3.
BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
SUBWORD_MODELS = ("unigram", "bpe")


def train_joint_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    model: str = "unigram",
    save_dir: str | os.PathLike | None = None,
    model_max_length: int = 512,
    extra_special_tokens: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """Train a SentencePiece-style subword tokenizer on source and target text together.

    Text is not normalised and spaces become "▁" (Metaspace), so decoding with `skip_special_tokens=True`
    reproduces the input exactly as long as every character was seen in training (unseen characters become
    `<unk>`). Like Marian, every encoded sequence, source or target (`text_target=`), ends with `</s>` and has no
    `<s>`; the decoder starts from `decoder_start_token_id` (the family's start token: `</s>`, or `<s>` for
    layer-wise coordination, whose paper appends SOS to the source's EOS).

    Args:
        texts: training sentences of both languages (any iterable, read once).
        vocab_size: size of the vocabulary, special tokens included.
        model: "unigram" (SentencePiece's default, trained by SentencePiece itself) or "bpe" (trained by
            `tokenizers`). Either way the same texts and arguments give the same tokenizer, ids included, in every
            process.
        save_dir: if given, `save_pretrained` there; `AutoTokenizer.from_pretrained(save_dir)` loads it back.
        model_max_length: longest sequence the model accepts (truncation limit when `max_length` is not given).
        extra_special_tokens: further never-split tokens placed right after `<unk>` (ids 4, 5, ...), e.g.
            target-language tags "<2de>" for multilingual training; `skip_special_tokens=True` drops them.

    Returns:
        A `PreTrainedTokenizerFast` (`TokenizersBackend` in Transformers 5).
    """
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        # a bare string is an iterable of characters: the vocabulary would be trained on single letters
        raise TypeError(f"`texts` must be an iterable of sentences, got {type(texts).__name__} {str(texts)[:50]!r}.")
    if model not in SUBWORD_MODELS:
        raise ValueError(f"`model` must be one of {SUBWORD_MODELS}, got {model!r}.")
    extra_special_tokens = list(extra_special_tokens)
    special_tokens = [*SPECIAL_TOKENS, *extra_special_tokens]
    duplicates = sorted({token for token in special_tokens if special_tokens.count(token) > 1})
    if duplicates:
        raise ValueError(f"Special tokens must be distinct; repeated: {duplicates}.")
    if not isinstance(vocab_size, int) or vocab_size <= len(special_tokens):
        raise ValueError(
            f"`vocab_size` must be an integer larger than the {len(special_tokens)} special tokens, got {vocab_size!r}."
        )
    if not isinstance(model_max_length, int) or model_max_length < 1:
        raise ValueError(f"`model_max_length` must be a positive integer, got {model_max_length!r}.")

    seen = {"sentences": 0, "characters": set()}
    unreadable = []

    def checked_texts():
        # `texts` is read once (it may be a generator), so it is checked while the trainer reads it. SentencePiece
        # turns an exception raised inside its reader into a RuntimeError, so the reader keeps it to raise as it was.
        try:
            for index, text in enumerate(texts):
                if not isinstance(text, str):
                    raise TypeError(f"`texts[{index}]` is {type(text).__name__} {text!r}, not a string.")
                seen["sentences"] += 1
                seen["characters"].update(text)
                yield text
        except Exception as error:  # noqa: BLE001 - re-raised unchanged after the trainer returns
            unreadable.append(error)

    def check_what_was_read():
        if unreadable:
            raise unreadable[0]
        if all(character.isspace() for character in seen["characters"]):
            raise ValueError(
                f"`texts` holds no text ({seen['sentences']} sentences, all empty): a tokenizer trained on it would "
                f"know only the {len(special_tokens)} special tokens."
            )

    if model == "unigram":
        try:
            unigram = train_unigram_model(checked_texts(), vocab_size - len(special_tokens))
        except RuntimeError:
            check_what_was_read()
            check_vocab_size_holds_characters(seen["characters"], vocab_size, len(special_tokens))
            raise
        check_what_was_read()
        special = set(special_tokens)
        vocab = [(token, 0.0) for token in special_tokens]
        # piece 0 is SentencePiece's own <unk>, which the package's takes over
        vocab += [
            (unigram.id_to_piece(index), unigram.get_score(index))
            for index in range(1, unigram.get_piece_size())
            if unigram.id_to_piece(index) not in special
        ]
        backend = Tokenizer(models.Unigram(vocab, unk_id=special_tokens.index(UNK_TOKEN), byte_fallback=False))
        backend.add_special_tokens(special_tokens)
    else:
        backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    if model == "bpe":
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False)
        backend.train_from_iterator(checked_texts(), trainer=trainer)
        check_what_was_read()
    # Special tokens take the first ids in list order (the BPE trainer's order too); the configs rely on it.
    token_ids = {token: backend.token_to_id(token) for token in special_tokens}
    if token_ids != {token: index for index, token in enumerate(special_tokens)}:
        raise RuntimeError(f"Unexpected special-token ids after training: {token_ids}.")
    # Marian convention: `tokens </s>` for one sequence, `tokens_a tokens_b </s>` for a pair.
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, token_ids[EOS_TOKEN])],
    )

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=extra_special_tokens,
        model_max_length=model_max_length,
        # The default clean-up deletes the space before punctuation ("a ." -> "a."), which breaks exact decoding.
        clean_up_tokenization_spaces=False,
    )
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer


def check_vocab_size_holds_characters(
    texts: Iterable[str], vocab_size: int, special_tokens: int = len(SPECIAL_TOKENS), what: str = "`vocab_size`"
) -> None:
    """Refuse a unigram `vocab_size` (named `what` in the error) too small for every distinct character of `texts`
    besides `special_tokens` special tokens: SentencePiece makes each character a piece (character coverage 1.0),
    spaces written "▁". A caller that trains later (under a run's lock, say) checks its texts with it first."""
    characters = set()
    for text in texts:
        characters.update(text)
    pieces = len((characters - {" "}) | {"▁"})
    if pieces > vocab_size - special_tokens:
        raise ValueError(
            f"{what} {vocab_size} cannot hold the {pieces} distinct characters of the training texts (spaces as '▁') "
            f"besides the {special_tokens} special tokens: pass at least {pieces + special_tokens}."
        ) from None


def train_unigram_model(sentences: Iterable[str], size: int) -> sentencepiece.SentencePieceProcessor:
    """SentencePiece's unigram trainer (Kudo, 2018) on `sentences`: a model of up to `size` pieces besides its
    `<unk>` (id 0), with their log probabilities as scores.

    SentencePiece rather than the `tokenizers` UnigramTrainer, because the latter walks hash maps whose order changes
    from process to process: the same texts gave different ids to pieces of equal score and scores differing in
    the 11th digit, so one command run twice trained differently initialised models. SentencePiece runs on one
    thread here, since its EM step sums per thread and its scores depend on the thread count.
    """
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="unigram",
        vocab_size=size + 1,  # with its <unk>
        hard_vocab_limit=False,  # a small corpus gives fewer pieces, not an error
        character_coverage=1.0,  # every character seen is a piece: none becomes <unk>
        normalization_rule_name="identity",  # text as it is, as the Metaspace pre-tokenizer encodes it
        remove_extra_whitespaces=False,
        max_sentence_length=1 << 30,  # SentencePiece's largest; its default skips sentences over 4192 bytes
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,  # errors only
    )
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
