"""benchmarks/bench_multi30k.py without training: every arm is a valid config, baselines are added, the paired
bootstrap is sacreBLEU's, and an output dir refuses other settings."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import CONFIG_MAPPING

import hf_layerfusion

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_multi30k.py"
spec = importlib.util.spec_from_file_location("bench_multi30k", BENCH)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)
run_translation = sys.modules["run_translation"]  # imported by the benchmark, which trains through it


@pytest.mark.parametrize("arm_name", list(bench.MODELS))
def test_every_arm_builds_a_valid_config_and_has_a_known_baseline(arm_name):
    arm = bench.MODELS[arm_name]
    config = CONFIG_MAPPING[arm.model_type].from_preset("multi30k", **arm.config)
    for key, value in arm.config.items():
        if value is not None:  # None = derived by the family (e.g. Re-Transformer's layer count from its layout)
            assert getattr(config, key) == value, key
    assert arm.baseline is None or bench.MODELS[arm.baseline].baseline is None
    if arm.baseline is not None:
        baseline = bench.MODELS[arm.baseline]
        assert baseline.training == arm.training  # same training options
        if arm.model_type == "gtrans":  # same shape
            shape = ("encoder_layers", "decoder_layers")
            assert {k: arm.config.get(k) for k in shape} == {k: baseline.config.get(k) for k in shape}


def arm_config(arm_name: str):
    """The config run_translation builds for an arm, from the command-line keys the benchmark passes it (preset
    `multi30k`, `--config_overrides`) and the special ids of the benchmark's tokenizer (`<s>` 0, `<pad>` 1,
    `</s>` 2)."""
    arm = bench.MODELS[arm_name]
    overrides = ",".join(f"{key}={bench.format_value(value)}" for key, value in arm.config.items()) or None
    model_args = run_translation.ModelArguments(
        model_type=arm.model_type, preset="multi30k", config_overrides=overrides
    )
    return run_translation.build_config(model_args, 8000, dict(pad_token_id=1, bos_token_id=0, eos_token_id=2))


def test_layerwise_coordination_14_is_the_papers_model():
    """Sec. 4.2: 14 shared layers at the small size, parameter-matched to the 6 + 6 plain baseline; the decoder
    starts from SOS (Sec. 4.3)."""
    assert bench.MODELS["layerwise_coordination_14"].baseline == "plain_transformer"
    config = arm_config("layerwise_coordination_14")
    paper = hf_layerfusion.LayerwiseCoordinationConfig.from_preset("layerwise_paper_small", vocab_size=8000)
    keys = ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "encoder_attention_heads",
            "share_layer_parameters", "mixed_attention", "language_embeddings", "position_embeddings")
    assert {key: getattr(config, key) for key in keys} == {key: getattr(paper, key) for key in keys}
    assert config.decoder_start_token_id == 0 and arm_config("plain_transformer").decoder_start_token_id == 2
    with torch.device("meta"):
        sizes = [
            sum(p.numel() for p in hf_layerfusion.FAMILIES[config.model_type][2](config).parameters())
            for config in (config, arm_config("plain_transformer"))
        ]
    assert abs(sizes[0] / sizes[1] - 1) < 1e-3


def test_embedding_init_arms():
    """fairseq / THUMT embedding initialisation for the plain model and GTrans, GTrans compared with the plain one."""
    for name in ("plain_transformer_embed_init", "gtrans_embed_init"):
        assert arm_config(name).embedding_init == "rsqrt_d_model"
    assert arm_config("plain_transformer").embedding_init == arm_config("gtrans").embedding_init == "init_std"
    assert bench.MODELS["gtrans_embed_init"].baseline == "plain_transformer_embed_init"
    assert bench.MODELS["gtrans_embed_init"].config == {**bench.MODELS["gtrans"].config, **bench.EMBED_INIT}


def test_baselines_are_added_before_their_arms():
    assert bench.with_baselines(["gtrans_ls0", "gtrans", "plain_transformer"]) == [
        "plain_transformer_ls0", "gtrans_ls0", "plain_transformer", "gtrans",
    ]


def test_paired_bootstrap_is_sacrebleus():
    references = [f"the cat number {i} sat on the mat" for i in range(40)]
    # two systems, each wrong on a different pair of sentences: the same BLEU, no significant difference
    one = [("a dog" if i in (3, 4) else ref) for i, ref in enumerate(references)]
    other = [("a dog" if i in (30, 31) else ref) for i, ref in enumerate(references)]
    tied = bench.paired_bootstrap(one, other, references)
    assert tied["bleu"] == pytest.approx(tied["baseline_bleu"]) and tied["p_value"] > 0.2
    worse = [f"a dog {i}" for i in range(40)]
    better = bench.paired_bootstrap(worse, references, references)
    assert better["bleu"] == pytest.approx(100.0) and better["p_value"] < 0.01 and "bs:1000" in better["signature"]
    with pytest.raises(ValueError, match="aligned"):
        bench.paired_bootstrap(worse[:-1], references, references)


def test_output_dir_refuses_other_settings(tmp_path):
    args = bench.parse_args(["--output_dir", str(tmp_path), "--max_steps_per_model", "30"])
    assert args.minutes_per_model is None  # steps-matched runs have no time budget unless asked
    bench.check_settings(args)
    assert json.loads((tmp_path / "settings.json").read_text())["max_steps_per_model"] == "30"
    bench.check_settings(args)  # the same settings continue
    with pytest.raises(SystemExit, match="max_steps_per_model was 30 and is now 40"):
        bench.check_settings(bench.parse_args(["--output_dir", str(tmp_path), "--max_steps_per_model", "40"]))
