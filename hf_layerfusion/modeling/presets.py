"""Named backbone sizes used in the papers and in this package's benchmarks (`Config.from_preset(name)`)."""

BACKBONE_PRESETS: dict[str, dict] = {
    # GTrans Table V / XLM-T: 12-layer encoder initialised from XLM-R base, 6-layer decoder, OPUS-100.
    # Embedding conventions are XLM-R's (learned positions with padding offset, embedding LayerNorm, GELU,
    # unscaled embeddings) so that `from_xlmr` can load the encoder weight for weight.
    "opus100": dict(
        vocab_size=250002,
        d_model=768,
        encoder_layers=12,
        decoder_layers=6,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        max_position_embeddings=512,
        position_embedding_type="learned",
        layernorm_embedding=True,
        scale_embedding=False,
        activation_function="gelu",
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    ),
    # fairseq `transformer_iwslt_de_en`: the small setting of GTrans Tables II-IV (IWSLT-14 De-En).
    "iwslt": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        dropout=0.3,
    ),
    # Multi30k size used by this package's real-data benchmark (CPU budget).
    "multi30k": dict(
        d_model=256,
        encoder_layers=6,
        decoder_layers=6,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        dropout=0.1,
    ),
}
