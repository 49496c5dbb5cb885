"""Target-language tags of multilingual models (Johnson et al. 2017): a `<2xx>` token prepended to the source tells
one model which language to produce (`hf_layerfusion.training.multilingual`).

A module of its own because `translate` needs it (a tagged tokenizer's sentences must carry a tag) and
`multilingual` translates through `translate`. A tokenizer holding tags marks a multilingual model: a source
without a tag would be translated into whatever language the model drifts to, a wrong answer without an error, so
every translation entry point (`translate`, the pipeline, the `translate` command) refuses it
(`check_sources_tagged`), and a source that carries a tag of its own when the target language is given as well
(`check_sources_untagged`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TAG_PATTERN = re.compile(r"<2([^\s<>]+)>")


def language_tag(language: str) -> str:
    """The target-language tag token, e.g. `"<2de>"`."""
    if not isinstance(language, str) or not language or any(c.isspace() or c in "<>" for c in language):
        raise ValueError(f"Invalid language code {language!r} for a tag token.")
    return f"<2{language}>"


def add_language_tags(tokenizer, languages: Sequence[str], model=None) -> dict[str, int]:
    """Add the `<2xx>` tags of `languages` to `tokenizer` as special tokens; return `{language: tag id}`.

    When `model` is given and its vocabulary is smaller than the tokenizer's, its shared embedding (and the tied
    output projection) is resized; new rows start at the mean of the old ones (transformers' `mean_resizing`).
    """
    tags = [language_tag(language) for language in languages]
    tokenizer.add_special_tokens({"extra_special_tokens": tags}, replace_extra_special_tokens=False)
    if model is not None and model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    return {language: tokenizer.convert_tokens_to_ids(tag) for language, tag in zip(languages, tags)}


def tag_languages(tokenizer) -> list[str]:
    """The languages whose `<2xx>` tag `tokenizer` holds, sorted; empty for the tokenizer of a one-direction model."""
    return sorted(match.group(1) for token in tokenizer.get_added_vocab() if (match := TAG_PATTERN.fullmatch(token)))


def check_language_tag(tokenizer, language: str) -> int:
    """Id of `language`'s tag; a `ValueError` if the tokenizer does not know it (it would silently become `<unk>`)."""
    tag = language_tag(language)
    tag_id = tokenizer.convert_tokens_to_ids(tag)
    if tag_id is None or tag_id == tokenizer.unk_token_id:
        known = tag_languages(tokenizer)
        raise ValueError(
            f"The tokenizer has no {tag} token (its target languages: {', '.join(known) if known else 'none'}); "
            f"call `add_language_tags(tokenizer, [{language!r}], model)` to train that direction."
        )
    return tag_id


def tag_source(text: str, target_lang: str) -> str:
    """The source sentence as the model reads it: the target-language tag, then the text."""
    return f"{language_tag(target_lang)} {text}"


def check_sources_untagged(sentences: Sequence[str], target_lang: str, how_to_choose: str) -> None:
    """A `ValueError` naming the first sentence that already begins with a target-language tag, when the caller gives
    the target language too (`how_to_choose`: `"tgt_lang="`, `"--tgt_lang"`), which prepends its own tag: the model
    would read two tags (conflicting ones, or one twice) and answer in either language."""
    added = language_tag(target_lang)
    for index, sentence in enumerate(sentences):
        own = TAG_PATTERN.match(sentence.lstrip())
        if own:
            raise ValueError(
                f"Sentence {index} ({sentence[:40]!r}) begins with the target-language tag {own.group(0)}, and "
                f"{how_to_choose}{target_lang!r} prepends {added}: the model would read two tags. Give the target "
                f"language once: drop the tag from the sentence, or leave out {how_to_choose.rstrip('=')}."
            )


def check_sources_tagged(tokenizer, sentences: Sequence[str], how_to_choose: str) -> None:
    """A `ValueError` naming the first sentence that does not begin with a target-language tag, when `tokenizer`
    holds tags (a multilingual model); nothing for a one-direction model. `how_to_choose` names the caller's way of
    giving the target language (`"tgt_lang="`, `"--tgt_lang"`)."""
    languages = tag_languages(tokenizer)
    if not languages:
        return
    tags = tuple(language_tag(language) for language in languages)
    for index, sentence in enumerate(sentences):
        if not sentence.lstrip().startswith(tags):
            raise ValueError(
                f"Sentence {index} ({sentence[:40]!r}) has no target-language tag, and this model translates into "
                f"several languages ({', '.join(languages)}): it would answer in any of them. Pass {how_to_choose} "
                f"(one of {', '.join(languages)}), or begin every sentence with its tag ({tags[0]} ...)."
            )
