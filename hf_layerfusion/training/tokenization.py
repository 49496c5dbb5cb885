"""Joint source/target subword tokenizers: unigram vocabularies trained by SentencePiece, BPE ones by `tokenizers`,
both served as `tokenizers` fast tokenizers.

The models of this package share one vocabulary between encoder and decoder (Marian/fairseq style), with the
special-token ids of their default configs: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3.
"""

import io
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ..file_checks import check_output_dir, check_write_error
from ..modeling.input_checks import check_positive_int, check_switch

logger = logging.getLogger(__name__)

# Order fixes the ids: bos 0, pad 1, eos 2 (the configs' defaults) and unk 3.
BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<s>", "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
SUBWORD_MODELS = ("unigram", "bpe")
# what `save_pretrained` writes; either one in a directory means it already holds a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def train_joint_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    model: str = "unigram",
    save_dir: str | os.PathLike | None = None,
    model_max_length: int = 512,
    extra_special_tokens: Iterable[str] = (),
    overwrite: bool = False,
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
        save_dir: if given, `save_pretrained` there (created if missing; other files in it are left alone);
            `AutoTokenizer.from_pretrained(save_dir)` loads it back. Checked before training: a file, or a path
            under one, is refused. The files are written into a temporary directory inside it and then moved into
            place, so a failed save leaves an earlier tokenizer there as it was.
        model_max_length: longest sequence the model accepts (truncation limit when `max_length` is not given).
        extra_special_tokens: further never-split tokens placed right after `<unk>` (ids 4, 5, ...), e.g.
            target-language tags "<2de>" for multilingual training; `skip_special_tokens=True` drops them. A list
            of non-empty strings (a bare string is refused: it would make every character a special token).
        overwrite: whether a `save_dir` that already holds a tokenizer (`TOKENIZER_FILES`) may be replaced (with
            a logged warning); False refuses it before training.

    Returns:
        A `PreTrainedTokenizerFast` (`TokenizersBackend` in Transformers 5).
    """
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        # a bare string is an iterable of characters: the vocabulary would be trained on single letters
        raise TypeError(f"`texts` must be an iterable of sentences, got {type(texts).__name__} {str(texts)[:50]!r}.")
    if model not in SUBWORD_MODELS:
        raise ValueError(f"`model` must be one of {SUBWORD_MODELS}, got {model!r}.")
    extra_special_tokens = check_extra_special_tokens(extra_special_tokens)
    special_tokens = [*SPECIAL_TOKENS, *extra_special_tokens]
    duplicates = sorted({token for token in special_tokens if special_tokens.count(token) > 1})
    if duplicates:
        raise ValueError(f"Special tokens must be distinct; repeated: {duplicates}.")
    if check_positive_int(vocab_size, "vocab_size") <= len(special_tokens):
        raise ValueError(
            f"`vocab_size` must be an integer larger than the {len(special_tokens)} special tokens, got {vocab_size!r}."
        )
    check_positive_int(model_max_length, "model_max_length")
    check_switch(overwrite, "overwrite")
    if save_dir is not None:
        # before training: transformers refuses a file only by logging, after the work is done
        save_dir = check_tokenizer_save_dir(save_dir, overwrite)

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
        save_tokenizer(tokenizer, save_dir)
    return tokenizer


def check_extra_special_tokens(extra_special_tokens: Iterable[str]) -> list[str]:
    """`extra_special_tokens` as a list of non-empty strings, else an error naming the bad value."""
    if isinstance(extra_special_tokens, (str, bytes)) or not isinstance(extra_special_tokens, Iterable):
        # a bare string is an iterable of characters: each would become a special token, dropped when decoding
        raise TypeError(
            f"`extra_special_tokens` must be a list of tokens, got {type(extra_special_tokens).__name__} "
            f"{extra_special_tokens!r}; pass [{extra_special_tokens!r}] for one token."
        )
    tokens = list(extra_special_tokens)
    for index, token in enumerate(tokens):
        if not isinstance(token, str) or not token:
            raise TypeError(
                f"`extra_special_tokens[{index}]` is {type(token).__name__} {token!r}, not a non-empty string."
            )
    return tokens


def check_tokenizer_save_dir(save_dir: str | os.PathLike, overwrite: bool) -> Path:
    """`save_dir` as a path we may save a tokenizer into: a directory or a missing one, under no file, and, unless
    `overwrite`, holding no tokenizer yet."""
    path = check_output_dir(save_dir, overwrite=True, what="`save_dir`")
    parent = next(directory for directory in path.absolute().parents if directory.exists())
    if not parent.is_dir():
        raise NotADirectoryError(f"`save_dir` {str(path)!r} cannot be created: {str(parent)!r} is a file.")
    existing = [name for name in TOKENIZER_FILES if (path / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"`save_dir` {str(path)!r} already holds a tokenizer ({existing}), which this one would replace; pass "
            "overwrite=True to replace it, or choose another directory."
        )
    return path


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, save_dir: Path) -> None:
    """`save_pretrained` into a temporary directory inside `save_dir`, then each file moved into place: a save that
    fails (a full disk, say) leaves what `save_dir` held as it was."""
    replaced = [name for name in TOKENIZER_FILES if (save_dir / name).exists()]
    if replaced:
        logger.warning("Replacing the tokenizer in %s (%s).", save_dir, ", ".join(replaced))
    save_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=save_dir))
    try:
        try:
            written = tokenizer.save_pretrained(staging)
        except Exception as error:  # noqa: BLE001 - re-raised; `tokenizers` reports a full disk as a plain Exception
            check_write_error(error, save_dir, "the tokenizer", removed=True)
            raise
        for file in written:
            os.replace(file, save_dir / Path(file).name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
