"""Smoke tests of the inference benchmarks' real-workload modes on tiny saved models (what issue 39's measurements
run): `profile_workload.py` (its phases add up to the whole, and it puts every function it times back),
`bench_inference.py --int8-formats` (a row for the other format, run by the product this CPU has for it, with its
BLEU cost), `--bleu-corpus quickstart` (the quickstart's own test split), `probe_inference_kernels.py --workload`,
`bench_layers_in_one_call.py`, `bench_ctranslate2_shapes.py`, `bench_workload_processes.py`, `probe_amx_rows.py` and `probe_int8_schemes.py` (its simulation against
`int8_linear_reference` and the int8 copies' translations)."""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from hf_layerfusion.inference import (
    decoding,
    decoding_attention,
    fast_generation,
    inference_copies,
    search,
)
from hf_layerfusion.inference.cpu_kernels import compiled_kernels
from study import (
    bench_ctranslate2_shapes,
    bench_inference,
    bench_layers_in_one_call,
    bench_workload_processes,
    inference_workload_report,
    probe_amx_rows,
    probe_inference_kernels,
    probe_int8_schemes,
    profile_workload,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

SENTENCES = ["ab ba abba", "baab ab", "b a", "abab baba aa bb", "ab", "ba ab ba ab"]


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """A tiny plain Transformer and a tiny GTrans with the tiny tokenizer, saved, and a Multi30k-shaped data folder
    (test_2016_flickr.en / .de) of letter sentences. d_model 32 over 2 heads: head_dim 16, the smallest the compiled
    decoding steps take, so the fast loop's copies run them as on a real model."""
    root = tmp_path_factory.mktemp("workload")
    tokenizer = tiny_tokenizer()
    directories = {}
    for model_type in ("plain_transformer", "gtrans"):
        model = tiny_model(model_type, max_length=12, d_model=32)
        model.generation_config.max_length = 12
        directory = root / model_type
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        directories[model_type] = directory
    data = root / "data"
    data.mkdir()
    (data / "test_2016_flickr.en").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (data / "test_2016_flickr.de").write_text("\n".join(reversed(SENTENCES)) + "\n", encoding="utf-8")
    return directories, data


def test_profile_workload_splits_the_whole_and_restores_what_it_timed(saved_models, capsys):
    directories, data = saved_models
    originals = (fast_generation.encode_by_length, decoding.DecoderSteps.logits, inference_copies.Int8Linear.forward,
                 inference_copies.Float32Linear.forward, inference_copies.CompiledDecoderLayers.states,
                 *(module.compiled_kernels for module in (inference_copies, search, decoding, decoding_attention)))
    profiles = profile_workload.main([str(directories["gtrans"]), "--data", str(data), "--sentences", "6",
                                      "--num-beams", "1", "2", "--top", "3"])
    output = capsys.readouterr().out
    assert set(profiles) == {(quantization, beams) for quantization in ("float32", "int8") for beams in (1, 2)}
    for (quantization, beams), seconds in profiles.items():
        label = "greedy" if beams == 1 else "beam 2"
        assert f"### {quantization}, {label}: 6 sentences, {seconds['whole']:.2f} s timed" in output
        phases = [seconds[name] for name in ("encoder", "steps", "bookkeeping", "outside")]
        assert min(phases) >= 0 and sum(phases) == pytest.approx(seconds["whole"], rel=1e-9)
        if compiled_kernels() is not None:
            assert 0 < seconds["kernels"] < seconds["whole"]  # the compiled calls were timed, and are not everything
            # the compiled decoding steps (made at the warm-up, before the timer) are among them
            assert 0 < seconds["decoding_steps"] < seconds["kernels"]
            assert f"the compiled decoding steps (every decoder layer of a step in one call) | " \
                   f"{seconds['decoding_steps']:.2f} |" in output
    assert len(re.findall(r"The untimed pass: \d+ page faults, \d+\.\d\d s system time", output)) == 4
    assert originals == (
        fast_generation.encode_by_length, decoding.DecoderSteps.logits, inference_copies.Int8Linear.forward,
        inference_copies.Float32Linear.forward, inference_copies.CompiledDecoderLayers.states,
        *(module.compiled_kernels for module in (inference_copies, search, decoding, decoding_attention)),
    )


def test_bench_inference_adds_the_other_int8_format_with_its_product_and_bleu_cost(saved_models, capsys):
    directories, data = saved_models
    kernels = compiled_kernels()
    if kernels is None:
        pytest.skip("the int8 formats' products need the compiled kernels")
    other = 7 if kernels.int8_code_bits() == 8 else 8
    bench_inference.main(["--speed", "none", "--threads", "1", "--bleu-beams", "1", "--int8-formats", "7", "8",
                          "--bleu", str(directories["gtrans"]), "--data", str(data)])
    output = capsys.readouterr().out
    engine = f"fast int8 {other}-bit ({kernels.int8_product(other)})"
    assert f"| {engine} |" in output
    assert output.count("| fast int8") == 2  # the default format once ("fast int8"), the other format once
    assert re.search(rf"- {re.escape(engine)} BLEU cost on Multi30k test .* <= 0.2 BLEU: ", output)


def test_bench_inference_times_a_plain_model_marian_cannot_express_against_its_generate(saved_models, tmp_path, capsys):
    _, data = saved_models
    pre_norm = tmp_path / "pre_norm"
    model = tiny_model("plain_transformer", max_length=12, normalize_before=True)
    model.generation_config.max_length = 12
    model.save_pretrained(pre_norm)
    tiny_tokenizer().save_pretrained(pre_norm)
    bench_inference.main(["--speed", "none", "--threads", "1", "--bleu-beams", "1", "--bleu", str(pre_norm),
                          "--data", str(data), "--results-dir", str(tmp_path / "results")])
    output = capsys.readouterr().out
    assert f"- {pre_norm}: no MarianMTModel or CTranslate2 engine (Marian cannot express" in output
    assert "| generate() |" in output and "| fast int8 |" in output
    assert "MarianMTModel generate() |" not in output and "| CTranslate2" not in output
    (record,) = [json.loads(path.read_text()) for path in (tmp_path / "results").iterdir()]
    assert set(record["rows"][0]["seconds"]) == {"generate()", "fast float32", "fast int8"}


def test_bench_inference_times_a_fusion_model_beside_the_plain_reference_with_both_flops(saved_models, tmp_path,
                                                                                          capsys, monkeypatch):
    """`--plain-reference`: the plain model's fast loops timed on the fusion model's chunks, both models' FLOPs counted
    on every `--flops-every`-th sentence (here compared with `FlopCounterMode` over `generate()` written out), the
    target line, and the numbers in the results file; a plain reference that is not a plain Transformer, or has
    another vocabulary, is refused before anything is timed."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSeq2SeqLM

    from hf_layerfusion import translate

    directories, data = saved_models
    argv = ["--speed", "none", "--threads", "1", "--bleu-beams", "1", "--flops-every", "2", "--data", str(data),
            "--plain-reference", str(directories["plain_transformer"]), "--bleu", str(directories["gtrans"]),
            "--results-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["bench_inference.py", *argv])
    bench_inference.main(argv)
    output = capsys.readouterr().out
    assert "| plain fast float32 |" in output and "| plain fast int8 |" in output
    assert re.search(r"- gtrans fast float32 / plain fast float32 ÷ FLOPs ratio [0-9.]+ on Multi30k test .* >= 0.8x: ",
                     output)
    (path,) = tmp_path.iterdir()
    (stored,) = json.loads(path.read_text(encoding="utf-8"))["rows"]
    assert stored["plain_reference"] == str(directories["plain_transformer"])
    expected = {}
    for name, model_type in (("model", "gtrans"), ("plain reference", "plain_transformer")):
        model = AutoModelForSeq2SeqLM.from_pretrained(directories[model_type]).eval()
        with FlopCounterMode(display=False) as counter:
            for sentence in SENTENCES[::2]:
                translate(model, tiny_tokenizer(), [sentence], num_beams=1, fast=False)
        expected[name] = counter.get_total_flops()
    assert stored["flops"] == {**expected, "sentences": 3} and min(expected.values()) > 0
    assert set(stored["seconds"]) == {"generate()", "fast float32", "fast int8", "plain fast float32",
                                      "plain fast int8"}

    def fail_if_measured(args):
        raise AssertionError("measured")

    monkeypatch.setattr(bench_inference, "measure_workload", fail_if_measured)
    with pytest.raises(SystemExit):
        bench_inference.main(["--speed", "none", "--plain-reference", str(directories["gtrans"]), "--bleu",
                              str(directories["gtrans"])])
    assert "is a 'gtrans' model; it must be a plain_transformer" in capsys.readouterr().err
    monkeypatch.undo()
    other_vocabulary = tmp_path / "other_vocabulary"
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["zzz"])
    AutoModelForSeq2SeqLM.from_pretrained(directories["plain_transformer"]).save_pretrained(other_vocabulary)
    tokenizer.save_pretrained(other_vocabulary)
    with pytest.raises(SystemExit, match="different vocabularies"):
        bench_inference.measure_workload(bench_inference.parse_args(
            ["--speed", "none", "--data", str(data), "--plain-reference", str(other_vocabulary), "--bleu",
             str(directories["gtrans"])]))


def test_the_quickstart_corpus_is_the_quickstarts_test_split():
    from hf_layerfusion.training.data import builtin_number_corpus

    args = bench_inference.parse_args(["--bleu-corpus", "quickstart", "--bleu-sentences", "5", "--speed", "none"])
    name, sources, references = bench_inference.workload_corpus(args)
    # the quickstart's own values (run as a module, not as __main__), against which its setting read from the source
    quickstart = runpy.run_path(str(REPO_ROOT / "examples" / "quickstart.py"))
    CORPUS, SOURCE_LANG, TARGET_LANG = quickstart["CORPUS"], quickstart["SOURCE_LANG"], quickstart["TARGET_LANG"]
    assert bench_inference.quickstart_setting() == {"SOURCE_LANG": SOURCE_LANG, "TARGET_LANG": TARGET_LANG,
                                                    "CORPUS": CORPUS}

    test = builtin_number_corpus(SOURCE_LANG, TARGET_LANG, CORPUS["builtin_num_train"], CORPUS["builtin_num_valid"],
                                 CORPUS["builtin_num_test"])["test"]
    assert name == "the quickstart's test split"
    assert sources == [example["translation"][SOURCE_LANG] for example in test][:5]
    assert references == [example["translation"][TARGET_LANG] for example in test][:5]


def test_probe_workload_runs_every_usable_candidate(saved_models, capsys):
    directories, data = saved_models
    if compiled_kernels() is None:
        pytest.skip("the package's kernels are the candidates' reference")
    probe_inference_kernels.main(["--workload", str(directories["plain_transformer"]), "--data", str(data)])
    output = capsys.readouterr().out
    left_out = {title for title in probe_inference_kernels.LIBRARY_CANDIDATES if f"- {title}: " in output}
    for label in ("greedy", "beam"):
        section = output.split(f"sentences, {label} (num_beams=")[1].split("###")[0]
        for title in probe_inference_kernels.LIBRARY_CANDIDATES:
            assert (f"| {title.removeprefix('plain: ')} |" in section) == (title not in left_out)
        assert "| fast float32 (Float32Linear, compiled) | " in section


def test_bench_layers_in_one_call_times_both_ways_and_puts_the_layers_back(saved_models, capsys):
    directories, data = saved_models
    original = fast_generation.compiled_decoder_layers
    bench_layers_in_one_call.main([str(directories["plain_transformer"]), "--data", str(data), "--steps", "3",
                                   "--repeats", "2"])  # an even count ends on the one-by-one way
    output = capsys.readouterr().out
    rows = re.findall(r"^\| (1|32) \| (float32|int8) \| (greedy|beam-4) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|$", output,
                      flags=re.MULTILINE)
    assert len(rows) == 8, output
    assert fast_generation.compiled_decoder_layers is original


@pytest.fixture(scope="module")
def tokenizer_sized_plain(saved_models):
    """A tiny plain Transformer with exactly the tiny tokenizer's vocabulary (CTranslate2 takes the tokenizer's
    vocabulary as the model's), saved with it."""
    _, data = saved_models
    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", vocab_size=len(tokenizer), max_length=12)
    model.generation_config.max_length = 12
    directory = data.parent / "plain_transformer_tokenizer_sized"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_bench_ctranslate2_shapes_gives_each_shapes_call_and_step_costs(saved_models, tokenizer_sized_plain, capsys):
    pytest.importorskip("ctranslate2")
    _, data = saved_models
    directory = tokenizer_sized_plain
    rows = bench_ctranslate2_shapes.main([str(directory), "--data", str(data), "--steps", "3", "--repeats", "1"])
    output = capsys.readouterr().out
    assert [(row["precision"], row["sentences"], row["beams"]) for row in rows] == [
        (precision, sentences, beams) for precision in ("float32", "int8") for sentences in (1, 32) for beams in (1, 4)
    ]
    for row in rows:
        assert min(row["one_token"].values()) > 0 and row["long_ratio"] > 0
        assert f"| {row['precision']} | {row['sentences']} | " in output


def test_bench_workload_processes_runs_each_engine_at_each_thread_count_in_its_own_process(
    saved_models, tokenizer_sized_plain, capsys, tmp_path
):
    pytest.importorskip("ctranslate2")
    _, data = saved_models
    rows = bench_workload_processes.main([str(tokenizer_sized_plain), "--data", str(data), "--threads", "1", "2",
                                          "--beams", "1", "--rounds", "1", "--sentences", "4",
                                          "--results-dir", str(tmp_path / "results")])
    output = capsys.readouterr().out
    # the run's file reads back into the report, with the target ratios the run printed
    (path, record), = inference_workload_report.read_processes_results(tmp_path / "results")
    # named by its wait policy where it is not ACTIVE (the suite's environment sets PASSIVE)
    policy = bench_workload_processes.ENGINE_WAIT_POLICY
    variant = None if policy == "ACTIVE" else f"wait-{policy.lower()}"
    assert path == bench_inference.workload_results_path(tmp_path / "results", kind="processes", variant=variant)
    assert f"results written to {path}" in output and record["rows"] == json.loads(json.dumps(rows))
    assert record["sentences"] == 4 and record["threads"] == [1, 2] and record["beams"] == [1]
    table = inference_workload_report.render(tmp_path / "results")
    for fast, reference, threads, _, ratio in bench_workload_processes.same_precision_ratios(rows):
        assert f"- {fast} vs {reference}, greedy, {threads} thread(s): {ratio:.2f}x" in output
        assert f"| {threads} | greedy | " in table and f" | {ratio:.2f}x | " in table
    assert sorted((row["engine"], row["threads"]) for row in rows) == sorted(
        (engine, threads) for engine in bench_workload_processes.ENGINES for threads in (1, 2)
    )
    for row in rows:
        assert len(row["seconds"]) == 1 and min(row["seconds"]) > 0 and row["num_beams"] == 1
        # each fast loop's process ran at the thread count asked for, with the environment's wait policy (else
        # ACTIVE), one batch at a time
        assert row["threads_used"] == row["threads"]
        assert row["omp_wait_policy_used"] == bench_workload_processes.ENGINE_WAIT_POLICY
        assert row["inter_threads_used"] == 1
        if sys.platform.startswith("linux"):  # counted from /proc: every thread of the process, not only the main one
            assert row["process_threads"] >= (2 if row["engine"].startswith("CTranslate2") else 1)  # + its translator
            assert min(row["context_switches_per_second"]) >= 0
    # float32 gives the same translations in both engines (CTranslate2 float32 equals generate() here too)
    bleu = {(row["engine"], row["threads"]): row["bleu"] for row in rows}
    assert bleu["fast float32", 1] == bleu["fast float32", 2] == bleu["CTranslate2 float32", 1]
    assert "- fast int8 vs CTranslate2 int8, greedy, 2 thread(s): " in output
    assert "| fast float32 | greedy | " in output
    if sys.platform.startswith("linux"):
        assert "| engine | search | 1 thread(s): OS threads, context switches / s | 2 thread(s): " in output
    # a random model barely translates: the run says its times are not those of real translations
    assert bleu["fast float32", 1] < bench_workload_processes.TRANSLATING_BLEU
    assert f"warning: {tokenizer_sized_plain} barely translates (greedy test BLEU {bleu['fast float32', 1]:.2f}, " \
           "below 10)" in output


def test_bench_workload_processes_warns_only_below_the_bleu_of_a_model_that_translates():
    def rows(greedy_bleu):
        return [{"engine": engine, "num_beams": beams, "bleu": greedy_bleu if beams == 1 else 40.0}
                for engine in bench_workload_processes.ENGINES for beams in (1, 4)]
    assert bench_workload_processes.untranslated_bleu(rows(9.5)) == 9.5
    assert bench_workload_processes.untranslated_bleu(rows(10.0)) is None
    assert bench_workload_processes.untranslated_bleu(rows(33.0)) is None
    assert bench_workload_processes.untranslated_bleu([row for row in rows(1.0) if row["num_beams"] == 4]) is None


def test_bench_workload_processes_runs_the_engines_under_the_wait_policy_and_the_batches_side_by_side_it_is_given(
    saved_models, tokenizer_sized_plain, capsys, tmp_path
):
    """`--wait-policy unset` removes OMP_WAIT_POLICY from the engines' processes (each runtime's own default), and
    `--inter-threads 2` at 2 threads runs two batches side by side in every engine (CTranslate2: two translators);
    the results file names both settings, and its caption in the report says them."""
    pytest.importorskip("ctranslate2")
    _, data = saved_models
    rows = bench_workload_processes.main([str(tokenizer_sized_plain), "--data", str(data), "--threads", "2",
                                          "--beams", "1", "--rounds", "1", "--sentences", "4", "--wait-policy", "unset",
                                          "--inter-threads", "2", "--results-dir", str(tmp_path)])
    assert {(row["omp_wait_policy_used"], row["inter_threads_used"], row["threads_used"]) for row in rows} == {
        ("unset", 2, 2)
    }
    (path, record), = inference_workload_report.read_processes_results(tmp_path)
    assert path == bench_inference.workload_results_path(tmp_path, kind="processes", variant="wait-unset-inter-2")
    assert record["omp_wait_policy"] == "unset" and record["inter_threads"] == 2
    assert "OMP_WAIT_POLICY=unset in the engines' processes, 2 batch(es) side by side" in (
        inference_workload_report.render(tmp_path))
    assert "OMP_WAIT_POLICY=unset in the engines' processes, 2 batch(es) side by side" in capsys.readouterr().out


@pytest.mark.parametrize("environment, policy", [(None, "ACTIVE"), ("PASSIVE", "PASSIVE")])
def test_bench_workload_processes_engines_wait_policy_is_the_environments_else_active(environment, policy):
    """Read before bench_backbone's import sets PASSIVE as the parent's default (the bug of a first run)."""
    env = {name: value for name, value in os.environ.items() if name != "OMP_WAIT_POLICY"}
    if environment is not None:
        env["OMP_WAIT_POLICY"] = environment
    completed = subprocess.run(
        [sys.executable, "-c", "from study import bench_workload_processes as b; print(b.ENGINE_WAIT_POLICY)"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split()[-1] == policy


def test_bench_workload_processes_refuses_bad_arguments_before_any_work(saved_models, tokenizer_sized_plain, capsys,
                                                                       tmp_path):
    directories, data = saved_models
    cases = [
        ([str(tokenizer_sized_plain), "--threads", "1", "1"], "--threads repeats a value"),
        ([str(tokenizer_sized_plain), "--rounds", "0"], "must be a positive integer, got 0"),
        ([str(tokenizer_sized_plain), "--threads", "1", "2", "--inter-threads", "2"],
         "--threads [1] cannot be shared out equally by --inter-threads 2"),
        ([str(tokenizer_sized_plain), "--wait-policy", "passive"], "invalid choice: 'passive'"),
        ([str(directories["gtrans"]), "--data", str(data)], "'gtrans' model; CTranslate2 runs only the plain"),
        ([str(data / "missing")], "no model at"),
        ([str(tokenizer_sized_plain), "--data", str(data / "missing")], "no Multi30k test sentences at"),
        ([str(tokenizer_sized_plain), "--data", str(data), "--overwrite-results"],
         "--overwrite-results needs --results-dir"),
        ([str(tokenizer_sized_plain), "--data", str(data), "--results-dir", str(data / "test_2016_flickr.en")],
         "is not a directory"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            bench_workload_processes.main(argv)
        assert message in capsys.readouterr().err
    # a file of this CPU type and commit is refused before the run, and left as it was
    existing = bench_inference.workload_results_path(tmp_path, kind="processes")
    existing.write_text("an earlier run", encoding="utf-8")
    with pytest.raises(SystemExit):
        bench_workload_processes.main([str(tokenizer_sized_plain), "--data", str(data), "--results-dir", str(tmp_path),
                                       "--wait-policy", "ACTIVE"])
    assert "exists already (this CPU type and commit); --overwrite-results replaces it" in capsys.readouterr().err
    assert existing.read_text(encoding="utf-8") == "an earlier run"


def test_probe_amx_rows_times_both_products_where_the_cpu_has_them(capsys):
    """On a CPU with AMX and VNNI: a row per product and row count, both timings and their ratio (the probe itself
    stops if the two products' numbers differ); elsewhere one line saying there is nothing to compare."""
    for bad, message in ((["--rows", "1", "0"], "--rows must be positive, got 1 0"),
                         (["--threads", "0"], "--threads must be positive, got 0")):
        with pytest.raises(SystemExit):
            probe_amx_rows.main(bad)
        assert message in capsys.readouterr().err
    assert probe_amx_rows.main(["--rows", "1", "9", "--repeats", "1"]) == 0
    output = capsys.readouterr().out
    kernels = compiled_kernels()
    if kernels is None or not kernels.int8_product(8).startswith("AMX ("):
        assert "which needs both" in output and "|" not in output
        return
    rows = re.findall(r"^\| (\d+) -> (\d+)(?: \+ ReLU)? \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", output, re.M)
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [
        (k, n, m) for k, n, _ in probe_amx_rows.SHAPES for m in (1, 9)
    ]
    half_digit = 0.005  # each column is printed to 2 decimals, the ratio from the unrounded timings
    for *_, tiles, vnni, ratio in rows:
        tiles, vnni, ratio = float(tiles), float(vnni), float(ratio)
        lowest = (tiles - half_digit) / (vnni + half_digit) - half_digit
        highest = (tiles + half_digit) / (vnni - half_digit) + half_digit
        assert lowest <= ratio <= highest, (tiles, vnni, ratio)


@pytest.mark.parametrize("code_bits", [8, 7])
def test_simulated_int8_schemes_compute_the_formats_reference_arithmetic(code_bits):
    """`SimulatedInt8Linear` in the scheme of an existing format gives `int8_linear_reference`'s numbers (exact
    integer products) to float rounding: rows of both signs, one-signed rows (after a ReLU), an outlier, all zeros."""
    generator = torch.Generator().manual_seed(code_bits)
    linear = torch.nn.Linear(48, 20)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(20, 48, generator=generator))
        linear.bias.copy_(torch.randn(20, generator=generator))
    inputs = torch.randn(6, 48, generator=generator)
    inputs[1] = inputs[1].abs()  # one-signed
    inputs[2] = -inputs[2].abs()
    inputs[3, 5] = 40.0  # an outlier sets the row's scale
    inputs[4] = 0.0
    weight_max = inference_copies.WEIGHT_CODE_MAX[code_bits]
    weight_scale = linear.weight.detach().abs().amax(dim=1) / weight_max  # `Int8Linear`'s weights, written out
    weight_t = torch.round(linear.weight.detach() / weight_scale[:, None]).to(torch.int8).t().contiguous()
    expected = inference_copies.int8_linear_reference(
        inputs, weight_t, weight_t.sum(dim=0, dtype=torch.int32), weight_scale, linear.bias.detach(), code_bits=code_bits
    )
    simulated = probe_int8_schemes.SimulatedInt8Linear(linear.weight, linear.bias, code_bits, weight_max)(inputs)
    torch.testing.assert_close(simulated, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(simulated[4], linear.bias.detach())  # an all-zero row: the bias alone


def test_probe_int8_schemes_translates_as_the_int8_copies(saved_models, capsys, kernels):
    """The probe's 8- and 7-bit schemes translate as the int8 copies of those formats (the compiled products) do,
    and its table counts each scheme's translations identical to float32's; bad schemes are named."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_layerfusion

    directories, data = saved_models
    model_dir = directories["gtrans"]
    args = probe_int8_schemes.parse_args([str(model_dir), "--data", str(data), "--schemes", "8:127", "7:63", "3:5"])
    texts = probe_int8_schemes.translations(args, SENTENCES)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(SENTENCES, text_target=SENTENCES, padding=True, return_tensors="pt")
    for code_bits, weight_max in ((8, 127), (7, 63)):
        copy = inference_copies.int8_copy(model, code_bits)
        assert texts[code_bits, weight_max] == hf_layerfusion.translate(copy, tokenizer, SENTENCES,
                                                                        quantization="int8")
        simulated = probe_int8_schemes.simulated_copy(model_dir, code_bits, weight_max)
        with torch.no_grad():  # every product quantized alike, the output projection too: the same logits
            torch.testing.assert_close(simulated(**batch).logits, copy(**batch).logits, rtol=1e-4, atol=1e-4)
    assert texts["float32"] == hf_layerfusion.translate(model, tokenizer, SENTENCES, fast=False)
    probe_int8_schemes.main([str(model_dir), "--data", str(data), "--schemes", "3:5"])
    printed = capsys.readouterr().out
    same = sum(a == b for a, b in zip(texts[3, 5], texts["float32"]))
    assert "| 3-bit activations, weights [-5, 5] | 7 | 11 |" in printed and f"| {same}/{len(SENTENCES)} |" in printed
    for bad, message in (("7", "ACTIVATION_BITS:WEIGHT_MAX"), ("9:127", "activation bits"), ("8:128", "127")):
        with pytest.raises(SystemExit):
            probe_int8_schemes.parse_args([str(model_dir), "--data", str(data), "--schemes", bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probe_int8_schemes.parse_args([str(data), "--data", str(data)])
    assert "no config.json" in capsys.readouterr().err
