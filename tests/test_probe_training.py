"""study/probe_training.py: argument checks and a two-step run on real Multi30k whose first memory norm must be
sqrt(d_model), the unit-gain root LayerNorm's output (a raw FFN root, as before RTAL's root LayerNorm, gives about 1/7
of it). Its spread measure is `position_spread`, tested in tests/test_deep_representations.py."""

import json

import pytest

from hf_layerfusion import RTALConfig
from hf_layerfusion.training.tokenization import train_joint_tokenizer
from study import probe_training


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "[1]"], "JSON object"),
        (["--config", "{x"], "not JSON"),
        (["--init_from", "/nonexistent/checkpoint"], "/nonexistent/checkpoint: no such checkpoint"),
        (["--steps", "0"], "--steps must be a positive integer, got 0"),
        (["--data", "/nonexistent/multi30k"], "missing train.en"),
    ],
)
def test_bad_arguments_named(argv, message, capsys, tmp_path):
    for split in ("train.en", "train.de", "val.en", "val.de"):  # a data dir that passes, unless argv names another
        (tmp_path / split).write_text("")
    with pytest.raises(SystemExit):
        probe_training.parse_args(["--data", str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_two_steps_on_multi30k(multi30k_dir, tmp_path, capsys):
    sentences = (multi30k_dir / "train.en").read_text().splitlines()[:2000]
    sentences += (multi30k_dir / "train.de").read_text().splitlines()[:2000]
    train_joint_tokenizer(sentences, 600, save_dir=tmp_path)
    probe_training.main([
        "--data", str(multi30k_dir), "--tokenizer", str(tmp_path), "--model_type", "rtal",
        "--config", '{"aggregation_function": "concat_ffn", "encoder_layers": 2, "decoder_layers": 2}',
        "--steps", "2", "--log_every", "1", "--threads", "1",
    ])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [row["step"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert len(row["encoder_spread"]) == 3  # embeddings + 2 layers
    # the memory is the root's LayerNorm output with unit gain: norm sqrt(d_model) = 16 before training
    assert rows[0]["memory_norm"] == pytest.approx(RTALConfig.from_preset("multi30k").d_model ** 0.5, abs=0.01)
    assert rows[1]["train_loss"] > 0 and rows[0]["val_loss"] != rows[2]["val_loss"]
