"""Sharing models: the self-contained Hub code written beside every saved model, model cards and the translation
pipeline."""
