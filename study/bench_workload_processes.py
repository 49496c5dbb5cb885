"""The real workload at one and two threads with each engine in a process of its own (issue 39, item 3).

`bench_inference.py --bleu` alternates every engine on chunks of sentences in one process. At one thread that is the
fairest comparison there is; at two it is not: torch and CTranslate2 each bring their own OpenMP runtime (the
CTranslate2 wheel bundles a libgomp of its own), and with `OMP_WAIT_POLICY=ACTIVE` (which two threads need on idle
cores: with passive waits every engine ran slower at two threads than at one, study/fast_cpu_translation_log.md) a
runtime's worker thread keeps spinning on the second core after its engine's turn, so whichever engine runs next
shares that core with the other runtime's spinning thread. Here each engine translates in a fresh process (this
script with `--child`) at one thread count, while the parent stays at one thread (no worker threads of its own);
rounds flip the engines' order, so that a drift of machine speed hits them alike, and each engine's time is the
median over rounds [min-max]. Each process also counts its OS threads and their context switches during the timed
translation (Linux): an OpenMP runtime whose workers sleep and wake at every parallel region shows there (libgomp
spins only 1,000 times before sleeping once it manages more threads than there are CPUs).

Engines: the fast loop in float32 and int8 (`hf_layerfusion.translate`: batches of 32 sorted by length, each sentence
stopping at its end token) and CTranslate2 float32 and int8 (`export_ctranslate2`, batches of 32, as
`bench_inference.py` runs it). Each child first translates two sentences untimed (the int8 copy, first calls,
thread pools), then the whole set once. Target (issue 39): the fast loop at or above CTranslate2 of the same
precision, at every thread count and search.

`--wait-policy` sets the engines' `OMP_WAIT_POLICY` (ACTIVE, PASSIVE, or `unset`: the variable removed, each runtime's
own default; by default the environment's, else ACTIVE), so that each policy is measured in a run of its own;
`--inter-threads N` translates N batches side by side in each engine (`translate(..., inter_threads=N)`, CTranslate2's
`inter_threads`), each with `threads / N` threads of its own (every `--threads` count a multiple of N): sentences per
second on many cores rather than one batch's latency.

`--results-dir DIR` also writes the run to `DIR/processes_<cpu>_<commit>.json` (`processes_<cpu>-<settings>_<commit>`
for a `--wait-policy` or `--inter-threads` other than the default; a temporary file renamed into place; an existing one
is refused before any work unless `--overwrite-results`), from which `inference_workload_report.py` renders the
results' tables of these runs.

    python -m study.bench_workload_processes runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_2
    python -m study.bench_workload_processes MODEL_DIR --threads 1 2 --beams 1 4 --rounds 3 --sentences 500
    python -m study.bench_workload_processes MODEL_DIR --rounds 2 --results-dir study/results/inference
    python -m study.bench_workload_processes MODEL_DIR --wait-policy PASSIVE --results-dir study/results/inference
    python -m study.bench_workload_processes MODEL_DIR --threads 2 --inter-threads 2 --results-dir study/results/inference
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the engines' processes' default OMP_WAIT_POLICY (`--wait-policy`), read before bench_backbone sets this process's
# default (PASSIVE): the environment's, else ACTIVE (each engine has the cores to itself)
STARTING_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")  # None: unset
ENGINE_WAIT_POLICY = STARTING_WAIT_POLICY or "ACTIVE"
WAIT_POLICIES = ("ACTIVE", "PASSIVE", "unset")  # "unset": OMP_WAIT_POLICY removed from the engines' environment

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_layerfusion  # noqa: E402
from hf_layerfusion.inference.cpu_kernels import machine_type  # noqa: E402
from study.bench_backbone import cpu_model, git_revision, loadavg  # noqa: E402
from study.bench_inference import (  # noqa: E402
    ctranslate2_translate,
    search_label,
    workload_results_path,
    write_workload_results,
)
from study.common import (  # noqa: E402
    DEFAULT_DATA,
    display_path,
    module_command,
    positive_int,
    read_lines,
    reproduction_command,
    study_environment,
)
from study.multi30k_ledger import cpu_family_model  # noqa: E402

ENGINES = ("fast float32", "CTranslate2 float32", "fast int8", "CTranslate2 int8")
SAME_PRECISION = {"fast float32": "CTranslate2 float32", "fast int8": "CTranslate2 int8"}
TARGET = 1.0  # the fast loop's speed over CTranslate2's of the same precision
# Below this test BLEU (the fast float32 loop's, greedy) a model barely translates: the study's plain Transformer
# scores above 30 from 2,000 steps. Such a model's times are those of real source sentences but not of real
# translations (its outputs' lengths and words are others), so its run says so, here and in the README's summary.
TRANSLATING_BLEU = 10.0
UNTRANSLATED_WORDS = "the times of real source sentences, not of real translations"  # the run's and the summary's
# the layout of a `--results-dir` file; inference_workload_report.py reads this version only
PROCESSES_RESULTS_VERSION = 1


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a trained plain Transformer with its tokenizer (a study run dir)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2], help="thread counts (default: 1 2)")
    parser.add_argument("--beams", type=positive_int, nargs="+", default=[1, 4], help="searches (default: 1 4)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed runs per engine (default: %(default)s)")
    parser.add_argument("--sentences", type=positive_int, default=None, help="the first N test sentences (default: all)")
    parser.add_argument("--wait-policy", choices=WAIT_POLICIES, default=ENGINE_WAIT_POLICY.upper(),
                        help="the engines' OMP_WAIT_POLICY; unset: none (default: the environment's, else ACTIVE)")
    parser.add_argument("--inter-threads", type=positive_int, default=1,
                        help="batches translated side by side in each engine, each with threads / N threads "
                             "(default: %(default)s)")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="also write the run to DIR/processes_<cpu>_<commit>.json (for "
                             "inference_workload_report.py, e.g. study/results/inference)")
    parser.add_argument("--overwrite-results", action="store_true",
                        help="let --results-dir replace an existing file of the same CPU and commit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a job file of `run_child`
    args = parser.parse_args(argv)
    if args.child is not None:
        return args
    for name in ("threads", "beams"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            parser.error(f"--{name} repeats a value: {values}")
    indivisible = [threads for threads in args.threads if threads % args.inter_threads]
    if indivisible:
        parser.error(f"--threads {indivisible} cannot be shared out equally by --inter-threads {args.inter_threads}: "
                     "give thread counts that are multiples of it")
    if not (args.model_dir / "config.json").is_file():
        parser.error(f"no model at {args.model_dir} (no config.json): pass a trained plain Transformer's directory")
    model_type = json.loads((args.model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    if model_type != "plain_transformer":
        parser.error(f"{args.model_dir} is a {model_type!r} model; CTranslate2 runs only the plain Transformer")
    for split in ("en", "de"):
        if not (args.data / f"test_2016_flickr.{split}").is_file():
            parser.error(f"no Multi30k test sentences at {args.data / f'test_2016_flickr.{split}'}; pass --data DIR")
    # checked before any work: the run takes most of an hour, and its results must have somewhere to go
    args.results_path = None
    if args.results_dir is not None:
        if args.results_dir.exists() and not args.results_dir.is_dir():
            parser.error(f"--results-dir {args.results_dir} is not a directory")
        args.results_path = workload_results_path(args.results_dir, kind="processes", variant=run_variant(args))
        if args.results_path.exists() and not args.overwrite_results:
            parser.error(f"{args.results_path} exists already (this CPU type and commit); --overwrite-results "
                         "replaces it")
    elif args.overwrite_results:
        parser.error("--overwrite-results needs --results-dir")
    return args


def run_variant(args) -> str | None:
    """The run's settings beside the default ones, as its results file names them ("wait-passive-inter-2"), or None."""
    parts = ([f"wait-{args.wait_policy.lower()}"] if args.wait_policy != "ACTIVE" else []) + (
        [f"inter-{args.inter_threads}"] if args.inter_threads > 1 else [])
    return "-".join(parts) or None


def engine_environment(wait_policy: str) -> dict:
    """The engines' processes' environment: this one's, with `wait_policy` as OMP_WAIT_POLICY ("unset": without it)."""
    environment = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    if wait_policy != "unset":
        environment["OMP_WAIT_POLICY"] = wait_policy
    return study_environment(environment)


# ------------------------------------------------------------------------------------------------ one engine's process
def process_threads_and_context_switches() -> tuple[int, int] | tuple[None, None]:
    """This process's OS threads and the context switches (voluntary and involuntary) its living threads have made so
    far, from Linux's /proc; (None, None) elsewhere."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None, None
    threads = switches = 0
    for status in tasks.glob("*/status"):
        try:
            lines = status.read_text(encoding="utf-8").splitlines()
        except OSError:  # a thread that ended since the listing
            continue
        threads += 1
        switches += sum(int(line.split()[1]) for line in lines if line.startswith(("voluntary_ctxt_switches",
                                                                                     "nonvoluntary_ctxt_switches")))
    return threads, switches


def run_child(job_file: Path) -> None:
    """Translate the job's sentences with one engine at one thread count (warm-up on two sentences first) and write
    `{"seconds", "translations", "threads", "inter_threads", "omp_wait_policy", "process_threads", "context_switches"}`
    beside the job file (the last two: this process's OS threads after the timed translation and their context
    switches during it; None off Linux)."""
    job = json.loads(job_file.read_text(encoding="utf-8"))
    # the policy this process was started with, for the runtimes loaded from here on (CTranslate2's own libgomp):
    # importing bench_backbone set PASSIVE where it was unset
    if STARTING_WAIT_POLICY is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = STARTING_WAIT_POLICY
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    sources = job["sources"]
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    engine = job["engine"]
    if engine.startswith("CTranslate2"):
        import ctranslate2

        torch.set_num_threads(1)  # no torch worker threads beside CTranslate2's
        translator = ctranslate2.Translator(job["ctranslate2_dir"], device="cpu",
                                            intra_threads=job["threads"] // job["inter_threads"],
                                            inter_threads=job["inter_threads"])
        max_decoding_length = GenerationConfig.from_pretrained(job["model_dir"]).max_length - 1  # as generate()'s
        threads, inter_threads = job["threads"], translator.num_translators

        def translate(sentences):
            return ctranslate2_translate(translator, tokenizer, sentences, job["num_beams"], max_decoding_length)
    else:
        torch.set_num_threads(job["threads"])
        model = AutoModelForSeq2SeqLM.from_pretrained(job["model_dir"]).eval()
        quantization = "int8" if engine == "fast int8" else None
        threads, inter_threads = torch.get_num_threads(), job["inter_threads"]

        def translate(sentences):
            return hf_layerfusion.translate(model, tokenizer, sentences, num_beams=job["num_beams"],
                                            quantization=quantization, inter_threads=job["inter_threads"])
    translate(sources[:2])
    _, switches_before = process_threads_and_context_switches()
    start = time.perf_counter()
    translations = translate(sources)
    seconds = time.perf_counter() - start
    process_threads, switches_after = process_threads_and_context_switches()
    context_switches = None if switches_after is None else switches_after - switches_before
    result = {"seconds": seconds, "translations": translations, "threads": threads, "inter_threads": inter_threads,
              "omp_wait_policy": STARTING_WAIT_POLICY or "unset",
              "process_threads": process_threads, "context_switches": context_switches}
    job_file.with_suffix(".result.json").write_text(json.dumps(result), encoding="utf-8")


def run_engine_process(work: Path, job: dict, wait_policy: str) -> dict:
    """`run_child`'s result for `job`, in a fresh Python process (`engine_environment(wait_policy)`)."""
    job_file = work / f"job_{time.monotonic_ns()}.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    completed = subprocess.run([*module_command(__spec__.name), job["model_dir"], "--child", str(job_file)],
                               capture_output=True, text=True,
                               env=engine_environment(wait_policy))
    if completed.returncode != 0:
        raise SystemExit(f"error: the {job['engine']} process ({job['threads']} thread(s), beam {job['num_beams']}) "
                         f"failed:\n{completed.stderr[-3000:]}")
    return json.loads(job_file.with_suffix(".result.json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------ the whole run
def measure(args, work: Path, sources: list[str]) -> dict:
    """`{(engine, threads, num_beams): [result of each round]}`, the engines' order flipped every round."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_layerfusion.inference import export_ctranslate2

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir).eval()
    converted = {quantization: export_ctranslate2(model, tokenizer, work / quantization,
                                                  None if quantization == "float32" else quantization)
                 for quantization in ("float32", "int8")}
    del model
    results = {}
    for round_index in range(args.rounds):
        for num_beams in args.beams:
            for threads in args.threads:
                for engine in ENGINES if round_index % 2 == 0 else reversed(ENGINES):
                    job = dict(engine=engine, model_dir=str(args.model_dir), threads=threads, num_beams=num_beams,
                               inter_threads=args.inter_threads, sources=sources,
                               ctranslate2_dir=str(converted[engine.split()[-1]]))
                    results.setdefault((engine, threads, num_beams), []).append(
                        run_engine_process(work, job, args.wait_policy))
    return results


def seconds_cell(seconds: list[float]) -> str:
    """Seconds over rounds as the printout and inference_workload_report.py's table show them: median [min-max]."""
    return f"{statistics.median(seconds):.2f} [{min(seconds):.2f}-{max(seconds):.2f}]"


def same_precision_ratios(rows: list[dict]) -> list[tuple[str, str, int, int, float]]:
    """`(fast loop, CTranslate2 engine, threads, num_beams, ratio)` for each fast loop, thread count and search of
    `rows` (`report`'s): CTranslate2's median seconds over the fast loop's, the number the target is decided on
    (here and in inference_workload_report.py's table of these runs)."""
    seconds = {(row["engine"], row["threads"], row["num_beams"]): row["median_seconds"] for row in rows}
    threads = list(dict.fromkeys(row["threads"] for row in rows))
    searches = list(dict.fromkeys(row["num_beams"] for row in rows))
    return [(fast, reference, t, b, seconds[reference, t, b] / seconds[fast, t, b])
            for fast, reference in SAME_PRECISION.items() for t in threads for b in searches]


def untranslated_bleu(rows: list[dict]) -> float | None:
    """The fast float32 loop's greedy test BLEU where it is below `TRANSLATING_BLEU` (the model barely translates),
    else None (or where the run has no greedy search)."""
    greedy = [row["bleu"] for row in rows if row["engine"] == "fast float32" and row["num_beams"] == 1]
    return greedy[0] if greedy and greedy[0] < TRANSLATING_BLEU else None


def report(args, results: dict, references: list[str]) -> list[dict]:
    """Print the tables and targets; return one row per (engine, threads, search)."""
    from hf_layerfusion.translation.bleu import corpus_bleu

    rows = []
    for (engine, threads, num_beams), runs in results.items():
        rows.append(dict(engine=engine, threads=threads, num_beams=num_beams,
                         seconds=[run["seconds"] for run in runs],
                         median_seconds=statistics.median(run["seconds"] for run in runs),
                         threads_used=runs[0]["threads"],
                         inter_threads_used=runs[0]["inter_threads"],
                         omp_wait_policy_used=runs[0]["omp_wait_policy"],
                         process_threads=runs[0]["process_threads"],
                         context_switches_per_second=[None if run["context_switches"] is None
                                                      else run["context_switches"] / run["seconds"] for run in runs],
                         bleu=corpus_bleu(runs[0]["translations"], references)[0]))
    row_of = {(row["engine"], row["threads"], row["num_beams"]): row for row in rows}
    header = " | ".join(f"{search_label(b)}, {t} thread(s): s" for b in args.beams for t in args.threads)
    print(f"| engine | {header} | " + " | ".join(f"{search_label(b)} BLEU" for b in args.beams) + " |")
    print("|---|" + "---|" * (len(args.beams) * len(args.threads) + len(args.beams)))
    for engine in ENGINES:
        cells = [seconds_cell(row_of[engine, t, b]["seconds"]) for b in args.beams for t in args.threads]
        bleu = [f"{row_of[engine, args.threads[0], b]['bleu']:.2f}" for b in args.beams]
        print(f"| {engine} | " + " | ".join(cells + bleu) + " |")
    print("\nSeconds to translate the sentences once, median over rounds [min-max]; BLEU of the first round.")
    if len(args.threads) > 1:
        print("\n| engine | search | " + " | ".join(f"{t} threads vs {args.threads[0]}" for t in args.threads[1:])
              + " |")
        print("|---|---|" + "---|" * (len(args.threads) - 1))
        for engine in ENGINES:
            for b in args.beams:
                base = row_of[engine, args.threads[0], b]["median_seconds"]
                ratios = [f"{base / row_of[engine, t, b]['median_seconds']:.2f}x" for t in args.threads[1:]]
                print(f"| {engine} | {search_label(b)} | " + " | ".join(ratios) + " |")
    if all(row["process_threads"] is not None for row in rows):
        print("\n| engine | search | " + " | ".join(f"{t} thread(s): OS threads, context switches / s" for t in args.threads)
              + " |")
        print("|---|---|" + "---|" * len(args.threads))
        for engine in ENGINES:
            for b in args.beams:
                cells = [f"{row_of[engine, t, b]['process_threads']}, "
                         f"{statistics.median(row_of[engine, t, b]['context_switches_per_second']):.0f}"
                         for t in args.threads]
                print(f"| {engine} | {search_label(b)} | " + " | ".join(cells) + " |")
        print("\nOS threads of the engine's process after its timed translation (first round); context switches of its "
              "threads per second of translation (median over rounds).")
    print(f"\nTargets (issue 39): the fast loop at or above CTranslate2 of the same precision (>= {TARGET:.1f}x):")
    for fast, reference, t, b, ratio in same_precision_ratios(rows):
        verdict = "met" if ratio >= TARGET else "NOT met"
        print(f"- {fast} vs {reference}, {search_label(b)}, {t} thread(s): {ratio:.2f}x, {verdict}")
    bleu = untranslated_bleu(rows)
    if bleu is not None:
        print(f"\nwarning: {args.model_dir} barely translates (greedy test BLEU {bleu:.2f}, below "
              f"{TRANSLATING_BLEU:.0f}): {UNTRANSLATED_WORDS}; measure a trained model (a study run dir) for figures "
              "to publish")
    return rows


def processes_record(args, command: str, revision: str, ctranslate2_version: str, loadavg_start,
                     rows: list[dict]) -> dict:
    """What `--results-dir` keeps of a run: its provenance (command, code, libraries, CPU, wait policy, load) and
    `report`'s rows without the translations (each row's BLEU stays)."""
    return {
        "format_version": PROCESSES_RESULTS_VERSION,
        "command": command,
        "git_revision": revision,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "ctranslate2": ctranslate2_version, "hf_layerfusion": hf_layerfusion.__version__,
                     "python": platform.python_version()},
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "machine_type": machine_type(),
        "logical_cpus": os.cpu_count(),
        "omp_wait_policy": args.wait_policy,
        "inter_threads": args.inter_threads,
        "model": display_path(args.model_dir),
        "sentences": args.sentences_read,
        "rounds": args.rounds,
        "threads": list(args.threads),
        "beams": list(args.beams),
        "loadavg_start": [round(value, 2) for value in loadavg_start],
        "loadavg_end": [round(value, 2) for value in os.getloadavg()],
        "rows": rows,
    }


def main(argv=None) -> list[dict] | None:
    args = parse_args(argv)
    if args.child is not None:
        run_child(Path(args.child))
        return None
    try:
        import ctranslate2
    except ImportError:
        raise SystemExit("error: this benchmark compares with CTranslate2: pip install -e '.[ctranslate2]'")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # the parent starts no worker threads beside the engines' processes
    try:
        return measure_and_report(args, ctranslate2.__version__, argv)
    finally:
        torch.set_num_threads(threads_before)


def measure_and_report(args, ctranslate2_version: str, argv) -> list[dict]:
    transformers.logging.set_verbosity_error()
    sources = read_lines(args.data / "test_2016_flickr.en")[: args.sentences]
    references = read_lines(args.data / "test_2016_flickr.de")[: args.sentences]
    command = reproduction_command(__spec__.name, sys.argv[1:] if argv is None else argv)
    args.sentences_read = len(sources)
    start, loadavg_start = time.perf_counter(), os.getloadavg()
    revision = git_revision()  # the code that runs: files edited during the run do not change it
    print("## The real workload with each engine in a process of its own (issue 39)\n")
    print(f"- command (from the repository root): `{command}`")
    print(f"- torch {torch.__version__}, transformers {transformers.__version__}, CTranslate2 {ctranslate2_version}, "
          f"hf_layerfusion {hf_layerfusion.__version__} (git {revision}), Python {platform.python_version()}")
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible), OMP_WAIT_POLICY="
          f"{args.wait_policy} in the engines' processes, {args.inter_threads} batch(es) side by side, load average at "
          f"start {loadavg()}")
    print(f"- model: {args.model_dir}, Multi30k test, {len(sources)} sentences, {args.rounds} round(s)\n")
    with tempfile.TemporaryDirectory() as work:
        results = measure(args, Path(work), sources)
    rows = report(args, results, references)
    print(f"\n(load average at end {loadavg()}; total wall time {time.perf_counter() - start:.0f}s)")
    if args.results_path is not None:
        write_workload_results(args.results_path, processes_record(args, command, revision, ctranslate2_version,
                                                                   loadavg_start, rows), args.overwrite_results)
        print(f"\n- results written to {args.results_path} (`python -m study.report` renders them)")
    return rows


if __name__ == "__main__":
    main()
